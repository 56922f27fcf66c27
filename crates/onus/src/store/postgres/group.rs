//! Group commit: concurrent callers' small writes (an API's single inserts, pull workers' single
//! answers, a busy client's) share one transaction and so one commit. A short queue sits in front
//! of a few writers; each writer takes everything that queued while the previous transaction ran,
//! writes it at once, and answers each caller with its own part only after that commit. A batch
//! the database refuses (a row breaking a rule of the schema) is written again one caller at a
//! time, so only the caller whose part is bad gets the error.
//!
//! Three writes go through it: inserts of rows without a unique key ([`Inserts`]), finished
//! attempts ([`Finishes`]), and operations written over a transaction that callers ask to share a
//! commit ([`Ops`]: an event's publish, inserts with unique keys), each in its own savepoint. SQLite
//! needs none of this: its single writer already commits whatever queued up together, each write
//! in its own savepoint.

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

/// At most this many operations share one transaction: each has a savepoint, and PostgreSQL keeps
/// up to 64 of a transaction's subtransactions in shared memory before every snapshot has to look
/// them up on disk.
const MAX_OPS: usize = 48;

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
    /// Writes `batch` and answers each caller.
    fn run(pool: &Pool, batch: Vec<Pending<Self>>) -> impl Future<Output = ()> + Send;
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

    fn run(pool: &Pool, batch: Vec<Pending<Self>>) -> impl Future<Output = ()> + Send {
        write::<W>(pool, batch)
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
        W::run(&pool, batch).await;
    }
}

/// Writes `batch` in one transaction and answers each caller; a refused batch is written again
/// one caller at a time.
async fn write<W: Write>(pool: &Pool, batch: Vec<Pending<W>>) {
    let mut client = match pool.get().await {
        Ok(c) => c,
        Err(e) => {
            let e = pool_err(e);
            for p in batch {
                let _ = p.answer.send(Err(e.clone()));
            }
            return;
        }
    };
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
            Err(e) => {
                for p in batch {
                    let _ = p.answer.send(Err(e.clone()));
                }
                return;
            }
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
/// asked to share a commit: each runs in its own savepoint, so one that fails undoes only its own
/// writes, and its caller hears only once the transaction holding its work committed. One that
/// fails among others runs again alone (it may have failed because of its neighbours: a lock
/// another batch held in the other order), so the error its caller gets is its own.
pub(super) struct Ops;

impl Batch for Ops {
    type Part = SharedTxFn;
    type Out = ();
    const MAX: usize = MAX_OPS;

    fn rows(_: &SharedTxFn) -> usize {
        1
    }

    async fn run(pool: &Pool, batch: Vec<Pending<Self>>) {
        let mut client = match pool.get().await {
            Ok(c) => c,
            Err(e) => {
                let e = pool_err(e);
                for p in batch {
                    let _ = p.answer.send(Err(e.clone()));
                }
                return;
            }
        };
        // The operations need not be `Send`: run them where they can be driven.
        let _ = off_task(async move |_| {
            let alone = if batch.len() > 1 {
                shared(&mut client, batch).await
            } else {
                batch
            };
            for mut p in alone {
                let r = run_alone(&mut client, &mut p).await;
                let _ = p.answer.send(r);
            }
            Ok(())
        })
        .await;
    }
}

/// Runs `batch` in one transaction, one savepoint each, and answers those that committed or
/// could not; returns those to run again alone.
async fn shared(client: &mut Object, batch: Vec<Pending<Ops>>) -> Vec<Pending<Ops>> {
    let mut done = Vec::new();
    let mut again = Vec::new();
    let mut unrun = Vec::new();
    let mut failed = None;
    match client.transaction().await {
        Err(e) => {
            failed = Some(pg_error(e));
            unrun = batch;
        }
        Ok(mut tx) => {
            let mut pending = batch.into_iter();
            while let Some(mut p) = pending.next() {
                if p.answer.is_closed() {
                    continue; // its caller gave up
                }
                match in_savepoint(&mut tx, &mut p).await {
                    Ok(true) => done.push(p),
                    Ok(false) => again.push(p),
                    Err(e) => {
                        failed = Some(e);
                        unrun.push(p);
                        unrun.extend(pending);
                        break;
                    }
                }
            }
            if failed.is_none() {
                failed = tx.commit().await.map_err(pg_error).err();
            }
        }
    }
    match failed {
        None => {
            for p in done {
                let _ = p.answer.send(Ok(()));
            }
        }
        // Nothing was written: run each again alone.
        Some(e) if refused(&e) => again.extend(done.into_iter().chain(unrun)),
        Some(e) => {
            for p in done.into_iter().chain(unrun).chain(again.drain(..)) {
                let _ = p.answer.send(Err(e.clone()));
            }
        }
    }
    again
}

/// Runs one operation of a shared transaction in its own savepoint: true when it succeeded,
/// false when it failed and its writes were undone; an error when the transaction itself failed.
async fn in_savepoint(
    tx: &mut deadpool_postgres::Transaction<'_>,
    p: &mut Pending<Ops>,
) -> StoreResult<bool> {
    let sp = tx.savepoint("onus_op").await.map_err(pg_error)?;
    let r = {
        let any = AnyTx::Postgres(PgTx::pooled(&sp));
        tokio::select! {
            r = (p.part)(&any) => r,
            () = p.answer.closed() => Err(StoreError::Aborted),
        }
    };
    match r {
        Ok(()) => sp.commit().await.map(|()| true),
        Err(_) => sp.rollback().await.map(|()| false),
    }
    .map_err(pg_error)
}

/// Runs one operation in its own transaction.
async fn run_alone(client: &mut Object, p: &mut Pending<Ops>) -> StoreResult<()> {
    let tx = client.transaction().await.map_err(pg_error)?;
    {
        let any = AnyTx::Postgres(PgTx::pooled(&tx));
        tokio::select! {
            r = (p.part)(&any) => r?,
            () = p.answer.closed() => return Err(StoreError::Aborted),
        }
    }
    tx.commit().await.map_err(pg_error)
}
