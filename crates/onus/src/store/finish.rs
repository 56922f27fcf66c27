//! Recording one finished attempt, written once for both backends: the job's row, its alert,
//! the key pause a snooze asks for, the lease slot it held, and its schedule's last run. The
//! PostgreSQL store also finishes plain batches in one statement (its engine file); everything
//! else comes here.

use crate::job::{Job, JobId};
use crate::outcome::Transition;
use crate::sql::{Backend, Sql, Tx, Value};
use crate::store::{keys, Finish, PauseMode, StoreResult};

/// The attempt's row, if `owner` still runs this attempt (locked on PostgreSQL until the
/// transaction ends; SQLite's one writer changes nothing between this read and the write). The
/// state and owner are compared through coalesce() on PostgreSQL so no plan walks a partial
/// index of running jobs.
static HELD: Sql = Sql::per_backend(
    "onus_jobs",
    "SELECT cancel_requested, lease_expires_at FROM onus_jobs
     WHERE id = $1 AND state = 'running' AND lease_owner = $2 AND attempt = $3",
    "SELECT cancel_requested, lease_expires_at FROM onus_jobs
     WHERE id = $1 AND coalesce(state, '') = 'running' AND coalesce(lease_owner, '') = $2
       AND attempt = $3 FOR UPDATE",
);

static WRITE: Sql = Sql::per_backend(
    "onus_jobs",
    "UPDATE onus_jobs SET state = $1, run_at = COALESCE($2, run_at), attempt = attempt - $3,
        snoozes = snoozes + $4, finalized_at = COALESCE($5, finalized_at),
        discard_reason = COALESCE($6, discard_reason),
        errors = CASE WHEN $7 IS NULL THEN errors ELSE json_insert(errors, '$[#]', json($7)) END,
        lease_wait = $8, lease_owner = NULL, lease_expires_at = NULL,
        result = CASE WHEN $1 = 'completed' THEN COALESCE($9, result) ELSE result END
     WHERE id = $10",
    "UPDATE onus_jobs SET state = $1, run_at = COALESCE($2, run_at), attempt = attempt - $3,
        snoozes = snoozes + $4, finalized_at = COALESCE($5, finalized_at),
        discard_reason = COALESCE($6, discard_reason),
        errors = CASE WHEN $7::jsonb IS NULL THEN errors ELSE errors || jsonb_build_array($7::jsonb) END,
        lease_wait = $8, lease_owner = NULL, lease_expires_at = NULL,
        result = CASE WHEN $1 = 'completed' THEN COALESCE($9::jsonb, result) ELSE result END
     WHERE id = $10",
);

static ALERT: Sql = Sql::new(
    "onus_alerts",
    "INSERT INTO onus_alerts (job_id, kind, message, created_at)
     SELECT id, kind, $1, $2 FROM onus_jobs WHERE id = $3",
);

static WAKE: Sql = Sql::new(
    "onus_jobs",
    "SELECT pg_notify('onus_jobs', queue) FROM onus_jobs WHERE id = $1",
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
    let written = tx
        .execute(
            &WRITE,
            &[
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
            ],
        )
        .await?;
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
