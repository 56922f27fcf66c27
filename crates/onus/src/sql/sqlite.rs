//! The database layer on SQLite: component statements and the migration runner, on a
//! connection the caller holds in a write transaction (the store's writer, or the caller's own).

use std::sync::Arc;

use rusqlite::Connection;

use crate::clock::Timestamp;
use crate::sql::error::driver;
use crate::sql::error::{StoreError, StoreResult};
use crate::sql::migrate::{Applied, Line};

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
    if transient(&e) {
        StoreError::Unavailable(with_hint(&e), Some(driver(e)))
    } else if e.sqlite_error_code() == Some(rusqlite::ErrorCode::ConstraintViolation) {
        StoreError::Constraint(e.to_string(), Some(driver(e)))
    } else if let rusqlite::Error::InvalidColumnType(_, column, _) = &e {
        // A stored value that does not read as its type.
        StoreError::Decode {
            table: "the job tables",
            column: column.clone(),
            problem: e.to_string(),
        }
    } else {
        StoreError::Query(e.to_string(), Some(driver(e)))
    }
}

/// A time as SQLite keeps it: Unix microseconds.
pub(crate) fn micros(t: Timestamp) -> i64 {
    t.timestamp_micros()
}

/// Applies the pending migrations of `lines` inside the caller's write transaction (which holds
/// SQLite's write lock, so no other process migrates at the same time).
pub(crate) fn apply_lines(conn: &Connection, lines: &[&'static Line]) -> StoreResult<Vec<Applied>> {
    crate::sql::ready(crate::sql::migrate::apply(
        &crate::sql::SqliteTx::new(conn),
        lines,
    ))
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
        let number = st
            .parameter_name(i)
            .and_then(|p| p.strip_prefix('$')?.parse().ok());
        if number != Some(i) {
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
