//! A store that misbehaves on purpose, wrapped around a real one: renewals that hang, claim
//! replies lost after the commit, outcomes the database refuses, every call hanging. Faults are
//! switched on and off while a test runs; everything else goes to the real store unchanged.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use onus::store::*;
use onus::{Job, JobFilter, JobId, Store, StoreError, Timestamp};

#[derive(Debug, Default)]
pub struct Faults {
    /// Lease renewals never answer.
    pub hang_heartbeats: AtomicBool,
    /// This many claims commit and then fail, as if the reply was lost on the way.
    pub lose_claim_replies: AtomicU32,
    /// A finish batch holding any of these jobs is refused by "the database".
    pub refuse_finish_of: Mutex<HashSet<JobId>>,
    /// How many finish batches were refused so.
    pub refused: AtomicU32,
    /// Completing any of these attempts (job, attempt) times out, as if the database were too
    /// busy for it.
    pub time_out_completing: Mutex<HashSet<(JobId, u32)>>,
    /// Every call hangs.
    pub hang_all: AtomicBool,
    /// The ids passed to each bulk retry and cancel (`None`: no id list, the whole filter).
    pub bulk_calls: Mutex<Vec<Option<usize>>>,
}

#[derive(Debug, Clone)]
pub struct Faulty {
    pub inner: Arc<dyn Store>,
    pub faults: Arc<Faults>,
}

impl Faulty {
    pub fn wrap(inner: Arc<dyn Store>) -> (Arc<dyn Store>, Arc<Faults>) {
        let faults = Arc::new(Faults::default());
        let store = Arc::new(Faulty {
            inner,
            faults: faults.clone(),
        });
        (store, faults)
    }

    async fn gate(&self) {
        if self.faults.hang_all.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    }

    fn record_bulk(&self, f: &JobFilter) {
        let n = (!f.ids.is_empty()).then_some(f.ids.len());
        self.faults.bulk_calls.lock().unwrap().push(n);
    }
}

#[async_trait]
impl Store for Faulty {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self.inner.as_any()
    }
    async fn transaction(&self, op: onus::sql::TxFn) -> StoreResult<()> {
        self.gate().await;
        self.inner.transaction(op).await
    }
    async fn read_only(&self, op: onus::sql::TxFn) -> StoreResult<()> {
        self.gate().await;
        self.inner.read_only(op).await
    }
    async fn migrate(
        &self,
        lines: &[&'static onus::sql::Line],
    ) -> StoreResult<Vec<onus::sql::migrate::Applied>> {
        self.inner.migrate(lines).await
    }
    async fn migrations(
        &self,
        lines: &[&'static onus::sql::Line],
    ) -> StoreResult<Vec<onus::sql::LineStatus>> {
        self.inner.migrations(lines).await
    }
    async fn insert(&self, rows: Vec<InsertRow>) -> StoreResult<Vec<Inserted>> {
        self.gate().await;
        self.inner.insert(rows).await
    }
    async fn claim(&self, req: ClaimRequest) -> StoreResult<Vec<Job>> {
        self.gate().await;
        let jobs = self.inner.claim(req).await?;
        if !jobs.is_empty()
            && self
                .faults
                .lose_claim_replies
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            return Err(StoreError::Unavailable(
                "the connection dropped after the claim committed".into(),
                None,
            ));
        }
        Ok(jobs)
    }
    async fn finish(&self, batch: &[Finish]) -> StoreResult<Vec<bool>> {
        self.gate().await;
        let refused = {
            let r = self.faults.refuse_finish_of.lock().unwrap();
            batch.iter().any(|f| r.contains(&f.id))
        };
        let timed_out = {
            let t = self.faults.time_out_completing.lock().unwrap();
            batch.iter().any(|f| {
                t.contains(&(f.id, f.attempt))
                    && matches!(f.transition, onus::outcome::Transition::Complete)
            })
        };
        if timed_out {
            return Err(StoreError::Unavailable(
                "ERROR: canceling statement due to statement timeout".into(),
                None,
            ));
        }
        if refused {
            self.faults.refused.fetch_add(1, Ordering::SeqCst);
            return Err(StoreError::Query(
                "ERROR: the database refused this outcome".into(),
                None,
            ));
        }
        self.inner.finish(batch).await
    }
    async fn heartbeat(
        &self,
        owner: &str,
        held: &[HeldJob],
        lease_until: Timestamp,
    ) -> StoreResult<Renewal> {
        self.gate().await;
        if self.faults.hang_heartbeats.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        self.inner.heartbeat(owner, held, lease_until).await
    }
    async fn get(&self, id: JobId) -> StoreResult<Option<Job>> {
        self.gate().await;
        self.inner.get(id).await
    }
    async fn list(
        &self,
        filter: &JobFilter,
        limit: usize,
        before: Option<JobId>,
    ) -> StoreResult<Vec<Job>> {
        self.gate().await;
        self.inner.list(filter, limit, before).await
    }
    async fn retry(&self, filter: &JobFilter, now: Timestamp) -> StoreResult<RetryOutcome> {
        self.gate().await;
        self.record_bulk(filter);
        self.inner.retry(filter, now).await
    }
    async fn cancel(&self, filter: &JobFilter, now: Timestamp) -> StoreResult<CancelOutcome> {
        self.gate().await;
        self.record_bulk(filter);
        self.inner.cancel(filter, now).await
    }
    async fn delete(&self, filter: &JobFilter) -> StoreResult<Vec<JobId>> {
        self.gate().await;
        self.record_bulk(filter);
        self.inner.delete(filter).await
    }
    async fn count(&self, filter: &JobFilter) -> StoreResult<u64> {
        self.gate().await;
        self.inner.count(filter).await
    }
    async fn expired(
        &self,
        kinds: &[String],
        now: Timestamp,
        limit: usize,
    ) -> StoreResult<Vec<Job>> {
        self.gate().await;
        self.inner.expired(kinds, now, limit).await
    }
    async fn acquire_lease(
        &self,
        key: &str,
        slots: u32,
        job: &Job,
        owner: &str,
        now: Timestamp,
        until: Timestamp,
    ) -> StoreResult<LeaseDecision> {
        self.gate().await;
        self.inner
            .acquire_lease(key, slots, job, owner, now, until)
            .await
    }
    async fn lease_busy_until(&self, key: &str) -> StoreResult<Option<Timestamp>> {
        self.gate().await;
        self.inner.lease_busy_until(key).await
    }
    async fn pause_key(
        &self,
        key: &str,
        until: Timestamp,
        now: Timestamp,
        reason: &str,
        mode: onus::store::PauseMode,
    ) -> StoreResult<u64> {
        self.gate().await;
        self.inner.pause_key(key, until, now, reason, mode).await
    }
    async fn report_progress(
        &self,
        id: onus::JobId,
        owner: &str,
        attempt: u32,
        progress: &onus::Progress,
    ) -> StoreResult<bool> {
        self.gate().await;
        self.inner
            .report_progress(id, owner, attempt, progress)
            .await
    }
    async fn skip_periods(&self, name: &str, next_run_at: Timestamp) -> StoreResult<()> {
        self.gate().await;
        self.inner.skip_periods(name, next_run_at).await
    }
    async fn pause_periodic(
        &self,
        name: &str,
        paused_at: Option<Timestamp>,
        next_run_at: Option<Timestamp>,
    ) -> StoreResult<bool> {
        self.gate().await;
        self.inner
            .pause_periodic(name, paused_at, next_run_at)
            .await
    }
    async fn resume_key(&self, key: &str, now: Timestamp) -> StoreResult<Option<u64>> {
        self.gate().await;
        self.inner.resume_key(key, now).await
    }
    async fn paused_until(&self, key: &str, now: Timestamp) -> StoreResult<Option<Timestamp>> {
        self.gate().await;
        self.inner.paused_until(key, now).await
    }
    async fn paused_keys(&self, now: Timestamp) -> StoreResult<Vec<onus::PausedKey>> {
        self.gate().await;
        self.inner.paused_keys(now).await
    }
    async fn take_rates(
        &self,
        asks: &[onus::store::RateAsk],
        now: Timestamp,
    ) -> StoreResult<Vec<RateDecision>> {
        self.gate().await;
        self.inner.take_rates(asks, now).await
    }
    async fn try_lead(
        &self,
        name: &str,
        holder: &str,
        now: Timestamp,
        until: Timestamp,
    ) -> StoreResult<bool> {
        self.gate().await;
        self.inner.try_lead(name, holder, now, until).await
    }
    async fn resign(&self, name: &str, holder: &str) -> StoreResult<()> {
        self.gate().await;
        self.inner.resign(name, holder).await
    }
    async fn upsert_periodic(
        &self,
        name: &str,
        kind: &str,
        schedule: &str,
        next_run_at: Timestamp,
    ) -> StoreResult<PeriodicRow> {
        self.gate().await;
        self.inner
            .upsert_periodic(name, kind, schedule, next_run_at)
            .await
    }
    async fn enqueue_period(
        &self,
        name: &str,
        period: Timestamp,
        next_run_at: Timestamp,
        job: InsertRow,
    ) -> StoreResult<Option<JobId>> {
        self.gate().await;
        self.inner
            .enqueue_period(name, period, next_run_at, job)
            .await
    }
    async fn list_periodic(&self) -> StoreResult<Vec<PeriodicRow>> {
        self.gate().await;
        self.inner.list_periodic().await
    }
    async fn prune(&self, now: Timestamp, retention: Retention, limit: usize) -> StoreResult<u64> {
        self.gate().await;
        self.inner.prune(now, retention, limit).await
    }
    async fn alerts(&self, include_acked: bool, limit: usize) -> StoreResult<Vec<Alert>> {
        self.gate().await;
        self.inner.alerts(include_acked, limit).await
    }
    async fn ack_alert(&self, id: i64, now: Timestamp) -> StoreResult<bool> {
        self.gate().await;
        self.inner.ack_alert(id, now).await
    }
    async fn counts(&self) -> StoreResult<Vec<CountRow>> {
        self.gate().await;
        self.inner.counts().await
    }
    async fn history(&self, since: Timestamp) -> StoreResult<Vec<HistoryRow>> {
        self.gate().await;
        self.inner.history(since).await
    }
    async fn fold_counts(&self, keep_since: Timestamp) -> StoreResult<()> {
        self.gate().await;
        self.inner.fold_counts(keep_since).await
    }
    async fn database_time(&self) -> StoreResult<DatabaseTime> {
        self.gate().await;
        self.inner.database_time().await
    }
    async fn listen(&self) -> StoreResult<Option<tokio::sync::mpsc::UnboundedReceiver<Notice>>> {
        self.gate().await;
        self.inner.listen().await
    }
}
