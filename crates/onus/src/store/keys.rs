//! Lease keys and their pauses, written once for both backends over [`Tx`]: a key paused until a
//! time (its waiting jobs held), resumed, listed; a lease slot given back, waking the job that has
//! waited longest for it.
//!
//! A key's writes take the key's lock first ([`lock_key`]: an advisory lock on PostgreSQL,
//! nothing on SQLite's one writer), so a pause, a resume, a lease taken and a lease given back
//! never interleave.

use crate::clock::Timestamp;
use crate::job::JobId;
use crate::sql::{FromRow, Row, Sql, StoreResult, Tx};

use crate::store::{PauseMode, PausedKey};

const PAUSES: &str = "onus_key_pauses";
const JOBS: &str = "onus_jobs";
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

static HOLD: Sql = Sql::new(
    JOBS,
    "UPDATE onus_jobs SET state = 'scheduled', run_at = $1, lease_wait = TRUE
     WHERE (lease_key = $2 OR rate_key = $2) AND state IN ('available', 'scheduled', 'retryable', 'snoozed')
       AND (run_at <= $3 OR (state = 'scheduled' AND lease_wait = TRUE)) AND id <> $4",
);

static HELD: Sql = Sql::new(
    JOBS,
    "SELECT count(*) AS n FROM onus_jobs
     WHERE (lease_key = $1 OR rate_key = $1) AND state = 'scheduled' AND lease_wait = TRUE",
);

static UNPAUSE: Sql = Sql::new(
    PAUSES,
    "DELETE FROM onus_key_pauses WHERE key = $1 RETURNING until",
);

static RELEASE_HELD: Sql = Sql::per_backend(
    JOBS,
    "UPDATE onus_jobs SET run_at = $1, lease_wait = FALSE
     WHERE (lease_key = $2 OR rate_key = $2) AND state = 'scheduled' AND lease_wait = TRUE",
    // Each queue with a job set free hears of it.
    "WITH r AS (
        UPDATE onus_jobs SET run_at = $1, lease_wait = false
        WHERE (lease_key = $2 OR rate_key = $2) AND state = 'scheduled' AND lease_wait RETURNING queue
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
        (SELECT count(*) FROM onus_jobs j WHERE (j.lease_key = p.key OR j.rate_key = p.key)
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
// claimed is passed over: this release frees another slot); only jobs waiting for the lease. It
// wakes due since its creation, not since now: it was claimed before the jobs still waiting in
// the queue, and a claim takes the longest due first, so it runs before later jobs of the same
// key take the slot and send it back to sleep.
static WAKE_WAITER: Sql = Sql::per_backend(
    JOBS,
    "UPDATE onus_jobs SET run_at = min(created_at, $1) WHERE id = (
        SELECT id FROM onus_jobs WHERE lease_key = $2 AND state = 'snoozed' AND lease_wait = 1
        AND id != $3 AND run_at > $1 ORDER BY run_at, id LIMIT 1
     )",
    "WITH w AS (
        SELECT id FROM onus_jobs WHERE lease_key = $2 AND state = 'snoozed' AND lease_wait AND id != $3
          AND run_at > $1
        ORDER BY run_at, id LIMIT 1
     ), woken AS (
        UPDATE onus_jobs j SET run_at = LEAST(j.created_at, $1) FROM w WHERE j.id = w.id RETURNING j.queue
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
pub(crate) async fn release<T: Tx + ?Sized>(
    tx: &T,
    key: &str,
    job: JobId,
    now: Timestamp,
) -> StoreResult<()> {
    let freed = tx.execute(&FREE_SLOT, &[key.into(), job.into()]).await?;
    if freed > 0 {
        tx.execute(&WAKE_WAITER, &[now.into(), key.into(), job.into()])
            .await?;
    }
    Ok(())
}

// The key's slots, and its pause as slot -1 when one is in force: one round trip.
static SLOTS: Sql = Sql::new(
    LEASES,
    "SELECT slot, job_id, busy_until FROM onus_leases WHERE key = $1
     UNION ALL SELECT -1, 0, until FROM onus_key_pauses WHERE key = $1 AND until > $2",
);

static TAKE_SLOT: Sql = Sql::new(
    LEASES,
    "INSERT INTO onus_leases (key, slot, job_id, busy_until) VALUES ($1, $2, $3, $4)
     ON CONFLICT (key, slot) DO UPDATE SET job_id = excluded.job_id, busy_until = excluded.busy_until",
);

// SQLite uses its partial index of waiters only for the predicate as the index states it.
static LAST_WAITER: Sql = Sql::per_backend(
    JOBS,
    "SELECT MAX(run_at) AS last FROM onus_jobs
     WHERE lease_key = $1 AND state = 'snoozed' AND lease_wait = 1 AND id != $2",
    "SELECT MAX(run_at) AS last FROM onus_jobs
     WHERE lease_key = $1 AND state = 'snoozed' AND lease_wait AND id != $2",
);

// Not waiting for the disk when a job only waits: this transaction holds the key's lock, and
// every job of the key queues behind it (the holder's release too). A wait lost in a crash of
// the database leaves the job running under its process's lease, which runs out, and the
// rescuer counts the attempt as lost, as for a process that died. Nothing acknowledged depends
// on it: a transaction that saw it commits after it, and its commit waits for both records.
static NO_DISK_WAIT: Sql = Sql::new(JOBS, "SET LOCAL synchronous_commit = off");

/// Takes a slot of lease key `ask.key` for its running job, or, when the key is paused or every
/// slot busy, holds or snoozes the job in the same transaction (see [`crate::Store::acquire_lease`]).
pub(crate) async fn acquire<T: Tx + ?Sized>(
    tx: &T,
    ask: LeaseAsk<'_>,
) -> StoreResult<crate::store::LeaseDecision> {
    use crate::store::{finish, LeaseDecision};
    lock_key(tx, ask.key).await?;
    let rows = tx.query(&SLOTS, &[ask.key.into(), ask.now.into()]).await?;
    let mut held: Vec<SlotRow> = Vec::with_capacity(rows.len());
    let mut paused = None;
    for r in &rows {
        let slot: i64 = r.get("slot")?;
        let busy_until: Timestamp = r.get("busy_until")?;
        if slot < 0 {
            paused = Some(busy_until);
        } else {
            held.push((slot as u32, r.get("job_id")?, busy_until));
        }
    }
    let waits = tx.backend() == crate::sql::Backend::Postgres;
    if let Some(until) = paused {
        finish::one(tx, &ask.paused_hold(until), false).await?;
        if waits {
            tx.execute(&NO_DISK_WAIT, &[]).await?;
        }
        return Ok(LeaseDecision::Paused(until));
    }
    if let Some(s) = ask.free_slot(&held) {
        let p = [
            ask.key.into(),
            s.into(),
            ask.job.id.into(),
            ask.until.into(),
        ];
        tx.execute(&TAKE_SLOT, &p).await?;
        return Ok(LeaseDecision::Acquired);
    }
    let last = tx
        .query(&LAST_WAITER, &[ask.key.into(), ask.job.id.into()])
        .await?;
    let last = match last.first() {
        Some(r) => r.get("last")?,
        None => None,
    };
    let snooze = ask.busy_snooze(&held, last);
    finish::one(tx, &snooze, true).await?;
    if waits {
        tx.execute(&NO_DISK_WAIT, &[]).await?;
    }
    Ok(LeaseDecision::Busy(match snooze.transition {
        crate::outcome::Transition::Snooze { run_at, .. } => run_at,
        _ => ask.now,
    }))
}

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

/// A slot of a lease key as stored: the slot, the job holding it, and until when.
pub(crate) type SlotRow = (u32, crate::JobId, crate::Timestamp);

/// A running job asking for a slot of a lease key, as the runtime asks a store.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseAsk<'a> {
    pub key: &'a str,
    pub slots: u32,
    pub job: &'a crate::Job,
    pub owner: &'a str,
    pub now: crate::Timestamp,
    /// Until when the slot is held (unless renewed).
    pub until: crate::Timestamp,
}

impl LeaseAsk<'_> {
    /// The slot the job takes: the one it already holds, or the first one free or expired;
    /// `None` when every slot is busy.
    pub(crate) fn free_slot(&self, held: &[SlotRow]) -> Option<u32> {
        held.iter()
            .find(|(_, j, _)| *j == self.job.id)
            .map(|(s, _, _)| *s)
            .or_else(|| {
                (0..self.slots.max(1)).find(|s| {
                    held.iter()
                        .find(|(hs, _, _)| hs == s)
                        .is_none_or(|(_, _, busy)| *busy <= self.now)
                })
            })
    }

    /// The hold written when the key is paused until `until`: attempt given back, nothing in the
    /// job's history (see [`crate::outcome::Transition::Hold`]).
    pub(crate) fn paused_hold(&self, until: crate::Timestamp) -> crate::store::Finish {
        crate::store::Finish {
            id: self.job.id,
            owner: self.owner.to_string(),
            attempt: self.job.attempt,
            transition: crate::outcome::Transition::Hold { run_at: until },
            now: self.now,
            release_lease: None,
            periodic: None,
            expired_before: None,
            result: None,
        }
    }

    /// The snooze written when every slot is busy: no attempt spent, until the earliest slot
    /// frees, or a slot's lease after the latest other waiter (`last_waiter`), so waiters whose
    /// holder died wake one by one.
    pub(crate) fn busy_snooze(
        &self,
        held: &[SlotRow],
        last_waiter: Option<crate::Timestamp>,
    ) -> crate::store::Finish {
        let slots = self.slots.max(1);
        let now = self.now;
        let free_at = held
            .iter()
            .map(|(_, _, b)| *b)
            .min()
            .unwrap_or(now)
            .max(now);
        let spacing = (self.until - now).to_std().unwrap_or_default() / slots;
        let run_at = crate::limits::lease_waiter_wakes_at(free_at, last_waiter, spacing);
        crate::store::Finish {
            id: self.job.id,
            owner: self.owner.to_string(),
            attempt: self.job.attempt,
            transition: crate::outcome::Transition::Snooze {
                run_at,
                entry: crate::job::HistoryEntry {
                    at: now,
                    attempt: self.job.attempt,
                    class: crate::job::EntryClass::Snooze,
                    message: format!(
                        "lease key {} busy ({} of {slots} slots held)",
                        self.key,
                        held.len()
                    ),
                },
                pause_key: None,
            },
            now,
            release_lease: None,
            periodic: None,
            expired_before: None,
            result: None,
        }
    }
}
