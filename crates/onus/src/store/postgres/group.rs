//! Group commit of inserts: concurrent inserts of rows without a unique key (an API's single
//! inserts, a busy client's) share one statement and so one commit. A short queue sits in front
//! of a few writers; each writer takes everything that queued while the previous statement ran,
//! writes it as one `unnest` insert, and answers each caller with its own rows only after that
//! statement committed. A batch the database refuses (a row breaking a rule of the schema) is
//! written again one caller at a time, so only the caller whose row is bad gets the error.
//!
//! SQLite needs none of this: its single writer already commits whatever queued up together.

use std::sync::Arc;

use deadpool_postgres::Pool;
use tokio::sync::{mpsc, oneshot, Mutex};

use super::{claims_of, insert_bulk, pool_err};
use crate::sql::PgConn;
use crate::store::{InsertClaim, InsertRow, Inserted, StoreError, StoreResult};

/// Writers working at once: while one statement commits, the next batch gathers and another
/// writer can send it (PostgreSQL flushes concurrent commits together).
const WRITERS: usize = 2;

/// An insert of this many rows or more is written on its own: it fills a statement by itself.
pub(super) const ALONE_FROM: usize = 64;

/// At most this many rows in one statement.
const MAX_ROWS: usize = 4096;

/// One caller's insert, waiting for its commit.
struct Pending {
    rows: Vec<InsertRow>,
    /// Which rows the insert claims, under its caller's claim.
    take: Vec<bool>,
    claim: Option<InsertClaim>,
    answer: oneshot::Sender<StoreResult<Vec<Inserted>>>,
}

/// The queue in front of the insert writers.
#[derive(Debug)]
pub(super) struct InsertQueue {
    queue: mpsc::UnboundedSender<Pending>,
}

impl InsertQueue {
    /// Starts the writers, which end when the queue is dropped.
    pub(super) fn start(pool: Pool) -> Self {
        let (queue, rx) = mpsc::unbounded_channel();
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..WRITERS {
            tokio::spawn(writer(pool.clone(), rx.clone()));
        }
        InsertQueue { queue }
    }

    /// Inserts `rows` (none with a unique key) in the next batch; answers once it committed.
    pub(super) async fn insert(
        &self,
        rows: Vec<InsertRow>,
        take: Vec<bool>,
        claim: Option<InsertClaim>,
    ) -> StoreResult<Vec<Inserted>> {
        let (answer, answered) = oneshot::channel();
        let pending = Pending {
            rows,
            take,
            claim,
            answer,
        };
        self.queue.send(pending).map_err(|_| StoreError::Closed)?;
        answered.await.map_err(|_| StoreError::Closed)?
    }
}

/// Takes whatever queued (up to [`MAX_ROWS`] rows) and writes it, until the queue closes.
async fn writer(pool: Pool, rx: Arc<Mutex<mpsc::UnboundedReceiver<Pending>>>) {
    loop {
        let batch = {
            let mut rx = rx.lock().await;
            let Some(first) = rx.recv().await else {
                return;
            };
            let mut rows = first.rows.len();
            let mut batch = vec![first];
            while rows < MAX_ROWS {
                match rx.try_recv() {
                    Ok(p) => {
                        rows += p.rows.len();
                        batch.push(p);
                    }
                    Err(_) => break,
                }
            }
            batch
        };
        write(&pool, batch).await;
    }
}

/// Writes `batch` in one statement and answers each caller; a refused batch is written again one
/// caller at a time.
async fn write(pool: &Pool, batch: Vec<Pending>) {
    let client = match pool.get().await {
        Ok(c) => c,
        Err(e) => {
            let e = pool_err(e);
            for p in batch {
                let _ = p.answer.send(Err(e.clone()));
            }
            return;
        }
    };
    let conn = PgConn::PooledClient(&client);
    if batch.len() > 1 {
        let rows: Vec<&InsertRow> = batch.iter().flat_map(|p| &p.rows).collect();
        let claims: Vec<Option<&InsertClaim>> = batch
            .iter()
            .flat_map(|p| claims_of(&p.take, p.claim.as_ref()))
            .collect();
        match insert_bulk(conn, &rows, &claims, true).await {
            Ok(mut all) => {
                for p in batch.into_iter().rev() {
                    let own = all.split_off(all.len() - p.rows.len());
                    let _ = p.answer.send(Ok(own));
                }
                return;
            }
            // Nothing was written: the database refused the statement. Find whose row it was.
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
        let rows: Vec<&InsertRow> = p.rows.iter().collect();
        let claims = claims_of(&p.take, p.claim.as_ref());
        let r = insert_bulk(conn, &rows, &claims, true).await;
        let _ = p.answer.send(r);
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
