//! The webhook tables, reached through the job store's own database.
//!
//! The tables use only `BIGINT` (times as Unix microseconds, flags as 0/1) and `TEXT` (JSON as
//! text), and every statement is written once in SQL both backends accept, with `$n` parameters
//! numbered in order of first use. [`Db`] runs a statement on SQLite (inside the store's writer, so
//! it batches with job writes) or on PostgreSQL (from the store's pool). Events are published with
//! their fan-out job in one transaction.

use std::sync::Arc;

use onus::sqlite::rusqlite;
use onus::store::postgres::PostgresStore;
use onus::store::sqlite::SqliteStore;
use onus::store::{InsertRow, Inserted, Store, StoreError, StoreResult};
use tokio_postgres::types::{IsNull, ToSql, Type};

/// The webhook schema, one script per version (each safe to apply once, in order).
const MIGRATIONS: &[&str] = &[include_str!("schema.sql")];

/// A value bound to or read from a statement.
#[derive(Debug, Clone, PartialEq)]
pub enum Val {
    /// An integer (also times in microseconds and 0/1 flags).
    I64(i64),
    /// Text (also JSON).
    Text(String),
    /// NULL.
    Null,
}

impl Val {
    pub fn i64(&self) -> Option<i64> {
        match self {
            Val::I64(v) => Some(*v),
            _ => None,
        }
    }

    pub fn text(&self) -> Option<&str> {
        match self {
            Val::Text(v) => Some(v),
            _ => None,
        }
    }
}

impl From<i64> for Val {
    fn from(v: i64) -> Self {
        Val::I64(v)
    }
}

impl From<&str> for Val {
    fn from(v: &str) -> Self {
        Val::Text(v.to_string())
    }
}

impl From<String> for Val {
    fn from(v: String) -> Self {
        Val::Text(v)
    }
}

impl<T: Into<Val>> From<Option<T>> for Val {
    fn from(v: Option<T>) -> Self {
        v.map(Into::into).unwrap_or(Val::Null)
    }
}

impl ToSql for Val {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut tokio_postgres::types::private::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            Val::I64(v) => v.to_sql(ty, out),
            Val::Text(v) => v.as_str().to_sql(ty, out),
            Val::Null => Ok(IsNull::Yes),
        }
    }

    fn accepts(ty: &Type) -> bool {
        <i64 as ToSql>::accepts(ty) || <&str as ToSql>::accepts(ty)
    }

    tokio_postgres::types::to_sql_checked!();
}

impl rusqlite::ToSql for Val {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        Ok(match self {
            Val::I64(v) => rusqlite::types::ToSqlOutput::from(*v),
            Val::Text(v) => rusqlite::types::ToSqlOutput::from(v.as_str()),
            Val::Null => rusqlite::types::ToSqlOutput::from(rusqlite::types::Null),
        })
    }
}

/// A statement and its parameters.
#[derive(Debug, Clone)]
pub struct Stmt {
    pub sql: &'static str,
    pub params: Vec<Val>,
}

pub fn stmt(sql: &'static str, params: Vec<Val>) -> Stmt {
    Stmt { sql, params }
}

/// Rows as values.
pub type Rows = Vec<Vec<Val>>;

/// The job store's database, for the webhook tables.
#[derive(Debug, Clone)]
pub struct Db {
    store: Arc<dyn Store>,
}

fn q(e: impl std::fmt::Display) -> StoreError {
    StoreError::Query(e.to_string())
}

pub(crate) fn sqlite_rows(conn: &rusqlite::Connection, s: &Stmt) -> StoreResult<Rows> {
    let mut st = conn.prepare_cached(s.sql).map_err(q)?;
    // `$n` parameters are bound by position: they must first appear in order.
    for i in 1..=st.parameter_count() {
        let expected = format!("${i}");
        if st.parameter_name(i) != Some(expected.as_str()) {
            return Err(StoreError::Query(format!(
                "parameter {i} of a webhook statement is not ${i}: {}",
                s.sql
            )));
        }
    }
    let cols = st.column_count();
    let params: Vec<&dyn rusqlite::ToSql> =
        s.params.iter().map(|v| v as &dyn rusqlite::ToSql).collect();
    let mut rows = st.query(params.as_slice()).map_err(q)?;
    let mut out = Vec::new();
    while let Some(r) = rows.next().map_err(q)? {
        let mut row = Vec::with_capacity(cols);
        for i in 0..cols {
            row.push(match r.get_ref(i).map_err(q)? {
                rusqlite::types::ValueRef::Integer(v) => Val::I64(v),
                rusqlite::types::ValueRef::Text(t) => {
                    Val::Text(String::from_utf8_lossy(t).into_owned())
                }
                rusqlite::types::ValueRef::Null => Val::Null,
                rusqlite::types::ValueRef::Real(v) => Val::I64(v as i64),
                rusqlite::types::ValueRef::Blob(b) => {
                    Val::Text(String::from_utf8_lossy(b).into_owned())
                }
            });
        }
        out.push(row);
    }
    Ok(out)
}

pub(crate) async fn pg_rows(c: &impl tokio_postgres::GenericClient, s: &Stmt) -> StoreResult<Rows> {
    let params: Vec<&(dyn ToSql + Sync)> =
        s.params.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
    let rows = c
        .query(s.sql, &params)
        .await
        .map_err(|e| StoreError::Query(onus::store::postgres::describe(&e)))?;
    let mut out = Vec::with_capacity(rows.len());
    for r in &rows {
        let mut row = Vec::with_capacity(r.len());
        for (i, col) in r.columns().iter().enumerate() {
            let v = match *col.type_() {
                Type::INT8 => r.try_get::<_, Option<i64>>(i).map_err(q)?.map(Val::I64),
                Type::INT4 => r
                    .try_get::<_, Option<i32>>(i)
                    .map_err(q)?
                    .map(|v| Val::I64(v.into())),
                Type::BOOL => r
                    .try_get::<_, Option<bool>>(i)
                    .map_err(q)?
                    .map(|v| Val::I64(v.into())),
                _ => r.try_get::<_, Option<String>>(i).map_err(q)?.map(Val::Text),
            };
            row.push(v.unwrap_or(Val::Null));
        }
        out.push(row);
    }
    Ok(out)
}

impl Db {
    /// The database of `store` (SQLite or PostgreSQL).
    pub fn new(store: Arc<dyn Store>) -> StoreResult<Self> {
        let any = store.as_any();
        if any.downcast_ref::<SqliteStore>().is_none()
            && any.downcast_ref::<PostgresStore>().is_none()
        {
            return Err(StoreError::Open(format!(
                "webhooks do not support the {} store",
                store.backend()
            )));
        }
        Ok(Db { store })
    }

    /// The job store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    fn sqlite(&self) -> Option<&SqliteStore> {
        self.store.as_any().downcast_ref::<SqliteStore>()
    }

    fn postgres(&self) -> Option<&PostgresStore> {
        self.store.as_any().downcast_ref::<PostgresStore>()
    }

    /// Runs statements in one transaction, then inserts `jobs` in it; returns each statement's rows
    /// and the inserted jobs. Nothing is written if any part fails.
    pub async fn tx(
        &self,
        stmts: Vec<Stmt>,
        jobs: Vec<InsertRow>,
    ) -> StoreResult<(Vec<Rows>, Vec<Inserted>)> {
        self.tx_with(stmts, move |_| jobs).await
    }

    /// Runs statements in one transaction, then inserts the jobs `jobs_for` picks given their
    /// rows (say, only for rows a conditional insert returned); nothing is written if any part
    /// fails.
    pub async fn tx_with(
        &self,
        stmts: Vec<Stmt>,
        jobs_for: impl FnOnce(&[Rows]) -> Vec<InsertRow> + Send + 'static,
    ) -> StoreResult<(Vec<Rows>, Vec<Inserted>)> {
        if let Some(s) = self.sqlite() {
            return s
                .write(move |conn| {
                    let rows = stmts
                        .iter()
                        .map(|st| sqlite_rows(conn, st))
                        .collect::<StoreResult<Vec<_>>>()?;
                    let jobs = jobs_for(&rows);
                    let ins = jobs
                        .into_iter()
                        .map(|j| onus::sqlite::insert_tx(conn, j))
                        .collect::<StoreResult<Vec<_>>>()?;
                    Ok((rows, ins))
                })
                .await;
        }
        let pg = self.postgres().ok_or(StoreError::Closed)?;
        let mut c = pg.pool().get().await.map_err(q)?;
        let tx = c
            .transaction()
            .await
            .map_err(|e| StoreError::Query(onus::store::postgres::describe(&e)))?;
        let mut rows = Vec::with_capacity(stmts.len());
        for st in &stmts {
            rows.push(pg_rows(&*tx, st).await?);
        }
        let mut ins = Vec::new();
        for j in jobs_for(&rows) {
            ins.push(onus::postgres::insert_tx(&*tx, j).await?);
        }
        tx.commit()
            .await
            .map_err(|e| StoreError::Query(onus::store::postgres::describe(&e)))?;
        Ok((rows, ins))
    }

    /// Runs one statement (a write, or a read that must see the latest writes).
    pub async fn run(&self, sql: &'static str, params: Vec<Val>) -> StoreResult<Rows> {
        let (mut rows, _) = self.tx(vec![stmt(sql, params)], Vec::new()).await?;
        Ok(rows.pop().unwrap_or_default())
    }

    /// Runs one read-only statement.
    pub async fn read(&self, sql: &'static str, params: Vec<Val>) -> StoreResult<Rows> {
        let s = stmt(sql, params);
        if let Some(sq) = self.sqlite() {
            return sq.read(move |conn| sqlite_rows(conn, &s)).await;
        }
        let pg = self.postgres().ok_or(StoreError::Closed)?;
        let c = pg.pool().get().await.map_err(q)?;
        pg_rows(&**c, &s).await
    }

    /// Applies the webhook schema's migrations not applied yet, recorded in
    /// `onus_webhooks_schema` (on PostgreSQL under an advisory lock, so processes may start at once).
    pub async fn migrate(&self) -> StoreResult<()> {
        const VERSION_TABLE: &str =
            "CREATE TABLE IF NOT EXISTS onus_webhooks_schema (version BIGINT NOT NULL)";
        if let Some(s) = self.sqlite() {
            return s
                .write(move |conn| {
                    conn.execute_batch(VERSION_TABLE).map_err(q)?;
                    let have: i64 = conn
                        .query_row(
                            "SELECT COALESCE(MAX(version), 0) FROM onus_webhooks_schema",
                            [],
                            |r| r.get(0),
                        )
                        .map_err(q)?;
                    for (i, script) in MIGRATIONS.iter().enumerate().skip(have.max(0) as usize) {
                        conn.execute_batch(script).map_err(q)?;
                        conn.execute(
                            "INSERT INTO onus_webhooks_schema (version) VALUES (?1)",
                            [i as i64 + 1],
                        )
                        .map_err(q)?;
                    }
                    Ok(())
                })
                .await;
        }
        let pg = self.postgres().ok_or(StoreError::Closed)?;
        let mut c = pg.pool().get().await.map_err(q)?;
        let describe =
            |e: tokio_postgres::Error| StoreError::Query(onus::store::postgres::describe(&e));
        let tx = c.transaction().await.map_err(describe)?;
        tx.batch_execute("SELECT pg_advisory_xact_lock(7300183)")
            .await
            .map_err(describe)?;
        tx.batch_execute(VERSION_TABLE).await.map_err(describe)?;
        let have: i64 = tx
            .query_one(
                "SELECT COALESCE(MAX(version), 0) FROM onus_webhooks_schema",
                &[],
            )
            .await
            .map_err(describe)?
            .get(0);
        for (i, script) in MIGRATIONS.iter().enumerate().skip(have.max(0) as usize) {
            tx.batch_execute(script).await.map_err(describe)?;
            tx.execute(
                "INSERT INTO onus_webhooks_schema (version) VALUES ($1)",
                &[&(i as i64 + 1)],
            )
            .await
            .map_err(describe)?;
        }
        tx.commit().await.map_err(describe)
    }
}
