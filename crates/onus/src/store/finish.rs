//! Recording one finished attempt, written once for both backends: the job's row, its alert,
//! the key pause a snooze asks for, the lease slot it held, and its schedule's last run. The
//! PostgreSQL store also finishes plain batches in one statement (its engine file); everything
//! else comes here.

use crate::job::{Job, JobId, JobState};
use crate::outcome::Transition;
use crate::sql::{Backend, Sql, Tx, Value};
use crate::store::{counts, keys, Finish, PauseMode, StoreResult};

/// The attempt's row, if `owner` still runs this attempt (locked on PostgreSQL until the
/// transaction ends; SQLite's one writer changes nothing between this read and the write). The
/// state and owner are compared through coalesce() on PostgreSQL so no plan walks a partial
/// index of running jobs.
static HELD: Sql = Sql::per_backend(
    "onus_live",
    "SELECT cancel_requested, lease_expires_at, queue, kind FROM onus_live
     WHERE id = $1 AND state = 'running' AND lease_owner = $2 AND attempt = $3",
    "SELECT cancel_requested, lease_expires_at, queue, kind FROM onus_live
     WHERE id = $1 AND coalesce(state, '') = 'running' AND coalesce(lease_owner, '') = $2
       AND attempt = $3 FOR UPDATE",
);

// The attempt's outcome: the job's row takes its state, history and counters from the narrow
// row (see migration 10), which is kept while the job can run again and deleted when it finished.
// On PostgreSQL one statement, which also counts an arrival in a finished state; on SQLite this
// writes the job's row, and [`KEEP_LIVE`] or [`DROP_LIVE`] and [`crate::store::counts::add`]
// follow.
static WRITE: Sql = Sql::per_backend(
    "onus_job_rows",
    "UPDATE onus_job_rows SET state = $1, run_at = COALESCE($2, l.run_at), attempt = l.attempt - $3,
        attempted_at = l.attempted_at, snoozes = snoozes + $4, finalized_at = COALESCE($5, finalized_at),
        discard_reason = COALESCE($6, discard_reason),
        errors = CASE WHEN $7 IS NULL THEN errors ELSE json_insert(errors, '$[#]', json($7)) END,
        lease_wait = $8, lease_owner = NULL, lease_expires_at = NULL, cancel_requested = l.cancel_requested,
        result = CASE WHEN $1 = 'completed' THEN COALESCE($9, result) ELSE result END
     FROM (SELECT * FROM onus_live WHERE id = $10) AS l
     WHERE onus_job_rows.id = l.id",
    "WITH l AS (
        SELECT * FROM onus_live WHERE id = $10
     ), dropped AS (
        DELETE FROM onus_live d WHERE d.id = $10 AND $1 IN ('completed', 'discarded', 'cancelled')
     ), kept AS (
        UPDATE onus_live k SET state = $1, run_at = COALESCE($2, k.run_at), attempt = k.attempt - $3,
            lease_wait = $8, lease_owner = NULL, lease_expires_at = NULL
        WHERE k.id = $10 AND $1 NOT IN ('completed', 'discarded', 'cancelled')
     ), written AS (
        UPDATE onus_job_rows j SET state = $1, run_at = COALESCE($2, l.run_at), attempt = l.attempt - $3,
            attempted_at = l.attempted_at, snoozes = j.snoozes + $4, finalized_at = COALESCE($5, j.finalized_at),
            discard_reason = COALESCE($6, j.discard_reason),
            errors = CASE WHEN $7::jsonb IS NULL THEN j.errors ELSE j.errors || jsonb_build_array($7::jsonb) END,
            lease_wait = $8, lease_owner = NULL, lease_expires_at = NULL, cancel_requested = l.cancel_requested,
            result = CASE WHEN $1 = 'completed' THEN COALESCE($9::jsonb, j.result) ELSE j.result END
        FROM l WHERE j.id = l.id AND j.id = $10
        RETURNING j.queue, j.kind
     ), counted AS (
        INSERT INTO onus_job_deltas (queue, kind, state, minute, n)
        SELECT queue, kind, $1,
               CASE WHEN $1 IN ('completed', 'discarded') THEN date_trunc('minute', $5::timestamptz) END, 1
        FROM written WHERE $1 IN ('completed', 'discarded', 'cancelled')
     )
     SELECT count(*) AS n FROM written",
);

// SQLite: the narrow row of a job that can run again, after [`WRITE`].
static KEEP_LIVE: Sql = Sql::new(
    "onus_live",
    "UPDATE onus_live SET state = $1, run_at = COALESCE($2, run_at), attempt = attempt - $3, lease_wait = $4,
        lease_owner = NULL, lease_expires_at = NULL
     WHERE id = $5",
);

// SQLite: the narrow row of a job that finished, after [`WRITE`].
static DROP_LIVE: Sql = Sql::new("onus_live", "DELETE FROM onus_live WHERE id = $1");

static ALERT: Sql = Sql::new(
    "onus_alerts",
    "INSERT INTO onus_alerts (job_id, kind, message, created_at)
     SELECT id, kind, $1, $2 FROM onus_job_rows WHERE id = $3",
);

static WAKE: Sql = Sql::new(
    "onus_job_rows",
    "SELECT pg_notify('onus_jobs', queue) FROM onus_job_rows WHERE id = $1",
);

static LAST_RUN: Sql = Sql::new(
    "onus_periodic",
    "UPDATE onus_periodic SET last_run_at = $1, last_state = $2,
     last_failure_at = CASE WHEN CAST($3 AS TEXT) IS NULL THEN last_failure_at ELSE $1 END,
     last_error = COALESCE(CAST($3 AS TEXT), last_error) WHERE name = $4",
);

/// Records `f` inside the caller's transaction, taking its lease key's lock first (writers of a
/// key queue up on PostgreSQL): false when the attempt no longer holds the job.
pub(crate) async fn locked<T: Tx + ?Sized>(tx: &T, f: &Finish) -> StoreResult<bool> {
    Ok(handing(tx, f, None).await?.is_some())
}

/// [`locked`], handing the lease slot `f` gives back to the key's next job as `hand` says (see
/// [`keys::release`]): `None` when the attempt no longer holds the job, else the job handed the
/// slot, if any.
pub(crate) async fn handing<T: Tx + ?Sized>(
    tx: &T,
    f: &Finish,
    hand: Option<&keys::HandTo>,
) -> StoreResult<Option<Option<Job>>> {
    if let Some(key) = &f.release_lease {
        keys::lock_key(tx, key).await?;
    }
    one_with(tx, f, false, hand).await
}

/// Records `f` (its lease key's lock already taken where it has one); `lease_wait` marks a
/// snooze that waits for a busy lease key. False when the attempt no longer holds the job, or
/// a rescue found its lease renewed.
pub(crate) async fn one<T: Tx + ?Sized>(tx: &T, f: &Finish, lease_wait: bool) -> StoreResult<bool> {
    Ok(one_with(tx, f, lease_wait, None).await?.is_some())
}

/// [`one`], handing the lease slot on as `hand` says: `None` when nothing was written, else the
/// job handed the slot, if any.
async fn one_with<T: Tx + ?Sized>(
    tx: &T,
    f: &Finish,
    lease_wait: bool,
    hand: Option<&keys::HandTo>,
) -> StoreResult<Option<Option<Job>>> {
    let id = Value::Int(f.id);
    let held = tx
        .query(
            &HELD,
            &[id.clone(), f.owner.as_str().into(), f.attempt.into()],
        )
        .await?;
    let Some(held) = held.first() else {
        return Ok(None); // the lease was lost: a newer owner decides
    };
    let Some(w) = f.write_for(
        held.get("cancel_requested")?,
        held.get("lease_expires_at")?,
        lease_wait,
    ) else {
        return Ok(None); // renewed since the rescuer looked: the job is alive
    };
    let entry = w.entry.as_ref().map(Value::json).transpose()?;
    let params = [
        w.state.as_str().into(),
        w.run_at.into(),
        i64::from(w.give_back_attempt).into(),
        i64::from(w.snoozed).into(),
        w.finalized_at.into(),
        w.discard_reason.map(|r| r.as_str()).into(),
        entry.unwrap_or(Value::Null),
        w.lease_wait.into(),
        f.result.clone().into(),
        id.clone(),
    ];
    let written = match tx.backend() {
        Backend::Postgres => tx.count(&WRITE, &params).await?,
        Backend::Sqlite => {
            let n = tx.execute(&WRITE, &params).await?;
            if n > 0 && w.state.is_finished() {
                tx.execute(&DROP_LIVE, std::slice::from_ref(&id)).await?;
                let minute = matches!(w.state, JobState::Completed | JobState::Discarded)
                    .then_some(w.finalized_at.unwrap_or(f.now));
                let (queue, kind): (String, String) = (held.get("queue")?, held.get("kind")?);
                counts::add(tx, &queue, &kind, w.state.as_str(), minute, 1).await?;
            } else if n > 0 {
                let keep = [
                    w.state.as_str().into(),
                    w.run_at.into(),
                    i64::from(w.give_back_attempt).into(),
                    w.lease_wait.into(),
                    id.clone(),
                ];
                tx.execute(&KEEP_LIVE, &keep).await?;
            }
            n
        }
    };
    if written == 0 {
        return Ok(None);
    }
    if let Some(message) = &w.alert {
        tx.execute(&ALERT, &[message.as_str().into(), f.now.into(), id.clone()])
            .await?;
    }
    if w.wake && tx.backend() == Backend::Postgres {
        tx.execute(&WAKE, &[id]).await?;
    }
    Ok(Some(after(tx, f, &w, hand).await?))
}

/// What follows a finished attempt's row write: the key pause a snooze asks for, the lease slot
/// it held (waking the key's next waiter, or handed to it), and its schedule's last run. Returns
/// the job handed the slot.
async fn after<T: Tx + ?Sized>(
    tx: &T,
    f: &Finish,
    w: &crate::outcome::RowWrite,
    hand: Option<&keys::HandTo>,
) -> StoreResult<Option<Job>> {
    if let Transition::Snooze {
        run_at,
        entry,
        pause_key: Some(key),
    } = &f.transition
    {
        let job: Option<JobId> = Some(f.id);
        keys::hold(
            tx,
            key,
            *run_at,
            f.now,
            &entry.message,
            PauseMode::Extend,
            job,
        )
        .await?;
    }
    let mut handed = None;
    if let Some(key) = &f.release_lease {
        handed = keys::release(tx, key, f.id, f.now, hand).await?;
    }
    if let (Some(name), Some(p)) = (&f.periodic, &w.periodic) {
        tx.execute(
            &LAST_RUN,
            &[
                f.now.into(),
                p.state.as_str().into(),
                p.failure.clone().into(),
                name.as_str().into(),
            ],
        )
        .await?;
    }
    Ok(handed)
}

/// Records a batch of finished attempts one by one; for each, whether its guarded write applied.
pub(crate) async fn all<T: Tx + ?Sized>(tx: &T, batch: &[Finish]) -> StoreResult<Vec<bool>> {
    let mut applied = Vec::with_capacity(batch.len());
    for f in batch {
        applied.push(one(tx, f, false).await?);
    }
    Ok(applied)
}
