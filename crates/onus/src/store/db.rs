//! The job store's database as the layers above reach it: [`Db`], a component's handle on it
//! (its own transactions, batched with job writes on SQLite), [`JobTx`], the job store's
//! operations inside any open transaction (the outbox), and [`JOBS`], the job tables' migrations.

use std::sync::{Arc, Mutex};

use crate::sql::{
    AnyTx, FromRow, Line, LocalFuture, PgConn, PgTx, SharedTxFn, Sql, Tx, TxFn, Value,
};
use crate::store::{Finish, InsertRow, Inserted, Store, StoreError, StoreResult};

/// The job store's operations inside an open transaction: on [`Db::tx`]'s, or on the caller's
/// own ([`crate::sql::SqliteTx`], [`crate::sql::PgTx`]).
#[allow(async_fn_in_trait)] // Send-ness follows the concrete transaction
pub trait JobTx: Tx {
    /// Inserts a job (prepared with [`crate::Client::prepare`]) in this transaction: it commits
    /// with the transaction or not at all.
    async fn insert_job(&self, row: InsertRow) -> StoreResult<Inserted> {
        let mut out = crate::store::insert::insert(self, vec![row], None).await?;
        out.pop()
            .ok_or_else(|| StoreError::Query("an insert of one row returned none".into(), None))
    }

    /// Inserts jobs (each prepared with [`crate::Client::prepare`]) in this transaction, in
    /// order: rows without a unique key in one statement per run of them.
    async fn insert_jobs(&self, rows: Vec<InsertRow>) -> StoreResult<Vec<Inserted>> {
        crate::store::insert::insert(self, rows, None).await
    }

    /// Records a finished attempt in this transaction, guarded like [`Store::finish`] (the job
    /// must still be running this attempt for its owner): false when it was not. Handlers use it
    /// through [`crate::JobContext::complete_with`].
    async fn finish_job(&self, finish: &Finish) -> StoreResult<bool> {
        if let AnyTx::Postgres(PgTx(PgConn::PooledClient(_))) = self.engine() {
            return Err(StoreError::Query(
                "a finished attempt is recorded inside a transaction, not on a bare connection"
                    .into(),
                None,
            ));
        }
        crate::store::finish::locked(self, finish).await
    }
}

impl<T: Tx + ?Sized> JobTx for T {}

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
        E: From<StoreError> + std::fmt::Display + Send + 'static,
    {
        run_on(&*self.store, op, false).await
    }

    /// Runs `op` as [`Db::tx`] does, in a transaction it may share with other callers' `op`s so
    /// that they commit together (group commit), answered only once the commit holding it is
    /// done. One that fails undoes only its own writes and answers its own error: on SQLite it
    /// runs in its own savepoint; on PostgreSQL, when anything in a shared transaction fails, that
    /// transaction is rolled back and each of its operations runs again alone. So `op` may run
    /// more than once, and must do nothing but its database work. On PostgreSQL the operations of
    /// a batch share one session: a [`Tx::lock`] does not keep them from each other, a savepoint
    /// of a fixed name would be shared too, and an operation whose caller stopped waiting once its
    /// batch began still commits with it. A lock waited for longer than 100 ms sends the batch to
    /// run alone.
    pub async fn tx_shared<R, E, F>(&self, op: F) -> Result<R, E>
    where
        F: for<'t> Fn(&'t AnyTx<'t>) -> LocalFuture<'t, Result<R, E>> + Send + Sync + 'static,
        R: Send + 'static,
        E: From<StoreError> + std::fmt::Display + Send + 'static,
    {
        shared(&*self.store, op).await
    }

    /// Runs read-only `op` on a read connection (no transaction on PostgreSQL).
    pub async fn read<R, E, F>(&self, op: F) -> Result<R, E>
    where
        F: for<'t> FnOnce(&'t AnyTx<'t>) -> LocalFuture<'t, Result<R, E>> + Send + 'static,
        R: Send + 'static,
        E: From<StoreError> + std::fmt::Display + Send + 'static,
    {
        run_on(&*self.store, op, true).await
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

/// Runs `op` on `store` in one transaction (or, `read_only`, on a read connection) and returns
/// its answer: how a flow written once over [`Tx`] runs on either backend.
pub(crate) async fn run_on<S, R, E, F>(store: &S, op: F, read_only: bool) -> Result<R, E>
where
    S: Store + ?Sized,
    F: for<'t> FnOnce(&'t AnyTx<'t>) -> LocalFuture<'t, Result<R, E>> + Send + 'static,
    R: Send + 'static,
    E: From<StoreError> + std::fmt::Display + Send + 'static,
{
    let slot = Slot::default();
    let out = slot.clone();
    let f: TxFn = Box::new(move |tx| Box::pin(async move { keep(&out, op(tx).await) }));
    let ran = if read_only {
        store.read_only(f).await
    } else {
        store.transaction(f).await
    };
    answer(&slot, ran)
}

/// Where an operation the store runs leaves its own answer for its caller.
struct Slot<R, E>(Arc<Mutex<Option<Result<R, E>>>>);

impl<R, E> Default for Slot<R, E> {
    fn default() -> Self {
        Slot(Arc::new(Mutex::new(None)))
    }
}

impl<R, E> Clone for Slot<R, E> {
    fn clone(&self) -> Self {
        Slot(self.0.clone())
    }
}

/// Keeps an operation's answer (the last, when it ran again) and tells the store whether it
/// failed: the store sees the error's text (SQLite names it to the other writes of a batch it
/// ended); the caller gets the error itself from the slot.
fn keep<R, E: std::fmt::Display>(slot: &Slot<R, E>, r: Result<R, E>) -> StoreResult<()> {
    let seen = match &r {
        Err(e) => Err(StoreError::Query(e.to_string(), None)),
        Ok(_) => Ok(()),
    };
    *slot.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
    seen
}

/// The caller's answer: the operation's own, once the store says its transaction committed.
fn answer<R, E: From<StoreError>>(slot: &Slot<R, E>, ran: StoreResult<()>) -> Result<R, E> {
    let answer = slot.0.lock().unwrap_or_else(|e| e.into_inner()).take();
    match (answer, ran) {
        (Some(Err(e)), _) => Err(e),
        (Some(Ok(v)), Ok(())) => Ok(v),
        (_, Err(e)) => Err(e.into()),
        (None, Ok(())) => Err(StoreError::Query("the operation did not run".into(), None).into()),
    }
}

/// Runs `op` on `store` in a transaction it may share with other callers' (see [`Db::tx_shared`]).
pub(crate) async fn shared<S, R, E, F>(store: &S, op: F) -> Result<R, E>
where
    S: Store + ?Sized,
    F: for<'t> Fn(&'t AnyTx<'t>) -> LocalFuture<'t, Result<R, E>> + Send + Sync + 'static,
    R: Send + 'static,
    E: From<StoreError> + std::fmt::Display + Send + 'static,
{
    let slot = Slot::default();
    let out = slot.clone();
    let f: SharedTxFn = Box::new(move |tx| {
        let run = op(tx);
        let out = out.clone();
        Box::pin(async move { keep(&out, run.await) })
    });
    let ran = store.transaction_shared(f).await;
    answer(&slot, ran)
}

/// Runs a flow in one transaction on `store`.
pub(crate) async fn write<S, R, F>(store: &S, op: F) -> StoreResult<R>
where
    S: Store + ?Sized,
    F: for<'t> FnOnce(&'t AnyTx<'t>) -> LocalFuture<'t, StoreResult<R>> + Send + 'static,
    R: Send + 'static,
{
    run_on(store, op, false).await
}

/// Runs a read-only flow on a read connection of `store`.
pub(crate) async fn read<S, R, F>(store: &S, op: F) -> StoreResult<R>
where
    S: Store + ?Sized,
    F: for<'t> FnOnce(&'t AnyTx<'t>) -> LocalFuture<'t, StoreResult<R>> + Send + 'static,
    R: Send + 'static,
{
    run_on(store, op, true).await
}

/// The job layer's tables.
pub static JOBS: Line = Line {
    name: "jobs",
    sqlite: crate::migrations!(
        "../../migrations/jobs/sqlite",
        "001_jobs.sql",
        "002_tags_and_queues.sql",
        "003_counts.sql",
        "004_drop_running_by_owner.sql",
        "005_inserts_count_themselves.sql",
        "006_key_pauses.sql",
        "007_progress_and_results.sql",
        "008_periodic_pause.sql",
        "009_rate_keys.sql",
        "010_live_jobs.sql",
        "011_job_ends.sql",
        "012_processes.sql"
    ),
    postgres: crate::migrations!(
        "../../migrations/jobs/postgres",
        "001_jobs.sql",
        "002_tags_and_queues.sql",
        "003_counts.sql",
        "004_drop_running_by_owner.sql",
        "005_counted_update_without_join.sql",
        "006_key_pauses.sql",
        "007_progress_and_results.sql",
        "008_periodic_pause.sql",
        "009_rate_keys.sql",
        "010_live_jobs.sql",
        "011_job_ends.sql",
        "012_processes.sql"
    ),
};

/// The job layer's line followed by `lines`, without duplicates.
pub fn with_jobs(lines: &[&'static Line]) -> Vec<&'static Line> {
    let mut out: Vec<&'static Line> = vec![&JOBS];
    for l in lines {
        if !out.iter().any(|o| o.name == l.name) {
            out.push(l);
        }
    }
    out
}
