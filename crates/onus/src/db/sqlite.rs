//! The database layer on SQLite: component statements and the migration runner, on a
//! connection the caller holds in a write transaction (the store's writer, or the caller's own).

use std::collections::HashMap;
use std::sync::Arc;

use rusqlite::{params, Connection};

use crate::db::migrate::{Applied, Line, LineStatus};
use crate::store::sqlite::{q, ts, us};
use crate::store::{StoreError, StoreResult};

const MIGRATIONS_TABLE: &str = "CREATE TABLE IF NOT EXISTS onus_migrations (
    line       TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    name       TEXT    NOT NULL,
    applied_at INTEGER NOT NULL,
    PRIMARY KEY (line, version)
)";

type Recorded = HashMap<String, (u32, Option<i64>)>;

fn table_exists(conn: &Connection, name: &str) -> StoreResult<bool> {
    conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1)",
        [name],
        |r| r.get(0),
    )
    .map_err(q)
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
            .map_err(q)?;
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, String>(0)?, (r.get(1)?, r.get(2)?))))
            .map_err(q)?;
        out = rows.collect::<rusqlite::Result<_>>().map_err(q)?;
    }
    if !out.contains_key("jobs") && table_exists(conn, "onus_jobs")? {
        let v: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(q)?;
        let v = u32::try_from(v).map_err(|_| {
            StoreError::Open(format!(
                "the database's user_version {v} is not an Onus schema version"
            ))
        })?;
        out.insert("jobs".into(), (v, None));
    }
    let legacy = crate::db::migrate::LEGACY_WEBHOOKS_TABLE;
    if !out.contains_key("webhooks") && table_exists(conn, legacy)? {
        let v: Option<u32> = conn
            .query_row(&format!("SELECT MAX(version) FROM {legacy}"), [], |r| {
                r.get(0)
            })
            .map_err(q)?;
        out.insert("webhooks".into(), (v.unwrap_or(0), None));
    }
    Ok(out)
}

fn record(conn: &Connection, line: &str, version: u32, name: &str) -> StoreResult<()> {
    conn.execute(
        "INSERT INTO onus_migrations (line, version, name, applied_at) VALUES (?1, ?2, ?3, ?4)",
        params![line, version, name, us(chrono::Utc::now())],
    )
    .map_err(q)?;
    Ok(())
}

/// Applies the pending migrations of `lines` inside the caller's write transaction (which holds
/// SQLite's write lock, so no other process migrates at the same time). Versions kept before
/// `onus_migrations` existed are recorded there first; the job tables' version is also kept in
/// `PRAGMA user_version`, where an earlier Onus looks for it (and refuses a newer schema).
pub(crate) fn apply_lines(conn: &Connection, lines: &[&'static Line]) -> StoreResult<Vec<Applied>> {
    let had = recorded(conn)?;
    conn.execute_batch(MIGRATIONS_TABLE).map_err(q)?;
    let mut out = Vec::new();
    for line in crate::db::migrate::with_jobs(lines) {
        let (version, at) = had.get(line.name).copied().unwrap_or((0, None));
        if at.is_none() {
            // Adopted from the earlier record.
            for m in line.sqlite.iter().take(version as usize) {
                record(conn, line.name, m.version, m.name)?;
            }
        }
        for m in line.pending(crate::db::Backend::Sqlite, version)? {
            conn.execute_batch(m.sql)
                .map_err(|e| crate::db::migrate::failed(line, m, q(e)))?;
            record(conn, line.name, m.version, m.name)?;
            out.push(Applied {
                line: line.name.to_string(),
                version: m.version,
                name: m.name.to_string(),
            });
        }
        if line.name == crate::db::JOBS.name {
            conn.execute_batch(&format!(
                "PRAGMA user_version = {}",
                line.latest(crate::db::Backend::Sqlite)
            ))
            .map_err(q)?;
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
    Ok(crate::db::migrate::with_jobs(lines)
        .into_iter()
        .map(|line| {
            let (v, at) = have.get(line.name).copied().unwrap_or((0, None));
            LineStatus::of(line, crate::db::Backend::Sqlite, v, ts(at))
        })
        .collect())
}

/// The rows of a component's statement on `conn`.
pub(crate) fn rows(
    conn: &Connection,
    sql: &crate::db::Sql,
    params: &[crate::db::Value],
) -> StoreResult<Vec<crate::db::Row>> {
    let mut st = statement(conn, sql, params)?;
    let columns: Arc<[String]> = st.column_names().into_iter().map(String::from).collect();
    let n = columns.len();
    let mut rows = st
        .query(rusqlite::params_from_iter(params.iter()))
        .map_err(q)?;
    let mut out = Vec::new();
    while let Some(r) = rows.next().map_err(q)? {
        let mut values = Vec::with_capacity(n);
        for i in 0..n {
            values.push(crate::db::value::from_sqlite(r.get_ref(i).map_err(q)?));
        }
        out.push(crate::db::Row::new(
            crate::db::Backend::Sqlite,
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
    sql: &crate::db::Sql,
    params: &[crate::db::Value],
) -> StoreResult<u64> {
    let mut st = statement(conn, sql, params)?;
    if st.column_count() > 0 {
        // A statement with RETURNING: step through it so every row is written.
        let mut rows = st
            .query(rusqlite::params_from_iter(params.iter()))
            .map_err(q)?;
        let mut n = 0;
        while rows.next().map_err(q)?.is_some() {
            n += 1;
        }
        return Ok(n);
    }
    st.execute(rusqlite::params_from_iter(params.iter()))
        .map(|n| n as u64)
        .map_err(q)
}

fn statement<'c>(
    conn: &'c Connection,
    sql: &crate::db::Sql,
    params: &[crate::db::Value],
) -> StoreResult<rusqlite::CachedStatement<'c>> {
    let text = sql.text(crate::db::Backend::Sqlite);
    let st = conn.prepare_cached(text).map_err(q)?;
    // `$n` parameters are bound by position: they must first appear in order, one value each.
    let n = st.parameter_count();
    for i in 1..=n {
        let expected = format!("${i}");
        if st.parameter_name(i) != Some(expected.as_str()) {
            return Err(StoreError::Query(format!(
                "parameter {i} of a statement on {} is not ${i} (number parameters in order of first use): {text}",
                sql.table
            )));
        }
    }
    if n != params.len() {
        return Err(StoreError::Query(format!(
            "a statement on {} takes {n} parameters but was given {}: {text}",
            sql.table,
            params.len()
        )));
    }
    Ok(st)
}
