//! Periodic schedules' rows, written once for both backends over [`Tx`]: registered, enqueued
//! exactly once per period, skipped, paused and resumed.

use crate::clock::Timestamp;
use crate::job::JobId;
use crate::sql::{FromRow, Row, Sql, StoreError, StoreResult, Tx};
use crate::store::{InsertRow, JobTx, PeriodicRow};

const PERIODIC: &str = "onus_periodic";

static UPSERT: Sql = Sql::new(
    PERIODIC,
    "INSERT INTO onus_periodic (name, kind, schedule, next_run_at) VALUES ($1, $2, $3, $4)
     ON CONFLICT (name) DO UPDATE SET kind = excluded.kind, schedule = excluded.schedule,
        next_run_at = CASE WHEN onus_periodic.schedule = excluded.schedule
            AND onus_periodic.next_run_at IS NOT NULL
            THEN onus_periodic.next_run_at ELSE excluded.next_run_at END",
);

static ALL: Sql = Sql::new(
    PERIODIC,
    "SELECT name, kind, schedule, last_period_at, last_job_id, last_run_at, last_state,
            last_failure_at, last_error, next_run_at, paused_at
     FROM onus_periodic ORDER BY name",
);

static ONE: Sql = Sql::new(
    PERIODIC,
    "SELECT name, kind, schedule, last_period_at, last_job_id, last_run_at, last_state,
            last_failure_at, last_error, next_run_at, paused_at
     FROM onus_periodic WHERE name = $1",
);

static TAKE_PERIOD: Sql = Sql::new(
    PERIODIC,
    "UPDATE onus_periodic SET last_period_at = $1, next_run_at = $2
     WHERE name = $3 AND paused_at IS NULL AND (last_period_at IS NULL OR last_period_at < $1)",
);

static LAST_JOB: Sql = Sql::new(
    PERIODIC,
    "UPDATE onus_periodic SET last_job_id = $1 WHERE name = $2",
);

static SKIP: Sql = Sql::new(
    PERIODIC,
    "UPDATE onus_periodic SET next_run_at = $1 WHERE name = $2 AND next_run_at < $1",
);

// `$4`: whether this is a pause (a resume changes only a paused schedule).
static PAUSE: Sql = Sql::new(
    PERIODIC,
    "UPDATE onus_periodic SET paused_at = $1, next_run_at = COALESCE($2, next_run_at)
     WHERE name = $3 AND ($4 OR paused_at IS NOT NULL)",
);

impl FromRow for PeriodicRow {
    fn from_row(r: &Row) -> StoreResult<Self> {
        Ok(PeriodicRow {
            name: r.get("name")?,
            kind: r.get("kind")?,
            schedule: r.get("schedule")?,
            last_period_at: r.get("last_period_at")?,
            last_job_id: r.get("last_job_id")?,
            last_run_at: r.get("last_run_at")?,
            last_state: r.get("last_state")?,
            last_failure_at: r.get("last_failure_at")?,
            last_error: r.get("last_error")?,
            next_run_at: r.get("next_run_at")?,
            paused_at: r.get("paused_at")?,
        })
    }
}

/// Records a schedule: created if new; an unchanged schedule keeps its next run time, a changed
/// one takes `next_run_at`. Returns its row as written.
pub(crate) async fn upsert<T: Tx + ?Sized>(
    tx: &T,
    name: &str,
    kind: &str,
    schedule: &str,
    next_run_at: Timestamp,
) -> StoreResult<PeriodicRow> {
    tx.execute(
        &UPSERT,
        &[
            name.into(),
            kind.into(),
            schedule.into(),
            next_run_at.into(),
        ],
    )
    .await?;
    tx.fetch_opt(&ONE, &[name.into()])
        .await?
        .ok_or_else(|| StoreError::Query(format!("periodic schedule {name:?} vanished"), None))
}

/// Every schedule, by name.
pub(crate) async fn list<T: Tx + ?Sized>(tx: &T) -> StoreResult<Vec<PeriodicRow>> {
    tx.fetch(&ALL, &[]).await
}

/// Enqueues `job` for `period` of `name` unless that period (or a later one) already was, or the
/// schedule is paused: the period taken and the job inserted in one transaction.
pub(crate) async fn enqueue<T: Tx + ?Sized>(
    tx: &T,
    name: &str,
    period: Timestamp,
    next_run_at: Timestamp,
    job: InsertRow,
) -> StoreResult<Option<JobId>> {
    let taken = tx
        .execute(
            &TAKE_PERIOD,
            &[period.into(), next_run_at.into(), name.into()],
        )
        .await?;
    if taken == 0 {
        return Ok(None);
    }
    let id = tx.insert_job(job).await?.job.id;
    tx.execute(&LAST_JOB, &[id.into(), name.into()]).await?;
    Ok(Some(id))
}

/// Moves `name`'s next run forward to `next_run_at` without enqueuing.
pub(crate) async fn skip<T: Tx + ?Sized>(
    tx: &T,
    name: &str,
    next_run_at: Timestamp,
) -> StoreResult<()> {
    tx.execute(&SKIP, &[next_run_at.into(), name.into()])
        .await?;
    Ok(())
}

/// Pauses `name` (`paused_at` given) or resumes it (`None`, only when paused), moving its next
/// run to `next_run_at` when given; false when nothing changed.
pub(crate) async fn pause<T: Tx + ?Sized>(
    tx: &T,
    name: &str,
    paused_at: Option<Timestamp>,
    next_run_at: Option<Timestamp>,
) -> StoreResult<bool> {
    let n = tx
        .execute(
            &PAUSE,
            &[
                paused_at.into(),
                next_run_at.into(),
                name.into(),
                paused_at.is_some().into(),
            ],
        )
        .await?;
    Ok(n > 0)
}
