//! The PostgreSQL store: the scale-out engine. Any number of processes on any number of machines
//! share one database and cooperate.
//!
//! - Claims lock rows with `FOR UPDATE SKIP LOCKED` inside one `UPDATE ... RETURNING`, so claimers
//!   never wait on each other and never take the same job.
//! - Inserts (and manual retries, and lease releases) send `NOTIFY onus_jobs, '<queue>'` with the
//!   transaction; idle workers wake within milliseconds. Polling stays as the fallback.
//! - Cancel requests send `NOTIFY onus_cancel, '<id>'`, so a running job hears it at once.
//! - Lease-key slots are serialized per key with a transaction-scoped advisory lock, so a release
//!   can never slip between a busy check and the waiter's snooze.
//!
//! Every instant comes from the caller's clock; SQL never calls `now()`.

use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_postgres::AsyncMessage;

use super::*;
use crate::clock::Timestamp;
use crate::job::{Job, JobId};
use crate::outcome::Transition;
use crate::sql::{Backend, PgConn, PgTx, Sql, Tx};

pub use deadpool_postgres;
pub use tokio_postgres;

pub(crate) mod connect;
mod group;
mod vacuum;

const CLAIM_SQL: &str = include_str!("claim.sql");
fn claim_sql(text: String) -> Sql {
    Sql::for_backend("onus_live", Backend::Postgres, text)
}

/// The claim that scans the available jobs from their start.
static CLAIM_FROM_START: std::sync::LazyLock<Sql> =
    std::sync::LazyLock::new(|| claim_sql(CLAIM_SQL.replace("/*after*/", "")));
/// The claim that resumes after a producer's cursor ($7, $8, $9: its priority, run_at and id).
static CLAIM_AFTER: std::sync::LazyLock<Sql> = std::sync::LazyLock::new(|| {
    claim_sql(CLAIM_SQL.replace(
        "/*after*/",
        "AND (queue, priority, run_at, id) > ($4, $7, $8, $9)",
    ))
});

/// The claim when some of its kinds are capped: the due jobs of every kind ranked in one order,
/// each capped kind ($7, with its room in $8) taking at most its room, so a capped kind keeps its
/// priority beside an uncapped backlog.
static CLAIM_CAPPED: std::sync::LazyLock<Sql> = std::sync::LazyLock::new(|| {
    let mut s = CLAIM_SQL.replace("/*after*/", "");
    for (from, to) in [
        (
            "SELECT id, priority, run_at, 0 AS src",
            "SELECT id, kind, priority, run_at, 0 AS src",
        ),
        (
            "SELECT id, priority, run_at, 1 AS src",
            "SELECT id, kind, priority, run_at, 1 AS src",
        ),
        (
            "SELECT id, src FROM (SELECT * FROM available UNION ALL SELECT * FROM delayed) due",
            "SELECT id, src FROM (
        SELECT due.*, row_number() OVER (PARTITION BY kind ORDER BY priority, run_at, id) AS rn
        FROM (SELECT * FROM available UNION ALL SELECT * FROM delayed) due
    ) ranked LEFT JOIN unnest($7::text[], $8::int8[]) AS caps(kind, room) USING (kind)
    WHERE caps.room IS NULL OR ranked.rn <= caps.room",
        ),
    ] {
        assert!(s.contains(from), "claim.sql has {from:?}");
        s = s.replace(from, to);
    }
    claim_sql(s)
});

/// Set in the transactions that find many running jobs by id (completion batches) and on the
/// connection of lease renewals. Their plans must be primary-key lookups, but a table that grew
/// from nothing in seconds carries statistics that call it a few rows, and the planner then picked
/// a sequential scan inside a nested loop: every job of the batch compared with every running job
/// (2 s for a batch of 512 with 17,000 jobs running, measured). Only these statements are steered;
/// everything else plans as usual. Completion batches also take their generic plan from their first
/// run on each connection (as claims do, see [`CLAIM_PLAN`]).
const NO_SEQSCAN: &str =
    "SET LOCAL enable_seqscan = off; SET LOCAL plan_cache_mode = force_generic_plan";
const NO_SEQSCAN_SESSION: &str = "SET enable_seqscan = off";

/// Set in every claim's transaction. A claim's plan must be a range scan of its partial index in
/// the claim's order that stops once it locked its LIMIT. Once `onus_live` has been vacuumed or
/// analyzed, its statistics describe the table as it was then, often a handful of rows, and the
/// planner then read every waiting job through a bitmap of the index and sorted them instead:
/// 92,000 index entries and 12,000 rows read to claim 500 (measured, `auto_explain`), claims
/// costing twice as much per job while a backlog lasted. The claim also takes its generic plan from
/// its first run on a connection: PostgreSQL otherwise plans it anew for the first five runs on
/// each, and a process's every new connection paid that (four processes at 16 slots spent 6% less
/// database CPU per job without it, measured).
#[doc(hidden)]
pub const CLAIM_PLAN: &str = "SET LOCAL enable_bitmapscan = off; SET LOCAL enable_seqscan = off; SET LOCAL plan_cache_mode = force_generic_plan";

/// How long a claim cursor is trusted before a claim scans the available jobs from their start
/// again: the most a job that sorts before what this process already passed (a more urgent
/// priority inserted behind a backlog, a job handed back) waits while the backlog lasts.
const CURSOR_REFRESH: Duration = Duration::from_millis(50);

/// Where this process's last claim of available jobs ended, per (queue, kinds claimed).
///
/// A claim marks the available jobs it takes `running`, but their old entries stay at the front
/// of the partial index of available jobs until a vacuum removes them, so a claim that scans from
/// the index's start steps over every job claimed since the last vacuum: 0.04 ms for a claim of
/// 16 on a fresh index, 0.7 ms after 16,000 claims (measured on this machine). While a queue has a
/// backlog, a claim resumes after the last key this process took instead, and scans from the start
/// again every [`CURSOR_REFRESH`]; a resumed claim that comes back short (the backlog is gone)
/// fills the rest from the start at once, so no job waits on the cursor for long.
///
/// The map is keyed by what a claim asks for, not by who asks: an outside worker's claim has an
/// owner of its own each time, and keying by it grew the map by one entry a claim for ever. An
/// entry not refreshed within [`CURSOR_REFRESH`] is never resumed after, so once the map holds
/// more than [`CURSORS_KEPT`] such stale entries are dropped.
#[derive(Debug, Default)]
struct Cursors(std::sync::Mutex<std::collections::HashMap<CursorKey, Cursor>>);

/// (queue, the claim's kinds sorted and joined).
type CursorKey = (String, String);

/// The entries a cursor map keeps before it drops those gone stale.
const CURSORS_KEPT: usize = 64;

#[derive(Debug, Clone, Copy)]
struct Cursor {
    /// (priority, run_at, id) of the last available job claimed.
    key: (i16, Timestamp, JobId),
    /// When a claim last scanned from the start.
    scanned: std::time::Instant,
    /// The last claim came back short: scan from the start next time.
    short: bool,
}

impl Cursors {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<CursorKey, Cursor>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn key(req: &ClaimRequest) -> CursorKey {
        let mut kinds: Vec<&str> = req.kinds.iter().map(String::as_str).collect();
        kinds.sort_unstable();
        (req.queue.clone(), kinds.join("\n"))
    }

    /// How many cursors are kept (for tests of the bound).
    fn len(&self) -> usize {
        self.lock().len()
    }

    /// The key a claim for `req` may resume after, if it may.
    fn resume(&self, req: &ClaimRequest) -> Option<(i16, Timestamp, JobId)> {
        self.lock()
            .get(&Self::key(req))
            .filter(|c| !c.short && c.scanned.elapsed() < CURSOR_REFRESH)
            .map(|c| c.key)
    }

    /// Records a claim's end: `last` is the greatest key it took from the available jobs.
    fn record(
        &self,
        req: &ClaimRequest,
        resumed: bool,
        last: Option<(i16, Timestamp, JobId)>,
        got: usize,
    ) {
        let mut m = self.lock();
        let k = Self::key(req);
        let short = got < req.limit;
        match (m.get_mut(&k), last) {
            (Some(c), last) => {
                if let Some(last) = last {
                    c.key = if resumed { c.key.max(last) } else { last };
                }
                if !resumed {
                    c.scanned = std::time::Instant::now();
                }
                c.short = short;
            }
            (None, Some(key)) => {
                if m.len() >= CURSORS_KEPT {
                    m.retain(|_, c| c.scanned.elapsed() < CURSOR_REFRESH);
                }
                m.insert(
                    k,
                    Cursor {
                        key,
                        scanned: std::time::Instant::now(),
                        short,
                    },
                );
            }
            (None, None) => {}
        }
    }
}
use super::manage::JOB_COLS;

/// The PostgreSQL store.
#[derive(Debug)]
pub struct PostgresStore {
    pool: Pool,
    target: connect::Target,
    renewals: Renewals,
    cursors: Cursors,
    inserts: group::Group<group::Inserts>,
    finishes: group::Group<group::Finishes>,
    ops: group::Group<group::Ops>,
    vacuum: std::sync::Arc<vacuum::Vacuum>,
}

/// The connection lease renewals use, apart from the pool: a busy pool never delays a renewal,
/// and a connection a renewal gave up on (its deadline passed mid-query) is never used again.
#[derive(Default)]
struct Renewals {
    conn: tokio::sync::Mutex<Option<(tokio_postgres::Client, tokio::task::JoinHandle<()>)>>,
    /// Set while a renewal runs; still set at the next one if that one was abandoned.
    busy: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Renewals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Renewals")
    }
}

pub use crate::sql::postgres::describe;
pub(crate) use crate::sql::postgres::error as pg_error;

fn pool_err(e: deadpool_postgres::PoolError) -> StoreError {
    match e {
        deadpool_postgres::PoolError::Backend(e) => StoreError::Unavailable(
            format!("cannot reach PostgreSQL: {}", describe(&e)),
            Some(crate::sql::error::driver(e)),
        ),
        e => StoreError::Unavailable(format!("cannot reach PostgreSQL: {e}"), None),
    }
}

impl PostgresStore {
    /// Connects to `url` (`postgres://user:password@host:port/database`), checks the connection,
    /// and applies the job layer's pending migrations. The error names what is wrong (address,
    /// credentials, database).
    pub async fn open(url: &str) -> StoreResult<Self> {
        Self::open_with(url, true).await
    }

    /// As [`PostgresStore::open`]; with `migrate` false nothing is applied (apply migrations with
    /// [`Store::migrate`], `onus migrate`, before use).
    pub async fn open_with(url: &str, migrate: bool) -> StoreResult<Self> {
        let target = connect::parse(url)?;
        let shown_url = target.shown.clone();
        let mgr = Manager::from_config(
            target.config.clone(),
            target.tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(mgr)
            .max_size(32)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(connect::POOL_WAIT_TIMEOUT))
            .create_timeout(Some(connect::CONNECT_TIMEOUT))
            .recycle_timeout(Some(connect::CONNECT_TIMEOUT))
            .build()
            .map_err(|e| StoreError::Open(format!("cannot set up a connection pool: {e}")))?;
        let client = pool.get().await.map_err(|e| {
            let why = match &e {
                deadpool_postgres::PoolError::Backend(e) => describe(e),
                e => e.to_string(),
            };
            StoreError::Open(format!(
                "cannot connect to PostgreSQL at {shown_url}: {why}; check the host, port, user, password, database and sslmode in ONUS_DATABASE_URL"
            ))
        })?;
        if migrate {
            crate::sql::postgres::apply_lines(&client, &crate::store::with_jobs(&[]))
                .await
                .map_err(|e| {
                    StoreError::Open(format!("cannot apply the schema at {shown_url}: {e}"))
                })?;
        }
        drop(client);
        Ok(PostgresStore {
            inserts: group::Group::start(pool.clone()),
            finishes: group::Group::start(pool.clone()),
            ops: group::Group::start(pool.clone()),
            vacuum: vacuum::Vacuum::new(pool.clone()),
            pool,
            target,
            renewals: Renewals::default(),
            cursors: Cursors::default(),
        })
    }

    /// The connection pool, for components that keep tables of their own in this database.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// How many claim cursors this store keeps (bounded: see the claim's cursor).
    #[doc(hidden)]
    pub fn claim_cursors(&self) -> usize {
        self.cursors.len()
    }

    /// How many passes over the table of unfinished jobs this store began (see `vacuum`).
    #[doc(hidden)]
    pub fn vacuum_passes(&self) -> u64 {
        self.vacuum.passes()
    }

    /// The database URL with its password hidden.
    pub fn url(&self) -> &str {
        &self.target.shown
    }

    async fn client(&self) -> StoreResult<deadpool_postgres::Object> {
        self.pool.get().await.map_err(pool_err)
    }

    /// Runs a flow written once over [`Tx`] in one transaction, on the caller's task.
    pub(crate) async fn write<R>(
        &self,
        f: impl for<'a, 'c> AsyncFnOnce(&'a PgTx<'c>) -> StoreResult<R>,
    ) -> StoreResult<R> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_error)?;
        let r = f(&PgTx::pooled(&tx)).await?;
        tx.commit().await.map_err(pg_error)?;
        Ok(r)
    }

    /// Runs a read-only flow written once over [`Tx`] on a pooled connection, on the caller's task.
    pub(crate) async fn read<R>(
        &self,
        f: impl for<'a, 'c> AsyncFnOnce(&'a PgTx<'c>) -> StoreResult<R>,
    ) -> StoreResult<R> {
        let client = self.client().await?;
        f(&PgTx::pooled_client(&client)).await
    }

    /// Runs `f` on the renewal connection, opening it first if there is none, it closed, or the
    /// previous renewal was abandoned while it ran (the connection may be hung).
    async fn on_renewal_conn<R>(
        &self,
        f: impl AsyncFnOnce(&tokio_postgres::Client) -> StoreResult<R>,
    ) -> StoreResult<R> {
        use std::sync::atomic::Ordering::SeqCst;
        let mut conn = self.renewals.conn.lock().await;
        let abandoned = self.renewals.busy.swap(true, SeqCst);
        if abandoned || conn.as_ref().is_some_and(|(c, _)| c.is_closed()) {
            if let Some((_, driver)) = conn.take() {
                driver.abort();
            }
        }
        if conn.is_none() {
            let (client, connection) = self
                .target
                .config
                .connect(self.target.tls.clone())
                .await
                .map_err(|e| {
                    self.renewals.busy.store(false, SeqCst);
                    StoreError::Unavailable(
                        format!("cannot reach PostgreSQL: {}", describe(&e)),
                        Some(crate::sql::error::driver(e)),
                    )
                })?;
            let driver = tokio::spawn(async move {
                let _ = connection.await;
            });
            // Renewals find their jobs by id; see `NO_SEQSCAN`.
            if let Err(e) = client.batch_execute(NO_SEQSCAN_SESSION).await {
                driver.abort();
                self.renewals.busy.store(false, SeqCst);
                return Err(pg_error(e));
            }
            *conn = Some((client, driver));
        }
        let r = match conn.as_ref() {
            Some((client, _)) => f(client).await,
            None => Err(StoreError::Unavailable(
                "no renewal connection".into(),
                None,
            )),
        };
        self.renewals.busy.store(false, SeqCst);
        r
    }
}

impl PostgresStore {
    /// Inserts `rows`, claiming as `claim` says: rows that carry no unique key in one statement
    /// outside any explicit transaction (a few rows by the group commit, sharing the statement
    /// with other callers' inserts: see [`group`]), others by the insert flow in a transaction
    /// shared with other callers' operations.
    async fn insert_with(
        &self,
        rows: Vec<InsertRow>,
        claim: Option<InsertClaim>,
    ) -> StoreResult<Vec<Inserted>> {
        if !rows.is_empty() && rows.iter().all(|r| r.unique_key.is_none()) {
            let take = taken(&rows, 0..rows.len(), claim.as_ref());
            if rows.len() < group::ALONE_FROM {
                return self.inserts.write((rows, take, claim)).await;
            }
            let c = self.client().await?;
            let rows: Vec<&InsertRow> = rows.iter().collect();
            let claims = claims_of(&take, claim.as_ref());
            return insert_bulk(PgConn::PooledClient(&c), &rows, &claims, true).await;
        }
        // A few rows with unique keys go through the insert flow in a transaction shared with
        // other callers' operations (`Db::tx_shared`); many fill a transaction of their own.
        if rows.len() >= group::ALONE_FROM {
            return self
                .write(async |tx| insert::insert(tx, rows, claim.as_ref()).await)
                .await;
        }
        let rows = std::sync::Arc::new(rows);
        let claim = std::sync::Arc::new(claim);
        crate::store::db::shared(self, move |tx| {
            let (rows, claim) = (rows.clone(), claim.clone());
            Box::pin(
                async move { insert::insert(tx, rows.to_vec(), claim.as_ref().as_ref()).await },
            )
        })
        .await
    }
}

/// Each row's claim: `claim` for the rows `take` marks, none for the others.
pub(crate) fn claims_of<'c>(
    take: &[bool],
    claim: Option<&'c InsertClaim>,
) -> Vec<Option<&'c InsertClaim>> {
    take.iter().map(|t| claim.filter(|_| *t)).collect()
}

/// Inserts rows without unique keys in one statement. A row with a claim is written `running`
/// under it, unless its queue is paused by hand.
pub(crate) async fn insert_bulk(
    e: PgConn<'_>,
    rows: &[&InsertRow],
    claims: &[Option<&InsertClaim>],
    notify: bool,
) -> StoreResult<Vec<Inserted>> {
    let kinds: Vec<&str> = rows.iter().map(|r| r.kind.as_str()).collect();
    let queues: Vec<&str> = rows.iter().map(|r| r.queue.as_str()).collect();
    let args: Vec<&serde_json::Value> = rows.iter().map(|r| &r.args).collect();
    let prios: Vec<i16> = rows.iter().map(|r| r.priority).collect();
    let states: Vec<&str> = rows.iter().map(|r| r.state.as_str()).collect();
    let maxes: Vec<i32> = rows.iter().map(|r| r.max_attempts as i32).collect();
    let run_ats: Vec<Timestamp> = rows.iter().map(|r| r.run_at).collect();
    let created: Vec<Timestamp> = rows.iter().map(|r| r.created_at).collect();
    let lease_keys: Vec<Option<&str>> = rows.iter().map(|r| r.lease_key.as_deref()).collect();
    let rate_keys: Vec<Option<&str>> = rows.iter().map(|r| r.rate_key.as_deref()).collect();
    let tags: Vec<serde_json::Value> = rows.iter().map(|r| serde_json::json!(r.tags)).collect();
    let take: Vec<bool> = claims.iter().map(Option::is_some).collect();
    let claim_at: Vec<Option<Timestamp>> = claims.iter().map(|c| c.map(|c| c.now)).collect();
    let owners: Vec<Option<&str>> = claims.iter().map(|c| c.map(|c| c.owner.as_str())).collect();
    let lease_until: Vec<Option<Timestamp>> =
        claims.iter().map(|c| c.map(|c| c.lease_until)).collect();
    // The job rows, their narrow rows in onus_live (see migration 10) and their count, in one
    // statement.
    let written = format!(
        "WITH ins AS (
            INSERT INTO onus_job_rows (kind, queue, args, priority, state, max_attempts, run_at, created_at, lease_key,
                                       tags, attempt, attempted_at, lease_owner, lease_expires_at, rate_key)
             SELECT kind, queue, args, priority, CASE WHEN took THEN 'running' ELSE state END, max_attempts, run_at,
                    created_at, lease_key, tags, CASE WHEN took THEN 1 ELSE 0 END,
                    CASE WHEN took THEN claim_at END, CASE WHEN took THEN owner END,
                    CASE WHEN took THEN lease_until END, rate_key
             FROM (SELECT t.*, t.take AND NOT EXISTS (
                          SELECT 1 FROM onus_queues q WHERE q.name = t.queue AND q.paused_at IS NOT NULL) AS took
                   FROM unnest($1::text[], $2::text[], $3::jsonb[], $4::smallint[], $5::text[], $6::integer[],
                               $7::timestamptz[], $8::timestamptz[], $9::text[], $10::jsonb[], $11::boolean[],
                               $12::timestamptz[], $13::text[], $14::timestamptz[], $15::text[])
                        WITH ORDINALITY AS t(kind, queue, args, priority, state, max_attempts, run_at, created_at,
                                             lease_key, tags, take, claim_at, owner, lease_until, rate_key,
                                             ord)) s
             ORDER BY ord
             RETURNING {JOB_COLS}, rate_key
         ), live AS (
            INSERT INTO onus_live (id, queue, kind, priority, state, run_at, created_at, attempt, attempted_at,
                                   lease_key, rate_key, lease_owner, lease_expires_at)
            SELECT id, queue, kind, priority, state, run_at, created_at, attempt, attempted_at, lease_key, rate_key,
                   lease_owner, lease_expires_at FROM ins
         ), counted AS (
            INSERT INTO onus_job_deltas (queue, kind, state, n) SELECT queue, kind, state, count(*) FROM ins GROUP BY 1, 2, 3
         )"
    );
    // With `notify`, the one statement also tells idle workers of the queues it filled (at its
    // commit), so an insert on its own is one round trip and one commit.
    let sql = if notify {
        format!(
            "{written}, woke AS (SELECT pg_notify('onus_jobs', queue) FROM (SELECT DISTINCT queue FROM ins WHERE state = 'available') w)
             SELECT {JOB_COLS} FROM ins WHERE (SELECT count(*) FROM woke) >= 0"
        )
    } else {
        format!("{written} SELECT {JOB_COLS} FROM ins")
    };
    let got = crate::sql::postgres::query(
        e,
        "onus_job_rows",
        &sql,
        true,
        &[
            &kinds,
            &queues,
            &args,
            &prios,
            &states,
            &maxes,
            &run_ats,
            &created,
            &lease_keys,
            &tags,
            &take,
            &claim_at,
            &owners,
            &lease_until,
            &rate_keys,
        ],
    )
    .await?;
    let mut jobs = manage::jobs(got)?;
    jobs.sort_by_key(|j| j.id); // ids follow the insertion order
    Ok(jobs
        .into_iter()
        .map(|job| Inserted {
            job,
            inserted: true,
        })
        .collect())
}

#[async_trait]
impl Store for PostgresStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    async fn transaction(&self, op: crate::sql::TxFn) -> StoreResult<()> {
        let mut client = self.client().await?;
        off_task(async move |stop| {
            let tx = client.transaction().await.map_err(pg_error)?;
            {
                let any = crate::sql::AnyTx::Postgres(crate::sql::PgTx::pooled(&tx));
                tokio::select! {
                    r = op(&any) => r?,
                    // The caller gave up (a timeout, a fence, shutdown): roll back, as dropping
                    // the transaction in the caller's own task would.
                    () = stop.cancelled() => return Err(StoreError::Aborted),
                }
            }
            tx.commit().await.map_err(pg_error)
        })
        .await
    }

    async fn transaction_shared(&self, op: crate::sql::SharedTxFn) -> StoreResult<()> {
        self.ops.write(op).await
    }

    async fn read_only(&self, op: crate::sql::TxFn) -> StoreResult<()> {
        let client = self.client().await?;
        off_task(async move |stop| {
            let any = crate::sql::AnyTx::Postgres(crate::sql::PgTx::pooled_client(&client));
            tokio::select! {
                r = op(&any) => r,
                () = stop.cancelled() => Err(StoreError::Aborted),
            }
        })
        .await
    }

    async fn migrate(&self, lines: &[&'static Line]) -> StoreResult<Vec<Applied>> {
        let client = self.client().await?;
        crate::sql::postgres::apply_lines(&client, &crate::store::with_jobs(lines)).await
    }

    async fn insert(&self, rows: Vec<InsertRow>) -> StoreResult<Vec<Inserted>> {
        self.insert_with(rows, None).await
    }

    async fn insert_claiming(
        &self,
        rows: Vec<InsertRow>,
        claim: InsertClaim,
    ) -> StoreResult<Vec<Inserted>> {
        self.insert_with(rows, Some(claim)).await
    }

    async fn claim(&self, req: ClaimRequest) -> StoreResult<Vec<Job>> {
        let capped = req.caps.iter().any(|(k, _)| req.kinds.contains(k));
        let cursors = &self.cursors;
        let claimed = self
            .write(async |tx| {
                tx.batch(CLAIM_PLAN).await?;
                if capped {
                    return claim::claim(tx, &req, &CLAIM_FROM_START, &CLAIM_CAPPED).await;
                }
                let mut rounds = claim::LeaseRounds::new(&req);
                while let Some(r) = rounds.next() {
                    let got = claim_from_cursor(tx, cursors, r).await?;
                    rounds.took(tx, got).await?;
                }
                Ok(rounds.into_claimed())
            })
            .await?;
        if !claimed.waited.is_empty() {
            // Once the claim committed: a release that looked for waiters before it did.
            let waited = &claimed.waited;
            self.read(async |tx| keys::wake_free(tx, waited, req.now).await)
                .await?;
        }
        if claimed.jobs.is_empty() {
            self.vacuum.found_nothing();
        }
        Ok(claimed.jobs)
    }

    fn idle(&self) {
        self.vacuum.idle();
    }

    async fn finish(&self, batch: &[Finish]) -> StoreResult<Vec<bool>> {
        // A few outcomes (a pull worker's answer, a short completion batch) share a commit with
        // other callers' (see [`group`]); a large batch fills a transaction by itself.
        let applied = if batch.len() < group::ALONE_FROM {
            self.finishes.write(batch.to_vec()).await?
        } else {
            let mut c = self.client().await?;
            finish_batch(&mut c, &batch.iter().collect::<Vec<_>>()).await?
        };
        // Each job ended left its row's dead versions in onus_live (see `vacuum`).
        let ended = applied.iter().filter(|a| **a).count() as u64;
        self.vacuum.ended(ended);
        Ok(applied)
    }

    async fn heartbeat(
        &self,
        owner: &str,
        held: &[HeldJob],
        lease_until: Timestamp,
    ) -> StoreResult<Renewal> {
        let mut ids: Vec<JobId> = held.iter().map(|h| h.id).collect();
        ids.sort_unstable();
        // Only the jobs this process holds: a row it lost track of keeps its old lease, which
        // runs out, and the rescuer takes it. Found by id; coalesce() keeps the planner off the
        // partial indexes of running jobs, as in `finish`.
        //
        // A renewal never waits for a row lock: a held job whose outcome is being written right
        // now (its row locked by the completion batch) is skipped, and reported alive from its
        // last committed version without a new lease; the write is about to end its lease anyway,
        // and if it fails the next renewal takes the row. Waiting instead made renewals and
        // completion batches wait on each other's rows, each holding some the other needed: a
        // deadlock PostgreSQL breaks after a second by failing one of them.
        let rows = self
            .on_renewal_conn(async |c| {
                c.query(
                    "WITH mine AS (
                        SELECT id FROM onus_live
                        WHERE coalesce(state, '') = 'running' AND coalesce(lease_owner, '') = $1 AND id = ANY($3)
                        ORDER BY id
                        FOR UPDATE SKIP LOCKED
                     ), renewed AS (
                        UPDATE onus_live j SET lease_expires_at = $2 WHERE j.id = ANY(ARRAY(SELECT id FROM mine))
                        RETURNING j.id, j.attempt, j.cancel_requested
                     ), slots AS (
                        UPDATE onus_leases l SET busy_until = $2 FROM renewed r WHERE l.job_id = r.id AND l.busy_until < $2
                     )
                     SELECT id, attempt, cancel_requested, true FROM renewed
                     UNION ALL
                     SELECT id, attempt, cancel_requested, false FROM onus_live
                     WHERE coalesce(state, '') = 'running' AND coalesce(lease_owner, '') = $1 AND id = ANY($3)
                       AND id NOT IN (SELECT id FROM mine)",
                    &[&owner, &lease_until, &ids],
                )
                .await
                .map_err(pg_error)
            })
            .await?;
        let mut renewed = Vec::with_capacity(rows.len());
        let mut busy = std::collections::HashSet::new();
        for r in &rows {
            let (id, attempt): (JobId, u32) = (r.get(0), r.get::<_, i32>(1) as u32);
            if r.get::<_, bool>(3) {
                renewed.push((id, attempt, r.get(2)));
            } else {
                busy.insert((id, attempt));
            }
        }
        let mut renewal = Renewal::of(held, &renewed);
        // Skipped while locked, but still this process's: not lost, not renewed either.
        if !busy.is_empty() {
            let attempts: std::collections::HashMap<JobId, u32> =
                held.iter().map(|h| (h.id, h.attempt)).collect();
            renewal
                .lost
                .retain(|id| !attempts.get(id).is_some_and(|a| busy.contains(&(*id, *a))));
        }
        Ok(renewal)
    }

    async fn database_time(&self) -> StoreResult<DatabaseTime> {
        let c = self.client().await?;
        let started = std::time::Instant::now();
        let row = c
            .query_one("SELECT clock_timestamp()", &[])
            .await
            .map_err(pg_error)?;
        Ok(DatabaseTime {
            at: row.get(0),
            round_trip: started.elapsed(),
            answered: std::time::Instant::now(),
        })
    }

    async fn listen(&self) -> StoreResult<Option<mpsc::UnboundedReceiver<Notice>>> {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(listen_loop(self.target.clone(), tx));
        Ok(Some(rx))
    }
}

/// Runs a component's operation, which need not be `Send` (it is written once for both
/// backends), to completion on a blocking thread, its queries driven by this runtime. If the
/// caller stops waiting, `stop` is cancelled, so the operation ends (rolled back) instead of
/// running on behind the caller's back.
async fn off_task(
    f: impl AsyncFnOnce(tokio_util::sync::CancellationToken) -> StoreResult<()> + Send + 'static,
) -> StoreResult<()> {
    let stop = tokio_util::sync::CancellationToken::new();
    let _cancel_on_drop = stop.clone().drop_guard();
    let handle = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || handle.block_on(f(stop)))
        .await
        .map_err(|e| StoreError::Query(format!("a database operation panicked: {e}"), None))?
}

/// Holds a LISTEN connection and forwards notices until the receiver is dropped; reconnects
/// (and says so, since notices may have been missed) when the connection is lost.
async fn listen_loop(target: connect::Target, tx: mpsc::UnboundedSender<Notice>) {
    let shown_url = target.shown.clone();
    let mut connected_before = false;
    let mut failing = false;
    loop {
        match target.config.connect(target.tls.clone()).await {
            Ok((client, mut conn)) => {
                let (ntx, mut nrx) = mpsc::unbounded_channel();
                let driver = tokio::spawn(async move {
                    let mut messages =
                        futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
                    while let Some(Ok(m)) = messages.next().await {
                        if let AsyncMessage::Notification(n) = m {
                            if ntx.send(n).is_err() {
                                return;
                            }
                        }
                    }
                });
                if client
                    .batch_execute("LISTEN onus_jobs; LISTEN onus_cancel")
                    .await
                    .is_ok()
                {
                    if failing || connected_before {
                        tracing::info!(database = %shown_url, "listening for notices again");
                        if tx.send(Notice::Reconnected).is_err() {
                            return;
                        }
                    }
                    failing = false;
                    connected_before = true;
                    loop {
                        tokio::select! {
                            n = nrx.recv() => {
                                let Some(n) = n else { break };
                                let notice = match n.channel() {
                                    "onus_jobs" => Notice::Jobs(n.payload().to_string()),
                                    "onus_cancel" => match n.payload().parse() {
                                        Ok(id) => Notice::Cancel(id),
                                        Err(_) => continue,
                                    },
                                    _ => continue,
                                };
                                if tx.send(notice).is_err() {
                                    driver.abort();
                                    return;
                                }
                            }
                            _ = tx.closed() => {
                                driver.abort();
                                return;
                            }
                        }
                    }
                }
                driver.abort();
                drop(client);
                if !failing {
                    tracing::warn!(database = %shown_url, "lost the notice connection; polling until it is back");
                    failing = true;
                }
            }
            Err(e) => {
                if !failing {
                    tracing::error!(database = %shown_url, error = %describe(&e), "cannot open the notice connection; polling until it is back");
                    failing = true;
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = tx.closed() => return,
        }
    }
}

/// One claim statement's worth for `req` (no kind capped), resuming from this process's cursor
/// for the queue when it has one (see [`Cursors`]).
async fn claim_from_cursor(
    tx: &PgTx<'_>,
    cursors: &Cursors,
    req: &ClaimRequest,
) -> StoreResult<Vec<Job>> {
    let kinds: Vec<&String> = req.kinds.iter().collect();
    let after = cursors.resume(req);
    let (sql, extra) = match after {
        None => (&*CLAIM_FROM_START, Vec::new()),
        Some((p, at, id)) => (&*CLAIM_AFTER, vec![p.into(), at.into(), id.into()]),
    };
    let mut rows = claim::rows(tx, sql, req, &kinds, req.limit, extra).await?;
    // A resumed claim that came back short reached the backlog's end: what it could not fill
    // comes from the front (a job handed back, or one sorting before the cursor, is never left
    // waiting for a wake-up that may not come).
    let mut from_start = after.is_none();
    if !from_start && rows.len() < req.limit {
        let rest = req.limit - rows.len();
        let more = claim::rows(tx, &CLAIM_FROM_START, req, &kinds, rest, Vec::new());
        rows.extend(more.await?);
        from_start = true;
    }
    let mut jobs = Vec::with_capacity(rows.len());
    let mut last = None;
    for r in rows {
        let src: i32 = r.get("src")?;
        let job = manage::claimed(r, req)?;
        if src == 0 {
            last = last.max(Some((job.priority, job.run_at, job.id)));
        }
        jobs.push(job);
    }
    cursors.record(req, !from_start, last, jobs.len());
    Ok(jobs)
}

/// Records `batch` in one transaction on `c`; for each, whether the guarded write applied. A job
/// listed twice (two callers' batches answering it at once) applies at most once.
pub(crate) async fn finish_batch(
    c: &mut deadpool_postgres::Object,
    batch: &[&Finish],
) -> StoreResult<Vec<bool>> {
    let tx = c.transaction().await.map_err(pg_error)?;
    tx.batch_execute(NO_SEQSCAN).await.map_err(pg_error)?;
    // Lease-key locks in one order (sorted), before any is needed: two finishers whose
    // batches release the same keys in different orders can never deadlock.
    let keys: Vec<&str> = batch
        .iter()
        .filter_map(|f| f.release_lease.as_deref())
        .collect();
    keys::lock_keys(&PgTx::pooled(&tx), &keys).await?;
    let mut applied = vec![false; batch.len()];
    // The common case, completions (releasing the job's lease key or not), all in one
    // statement whatever their owners (a group commit mixes many pull workers' answers).
    let mut plain: Vec<usize> = Vec::new();
    let mut now = None;
    // Rows in id order, as renewals and other batches take them: two writers never each
    // hold a row the other waits for.
    let mut order: Vec<usize> = (0..batch.len()).collect();
    order.sort_by_key(|&i| batch[i].id);
    for i in order {
        let f = &batch[i];
        if matches!(f.transition, Transition::Complete)
            && f.periodic.is_none()
            && f.expired_before.is_none()
            && f.result.is_none()
        {
            plain.push(i);
            now = now.max(Some(f.now));
        } else {
            applied[i] = finish::one(&PgTx::pooled(&tx), f, false).await?;
        }
    }
    // Each row is found by its id (the primary key) among the batch's ids, and its attempt and
    // owner checked against the batch's listings as a hashed set (kept a filter by the CASE, so
    // the planner never turns it into a join): no plan joins the batch to onus_live on an estimate
    // (its statistics lag its churn; plans that trusted them walked the whole table, or the batch
    // once per row, for each batch), and no row is locked before it is deleted (the deletion
    // checks the guard again on a row changed meanwhile). The state and the owner are compared
    // through coalesce() so that no partial index of running jobs matches the statement: the
    // planner's statistics lag a fast-growing table and call such an index tiny, and it then
    // walked every job this process held for each id of the batch (300 ms a batch at 64
    // slots through the index by owner; 430 ms through the index by lease expiry once the
    // first was gone).
    //
    // A completion that releases a lease key frees its slot and wakes as many sleeping
    // waiters of the key as it freed slots, as `release_lease` does one by one, in the same
    // statement: the batch holds its keys' locks for one statement, not for a round trip per
    // job (with many keys, every job waiting on any of them waited for the whole batch).
    //
    // A job listed twice (two callers answering it at once) is updated once: the statement
    // answers the ids and attempts it wrote, and the first listing of each applies.
    //
    // The job's end is appended to onus_job_ends, not written into its row (jobs migration 11):
    // the job row of a job that succeeds is written once, at its insert.
    if let Some(now) = now {
        let ids: Vec<JobId> = plain.iter().map(|&i| batch[i].id).collect();
        let attempts: Vec<i32> = plain.iter().map(|&i| batch[i].attempt as i32).collect();
        let owners: Vec<&str> = plain.iter().map(|&i| batch[i].owner.as_str()).collect();
        let releases: Vec<Option<&str>> = plain
            .iter()
            .map(|&i| batch[i].release_lease.as_deref())
            .collect();
        let stmt = tx
            .prepare_cached(
                "WITH u AS (
                    SELECT * FROM unnest($2::bigint[], $3::integer[], $4::text[], $5::text[]) AS u(id, attempt, owner, release)
                 ), gone AS (
                    DELETE FROM onus_live l
                    WHERE l.id = ANY($2) AND coalesce(l.state, '') = 'running'
                      AND CASE WHEN (l.id, l.attempt, coalesce(l.lease_owner, '')) IN (SELECT id, attempt, owner FROM u)
                               THEN true ELSE false END
                    RETURNING l.id, l.queue, l.kind, l.attempt, l.attempted_at, l.run_at, l.cancel_requested, l.lease_owner
                 ), done AS (
                    INSERT INTO onus_job_ends (id, attempt, attempted_at, run_at, finalized_at, cancel_requested)
                    SELECT id, attempt, attempted_at, run_at, $1, cancel_requested FROM gone
                 ), counted AS (
                    INSERT INTO onus_job_deltas (queue, kind, state, minute, n)
                    SELECT queue, kind, 'completed', date_trunc('minute', $1::timestamptz), count(*) FROM gone GROUP BY queue, kind
                 ), freed AS (
                    DELETE FROM onus_leases l USING u d
                    WHERE d.release IS NOT NULL AND l.key = d.release AND l.job_id = d.id
                      AND l.job_id = ANY(ARRAY(SELECT id FROM gone))
                    RETURNING l.key
                 ), wake AS (
                    SELECT w.id FROM (SELECT key, count(*) AS n FROM freed GROUP BY key) f,
                         LATERAL (SELECT w.id FROM onus_live w
                                  WHERE w.lease_key = f.key AND w.state = 'snoozed' AND w.lease_wait AND w.run_at > $1
                                  ORDER BY w.run_at LIMIT f.n FOR UPDATE SKIP LOCKED) w
                 ), woken AS (
                    UPDATE onus_live j SET run_at = LEAST(j.created_at, $1)
                    WHERE j.id = ANY(ARRAY(SELECT id FROM wake))
                    RETURNING j.queue
                 )
                 SELECT id, attempt, lease_owner, false FROM gone
                 UNION ALL
                 SELECT NULL, NULL, NULL, pg_notify('onus_jobs', q) IS NULL FROM (SELECT DISTINCT queue AS q FROM woken) n",
            )
            .await
            .map_err(pg_error)?;
        let rows = tx
            .query(&stmt, &[&now, &ids, &attempts, &owners, &releases])
            .await
            .map_err(pg_error)?;
        // Each job written applies through its first listing of the attempt and owner written
        // (looked up once per row, not by a search of the batch per row).
        let mut first: rustc_hash::FxHashMap<(JobId, i32, &str), usize> =
            rustc_hash::FxHashMap::with_capacity_and_hasher(plain.len(), Default::default());
        for &i in plain.iter().rev() {
            let f = &batch[i];
            first.insert((f.id, f.attempt as i32, f.owner.as_str()), i);
        }
        for r in &rows {
            // The owner read in place, not copied out.
            let written: (Option<i64>, Option<i32>, Option<&str>) = (r.get(0), r.get(1), r.get(2));
            if let (Some(id), Some(attempt), Some(owner)) = written {
                if let Some(&i) = first.get(&(id, attempt, owner)) {
                    applied[i] = true;
                }
            }
        }
    }
    tx.commit().await.map_err(pg_error)?;
    Ok(applied)
}
