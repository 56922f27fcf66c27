//! The table of unfinished jobs vacuumed as its jobs end, not when autovacuum next looks.
//!
//! Each job leaves two dead versions of its row in `onus_live`: the one its claim moved (deleted
//! and inserted anew as running) and the one deleted at its end. PostgreSQL keeps them, and their
//! index entries, until a vacuum; a deletion is never reclaimed by pruning alone. Autovacuum looks
//! at the table once per `autovacuum_naptime` (a server setting, 60 s by default), by which time a
//! queue of thousands of jobs a second has left hundreds of thousands of them, and every claim
//! walks the index entries they left behind.
//!
//! So a process counts the jobs its completion batches end and vacuums `onus_live` itself, on a
//! pooled connection, once enough ended since its last pass:
//!
//! - as many as the table's live rows at the last pass, and at least [`EVERY`]: a pass reads
//!   every index of the table whole and its pages changed since the last, so its cost grows with
//!   the live rows as well as the dead ones, and a pass due only once the dead versions outnumber
//!   the live rows costs a bounded amount per job ended however long the backlog (a pass every
//!   5,000 jobs while 100,000 waited cost a sixth of the throughput, measured);
//! - or just [`EVERY`] when a claim found nothing to take, or when the process holds no job any
//!   more (every outcome written; the job layer says so, [`crate::Store::idle`]): a queue that
//!   ran dry is left clean while its table is small. A pass when the process holds nothing waits
//!   for one already running (another process's) instead of skipping the table: with several
//!   processes draining one backlog, each one's last jobs end after the others' passes began, and
//!   the last process to go idle then vacuums after every job ended;
//! - and, while a snapshot older than a second is held open elsewhere (a long transaction in
//!   this database, a replica's `hot_standby_feedback`, a replication slot), twice as many as the
//!   last pass waited for: that snapshot keeps every version a pass would remove, and the passes
//!   then space out instead of reading the same versions again and again. (The statistics'
//!   count of dead versions cannot say this: each connection reports its deletions up to a
//!   second late, so after a pass they count versions it removed. A role that may not see other
//!   roles' sessions sees no such snapshot, and its passes keep their pace.)
//!
//! One pass at a time per process, and otherwise none while another session (another process,
//! autovacuum) vacuums the table: `SKIP_LOCKED`. A pass never truncates the table's empty end,
//! which would take its exclusive lock while claims wait. A role that may not vacuum the table
//! (only its owner or a superuser may) gets a warning from PostgreSQL and nothing else: its passes
//! do nothing, at the cost of a statement each, and autovacuum keeps the table as before. Only the
//! narrow table of unfinished jobs is vacuumed: the job rows and their ends are written once and
//! left to autovacuum.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

use deadpool_postgres::Pool;

use super::{pg_error, pool_err};
use crate::store::StoreResult;

/// Jobs ended between two passes at least.
const EVERY: u64 = 5_000;
/// Jobs ended between two passes at most while a snapshot is held open elsewhere.
const MOST: u64 = 1 << 22;

/// What a process knows of its passes over `onus_live`.
#[derive(Debug)]
pub(super) struct Vacuum {
    /// Where a pass takes its connection.
    pool: Pool,
    /// Jobs ended since the last pass began.
    ended: AtomicU64,
    /// Jobs to end before the next pass, while there is work to claim.
    due: AtomicU64,
    /// Jobs to end before the next pass, once the process is idle.
    due_idle: AtomicU64,
    /// Set while a pass runs.
    running: AtomicBool,
    /// Set when the process went idle while a pass ran: another pass may be due once it ends.
    idle_again: AtomicBool,
    /// Passes begun, for tests.
    passes: AtomicU64,
}

impl Vacuum {
    pub(super) fn new(pool: Pool) -> Arc<Self> {
        Arc::new(Vacuum {
            pool,
            ended: AtomicU64::new(0),
            due: AtomicU64::new(EVERY),
            due_idle: AtomicU64::new(EVERY),
            running: AtomicBool::new(false),
            idle_again: AtomicBool::new(false),
            passes: AtomicU64::new(0),
        })
    }

    /// Counts `n` jobs ended, and starts a pass once enough have been.
    pub(super) fn ended(self: &Arc<Self>, n: u64) {
        if n == 0 {
            return;
        }
        let ended = self.ended.fetch_add(n, SeqCst) + n;
        if ended >= self.due.load(SeqCst) {
            self.start(ended, Wait::Skip);
        }
    }

    /// A claim found nothing to take: starts a pass if enough jobs ended since the last.
    pub(super) fn found_nothing(self: &Arc<Self>) {
        let ended = self.ended.load(SeqCst);
        if ended >= self.due_idle.load(SeqCst) {
            self.start(ended, Wait::Skip);
        }
    }

    /// The process holds no job: starts a pass if enough jobs ended since the last, after any
    /// pass already running (another process's, autovacuum's) rather than instead of it, since
    /// the jobs this process ended meanwhile would be left to the next look of autovacuum.
    pub(super) fn idle(self: &Arc<Self>) {
        let ended = self.ended.load(SeqCst);
        if ended >= self.due_idle.load(SeqCst) && !self.start(ended, Wait::Wait) {
            // A pass of this process runs: the jobs that ended since it began are looked at
            // once it ends.
            self.idle_again.store(true, SeqCst);
        }
    }

    /// Starts a pass unless one of this process runs; answers whether it started one.
    fn start(self: &Arc<Self>, ended: u64, wait: Wait) -> bool {
        if self.running.swap(true, SeqCst) {
            return false;
        }
        self.ended.fetch_sub(ended, SeqCst);
        self.passes.fetch_add(1, SeqCst);
        let me = self.clone();
        tokio::spawn(async move {
            let (live, held) = match pass(&me.pool, wait).await {
                Ok(counts) => counts,
                Err(e) => {
                    tracing::debug!(error = %e, "vacuum of onus_live failed");
                    (0, false)
                }
            };
            let spaced = match held {
                true => (me.due_idle.load(SeqCst) * 2).min(MOST),
                false => EVERY,
            };
            me.due.store(EVERY.max(live).max(spaced), SeqCst);
            me.due_idle.store(spaced, SeqCst);
            me.running.store(false, SeqCst);
            if me.idle_again.swap(false, SeqCst) {
                me.idle();
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

/// One pass; answers the table's live rows, and whether a snapshot older than a second is held
/// open elsewhere (which kept what the pass would have removed).
async fn pass(pool: &Pool, wait: Wait) -> StoreResult<(u64, bool)> {
    let c = pool.get().await.map_err(pool_err)?;
    let sql = match wait {
        Wait::Skip => "VACUUM (SKIP_LOCKED, TRUNCATE false) onus_live",
        Wait::Wait => "VACUUM (TRUNCATE false) onus_live",
    };
    c.batch_execute(sql).await.map_err(pg_error)?;
    // The database's own clock against its own record of when each transaction began.
    let row = c
        .query_one(
            "SELECT (SELECT n_live_tup FROM pg_stat_user_tables WHERE relid = 'onus_live'::regclass),
                    EXISTS (SELECT 1 FROM pg_stat_activity
                            WHERE pid <> pg_backend_pid() AND backend_xmin IS NOT NULL
                              AND (datname = current_database() OR backend_type = 'walsender')
                              AND xact_start < statement_timestamp() - interval '1 second')
                    OR EXISTS (SELECT 1 FROM pg_replication_slots
                               WHERE xmin IS NOT NULL AND (database IS NULL OR database = current_database()))",
            &[],
        )
        .await
        .map_err(pg_error)?;
    let (live, held): (Option<i64>, bool) = (row.get(0), row.get(1));
    Ok((live.unwrap_or(0).max(0) as u64, held))
}
