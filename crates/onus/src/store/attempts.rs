//! What a running attempt writes before its end, written once for both backends over [`Tx`]:
//! its progress, guarded by its lease like every write of an attempt.

use crate::job::{JobId, Progress};
use crate::sql::{Sql, StoreResult, Tx, Value};

// On the job's row, while its narrow row says the attempt runs (see migration 10). Found by id;
// coalesce() keeps PostgreSQL's planner off the partial indexes of running jobs, as in a finish
// batch.
static PROGRESS: Sql = Sql::new(
    "onus_job_rows",
    "UPDATE onus_job_rows SET progress = $1
     WHERE id = $2 AND EXISTS (SELECT 1 FROM onus_live l WHERE l.id = $2 AND coalesce(l.state, '') = 'running'
                                 AND coalesce(l.lease_owner, '') = $3 AND l.attempt = $4)",
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
