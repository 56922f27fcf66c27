//! The database layer on PostgreSQL: component statements and the migration runner.

use std::collections::HashMap;

use tokio_postgres::types::ToSql;
use tokio_postgres::GenericClient;

use crate::sql::error::driver;

use crate::clock::Timestamp;
use crate::sql::error::{StoreError, StoreResult};
use crate::sql::migrate::{Applied, Line, LineStatus};

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

const MIGRATIONS_TABLE: &str = "CREATE TABLE IF NOT EXISTS onus_migrations (
    line       text        NOT NULL,
    version    integer     NOT NULL,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL,
    PRIMARY KEY (line, version)
)";

/// Runs `f` holding the migration lock (a session advisory lock, so processes starting at once
/// migrate one after another), with no statement timeout: a migration may wait for another
/// process's, and may build indexes on a large table.
async fn under_migration_lock<R>(
    client: &tokio_postgres::Client,
    f: impl AsyncFnOnce(&tokio_postgres::Client) -> StoreResult<R>,
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

type Recorded = HashMap<String, (u32, Option<Timestamp>)>;

async fn table_exists(client: &tokio_postgres::Client, name: &str) -> StoreResult<bool> {
    Ok(client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&name])
        .await
        .map_err(error)?
        .get(0))
}

fn version(v: i32) -> StoreResult<u32> {
    u32::try_from(v).map_err(|_| StoreError::Open(format!("{v} is not a migration version")))
}

/// The newest version of each line, read without writing: from `onus_migrations`, and for a line
/// it does not record yet, from where the schema kept it before (the tables `onus_schema` and
/// `onus_webhooks_schema`), with no time applied.
async fn recorded(client: &tokio_postgres::Client) -> StoreResult<Recorded> {
    let mut out = Recorded::new();
    if table_exists(client, "onus_migrations").await? {
        for r in client
            .query(
                "SELECT line, max(version), max(applied_at) FROM onus_migrations GROUP BY line",
                &[],
            )
            .await
            .map_err(error)?
        {
            out.insert(r.get(0), (version(r.get(1))?, r.get(2)));
        }
    }
    if !out.contains_key(crate::sql::migrate::LEGACY_JOBS_LINE)
        && table_exists(client, "onus_schema").await?
    {
        let v: Option<i32> = client
            .query_one("SELECT max(version) FROM onus_schema", &[])
            .await
            .map_err(error)?
            .get(0);
        out.insert(
            crate::sql::migrate::LEGACY_JOBS_LINE.into(),
            (version(v.unwrap_or(0))?, None),
        );
    }
    let legacy = crate::sql::migrate::LEGACY_WEBHOOKS_TABLE;
    if !out.contains_key("webhooks") && table_exists(client, legacy).await? {
        let v: Option<i64> = client
            .query_one(&format!("SELECT max(version) FROM {legacy}"), &[])
            .await
            .map_err(error)?
            .get(0);
        let v = i32::try_from(v.unwrap_or(0))
            .map_err(|_| StoreError::Open(format!("{legacy} holds no migration version")))?;
        out.insert("webhooks".into(), (version(v)?, None));
    }
    Ok(out)
}

async fn record(
    client: &tokio_postgres::Client,
    line: &str,
    version: u32,
    name: &str,
) -> Result<(), tokio_postgres::Error> {
    let v = i32::try_from(version).unwrap_or(i32::MAX);
    client
        .execute(
            "INSERT INTO onus_migrations (line, version, name, applied_at) VALUES ($1, $2, $3, $4)",
            &[&line, &v, &name, &chrono::Utc::now()],
        )
        .await
        .map(|_| ())
}

/// Applies the pending migrations of `lines`, each in a transaction with its record, under the
/// migration lock. Versions kept before `onus_migrations` existed are recorded there first; the
/// job tables' version is also kept in `onus_schema`, where an earlier Onus looks for it (and
/// refuses a newer schema).
pub(crate) async fn apply_lines(
    client: &tokio_postgres::Client,
    lines: &[&'static Line],
) -> StoreResult<Vec<Applied>> {
    under_migration_lock(client, async |client| {
        let had = recorded(client).await?;
        client.batch_execute(MIGRATIONS_TABLE).await.map_err(error)?;
        let mut out = Vec::new();
        for &line in lines {
            let (version, at) = had.get(line.name).copied().unwrap_or((0, None));
            if at.is_none() {
                for m in line.postgres.iter().take(version as usize) {
                    record(client, line.name, m.version, m.name).await.map_err(error)?;
                }
            }
            for m in line.pending(crate::sql::Backend::Postgres, version)? {
                let run = async {
                    client.batch_execute("BEGIN").await?;
                    client.batch_execute(m.sql).await?;
                    record(client, line.name, m.version, m.name).await?;
                    client.batch_execute("COMMIT").await
                };
                if let Err(e) = run.await {
                    let _ = client.batch_execute("ROLLBACK").await;
                    return Err(crate::sql::migrate::failed(line, m, error(e)));
                }
                out.push(Applied {
                    line: line.name.to_string(),
                    version: m.version,
                    name: m.name.to_string(),
                });
            }
            if line.name == crate::sql::migrate::LEGACY_JOBS_LINE {
                let latest = line.latest(crate::sql::Backend::Postgres);
                client
                    .batch_execute(&format!(
                        "CREATE TABLE IF NOT EXISTS onus_schema (version integer NOT NULL);
                         DELETE FROM onus_schema; INSERT INTO onus_schema (version) VALUES ({latest})"
                    ))
                    .await
                    .map_err(error)?;
            }
        }
        Ok(out)
    })
    .await
}

/// Where each line stands, read without writing anything (and without the migration lock).
pub(crate) async fn line_status(
    client: &tokio_postgres::Client,
    lines: &[&'static Line],
) -> StoreResult<Vec<LineStatus>> {
    let have = recorded(client).await?;
    Ok(lines
        .iter()
        .map(|line| {
            let (v, at) = have.get(line.name).copied().unwrap_or((0, None));
            LineStatus::of(line, crate::sql::Backend::Postgres, v, at)
        })
        .collect())
}

/// The rows of a statement (`statement`: its text, or the same prepared).
pub(crate) async fn rows<S>(
    c: &impl GenericClient,
    statement: &S,
    sql: &crate::sql::Sql,
    params: &[crate::sql::Value],
) -> StoreResult<Vec<crate::sql::Row>>
where
    S: tokio_postgres::ToStatement + Sync + Send + ?Sized,
{
    let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
    let rows = c.query(statement, &refs).await.map_err(error)?;
    let Some(first) = rows.first() else {
        return Ok(Vec::new());
    };
    let columns: std::sync::Arc<[String]> = first
        .columns()
        .iter()
        .map(|c| c.name().to_string())
        .collect();
    rows.iter()
        .map(|r| {
            let values = (0..columns.len())
                .map(|i| {
                    crate::sql::value::from_postgres(r, i).map_err(|problem| StoreError::Decode {
                        table: sql.table,
                        column: columns[i].clone(),
                        problem,
                    })
                })
                .collect::<StoreResult<Vec<_>>>()?;
            Ok(crate::sql::Row::new(
                crate::sql::Backend::Postgres,
                sql.table,
                columns.clone(),
                values,
            ))
        })
        .collect()
}

/// Runs a statement (its text, or the same prepared); returns the rows it changed.
pub(crate) async fn execute<S>(
    c: &impl GenericClient,
    statement: &S,
    params: &[crate::sql::Value],
) -> StoreResult<u64>
where
    S: tokio_postgres::ToStatement + Sync + Send + ?Sized,
{
    let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
    c.execute(statement, &refs).await.map_err(error)
}
