//! The database layer on PostgreSQL: component statements and the migration runner.

use tokio_postgres::types::ToSql;

use crate::sql::error::driver;
use crate::sql::PgConn;

use crate::sql::error::{StoreError, StoreResult};
use crate::sql::migrate::{Applied, Line};

/// The advisory lock key held while migrating ("onus" in ASCII).
pub(crate) const MIGRATION_LOCK: i64 = 0x6f6e_7573;

/// A PostgreSQL error with the server's message, detail and hint.
pub fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut s = format!("{}: {}", db.severity(), db.message());
            if let Some(d) = db.detail() {
                s.push_str(&format!(" ({d})"));
            }
            if let Some(h) = db.hint() {
                s.push_str(&format!("; hint: {h}"));
            }
            s
        }
        None => {
            let mut s = e.to_string();
            let mut cur = std::error::Error::source(e);
            while let Some(c) = cur {
                s.push_str(&format!(": {c}"));
                cur = c.source();
            }
            s
        }
    }
}

/// Whether a PostgreSQL error may clear up by itself: the connection is gone or timed out, the
/// server is starting, stopping or out of resources, or a transaction lost a race.
fn transient(e: &tokio_postgres::Error) -> bool {
    if let Some(code) = e.code() {
        let c = code.code();
        return c.starts_with("08") // connection exception
            || c.starts_with("53") // insufficient resources
            || c.starts_with("57P") // shutting down, cannot connect now
            || c == "57014" // cancelled: statement timeout
            || c == "40001" // serialization failure
            || c == "40P01"; // deadlock detected
    }
    let io = std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>());
    e.is_closed() || io || e.to_string().contains("timeout")
}

/// A PostgreSQL error as a [`StoreError`].
pub(crate) fn error(e: tokio_postgres::Error) -> StoreError {
    if transient(&e) {
        StoreError::Unavailable(describe(&e), Some(driver(e)))
    } else if e.code().is_some_and(|c| c.code().starts_with("23")) {
        StoreError::Constraint(describe(&e), Some(driver(e)))
    } else {
        StoreError::Query(describe(&e), Some(driver(e)))
    }
}

/// Runs `f` holding the migration lock (a session advisory lock, so processes starting at once
/// migrate one after another), with no statement timeout: a migration may wait for another
/// process's, and may build indexes on a large table.
async fn under_migration_lock<R>(
    client: &deadpool_postgres::Object,
    f: impl AsyncFnOnce(&deadpool_postgres::Object) -> StoreResult<R>,
) -> StoreResult<R> {
    client
        .batch_execute("SET statement_timeout = 0")
        .await
        .map_err(error)?;
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(error)?;
    let r = f(client).await;
    let _ = client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await;
    let _ = client.batch_execute("RESET statement_timeout").await;
    r
}

/// Applies the pending migrations of `lines`, each in a transaction with its record, under the
/// migration lock.
pub(crate) async fn apply_lines(
    client: &deadpool_postgres::Object,
    lines: &[&'static Line],
) -> StoreResult<Vec<Applied>> {
    under_migration_lock(client, async |client| {
        crate::sql::migrate::apply(&crate::sql::PgTx::pooled_client(client), lines).await
    })
    .await
}

/// Runs a PostgreSQL statement on `e` and returns its rows, decoded as `table`'s: prepared once
/// per connection of the store's pool when `cached` (the caller's own transaction prepares it for
/// this use). Parameters are [`crate::sql::Value`]s or, for the job store's array statements, any
/// `ToSql`.
pub(crate) async fn query(
    e: PgConn<'_>,
    table: &'static str,
    text: &str,
    cached: bool,
    params: &[&(dyn ToSql + Sync)],
) -> StoreResult<Vec<crate::sql::Row>> {
    let rows = match e {
        PgConn::PooledTx(t) if cached => {
            let st = t.prepare_cached(text).await.map_err(error)?;
            t.query(&st, params).await
        }
        PgConn::PooledClient(c) if cached => {
            let st = c.prepare_cached(text).await.map_err(error)?;
            c.query(&st, params).await
        }
        PgConn::Tx(t) => t.query(text, params).await,
        PgConn::PooledTx(t) => t.query(text, params).await,
        PgConn::PooledClient(c) => c.query(text, params).await,
    }
    .map_err(error)?;
    let Some(first) = rows.first() else {
        return Ok(Vec::new());
    };
    let columns: std::sync::Arc<[String]> = first
        .columns()
        .iter()
        .map(|c| c.name().to_string())
        .collect();
    Ok(rows
        .into_iter()
        .map(|r| crate::sql::Row::postgres(table, columns.clone(), r))
        .collect())
}

/// Runs a PostgreSQL statement on `e` (prepared as [`query`] does); returns the rows it changed.
pub(crate) async fn execute(
    e: PgConn<'_>,
    text: &str,
    cached: bool,
    params: &[&(dyn ToSql + Sync)],
) -> StoreResult<u64> {
    match e {
        PgConn::PooledTx(t) if cached => {
            let st = t.prepare_cached(text).await.map_err(error)?;
            t.execute(&st, params).await
        }
        PgConn::PooledClient(c) if cached => {
            let st = c.prepare_cached(text).await.map_err(error)?;
            c.execute(&st, params).await
        }
        PgConn::Tx(t) => t.execute(text, params).await,
        PgConn::PooledTx(t) => t.execute(text, params).await,
        PgConn::PooledClient(c) => c.execute(text, params).await,
    }
    .map_err(error)
}

/// [`crate::sql::Value`]s as PostgreSQL parameters.
pub(crate) fn refs(params: &[crate::sql::Value]) -> Vec<&(dyn ToSql + Sync)> {
    params.iter().map(|v| v as &(dyn ToSql + Sync)).collect()
}
