//! The SQLite store: the embedded default, one file, zero set-up.
//!
//! One writer thread owns the only write connection and commits every write that queued up while
//! the previous commit was syncing in a single transaction (group commit), so many workers never
//! meet `database is locked` and a durable commit costs one sync for a whole batch. Each write runs
//! in its own savepoint, so one failing write never undoes its neighbours. Reads use a small pool of
//! separate connections (WAL lets them run beside the writer). A caller is answered only after its
//! write is committed: an acknowledged insert survives a crash.
//!
//! Other processes may share the file (the CLI, or a second `onus serve`): writers take the lock
//! with `BEGIN IMMEDIATE` and wait for it (`busy_timeout`) instead of failing.

use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::Connection;
use tokio::sync::oneshot;

use super::*;
use crate::clock::{from_micros, Timestamp};
use crate::job::{Job, JobId};
use crate::sql::{Backend, Sql, Tx, Value};

pub use rusqlite;

const CLAIM_SQL: &str = include_str!("claim.sql");

static CLAIM: std::sync::LazyLock<Sql> =
    std::sync::LazyLock::new(|| Sql::for_backend("onus_live", Backend::Sqlite, CLAIM_SQL.into()));

/// The claim when some of its kinds are capped: the due jobs of every kind ranked in one order,
/// each capped kind's taking at most its room ($7, a JSON object of kind to room), so a capped
/// kind keeps its priority beside an uncapped backlog.
static CLAIM_CAPPED: std::sync::LazyLock<Sql> = std::sync::LazyLock::new(|| {
    let mut s = CLAIM_SQL.to_string();
    for (from, to) in [
        ("SELECT id, priority, run_at FROM onus_live", "SELECT id, kind, priority, run_at FROM onus_live"),
        ("SELECT id, priority, run_at FROM (", "SELECT id, kind, priority, run_at FROM ("),
        (
            "SELECT id FROM (",
            "SELECT id FROM (SELECT *, row_number() OVER (PARTITION BY kind ORDER BY priority, run_at, id) AS rn FROM (",
        ),
        (
            ") ORDER BY priority, run_at, id LIMIT $6",
            ")) ranked WHERE rn <= coalesce((SELECT value FROM json_each($7) WHERE key = ranked.kind), rn)
        ORDER BY priority, run_at, id LIMIT $6",
        ),
    ] {
        assert!(s.contains(from), "claim.sql has {from:?}");
        s = s.replace(from, to);
    }
    Sql::for_backend("onus_live", Backend::Sqlite, s)
});

/// How hard a commit waits for the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// `synchronous = FULL`: a confirmed write survives power loss (the default).
    Full,
    /// `synchronous = NORMAL`: survives a process crash, may lose the last commits on power loss; faster.
    Normal,
}

/// How to open a SQLite store.
#[derive(Debug, Clone)]
pub struct SqliteOptions {
    /// The database file (created if missing).
    pub path: PathBuf,
    /// Commit durability.
    pub durability: Durability,
    /// How long a write waits for another process's lock before failing.
    pub busy_timeout: Duration,
    /// Most writes committed in one transaction.
    pub max_batch: usize,
    /// Whether opening applies the job layer's pending migrations (the default). Without it,
    /// apply them with [`Store::migrate`] (`onus migrate`) before use.
    pub migrate: bool,
    /// How often, while a runtime listens ([`Store::listen`]) and the writer has nothing to do,
    /// it asks SQLite whether another process committed (`PRAGMA data_version`, a read of shared
    /// memory, no disk access); such a commit wakes this process's idle workers. 2 ms by default:
    /// a job another process inserts starts here within about a millisecond of its commit on
    /// average. After a second without another process's commit the writer asks every 100 ms
    /// (or this interval, if longer) until one comes, so an idle server costs next to nothing.
    pub watch_interval: Duration,
}

impl SqliteOptions {
    /// Options for the file at `path`, durable.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        SqliteOptions {
            path: path.into(),
            durability: Durability::Full,
            busy_timeout: Duration::from_secs(30),
            max_batch: 1024,
            migrate: true,
            watch_interval: Duration::from_millis(2),
        }
    }

    /// Parses `sqlite://relative/path.db`, `sqlite:///absolute/path.db` or `sqlite:path.db`, with an
    /// optional `?synchronous=normal` (or `full`, the default).
    pub fn from_url(url: &str) -> StoreResult<Self> {
        let rest = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
            .ok_or_else(|| StoreError::BadUrl(format!("{url:?} is not a sqlite:// URL")))?;
        let (path, query) = match rest.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (rest, None),
        };
        if path.is_empty() {
            return Err(StoreError::BadUrl(format!(
                "{url:?} names no file; write it like sqlite://onus.db or sqlite:///var/lib/onus/onus.db"
            )));
        }
        let mut o = SqliteOptions::new(path);
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("synchronous", v)) if v.eq_ignore_ascii_case("full") => o.durability = Durability::Full,
                Some(("synchronous", v)) if v.eq_ignore_ascii_case("normal") => o.durability = Durability::Normal,
                _ => {
                    return Err(StoreError::BadUrl(format!(
                        "unknown option {pair:?} in {url:?}; the one option is synchronous=full (default) or synchronous=normal"
                    )))
                }
            }
        }
        Ok(o)
    }
}

/// Answers a write's caller once its batch is decided: with the batch's failure if it failed.
type Deliver = Box<dyn FnOnce(Option<&BatchError>) + Send>;
/// A queued write: run on the writer's connection inside the batch transaction, or (given `None`,
/// when no transaction could be begun) fail without running. Also returns its own error's text,
/// if it failed.
type Work = Box<dyn FnOnce(Option<&Connection>) -> (Deliver, Option<String>) + Send>;

/// Why a whole batch failed: the transaction could not begin, was rolled back by SQLite, or could
/// not commit.
#[derive(Debug, Clone)]
struct BatchError {
    transient: bool,
    message: String,
}

impl BatchError {
    fn of(what: &str, e: &rusqlite::Error) -> Self {
        BatchError {
            transient: crate::sql::sqlite::transient(e),
            message: format!("{what}: {}", crate::sql::sqlite::with_hint(e)),
        }
    }

    fn to_error(&self) -> StoreError {
        if self.transient {
            StoreError::Unavailable(self.message.clone(), None)
        } else {
            StoreError::Query(self.message.clone(), None)
        }
    }
}

/// The SQLite store.
#[derive(Debug)]
pub struct SqliteStore {
    writer: Mutex<Option<mpsc::Sender<Work>>>,
    /// Where the writer reports other processes' commits, once a runtime listens.
    watch: Arc<Mutex<Option<tokio::sync::mpsc::UnboundedSender<Notice>>>>,
    readers: Arc<ReaderPool>,
    path: PathBuf,
    /// The file as opened, to notice it removed or replaced.
    file: Option<FileId>,
}

#[derive(Debug)]
struct ReaderPool {
    opts: SqliteOptions,
    idle: Mutex<Vec<Connection>>,
}

fn open_err(path: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::Open(format!(
        "cannot open the SQLite database at {}: {e}; check that the directory exists, is writable, and that the file is an Onus database",
        path.display()
    ))
}

fn connect(opts: &SqliteOptions, write: bool) -> StoreResult<Connection> {
    let path = &opts.path;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.is_dir() {
            return Err(open_err(
                path,
                format!("directory {} does not exist", dir.display()),
            ));
        }
    }
    let conn = Connection::open(path).map_err(|e| open_err(path, e))?;
    conn.busy_timeout(opts.busy_timeout)
        .map_err(|e| open_err(path, e))?;
    conn.set_prepared_statement_cache_capacity(64);
    let sync = match opts.durability {
        Durability::Full => "FULL",
        Durability::Normal => "NORMAL",
    };
    let pragmas = if write {
        format!("PRAGMA journal_mode = WAL; PRAGMA synchronous = {sync}; PRAGMA temp_store = MEMORY; PRAGMA cache_size = -8000;")
    } else {
        "PRAGMA temp_store = MEMORY; PRAGMA cache_size = -2000;".to_string()
    };
    conn.execute_batch(&pragmas)
        .map_err(|e| open_err(path, e))?;
    Ok(conn)
}

/// Runs `f` in a transaction of its own that holds the write lock (before the writer starts).
fn immediate<R>(
    conn: &mut Connection,
    path: &Path,
    f: impl FnOnce(&Connection) -> StoreResult<R>,
) -> StoreResult<R> {
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(|e| open_err(path, e))?;
    let r = f(&tx)?;
    tx.commit().map_err(|e| open_err(path, e))?;
    Ok(r)
}

impl SqliteStore {
    /// Opens (creating if needed) and migrates the database, and starts its writer thread.
    pub async fn open(opts: SqliteOptions) -> StoreResult<Self> {
        let o = opts.clone();
        let conn = tokio::task::spawn_blocking(move || -> StoreResult<Connection> {
            let mut conn = connect(&o, true)?;
            if o.migrate {
                immediate(&mut conn, &o.path, |c| {
                    crate::sql::sqlite::apply_lines(c, &crate::store::with_jobs(&[]))
                })
                .map_err(|e| match e {
                    StoreError::Open(m) => StoreError::Open(format!(
                        "cannot apply the schema of the SQLite database at {}: {m}",
                        o.path.display()
                    )),
                    e => open_err(&o.path, e),
                })?;
            }
            Ok(conn)
        })
        .await
        .map_err(|e| StoreError::Open(e.to_string()))??;
        let (tx, rx) = mpsc::channel::<Work>();
        let max_batch = opts.max_batch.max(1);
        let watch = Arc::new(Mutex::new(None));
        let w = Watch {
            to: watch.clone(),
            every: opts.watch_interval.max(Duration::from_micros(100)),
            last_seen: std::time::Instant::now(),
        };
        let file = FileId::of(&opts.path);
        let writer_file = file.clone();
        std::thread::Builder::new()
            .name("onus-sqlite-writer".into())
            .spawn(move || writer_loop(conn, rx, max_batch, w, writer_file))
            .map_err(|e| StoreError::Open(format!("cannot start the SQLite writer thread: {e}")))?;
        Ok(SqliteStore {
            writer: Mutex::new(Some(tx)),
            watch,
            readers: Arc::new(ReaderPool {
                opts: opts.clone(),
                idle: Mutex::new(Vec::new()),
            }),
            path: opts.path,
            file,
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` in the writer's current transaction (committed with its batch; rolled back to a
    /// savepoint if `f` fails). Answers only once committed.
    pub async fn write<R, F>(&self, f: F) -> StoreResult<R>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<R> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let work: Work = Box::new(move |conn: Option<&Connection>| {
            let r = conn.map(|conn| in_savepoint(conn, f));
            let own = match &r {
                Some(Err(e)) => Some(e.to_string()),
                _ => None,
            };
            let deliver: Deliver = Box::new(move |batch: Option<&BatchError>| {
                let r = match (r, batch) {
                    (Some(Err(e)), _) => Err(e), // its own error says the most
                    (Some(Ok(v)), None) => Ok(v),
                    (_, Some(b)) => Err(b.to_error()),
                    (None, None) => Err(StoreError::Query("the write was not run".into(), None)),
                };
                let _ = tx.send(r);
            });
            (deliver, own)
        });
        {
            let guard = self.writer.lock().unwrap_or_else(|e| e.into_inner());
            guard
                .as_ref()
                .ok_or(StoreError::Closed)?
                .send(work)
                .map_err(|_| StoreError::Closed)?;
        }
        rx.await.map_err(|_| StoreError::Closed)?
    }

    /// Runs `f` on a read connection.
    pub async fn read<R, F>(&self, f: F) -> StoreResult<R>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<R> + Send + 'static,
    {
        let pool = self.readers.clone();
        tokio::task::spawn_blocking(move || {
            let conn = pool.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
            let conn = match conn {
                Some(c) => c,
                None => connect(&pool.opts, false)?,
            };
            let r = f(&conn);
            pool.idle
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(conn);
            r
        })
        .await
        .map_err(|e| StoreError::Query(e.to_string(), None))?
    }
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        // Closing the channel ends the writer thread once it has committed what is queued.
        self.writer.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}

/// Runs `f` in its own savepoint, so its failure undoes only its own writes. A panic in `f` is
/// contained to this write (an error for its caller), never the writer thread.
fn in_savepoint<R>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> StoreResult<R>,
) -> StoreResult<R> {
    conn.execute_batch("SAVEPOINT onus_op").map_err(job_error)?;
    let r =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(conn))).unwrap_or_else(|p| {
            Err(StoreError::Query(
                format!(
                    "a write panicked: {}",
                    crate::outcome::panic_message(p.as_ref())
                ),
                None,
            ))
        });
    if conn.is_autocommit() {
        // SQLite rolled the whole transaction back (it does on SQLITE_FULL, IOERR, NOMEM): no
        // savepoint is left to release; the writer fails the batch with this error.
        return r.and(Err(StoreError::Query(
            "the write transaction was rolled back by SQLite".into(),
            None,
        )));
    }
    if r.is_err() {
        let _ = conn.execute_batch("ROLLBACK TO onus_op");
        let _ = conn.execute_batch("RELEASE onus_op");
        return r;
    }
    conn.execute_batch("RELEASE onus_op").map_err(job_error)?;
    r
}

/// The writer's watch for other processes' commits.
struct Watch {
    to: Arc<Mutex<Option<tokio::sync::mpsc::UnboundedSender<Notice>>>>,
    every: Duration,
    /// When another process's commit was last seen (or the watch began).
    last_seen: std::time::Instant,
}

/// Quiet this long (no other process's commit seen), the watch slows to [`WATCH_QUIET_EVERY`].
const WATCH_QUIET_AFTER: Duration = Duration::from_secs(1);
const WATCH_QUIET_EVERY: Duration = Duration::from_millis(100);

impl Watch {
    fn listener(&self) -> Option<tokio::sync::mpsc::UnboundedSender<Notice>> {
        self.to.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// How long the idle writer waits between checks now.
    fn interval(&self) -> Duration {
        if self.last_seen.elapsed() < WATCH_QUIET_AFTER {
            self.every
        } else {
            self.every.max(WATCH_QUIET_EVERY)
        }
    }

    /// Tells the listener when another connection (another process: this one writes only through
    /// `conn`) committed since `seen`. `data_version` changes only for other connections' commits.
    fn check(&mut self, conn: &Connection, seen: &mut Option<i64>) {
        let Some(to) = self.listener() else { return };
        let Ok(v) = conn.query_row("PRAGMA data_version", [], |r| r.get::<_, i64>(0)) else {
            return;
        };
        if seen.is_some_and(|s| s != v) {
            self.last_seen = std::time::Instant::now();
            if to.send(Notice::Written).is_err() {
                self.to.lock().unwrap_or_else(|e| e.into_inner()).take();
            }
        }
        *seen = Some(v);
    }
}

/// One transaction per batch of queued writes (group commit). While a runtime listens, an idle
/// writer checks every `watch.interval()` whether another process committed.
fn writer_loop(
    conn: Connection,
    rx: mpsc::Receiver<Work>,
    max_batch: usize,
    mut watch: Watch,
    file: Option<FileId>,
) {
    let mut delivers: Vec<Deliver> = Vec::with_capacity(max_batch);
    let mut seen = None;
    let mut checked = std::time::Instant::now();
    loop {
        let first = if watch.listener().is_some() {
            if checked.elapsed() >= watch.interval() {
                watch.check(&conn, &mut seen);
                checked = std::time::Instant::now();
            }
            match rx.recv_timeout(watch.interval()) {
                Ok(w) => w,
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        } else {
            match rx.recv() {
                Ok(w) => w,
                Err(_) => break,
            }
        };
        if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
            // Everything queued now would wait out the same lock one busy timeout after another:
            // fail it all at once with the same error.
            let err = BatchError::of("cannot begin a write transaction", &e);
            first(None).0(Some(&err));
            while let Ok(w) = rx.try_recv() {
                w(None).0(Some(&err));
            }
            continue;
        }
        let run = |w: Work, delivers: &mut Vec<Deliver>| {
            let (d, own) = w(Some(&conn));
            delivers.push(d);
            if conn.is_autocommit() {
                // The transaction is gone: what ran before it was undone, and anything run now
                // would commit alone. Fail the batch with the error that ended it.
                let why = own.unwrap_or_else(|| "a write ended the transaction".into());
                // Transient for the others in the batch: they did nothing wrong, and may succeed
                // in the next one (the write that caused it keeps its own error).
                Some(BatchError {
                    transient: true,
                    message: format!("the write transaction was rolled back by SQLite ({why}); nothing in this batch was written"),
                })
            } else {
                None
            }
        };
        let mut lost = run(first, &mut delivers);
        while lost.is_none() && delivers.len() < max_batch {
            match rx.try_recv() {
                Ok(w) => lost = run(w, &mut delivers),
                Err(_) => break,
            }
        }
        // A file removed or replaced under the open connection would take this commit into an
        // unlinked file, lost at the next open: refuse it instead.
        let lost = lost.or_else(|| file.as_ref().and_then(FileId::moved));
        let err = match lost {
            Some(e) => {
                if !conn.is_autocommit() {
                    let _ = conn.execute_batch("ROLLBACK");
                }
                Some(e)
            }
            None => match conn.execute_batch("COMMIT") {
                Ok(()) => None,
                Err(e) => {
                    let _ = conn.execute_batch("ROLLBACK");
                    Some(BatchError::of("commit failed", &e))
                }
            },
        };
        for d in delivers.drain(..) {
            d(err.as_ref());
        }
    }
}

/// Which file the database was opened as (device and inode), to notice it removed or replaced.
#[derive(Debug, Clone)]
struct FileId {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl FileId {
    fn of(path: &Path) -> Option<FileId> {
        use std::os::unix::fs::MetadataExt as _;
        let m = std::fs::metadata(path).ok()?;
        Some(FileId {
            path: path.to_path_buf(),
            dev: m.dev(),
            ino: m.ino(),
        })
    }

    /// Why a commit must not go ahead, when the file at the path is no longer the one open.
    fn moved(&self) -> Option<BatchError> {
        use std::os::unix::fs::MetadataExt as _;
        let same = std::fs::metadata(&self.path)
            .map(|m| m.dev() == self.dev && m.ino() == self.ino)
            .unwrap_or(false);
        (!same).then(|| BatchError {
            transient: true,
            message: format!(
                "the SQLite file {} was removed or replaced while open; nothing of this write was kept: put the file back, or restart onus to open the database now at that path",
                self.path.display()
            ),
        })
    }
}

use crate::sql::sqlite::{error as job_error, micros};

/// Rows per multi-row insert statement, largest first: a run of rows without unique keys is
/// written by as few statements as these sizes allow, each prepared once per connection.
const BULK_SIZES: [usize; 7] = [256, 64, 16, 8, 4, 2, 1];

/// Inserts rows without unique keys, in order, by multi-row statements of [`BULK_SIZES`] rows.
pub(crate) fn insert_run(
    conn: &Connection,
    rows: Vec<InsertRow>,
    out: &mut Vec<Inserted>,
) -> StoreResult<()> {
    let mut rows = rows.into_iter();
    let mut left = rows.len();
    while left > 0 {
        let size = BULK_SIZES.into_iter().find(|s| *s <= left).unwrap_or(1);
        let chunk: Vec<InsertRow> = rows.by_ref().take(size).collect();
        left -= size;
        let mut stmt = conn.prepare_cached(&bulk_sql(size)).map_err(job_error)?;
        let text = |v: Result<String, serde_json::Error>| {
            v.map_err(|e| StoreError::Query(e.to_string(), None))
        };
        let owned = chunk
            .iter()
            .map(|r| {
                Ok((
                    text(serde_json::to_string(&r.args))?,
                    text(serde_json::to_string(&r.tags))?,
                    r.state.as_str(),
                    micros(r.run_at),
                    micros(r.created_at),
                ))
            })
            .collect::<StoreResult<Vec<(String, String, &str, i64, i64)>>>()?;
        let mut values: Vec<&dyn rusqlite::ToSql> = Vec::with_capacity(size * 11);
        for (r, (args, tags, state, run_at, created_at)) in chunk.iter().zip(&owned) {
            values.extend([
                &r.kind as &dyn rusqlite::ToSql,
                &r.queue,
                args,
                &r.priority,
                state,
                &r.max_attempts,
                run_at,
                created_at,
                &r.lease_key,
                tags,
                &r.rate_key,
            ]);
        }
        let n = stmt.execute(values.as_slice()).map_err(job_error)?;
        if n != chunk.len() {
            return Err(StoreError::Query(
                format!("an insert of {} rows wrote {n}", chunk.len()),
                None,
            ));
        }
        // One writer, and an AUTOINCREMENT key that nothing else writes during the statement:
        // the rows took consecutive ids in the order of the VALUES list, ending at the last.
        let last = conn.last_insert_rowid();
        let first = last - n as JobId + 1;
        // Their narrow rows (see migration 10).
        conn.prepare_cached(
            "INSERT INTO onus_live (id, queue, kind, priority, state, run_at, created_at, attempt, lease_key, rate_key)
             SELECT id, queue, kind, priority, state, run_at, created_at, attempt, lease_key, rate_key
             FROM onus_job_rows WHERE id BETWEEN ?1 AND ?2",
        )
        .and_then(|mut s| s.execute([first, last]))
        .map_err(job_error)?;
        out.extend(chunk.into_iter().zip(first..).map(|(r, id)| Inserted {
            job: fresh_job(id, r),
            inserted: true,
        }));
    }
    Ok(())
}

fn bulk_sql(rows: usize) -> String {
    let one = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
    let values = vec![one; rows].join(", ");
    format!(
        "INSERT INTO onus_job_rows (kind, queue, args, priority, state, max_attempts, run_at, created_at, lease_key, tags, rate_key)
         VALUES {values}"
    )
}

/// The job a row without a unique key became, as the database holds it (times to the
/// microsecond, every other column at its default).
fn fresh_job(id: JobId, r: InsertRow) -> Job {
    let at = |t: Timestamp| from_micros(micros(t));
    Job {
        id,
        kind: r.kind,
        queue: r.queue,
        args: r.args,
        priority: r.priority,
        state: r.state,
        attempt: 0,
        max_attempts: r.max_attempts,
        run_at: at(r.run_at),
        created_at: at(r.created_at),
        attempted_at: None,
        finalized_at: None,
        errors: Vec::new(),
        snoozes: 0,
        discard_reason: None,
        unique_key: None,
        lease_key: r.lease_key,
        lease_owner: None,
        lease_expires_at: None,
        cancel_requested: false,
        tags: r.tags,
        progress: None,
        result: None,
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn health(&self) -> StoreResult<()> {
        if let Some(moved) = self.file.as_ref().and_then(FileId::moved) {
            return Err(moved.to_error());
        }
        self.get(0).await.map(|_| ())
    }

    fn backend(&self) -> &'static str {
        "sqlite"
    }

    fn hands_on_lease_slots(&self) -> bool {
        true
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    async fn transaction(&self, op: crate::sql::TxFn) -> StoreResult<()> {
        self.write(move |conn| {
            let tx = crate::sql::AnyTx::Sqlite(crate::sql::SqliteTx::new(conn));
            crate::sql::ready(op(&tx))
        })
        .await
    }

    async fn read_only(&self, op: crate::sql::TxFn) -> StoreResult<()> {
        self.read(move |conn| {
            let tx = crate::sql::AnyTx::Sqlite(crate::sql::SqliteTx::new(conn));
            crate::sql::ready(op(&tx))
        })
        .await
    }

    async fn insert_claiming(
        &self,
        rows: Vec<InsertRow>,
        claim: InsertClaim,
    ) -> StoreResult<Vec<Inserted>> {
        flow!(self, write, |tx| insert::insert(tx, rows, Some(&claim)))
    }

    async fn claim(&self, req: ClaimRequest) -> StoreResult<Vec<Job>> {
        // One writer: a release runs wholly before or after this claim and sees its waiters.
        let claimed = flow!(self, write, |tx| claim::claim(
            tx,
            &req,
            &CLAIM,
            &CLAIM_CAPPED
        ))?;
        Ok(claimed.jobs)
    }

    async fn heartbeat(
        &self,
        owner: &str,
        held: &[HeldJob],
        lease_until: Timestamp,
    ) -> StoreResult<Renewal> {
        let (owner, held) = (owner.to_string(), held.to_vec());
        flow!(self, write, |tx| renew(tx, &owner, &held, lease_until))
    }

    /// Another process's commits, seen by the writer ([`SqliteOptions::watch_interval`]). One
    /// listener at a time: a second call takes the watch over.
    async fn listen(&self) -> StoreResult<Option<tokio::sync::mpsc::UnboundedReceiver<Notice>>> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        *self.watch.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
        // A writer waiting for work without a deadline starts watching after its next write.
        self.write(|_| Ok(())).await?;
        Ok(Some(rx))
    }
}

static RENEW: Sql = Sql::new(
    "onus_live",
    "UPDATE onus_live SET lease_expires_at = $1
     WHERE state = 'running' AND lease_owner = $2 AND id IN (SELECT value FROM json_each($3))
     RETURNING id, attempt, cancel_requested",
);

static RENEW_SLOTS: Sql = Sql::new(
    "onus_leases",
    "UPDATE onus_leases SET busy_until = $1
     WHERE busy_until < $1 AND job_id IN (SELECT value FROM json_each($2))",
);

/// Extends to `lease_until` the leases of the jobs in `held` that `owner` still runs, and the
/// lease-key slots they hold: only those listed, so a row the process lost track of keeps its old
/// lease, which runs out, and the rescuer takes it.
async fn renew<T: Tx + ?Sized>(
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
