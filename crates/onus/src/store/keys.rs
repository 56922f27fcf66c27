//! Lease keys and their pauses, written once for both backends over [`Tx`]: a key paused until a
//! time (its waiting jobs held), resumed, listed; the slots a claim takes for its jobs
//! ([`acquire`]); a lease slot given back, waking the job that has waited longest for it.
//!
//! A pause, a resume and a release take the key's lock first ([`lock_key`]: an advisory lock on
//! PostgreSQL, nothing on SQLite's one writer), so they never interleave. A claim takes a key's
//! lock only if it is free and otherwise treats the key as busy, so a claim never waits; what that
//! could miss (a release that looked for waiters before the claim committed) [`wake_free`] catches.

use crate::clock::Timestamp;
use crate::job::{Job, JobId};
use crate::sql::{FromRow, Row, Sql, StoreResult, Tx};
use crate::StoreError;

use crate::store::{PauseMode, PausedKey};

const PAUSES: &str = "onus_key_pauses";
const JOBS: &str = "onus_jobs";
const LIVE: &str = "onus_live";
const LEASES: &str = "onus_leases";

/// Takes `key`'s lock until the transaction ends.
pub(crate) async fn lock_key<T: Tx + ?Sized>(tx: &T, key: &str) -> StoreResult<()> {
    tx.lock(&format!("onus.lease:{key}")).await
}

// An operator's pause replaces the one in force; one asked by an answer (`$5`, extend) only
// lengthens it.
static PAUSE: Sql = Sql::new(
    PAUSES,
    "INSERT INTO onus_key_pauses (key, until, paused_at, reason) VALUES ($1, $2, $3, $4)
     ON CONFLICT (key) DO UPDATE SET
        until = CASE WHEN $5 AND onus_key_pauses.until > $3 AND onus_key_pauses.until > excluded.until
                     THEN onus_key_pauses.until ELSE excluded.until END,
        paused_at = excluded.paused_at, reason = excluded.reason
     RETURNING until",
);

// A job some claim has locked is passed over: that claim reads the pause once this one commits
// (it waits for the key's lock) and holds the job itself.
static HOLD: Sql = Sql::per_backend(
    LIVE,
    "UPDATE onus_live SET state = 'scheduled', run_at = $1, lease_wait = TRUE
     WHERE (lease_key = $2 OR rate_key = $2) AND state IN ('available', 'scheduled', 'retryable', 'snoozed')
       AND (run_at <= $3 OR (state = 'scheduled' AND lease_wait = TRUE)) AND id <> $4",
    "UPDATE onus_live SET state = 'scheduled', run_at = $1, lease_wait = TRUE
     WHERE id = ANY(ARRAY(SELECT id FROM onus_live
        WHERE (lease_key = $2 OR rate_key = $2) AND state IN ('available', 'scheduled', 'retryable', 'snoozed')
          AND (run_at <= $3 OR (state = 'scheduled' AND lease_wait = TRUE)) AND id <> $4
        FOR UPDATE SKIP LOCKED))",
);

static HELD: Sql = Sql::new(
    LIVE,
    "SELECT count(*) AS n FROM onus_live
     WHERE (lease_key = $1 OR rate_key = $1) AND state = 'scheduled' AND lease_wait = TRUE",
);

static UNPAUSE: Sql = Sql::new(
    PAUSES,
    "DELETE FROM onus_key_pauses WHERE key = $1 RETURNING until",
);

static RELEASE_HELD: Sql = Sql::per_backend(
    LIVE,
    "UPDATE onus_live SET run_at = $1, lease_wait = FALSE
     WHERE (lease_key = $2 OR rate_key = $2) AND state = 'scheduled' AND lease_wait = TRUE",
    // Each queue with a job set free hears of it. A job some claim has locked is passed over:
    // that claim reads the key once this resume commits.
    "WITH r AS (
        UPDATE onus_live SET run_at = $1, lease_wait = false
        WHERE id = ANY(ARRAY(SELECT id FROM onus_live
            WHERE (lease_key = $2 OR rate_key = $2) AND state = 'scheduled' AND lease_wait
            FOR UPDATE SKIP LOCKED))
        RETURNING queue
     ), n AS (SELECT pg_notify('onus_jobs', queue) FROM (SELECT DISTINCT queue FROM r) d)
     SELECT (SELECT count(*) FROM r) AS n, (SELECT count(*) FROM n) AS notified",
);

static PAUSED_UNTIL: Sql = Sql::new(
    PAUSES,
    "SELECT until FROM onus_key_pauses WHERE key = $1 AND until > $2",
);

static PAUSED_KEYS: Sql = Sql::new(
    PAUSES,
    "SELECT p.key, p.until, p.paused_at, p.reason,
        (SELECT count(*) FROM onus_live j WHERE (j.lease_key = p.key OR j.rate_key = p.key)
            AND j.state = 'scheduled' AND j.lease_wait = TRUE) AS held
     FROM onus_key_pauses p WHERE p.until > $1 ORDER BY p.key",
);

static BUSY_UNTIL: Sql = Sql::new(
    LEASES,
    "SELECT MAX(busy_until) AS busy_until FROM onus_leases WHERE key = $1",
);

static FREE_SLOT: Sql = Sql::new(
    LEASES,
    "DELETE FROM onus_leases WHERE key = $1 AND job_id = $2",
);

// The job that has waited longest for this key and still sleeps (one woken earlier and not yet
// claimed is passed over: this release frees another slot); only jobs waiting for the lease. On
// PostgreSQL a waiter some other transaction has locked is passed over too, and the waiters are
// taken in their index's order (run_at alone: ordering by id as well sorted every waiter of the
// key on each release; a claim spaces one key's waiters apart). It wakes due since its creation,
// not since now: it was claimed before the jobs still waiting in the queue, and a claim takes the
// longest due first, so it runs before later jobs of the same key take the slot and send it back
// to sleep.
static WAKE_WAITER: Sql = Sql::per_backend(
    LIVE,
    "UPDATE onus_live SET run_at = min(created_at, $1) WHERE id = (
        SELECT id FROM onus_live WHERE lease_key = $2 AND state = 'snoozed' AND lease_wait = 1
        AND id != $3 AND run_at > $1 ORDER BY run_at, id LIMIT 1
     )",
    "WITH w AS (
        SELECT id FROM onus_live WHERE lease_key = $2 AND state = 'snoozed' AND lease_wait AND id != $3
          AND run_at > $1
        ORDER BY run_at LIMIT 1 FOR UPDATE SKIP LOCKED
     ), woken AS (
        UPDATE onus_live j SET run_at = LEAST(j.created_at, $1) WHERE j.id = (SELECT id FROM w) RETURNING j.queue
     )
     SELECT pg_notify('onus_jobs', queue) FROM woken",
);

impl FromRow for PausedKey {
    fn from_row(r: &Row) -> StoreResult<Self> {
        Ok(PausedKey {
            key: r.get("key")?,
            until: r.get("until")?,
            paused_at: r.get("paused_at")?,
            reason: r.get("reason")?,
            held: r.get::<i64>("held")?.max(0) as u64,
        })
    }
}

/// Pauses `key` until `until` and holds its waiting jobs that are due by then (all but `except`,
/// the job whose answer paused it): `scheduled` until the pause ends, `lease_wait` marking them
/// held. Jobs due later are held if a claim reaches them during the pause. The caller holds the
/// key's lock. Returns how many jobs it held.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn hold<T: Tx + ?Sized>(
    tx: &T,
    key: &str,
    until: Timestamp,
    now: Timestamp,
    reason: &str,
    mode: PauseMode,
    except: Option<JobId>,
) -> StoreResult<u64> {
    let rows = tx
        .query(
            &PAUSE,
            &[
                key.into(),
                until.into(),
                now.into(),
                reason.into(),
                matches!(mode, PauseMode::Extend).into(),
            ],
        )
        .await?;
    let until: Timestamp = match rows.first() {
        Some(r) => r.get("until")?,
        None => until,
    };
    tx.execute(
        &HOLD,
        &[
            until.into(),
            key.into(),
            now.into(),
            except.unwrap_or(0).into(),
        ],
    )
    .await
}

/// Pauses `key` (see [`crate::Store::pause_key`]); how many jobs the pause holds.
pub(crate) async fn pause<T: Tx + ?Sized>(
    tx: &T,
    key: &str,
    until: Timestamp,
    now: Timestamp,
    reason: &str,
    mode: PauseMode,
) -> StoreResult<u64> {
    lock_key(tx, key).await?;
    hold(tx, key, until, now, reason, mode, None).await?;
    held(tx, key).await
}

/// How many jobs `key`'s pause holds.
pub(crate) async fn held<T: Tx + ?Sized>(tx: &T, key: &str) -> StoreResult<u64> {
    tx.count(&HELD, &[key.into()]).await
}

/// Ends `key`'s pause and makes its held jobs due at `now`: how many, or `None` when the key was
/// not paused at `now`.
pub(crate) async fn resume<T: Tx + ?Sized>(
    tx: &T,
    key: &str,
    now: Timestamp,
) -> StoreResult<Option<u64>> {
    lock_key(tx, key).await?;
    let was = tx.query(&UNPAUSE, &[key.into()]).await?;
    let in_force = match was.first() {
        Some(r) => r.get::<Timestamp>("until")? > now,
        None => false,
    };
    if !in_force {
        return Ok(None);
    }
    let params = [now.into(), key.into()];
    let n = match tx.backend() {
        crate::sql::Backend::Sqlite => tx.execute(&RELEASE_HELD, &params).await?,
        // The statement also tells idle workers, and returns the count as `n`.
        crate::sql::Backend::Postgres => tx.count(&RELEASE_HELD, &params).await?,
    };
    Ok(Some(n))
}

/// When `key`'s pause in force at `now` ends, if it is paused.
pub(crate) async fn paused_until<T: Tx + ?Sized>(
    tx: &T,
    key: &str,
    now: Timestamp,
) -> StoreResult<Option<Timestamp>> {
    let rows = tx.query(&PAUSED_UNTIL, &[key.into(), now.into()]).await?;
    rows.first().map(|r| r.get("until")).transpose()
}

/// The keys paused at `now`, with how many jobs each holds.
pub(crate) async fn paused_keys<T: Tx + ?Sized>(
    tx: &T,
    now: Timestamp,
) -> StoreResult<Vec<PausedKey>> {
    tx.fetch(&PAUSED_KEYS, &[now.into()]).await
}

/// Until when `key`'s busiest slot is held, if any is.
pub(crate) async fn busy_until<T: Tx + ?Sized>(
    tx: &T,
    key: &str,
) -> StoreResult<Option<Timestamp>> {
    let rows = tx.query(&BUSY_UNTIL, &[key.into()]).await?;
    Ok(rows
        .first()
        .map(|r| r.get::<Option<Timestamp>>("busy_until"))
        .transpose()?
        .flatten())
}

/// Frees `job`'s slot of lease `key` and wakes the job that has waited longest for the key. The
/// caller holds the key's lock.
///
/// With `hand`, the slot goes straight to the key's longest waiter instead when it is of the same
/// queue and kind, claimed in this transaction for the process finishing `job` (which runs it
/// next): no wake-up, no second claim. Returns that job, as claimed.
pub(crate) async fn release<T: Tx + ?Sized>(
    tx: &T,
    key: &str,
    job: JobId,
    now: Timestamp,
    hand: Option<&HandTo>,
) -> StoreResult<Option<Job>> {
    if let Some(h) = hand {
        let handed = tx
            .query(
                &HAND_JOB,
                &[
                    now.into(),
                    h.owner.as_str().into(),
                    h.lease_until.into(),
                    key.into(),
                    job.into(),
                    h.queue.as_str().into(),
                    h.kind.as_str().into(),
                ],
            )
            .await?
            .iter()
            .map(|r| r.get::<JobId>("id"))
            .collect::<StoreResult<Vec<_>>>()?;
        let mut next =
            crate::store::manage::jobs(crate::store::manage::rows_by_ids(tx, &handed).await?)?;
        if let Some(next) = next.pop() {
            let moved = tx
                .execute(
                    &HAND_SLOT,
                    &[next.id.into(), h.lease_until.into(), key.into(), job.into()],
                )
                .await?;
            if moved == 1 {
                return Ok(Some(next));
            }
            // The slot was there when the waiter was claimed, and the key's lock keeps it.
            return Err(StoreError::Conflict(format!(
                "job {job}'s slot of lease key {key} went away while it was handed on"
            )));
        }
    }
    let freed = tx.execute(&FREE_SLOT, &[key.into(), job.into()]).await?;
    if freed > 0 {
        tx.execute(&WAKE_WAITER, &[now.into(), key.into(), job.into()])
            .await?;
    }
    Ok(None)
}

/// Whom a finished attempt's lease slot is handed to: the next job of the key in `queue` of
/// `kind`, claimed for `owner` until `lease_until` (see [`release`]).
#[derive(Debug, Clone)]
pub(crate) struct HandTo {
    pub(crate) owner: String,
    pub(crate) queue: String,
    pub(crate) kind: String,
    pub(crate) lease_until: Timestamp,
}

// The key's ($4) longest waiter other than the finished job ($5), claimed at $1 for $2 until $3 as
// a claim would (due since its creation, as a wake-up makes it), if it is of queue $6 and kind $7
// (a waiter of another kind is woken for a claim instead, so none is passed over); none while the
// queue or the key is paused, or when the finished job holds no slot of the key. On PostgreSQL a
// waiter another transaction has locked (a claim or a wake-up on it) is passed over.
static HAND_JOB: Sql = Sql::per_backend(
    LIVE,
    "UPDATE onus_live SET state = 'running', attempt = attempt + 1, attempted_at = $1,
            lease_owner = $2, lease_expires_at = $3, cancel_requested = 0, lease_wait = 0,
            run_at = min(created_at, $1)
         WHERE id = (
            SELECT id FROM onus_live WHERE lease_key = $4 AND state = 'snoozed' AND lease_wait = 1
              AND id != $5
              AND NOT EXISTS (SELECT 1 FROM onus_queues WHERE name = $6 AND paused_at IS NOT NULL)
              AND NOT EXISTS (SELECT 1 FROM onus_key_pauses WHERE key = $4 AND until > $1)
              AND EXISTS (SELECT 1 FROM onus_leases WHERE key = $4 AND job_id = $5)
            ORDER BY run_at LIMIT 1)
           AND queue = $6 AND kind = $7
         RETURNING id",
    "UPDATE onus_live SET state = 'running', attempt = attempt + 1, attempted_at = $1,
            lease_owner = $2, lease_expires_at = $3, cancel_requested = false, lease_wait = false,
            run_at = LEAST(created_at, $1)
         WHERE id = (
            SELECT id FROM onus_live WHERE lease_key = $4 AND state = 'snoozed' AND lease_wait
              AND id != $5
              AND NOT EXISTS (SELECT 1 FROM onus_queues WHERE name = $6 AND paused_at IS NOT NULL)
              AND NOT EXISTS (SELECT 1 FROM onus_key_pauses WHERE key = $4 AND until > $1)
              AND EXISTS (SELECT 1 FROM onus_leases WHERE key = $4 AND job_id = $5)
            ORDER BY run_at LIMIT 1 FOR UPDATE SKIP LOCKED)
           AND queue = $6 AND kind = $7
         RETURNING id",
);

// The finished job's ($4) slot of key $3, now the handed job's ($1) until $2.
static HAND_SLOT: Sql = Sql::new(
    LEASES,
    "UPDATE onus_leases SET job_id = $1, busy_until = $2 WHERE key = $3 AND job_id = $4",
);

// The keys' slots, each key's pause as slot -1 when one is in force, and the latest run_at of
// the key's sleeping waiters as slot -2 (one step down the waiters' index per key): one round
// trip for a claim's every key.
static SLOTS: Sql = Sql::per_backend(
    LEASES,
    "SELECT key, slot, job_id, busy_until FROM onus_leases WHERE key IN (SELECT value FROM json_each($1))
     UNION ALL SELECT key, -1, 0, until FROM onus_key_pauses
        WHERE key IN (SELECT value FROM json_each($1)) AND until > $2
     UNION ALL SELECT k.value, -2, 0, (SELECT MAX(run_at) FROM onus_live
            WHERE lease_key = k.value AND state = 'snoozed' AND lease_wait = 1) AS last
        FROM json_each($1) k WHERE last IS NOT NULL",
    "SELECT key, slot, job_id, busy_until FROM onus_leases WHERE key = ANY($1)
     UNION ALL SELECT key, -1, 0, until FROM onus_key_pauses WHERE key = ANY($1) AND until > $2
     UNION ALL SELECT k, -2, 0, w.run_at FROM unnest($1::text[]) AS k,
        LATERAL (SELECT run_at FROM onus_live WHERE lease_key = k AND state = 'snoozed' AND lease_wait
                 ORDER BY run_at DESC LIMIT 1) w",
);

// Free slots taken: keys ($1), slots ($2) and jobs ($3) in the same order (sorted by key), all
// until $4. A slot another claim took meanwhile is not: the job is not returned, and waits.
static TAKE_FREE: Sql = Sql::per_backend(
    LEASES,
    "INSERT INTO onus_leases (key, slot, job_id, busy_until)
     SELECT k.value, s.value, j.value, u.v FROM json_each($1) k
        JOIN json_each($2) s ON s.key = k.key JOIN json_each($3) j ON j.key = k.key, (SELECT $4 AS v) u
     WHERE true ORDER BY k.key
     ON CONFLICT (key, slot) DO NOTHING RETURNING job_id",
    "INSERT INTO onus_leases (key, slot, job_id, busy_until)
     SELECT k, s, j, $4 FROM unnest($1::text[], $2::bigint[], $3::bigint[]) WITH ORDINALITY AS u(k, s, j, o)
     ORDER BY o
     ON CONFLICT (key, slot) DO NOTHING RETURNING job_id",
);

// Slots taken that are stored already: the job's own (a job claimed again), or one whose lease ran
// out (its holder died). Same lists as [`TAKE_FREE`], and `now` ($5).
static TAKE_HELD: Sql = Sql::per_backend(
    LEASES,
    "UPDATE onus_leases SET job_id = t.job, busy_until = t.until
     FROM (SELECT k.value AS key, s.value AS slot, j.value AS job, u.v AS until FROM json_each($1) k
           JOIN json_each($2) s ON s.key = k.key JOIN json_each($3) j ON j.key = k.key, (SELECT $4 AS v) u) AS t
     WHERE onus_leases.key = t.key AND onus_leases.slot = t.slot
       AND (onus_leases.busy_until <= $5 OR onus_leases.job_id = t.job)
     RETURNING onus_leases.job_id",
    "UPDATE onus_leases l SET job_id = t.j, busy_until = $4
     FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS t(k, s, j)
     WHERE l.key = t.k AND l.slot = t.s AND (l.busy_until <= $5 OR l.job_id = t.j)
     RETURNING l.job_id",
);

// After a claim that set jobs waiting committed: each key of $1 with fewer live slots than its
// slots ($2) and no waiter already woken wakes as many sleeping waiters as it has free slots. A
// slot row a release is deleting is waited for (it locks the row), so a release that missed the
// claim's waiters (they were not committed when it looked) is seen here once it commits.
// (PostgreSQL only: on SQLite's one writer a release runs wholly before or after a claim, and
// sees its waiters.)
static WAKE_FREE: Sql = Sql::new(
    LIVE,
    "WITH k AS (SELECT key, slots FROM unnest($1::text[], $2::bigint[]) AS u(key, slots)),
     live AS (SELECT l.key FROM onus_leases l JOIN k ON l.key = k.key WHERE l.busy_until > $3
              FOR KEY SHARE OF l),
     f AS (SELECT k.key, k.slots - (SELECT count(*) FROM live WHERE live.key = k.key)
                 - (SELECT count(*) FROM onus_live d WHERE d.lease_key = k.key AND d.state = 'snoozed'
                      AND d.lease_wait AND d.run_at <= $3) AS free FROM k),
     wake AS (
        SELECT w.id FROM f, LATERAL (SELECT w.id FROM onus_live w
                         WHERE w.lease_key = f.key AND w.state = 'snoozed' AND w.lease_wait AND w.run_at > $3
                         ORDER BY w.run_at LIMIT GREATEST(f.free, 0) FOR UPDATE SKIP LOCKED) w),
     woken AS (
        UPDATE onus_live j SET run_at = LEAST(j.created_at, $3)
        WHERE j.id = ANY(ARRAY(SELECT id FROM wake)) RETURNING j.queue)
     SELECT pg_notify('onus_jobs', q) FROM (SELECT DISTINCT queue AS q FROM woken) n",
);

// Claimed jobs that wait instead: ids ($1), states ($2: `snoozed` behind a busy key, `scheduled`
// held by a pause) and run_at ($3) in the same order, still leased to $4. The attempt the claim
// counted is given back; nothing goes into the job's history. The row is found by its id, with
// state and owner compared through coalesce() (see the batch finish on PostgreSQL).
static WAIT: Sql = Sql::per_backend(
    LIVE,
    "UPDATE onus_live SET state = w.state, run_at = w.run_at, lease_wait = 1, attempt = attempt - 1,
        lease_owner = NULL, lease_expires_at = NULL
     FROM (SELECT i.value AS id, s.value AS state, r.value AS run_at FROM json_each($1) i
           JOIN json_each($2) s ON s.key = i.key JOIN json_each($3) r ON r.key = i.key) AS w
     WHERE onus_live.id = w.id AND onus_live.state = 'running' AND onus_live.lease_owner = $4",
    "UPDATE onus_live j SET state = w.state, run_at = w.run_at, lease_wait = true, attempt = j.attempt - 1,
        lease_owner = NULL, lease_expires_at = NULL
     FROM unnest($1::bigint[], $2::text[], $3::timestamptz[]) AS w(id, state, run_at)
     WHERE j.id = w.id AND j.id = ANY($1) AND coalesce(j.state, '') = 'running' AND coalesce(j.lease_owner, '') = $4",
);

/// Takes `keys` locks in one order (sorted, deduplicated), so two writers of the same keys never
/// wait on each other in a cycle: on PostgreSQL one round trip of advisory locks, on SQLite
/// nothing (see [`Tx::lock`]).
pub(crate) async fn lock_keys<T: Tx + ?Sized>(tx: &T, keys: &[&str]) -> StoreResult<()> {
    if tx.backend() == crate::sql::Backend::Sqlite || keys.is_empty() {
        return Ok(());
    }
    let mut keys: Vec<&str> = keys.to_vec();
    keys.sort_unstable();
    keys.dedup();
    tx.execute(&LOCK_KEYS, &[crate::sql::Value::list(keys)])
        .await
        .map(drop)
}

// The keys of $1 whose locks were free, now taken until the transaction ends; none waited for.
static TRY_LOCK_KEYS: Sql = Sql::new(
    JOBS,
    "SELECT k FROM unnest($1::text[]) AS k
     WHERE pg_try_advisory_xact_lock(hashtextextended('onus.lease:' || k, 0))",
);

static LOCK_KEYS: Sql = Sql::new(
    JOBS,
    "SELECT pg_advisory_xact_lock(hashtextextended('onus.lease:' || k, 0)) FROM unnest($1::text[]) AS k",
);

/// Claimed jobs asking for slots of their lease keys, as the claim that took them asks: all
/// leased to `owner` at `now`, a slot taken held until `until` unless renewed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseAsks<'a> {
    /// Each job with its lease key and the key's number of slots.
    pub jobs: &'a [(&'a crate::Job, &'a str, u32)],
    pub owner: &'a str,
    pub now: crate::Timestamp,
    pub until: crate::Timestamp,
}

/// What a claim's lease keys decided: for each ask in order, and the keys (with their slots)
/// whose jobs were set asleep, for [`wake_free`] once the claim commits.
#[derive(Debug, Default)]
pub(crate) struct Acquired {
    pub decisions: Vec<crate::store::LeaseDecision>,
    pub waited: Vec<(String, u32)>,
}

/// Takes a slot of its lease key for each job of `asks` in order, in the claim's transaction
/// (see [`crate::Store::acquire_lease`]), without waiting for any key's lock: one read of every
/// key's slots, its pause and its last waiter; the locks of the keys with a slot to take, each
/// only if free (a key whose lock is held is being taken or given back: its jobs wait); the free
/// slots taken by inserting their rows, so of two claims taking one slot only one gets it; one
/// write of the jobs that wait instead, held until a pause ends or asleep until a slot frees. A
/// release wakes the longest waiter; one that looked before this claim committed is caught by
/// [`wake_free`], which the caller runs after the commit. A paused key is read again under its lock, so a resume never misses the jobs this
/// claim holds. The jobs' order is the claim's, so the longest due job of a key takes its slot.
pub(crate) async fn acquire<T: Tx + ?Sized>(tx: &T, asks: LeaseAsks<'_>) -> StoreResult<Acquired> {
    use crate::sql::Value;
    use crate::store::LeaseDecision;
    use std::collections::{HashMap, HashSet};
    if asks.jobs.is_empty() {
        return Ok(Acquired::default());
    }
    let mut keys: Vec<&str> = asks.jobs.iter().map(|(_, k, _)| *k).collect();
    keys.sort_unstable();
    keys.dedup();
    let mut state = read_keys(tx, &keys, asks.now).await?;
    let paused: Vec<&str> = keys
        .iter()
        .copied()
        .filter(|k| state.get(*k).is_some_and(|s| s.paused.is_some()))
        .collect();
    if !paused.is_empty() {
        // Under the paused keys' locks, as a resume takes them: read again, so a resume either
        // committed before (no pause) or waits and sees the jobs held here.
        lock_keys(tx, &paused).await?;
        let again = read_keys(tx, &paused, asks.now).await?;
        for k in &paused {
            state.insert((*k).to_string(), again.get(*k).cloned().unwrap_or_default());
        }
    }
    let mut out = Vec::with_capacity(asks.jobs.len());
    // Slots to insert, and slots stored already (the job's own, or run out): key, slot, job.
    let mut free: Vec<(&str, i64, JobId)> = Vec::new();
    let mut held: Vec<(&str, i64, JobId)> = Vec::new();
    for &(job, key, slots) in asks.jobs {
        let k = state.entry(key.to_string()).or_default();
        let decision = match k.decide(job.id, slots.max(1), asks.now, asks.until) {
            Decided::Take { slot, stored } => {
                let row = (key, i64::from(slot), job.id);
                if stored {
                    held.push(row);
                } else {
                    free.push(row);
                }
                LeaseDecision::Acquired
            }
            Decided::Wait(d) => d,
        };
        out.push(decision);
    }
    // A key whose lock another transaction holds (a claim taking its slot, a release giving it
    // back) is not waited for: its jobs here wait asleep instead.
    let mut wanted: Vec<&str> = free.iter().chain(&held).map(|r| r.0).collect();
    wanted.sort_unstable();
    wanted.dedup();
    let locked: HashSet<String> = match tx.backend() {
        crate::sql::Backend::Sqlite => wanted.iter().map(|k| k.to_string()).collect(),
        crate::sql::Backend::Postgres if wanted.is_empty() => HashSet::new(),
        crate::sql::Backend::Postgres => tx
            .query(&TRY_LOCK_KEYS, &[Value::list(wanted.iter().copied())])
            .await?
            .iter()
            .map(|r| r.get::<String>("k"))
            .collect::<StoreResult<_>>()?,
    };
    free.retain(|r| locked.contains(r.0));
    held.retain(|r| locked.contains(r.0));
    free.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
    let mut taken: HashSet<JobId> = HashSet::new();
    for (sql, rows, extra) in [
        (&TAKE_FREE, &free, None),
        (&TAKE_HELD, &held, Some(asks.now)),
    ] {
        if rows.is_empty() {
            continue;
        }
        let mut p = vec![
            Value::list(rows.iter().map(|r| r.0)),
            Value::list(rows.iter().map(|r| r.1)),
            Value::list(rows.iter().map(|r| r.2)),
            asks.until.into(),
        ];
        p.extend(extra.map(Value::from));
        for r in tx.query(sql, &p).await? {
            taken.insert(r.get("job_id")?);
        }
    }
    // A key another transaction held, or a slot another claim took meanwhile: the job waits for
    // that holder's lease (or its release, or [`wake_free`]).
    let mut wait: (Vec<JobId>, Vec<&str>, Vec<Timestamp>) = Default::default();
    let mut waited: HashMap<&str, u32> = HashMap::new();
    for (d, &(job, key, slots)) in out.iter_mut().zip(asks.jobs) {
        if *d == LeaseDecision::Acquired && !taken.contains(&job.id) {
            *d = LeaseDecision::Busy(asks.until);
        }
        let (state, at) = match *d {
            LeaseDecision::Acquired => continue,
            LeaseDecision::Busy(at) => {
                waited.insert(key, slots.max(1));
                ("snoozed", at)
            }
            LeaseDecision::Paused(at) => ("scheduled", at),
        };
        wait.0.push(job.id);
        wait.1.push(state);
        wait.2.push(at);
    }
    if !wait.0.is_empty() {
        let p = [
            Value::list(wait.0),
            Value::list(wait.1),
            Value::list(wait.2),
            asks.owner.into(),
        ];
        tx.execute(&WAIT, &p).await?;
    }
    let mut waited: Vec<(String, u32)> = waited
        .into_iter()
        .map(|(k, n)| (k.to_string(), n))
        .collect();
    waited.sort();
    Ok(Acquired {
        decisions: out,
        waited,
    })
}

/// Wakes, for each key of `keys` (with its slots) that has a free slot and no waiter woken
/// already, its longest sleeping waiters: run in its own transaction after a claim that set jobs
/// of these keys asleep committed (see [`acquire`]).
pub(crate) async fn wake_free<T: Tx + ?Sized>(
    tx: &T,
    keys: &[(String, u32)],
    now: Timestamp,
) -> StoreResult<()> {
    use crate::sql::Value;
    if keys.is_empty() || tx.backend() == crate::sql::Backend::Sqlite {
        return Ok(());
    }
    let p = [
        Value::list(keys.iter().map(|(k, _)| k.as_str())),
        Value::list(keys.iter().map(|(_, n)| i64::from(*n))),
        now.into(),
    ];
    tx.query(&WAKE_FREE, &p).await.map(drop)
}

/// Every key of `keys` as stored at `now`: its slots, its pause in force, its last waiter.
async fn read_keys<T: Tx + ?Sized>(
    tx: &T,
    keys: &[&str],
    now: Timestamp,
) -> StoreResult<std::collections::HashMap<String, KeyState>> {
    let rows = tx
        .query(
            &SLOTS,
            &[crate::sql::Value::list(keys.iter().copied()), now.into()],
        )
        .await?;
    let mut state: std::collections::HashMap<String, KeyState> = Default::default();
    for r in &rows {
        let key: String = r.get("key")?;
        let slot: i64 = r.get("slot")?;
        let at: Timestamp = r.get("busy_until")?;
        let k = state.entry(key).or_default();
        match slot {
            -1 => k.paused = Some(at),
            -2 => k.last_waiter = Some(at),
            s => k.held.push((s as u32, r.get("job_id")?, at)),
        }
    }
    Ok(state)
}

/// A slot of a lease key as stored: the slot, the job holding it, and until when.
pub(crate) type SlotRow = (u32, crate::JobId, crate::Timestamp);

/// One lease key as a claim's asks find it and change it.
#[derive(Debug, Default, Clone)]
struct KeyState {
    /// The slots held (a slot taken by an earlier ask of the same claim last).
    held: Vec<SlotRow>,
    /// When the pause in force ends.
    paused: Option<Timestamp>,
    /// The latest run_at of the key's sleeping waiters.
    last_waiter: Option<Timestamp>,
}

/// What a job gets of its key: a slot to take (`stored`: its row exists, the job's own or one
/// run out), or a wait (busy or paused).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Decided {
    Take { slot: u32, stored: bool },
    Wait(crate::store::LeaseDecision),
}

impl KeyState {
    /// What job `job` gets of this key with `slots` slots at `now`: the slot it already holds,
    /// or the first free or expired one (recorded as held until `until`); held while the key is
    /// paused; else asleep until the earliest slot frees, or a slot's lease after the latest
    /// other waiter, so waiters whose holder died wake one by one.
    fn decide(&mut self, job: JobId, slots: u32, now: Timestamp, until: Timestamp) -> Decided {
        use crate::store::LeaseDecision;
        if let Some(end) = self.paused {
            return Decided::Wait(LeaseDecision::Paused(end));
        }
        let free = self
            .held
            .iter()
            .find(|(_, j, _)| *j == job)
            .map(|(s, _, _)| *s)
            .or_else(|| {
                (0..slots).find(|s| {
                    self.held
                        .iter()
                        .filter(|(hs, _, _)| hs == s)
                        .all(|(_, _, busy)| *busy <= now)
                })
            });
        if let Some(slot) = free {
            let before = self.held.len();
            self.held.retain(|(hs, _, _)| *hs != slot);
            let stored = self.held.len() < before;
            self.held.push((slot, job, until));
            return Decided::Take { slot, stored };
        }
        let free_at = self
            .held
            .iter()
            .map(|(_, _, b)| *b)
            .min()
            .unwrap_or(now)
            .max(now);
        let spacing = (until - now).to_std().unwrap_or_default() / slots;
        let at = crate::limits::lease_waiter_wakes_at(free_at, self.last_waiter, spacing);
        self.last_waiter = Some(at);
        Decided::Wait(LeaseDecision::Busy(at))
    }
}

// Not waiting for the disk when nothing of a transaction needs it (a spent rate window writes
// nothing that lasts).
static NO_DISK_WAIT: Sql = Sql::new(JOBS, "SET LOCAL synchronous_commit = off");

static TAKE_USE: Sql = Sql::new(
    "onus_rate_windows",
    "INSERT INTO onus_rate_windows (key, window_start, window_end, used) VALUES ($1, $2, $3, 1)
     ON CONFLICT (key, window_start) DO UPDATE SET used = onus_rate_windows.used + 1
     RETURNING used",
);

/// Takes one use of each rate window asked for, all or none (see [`crate::Store::take_rates`]):
/// each window's row counts its use as it is taken (keys in one order, so two takers of the same
/// keys never wait on each other in a cycle), under a savepoint that is rolled back when any
/// window is spent, so a spent answer writes nothing.
pub(crate) async fn take_rates<T: Tx + ?Sized>(
    tx: &T,
    asks: &[crate::store::RateAsk],
    now: Timestamp,
) -> StoreResult<Vec<crate::store::RateDecision>> {
    use crate::store::RateDecision;
    let mut order: Vec<usize> = (0..asks.len()).collect();
    order.sort_by(|&a, &b| asks[a].key.cmp(&asks[b].key));
    let mut out = vec![RateDecision::Taken { left: 0 }; asks.len()];
    let mut all = true;
    tx.batch("SAVEPOINT onus_rates").await?;
    for &i in &order {
        let a = &asks[i];
        let (start, end) = a.window_at(now);
        let (start, end) = (
            crate::clock::from_micros(start),
            crate::clock::from_micros(end),
        );
        let rows = tx
            .query(
                &TAKE_USE,
                &[a.key.as_str().into(), start.into(), end.into()],
            )
            .await?;
        let used: i64 = match rows.first() {
            Some(r) => r.get("used")?,
            None => 0,
        };
        let used = used.max(0) as u32;
        out[i] = if used <= a.max {
            RateDecision::Taken { left: a.max - used }
        } else {
            all = false;
            RateDecision::Spent(end)
        };
    }
    if !all {
        tx.batch("ROLLBACK TO SAVEPOINT onus_rates").await?;
        if tx.backend() == crate::sql::Backend::Postgres {
            // Nothing of this transaction needs the disk.
            tx.execute(&NO_DISK_WAIT, &[]).await?;
        }
    }
    tx.batch("RELEASE SAVEPOINT onus_rates").await?;
    Ok(out)
}
