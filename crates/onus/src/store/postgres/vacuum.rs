//! The table of unfinished jobs vacuumed as its jobs end, not when autovacuum next looks.
//!
//! Each job leaves two dead versions of its row in `onus_live`: the one its claim moved (deleted
//! and inserted anew as running) and the one deleted at its end. PostgreSQL keeps them, and their index entries, until a vacuum; a
//! deletion is never reclaimed by pruning alone. Autovacuum looks at the table once per
//! `autovacuum_naptime` (a server setting, 60 s by default), by which time a queue of thousands
//! of jobs a second has left hundreds of thousands of them, and every claim walks the index
//! entries they left behind.
//!
//! So a process counts the jobs its completion batches end and vacuums `onus_live` itself, on a
//! pooled connection, once enough ended since its last pass:
//!
//! - as many as the table's live rows at the last pass, and at least [`EVERY`]: a pass reads
//!   every index of the table whole and its pages changed since the last, so its cost grows with
//!   the live rows as well as the dead ones, and a pass due only once the dead versions outnumber
//!   the live rows costs a bounded amount per job ended however long the backlog (a pass every
//!   5,000 jobs while 100,000 waited cost a sixth of the throughput, measured);
//! - or [`EVERY_IDLE`] when a claim found nothing to take, or when the process holds no job any
//!   more (every outcome written; the job layer says so, [`crate::Store::idle`]): a queue that ran
//!   dry is left clean while its table is small. A pass when the process holds nothing waits for
//!   one already running (another process's) instead of skipping the table: with several
//!   processes draining one backlog, each one's last jobs end after the others' passes began, and
//!   the last process to go idle then vacuums after every job ended;
//! - and in both cases at least as many as the versions the last pass had to leave: a snapshot
//!   held open elsewhere keeps them, and the passes then space out as they pile up instead of
//!   reading them again and again.
//!
//! One pass at a time per process, and otherwise none while another session (another process,
//! autovacuum) vacuums the table: `SKIP_LOCKED`. A pass never truncates the table's empty end, which would
//! take its exclusive lock while claims wait. A role that may not vacuum the table gets a warning
//! from PostgreSQL and nothing else: its passes leave everything, so they space out the same way.
//! Only the narrow table of unfinished jobs is vacuumed: the job rows and their ends are written
//! once and left to autovacuum.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

use deadpool_postgres::Pool;

/// Jobs ended between two passes at least, while there is work to claim.
pub(crate) const EVERY: u64 = 5_000;
/// Jobs ended between two passes at least, once a claim found nothing to take.
pub(crate) const EVERY_IDLE: u64 = 1_000;

/// What a process knows of its passes over `onus_live`.
#[derive(Debug)]
pub(super) struct Vacuum {
    /// Jobs ended since the last pass began.
    ended: AtomicU64,
    /// Jobs to end before the next pass, while there is work to claim.
    due: AtomicU64,
    /// Jobs to end before the next pass, once a claim found nothing.
    due_idle: AtomicU64,
    /// Set while a pass runs.
    running: AtomicBool,
    /// Set when the process went idle while a pass ran: another pass may be due once it ends.
    idle_again: AtomicBool,
    /// Passes begun, for tests.
    passes: AtomicU64,
}

impl Default for Vacuum {
    fn default() -> Self {
        Vacuum {
            ended: AtomicU64::new(0),
            due: AtomicU64::new(EVERY),
            due_idle: AtomicU64::new(EVERY_IDLE),
            running: AtomicBool::new(false),
            idle_again: AtomicBool::new(false),
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
        if ended >= self.due.load(SeqCst) {
            self.start(pool, ended, Wait::Skip);
        }
    }

    /// A claim found nothing to take: starts a pass if enough jobs ended since the last.
    pub(super) fn found_nothing(self: &Arc<Self>, pool: &Pool) {
        let ended = self.ended.load(SeqCst);
        if ended >= self.due_idle.load(SeqCst) {
            self.start(pool, ended, Wait::Skip);
        }
    }

    /// The process holds no job: starts a pass if enough jobs ended since the last, after any
    /// pass already running (another process's, autovacuum's) rather than instead of it, since
    /// the jobs this process ended meanwhile would be left to the next look of autovacuum.
    pub(super) fn idle(self: &Arc<Self>, pool: &Pool) {
        let ended = self.ended.load(SeqCst);
        if ended >= self.due_idle.load(SeqCst) && !self.start(pool, ended, Wait::Wait) {
            // A pass of this process runs: the jobs that ended since it began are looked at
            // once it ends.
            self.idle_again.store(true, SeqCst);
        }
    }

    /// Starts a pass unless one of this process runs; answers whether it started one.
    fn start(self: &Arc<Self>, pool: &Pool, ended: u64, wait: Wait) -> bool {
        if self.running.swap(true, SeqCst) {
            return false;
        }
        self.ended.fetch_sub(ended, SeqCst);
        self.passes.fetch_add(1, SeqCst);
        let (me, pool) = (self.clone(), pool.clone());
        tokio::spawn(async move {
            let (live, left) = match pass(&pool, wait).await {
                Ok(counts) => counts,
                Err(e) => {
                    tracing::debug!(error = %e, "vacuum of onus_live failed");
                    (0, 0)
                }
            };
            me.due.store(EVERY.max(live).max(left), SeqCst);
            me.due_idle.store(EVERY_IDLE.max(left), SeqCst);
            me.running.store(false, SeqCst);
            if me.idle_again.swap(false, SeqCst) {
                me.idle(&pool);
            }
        });
        true
    }

    /// Passes begun so far.
    pub(super) fn passes(&self) -> u64 {
        self.passes.load(SeqCst)
    }
}

/// Whether a pass skips the table while another session vacuums it, or waits for that one.
#[derive(Clone, Copy, Debug)]
enum Wait {
    Skip,
    Wait,
}

/// One pass; answers the table's live rows and the dead versions it had to leave.
async fn pass(pool: &Pool, wait: Wait) -> Result<(u64, u64), String> {
    let c = pool.get().await.map_err(|e| e.to_string())?;
    let sql = match wait {
        Wait::Skip => "VACUUM (SKIP_LOCKED, TRUNCATE false) onus_live",
        Wait::Wait => "VACUUM (TRUNCATE false) onus_live",
    };
    c.batch_execute(sql).await.map_err(|e| e.to_string())?;
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
