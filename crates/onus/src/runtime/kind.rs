//! Job kinds: a name, a policy (data), a queue, lease-key slots, and a handler.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::clock::{Clock, Timestamp};
use crate::job::{decode_args, Job, JobArgs, Progress, ReportError};
use crate::limits::RateWindow;
use crate::outcome::Transition;
use crate::outcome::{JobError, JobResult};
use crate::policy::Policy;
use crate::sql::{AnyTx, LocalFuture};
use crate::store::{Store, StoreError};

/// A boxed handler future.
pub type HandlerFuture = Pin<Box<dyn Future<Output = JobResult> + Send + 'static>>;

/// Runs one attempt of a job. Implemented for async closures by [`Kind::handler`] and
/// [`crate::Builder::register`]; implement it by hand for handlers that need state.
pub trait Handler: Send + Sync + 'static {
    /// Runs the attempt described by `ctx`.
    fn call(&self, ctx: JobContext) -> HandlerFuture;
}

impl<F, Fut> Handler for F
where
    F: Fn(JobContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = JobResult> + Send + 'static,
{
    fn call(&self, ctx: JobContext) -> HandlerFuture {
        Box::pin(self(ctx))
    }
}

/// A job kind: its name and, as data, how its jobs run.
#[derive(Clone)]
pub struct Kind {
    pub(crate) name: String,
    /// Its metrics' handles, shared by every attempt.
    pub(crate) meters: Arc<super::metrics::KindMeters>,
    pub(crate) policy: Policy,
    pub(crate) queue: String,
    pub(crate) lease_slots: u32,
    pub(crate) lease_key: Option<crate::limits::KeyTemplate>,
    pub(crate) retry_budget: Option<crate::budget::RetryBudget>,
    pub(crate) max_running: Option<u32>,
    pub(crate) rate: Option<(RateWindow, crate::limits::KeyTemplate)>,
    pub(crate) handler: Option<Arc<dyn Handler>>,
    pub(crate) check: Option<ArgsCheck>,
}

/// A kind's check of the args of a job being inserted (see [`Kind::check_args`]).
pub type ArgsCheck = Arc<dyn Fn(&serde_json::Value) -> Result<(), String> + Send + Sync>;

impl fmt::Debug for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kind")
            .field("name", &self.name)
            .field("policy", &self.policy)
            .field("queue", &self.queue)
            .field("lease_slots", &self.lease_slots)
            .field("lease_key", &self.lease_key.as_ref().map(|t| t.as_str()))
            .field("handled", &self.handler.is_some())
            .finish()
    }
}

impl Kind {
    /// A kind with the `default` policy in the `default` queue, not handled in this process.
    pub fn new(name: impl Into<String>) -> Self {
        let name: String = name.into();
        Kind {
            meters: Arc::new(super::metrics::KindMeters::new(&name)),
            name,
            policy: Policy::preset_default(),
            queue: crate::DEFAULT_QUEUE.into(),
            lease_slots: 1,
            lease_key: None,
            retry_budget: None,
            max_running: None,
            rate: None,
            handler: None,
            check: None,
        }
    }

    /// The kind of typed args `A`, with their declared policy and queue.
    pub fn of<A: JobArgs>() -> Self {
        Kind::new(A::KIND).policy(A::policy()).queue(A::queue())
    }

    /// Sets the retry policy.
    pub fn policy(mut self, p: Policy) -> Self {
        self.policy = p;
        self
    }

    /// Sets the queue jobs go to when their insert names none.
    pub fn queue(mut self, q: impl Into<String>) -> Self {
        self.queue = q.into();
        self
    }

    /// Builds the lease key of every job of this kind inserted without one from its args
    /// (`"customer:{customer_id}"`); a job whose args lack a field of it is refused at insert.
    pub fn lease_key_from(mut self, t: crate::limits::KeyTemplate) -> Self {
        self.lease_key = Some(t);
        self
    }

    /// Budgets this kind's retries (replacing the runtime's default budget, [`crate::Options`]):
    /// of the attempts it starts in any window, at most the budget's share may be retries; a
    /// retry over it is deferred until the budget allows (see [`crate::budget`]).
    pub fn retry_budget(mut self, b: crate::budget::RetryBudget) -> Self {
        self.retry_budget = Some(b);
        self
    }

    /// At most `n` jobs of this kind run at once across every process (claimed jobs count; the
    /// others wait, claimable, until one ends). A claim of a capped kind counts its running jobs,
    /// holding the kind's lock on PostgreSQL.
    pub fn max_running(mut self, n: u32) -> Self {
        self.max_running = Some(n.max(1));
        self
    }

    /// Takes one use of `limit` for the key `key` builds from each job's args before every
    /// attempt starts (`"customer:{customer_id}"`; a job whose args lack a field of it is refused
    /// at insert): when the window is spent the job snoozes to the next window or is dropped, as
    /// the limit says, without running. The same as [`JobContext::take`] in the handler, for
    /// kinds whose handler is not Rust in this process (push and pull kinds).
    pub fn rate_from(mut self, limit: RateWindow, key: crate::limits::KeyTemplate) -> Self {
        self.rate = Some((limit, key));
        self
    }

    /// How many jobs holding the same lease key may run at once (default 1).
    pub fn lease_slots(mut self, n: u32) -> Self {
        self.lease_slots = n.max(1);
        self
    }

    /// Checks the args of every job of this kind inserted through this process's client: an
    /// `Err` refuses the insert ([`crate::Error::Invalid`], a 422 at the HTTP API) with its message,
    /// which should name the field and say what to fix.
    pub fn check_args(
        mut self,
        f: impl Fn(&serde_json::Value) -> Result<(), String> + Send + Sync + 'static,
    ) -> Self {
        self.check = Some(Arc::new(f));
        self
    }

    /// Handles jobs of this kind in this process, with the raw JSON args in `ctx.job().args`.
    pub fn handler(mut self, h: impl Handler) -> Self {
        self.handler = Some(Arc::new(h));
        self
    }

    /// Handles jobs of this kind with typed args; args that fail to decode discard the job with a
    /// message naming the field.
    pub fn typed<A, F, Fut>(self, f: F) -> Self
    where
        A: serde::de::DeserializeOwned + Send + 'static,
        F: Fn(JobContext, A) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = JobResult> + Send + 'static,
    {
        let f = Arc::new(f);
        self.handler(move |ctx: JobContext| {
            let f = f.clone();
            async move {
                let args: A = decode_args(&ctx.job().args).map_err(JobError::discard_err)?;
                f(ctx, args).await
            }
        })
    }

    /// The kind's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The kind's policy (after configuration overrides).
    pub fn policy_ref(&self) -> &Policy {
        &self.policy
    }

    /// Whether this process runs its jobs (a kind without a handler is known for its policy and
    /// queue only: its jobs are run elsewhere, by pull workers say).
    pub fn is_handled(&self) -> bool {
        self.handler.is_some()
    }

    /// Its default queue.
    pub fn queue_name(&self) -> &str {
        &self.queue
    }

    /// The template its jobs' lease keys are built from, when it has one.
    pub fn lease_key_template(&self) -> Option<&str> {
        self.lease_key.as_ref().map(|t| t.as_str())
    }

    /// How many jobs of one lease key run at once, across every process.
    pub fn slots(&self) -> u32 {
        self.lease_slots
    }

    /// The most jobs of the kind running at once across every process, when capped.
    pub fn running_cap(&self) -> Option<u32> {
        self.max_running
    }

    /// Its rate window and the template of the key it counts by, when it has one.
    pub fn rate_window(&self) -> Option<(&RateWindow, &str)> {
        self.rate.as_ref().map(|(w, k)| (w, k.as_str()))
    }

    /// Its own retry budget, when it has one.
    pub fn own_retry_budget(&self) -> Option<&crate::budget::RetryBudget> {
        self.retry_budget.as_ref()
    }
}

/// What a handler knows about the attempt it runs.
#[derive(Clone)]
pub struct JobContext {
    pub(crate) attempt: Arc<AttemptState>,
    pub(crate) signals: Arc<super::hub::Signals>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) client: super::Client,
}

/// What a handler and the attempt running it share: the job, and what the handler left for the
/// attempt to write. One allocation per attempt.
#[derive(Debug)]
pub(crate) struct AttemptState {
    pub(crate) job: Job,
    /// Set once [`JobContext::complete_with`] committed the job's completion.
    pub(crate) completed: AtomicBool,
    /// The result to keep if this attempt completes the job ([`JobContext::set_result`]).
    pub(crate) result: std::sync::Mutex<Option<serde_json::Value>>,
}

impl AttemptState {
    pub(crate) fn new(job: Job) -> Self {
        AttemptState {
            job,
            completed: AtomicBool::new(false),
            result: std::sync::Mutex::new(None),
        }
    }
}

impl fmt::Debug for JobContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobContext")
            .field("job", &self.attempt.job.id)
            .field("kind", &self.attempt.job.kind)
            .finish()
    }
}

impl JobContext {
    /// The job as claimed (`attempt` counts this attempt).
    pub fn job(&self) -> &Job {
        &self.attempt.job
    }

    /// This attempt's number, from 1.
    pub fn attempt(&self) -> u32 {
        self.job().attempt
    }

    /// The job layer's current time.
    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// A client of the runtime running this job, to insert follow-up jobs (they wake this
    /// process's workers at once).
    pub fn client(&self) -> &super::Client {
        &self.client
    }

    /// Reports how far this attempt got: `fraction` from 0 to 1 and a short message, shown with
    /// the job (API, CLI, panel) until the next report. Each report is one write to the
    /// database, so report at steps that matter (every few percent), not for every item. A
    /// report the database does not take is logged and dropped: progress never fails the job.
    pub async fn progress(&self, fraction: f64, message: &str) -> Result<(), ReportError> {
        let p = Progress::new(fraction, message, self.clock.now())?;
        let owner = self.job().lease_owner.clone().unwrap_or_default();
        if let Err(e) = self
            .store
            .report_progress(self.job().id, &owner, self.job().attempt, &p)
            .await
        {
            tracing::warn!(job = self.job().id, error = %e, "progress not recorded");
        }
        Ok(())
    }

    /// Keeps `value` as the job's result if this attempt completes it (written with the
    /// completion; a later call replaces it). At most [`crate::job::MAX_RESULT_BYTES`] of JSON:
    /// keep large output elsewhere and its address here.
    pub fn set_result(&self, value: impl serde::Serialize) -> Result<(), ReportError> {
        let v = serde_json::to_value(value)
            .map_err(|e| ReportError(format!("result does not serialize to JSON: {e}")))?;
        crate::job::check_result(&v)?;
        *self
            .attempt
            .result
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(v);
        Ok(())
    }

    /// The result set so far, to write with the completion.
    pub(crate) fn kept_result(&self) -> Option<serde_json::Value> {
        self.attempt
            .result
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// True once the job was cancelled; the attempt then ends `cancelled` unless it succeeds.
    pub fn is_cancelled(&self) -> bool {
        self.signals.is_cancelled()
    }

    /// Resolves when the job is cancelled.
    pub async fn cancelled(&self) {
        self.signals.cancelled().await
    }

    /// Takes one use of `limit` for `key`. When the window is spent this returns the error to
    /// propagate with `?`: a snooze to the next window, or a drop, as the limit says.
    pub async fn take(&self, limit: &RateWindow, key: &str) -> Result<(), JobError> {
        self.take_all(&[(limit, key)]).await
    }

    /// Takes one use of each `(limit, key)`, all or none: when any window is spent nothing is
    /// taken and this returns the error to propagate with `?`. A spent limit that drops wins over
    /// one that snoozes (the job would be dropped anyway); otherwise the job snoozes until every
    /// spent window has passed.
    pub async fn take_all(&self, limits: &[(&RateWindow, &str)]) -> Result<(), JobError> {
        super::admission::take_rates(&*self.store, self.clock.now(), limits).await
    }

    /// Completes this job in one transaction with `op`'s writes: both commit, or neither (the
    /// job then runs again as the handler's answer says). Use it for the step that records a side
    /// effect as done ("send, then mark"): a crash before the commit runs the effect again, never
    /// loses the mark. `op` runs after the job's completion is written, so it never runs for an
    /// attempt whose lease was lost; its error rolls both back and is returned as it was. Once this
    /// returns `Ok` the job is completed whatever the handler returns afterwards.
    pub async fn complete_with<R, E, F>(&self, op: F) -> Result<R, E>
    where
        F: for<'t> FnOnce(&'t AnyTx<'t>) -> LocalFuture<'t, Result<R, E>> + Send + 'static,
        R: Send + 'static,
        E: From<StoreError> + std::fmt::Display + Send + 'static,
    {
        let shared = &self.client.shared;
        let finish = crate::store::Finish {
            result: self.kept_result(),
            ..super::attempt::finish_of(shared, self.job(), Transition::Complete)
        };
        let id = self.job().id;
        // The lease slot this attempt holds goes to the key's next job of the same queue and
        // kind, claimed for this process in the same commit, where the store hands slots on
        // (`Store::hands_on_lease_slots`), while the queue runs here (and this process's clock is
        // within bounds of the database's, as for any claim of its own).
        let door = self
            .job()
            .lease_key
            .as_ref()
            .filter(|_| self.store.hands_on_lease_slots())
            .filter(|_| super::skew::Skew::within_bound(shared))
            .and_then(|_| shared.intakes.get(&self.job().queue));
        let to = door.as_ref().map(|_| {
            let now = shared.clock.now();
            crate::store::keys::HandTo {
                owner: shared.owner.clone(),
                queue: self.job().queue.clone(),
                kind: self.job().kind.clone(),
                lease_until: crate::clock::add(now, shared.options.lease_ttl),
            }
        });
        let started = std::time::Instant::now();
        let next: Arc<std::sync::Mutex<Option<Job>>> = Arc::default();
        let handed = next.clone();
        let (store, shared, queue) = (self.store.clone(), shared.clone(), self.job().queue.clone());
        // When a slot is handed on, the commit and the start of the job it went to happen together,
        // in a task of their own: the handler may be stopped once its job is completed (a renewal
        // finds it no longer running), and the job handed on must not be left claimed with nobody
        // to run it. Otherwise the commit runs on the handler's task.
        let hands_on = door.is_some();
        let commit = async move {
            let out = crate::store::Db::new(store)
                .tx(move |tx| {
                    Box::pin(async move {
                        match crate::store::finish::handing(tx, &finish, to.as_ref()).await? {
                            None => {
                                return Err(E::from(StoreError::Conflict(format!(
                                    "job {id} is no longer this attempt's (its lease was lost): nothing was written"
                                ))))
                            }
                            Some(next) => *handed.lock().unwrap_or_else(|e| e.into_inner()) = next,
                        }
                        op(tx).await
                    })
                })
                .await;
            let next = next.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let (Ok(_), Some(door), Some(next)) = (&out, door, next) {
                // It runs in the slot this attempt is about to give back.
                door.deliver_handed(&shared, &queue, next, started);
            }
            out
        };
        let out = if !hands_on {
            commit.await?
        } else {
            match tokio::spawn(commit).await {
                Ok(out) => out?,
                // `op` panicked: the handler panics as it would have without the task.
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(e) => {
                    return Err(E::from(StoreError::Query(
                        format!("the completion's transaction was stopped: {e}"),
                        None,
                    )))
                }
            }
        };
        self.attempt.completed.store(true, Ordering::SeqCst);
        Ok(out)
    }
}
