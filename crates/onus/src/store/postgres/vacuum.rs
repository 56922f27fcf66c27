//! The table of unfinished jobs vacuumed as its jobs end, not when autovacuum next looks.
//!
//! Each job leaves two dead versions of its row in `onus_live`: the claim's update and the
//! deletion at its end. PostgreSQL keeps them, and their index entries, until a vacuum; a
//! deletion is never reclaimed by pruning alone. Autovacuum looks at the table once per
//! `autovacuum_naptime` (a server setting, 60 s by default), by which time a queue of thousands
//! of jobs a second has left hundreds of thousands of them, and every claim walks the index
//! entries they left behind.
//!
//! So a process counts the jobs its completion batches end and vacuums `onus_live` itself on a
//! pooled connection once enough ended since its last pass: [`EVERY`], or a quarter of the
//! table's live rows if more (a pass reads every index of the table whole, so a large backlog is
//! vacuumed less often), or as many as the versions the last pass had to leave (a snapshot held
//! open elsewhere keeps them; the passes then space out as they pile up instead of reading them
//! again and again). One pass at a time per process, and none while another session (another
//! process, autovacuum) vacuums the table: `SKIP_LOCKED`. The pass never truncates the table's
//! empty end, which would take its exclusive lock while claims wait. A role that may not vacuum
//! the table gets a warning from PostgreSQL and nothing else: its passes leave everything, so
//! they space out the same way. Only the narrow table of unfinished jobs is vacuumed: the job
//! rows and their ends are written once and left to autovacuum.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

use deadpool_postgres::Pool;

/// Jobs ended between two passes at least.
pub(crate) const EVERY: u64 = 5_000;

/// What a process knows of its passes over `onus_live`.
#[derive(Debug)]
pub(super) struct Vacuum {
    /// Jobs ended since the last pass began.
    ended: AtomicU64,
    /// Jobs to end before the next pass.
    due: AtomicU64,
    /// Set while a pass runs.
    running: AtomicBool,
    /// Passes begun, for tests.
    passes: AtomicU64,
}

impl Default for Vacuum {
    fn default() -> Self {
        Vacuum {
            ended: AtomicU64::new(0),
            due: AtomicU64::new(EVERY),
            running: AtomicBool::new(false),
            passes: AtomicU64::new(0),
        }
    }
}

impl Vacuum {
    /// Counts `n` jobs ended, and starts a pass once enough have been.
    pub(super) fn ended(self: &Arc<Self>, pool: &Pool, n: u64) {
        if n == 0 {
            return;
        }
        let ended = self.ended.fetch_add(n, SeqCst) + n;
        if ended < self.due.load(SeqCst) || self.running.swap(true, SeqCst) {
            return;
        }
        self.ended.fetch_sub(ended, SeqCst);
        self.passes.fetch_add(1, SeqCst);
        let (me, pool) = (self.clone(), pool.clone());
        tokio::spawn(async move {
            let due = match pass(&pool).await {
                Ok((live, left)) => EVERY.max(live / 4).max(left),
                Err(e) => {
                    tracing::debug!(error = %e, "vacuum of onus_live failed");
                    EVERY
                }
            };
            me.due.store(due, SeqCst);
            me.running.store(false, SeqCst);
        });
    }

    /// Passes begun so far.
    pub(super) fn passes(&self) -> u64 {
        self.passes.load(SeqCst)
    }
}

/// One pass; answers the table's live rows and the dead versions it had to leave.
async fn pass(pool: &Pool) -> Result<(u64, u64), String> {
    let c = pool.get().await.map_err(|e| e.to_string())?;
    c.batch_execute("VACUUM (SKIP_LOCKED, TRUNCATE false) onus_live")
        .await
        .map_err(|e| e.to_string())?;
    let row = c
        .query_one(
            "SELECT n_live_tup, n_dead_tup FROM pg_stat_user_tables WHERE relid = 'onus_live'::regclass",
            &[],
        )
        .await
        .map_err(|e| e.to_string())?;
    let (live, dead): (i64, i64) = (row.get(0), row.get(1));
    Ok((live.max(0) as u64, dead.max(0) as u64))
}
