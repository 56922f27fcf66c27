//! What a running attempt writes before its end, written once for both backends over [`Tx`]:
//! its progress, guarded by its lease like every write of an attempt.

use crate::job::{JobId, Progress};
use crate::sql::{Sql, StoreResult, Tx, Value};

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
