//! The SQL engine layer: statements, rows, values, transactions and migrations on either backend.
//! It knows SQLite and PostgreSQL and nothing above them: the job store and the components
//! (webhooks, mail, the runtime's own tables) are written on it, never the reverse.
//!
//! - A statement is [`Sql`]: the table it reads (named in decode errors) and its text, written
//!   once for both backends where it can be (`$1`, `$2`, ... numbered in order of first use).
//! - Parameters are [`Value`]s, bound in each backend's convention: on SQLite times as Unix
//!   microseconds, JSON as text and flags as 0/1; on PostgreSQL `timestamptz`, `jsonb` and
//!   `boolean`. The job tables follow the same convention.
//! - Rows decode into typed records with [`Row::get`]: a missing column, a NULL where none is
//!   allowed or a value of the wrong type is a [`StoreError::Decode`] naming the table and column.
//! - [`Tx`] is an open transaction. One `async fn` generic over `Tx` serves the store's own
//!   transactions (`onus::store::Db::tx`: on SQLite inside the single writer, so component writes
//!   batch with job writes; on PostgreSQL from the pool) and the caller's own open transaction
//!   (the outbox: [`SqliteTx`] over a `rusqlite` transaction, [`PgTx`] over a `tokio-postgres`
//!   one).
//! - [`Line`]: a numbered list of migrations per backend, applied by one runner under one lock
//!   and recorded in `onus_migrations`.
//! - [`StoreError`]: every database failure, with whose fault it is.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

pub mod error;
pub mod migrate;
pub(crate) mod postgres;
pub(crate) mod sqlite;
pub(crate) mod value;

pub use error::{DriverError, Fault, StoreError, StoreResult};
pub use migrate::{
    columns, schema_differences, Applied, Line, LineStatus, Migration, ONE_BACKEND_ONLY,
};
pub use value::{FromValue, Json, Value};

/// Which database a transaction runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The embedded SQLite file.
    Sqlite,
    /// A PostgreSQL server.
    Postgres,
}

/// One statement: the table it is about and its text per backend. A statement written in the
/// source is prepared once per connection and kept; one built at run time ([`Sql::built`], a
/// filter's conditions) is prepared for its one use, so such statements never fill the caches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sql {
    /// The table its rows come from, named in decode errors.
    pub table: &'static str,
    sqlite: Cow<'static, str>,
    postgres: Cow<'static, str>,
    cached: bool,
}

impl Sql {
    /// A statement both backends accept as written.
    pub const fn new(table: &'static str, text: &'static str) -> Self {
        Sql::per_backend(table, text, text)
    }

    /// A statement written once per backend.
    pub const fn per_backend(
        table: &'static str,
        sqlite: &'static str,
        postgres: &'static str,
    ) -> Self {
        Sql {
            table,
            sqlite: Cow::Borrowed(sqlite),
            postgres: Cow::Borrowed(postgres),
            cached: true,
        }
    }

    /// A statement built at run time for `backend`, prepared for this use only.
    pub fn built(table: &'static str, backend: Backend, text: String) -> Self {
        let (sqlite, postgres) = match backend {
            Backend::Sqlite => (Cow::Owned(text), Cow::Borrowed("")),
            Backend::Postgres => (Cow::Borrowed(""), Cow::Owned(text)),
        };
        Sql {
            table,
            sqlite,
            postgres,
            cached: false,
        }
    }

    /// A statement of one backend's engine built once at run time (a claim assembled from its
    /// parts), kept prepared like one written in the source.
    pub fn for_backend(table: &'static str, backend: Backend, text: String) -> Self {
        Sql {
            cached: true,
            ..Sql::built(table, backend, text)
        }
    }

    /// Its text for `backend`.
    pub fn text(&self, backend: Backend) -> &str {
        match backend {
            Backend::Sqlite => &self.sqlite,
            Backend::Postgres => &self.postgres,
        }
    }

    /// Whether connections keep it prepared (false for one built at run time).
    pub(crate) fn cached(&self) -> bool {
        self.cached
    }
}

static ADVISORY_LOCK: Sql = Sql::new(
    "a lock",
    "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
);

/// One row of a result, decoded column by column with [`Row::get`].
#[derive(Debug, Clone)]
pub struct Row {
    backend: Backend,
    table: &'static str,
    columns: Arc<[String]>,
    values: Values,
    /// Where [`Row::take`] looks first: after the column it took last (a decoder that takes the
    /// columns in their order finds each at once).
    next: usize,
}

/// A row's values: SQLite's read at once (its connection is needed to read them), PostgreSQL's
/// kept as the driver received them and each decoded straight into the type asked for.
#[derive(Debug, Clone)]
enum Values {
    Read(Vec<Value>),
    Postgres(Arc<tokio_postgres::Row>),
}

impl Values {
    fn len(&self) -> usize {
        match self {
            Values::Read(v) => v.len(),
            Values::Postgres(r) => r.len(),
        }
    }

    /// Every value, for comparing rows.
    fn all(&self) -> Vec<Value> {
        match self {
            Values::Read(v) => v.clone(),
            Values::Postgres(r) => (0..r.len())
                .map(|i| value::from_postgres(r, i).unwrap_or(Value::Null))
                .collect(),
        }
    }
}

impl PartialEq for Row {
    fn eq(&self, other: &Self) -> bool {
        (self.backend, self.table, &self.columns, self.values.all())
            == (
                other.backend,
                other.table,
                &other.columns,
                other.values.all(),
            )
    }
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
            values: Values::Read(values),
            next: 0,
        }
    }

    /// A row as PostgreSQL's driver received it.
    pub(crate) fn postgres(
        table: &'static str,
        columns: Arc<[String]>,
        row: tokio_postgres::Row,
    ) -> Self {
        Row {
            backend: Backend::Postgres,
            table,
            columns,
            values: Values::Postgres(Arc::new(row)),
            next: 0,
        }
    }

    /// The value of `column` as `T`; an error names the table and column when the column is
    /// missing, NULL where `T` allows none, or of another type.
    pub fn get<T: FromValue>(&self, column: &str) -> StoreResult<T> {
        let at = self.at(column)?;
        match &self.values {
            Values::Read(v) => T::from_value(&v[at], self.backend),
            Values::Postgres(r) => T::from_postgres_column(r, at),
        }
        .map_err(|problem| self.decode(column, problem))
    }

    /// As [`Row::get`], moving the value out where it was read already (it reads as NULL
    /// afterwards): no copy of a text or JSON value.
    pub fn take<T: FromValue>(&mut self, column: &str) -> StoreResult<T> {
        let at = match self.columns.get(self.next) {
            Some(c) if c == column && self.next < self.values.len() => self.next,
            _ => self.at(column)?,
        };
        self.next = at + 1;
        match &mut self.values {
            Values::Read(v) => {
                let v = std::mem::replace(&mut v[at], Value::Null);
                T::from_owned(v, self.backend)
            }
            Values::Postgres(r) => T::from_postgres_column(r, at),
        }
        .map_err(|problem| self.decode(column, problem))
    }

    /// Whether the result has `column`.
    pub fn has(&self, column: &str) -> bool {
        // Without building the error `at` would (a claim's rows lack `progress`: two strings
        // made and dropped per job).
        self.columns
            .iter()
            .position(|c| c == column)
            .is_some_and(|i| i < self.values.len())
    }

    fn at(&self, column: &str) -> StoreResult<usize> {
        match self.columns.iter().position(|c| c == column) {
            Some(i) if i < self.values.len() => Ok(i),
            _ => Err(self.decode(column, "the column is missing from the result".into())),
        }
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

    /// Decodes one row it may take values from ([`Row::take`]) instead of copying them.
    fn from_owned(row: Row) -> StoreResult<Self> {
        Self::from_row(&row)
    }
}

/// An open transaction on either backend. Write each operation once as an `async fn` generic
/// over `T: Tx + ?Sized`; it runs in the store's `Db::tx` and in the caller's own transaction alike.
///
/// On SQLite every call completes at once (the connection is synchronous), so an operation
/// must await nothing but its transaction: the store's `Db::tx` refuses one that does.
#[allow(async_fn_in_trait)] // Send-ness follows the concrete transaction: PgTx's futures are Send
pub trait Tx {
    /// The backend it runs on.
    fn backend(&self) -> Backend;

    /// Runs `sql` with `params` and returns its rows.
    async fn query(&self, sql: &Sql, params: &[Value]) -> StoreResult<Vec<Row>>;

    /// Runs `sql` with `params` and returns how many rows it changed.
    async fn execute(&self, sql: &Sql, params: &[Value]) -> StoreResult<u64>;

    /// Runs `sql`, several statements without parameters (a migration file, `BEGIN`).
    async fn batch(&self, sql: &str) -> StoreResult<()>;

    /// The backend's own transaction underneath, for the job store's statements that differ by
    /// engine (bulk insert): not for components, which write [`Sql`] through `query` and
    /// `execute`.
    #[doc(hidden)]
    fn engine(&self) -> AnyTx<'_>;

    /// Takes the lock named `name` until this transaction ends: on PostgreSQL a transaction-level
    /// advisory lock, so writers of the same name queue up; on SQLite nothing, since its one
    /// writer already runs one transaction at a time.
    async fn lock(&self, name: &str) -> StoreResult<()> {
        match self.backend() {
            Backend::Sqlite => Ok(()),
            Backend::Postgres => self.execute(&ADVISORY_LOCK, &[name.into()]).await.map(drop),
        }
    }

    /// Runs `sql`, a count, and returns its first row's column `n` (0 when it returned no row or a
    /// negative number).
    async fn count(&self, sql: &Sql, params: &[Value]) -> StoreResult<u64> {
        match self.query(sql, params).await?.first() {
            Some(r) => Ok(r.get::<i64>("n")?.max(0) as u64),
            None => Ok(0),
        }
    }

    /// Runs `sql` and decodes each row as `R`.
    async fn fetch<R: FromRow>(&self, sql: &Sql, params: &[Value]) -> StoreResult<Vec<R>> {
        self.query(sql, params)
            .await?
            .into_iter()
            .map(R::from_owned)
            .collect()
    }

    /// Runs `sql` and decodes its first row as `R`, if it returned one.
    async fn fetch_opt<R: FromRow>(&self, sql: &Sql, params: &[Value]) -> StoreResult<Option<R>> {
        let first = self.query(sql, params).await?.into_iter().next();
        first.map(R::from_owned).transpose()
    }
}

/// The caller's own open SQLite transaction (or any connection inside one).
#[derive(Debug, Clone, Copy)]
pub struct SqliteTx<'c> {
    pub(crate) conn: &'c rusqlite::Connection,
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

    async fn batch(&self, sql: &str) -> StoreResult<()> {
        self.conn.execute_batch(sql).map_err(sqlite::error)
    }

    fn engine(&self) -> AnyTx<'_> {
        AnyTx::Sqlite(*self)
    }
}

/// An open PostgreSQL transaction: the caller's own, or one of the store's pool (whose
/// connections keep each statement prepared).
#[derive(Debug, Clone, Copy)]
pub struct PgTx<'c>(pub(crate) PgConn<'c>);

impl<'c> PgTx<'c> {
    /// Wraps the caller's open transaction (a `deadpool_postgres::Transaction` derefs to one).
    pub fn new(tx: &'c tokio_postgres::Transaction<'c>) -> Self {
        PgTx(PgConn::Tx(tx))
    }

    /// A transaction of the store's pool: statements prepared once per connection.
    pub(crate) fn pooled(tx: &'c deadpool_postgres::Transaction<'c>) -> Self {
        PgTx(PgConn::PooledTx(tx))
    }

    /// A pooled connection outside any transaction: reads, and writes of one statement (each its
    /// own transaction).
    pub(crate) fn pooled_client(c: &'c deadpool_postgres::Object) -> Self {
        PgTx(PgConn::PooledClient(c))
    }
}

impl Tx for PgTx<'_> {
    fn backend(&self) -> Backend {
        Backend::Postgres
    }

    async fn query(&self, sql: &Sql, params: &[Value]) -> StoreResult<Vec<Row>> {
        let text = sql.text(Backend::Postgres);
        postgres::query(
            self.0,
            sql.table,
            text,
            sql.cached(),
            &postgres::refs(params),
        )
        .await
    }

    async fn execute(&self, sql: &Sql, params: &[Value]) -> StoreResult<u64> {
        let text = sql.text(Backend::Postgres);
        postgres::execute(self.0, text, sql.cached(), &postgres::refs(params)).await
    }

    async fn batch(&self, sql: &str) -> StoreResult<()> {
        match self.0 {
            PgConn::Tx(t) => t.batch_execute(sql).await,
            PgConn::PooledTx(t) => t.batch_execute(sql).await,
            PgConn::PooledClient(c) => c.batch_execute(sql).await,
        }
        .map_err(postgres::error)
    }

    fn engine(&self) -> AnyTx<'_> {
        AnyTx::Postgres(*self)
    }
}

/// The transaction the store's `Db::tx` hands an operation: on whichever backend the store runs.
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

    async fn batch(&self, sql: &str) -> StoreResult<()> {
        match self {
            AnyTx::Sqlite(t) => t.batch(sql).await,
            AnyTx::Postgres(t) => t.batch(sql).await,
        }
    }

    fn engine(&self) -> AnyTx<'_> {
        *self
    }
}

/// A PostgreSQL connection under a [`PgTx`].
#[doc(hidden)]
#[derive(Clone, Copy)]
pub enum PgConn<'c> {
    /// The caller's own transaction.
    Tx(&'c tokio_postgres::Transaction<'c>),
    /// A transaction of the store's pool (statements prepared once per connection).
    PooledTx(&'c deadpool_postgres::Transaction<'c>),
    /// A connection of the store's pool outside any transaction (reads, one-statement writes).
    PooledClient(&'c deadpool_postgres::Object),
}

impl std::fmt::Debug for PgConn<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PgConn::Tx(_) | PgConn::PooledTx(_) => "PostgreSQL transaction",
            PgConn::PooledClient(_) => "PostgreSQL connection",
        })
    }
}

/// A future that need not be `Send`: operations run where their transaction lives.
pub type LocalFuture<'t, T> = Pin<Box<dyn Future<Output = T> + 't>>;

/// An operation as a store runs it: given the open transaction, it succeeds (commit) or fails
/// (roll back). The store's `Db::tx` builds these; a store runs them in its transactions.
pub type TxFn = Box<dyn for<'t> FnOnce(&'t AnyTx<'t>) -> LocalFuture<'t, StoreResult<()>> + Send>;

/// An operation that may share its transaction with other callers' ([`crate::store::Db::tx_shared`]):
/// it can run again, alone, when it failed among others.
pub type SharedTxFn =
    Box<dyn for<'t> Fn(&'t AnyTx<'t>) -> LocalFuture<'t, StoreResult<()>> + Send + Sync>;

/// The result of an operation on a [`SqliteTx`], from synchronous code: SQLite answers at once,
/// so the operation completes on its first poll, without an async runtime. An operation that
/// awaits anything else fails instead of blocking.
///
/// ```no_run
/// # fn demo(conn: &mut onus::sqlite::rusqlite::Connection, client: &onus::Client) -> Result<(), Box<dyn std::error::Error>> {
/// let tx = conn.transaction()?;
/// tx.execute("INSERT INTO orders (id, total) VALUES (?1, ?2)", (42, 1999))?;
/// let job = onus::NewJob::new("receipt.send", serde_json::json!({"order": 42}));
/// onus::sql::ready(client.insert_in(&onus::sql::SqliteTx::new(&tx), job))?;
/// tx.commit()?; // the order and its job, or neither
/// # Ok(()) }
/// ```
pub fn ready<T, E: From<StoreError>>(fut: impl Future<Output = Result<T, E>>) -> Result<T, E> {
    use futures_util::FutureExt;
    fut.now_or_never().unwrap_or_else(|| {
        Err(StoreError::Query(
            "a database operation awaited something other than its SQLite transaction; an operation may await only its transaction".into(), None
        )
        .into())
    })
}
