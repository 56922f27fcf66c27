//! Group commit: concurrent callers' small writes (an API's single inserts, pull workers' single
//! answers, a busy client's) share one transaction and so one commit. A short queue sits in front
//! of a few writers; each writer takes everything that queued while the previous transaction ran,
//! writes it at once, and answers each caller with its own part only after that commit. A batch
//! the database refuses (a row breaking a rule of the schema) is written again one caller at a
//! time, so only the caller whose part is bad gets the error.
//!
//! Three writes go through it: inserts of rows without a unique key ([`Inserts`]), finished
//! attempts ([`Finishes`]), and operations written over a transaction that callers ask to share a
//! commit ([`Ops`]: an event's publish, inserts with unique keys). SQLite needs none of this: its
//! single writer already commits whatever queued up together, each write in its own savepoint.

use std::future::Future;
use std::sync::Arc;

use deadpool_postgres::{Object, Pool};
use tokio::sync::{mpsc, oneshot, Mutex};

use super::{claims_of, finish_batch, insert_bulk, off_task, pg_error, pool_err};
use crate::sql::{AnyTx, PgConn, PgTx, SharedTxFn};
use crate::store::{Finish, InsertClaim, InsertRow, Inserted, StoreError, StoreResult};

/// Writers working at once: while one transaction commits, the next batch gathers and another
/// writer can send it (PostgreSQL flushes concurrent commits together).
const WRITERS: usize = 2;

/// A write of this many rows or more is written on its own: it fills a statement by itself.
pub(super) const ALONE_FROM: usize = 64;

/// At most this many rows in one transaction.
const MAX_ROWS: usize = 4096;

/// At most this many operations share one transaction.
const MAX_OPS: usize = 64;

/// How long an operation in a shared transaction waits for a lock (a row another transaction is
/// inserting with the same unique key, say) before the transaction gives up and each of its
/// operations runs again alone: one waiting operation would hold up the whole batch.
const SHARED_LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '100ms'";

/// What callers' parts share: a batch of them and how it is written.
pub(super) trait Batch: Send + Sync + Sized + 'static {
    /// One caller's part.
    type Part: Send + Sync + 'static;
    /// One caller's answer.
    type Out: Send + 'static;
    /// At most this many rows in one batch.
    const MAX: usize;
    /// The rows a part writes.
    fn rows(part: &Self::Part) -> usize;
    /// Writes `batch` on `client` and answers each caller.
    fn run(client: Object, batch: Vec<Pending<Self>>) -> impl Future<Output = ()> + Send;
}

/// A write of rows that callers' parts can share, written again one caller at a time when the
/// database refuses the batch.
pub(super) trait Write: Send + Sync + 'static {
    /// One caller's part.
    type Part: Send + Sync + 'static;
    /// One caller's answer.
    type Out: Send + 'static;
    /// The rows a part writes.
    fn rows(part: &Self::Part) -> usize;
    /// Writes `parts` in one transaction on `client`; one answer per part, in order.
    fn write<'a>(
        client: &'a mut Object,
        parts: &'a [&'a Self::Part],
    ) -> impl Future<Output = StoreResult<Vec<Self::Out>>> + Send + 'a;
}

impl<W: Write> Batch for W {
    type Part = W::Part;
    type Out = W::Out;
    const MAX: usize = MAX_ROWS;

    fn rows(part: &Self::Part) -> usize {
        W::rows(part)
    }

    fn run(client: Object, batch: Vec<Pending<Self>>) -> impl Future<Output = ()> + Send {
        write::<W>(client, batch)
    }
}

/// One caller's part, waiting for its commit.
pub(super) struct Pending<W: Batch> {
    part: W::Part,
    answer: oneshot::Sender<StoreResult<W::Out>>,
}

/// The queue in front of a write's writers.
pub(super) struct Group<W: Batch> {
    queue: mpsc::UnboundedSender<Pending<W>>,
}

impl<W: Batch> std::fmt::Debug for Group<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Group")
    }
}

impl<W: Batch> Group<W> {
    /// Starts the writers, which end when the queue is dropped.
    pub(super) fn start(pool: Pool) -> Self {
        let (queue, rx) = mpsc::unbounded_channel();
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..WRITERS {
            tokio::spawn(writer::<W>(pool.clone(), rx.clone()));
        }
        Group { queue }
    }

    /// Writes `part` in the next batch; answers once it committed.
    pub(super) async fn write(&self, part: W::Part) -> StoreResult<W::Out> {
        let (answer, answered) = oneshot::channel();
        self.queue
            .send(Pending { part, answer })
            .map_err(|_| StoreError::Closed)?;
        answered.await.map_err(|_| StoreError::Closed)?
    }
}

/// Takes whatever queued (up to [`Batch::MAX`] rows) and writes it, until the queue closes.
async fn writer<W: Batch>(pool: Pool, rx: Arc<Mutex<mpsc::UnboundedReceiver<Pending<W>>>>) {
    loop {
        let batch = {
            let mut rx = rx.lock().await;
            let Some(first) = rx.recv().await else {
                return;
            };
            let mut rows = W::rows(&first.part);
            let mut batch = vec![first];
            while rows < W::MAX {
                match rx.try_recv() {
                    Ok(p) => {
                        rows += W::rows(&p.part);
                        batch.push(p);
                    }
                    Err(_) => break,
                }
            }
            batch
        };
        match pool.get().await {
            Ok(client) => W::run(client, batch).await,
            Err(e) => fail_all(batch, &pool_err(e)),
        }
    }
}

/// Answers every caller of `batch` with `e`.
fn fail_all<W: Batch>(batch: impl IntoIterator<Item = Pending<W>>, e: &StoreError) {
    for p in batch {
        let _ = p.answer.send(Err(e.clone()));
    }
}

/// Writes `batch` in one transaction and answers each caller; a refused batch is written again
/// one caller at a time.
async fn write<W: Write>(mut client: Object, batch: Vec<Pending<W>>) {
    if batch.len() > 1 {
        let parts: Vec<&W::Part> = batch.iter().map(|p| &p.part).collect();
        match W::write(&mut client, &parts).await {
            Ok(outs) => {
                for (p, out) in batch.into_iter().zip(outs) {
                    let _ = p.answer.send(Ok(out));
                }
                return;
            }
            // Nothing was written: the database refused the transaction. Find whose part it was.
            Err(e) if refused(&e) => {}
            Err(e) => return fail_all(batch, &e),
        }
    }
    for p in batch {
        let r = W::write(&mut client, &[&p.part]).await;
        let _ = p.answer.send(r.map(|mut outs| outs.remove(0)));
    }
}

/// True when the database itself refused the statement (so nothing of it was written), rather
/// than the connection failing (when a commit may have happened unseen).
fn refused(e: &StoreError) -> bool {
    let (StoreError::Query(_, Some(src)) | StoreError::Constraint(_, Some(src))) = e else {
        return false;
    };
    src.downcast_ref::<tokio_postgres::Error>()
        .is_some_and(|e| e.code().is_some())
}

/// Inserts of rows without a unique key: a caller's rows, which of them its claim takes, and
/// the claim; answered with the caller's rows as inserted.
pub(super) struct Inserts;

impl Write for Inserts {
    type Part = (Vec<InsertRow>, Vec<bool>, Option<InsertClaim>);
    type Out = Vec<Inserted>;

    fn rows(part: &Self::Part) -> usize {
        part.0.len()
    }

    async fn write(client: &mut Object, parts: &[&Self::Part]) -> StoreResult<Vec<Vec<Inserted>>> {
        let rows: Vec<&InsertRow> = parts.iter().flat_map(|p| &p.0).collect();
        let claims: Vec<Option<&InsertClaim>> = parts
            .iter()
            .flat_map(|p| claims_of(&p.1, p.2.as_ref()))
            .collect();
        let mut all = insert_bulk(PgConn::PooledClient(client), &rows, &claims, true).await?;
        let mut outs: Vec<Vec<Inserted>> = parts
            .iter()
            .rev()
            .map(|p| all.split_off(all.len() - p.0.len()))
            .collect();
        outs.reverse();
        Ok(outs)
    }
}

/// Finished attempts: a caller's batch, answered with whether each write applied.
pub(super) struct Finishes;

impl Write for Finishes {
    type Part = Vec<Finish>;
    type Out = Vec<bool>;

    fn rows(part: &Self::Part) -> usize {
        part.len()
    }

    async fn write(client: &mut Object, parts: &[&Self::Part]) -> StoreResult<Vec<Vec<bool>>> {
        let all: Vec<&Finish> = parts.iter().flat_map(|p| p.iter()).collect();
        let mut applied = finish_batch(client, &all).await?.into_iter();
        Ok(parts
            .iter()
            .map(|p| applied.by_ref().take(p.len()).collect())
            .collect())
    }
}

/// Operations written once over a transaction (a component's, the insert flow), which callers
/// asked to share a commit. A batch's operations run at once in one transaction, so their
/// statements travel together on its connection; each caller hears only once that transaction
/// committed. If any of them fails (its own error, a row the database refuses, a lock it waited
/// for longer than [`SHARED_LOCK_TIMEOUT`] allows), the transaction is rolled back and each runs
/// again alone, so the error a caller gets is its own and nothing of a failed operation is
/// written. A panic in one of them fails its whole batch (each caller hears `Closed`).
pub(super) struct Ops;

impl Batch for Ops {
    type Part = SharedTxFn;
    type Out = ();
    const MAX: usize = MAX_OPS;

    fn rows(_: &SharedTxFn) -> usize {
        1
    }

    async fn run(mut client: Object, batch: Vec<Pending<Self>>) {
        // The operations need not be `Send`: run them where they can be driven.
        let _ = off_task(async move |_| {
            let batch: Vec<_> = batch
                .into_iter()
                .filter(|p| !p.answer.is_closed())
                .collect();
            let alone = match batch.len() {
                0 => return Ok(()),
                1 => batch,
                _ => shared(&mut client, batch).await,
            };
            for p in alone {
                let r = run_alone(&mut client, &p.part).await;
                let _ = p.answer.send(r);
            }
            Ok(())
        })
        .await;
    }
}

/// Runs `batch` at once in one transaction and answers every caller once it committed; returns
/// the batch to run again one at a time when anything in it failed.
async fn shared(client: &mut Object, batch: Vec<Pending<Ops>>) -> Vec<Pending<Ops>> {
    let ended = async {
        let tx = client.transaction().await.map_err(pg_error)?;
        tx.batch_execute(SHARED_LOCK_TIMEOUT)
            .await
            .map_err(pg_error)?;
        let all_ran = {
            let any = AnyTx::Postgres(PgTx::pooled(&tx));
            let runs = batch.iter().map(|p| (p.part)(&any));
            futures_util::future::join_all(runs)
                .await
                .iter()
                .all(Result::is_ok)
        };
        if !all_ran {
            tx.rollback().await.map_err(pg_error)?;
            return Ok(false);
        }
        tx.commit().await.map_err(pg_error)?;
        Ok(true)
    }
    .await;
    match ended {
        Ok(true) => {
            for p in batch {
                let _ = p.answer.send(Ok(()));
            }
            Vec::new()
        }
        // Nothing was written.
        Ok(false) => batch,
        Err(e) if refused(&e) => batch,
        Err(e) => {
            fail_all(batch, &e);
            Vec::new()
        }
    }
}

/// Runs one operation in its own transaction.
async fn run_alone(client: &mut Object, op: &SharedTxFn) -> StoreResult<()> {
    let tx = client.transaction().await.map_err(pg_error)?;
    {
        let any = AnyTx::Postgres(PgTx::pooled(&tx));
        op(&any).await?;
    }
    tx.commit().await.map_err(pg_error)
}
