//! The database layer on SQLite: component statements and the migration runner, on a
//! connection the caller holds in a write transaction (the store's writer, or the caller's own).

use std::collections::HashMap;
use std::sync::Arc;

use rusqlite::{params, Connection};

use crate::clock::{from_micros, Timestamp};
use crate::sql::error::driver;
use crate::sql::error::{StoreError, StoreResult};
use crate::sql::migrate::{Applied, Line, LineStatus};

const MIGRATIONS_TABLE: &str = "CREATE TABLE IF NOT EXISTS onus_migrations (
    line       TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    name       TEXT    NOT NULL,
    applied_at INTEGER NOT NULL,
    PRIMARY KEY (line, version)
)";

/// Errors that may clear up by themselves: another process holds the lock, the disk is full or
/// failing for now.
pub(crate) fn transient(e: &rusqlite::Error) -> bool {
    use rusqlite::ErrorCode::*;
    matches!(
        e.sqlite_error_code(),
        Some(DatabaseBusy | DatabaseLocked | DiskFull | SystemIoFailure | OutOfMemory)
    )
}

/// SQLite's message, and what to do about it where the cause is the machine's: a full disk, a
/// read-only file or directory, a file that cannot be opened.
pub(crate) fn with_hint(e: &rusqlite::Error) -> String {
    use rusqlite::ErrorCode::*;
    let hint = match e.sqlite_error_code() {
        Some(DiskFull) => {
            "; the disk holding the SQLite file is full: free space on it (nothing of this write was kept, and writes work again once there is room)"
        }
        Some(ReadOnly) => {
            "; the SQLite file or its directory is read-only: give this process write access to both (SQLite writes its -wal and -shm files beside the database)"
        }
        Some(CannotOpen) => {
            "; the SQLite file cannot be opened: check that its directory exists and this process may write there"
        }
        _ => "",
    };
    format!("{e}{hint}")
}

/// A SQLite error as a [`StoreError`].
pub(crate) fn error(e: rusqlite::Error) -> StoreError {
    error_in(e, "")
}

/// A SQLite error as a [`StoreError`], for a statement whose result has `columns` (a
/// comma-separated list naming, by position, the column a value of the wrong type was in).
pub(crate) fn error_in(e: rusqlite::Error, columns: &str) -> StoreError {
    if transient(&e) {
        StoreError::Unavailable(with_hint(&e), Some(driver(e)))
    } else if e.sqlite_error_code() == Some(rusqlite::ErrorCode::ConstraintViolation) {
        StoreError::Constraint(e.to_string(), Some(driver(e)))
    } else if let Some(column) = decode_column(&e, columns) {
        // A stored value that does not read as its type.
        StoreError::Decode {
            table: "the job tables",
            column,
            problem: e.to_string(),
        }
    } else {
        StoreError::Query(e.to_string(), Some(driver(e)))
    }
}

/// The column a read failed on, when the failure is a value of the wrong type.
fn decode_column(e: &rusqlite::Error, columns: &str) -> Option<String> {
    match e {
        rusqlite::Error::InvalidColumnType(_, name, _) => Some(name.clone()),
        rusqlite::Error::FromSqlConversionFailure(i, _, _) => Some(
            columns
                .split(", ")
                .nth(*i)
                .map_or_else(|| format!("#{i}"), str::to_string),
        ),
        _ => None,
    }
}

/// A time as SQLite keeps it: Unix microseconds.
pub(crate) fn micros(t: Timestamp) -> i64 {
    t.timestamp_micros()
}

/// A time SQLite kept, if any.
pub(crate) fn micros_opt(v: Option<i64>) -> Option<Timestamp> {
    v.map(from_micros)
}

type Recorded = HashMap<String, (u32, Option<i64>)>;

fn table_exists(conn: &Connection, name: &str) -> StoreResult<bool> {
    conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1)",
        [name],
        |r| r.get(0),
    )
    .map_err(error)
}

/// The newest version of each line, read without writing: from `onus_migrations`, and for a line
/// it does not record yet, from where the schema kept it before (`PRAGMA user_version` beside the
/// job tables; the table `onus_webhooks_schema`), with no time applied.
fn recorded(conn: &Connection) -> StoreResult<Recorded> {
    let mut out = Recorded::new();
    if table_exists(conn, "onus_migrations")? {
        let mut stmt = conn
            .prepare(
                "SELECT line, MAX(version), MAX(applied_at) FROM onus_migrations GROUP BY line",
            )
            .map_err(error)?;
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, String>(0)?, (r.get(1)?, r.get(2)?))))
            .map_err(error)?;
        out = rows.collect::<rusqlite::Result<_>>().map_err(error)?;
    }
    if !out.contains_key(crate::sql::migrate::LEGACY_JOBS_LINE) && table_exists(conn, "onus_jobs")?
    {
        let v: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(error)?;
        let v = u32::try_from(v).map_err(|_| {
            StoreError::Open(format!(
                "the database's user_version {v} is not an Onus schema version"
            ))
        })?;
        out.insert(crate::sql::migrate::LEGACY_JOBS_LINE.into(), (v, None));
    }
    let legacy = crate::sql::migrate::LEGACY_WEBHOOKS_TABLE;
    if !out.contains_key("webhooks") && table_exists(conn, legacy)? {
        let v: Option<u32> = conn
            .query_row(&format!("SELECT MAX(version) FROM {legacy}"), [], |r| {
                r.get(0)
            })
            .map_err(error)?;
        out.insert("webhooks".into(), (v.unwrap_or(0), None));
    }
    Ok(out)
}

fn record(conn: &Connection, line: &str, version: u32, name: &str) -> StoreResult<()> {
    conn.execute(
        "INSERT INTO onus_migrations (line, version, name, applied_at) VALUES (?1, ?2, ?3, ?4)",
        params![line, version, name, micros(chrono::Utc::now())],
    )
    .map_err(error)?;
    Ok(())
}

/// Applies the pending migrations of `lines` inside the caller's write transaction (which holds
/// SQLite's write lock, so no other process migrates at the same time). Versions kept before
/// `onus_migrations` existed are recorded there first; the job tables' version is also kept in
/// `PRAGMA user_version`, where an earlier Onus looks for it (and refuses a newer schema).
pub(crate) fn apply_lines(conn: &Connection, lines: &[&'static Line]) -> StoreResult<Vec<Applied>> {
    let had = recorded(conn)?;
    conn.execute_batch(MIGRATIONS_TABLE).map_err(error)?;
    let mut out = Vec::new();
    for &line in lines {
        let (version, at) = had.get(line.name).copied().unwrap_or((0, None));
        if at.is_none() {
            // Adopted from the earlier record.
            for m in line.sqlite.iter().take(version as usize) {
                record(conn, line.name, m.version, m.name)?;
            }
        }
        for m in line.pending(crate::sql::Backend::Sqlite, version)? {
            conn.execute_batch(m.sql)
                .map_err(|e| crate::sql::migrate::failed(line, m, error(e)))?;
            record(conn, line.name, m.version, m.name)?;
            out.push(Applied {
                line: line.name.to_string(),
                version: m.version,
                name: m.name.to_string(),
            });
        }
        if line.name == crate::sql::migrate::LEGACY_JOBS_LINE {
            conn.execute_batch(&format!(
                "PRAGMA user_version = {}",
                line.latest(crate::sql::Backend::Sqlite)
            ))
            .map_err(error)?;
        }
    }
    Ok(out)
}

/// Where each line stands, read without writing anything.
pub(crate) fn line_status(
    conn: &Connection,
    lines: &[&'static Line],
) -> StoreResult<Vec<LineStatus>> {
    let have = recorded(conn)?;
    Ok(lines
        .iter()
        .map(|line| {
            let (v, at) = have.get(line.name).copied().unwrap_or((0, None));
            LineStatus::of(line, crate::sql::Backend::Sqlite, v, micros_opt(at))
        })
        .collect())
}

/// The rows of a component's statement on `conn`.
pub(crate) fn rows(
    conn: &Connection,
    sql: &crate::sql::Sql,
    params: &[crate::sql::Value],
) -> StoreResult<Vec<crate::sql::Row>> {
    let mut st = statement(conn, sql, params)?;
    let columns: Arc<[String]> = st.column_names().into_iter().map(String::from).collect();
    let n = columns.len();
    let mut rows = st
        .query(rusqlite::params_from_iter(params.iter()))
        .map_err(error)?;
    let mut out = Vec::new();
    while let Some(r) = rows.next().map_err(error)? {
        let mut values = Vec::with_capacity(n);
        for i in 0..n {
            values.push(crate::sql::value::from_sqlite(r.get_ref(i).map_err(error)?));
        }
        out.push(crate::sql::Row::new(
            crate::sql::Backend::Sqlite,
            sql.table,
            columns.clone(),
            values,
        ));
    }
    Ok(out)
}

/// Runs a component's statement on `conn`; returns the rows it changed.
pub(crate) fn execute(
    conn: &Connection,
    sql: &crate::sql::Sql,
    params: &[crate::sql::Value],
) -> StoreResult<u64> {
    let mut st = statement(conn, sql, params)?;
    if st.column_count() > 0 {
        // A statement with RETURNING: step through it so every row is written.
        let mut rows = st
            .query(rusqlite::params_from_iter(params.iter()))
            .map_err(error)?;
        let mut n = 0;
        while rows.next().map_err(error)?.is_some() {
            n += 1;
        }
        return Ok(n);
    }
    st.execute(rusqlite::params_from_iter(params.iter()))
        .map(|n| n as u64)
        .map_err(error)
}

/// A statement prepared for its one use or kept in the connection's cache.
enum Prepared<'c> {
    Cached(rusqlite::CachedStatement<'c>),
    Once(rusqlite::Statement<'c>),
}

impl<'c> std::ops::Deref for Prepared<'c> {
    type Target = rusqlite::Statement<'c>;
    fn deref(&self) -> &Self::Target {
        match self {
            Prepared::Cached(s) => s,
            Prepared::Once(s) => s,
        }
    }
}

impl std::ops::DerefMut for Prepared<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        match self {
            Prepared::Cached(s) => s,
            Prepared::Once(s) => s,
        }
    }
}

fn statement<'c>(
    conn: &'c Connection,
    sql: &crate::sql::Sql,
    params: &[crate::sql::Value],
) -> StoreResult<Prepared<'c>> {
    let text = sql.text(crate::sql::Backend::Sqlite);
    let st = if sql.cached() {
        Prepared::Cached(conn.prepare_cached(text).map_err(error)?)
    } else {
        Prepared::Once(conn.prepare(text).map_err(error)?)
    };
    // `$n` parameters are bound by position: they must first appear in order, one value each.
    let n = st.parameter_count();
    for i in 1..=n {
        let expected = format!("${i}");
        if st.parameter_name(i) != Some(expected.as_str()) {
            return Err(StoreError::Query(format!(
                "parameter {i} of a statement on {} is not ${i} (number parameters in order of first use): {text}",
                sql.table
            ), None));
        }
    }
    if n != params.len() {
        return Err(StoreError::Query(
            format!(
                "a statement on {} takes {n} parameters but was given {}: {text}",
                sql.table,
                params.len()
            ),
            None,
        ));
    }
    Ok(st)
}
