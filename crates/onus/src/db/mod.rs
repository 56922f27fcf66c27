//! The database layer components build on: their statements, their rows, their transactions and
//! their migrations, on either backend, through the same path the job store uses.
//!
//! - A statement is [`Sql`]: the table it reads (named in decode errors) and its text, written
//!   once for both backends where it can be (`$1`, `$2`, ... numbered in order of first use).
//! - Parameters are [`Value`]s, bound in each backend's convention: on SQLite times as Unix
//!   microseconds, JSON as text and flags as 0/1; on PostgreSQL `timestamptz`, `jsonb` and
//!   `boolean`. The job tables follow the same convention.
//! - Rows decode into typed records with [`Row::get`]: a missing column, a NULL where none is
//!   allowed or a value of the wrong type is a [`StoreError::Decode`] naming the table and column.
//! - [`Tx`] is an open transaction. One `async fn` generic over `Tx` serves a component's own
//!   transactions ([`Db::tx`]: on SQLite inside the single writer, so component writes batch with
//!   job writes; on PostgreSQL from the pool) and the caller's own open transaction (the outbox:
//!   [`SqliteTx`] over a `rusqlite` transaction, [`PgTx`] over a `tokio-postgres` one).
//! - [`Line`]: a component's numbered migrations per backend, applied by one runner
//!   ([`Store::migrate`]) under one lock and recorded in `onus_migrations`.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use crate::store::{Finish, InsertRow, Inserted, Store, StoreError, StoreResult};

pub mod migrate;
pub(crate) mod postgres;
pub(crate) mod sqlite;
pub(crate) mod value;

pub use migrate::{Applied, Line, LineStatus, Migration, JOBS};
pub use value::{FromValue, Json, Value};

/// Which database a transaction runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The embedded SQLite file.
    Sqlite,
    /// A PostgreSQL server.
    Postgres,
}

/// One statement: the table it is about and its text per backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sql {
    /// The table its rows come from, named in decode errors.
    pub table: &'static str,
    sqlite: &'static str,
    postgres: &'static str,
}

impl Sql {
    /// A statement both backends accept as written.
    pub const fn new(table: &'static str, text: &'static str) -> Self {
        Sql {
            table,
            sqlite: text,
            postgres: text,
        }
    }

    /// A statement written once per backend.
    pub const fn per_backend(
        table: &'static str,
        sqlite: &'static str,
        postgres: &'static str,
    ) -> Self {
        Sql {
            table,
            sqlite,
            postgres,
        }
    }

    /// Its text for `backend`.
    pub fn text(&self, backend: Backend) -> &'static str {
        match backend {
            Backend::Sqlite => self.sqlite,
            Backend::Postgres => self.postgres,
        }
    }
}

/// One row of a result, decoded column by column with [`Row::get`].
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    backend: Backend,
    table: &'static str,
    columns: Arc<[String]>,
    values: Vec<Value>,
}

impl Row {
    pub(crate) fn new(
        backend: Backend,
        table: &'static str,
        columns: Arc<[String]>,
        values: Vec<Value>,
    ) -> Self {
        Row {
            backend,
            table,
            columns,
            values,
        }
    }

    /// The value of `column` as `T`; an error names the table and column when the column is
    /// missing, NULL where `T` allows none, or of another type.
    pub fn get<T: FromValue>(&self, column: &str) -> StoreResult<T> {
        let at = self.columns.iter().position(|c| c == column);
        let Some(v) = at.and_then(|i| self.values.get(i)) else {
            return Err(self.decode(column, "the column is missing from the result".into()));
        };
        T::from_value(v, self.backend).map_err(|problem| self.decode(column, problem))
    }

    fn decode(&self, column: &str, problem: String) -> StoreError {
        StoreError::Decode {
            table: self.table,
            column: column.to_string(),
            problem,
        }
    }
}

/// A typed record read from a row.
pub trait FromRow: Sized {
    /// Decodes one row.
    fn from_row(row: &Row) -> StoreResult<Self>;
}

/// An open transaction on either backend. Write each operation once as an `async fn` generic
/// over `T: Tx + ?Sized`; it runs in [`Db::tx`] and in the caller's own transaction alike.
///
/// On SQLite every call completes at once (the connection is synchronous), so an operation
/// must await nothing but its transaction: [`Db::tx`] refuses one that does.
#[allow(async_fn_in_trait)] // Send-ness follows the concrete transaction: PgTx's futures are Send
pub trait Tx {
    /// The backend it runs on.
    fn backend(&self) -> Backend;

    /// Runs `sql` with `params` and returns its rows.
    async fn query(&self, sql: &Sql, params: &[Value]) -> StoreResult<Vec<Row>>;

    /// Runs `sql` with `params` and returns how many rows it changed.
    async fn execute(&self, sql: &Sql, params: &[Value]) -> StoreResult<u64>;

    /// Inserts a job (prepared with [`crate::Client::prepare`]) in this transaction: it commits
    /// with the transaction or not at all.
    async fn insert_job(&self, row: InsertRow) -> StoreResult<Inserted>;

    /// Records a finished attempt in this transaction, guarded like [`Store::finish`] (the job
    /// must still be running this attempt for its owner): false when it was not. Handlers use it
    /// through [`crate::JobContext::complete_with`].
    async fn finish_job(&self, finish: &Finish) -> StoreResult<bool>;

    /// Runs `sql` and decodes each row as `R`.
    async fn fetch<R: FromRow>(&self, sql: &Sql, params: &[Value]) -> StoreResult<Vec<R>> {
        self.query(sql, params)
            .await?
            .iter()
            .map(R::from_row)
            .collect()
    }

    /// Runs `sql` and decodes its first row as `R`, if it returned one.
    async fn fetch_opt<R: FromRow>(&self, sql: &Sql, params: &[Value]) -> StoreResult<Option<R>> {
        self.query(sql, params)
            .await?
            .first()
            .map(R::from_row)
            .transpose()
    }
}

/// The caller's own open SQLite transaction (or any connection inside one).
#[derive(Debug, Clone, Copy)]
pub struct SqliteTx<'c> {
    conn: &'c rusqlite::Connection,
}

impl<'c> SqliteTx<'c> {
    /// Wraps `conn`, which the caller holds in an open transaction (a `rusqlite::Transaction`
    /// derefs to it).
    pub fn new(conn: &'c rusqlite::Connection) -> Self {
        SqliteTx { conn }
    }
}

impl Tx for SqliteTx<'_> {
    fn backend(&self) -> Backend {
        Backend::Sqlite
    }

    async fn query(&self, sql: &Sql, params: &[Value]) -> StoreResult<Vec<Row>> {
        sqlite::rows(self.conn, sql, params)
    }

    async fn execute(&self, sql: &Sql, params: &[Value]) -> StoreResult<u64> {
        sqlite::execute(self.conn, sql, params)
    }

    async fn insert_job(&self, row: InsertRow) -> StoreResult<Inserted> {
        crate::store::sqlite::insert_tx(self.conn, row)
    }

    async fn finish_job(&self, finish: &Finish) -> StoreResult<bool> {
        crate::store::sqlite::finish_one(self.conn, finish, false)
    }
}

/// The caller's own open PostgreSQL transaction.
#[derive(Debug, Clone, Copy)]
pub struct PgTx<'c> {
    conn: PgConn<'c>,
}

#[derive(Clone, Copy)]
enum PgConn<'c> {
    Tx(&'c tokio_postgres::Transaction<'c>),
    Client(&'c tokio_postgres::Client),
}

impl std::fmt::Debug for PgConn<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PgConn::Tx(_) => "transaction",
            PgConn::Client(_) => "connection",
        })
    }
}

impl<'c> PgTx<'c> {
    /// Wraps the caller's open transaction (a `deadpool_postgres::Transaction` derefs to one).
    pub fn new(tx: &'c tokio_postgres::Transaction<'c>) -> Self {
        PgTx {
            conn: PgConn::Tx(tx),
        }
    }

    /// A connection outside any transaction, for reads.
    pub(crate) fn client(c: &'c tokio_postgres::Client) -> Self {
        PgTx {
            conn: PgConn::Client(c),
        }
    }
}

impl Tx for PgTx<'_> {
    fn backend(&self) -> Backend {
        Backend::Postgres
    }

    async fn query(&self, sql: &Sql, params: &[Value]) -> StoreResult<Vec<Row>> {
        match self.conn {
            PgConn::Tx(t) => postgres::rows(t, sql, params).await,
            PgConn::Client(c) => postgres::rows(c, sql, params).await,
        }
    }

    async fn execute(&self, sql: &Sql, params: &[Value]) -> StoreResult<u64> {
        match self.conn {
            PgConn::Tx(t) => postgres::execute(t, sql, params).await,
            PgConn::Client(c) => postgres::execute(c, sql, params).await,
        }
    }

    async fn insert_job(&self, row: InsertRow) -> StoreResult<Inserted> {
        match self.conn {
            PgConn::Tx(t) => crate::store::postgres::insert_tx(t, row).await,
            PgConn::Client(c) => crate::store::postgres::insert_tx(c, row).await,
        }
    }

    async fn finish_job(&self, finish: &Finish) -> StoreResult<bool> {
        match self.conn {
            PgConn::Tx(t) => crate::store::postgres::finish_in(t, finish).await,
            PgConn::Client(_) => Err(StoreError::Query(
                "a finished attempt is recorded inside a transaction, not on a bare connection"
                    .into(),
            )),
        }
    }
}

/// The transaction [`Db::tx`] hands an operation: on whichever backend the store runs.
#[derive(Debug, Clone, Copy)]
pub enum AnyTx<'c> {
    /// On SQLite.
    Sqlite(SqliteTx<'c>),
    /// On PostgreSQL.
    Postgres(PgTx<'c>),
}

impl Tx for AnyTx<'_> {
    fn backend(&self) -> Backend {
        match self {
            AnyTx::Sqlite(_) => Backend::Sqlite,
            AnyTx::Postgres(_) => Backend::Postgres,
        }
    }

    async fn query(&self, sql: &Sql, params: &[Value]) -> StoreResult<Vec<Row>> {
        match self {
            AnyTx::Sqlite(t) => t.query(sql, params).await,
            AnyTx::Postgres(t) => t.query(sql, params).await,
        }
    }

    async fn execute(&self, sql: &Sql, params: &[Value]) -> StoreResult<u64> {
        match self {
            AnyTx::Sqlite(t) => t.execute(sql, params).await,
            AnyTx::Postgres(t) => t.execute(sql, params).await,
        }
    }

    async fn insert_job(&self, row: InsertRow) -> StoreResult<Inserted> {
        match self {
            AnyTx::Sqlite(t) => t.insert_job(row).await,
            AnyTx::Postgres(t) => t.insert_job(row).await,
        }
    }

    async fn finish_job(&self, finish: &Finish) -> StoreResult<bool> {
        match self {
            AnyTx::Sqlite(t) => t.finish_job(finish).await,
            AnyTx::Postgres(t) => t.finish_job(finish).await,
        }
    }
}

/// A future that need not be `Send`: operations run where their transaction lives.
pub type LocalFuture<'t, T> = Pin<Box<dyn Future<Output = T> + 't>>;

/// An operation as a store runs it: given the open transaction, it succeeds (commit) or fails
/// (roll back). [`Db::tx`] builds these; a store implements [`Store::transaction`] with them.
pub type TxFn = Box<dyn for<'t> FnOnce(&'t AnyTx<'t>) -> LocalFuture<'t, StoreResult<()>> + Send>;

/// The result of an operation on a [`SqliteTx`], from synchronous code: SQLite answers at once,
/// so the operation completes on its first poll, without an async runtime. An operation that
/// awaits anything else fails instead of blocking.
///
/// ```no_run
/// # fn demo(conn: &mut onus::sqlite::rusqlite::Connection, client: &onus::Client) -> Result<(), Box<dyn std::error::Error>> {
/// let tx = conn.transaction()?;
/// tx.execute("INSERT INTO orders (id, total) VALUES (?1, ?2)", (42, 1999))?;
/// let job = onus::NewJob::new("receipt.send", serde_json::json!({"order": 42}));
/// onus::db::ready(client.insert_in(&onus::db::SqliteTx::new(&tx), job))?;
/// tx.commit()?; // the order and its job, or neither
/// # Ok(()) }
/// ```
pub fn ready<T, E: From<StoreError>>(fut: impl Future<Output = Result<T, E>>) -> Result<T, E> {
    use futures_util::FutureExt;
    fut.now_or_never().unwrap_or_else(|| {
        Err(StoreError::Query(
            "a database operation awaited something other than its SQLite transaction; an operation may await only its transaction".into(),
        )
        .into())
    })
}

/// A component's handle on the job store's database.
#[derive(Debug, Clone)]
pub struct Db {
    store: Arc<dyn Store>,
}

impl Db {
    /// The database of `store`.
    pub fn new(store: Arc<dyn Store>) -> Self {
        Db { store }
    }

    /// The job store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Runs `op` in one transaction (on SQLite in the single writer, batched with job writes; on
    /// PostgreSQL on a pooled connection): committed when it returns `Ok`, rolled back when it
    /// returns an error (which is returned as it was).
    pub async fn tx<R, E, F>(&self, op: F) -> Result<R, E>
    where
        F: for<'t> FnOnce(&'t AnyTx<'t>) -> LocalFuture<'t, Result<R, E>> + Send + 'static,
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        self.run(op, false).await
    }

    /// Runs read-only `op` on a read connection (no transaction on PostgreSQL).
    pub async fn read<R, E, F>(&self, op: F) -> Result<R, E>
    where
        F: for<'t> FnOnce(&'t AnyTx<'t>) -> LocalFuture<'t, Result<R, E>> + Send + 'static,
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        self.run(op, true).await
    }

    async fn run<R, E, F>(&self, op: F, read_only: bool) -> Result<R, E>
    where
        F: for<'t> FnOnce(&'t AnyTx<'t>) -> LocalFuture<'t, Result<R, E>> + Send + 'static,
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        type Slot<R, E> = Arc<Mutex<Option<Result<R, E>>>>;
        let slot: Slot<R, E> = Arc::new(Mutex::new(None));
        let out = slot.clone();
        let f: TxFn = Box::new(move |tx| {
            Box::pin(async move {
                let r = op(tx).await;
                let failed = r.is_err();
                *out.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
                if failed {
                    Err(StoreError::Aborted)
                } else {
                    Ok(())
                }
            })
        });
        let ran = if read_only {
            self.store.read_only(f).await
        } else {
            self.store.transaction(f).await
        };
        let answer = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
        match (answer, ran) {
            (Some(Err(e)), _) => Err(e),
            (Some(Ok(v)), Ok(())) => Ok(v),
            (_, Err(e)) => Err(e.into()),
            (None, Ok(())) => Err(StoreError::Query("the operation did not run".into()).into()),
        }
    }

    /// Runs one statement in its own transaction and returns its rows as `R`.
    pub async fn fetch<R: FromRow + Send + 'static>(
        &self,
        sql: &'static Sql,
        params: Vec<Value>,
    ) -> StoreResult<Vec<R>> {
        self.tx(move |tx| Box::pin(async move { tx.fetch(sql, &params).await }))
            .await
    }

    /// Reads with one statement and returns its rows as `R`.
    pub async fn read_rows<R: FromRow + Send + 'static>(
        &self,
        sql: &'static Sql,
        params: Vec<Value>,
    ) -> StoreResult<Vec<R>> {
        self.read(move |tx| Box::pin(async move { tx.fetch(sql, &params).await }))
            .await
    }

    /// Runs one statement in its own transaction; returns how many rows it changed.
    pub async fn execute(&self, sql: &'static Sql, params: Vec<Value>) -> StoreResult<u64> {
        self.tx(move |tx| Box::pin(async move { tx.execute(sql, &params).await }))
            .await
    }
}
