//! What a running attempt writes before its end, written once for both backends over [`Tx`]:
//! its progress, guarded by its lease like every write of an attempt, and its lease renewed.

use crate::clock::Timestamp;
use crate::job::{JobId, Progress};
use crate::sql::{Sql, StoreResult, Tx, Value};
use crate::store::{HeldJob, Renewal};

// Found by id; coalesce() keeps PostgreSQL's planner off the partial indexes of running jobs, as
// in a finish batch.
static PROGRESS: Sql = Sql::new(
    "onus_jobs",
    "UPDATE onus_jobs SET progress = $1
     WHERE id = $2 AND coalesce(state, '') = 'running' AND coalesce(lease_owner, '') = $3
       AND attempt = $4",
);

/// Records `progress` for attempt `attempt` of job `id` run by `owner`; false when that attempt
/// no longer holds the job.
pub(crate) async fn progress<T: Tx + ?Sized>(
    tx: &T,
    id: JobId,
    owner: &str,
    attempt: u32,
    progress: &Progress,
) -> StoreResult<bool> {
    let n = tx
        .execute(
            &PROGRESS,
            &[
                Value::json(progress)?,
                id.into(),
                owner.into(),
                attempt.into(),
            ],
        )
        .await?;
    Ok(n > 0)
}

static RENEW: Sql = Sql::per_backend(
    "onus_jobs",
    "UPDATE onus_jobs SET lease_expires_at = $1
     WHERE state = 'running' AND lease_owner = $2 AND id IN (SELECT value FROM json_each($3))
     RETURNING id, attempt, cancel_requested",
    "UPDATE onus_jobs SET lease_expires_at = $1
     WHERE coalesce(state, '') = 'running' AND coalesce(lease_owner, '') = $2 AND id = ANY($3)
     RETURNING id, attempt, cancel_requested",
);

static RENEW_SLOTS: Sql = Sql::per_backend(
    "onus_leases",
    "UPDATE onus_leases SET busy_until = $1
     WHERE busy_until < $1 AND job_id IN (SELECT value FROM json_each($2))",
    "UPDATE onus_leases SET busy_until = $1 WHERE busy_until < $1 AND job_id = ANY($2)",
);

/// Extends to `lease_until` the leases of the jobs in `held` that `owner` still runs, and the
/// lease-key slots they hold: only those listed, so a row the process lost track of keeps its old
/// lease, which runs out, and the rescuer takes it.
pub(crate) async fn renew<T: Tx + ?Sized>(
    tx: &T,
    owner: &str,
    held: &[HeldJob],
    lease_until: Timestamp,
) -> StoreResult<Renewal> {
    let ids = Value::list(held.iter().map(|h| h.id));
    let params = [lease_until.into(), owner.into(), ids];
    let mut rows = Vec::new();
    for r in tx.query(&RENEW, &params).await? {
        rows.push((r.get("id")?, r.get("attempt")?, r.get("cancel_requested")?));
    }
    let renewal = Renewal::of(held, &rows);
    let renewed = Value::list(renewal.renewed.iter().copied());
    tx.execute(&RENEW_SLOTS, &[lease_until.into(), renewed])
        .await?;
    Ok(renewal)
}
