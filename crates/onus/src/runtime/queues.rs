//! Queues as a whole: paused and resumed by hand (every process sharing the database stops
//! claiming from a paused queue), and their figures (jobs per state, the oldest waiting job).
//! Written once on the shared database layer for both backends.

use serde::Serialize;

use crate::clock::Timestamp;
use crate::job::JobState;
use crate::sql::{Backend, FromRow, Row, Sql, Tx};
use crate::store::Db;
use crate::StoreResult;

use super::{Client, Error};

const QUEUES: &str = "onus_queues";

static PAUSE: Sql = Sql::new(
    QUEUES,
    "INSERT INTO onus_queues (name, paused_at, updated_at) VALUES ($1, $2, $2)
     ON CONFLICT (name) DO UPDATE SET paused_at = COALESCE(onus_queues.paused_at, excluded.paused_at),
         updated_at = excluded.updated_at",
);

static RESUME: Sql = Sql::new(
    QUEUES,
    "UPDATE onus_queues SET paused_at = NULL, updated_at = $1 WHERE name = $2 AND paused_at IS NOT NULL",
);

static WAKE: Sql = Sql::new(QUEUES, "SELECT pg_notify('onus_jobs', $1) IS NULL AS woke");

static PAUSED: Sql = Sql::new(
    QUEUES,
    "SELECT name, paused_at FROM onus_queues WHERE paused_at IS NOT NULL ORDER BY name",
);

/// Per queue, the earliest `run_at` of a job waiting now: available, or delayed and due. Read
/// from the claims' partial indexes, so its cost follows the waiting jobs, never the finished ones.
static OLDEST: Sql = Sql::new(
    "onus_live",
    "SELECT queue, MIN(run_at) AS oldest FROM (
         SELECT queue, run_at FROM onus_live WHERE state = 'available'
         UNION ALL
         SELECT queue, run_at FROM onus_live
         WHERE state IN ('scheduled', 'retryable', 'snoozed') AND run_at <= $1) AS w
     GROUP BY queue",
);

/// A paused queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PausedQueue {
    /// Its name.
    pub name: String,
    /// Since when.
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub paused_at: Timestamp,
}

impl FromRow for PausedQueue {
    fn from_row(r: &Row) -> StoreResult<Self> {
        Ok(PausedQueue {
            name: r.get("name")?,
            paused_at: r.get("paused_at")?,
        })
    }
}

struct Oldest {
    queue: String,
    oldest: Timestamp,
}

impl FromRow for Oldest {
    fn from_row(r: &Row) -> StoreResult<Self> {
        Ok(Oldest {
            queue: r.get("queue")?,
            oldest: r.get("oldest")?,
        })
    }
}

/// A queue's figures at one moment.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QueueStats {
    /// The queue.
    pub name: String,
    /// Jobs in each state that has any.
    pub counts: std::collections::BTreeMap<JobState, u64>,
    /// Jobs available now and not yet claimed.
    pub waiting: u64,
    /// How long the oldest of those has been due, in seconds (0 when none waits).
    pub oldest_waiting_seconds: f64,
    /// Paused by hand: no process claims from it until resumed.
    pub paused: bool,
    /// Since when it is paused.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime))]
    pub paused_at: Option<Timestamp>,
}

async fn pause_in<T: Tx + ?Sized>(tx: &T, name: &str, now: Timestamp) -> StoreResult<()> {
    tx.execute(&PAUSE, &[name.into(), now.into()]).await?;
    Ok(())
}

async fn resume_in<T: Tx + ?Sized>(tx: &T, name: &str, now: Timestamp) -> StoreResult<bool> {
    let n = tx.execute(&RESUME, &[now.into(), name.into()]).await?;
    if n > 0 && tx.backend() == Backend::Postgres {
        // Idle workers of every process claim again at once.
        tx.query(&WAKE, &[name.into()]).await?;
    }
    Ok(n > 0)
}

impl Client {
    /// The shared database layer over this client's store.
    pub(crate) fn db(&self) -> Db {
        Db::new(self.shared.store.clone())
    }

    /// Pauses `queue` in every process sharing the database: nothing more is claimed from it
    /// until [`Client::resume_queue`]; running jobs finish. Pausing a paused queue keeps its time.
    pub async fn pause_queue(&self, queue: &str) -> Result<(), Error> {
        super::prepare::check_name("queue", queue)?;
        let now = self.now();
        let name = queue.to_string();
        self.db()
            .tx(move |tx| Box::pin(async move { pause_in(tx, &name, now).await }))
            .await?;
        Ok(())
    }

    /// Resumes a paused queue; false when it was not paused.
    pub async fn resume_queue(&self, queue: &str) -> Result<bool, Error> {
        super::prepare::check_name("queue", queue)?;
        let now = self.now();
        let name = queue.to_string();
        let resumed = self
            .db()
            .tx(move |tx| Box::pin(async move { resume_in(tx, &name, now).await }))
            .await?;
        if resumed {
            self.shared.hub.wake(queue);
        }
        Ok(resumed)
    }

    /// The paused queues.
    pub async fn paused_queues(&self) -> Result<Vec<PausedQueue>, Error> {
        Ok(self.db().read_rows(&PAUSED, Vec::new()).await?)
    }

    /// Every queue that has jobs or is paused, plus `also` (the configured ones), by name.
    pub async fn queue_stats(&self, also: &[String]) -> Result<Vec<QueueStats>, Error> {
        let now = self.now();
        let counts = self.store().counts().await?;
        let oldest: Vec<Oldest> = self.db().read_rows(&OLDEST, vec![now.into()]).await?;
        let paused = self.paused_queues().await?;
        let mut out: std::collections::BTreeMap<String, QueueStats> = Default::default();
        let entry = |out: &mut std::collections::BTreeMap<String, QueueStats>, name: &str| {
            out.entry(name.to_string())
                .or_insert_with(|| QueueStats {
                    name: name.to_string(),
                    counts: Default::default(),
                    waiting: 0,
                    oldest_waiting_seconds: 0.0,
                    paused: false,
                    paused_at: None,
                })
                .name
                .clone()
        };
        for name in also {
            entry(&mut out, name);
        }
        for c in counts {
            let key = entry(&mut out, &c.queue);
            let q = out.get_mut(&key).expect("just inserted");
            *q.counts.entry(c.state).or_default() += c.count;
            // Delayed jobs may not be due yet, so only available jobs count as waiting by number.
            if c.state == JobState::Available {
                q.waiting += c.count;
            }
        }
        for o in oldest {
            let key = entry(&mut out, &o.queue);
            let q = out.get_mut(&key).expect("just inserted");
            let age = (now - o.oldest).num_microseconds().unwrap_or(0).max(0) as f64 / 1e6;
            q.oldest_waiting_seconds = q.oldest_waiting_seconds.max(age);
        }
        for p in paused {
            let key = entry(&mut out, &p.name);
            let q = out.get_mut(&key).expect("just inserted");
            q.paused = true;
            q.paused_at = Some(p.paused_at);
        }
        Ok(out.into_values().collect())
    }
}
