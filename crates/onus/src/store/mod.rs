//! Storage: one [`Store`] trait, implemented by SQLite (the embedded default) and PostgreSQL (to
//! scale out across machines).
//!
//! A store persists and queries; it never decides. Every instant it writes comes from the caller
//! (the runtime's [`Clock`](crate::Clock)), never from the database's own `now()`, and every state
//! change after an attempt arrives as a ready-made [`Transition`] computed by the job layer.
//! Writes after an attempt are guarded by the lease (`owner` and `attempt`), so a late answer from a
//! process that lost its job can never overwrite newer state.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use crate::clock::Timestamp;
use crate::job::{Job, JobId};
use crate::sql::migrate::Applied;
use crate::sql::{Line, LineStatus};

/// Runs a flow written once over [`Tx`](crate::sql::Tx) on `$store`: `write` in one
/// transaction, `read` on a read connection. On PostgreSQL it runs on the caller's task over a
/// pooled connection; on SQLite in the writer thread (writes) or a reader.
macro_rules! flow {
    ($store:expr, $mode:ident, |$tx:ident| $body:expr) => {
        match $store.as_any().downcast_ref::<postgres::PostgresStore>() {
            Some(pg) => pg.$mode(async move |$tx| $body.await).await,
            None => db::$mode($store, move |$tx| Box::pin(async move { $body.await })).await,
        }
    };
}

/// Every column of a job, in the order claims return them.
macro_rules! job_cols {
    () => {
        "id, kind, queue, args, priority, state, attempt, max_attempts, run_at, created_at, \
         attempted_at, finalized_at, errors, snoozes, discard_reason, unique_key, lease_key, \
         lease_owner, lease_expires_at, cancel_requested, tags, progress, result"
    };
}

pub(crate) mod attempts;
pub(crate) mod claim;
pub(crate) mod counts;
pub(crate) mod db;
pub(crate) mod finish;
pub(crate) mod insert;
pub(crate) mod keys;
pub(crate) mod maintenance;
pub(crate) mod manage;
pub(crate) mod periodic;
pub(crate) mod postgres;
mod rows;
pub(crate) mod sqlite;

pub use db::{with_jobs, Db, JobTx, JOBS};
pub(crate) use manage::{pick_retries, single_id, RetriedKeys};

pub use crate::sql::error::{Fault, StoreError, StoreResult};
pub(crate) use rows::taken;
pub use rows::*;

/// The storage interface. Every backend passes the same conformance tests.
#[async_trait]
pub trait Store: Send + Sync + fmt::Debug + 'static {
    /// The backend's name (`sqlite`, `postgres`).
    fn backend(&self) -> &'static str;

    /// Whether a job completed in its handler's own transaction hands its lease key's slot
    /// straight to the key's next job of the same queue and kind, claimed in that commit for the
    /// same process (see `keys::release`), rather than releasing it and waking that job for a
    /// claim. SQLite does: its one writer makes the hand-over one more statement in a batch, and
    /// webhook delivery runs about a sixth faster. PostgreSQL does not: there it made a burst of
    /// deliveries faster but let one dead endpoint slow its healthy neighbours' deliveries by
    /// up to a quarter and double their latency (docs/benchmarks.md, issue 26's third round).
    fn hands_on_lease_slots(&self) -> bool {
        false
    }

    /// Whether the database answers and can take writes: `/healthz` asks this. By default a read
    /// of one row.
    async fn health(&self) -> StoreResult<()> {
        self.get(0).await.map(|_| ())
    }

    /// Told by a process's job layer each time it holds no job any more: every job it claimed has
    /// its outcome written. A hint, answered at once: PostgreSQL vacuums its table of unfinished
    /// jobs then if enough of them ended since its last pass (see `postgres::vacuum`).
    fn idle(&self) {}

    /// The concrete store, for backend-specific tests and tools. Components reach the database
    /// through [`crate::store::Db`] instead.
    fn as_any(&self) -> &dyn std::any::Any;

    /// Runs a component's operation in one transaction: on SQLite in the single writer (batched
    /// with job writes), on PostgreSQL on a pooled connection. Committed when it returns `Ok`.
    async fn transaction(&self, op: crate::sql::TxFn) -> StoreResult<()>;

    /// Runs a component's operation in a transaction it may share with other callers' (answered
    /// once the shared commit is done; see [`crate::store::Db::tx_shared`]). SQLite's single
    /// writer already shares its transactions, so by default this is [`Store::transaction`].
    async fn transaction_shared(&self, op: crate::sql::SharedTxFn) -> StoreResult<()> {
        self.transaction(Box::new(move |tx| op(tx))).await
    }

    /// Runs a component's read-only operation on a read connection.
    async fn read_only(&self, op: crate::sql::TxFn) -> StoreResult<()>;

    /// Applies the pending migrations of `lines` (the job layer's line always first) under one
    /// lock, recording each in `onus_migrations`; returns what it applied.
    async fn migrate(&self, lines: &[&'static Line]) -> StoreResult<Vec<Applied>> {
        let lines = with_jobs(lines);
        flow!(self, write, |tx| crate::sql::migrate::apply(tx, &lines))
    }

    /// Where each of `lines` (and the job layer's) stands in this database.
    async fn migrations(&self, lines: &[&'static Line]) -> StoreResult<Vec<LineStatus>> {
        let lines = with_jobs(lines);
        flow!(self, read, |tx| crate::sql::migrate::status(tx, &lines))
    }

    /// Inserts jobs in one transaction, in order.
    async fn insert(&self, rows: Vec<InsertRow>) -> StoreResult<Vec<Inserted>> {
        flow!(self, write, |tx| insert::insert(tx, rows, None))
    }

    /// Inserts jobs as [`Store::insert`] does, claiming some in the same transaction as `claim`
    /// says; the answer shows which (`running`, leased to the claim's owner). A store that does
    /// not say otherwise (a wrapper) claims none.
    async fn insert_claiming(
        &self,
        rows: Vec<InsertRow>,
        claim: InsertClaim,
    ) -> StoreResult<Vec<Inserted>> {
        let _ = claim;
        self.insert(rows).await
    }

    /// Claims up to `limit` due jobs: `state = running`, `attempt + 1`, leased to `owner`.
    async fn claim(&self, req: ClaimRequest) -> StoreResult<Vec<Job>>;

    /// Records finished attempts; for each, whether the guarded write applied.
    async fn finish(&self, batch: &[Finish]) -> StoreResult<Vec<bool>> {
        let batch = batch.to_vec(); // SQLite's writer thread takes its own
        flow!(self, write, |tx| finish::all(tx, &batch))
    }

    /// Extends to `lease_until` the leases of the jobs `owner` holds (and their lease-key slots):
    /// only those listed, so a row the process lost track of is never renewed and its lease runs
    /// out. Says which of them were renewed, which are no longer `owner`'s, and which were asked
    /// to cancel.
    async fn heartbeat(
        &self,
        owner: &str,
        held: &[HeldJob],
        lease_until: Timestamp,
    ) -> StoreResult<Renewal>;

    /// One job.
    async fn get(&self, id: JobId) -> StoreResult<Option<Job>> {
        flow!(self, read, |tx| manage::get(tx, id))
    }

    /// Jobs matching `filter`, newest first, with ids below `before` when given.
    async fn list(
        &self,
        filter: &JobFilter,
        limit: usize,
        before: Option<JobId>,
    ) -> StoreResult<Vec<Job>> {
        let filter = filter.clone();
        flow!(self, read, |tx| manage::list(tx, &filter, limit, before))
    }

    /// Manual retry of every matching discarded, cancelled, retryable, scheduled or snoozed job:
    /// due now, with one more attempt allowed if needed. Of the jobs sharing a kind and unique key
    /// only the newest is retried, and none while another unfinished job holds the key; those are
    /// refused with the reason. One statement: [`crate::Client::retry_where`] calls it in chunks.
    async fn retry(&self, filter: &JobFilter, now: Timestamp) -> StoreResult<RetryOutcome> {
        let filter = filter.clone();
        flow!(self, write, |tx| manage::retry(tx, &filter, now))
    }

    /// Manual cancel of every matching unfinished job. One statement:
    /// [`crate::Client::cancel_where`] calls it in chunks.
    async fn cancel(&self, filter: &JobFilter, now: Timestamp) -> StoreResult<CancelOutcome> {
        let filter = filter.clone();
        flow!(self, write, |tx| manage::cancel(tx, &filter, now))
    }

    /// Deletes every matching finished job (completed, discarded, cancelled) and returns their
    /// ids. One statement: [`crate::Client::delete_where`] calls it in chunks. A filter naming one
    /// job that is absent or unfinished is refused ([`StoreError::NotFound`],
    /// [`StoreError::Conflict`]).
    async fn delete(&self, filter: &JobFilter) -> StoreResult<Vec<JobId>> {
        let filter = filter.clone();
        flow!(self, write, |tx| manage::delete(tx, &filter))
    }

    /// How many jobs match `filter` (its `limit` caps the count).
    async fn count(&self, filter: &JobFilter) -> StoreResult<u64> {
        let filter = filter.clone();
        flow!(self, read, |tx| manage::count(tx, &filter))
    }

    /// Running jobs of `kinds` whose lease expired before `now`.
    async fn expired(
        &self,
        kinds: &[String],
        now: Timestamp,
        limit: usize,
    ) -> StoreResult<Vec<Job>> {
        let kinds = kinds.to_vec();
        flow!(self, read, |tx| manage::expired(tx, &kinds, now, limit))
    }

    /// Takes one of `slots` slots of lease `key` for the running `job` (leased to `owner`) until
    /// `until`, as a claim takes its jobs' slots. When every slot is busy the job waits asleep in
    /// the same write (its attempt given back, nothing in its history) until the earliest slot
    /// expires, and releasing a slot wakes the longest waiter at once; when the key is paused the
    /// job is held until the pause ends.
    async fn acquire_lease(
        &self,
        key: &str,
        slots: u32,
        job: &Job,
        owner: &str,
        now: Timestamp,
        until: Timestamp,
    ) -> StoreResult<LeaseDecision> {
        let (key, job, owner) = (key.to_string(), job.clone(), owner.to_string());
        let acquired = flow!(self, write, |tx| keys::acquire(
            tx,
            keys::LeaseAsks {
                jobs: &[(&job, key.as_str(), slots)],
                owner: &owner,
                now,
                until
            }
        ))?;
        let waited = acquired.waited;
        if !waited.is_empty() {
            flow!(self, write, |tx| keys::wake_free(tx, &waited, now))?;
        }
        Ok(acquired
            .decisions
            .first()
            .copied()
            .unwrap_or(LeaseDecision::Acquired))
    }

    /// Until when lease `key` is held (the latest slot), if it is held at all.
    async fn lease_busy_until(&self, key: &str) -> StoreResult<Option<Timestamp>> {
        let key = key.to_string();
        flow!(self, read, |tx| keys::busy_until(tx, &key))
    }

    /// Records the progress of attempt `attempt` of job `id`, run by `owner`; false when that
    /// attempt no longer holds the job (nothing is written).
    async fn report_progress(
        &self,
        id: JobId,
        owner: &str,
        attempt: u32,
        progress: &crate::job::Progress,
    ) -> StoreResult<bool> {
        let (owner, progress) = (owner.to_string(), progress.clone());
        flow!(self, write, |tx| attempts::progress(
            tx, id, &owner, attempt, &progress
        ))
    }

    /// Pauses lease key `key` until `until`: its waiting jobs due by then are held (`scheduled`
    /// until the pause ends, no attempt spent and nothing written to their history), and a job of
    /// the key claimed during the pause is held when it tries to take the key. Returns how many
    /// jobs the pause holds now.
    async fn pause_key(
        &self,
        key: &str,
        until: Timestamp,
        now: Timestamp,
        reason: &str,
        mode: PauseMode,
    ) -> StoreResult<u64> {
        let (key, reason) = (key.to_string(), reason.to_string());
        flow!(self, write, |tx| keys::pause(
            tx, &key, until, now, &reason, mode
        ))
    }

    /// Ends `key`'s pause now: its held jobs are due at once. `None` when the key was not paused.
    async fn resume_key(&self, key: &str, now: Timestamp) -> StoreResult<Option<u64>> {
        let key = key.to_string();
        flow!(self, write, |tx| keys::resume(tx, &key, now))
    }

    /// When `key`'s pause in force at `now` ends, if it is paused.
    async fn paused_until(&self, key: &str, now: Timestamp) -> StoreResult<Option<Timestamp>> {
        let key = key.to_string();
        flow!(self, read, |tx| keys::paused_until(tx, &key, now))
    }

    /// The keys paused at `now`, by key, with how many jobs each holds.
    async fn paused_keys(&self, now: Timestamp) -> StoreResult<Vec<PausedKey>> {
        flow!(self, read, |tx| keys::paused_keys(tx, now))
    }

    /// Takes one use of each rate window asked for (at most `max` per `window`, windows aligned
    /// to the epoch), all or none: when any window is spent nothing is taken. The answers follow
    /// the asks' order; a window that was not spent answers `Taken` with the uses it would leave.
    async fn take_rates(&self, asks: &[RateAsk], now: Timestamp) -> StoreResult<Vec<RateDecision>> {
        let asks = asks.to_vec();
        flow!(self, write, |tx| keys::take_rates(tx, &asks, now))
    }

    /// Takes or renews leadership `name` for `holder` until `until`; true when `holder` leads.
    async fn try_lead(
        &self,
        name: &str,
        holder: &str,
        now: Timestamp,
        until: Timestamp,
    ) -> StoreResult<bool> {
        let (name, holder) = (name.to_string(), holder.to_string());
        flow!(self, write, |tx| maintenance::try_lead(
            tx, &name, &holder, now, until
        ))
    }

    /// Gives leadership up.
    async fn resign(&self, name: &str, holder: &str) -> StoreResult<()> {
        let (name, holder) = (name.to_string(), holder.to_string());
        flow!(self, write, |tx| maintenance::resign(tx, &name, &holder))
    }

    /// Records a periodic schedule: created if new; an unchanged schedule keeps its next run time,
    /// a changed one takes `next_run_at`.
    async fn upsert_periodic(
        &self,
        name: &str,
        kind: &str,
        schedule: &str,
        next_run_at: Timestamp,
    ) -> StoreResult<PeriodicRow> {
        let (name, kind, schedule) = (name.to_string(), kind.to_string(), schedule.to_string());
        flow!(self, write, |tx| periodic::upsert(
            tx,
            &name,
            &kind,
            &schedule,
            next_run_at
        ))
    }

    /// Enqueues `job` for period `period` of `name`, unless that period (or a later one) already
    /// was. Returns the job's id when enqueued.
    async fn enqueue_period(
        &self,
        name: &str,
        period: Timestamp,
        next_run_at: Timestamp,
        job: InsertRow,
    ) -> StoreResult<Option<JobId>> {
        let name = name.to_string();
        flow!(self, write, |tx| periodic::enqueue(
            tx,
            &name,
            period,
            next_run_at,
            job
        ))
    }

    /// Every periodic schedule.
    async fn list_periodic(&self) -> StoreResult<Vec<PeriodicRow>> {
        flow!(self, read, |tx| periodic::list(tx))
    }

    /// Moves schedule `name`'s next run forward to `next_run_at` without enqueuing (missed
    /// periods its catch-up policy skips).
    async fn skip_periods(&self, name: &str, next_run_at: Timestamp) -> StoreResult<()> {
        let name = name.to_string();
        flow!(self, write, |tx| periodic::skip(tx, &name, next_run_at))
    }

    /// Pauses schedule `name` (`paused_at` set) or resumes it (`None`), moving its next run to
    /// `next_run_at` when given. A resume changes nothing on a schedule that is not paused (its
    /// missed periods stay due, for its catch-up policy). False when nothing changed.
    async fn pause_periodic(
        &self,
        name: &str,
        paused_at: Option<Timestamp>,
        next_run_at: Option<Timestamp>,
    ) -> StoreResult<bool> {
        let name = name.to_string();
        flow!(self, write, |tx| periodic::pause(
            tx,
            &name,
            paused_at,
            next_run_at
        ))
    }

    /// Deletes finished jobs past retention, old rate windows and stale leases; returns jobs deleted.
    async fn prune(&self, now: Timestamp, retention: Retention, limit: usize) -> StoreResult<u64> {
        flow!(self, write, |tx| maintenance::prune(
            tx, now, retention, limit
        ))
    }

    /// Alerts, newest first.
    async fn alerts(&self, include_acked: bool, limit: usize) -> StoreResult<Vec<Alert>> {
        let order = maintenance::AlertOrder::Newest { include_acked };
        flow!(self, read, |tx| maintenance::alerts(tx, order, limit))
    }

    /// Acknowledges an alert; false when there is none with that id.
    async fn ack_alert(&self, id: i64, now: Timestamp) -> StoreResult<bool> {
        flow!(self, write, |tx| maintenance::ack_alert(tx, id, now))
    }

    /// Job counts per state, kind and queue, read from counters that triggers keep in the same
    /// transaction as every change of a job (so the cost never grows with the number of jobs).
    async fn counts(&self) -> StoreResult<Vec<CountRow>> {
        flow!(self, read, |tx| counts::current(tx))
    }

    /// How many jobs reached completed, retryable or discarded in each minute from `since` on, per
    /// kind. Read from the history the counters' triggers keep, never from the jobs.
    async fn history(&self, since: Timestamp) -> StoreResult<Vec<HistoryRow>> {
        flow!(self, read, |tx| counts::history(tx, since))
    }

    /// Folds the counters' pending changes into their totals (PostgreSQL appends changes so that
    /// writers never wait on one counter row) and drops history older than `keep_since`. The
    /// maintenance leader calls it; counts and history are exact whether or not it has run.
    async fn fold_counts(&self, keep_since: Timestamp) -> StoreResult<()> {
        flow!(self, write, |tx| counts::fold(tx, keep_since))
    }

    /// The database's clock, read for measurement only (decisions use the runtime's clock). The
    /// default is this machine's clock: an embedded database shares it.
    async fn database_time(&self) -> StoreResult<DatabaseTime> {
        Ok(DatabaseTime {
            at: chrono::Utc::now(),
            round_trip: Duration::ZERO,
            answered: std::time::Instant::now(),
        })
    }

    /// Notices from other processes, where the backend has them (`None` where workers only poll).
    /// The stream ends when the receiver is dropped.
    async fn listen(&self) -> StoreResult<Option<tokio::sync::mpsc::UnboundedReceiver<Notice>>> {
        Ok(None)
    }
}

/// The tables and columns of the database at `url` once `lines` are applied to it (see
/// [`crate::sql::columns`]).
pub async fn schema(url: &str, lines: &[&'static Line]) -> StoreResult<Vec<String>> {
    let store = open_with(url, false).await?;
    store.migrate(lines).await?;
    Db::new(store)
        .read(|tx| Box::pin(async move { crate::sql::columns(tx).await }))
        .await
}

/// A database URL as it may be shown in logs and errors: a PostgreSQL URL rebuilt from its parsed
/// parts (no password, in the authority or in `?password=`, can appear), a SQLite URL as it is
/// (it holds no secret), and anything else with its credentials and query hidden.
pub fn redact_url(url: &str) -> String {
    if url.starts_with("sqlite:") {
        url.to_string()
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        postgres::connect::redact(url)
    } else {
        crude_redact(url)
    }
}

/// A URL with everything between `://` and `@` and the whole query hidden, for a URL that does not
/// parse (so not even a malformed password is shown).
pub(crate) fn crude_redact(url: &str) -> String {
    let (base, has_query) = match url.split_once('?') {
        Some((b, _)) => (b, true),
        None => (url, false),
    };
    let base = match (base.find("://"), base.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}***{}", &base[..s + 3], &base[at..]),
        _ => base.to_string(),
    };
    if has_query {
        format!("{base}?***")
    } else {
        base
    }
}

/// Opens the store a URL names (`sqlite://path/to/file.db`, created if missing, or
/// `postgres://user@host/db`) and applies the job layer's pending migrations.
pub async fn open(url: &str) -> StoreResult<std::sync::Arc<dyn Store>> {
    open_with(url, true).await
}

/// As [`open`]; with `migrate` false no migration is applied (see [`Store::migrate`]).
pub async fn open_with(url: &str, migrate: bool) -> StoreResult<std::sync::Arc<dyn Store>> {
    if url.starts_with("sqlite:") {
        let opts = sqlite::SqliteOptions {
            migrate,
            ..sqlite::SqliteOptions::from_url(url)?
        };
        Ok(std::sync::Arc::new(sqlite::SqliteStore::open(opts).await?))
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(std::sync::Arc::new(
            postgres::PostgresStore::open_with(url, migrate).await?,
        ))
    } else {
        Err(StoreError::BadUrl(format!(
            "the database URL {} is not understood; use sqlite://path/to/onus.db (or postgres://user@host/db)",
            redact_url(url)
        )))
    }
}
