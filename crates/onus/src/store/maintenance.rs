//! The job store's upkeep, written once for both backends over [`Tx`]: leadership, alerts raised
//! by exhausted jobs, and retention (pruning finished jobs and spent bookkeeping rows).

use crate::clock::Timestamp;
use crate::sql::{FromRow, Row, Sql, StoreResult, Tx};
use crate::store::{Alert, Retention};

const LEADER: &str = "onus_leader";
const ALERTS: &str = "onus_alerts";
const JOBS: &str = "onus_job_rows";

static TRY_LEAD: Sql = Sql::new(
    LEADER,
    "INSERT INTO onus_leader (name, holder, expires_at) VALUES ($1, $2, $3)
     ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
     WHERE onus_leader.holder = excluded.holder OR onus_leader.expires_at < $4
     RETURNING holder",
);

static RESIGN: Sql = Sql::new(
    LEADER,
    "DELETE FROM onus_leader WHERE name = $1 AND holder = $2",
);

/// Takes or keeps the lease `name` for `holder` until `until`: true when `holder` holds it.
pub(crate) async fn try_lead<T: Tx + ?Sized>(
    tx: &T,
    name: &str,
    holder: &str,
    now: Timestamp,
    until: Timestamp,
) -> StoreResult<bool> {
    let rows = tx
        .query(
            &TRY_LEAD,
            &[name.into(), holder.into(), until.into(), now.into()],
        )
        .await?;
    match rows.first() {
        Some(r) => Ok(r.get::<String>("holder")? == holder),
        None => Ok(false),
    }
}

/// Gives up the lease `name` if `holder` holds it.
pub(crate) async fn resign<T: Tx + ?Sized>(tx: &T, name: &str, holder: &str) -> StoreResult<()> {
    tx.execute(&RESIGN, &[name.into(), holder.into()]).await?;
    Ok(())
}

static ALERTS_NEWEST: Sql = Sql::new(
    ALERTS,
    "SELECT id, job_id, kind, message, created_at, acked_at FROM onus_alerts
     WHERE $1 OR acked_at IS NULL ORDER BY id DESC LIMIT $2",
);

static ALERTS_OPEN_FIRST: Sql = Sql::new(
    ALERTS,
    "SELECT id, job_id, kind, message, created_at, acked_at FROM onus_alerts
     ORDER BY CASE WHEN acked_at IS NULL THEN 0 ELSE 1 END, id DESC LIMIT $1",
);

static ALERT: Sql = Sql::new(
    ALERTS,
    "SELECT id, job_id, kind, message, created_at, acked_at FROM onus_alerts WHERE id = $1",
);

static ALERTS_OF_JOB: Sql = Sql::new(
    ALERTS,
    "SELECT id, job_id, kind, message, created_at, acked_at FROM onus_alerts WHERE job_id = $1 ORDER BY id",
);

static OPEN_ALERTS_UPTO: Sql = Sql::new(
    ALERTS,
    "SELECT COUNT(*) AS n FROM (SELECT id FROM onus_alerts WHERE acked_at IS NULL LIMIT $1) AS o",
);

static ACK_ALERT: Sql = Sql::new(
    ALERTS,
    "UPDATE onus_alerts SET acked_at = COALESCE(acked_at, $1) WHERE id = $2",
);

static ACK_ALL_ALERTS: Sql = Sql::new(
    ALERTS,
    "UPDATE onus_alerts SET acked_at = $1 WHERE acked_at IS NULL",
);

impl FromRow for Alert {
    fn from_row(r: &Row) -> StoreResult<Self> {
        Ok(Alert {
            id: r.get("id")?,
            job_id: r.get("job_id")?,
            kind: r.get("kind")?,
            message: r.get("message")?,
            created_at: r.get("created_at")?,
            acked_at: r.get("acked_at")?,
        })
    }
}

/// How alerts are listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AlertOrder {
    /// Newest first; acknowledged ones only when asked.
    Newest {
        /// Acknowledged alerts too.
        include_acked: bool,
    },
    /// Open ones first, newest first within each.
    OpenFirst,
}

/// Up to `limit` alerts in `order`.
pub(crate) async fn alerts<T: Tx + ?Sized>(
    tx: &T,
    order: AlertOrder,
    limit: usize,
) -> StoreResult<Vec<Alert>> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    match order {
        AlertOrder::Newest { include_acked } => {
            tx.fetch(&ALERTS_NEWEST, &[include_acked.into(), limit.into()])
                .await
        }
        AlertOrder::OpenFirst => tx.fetch(&ALERTS_OPEN_FIRST, &[limit.into()]).await,
    }
}

/// One alert, if there is one with that id.
pub(crate) async fn alert<T: Tx + ?Sized>(tx: &T, id: i64) -> StoreResult<Option<Alert>> {
    tx.fetch_opt(&ALERT, &[id.into()]).await
}

/// The alerts a job raised, oldest first.
pub(crate) async fn alerts_of_job<T: Tx + ?Sized>(tx: &T, job: i64) -> StoreResult<Vec<Alert>> {
    tx.fetch(&ALERTS_OF_JOB, &[job.into()]).await
}

/// How many alerts are open, counting no further than `cap`.
pub(crate) async fn open_alerts_upto<T: Tx + ?Sized>(tx: &T, cap: u64) -> StoreResult<u64> {
    let cap = i64::try_from(cap).unwrap_or(i64::MAX);
    tx.count(&OPEN_ALERTS_UPTO, &[cap.into()]).await
}

/// Acknowledges an alert (again: keeps the first time); false when there is none with that id.
pub(crate) async fn ack_alert<T: Tx + ?Sized>(
    tx: &T,
    id: i64,
    now: Timestamp,
) -> StoreResult<bool> {
    Ok(tx.execute(&ACK_ALERT, &[now.into(), id.into()]).await? > 0)
}

/// Acknowledges every open alert in one statement; how many it acknowledged.
pub(crate) async fn ack_all_alerts<T: Tx + ?Sized>(tx: &T, now: Timestamp) -> StoreResult<u64> {
    tx.execute(&ACK_ALL_ALERTS, &[now.into()]).await
}

// Finished jobs of state $1 that finished before $2, at most $4, with their queue and kind for the
// counts. A finished job has no narrow row (see migration 10), so its row says its state, or on
// PostgreSQL its end does for a job the completion batch completed (migration 11; SQLite's
// completions write the row, and its table of ends stays empty), deleted with it. They
// are found among the jobs created before $2 (a job finishes after it is created): on SQLite
// through the index by state and end; on PostgreSQL among the oldest ids, up to the first job
// created between $2 and now ($3; ids grow with creation), read through the primary key from its
// start. A job whose creation time is ahead of now (an inserting process's clock ahead of this
// one's) bounds nothing, so it never holds back the jobs after it. The row's own indexes name no
// column a finish changes, and the block-range index of creation times cannot bound this search:
// its ranges filled since the last vacuum are unsummarized and every scan reads them, so each
// retention pass read the whole table's new part (70 ms a pass after 100,000 jobs, finding
// nothing).
static PRUNE_IN_STATE: Sql = Sql::per_backend(
    JOBS,
    "DELETE FROM onus_job_rows WHERE id IN (SELECT id FROM onus_job_rows
     WHERE state = $1 AND finalized_at IS NOT NULL AND finalized_at < $2 AND created_at < $2
       AND created_at <= $3 LIMIT $4)
     RETURNING queue, kind",
    "WITH gone AS (
        DELETE FROM onus_job_rows WHERE id = ANY(ARRAY(
            SELECT j.id FROM onus_job_rows j
            LEFT JOIN LATERAL (SELECT e.finalized_at FROM onus_job_ends e WHERE e.id = j.id) e ON true
            WHERE j.id < coalesce((SELECT id FROM onus_job_rows WHERE created_at >= $2 AND created_at <= $3
                                   ORDER BY id LIMIT 1),
                                  9223372036854775807)
              AND j.created_at < $2
              AND CASE WHEN e.finalized_at IS NOT NULL THEN $1 = 'completed' AND e.finalized_at < $2
                       ELSE j.state = $1 AND j.finalized_at IS NOT NULL AND j.finalized_at < $2 END
            ORDER BY j.id LIMIT $4))
        RETURNING id, queue, kind
     ), ends AS (
        DELETE FROM onus_job_ends WHERE id = ANY(ARRAY(SELECT id FROM gone))
     )
     SELECT queue, kind FROM gone",
);

static PRUNE_RATE_WINDOWS: Sql = Sql::new(
    "onus_rate_windows",
    "DELETE FROM onus_rate_windows WHERE window_end < $1",
);

static PRUNE_LEASES: Sql = Sql::new(
    "onus_leases",
    "DELETE FROM onus_leases WHERE busy_until < $1",
);

static PRUNE_KEY_PAUSES: Sql = Sql::new(
    "onus_key_pauses",
    "DELETE FROM onus_key_pauses WHERE until < $1",
);

/// Deletes up to `limit` finished jobs of each kind of ending past their retention, and the rate
/// windows, lease slots (an hour after they lapsed) and key pauses that have ended; how many jobs
/// it deleted.
pub(crate) async fn prune<T: Tx + ?Sized>(
    tx: &T,
    now: Timestamp,
    retention: Retention,
    limit: usize,
) -> StoreResult<u64> {
    // Never before 1970 (PostgreSQL's range ends earlier than chrono's; no job finished then).
    let floor = chrono::DateTime::UNIX_EPOCH;
    let completed_before = crate::clock::sub(now, retention.completed).max(floor);
    let discarded_before = crate::clock::sub(now, retention.discarded).max(floor);
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut n = 0;
    for (state, before) in [
        ("completed", completed_before),
        ("discarded", discarded_before),
        ("cancelled", discarded_before),
    ] {
        let rows = tx
            .query(
                &PRUNE_IN_STATE,
                &[state.into(), before.into(), now.into(), limit.into()],
            )
            .await?;
        n += rows.len() as u64;
        super::counts::removed(tx, state, &rows).await?;
    }
    tx.execute(&PRUNE_RATE_WINDOWS, &[now.into()]).await?;
    let stale = now - chrono::TimeDelta::hours(1);
    tx.execute(&PRUNE_LEASES, &[stale.into()]).await?;
    tx.execute(&PRUNE_KEY_PAUSES, &[now.into()]).await?;
    Ok(n)
}
