//! One migration runner for every line of tables: the job layer's (`jobs`) and each component's
//! (`webhooks`, ...). A line is a numbered list of `.sql` files per backend; each applied file is
//! recorded in `onus_migrations (line, version, name, applied_at)`. A store applies them
//! ([`crate::Store::migrate`]) under one lock (PostgreSQL advisory lock, SQLite write lock), so
//! many processes may start at once; each migration commits with its record or not at all.

use serde::Serialize;

use super::{Backend, Sql, Tx};
use crate::clock::Timestamp;
use crate::sql::error::{StoreError, StoreResult};

/// One numbered migration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migration {
    /// Its number, from 1 with no gaps.
    pub version: u32,
    /// Its file name.
    pub name: &'static str,
    /// Its SQL.
    pub sql: &'static str,
}

/// A named line of migrations, per backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Line {
    /// The line's name (`jobs`, `webhooks`, `mail`).
    pub name: &'static str,
    /// Its SQLite migrations, in order.
    pub sqlite: &'static [Migration],
    /// Its PostgreSQL migrations, in order.
    pub postgres: &'static [Migration],
}

/// Builds a [`Migration`] list from files in a directory next to the calling source file:
/// `migrations!("../migrations/sqlite", "001_tables.sql", "002_more.sql")`, numbered in order.
#[macro_export]
macro_rules! migrations {
    ($dir:literal, $($file:literal),+ $(,)?) => {{
        const FILES: &[(&str, &str)] = &[$(($file, include_str!(concat!($dir, "/", $file)))),+];
        const N: usize = FILES.len();
        const LIST: [$crate::sql::Migration; N] = {
            let mut out = [$crate::sql::Migration { version: 0, name: "", sql: "" }; N];
            let mut i = 0;
            while i < N {
                out[i] = $crate::sql::Migration { version: (i + 1) as u32, name: FILES[i].0, sql: FILES[i].1 };
                i += 1;
            }
            out
        };
        &LIST
    }};
}

impl Line {
    /// Its migrations for `backend`.
    pub fn migrations(&self, backend: Backend) -> &'static [Migration] {
        match backend {
            Backend::Sqlite => self.sqlite,
            Backend::Postgres => self.postgres,
        }
    }

    /// The newest version this build knows for `backend`.
    pub fn latest(&self, backend: Backend) -> u32 {
        self.migrations(backend).len() as u32
    }

    /// The migrations still to apply after `applied` (the newest version recorded). A database
    /// newer than this build is refused: an older Onus must not run on a newer schema.
    pub fn pending(&self, backend: Backend, applied: u32) -> StoreResult<&'static [Migration]> {
        let all = self.migrations(backend);
        if applied as usize > all.len() {
            return Err(StoreError::Open(format!(
                "the database's {} tables are at version {applied}, newer than this Onus knows ({}); upgrade Onus",
                self.name,
                all.len()
            )));
        }
        Ok(&all[applied as usize..])
    }
}

/// Where one line stands in a database (a version recorded before `onus_migrations` existed
/// shows no time applied).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LineStatus {
    /// The line.
    pub line: String,
    /// The newest version applied (0: none).
    pub version: u32,
    /// The newest version this build knows.
    pub latest: u32,
    /// When the newest applied version was applied.
    pub applied_at: Option<Timestamp>,
    /// The files still to apply, in order.
    pub pending: Vec<String>,
}

impl LineStatus {
    /// Where `line` stands given its newest applied version.
    pub fn of(line: &Line, backend: Backend, version: u32, applied_at: Option<Timestamp>) -> Self {
        let all = line.migrations(backend);
        LineStatus {
            line: line.name.to_string(),
            version,
            latest: all.len() as u32,
            applied_at,
            pending: all
                .iter()
                .skip(version as usize)
                .map(|m| m.name.to_string())
                .collect(),
        }
    }

    /// True when the database is at the newest version this build knows.
    pub fn is_current(&self) -> bool {
        self.version == self.latest
    }

    /// True when the database is newer than this build: upgrade Onus.
    pub fn is_ahead(&self) -> bool {
        self.version > self.latest
    }
}

/// A migration a run applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Applied {
    /// The line.
    pub line: String,
    /// Its version.
    pub version: u32,
    /// Its file.
    pub name: String,
}

/// The error for a migration that failed: its line, number and file, and the database's word;
/// still [`StoreError::Unavailable`] when the database could not be reached.
pub(crate) fn failed(line: &Line, m: &Migration, why: StoreError) -> StoreError {
    let what = format!("migration {} {} ({}) failed", line.name, m.version, m.name);
    match why {
        StoreError::Unavailable(e, source) => {
            StoreError::Unavailable(format!("{what}: {e}"), source)
        }
        e => StoreError::Open(format!("{what}: {e}")),
    }
}

/// The line whose version an earlier Onus kept outside `onus_migrations` (SQLite's `PRAGMA
/// user_version`, PostgreSQL's `onus_schema`): the job store's.
pub(crate) const LEGACY_JOBS_LINE: &str = "jobs";

/// The records the schema kept before the shared runner, which a first run adopts: SQLite's
/// `PRAGMA user_version` and PostgreSQL's `onus_schema` for the jobs line, and the table
/// `onus_webhooks_schema` for webhooks. They are left in place (read, never written again).
pub(crate) const LEGACY_WEBHOOKS_TABLE: &str = "onus_webhooks_schema";

/// The newest version of each line and when it was applied.
pub(crate) type Recorded = std::collections::HashMap<String, (u32, Option<Timestamp>)>;

static MIGRATIONS_TABLE: Sql = Sql::per_backend(
    "onus_migrations",
    "CREATE TABLE IF NOT EXISTS onus_migrations (
        line       TEXT    NOT NULL,
        version    INTEGER NOT NULL,
        name       TEXT    NOT NULL,
        applied_at INTEGER NOT NULL,
        PRIMARY KEY (line, version)
    )",
    "CREATE TABLE IF NOT EXISTS onus_migrations (
        line       text        NOT NULL,
        version    integer     NOT NULL,
        name       text        NOT NULL,
        applied_at timestamptz NOT NULL,
        PRIMARY KEY (line, version)
    )",
);

static TABLE_EXISTS: Sql = Sql::per_backend(
    "the schema",
    "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = $1) AS e",
    "SELECT to_regclass($1) IS NOT NULL AS e",
);

static RECORDED: Sql = Sql::new(
    "onus_migrations",
    "SELECT line, max(version) AS version, max(applied_at) AS applied_at
     FROM onus_migrations GROUP BY line",
);

static RECORD: Sql = Sql::new(
    "onus_migrations",
    "INSERT INTO onus_migrations (line, version, name, applied_at) VALUES ($1, $2, $3, $4)",
);

/// Where an earlier Onus kept the job tables' version: the table that shows it was there, and
/// the statement that reads it.
static LEGACY_JOBS: (&str, &str, Sql) = (
    "onus_jobs",
    "onus_schema",
    Sql::per_backend(
        "the schema",
        "SELECT user_version AS v FROM pragma_user_version",
        "SELECT max(version) AS v FROM onus_schema",
    ),
);

async fn table_exists<T: Tx + ?Sized>(tx: &T, name: &str) -> StoreResult<bool> {
    let rows = tx.query(&TABLE_EXISTS, &[name.into()]).await?;
    rows.first().map_or(Ok(false), |r| r.get("e"))
}

fn version(v: i64) -> StoreResult<u32> {
    u32::try_from(v).map_err(|_| StoreError::Open(format!("{v} is not a migration version")))
}

/// The newest version of each line, read without writing: from `onus_migrations`, and for a line
/// it does not record yet, from where the schema kept it before (SQLite's `PRAGMA user_version`
/// beside the job tables, PostgreSQL's `onus_schema`; the table `onus_webhooks_schema`), with no
/// time applied.
pub(crate) async fn recorded<T: Tx + ?Sized>(tx: &T) -> StoreResult<Recorded> {
    let mut out = Recorded::new();
    if table_exists(tx, "onus_migrations").await? {
        for r in tx.query(&RECORDED, &[]).await? {
            let v = version(r.get("version")?)?;
            out.insert(r.get("line")?, (v, r.get("applied_at")?));
        }
    }
    let (jobs_table, pg_table, read) = &LEGACY_JOBS;
    let kept_at = match tx.backend() {
        Backend::Sqlite => jobs_table,
        Backend::Postgres => pg_table,
    };
    let legacy = [
        (LEGACY_JOBS_LINE, *kept_at, read.clone()),
        (
            "webhooks",
            LEGACY_WEBHOOKS_TABLE,
            Sql::built(
                "the schema",
                tx.backend(),
                format!("SELECT max(version) AS v FROM {LEGACY_WEBHOOKS_TABLE}"),
            ),
        ),
    ];
    for (line, table, read) in legacy {
        if !out.contains_key(line) && table_exists(tx, table).await? {
            let rows = tx.query(&read, &[]).await?;
            let v: Option<i64> = match rows.first() {
                Some(r) => r.get("v")?,
                None => None,
            };
            out.insert(line.into(), (version(v.unwrap_or(0))?, None));
        }
    }
    Ok(out)
}

async fn record<T: Tx + ?Sized>(tx: &T, line: &str, m: &Migration) -> StoreResult<()> {
    let now = crate::clock::trunc(chrono::Utc::now());
    let p = [line.into(), m.version.into(), m.name.into(), now.into()];
    tx.execute(&RECORD, &p).await.map(drop)
}

/// Applies the pending migrations of `lines`: on SQLite inside the caller's write transaction
/// (which holds the write lock), on PostgreSQL each in a transaction of its own with its record
/// (the caller holds the migration lock). Versions kept before `onus_migrations` existed are
/// recorded there first; the job tables' version is also kept where an earlier Onus looks for it
/// (and refuses a newer schema).
pub(crate) async fn apply<T: Tx + ?Sized>(
    tx: &T,
    lines: &[&'static Line],
) -> StoreResult<Vec<Applied>> {
    let backend = tx.backend();
    let own_transactions = backend == Backend::Postgres;
    let had = recorded(tx).await?;
    tx.execute(&MIGRATIONS_TABLE, &[]).await?;
    let mut out = Vec::new();
    for &line in lines {
        let (version, at) = had.get(line.name).copied().unwrap_or((0, None));
        if at.is_none() {
            // Adopted from the earlier record.
            for m in line.migrations(backend).iter().take(version as usize) {
                record(tx, line.name, m).await?;
            }
        }
        for m in line.pending(backend, version)? {
            let run = async {
                if own_transactions {
                    tx.batch("BEGIN").await?;
                }
                tx.batch(m.sql).await?;
                record(tx, line.name, m).await?;
                if own_transactions {
                    tx.batch("COMMIT").await?;
                }
                Ok::<(), StoreError>(())
            };
            if let Err(e) = run.await {
                if own_transactions {
                    let _ = tx.batch("ROLLBACK").await;
                }
                return Err(failed(line, m, e));
            }
            out.push(Applied {
                line: line.name.to_string(),
                version: m.version,
                name: m.name.to_string(),
            });
        }
        if line.name == LEGACY_JOBS_LINE {
            let latest = line.latest(backend);
            tx.batch(&match backend {
                Backend::Sqlite => format!("PRAGMA user_version = {latest}"),
                Backend::Postgres => format!(
                    "CREATE TABLE IF NOT EXISTS onus_schema (version integer NOT NULL);
                     DELETE FROM onus_schema; INSERT INTO onus_schema (version) VALUES ({latest})"
                ),
            })
            .await?;
        }
    }
    Ok(out)
}

/// Where each line stands, read without writing anything.
pub(crate) async fn status<T: Tx + ?Sized>(
    tx: &T,
    lines: &[&'static Line],
) -> StoreResult<Vec<LineStatus>> {
    let have = recorded(tx).await?;
    Ok(lines
        .iter()
        .map(|line| {
            let (v, at) = have.get(line.name).copied().unwrap_or((0, None));
            LineStatus::of(line, tx.backend(), v, at)
        })
        .collect())
}

/// Tables one backend's migrations create that the other has no counterpart of, with why.
pub const ONE_BACKEND_ONLY: &[(&str, &str)] = &[
    (
        "onus_job_deltas",
        "PostgreSQL appends counter changes so writers never wait on one counter row; \
         SQLite's one writer updates the counters in place",
    ),
    (
        "onus_schema",
        "PostgreSQL keeps the job tables' version where an earlier Onus looks for it; \
         SQLite keeps it in PRAGMA user_version",
    ),
];

static COLUMNS: Sql = Sql::per_backend(
    "the schema",
    "SELECT m.name || '.' || p.name AS col FROM sqlite_master m, pragma_table_info(m.name) p
     WHERE m.type IN ('table', 'view') AND m.name NOT LIKE 'sqlite_%' ORDER BY 1",
    "SELECT table_name || '.' || column_name AS col FROM information_schema.columns
     WHERE table_schema = current_schema() ORDER BY 1",
);

/// Every table and column of the database's schema, as `table.column`, sorted: read back from
/// the database, to compare what each backend's migrations made (a column a line adds on one
/// backend only is a bug; see [`ONE_BACKEND_ONLY`] for the tables that are not).
pub async fn columns<T: Tx + ?Sized>(tx: &T) -> StoreResult<Vec<String>> {
    tx.query(&COLUMNS, &[])
        .await?
        .iter()
        .map(|r| r.get("col"))
        .collect()
}

/// The columns only `sqlite` has and those only `postgres` has (each as [`columns`] gives
/// them), apart from the tables of [`ONE_BACKEND_ONLY`].
pub fn schema_differences(sqlite: &[String], postgres: &[String]) -> (Vec<String>, Vec<String>) {
    let compared = |col: &&String| {
        !ONE_BACKEND_ONLY
            .iter()
            .any(|(table, _)| col.starts_with(&format!("{table}.")))
    };
    let only = |a: &[String], b: &[String]| -> Vec<String> {
        a.iter()
            .filter(compared)
            .filter(|c| !b.contains(c))
            .cloned()
            .collect()
    };
    (only(sqlite, postgres), only(postgres, sqlite))
}
