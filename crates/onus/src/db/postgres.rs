//! The database layer on PostgreSQL: component statements and the migration runner.

use std::collections::HashMap;

use tokio_postgres::types::ToSql;
use tokio_postgres::GenericClient;

use crate::clock::Timestamp;
use crate::db::migrate::{Applied, Line, LineStatus};
use crate::store::postgres::{describe, q, MIGRATION_LOCK};
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

/// The newest version recorded per line, creating the record table (and adopting the records
/// kept before it) if needed. Call under the migration lock.
async fn applied_versions(
    client: &tokio_postgres::Client,
) -> StoreResult<HashMap<String, (u32, Option<Timestamp>)>> {
    client.batch_execute(MIGRATIONS_TABLE).await.map_err(q)?;
    let now = chrono::Utc::now();
    let adopt_jobs = client
        .query_one(
            "SELECT to_regclass('onus_schema') IS NOT NULL
               AND NOT EXISTS (SELECT 1 FROM onus_migrations WHERE line = 'jobs')",
            &[],
        )
        .await
        .map_err(q)?
        .get::<_, bool>(0);
    if adopt_jobs {
        let legacy: i32 = client
            .query_opt("SELECT max(version) FROM onus_schema", &[])
            .await
            .map_err(q)?
            .and_then(|r| r.get::<_, Option<i32>>(0))
            .unwrap_or(0);
        for v in 1..=legacy.max(0) {
            let name = crate::db::JOBS
                .postgres
                .get(v as usize - 1)
                .map_or("(recorded before onus_migrations)", |m| m.name);
            client
                .execute(
                    "INSERT INTO onus_migrations (line, version, name, applied_at) VALUES ('jobs', $1, $2, $3)",
                    &[&v, &name, &now],
                )
                .await
                .map_err(q)?;
        }
    }
    let adopt_webhooks = client
        .query_one(
            &format!(
                "SELECT to_regclass('{}') IS NOT NULL
                   AND NOT EXISTS (SELECT 1 FROM onus_migrations WHERE line = 'webhooks')",
                crate::db::migrate::LEGACY_WEBHOOKS_TABLE
            ),
            &[],
        )
        .await
        .map_err(q)?
        .get::<_, bool>(0);
    if adopt_webhooks {
        client
            .execute(
                &format!(
                    "INSERT INTO onus_migrations (line, version, name, applied_at)
                     SELECT DISTINCT 'webhooks', version::integer, '(recorded before onus_migrations)', $1::timestamptz FROM {}",
                    crate::db::migrate::LEGACY_WEBHOOKS_TABLE
                ),
                &[&now],
            )
            .await
            .map_err(q)?;
    }
    let rows = client
        .query(
            "SELECT line, max(version), max(applied_at) FROM onus_migrations GROUP BY line",
            &[],
        )
        .await
        .map_err(q)?;
    Ok(rows
        .iter()
        .map(|r| {
            let v: i32 = r.get(1);
            (r.get::<_, String>(0), (v.max(0) as u32, r.get(2)))
        })
        .collect())
}

/// Applies the pending migrations of `lines`, each in a transaction with its record.
pub(crate) async fn apply_lines(
    client: &tokio_postgres::Client,
    lines: &[&'static Line],
) -> StoreResult<Vec<Applied>> {
    under_migration_lock(client, async |client| {
        let have = applied_versions(client).await?;
        let mut out = Vec::new();
        for line in crate::db::migrate::with_jobs(lines) {
            let version = have.get(line.name).map_or(0, |(v, _)| *v);
            for m in line.pending(crate::db::Backend::Postgres, version)? {
                let run = async {
                    client.batch_execute("BEGIN").await?;
                    client.batch_execute(m.sql).await?;
                    client
                        .execute(
                            "INSERT INTO onus_migrations (line, version, name, applied_at) VALUES ($1, $2, $3, $4)",
                            &[&line.name, &(m.version as i32), &m.name, &chrono::Utc::now()],
                        )
                        .await?;
                    client.batch_execute("COMMIT").await
                };
                if let Err(e) = run.await {
                    let _ = client.batch_execute("ROLLBACK").await;
                    return Err(crate::db::migrate::failed(line, m, describe(&e)));
                }
                out.push(Applied {
                    line: line.name.to_string(),
                    version: m.version,
                    name: m.name.to_string(),
                });
            }
        }
        Ok(out)
    })
    .await
}

pub(crate) async fn line_status(
    client: &tokio_postgres::Client,
    lines: &[&'static Line],
) -> StoreResult<Vec<LineStatus>> {
    under_migration_lock(client, async |client| {
        let have = applied_versions(client).await?;
        crate::db::migrate::with_jobs(lines)
            .into_iter()
            .map(|line| {
                let (v, at) = have.get(line.name).copied().unwrap_or((0, None));
                LineStatus::of(line, crate::db::Backend::Postgres, v, at)
            })
            .collect()
    })
    .await
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
            Ok(crate::db::Row::new(sql.table, columns.clone(), values))
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
