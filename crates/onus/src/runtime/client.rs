//! The client: insert jobs (one, many, or inside the caller's transaction), look them up, and
//! retry or cancel them by hand, singly or in bulk.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::{self, Timestamp};
use crate::job::{Job, JobId, JobState, NewJob};
use crate::store::{
    pick_retries, CancelOutcome, InsertClaim, InsertRow, Inserted, JobFilter, JobTx, RetriedKeys,
    RetryOutcome, Store, StoreError, CANCELLABLE_STATES, DELETABLE_STATES, RETRYABLE_STATES,
};

use super::Shared;

/// What went wrong in a client call.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed; the message says what to fix.
    #[error("{0}")]
    Invalid(String),
    /// The store failed or refused.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A wait ran out of time.
    #[error("{0}")]
    Timeout(String),
    /// What the call names does not exist; the message says what does.
    #[error("{0}")]
    NotFound(String),
}

impl Error {
    /// Whose fault it is (see [`crate::Fault`]).
    pub fn fault(&self) -> crate::Fault {
        match self {
            Error::Invalid(_) | Error::NotFound(_) => crate::Fault::Caller,
            Error::Store(e) => e.fault(),
            Error::Timeout(_) => crate::Fault::Service,
        }
    }
}

/// Inserts and manages jobs. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Client {
    pub(crate) shared: Arc<Shared>,
}

/// The shortest pause of a key an operator may ask for.
pub const MIN_PAUSE: Duration = Duration::from_secs(1);

/// The most jobs one statement of a bulk retry or cancel touches; a bulk action over more runs
/// as several, so the database (on SQLite, its one writer) is never held for long.
pub const BULK_CHUNK: usize = 1000;

/// Walks the jobs a bulk action applies to, newest first, a chunk at a time.
struct Pages {
    /// The filter, narrowed to the states the action applies to, without its limit.
    listing: JobFilter,
    /// How many more the filter's limit allows.
    left: usize,
    before: Option<JobId>,
}

impl Pages {
    fn new(filter: &JobFilter, applies_to: &[JobState]) -> Self {
        let states = if filter.states.is_empty() {
            applies_to.to_vec()
        } else {
            filter
                .states
                .iter()
                .filter(|s| applies_to.contains(s))
                .copied()
                .collect()
        };
        Pages {
            left: filter.limit.unwrap_or(usize::MAX),
            listing: JobFilter {
                states,
                limit: None,
                ..filter.clone()
            },
            before: None,
        }
    }

    async fn next(&mut self, store: &Arc<dyn Store>) -> Result<Option<Vec<Job>>, Error> {
        if self.left == 0 || self.listing.states.is_empty() {
            return Ok(None);
        }
        let page = store
            .list(&self.listing, BULK_CHUNK.min(self.left), self.before)
            .await?;
        let Some(last) = page.last() else {
            return Ok(None);
        };
        self.before = Some(last.id);
        self.left -= page.len();
        Ok(Some(page))
    }

    /// The filter for one chunk: these jobs, still in the states the action applies to.
    fn chunk(&self, ids: Vec<JobId>) -> JobFilter {
        JobFilter {
            limit: Some(ids.len()),
            ids,
            states: self.listing.states.clone(),
            ..JobFilter::default()
        }
    }
}

/// What one insert was offered at an idle queue's door (its [`super::producer::Intake`]): the
/// door, and the free run slots the insert may start its jobs in.
struct Offer {
    intake: Option<Arc<super::producer::Intake>>,
    permits: Vec<tokio::sync::OwnedSemaphorePermit>,
}

impl Client {
    /// The kind `name` as this runtime knows it (its policy, queue and limits).
    pub fn kind(&self, name: &str) -> Option<&super::Kind> {
        self.shared.kinds.get(name)
    }
}

impl Client {
    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.shared.store
    }

    /// The job layer's current time.
    pub fn now(&self) -> Timestamp {
        self.shared.clock.now()
    }

    /// Resolves a new job's defaults (queue and attempts from its kind's policy, the run time from
    /// this client's clock) into the row a store writes, for [`crate::store::JobTx::insert_job`].
    pub fn prepare(&self, job: NewJob) -> Result<InsertRow, Error> {
        super::prepare::prepare_with(&self.shared, job)
    }

    /// Inserts one job inside the caller's own open transaction (an [`crate::sql::SqliteTx`] or
    /// [`crate::sql::PgTx`]): it commits with the caller's writes or not at all (the outbox). On
    /// SQLite, from synchronous code, wrap the call in [`crate::sql::ready`], and call
    /// [`Client::notify_inserted`] after the commit; on PostgreSQL workers are notified by the
    /// commit.
    ///
    /// ```no_run
    /// # async fn demo(client: &onus::Client, db: &mut onus::postgres::tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// let tx = db.transaction().await?;
    /// tx.execute("INSERT INTO orders (id, total) VALUES ($1, $2)", &[&42i64, &1999i64]).await?;
    /// let job = onus::NewJob::new("receipt.send", serde_json::json!({"order": 42}));
    /// client.insert_in(&onus::sql::PgTx::new(&tx), job).await?;
    /// tx.commit().await?; // the order and its job, or neither
    /// # Ok(()) }
    /// ```
    pub async fn insert_in<T: crate::sql::Tx + ?Sized>(
        &self,
        tx: &T,
        job: NewJob,
    ) -> Result<Inserted, Error> {
        let row = self.prepare(job)?;
        Ok(tx.insert_job(row).await?)
    }

    /// Inserts one job; durable once this returns.
    pub async fn insert(&self, job: NewJob) -> Result<Inserted, Error> {
        let mut v = self.insert_many(vec![job]).await?;
        v.pop()
            .ok_or_else(|| Error::Invalid("nothing was inserted".into()))
    }

    /// Inserts many jobs in one transaction: all or none.
    pub async fn insert_many(&self, jobs: Vec<NewJob>) -> Result<Vec<Inserted>, Error> {
        let rows = jobs
            .into_iter()
            .map(|j| self.prepare(j))
            .collect::<Result<Vec<_>, _>>()?;
        self.insert_prepared(rows).await
    }

    /// Inserts jobs already prepared with [`Client::prepare`] (which checked them) in one
    /// transaction: all or none. For a caller that prepares each job where it can say which one
    /// was refused (the HTTP API names the field), so nothing is prepared twice.
    pub async fn insert_prepared(&self, rows: Vec<InsertRow>) -> Result<Vec<Inserted>, Error> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let out = self.insert_rows(rows).await?;
        let mut woken = std::collections::HashSet::new();
        for i in &out {
            if i.inserted && i.job.state == JobState::Available && woken.insert(i.job.queue.clone())
            {
                self.shared.hub.wake(&i.job.queue);
            }
        }
        Ok(out)
    }

    /// Inserts `rows`. Those due now, of a kind this process runs, whose queue's worker here is
    /// idle, are claimed by the insert itself (one commit for both) and start at once, each in a
    /// free slot of its queue.
    async fn insert_rows(&self, rows: Vec<InsertRow>) -> Result<Vec<Inserted>, Error> {
        let shared = &self.shared;
        let mut take = vec![false; rows.len()];
        let mut doors: std::collections::HashMap<String, Offer> = std::collections::HashMap::new();
        // Not before this process has read its clock against the database's.
        if shared.skew.tried() && super::skew::Skew::within_bound(shared) {
            for (i, r) in rows.iter().enumerate() {
                // Not a kind capped across processes: only a claim counts what runs elsewhere.
                if r.state != JobState::Available
                    || r.unique_key.is_some()
                    || !shared.runs(&r.kind)
                    || shared
                        .kinds
                        .get(&r.kind)
                        .is_some_and(|k| k.max_running.is_some())
                {
                    continue;
                }
                let offer = doors.entry(r.queue.clone()).or_insert_with(|| Offer {
                    intake: shared.intakes.get(&r.queue),
                    permits: Vec::new(),
                });
                if let Some(p) = offer.intake.as_ref().and_then(|d| d.offer()) {
                    offer.permits.push(p);
                    take[i] = true;
                }
            }
        }
        if !take.contains(&true) {
            return Ok(shared.store.insert(rows).await?);
        }
        let started = std::time::Instant::now();
        let now = shared.clock.now();
        let claim = InsertClaim {
            owner: shared.owner.clone(),
            now,
            lease_until: clock::add(now, shared.options.lease_ttl),
            take,
        };
        let out = shared.store.insert_claiming(rows, claim).await?;
        for (queue, offer) in doors {
            let Some(intake) = offer.intake else { continue };
            let jobs: Vec<Job> = out
                .iter()
                .filter(|i| {
                    i.inserted
                        && i.job.queue == queue
                        && i.job.state == JobState::Running
                        && i.job.lease_owner.as_deref() == Some(shared.owner.as_str())
                })
                .map(|i| i.job.clone())
                .collect();
            intake.deliver(shared, &queue, jobs, offer.permits, started);
        }
        Ok(out)
    }

    /// Tells this process's workers that jobs were inserted elsewhere (for example with
    /// [`Client::insert_in`] on SQLite, after the caller's commit), so they need not wait for a poll.
    pub fn notify_inserted(&self, queue: &str) {
        self.shared.hub.wake(queue);
    }

    /// One job.
    pub async fn get(&self, id: JobId) -> Result<Job, Error> {
        self.shared
            .store
            .get(id)
            .await?
            .ok_or(Error::Store(StoreError::NotFound(id)))
    }

    /// Jobs matching `filter`, newest first; pass the last id seen as `before` for the next page.
    pub async fn list(
        &self,
        filter: &JobFilter,
        limit: usize,
        before: Option<JobId>,
    ) -> Result<Vec<Job>, Error> {
        Ok(self
            .shared
            .store
            .list(filter, limit.clamp(1, 10_000), before)
            .await?)
    }

    /// Runs a discarded, cancelled or retryable job now, with one more attempt if it needs one.
    pub async fn retry(&self, id: JobId) -> Result<Job, Error> {
        self.retry_where(&JobFilter::id(id)).await?;
        self.get(id).await
    }

    /// Manual retry of every job matching `filter` (not just one page), in chunks of
    /// [`BULK_CHUNK`] jobs so the database is never held by one long statement. Of the jobs
    /// sharing a kind and unique key only the newest is retried; the others are refused, with why.
    pub async fn retry_where(&self, filter: &JobFilter) -> Result<RetryOutcome, Error> {
        if crate::store::single_id(filter).is_some() {
            let out = self.shared.store.retry(filter, self.now()).await?;
            if !out.retried.is_empty() {
                self.shared.hub.wake_all();
            }
            return Ok(out);
        }
        let mut out = RetryOutcome::default();
        // One newest job per kind and unique key across every chunk.
        let mut keys = RetriedKeys::new();
        let mut pages = Pages::new(filter, &RETRYABLE_STATES);
        while let Some(page) = pages.next(&self.shared.store).await? {
            let candidates: Vec<_> = page
                .into_iter()
                .map(|j| (j.id, j.kind, j.unique_key))
                .collect();
            let (ids, refused) = pick_retries(&candidates, &mut keys);
            out.refused.extend(refused);
            if ids.is_empty() {
                continue;
            }
            let r = self
                .shared
                .store
                .retry(&pages.chunk(ids), self.now())
                .await?;
            if !r.retried.is_empty() {
                self.shared.hub.wake_all();
            }
            out.retried.extend(r.retried);
            out.refused.extend(r.refused);
        }
        Ok(out)
    }

    /// Cancels a job: a waiting one at once, a running one by a signal its handler can observe.
    pub async fn cancel(&self, id: JobId) -> Result<CancelOutcome, Error> {
        self.cancel_where(&JobFilter::id(id)).await
    }

    /// Cancels every job matching `filter`, in chunks of [`BULK_CHUNK`] jobs.
    pub async fn cancel_where(&self, filter: &JobFilter) -> Result<CancelOutcome, Error> {
        if crate::store::single_id(filter).is_some() {
            let out = self.shared.store.cancel(filter, self.now()).await?;
            self.signal_cancels(&out).await;
            return Ok(out);
        }
        let mut out = CancelOutcome::default();
        let mut pages = Pages::new(filter, &CANCELLABLE_STATES);
        while let Some(page) = pages.next(&self.shared.store).await? {
            let ids = page.iter().map(|j| j.id).collect();
            let r = self
                .shared
                .store
                .cancel(&pages.chunk(ids), self.now())
                .await?;
            self.signal_cancels(&r).await;
            out.cancelled.extend(r.cancelled);
            out.requested.extend(r.requested);
        }
        Ok(out)
    }

    /// Deletes a finished job (completed, discarded or cancelled); an unfinished one is refused
    /// with [`StoreError::Conflict`] (cancel it first).
    pub async fn delete(&self, id: JobId) -> Result<(), Error> {
        self.shared.store.delete(&JobFilter::id(id)).await?;
        Ok(())
    }

    /// Deletes every finished job matching `filter` (not just one page), in chunks of
    /// [`BULK_CHUNK`]; unfinished matches are left alone. Returns the ids deleted.
    pub async fn delete_where(&self, filter: &JobFilter) -> Result<Vec<JobId>, Error> {
        if crate::store::single_id(filter).is_some() {
            return Ok(self.shared.store.delete(filter).await?);
        }
        let mut out = Vec::new();
        let mut pages = Pages::new(filter, &DELETABLE_STATES);
        while let Some(page) = pages.next(&self.shared.store).await? {
            let ids = page.iter().map(|j| j.id).collect();
            out.extend(self.shared.store.delete(&pages.chunk(ids)).await?);
        }
        Ok(out)
    }

    /// How many jobs match `filter`.
    pub async fn count(&self, filter: &JobFilter) -> Result<u64, Error> {
        Ok(self.shared.store.count(filter).await?)
    }

    /// Pauses lease key `key` until `until` (replacing a pause already in force): every waiting
    /// job holding the key is held until then without being claimed, spending no attempt and
    /// writing nothing to its history. Returns the pause as written, with how many jobs it
    /// holds. A pause lasts at least [`MIN_PAUSE`]. A job's handler asks for the same with
    /// [`crate::JobError::pausing_key`].
    pub async fn pause_key(
        &self,
        key: &str,
        until: Timestamp,
        reason: &str,
    ) -> Result<crate::store::PausedKey, Error> {
        super::prepare::check_name("key", key)?;
        if key.is_empty() {
            return Err(Error::Invalid("the key to pause is empty".into()));
        }
        let now = self.now();
        let until = clock::trunc(until);
        // Measured from when the caller asked, a moment ago: a quarter second of slack.
        if until < clock::add(now, MIN_PAUSE - Duration::from_millis(250)) {
            return Err(Error::Invalid(format!(
                "a pause lasts at least {} s (it would end {}, now is {}); to end a pause, resume the key",
                MIN_PAUSE.as_secs(),
                until,
                clock::trunc(now)
            )));
        }
        let reason = if reason.trim().is_empty() {
            "paused by hand".to_string()
        } else {
            crate::job::clean_message(reason)
        };
        let held = self
            .shared
            .store
            .pause_key(key, until, now, &reason, crate::store::PauseMode::Replace)
            .await?;
        Ok(crate::store::PausedKey {
            key: key.to_string(),
            until,
            paused_at: clock::trunc(now),
            reason,
            held,
        })
    }

    /// Ends `key`'s pause now: the jobs it held are due at once. Returns how many it released,
    /// or `None` when the key was not paused.
    pub async fn resume_key(&self, key: &str) -> Result<Option<u64>, Error> {
        let out = self.shared.store.resume_key(key, self.now()).await?;
        if out.is_some_and(|n| n > 0) {
            self.shared.hub.wake_all();
        }
        Ok(out)
    }

    /// The keys paused now, with how many jobs each holds.
    pub async fn paused_keys(&self) -> Result<Vec<crate::store::PausedKey>, Error> {
        Ok(self.shared.store.paused_keys(self.now()).await?)
    }

    /// The periodic schedule `name` this process defines, or an error naming the ones it does.
    fn periodic(&self, name: &str) -> Result<&super::Periodic, Error> {
        let all = &self.shared.periodics;
        all.iter().find(|p| p.name == name).ok_or_else(|| {
            Error::NotFound(format!(
                "no periodic schedule {name:?}; the schedules are: {}",
                all.iter()
                    .map(|p| p.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
    }

    /// Pauses periodic schedule `name` in every process: it enqueues nothing until resumed
    /// (jobs already enqueued run).
    pub async fn pause_periodic(&self, name: &str) -> Result<(), Error> {
        self.periodic(name)?;
        self.shared
            .store
            .pause_periodic(name, Some(self.now()), None)
            .await?;
        Ok(())
    }

    /// Resumes periodic schedule `name`: it goes on from its next period after now (the periods
    /// that came due while it was paused are not run).
    pub async fn resume_periodic(&self, name: &str) -> Result<(), Error> {
        let next = self.periodic(name)?.schedule.next_after(self.now());
        self.shared
            .store
            .pause_periodic(name, None, Some(next))
            .await?;
        Ok(())
    }

    /// Enqueues schedule `name`'s job now, once, besides its periods (paused or not); its outcome
    /// is recorded on the schedule like a period's.
    pub async fn run_periodic(&self, name: &str) -> Result<Job, Error> {
        let p = self.periodic(name)?;
        let job = p
            .job
            .clone()
            .unique_key(super::periodic_unique_key(&p.name, self.now()));
        Ok(self.insert(job).await?.job)
    }

    /// Tells the running jobs asked to cancel: a handler here through its context; an outside
    /// worker by its next heartbeat, its lease cut to end `cancel_grace` from now (renewals never
    /// extend it again), after which a rescuer ends the job `cancelled`, heartbeat or not.
    async fn signal_cancels(&self, out: &CancelOutcome) {
        for id in &out.requested {
            self.shared.hub.cancel_running(*id);
        }
        let until = clock::add(self.now(), self.shared.options.cancel_grace);
        for id in &out.requested {
            let Ok(Some(job)) = self.shared.store.get(*id).await else {
                continue;
            };
            let pulled = job
                .lease_owner
                .as_deref()
                .filter(|o| o.starts_with(super::pull::OWNER_PREFIX));
            if let (Some(owner), Some(lapses)) = (pulled, job.lease_expires_at) {
                if lapses > until {
                    let held = [crate::store::HeldJob {
                        id: job.id,
                        attempt: job.attempt,
                    }];
                    if let Err(e) = self.shared.store.heartbeat(owner, &held, until).await {
                        tracing::warn!(job = job.id, error = %e, "cannot cut the lease of a pulled job asked to cancel; it ends when its lease does");
                    }
                }
            }
        }
    }

    /// Polls job `id` until `done` holds or `timeout` passes (for tests and tools).
    pub async fn wait_for(
        &self,
        id: JobId,
        done: impl Fn(&Job) -> bool,
        timeout: Duration,
    ) -> Result<Job, Error> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let job = self.get(id).await?;
            if done(&job) {
                return Ok(job);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::Timeout(format!(
                    "job {id} did not reach the awaited condition within {}; it is {} (attempt {}/{})",
                    crate::policy::human(timeout),
                    job.state,
                    job.attempt,
                    job.max_attempts
                )));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}
