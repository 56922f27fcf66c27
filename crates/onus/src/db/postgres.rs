//! The database layer on PostgreSQL: component statements and the migration runner.

use std::collections::HashMap;

use tokio_postgres::types::ToSql;
use tokio_postgres::GenericClient;

use crate::clock::Timestamp;
use crate::db::migrate::{Applied, Line, LineStatus};
use crate::store::postgres::{q, MIGRATION_LOCK};
use crate::store::{StoreError, StoreResult};

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
        .map_err(q)?;
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(q)?;
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
        .map_err(q)?
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
            .map_err(q)?
        {
            out.insert(r.get(0), (version(r.get(1))?, r.get(2)));
        }
    }
    if !out.contains_key("jobs") && table_exists(client, "onus_schema").await? {
        let v: Option<i32> = client
            .query_one("SELECT max(version) FROM onus_schema", &[])
            .await
            .map_err(q)?
            .get(0);
        out.insert("jobs".into(), (version(v.unwrap_or(0))?, None));
    }
    let legacy = crate::db::migrate::LEGACY_WEBHOOKS_TABLE;
    if !out.contains_key("webhooks") && table_exists(client, legacy).await? {
        let v: Option<i64> = client
            .query_one(&format!("SELECT max(version) FROM {legacy}"), &[])
            .await
            .map_err(q)?
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
        client.batch_execute(MIGRATIONS_TABLE).await.map_err(q)?;
        let mut out = Vec::new();
        for line in crate::db::migrate::with_jobs(lines) {
            let (version, at) = had.get(line.name).copied().unwrap_or((0, None));
            if at.is_none() {
                for m in line.postgres.iter().take(version as usize) {
                    record(client, line.name, m.version, m.name).await.map_err(q)?;
                }
            }
            for m in line.pending(crate::db::Backend::Postgres, version)? {
                let run = async {
                    client.batch_execute("BEGIN").await?;
                    client.batch_execute(m.sql).await?;
                    record(client, line.name, m.version, m.name).await?;
                    client.batch_execute("COMMIT").await
                };
                if let Err(e) = run.await {
                    let _ = client.batch_execute("ROLLBACK").await;
                    return Err(crate::db::migrate::failed(line, m, q(e)));
                }
                out.push(Applied {
                    line: line.name.to_string(),
                    version: m.version,
                    name: m.name.to_string(),
                });
            }
            if line.name == crate::db::JOBS.name {
                let latest = line.latest(crate::db::Backend::Postgres);
                client
                    .batch_execute(&format!(
                        "CREATE TABLE IF NOT EXISTS onus_schema (version integer NOT NULL);
                         DELETE FROM onus_schema; INSERT INTO onus_schema (version) VALUES ({latest})"
                    ))
                    .await
                    .map_err(q)?;
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
    Ok(crate::db::migrate::with_jobs(lines)
        .into_iter()
        .map(|line| {
            let (v, at) = have.get(line.name).copied().unwrap_or((0, None));
            LineStatus::of(line, crate::db::Backend::Postgres, v, at)
        })
        .collect())
}

/// The rows of a component's statement.
pub(crate) async fn rows(
    c: &impl GenericClient,
    sql: &crate::db::Sql,
    params: &[crate::db::Value],
) -> StoreResult<Vec<crate::db::Row>> {
    let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
    let rows = c
        .query(sql.text(crate::db::Backend::Postgres), &refs)
        .await
        .map_err(q)?;
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
                    crate::db::value::from_postgres(r, i).map_err(|problem| StoreError::Decode {
                        table: sql.table,
                        column: columns[i].clone(),
                        problem,
                    })
                })
                .collect::<StoreResult<Vec<_>>>()?;
            Ok(crate::db::Row::new(
                crate::db::Backend::Postgres,
                sql.table,
                columns.clone(),
                values,
            ))
        })
        .collect()
}

/// Runs a component's statement; returns the rows it changed.
pub(crate) async fn execute(
    c: &impl GenericClient,
    sql: &crate::db::Sql,
    params: &[crate::db::Value],
) -> StoreResult<u64> {
    let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
    c.execute(sql.text(crate::db::Backend::Postgres), &refs)
        .await
        .map_err(q)
}
