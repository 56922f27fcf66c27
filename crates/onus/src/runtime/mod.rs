//! The runtime: a client to insert and manage jobs, workers that claim and run them, and the
//! maintenance loops (heartbeat, rescuer, leader election, periodic jobs, retention).
//!
//! The runtime is the only code that turns a handler's answer into the next state, through
//! [`crate::outcome::decide`] and the kind's [`Policy`](crate::Policy).

mod admission;
mod alerts;
mod attempt;
mod client;
mod execute;
mod finisher;
mod hub;
mod kind;
mod maintenance;
pub mod metrics;
mod periodic;
mod prepare;
mod processes;
mod producer;
mod pull;
mod queues;
mod skew;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use client::{Client, Error, BULK_CHUNK, MIN_PAUSE};
pub(crate) use hub::Hub;
pub use kind::{Handler, HandlerFuture, JobContext, Kind};
pub(crate) use periodic::{name_of as periodic_name_of, unique_key as periodic_unique_key};
pub use periodic::{CatchUp, CronIn, Periodic, Schedule, ScheduleError};
pub use processes::{
    ProcessInfo, ProcessRole, Processes, QueueSlots, RunningJob, JOBS_SHOWN, KEPT_FOR, LIVE_WITHIN,
    MAX_WORKER_NAME, PRESENCE_EVERY,
};
pub use pull::{at_most, Answer, Beat, BeatAsk, Claimed, MAX_CLAIM, MAX_CLAIM_WAIT};
pub use queues::{PausedQueue, QueueStats};

use crate::clock::{Clock, SystemClock};
use crate::job::JobArgs;
use crate::outcome::JobResult;
use crate::policy;
use crate::policy::PolicyOverride;
use crate::store::{Retention, Store};

/// Concurrency of a queue nobody configured.
pub const DEFAULT_CONCURRENCY: usize = 10;

/// Tuning knobs; the defaults suit most deployments.
#[derive(Debug, Clone)]
pub struct Options {
    /// How often an idle worker looks for due jobs it was not told about.
    pub poll_interval: Duration,
    /// How long a claimed job stays leased to its process without a heartbeat.
    pub lease_ttl: Duration,
    /// How often a process renews the leases of its running jobs and looks for cancel requests.
    pub heartbeat_interval: Duration,
    /// How often the rescuer looks for jobs whose process died.
    pub rescue_interval: Duration,
    /// How often leader election, periodic jobs and retention run.
    pub maintenance_interval: Duration,
    /// How long leadership lasts without renewal.
    pub leader_ttl: Duration,
    /// How often retention prunes (the leader only).
    pub prune_interval: Duration,
    /// How long finished jobs are kept.
    pub retention: Retention,
    /// Most jobs claimed in one statement. A queue whose handlers finish faster than its claims
    /// come back holds up to four such batches claimed and ready to start; otherwise as many as
    /// it has slots.
    pub claim_batch: usize,
    /// Periodic periods that came due within this window are each enqueued (a leader failover
    /// skips none); after a longer outage only the latest missed period is.
    pub periodic_catch_up: Duration,
    /// How long a cancelled handler may take to return before it is dropped.
    pub cancel_grace: Duration,
    /// Every kind's retry budget unless the kind has its own ([`Kind::retry_budget`]); none by
    /// default.
    pub retry_budget: Option<crate::budget::RetryBudget>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            poll_interval: Duration::from_secs(1),
            lease_ttl: Duration::from_secs(30),
            heartbeat_interval: Duration::from_secs(2),
            rescue_interval: Duration::from_secs(5),
            maintenance_interval: Duration::from_secs(1),
            leader_ttl: Duration::from_secs(10),
            prune_interval: Duration::from_secs(60),
            retention: Retention::default(),
            claim_batch: 500,
            periodic_catch_up: Duration::from_secs(60),
            cancel_grace: Duration::from_secs(5),
            retry_budget: None,
        }
    }
}

impl Options {
    /// Checks that the intervals make sense together; the error says what to change.
    pub fn validate(&self) -> Result<(), BuildError> {
        let bad = |m: String| Err(BuildError::Invalid(m));
        let day = Duration::from_secs(86_400);
        if self.lease_ttl < Duration::from_millis(100) || self.lease_ttl > day {
            return bad(format!(
                "lease_ttl must be from 100ms to 1 day; got {}",
                policy::human(self.lease_ttl)
            ));
        }
        if self.heartbeat_interval.is_zero() || self.heartbeat_interval > self.lease_ttl / 2 {
            return bad(format!(
                "heartbeat_interval ({}) must be at most half of lease_ttl ({}), or long attempts are dropped by the fence; a tenth of it is usual",
                policy::human(self.heartbeat_interval),
                policy::human(self.lease_ttl)
            ));
        }
        for (name, d) in [
            ("poll_interval", self.poll_interval),
            ("rescue_interval", self.rescue_interval),
            ("maintenance_interval", self.maintenance_interval),
            ("leader_ttl", self.leader_ttl),
            ("prune_interval", self.prune_interval),
            ("cancel_grace", self.cancel_grace),
            ("periodic_catch_up", self.periodic_catch_up),
        ] {
            if d > day {
                return bad(format!(
                    "{name} must be at most 1 day; got {}",
                    policy::human(d)
                ));
            }
        }
        if self.poll_interval.is_zero()
            || self.rescue_interval.is_zero()
            || self.maintenance_interval.is_zero()
        {
            return bad(
                "poll_interval, rescue_interval and maintenance_interval must be longer than zero"
                    .into(),
            );
        }
        Ok(())
    }
}

/// What went wrong while building the runtime.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A kind's policy (with its overrides) makes no sense.
    #[error("kind {kind:?}: {error}")]
    Policy {
        /// The kind.
        kind: String,
        /// What is wrong.
        error: crate::policy::PolicyError,
    },
    /// Something else in the set-up is wrong.
    #[error("{0}")]
    Invalid(String),
}

/// Logs the first failure of a database outage as an error and the rest quietly, until a
/// success says the database is back: one clear error per outage, not one per loop.
#[derive(Debug, Default)]
pub(crate) struct OutageLog(std::sync::atomic::AtomicBool);

impl OutageLog {
    pub(crate) fn report(&self, what: &str, e: &dyn std::fmt::Display) {
        if self.0.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::debug!(error = %e, "{what}");
        } else {
            tracing::error!(error = %e, "{what}; will keep trying until the database answers");
        }
    }

    pub(crate) fn clear(&self) {
        if self.0.swap(false, std::sync::atomic::Ordering::Relaxed) {
            tracing::info!("the database answers again");
        }
    }
}

pub(crate) struct Shared {
    pub(crate) lines: Vec<&'static crate::sql::Line>,
    pub(crate) outage: OutageLog,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) kinds: rustc_hash::FxHashMap<String, Kind>,
    pub(crate) queues: BTreeMap<String, usize>,
    pub(crate) periodics: Vec<Periodic>,
    pub(crate) options: Options,
    pub(crate) hub: Hub,
    /// Each running queue's door for this process's own inserts.
    pub(crate) intakes: producer::Intakes,
    pub(crate) owner: String,
    /// When each named pull worker's presence was last written.
    pub(crate) pull_seen: processes::PullSeen,
    pub(crate) skew: skew::Skew,
    pub(crate) budgets: crate::budget::Budgets,
    /// Outcomes queued for the finisher and not yet written (or given up): while there are
    /// [`producer::UNWRITTEN_LIMIT`], the queues claim nothing more.
    pub(crate) unwritten: std::sync::atomic::AtomicUsize,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Onus")
            .field("store", &self.store.backend())
            .field("owner", &self.owner)
            .field("kinds", &self.kinds.keys().collect::<Vec<_>>())
            .field("queues", &self.queues)
            .finish()
    }
}

impl Shared {
    /// Kinds this process can run.
    /// The caps on running jobs of `kinds` (those with [`Kind::max_running`]), for a claim.
    pub(crate) fn caps(&self, kinds: &[String]) -> Vec<(String, u32)> {
        kinds
            .iter()
            .filter_map(|k| {
                let n = self.kinds.get(k)?.max_running?;
                Some((k.clone(), n))
            })
            .collect()
    }

    /// The kinds among `kinds` whose lease keys have more than one slot, as a claim asks.
    pub(crate) fn lease_slots(&self, kinds: &[String]) -> Vec<(String, u32)> {
        kinds
            .iter()
            .filter_map(|k| {
                let n = self.kinds.get(k)?.lease_slots;
                (n > 1).then(|| (k.clone(), n))
            })
            .collect()
    }

    /// Whether this process runs `kind` (it has a handler here, not an outside worker).
    pub(crate) fn runs(&self, kind: &str) -> bool {
        self.kinds.get(kind).is_some_and(|k| k.handler.is_some())
    }

    pub(crate) fn handled_kinds(&self) -> Vec<String> {
        let mut k: Vec<String> = self
            .kinds
            .values()
            .filter(|k| k.handler.is_some())
            .map(|k| k.name.clone())
            .collect();
        k.sort();
        k
    }
}

/// A component built on the job layer (webhooks, mail): its kinds and periodic jobs, its tables'
/// migration line, and the client it works through, registered in one step with
/// [`Builder::component`].
pub trait Component: Clone + Send + Sync + 'static {
    /// Its tables' migration line, if it keeps tables.
    fn migrations(&self) -> Option<&'static crate::sql::Line>;

    /// Adds its kinds and periodic jobs to a runtime being built.
    fn install(&self, b: Builder) -> Builder;

    /// Receives the runtime's client once the runtime is built.
    fn bind(&self, client: Client);
}

/// A component waiting for the runtime's client.
struct Binder(Box<dyn FnOnce(Client) + Send>);

impl std::fmt::Debug for Binder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Binder")
    }
}

/// Sets up a runtime: kinds, queues, periodic jobs, components, clock and options.
#[derive(Debug)]
pub struct Builder {
    store: Arc<dyn Store>,
    lines: Vec<&'static crate::sql::Line>,
    binders: Vec<Binder>,
    clock: Arc<dyn Clock>,
    kinds: BTreeMap<String, Kind>,
    queues: BTreeMap<String, usize>,
    periodics: Vec<Periodic>,
    overrides: Vec<(String, PolicyOverride)>,
    budgets: Vec<(String, crate::budget::RetryBudget)>,
    options: Options,
}

impl Builder {
    /// Uses this clock instead of the system clock.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Adds (or replaces) a kind.
    pub fn kind(mut self, kind: Kind) -> Self {
        self.kinds.insert(kind.name.clone(), kind);
        self
    }

    /// Handles typed args `A` with `f`, under `A`'s declared policy and queue.
    pub fn register<A, F, Fut>(self, f: F) -> Self
    where
        A: JobArgs,
        F: Fn(JobContext, A) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = JobResult> + Send + 'static,
    {
        self.kind(Kind::of::<A>().typed(f))
    }

    /// Runs queue `name` with at most `concurrency` jobs at once in this process. Without any
    /// call, `default` runs with 10; the default queue of every handled kind always runs (with 10
    /// unless set here).
    pub fn queue(mut self, name: impl Into<String>, concurrency: usize) -> Self {
        self.queues.insert(name.into(), concurrency.max(1));
        self
    }

    /// Adds a periodic job.
    pub fn periodic(mut self, p: Periodic) -> Self {
        self.periodics.push(p);
        self
    }

    /// Adds a component: its kinds and periodic jobs now, its migration line to
    /// [`Onus::migrations`], and the runtime's client when the runtime is built.
    pub fn component<C: Component>(self, c: &C) -> Self {
        let mut b = c.install(self);
        if let Some(line) = c.migrations() {
            if !b.lines.iter().any(|l| l.name == line.name) {
                b.lines.push(line);
            }
        }
        let c = c.clone();
        b.binders
            .push(Binder(Box::new(move |client| c.bind(client))));
        b
    }

    /// Overrides a kind's policy from configuration.
    pub fn policy_override(mut self, kind: impl Into<String>, o: PolicyOverride) -> Self {
        self.overrides.push((kind.into(), o));
        self
    }

    /// Sets a kind's retry budget from configuration (a kind registered by a component too).
    pub fn retry_budget(mut self, kind: impl Into<String>, b: crate::budget::RetryBudget) -> Self {
        self.budgets.push((kind.into(), b));
        self
    }

    /// Replaces the tuning options.
    pub fn options(mut self, o: Options) -> Self {
        self.options = o;
        self
    }

    /// Checks the set-up and builds the runtime (not started yet).
    pub fn build(mut self) -> Result<Onus, BuildError> {
        self.options.validate()?;
        for (kind, o) in std::mem::take(&mut self.overrides) {
            let k = self
                .kinds
                .entry(kind.clone())
                .or_insert_with(|| Kind::new(kind.clone()));
            k.policy = k
                .policy
                .clone()
                .with_overrides(&o)
                .map_err(|error| BuildError::Policy { kind, error })?;
        }
        for (kind, b) in std::mem::take(&mut self.budgets) {
            b.check().map_err(BuildError::Invalid)?;
            self.kinds
                .entry(kind.clone())
                .or_insert_with(|| Kind::new(kind.clone()))
                .retry_budget = Some(b);
        }
        if let Some(b) = &self.options.retry_budget {
            b.check().map_err(BuildError::Invalid)?;
        }
        for k in self.kinds.values() {
            if let Some(b) = &k.retry_budget {
                b.check()
                    .map_err(|e| BuildError::Invalid(format!("kind {}: {e}", k.name)))?;
            }
            k.policy.validate().map_err(|error| BuildError::Policy {
                kind: k.name.clone(),
                error,
            })?;
            if k.name.trim().is_empty() {
                return Err(BuildError::Invalid("a kind needs a name".into()));
            }
        }
        let mut names = std::collections::HashSet::new();
        for p in &self.periodics {
            if !names.insert(p.name.clone()) {
                return Err(BuildError::Invalid(format!(
                    "two periodic jobs are named {:?}",
                    p.name
                )));
            }
        }
        if self.queues.is_empty() {
            self.queues
                .insert(crate::DEFAULT_QUEUE.to_string(), DEFAULT_CONCURRENCY);
        }
        // A handled kind's default queue always runs here, or its jobs would wait forever.
        for k in self.kinds.values().filter(|k| k.handler.is_some()) {
            self.queues
                .entry(k.queue.clone())
                .or_insert(DEFAULT_CONCURRENCY);
        }
        let owner = format!(
            "{}:{}:{:08x}",
            processes::host_name(),
            std::process::id(),
            rand::random::<u32>()
        );
        let binders = std::mem::take(&mut self.binders);
        let shared = Shared {
            lines: std::mem::take(&mut self.lines),
            outage: OutageLog::default(),
            store: self.store,
            clock: self.clock,
            kinds: self.kinds.into_iter().collect(),
            queues: self.queues,
            periodics: self.periodics,
            options: self.options,
            hub: Hub::default(),
            intakes: Default::default(),
            owner,
            pull_seen: Default::default(),
            skew: skew::Skew::default(),
            budgets: Default::default(),
            unwritten: std::sync::atomic::AtomicUsize::new(0),
        };
        for q in shared.queues.keys() {
            shared.hub.queue(q);
        }
        let onus = Onus {
            shared: Arc::new(shared),
        };
        for b in binders {
            (b.0)(onus.client());
        }
        Ok(onus)
    }
}

/// A built runtime. [`Onus::client`] inserts and manages jobs; [`Onus::start`] runs the workers.
///
/// ```
/// use std::time::Duration;
/// use onus::{JobArgs, JobContext, JobResult, NewJob, Onus};
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Greet { name: String }
/// impl JobArgs for Greet { const KIND: &'static str = "greet"; }
///
/// async fn greet(_ctx: JobContext, args: Greet) -> JobResult {
///     println!("hello, {}", args.name);
///     Ok(())
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let url = format!("sqlite://{}", dir.path().join("onus.db").display());
/// let store = onus::open(&url).await?;
/// let onus = Onus::builder(store).register(greet).queue("default", 4).build()?;
/// let client = onus.client();
/// let job = client.insert(NewJob::of(&Greet { name: "Ada".into() })?).await?.job;
/// let running = onus.start();
/// let done = client.wait_for(job.id, |j| j.state.is_finished(), Duration::from_secs(5)).await?;
/// assert_eq!(done.state, onus::JobState::Completed);
/// running.shutdown(Duration::from_secs(5)).await;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Onus {
    pub(crate) shared: Arc<Shared>,
}

impl Onus {
    /// Starts setting up a runtime on `store`.
    pub fn builder(store: Arc<dyn Store>) -> Builder {
        Builder {
            store,
            lines: Vec::new(),
            binders: Vec::new(),
            clock: Arc::new(SystemClock),
            kinds: BTreeMap::new(),
            queues: BTreeMap::new(),
            periodics: Vec::new(),
            overrides: Vec::new(),
            budgets: Vec::new(),
            options: Options::default(),
        }
    }

    /// A client sharing this runtime's store, clock, kinds and wake-ups.
    pub fn client(&self) -> Client {
        Client {
            shared: self.shared.clone(),
        }
    }

    /// The migration lines of the job layer and of every registered component.
    pub fn migrations(&self) -> Vec<&'static crate::sql::Line> {
        crate::store::with_jobs(&self.shared.lines)
    }

    /// Applies the pending migrations of the job layer and of every registered component, under
    /// one lock; returns what it applied.
    pub async fn migrate(&self) -> Result<Vec<crate::sql::Applied>, crate::StoreError> {
        self.shared.store.migrate(&self.migrations()).await
    }

    /// Refuses a database whose tables are not at the versions this build knows, saying what to
    /// do (for processes started without migrating).
    pub async fn check_migrations(&self) -> Result<(), crate::StoreError> {
        let status = self.shared.store.migrations(&self.migrations()).await?;
        if let Some(l) = status.iter().find(|l| l.is_ahead()) {
            return Err(crate::StoreError::Open(format!(
                "the database's {} tables are at version {}, newer than this Onus knows ({}); upgrade Onus",
                l.line, l.version, l.latest
            )));
        }
        let behind: Vec<String> = status
            .iter()
            .filter(|l| !l.is_current())
            .map(|l| format!("{} {} -> {}", l.line, l.version, l.latest))
            .collect();
        if behind.is_empty() {
            Ok(())
        } else {
            Err(crate::StoreError::Open(format!(
                "the database needs migrations ({}); run `onus migrate` first",
                behind.join(", ")
            )))
        }
    }

    /// A kind by name.
    pub fn kind(&self, name: &str) -> Option<&Kind> {
        self.shared.kinds.get(name)
    }

    /// Every kind it knows, by name.
    pub fn kinds(&self) -> impl Iterator<Item = &Kind> {
        let mut v: Vec<&Kind> = self.shared.kinds.values().collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v.into_iter()
    }

    /// The identity this process leases jobs under.
    pub fn owner(&self) -> &str {
        &self.shared.owner
    }

    /// The database's clock minus this process's, as last measured (by the rescuer, at start and
    /// every rescue interval); `None` before the first measurement or for a manual clock.
    pub fn database_clock_offset(&self) -> Option<chrono::TimeDelta> {
        self.shared.skew.latest().map(|r| r.offset)
    }

    /// Starts the workers and maintenance loops. Needs a Tokio runtime.
    pub fn start(&self) -> Running {
        let shared = self.shared.clone();
        let stop = CancellationToken::new();
        let hard = CancellationToken::new();
        let tracker = TaskTracker::new();
        let (finish_tx, finish_rx) = mpsc::unbounded_channel::<attempt::QueuedOutcome>();
        let abandon = CancellationToken::new();
        let finisher = tokio::spawn(finisher::finisher(
            shared.clone(),
            finish_rx,
            abandon.clone(),
        ));
        let mut tasks = Vec::new();
        if !shared.handled_kinds().is_empty() {
            for (q, conc) in &shared.queues {
                tasks.push(tokio::spawn(producer::run_queue(
                    shared.clone(),
                    q.clone(),
                    *conc,
                    stop.clone(),
                    hard.clone(),
                    tracker.clone(),
                    finish_tx.clone(),
                )));
            }
        }
        tasks.push(tokio::spawn(maintenance::rescuer(
            shared.clone(),
            stop.clone(),
            finish_tx.clone(),
        )));
        tasks.push(tokio::spawn(maintenance::leader(
            shared.clone(),
            stop.clone(),
        )));
        tasks.push(tokio::spawn(maintenance::notices(
            shared.clone(),
            stop.clone(),
        )));
        let heartbeat_stop = CancellationToken::new();
        let heartbeat = tokio::spawn(maintenance::heartbeat(
            shared.clone(),
            heartbeat_stop.clone(),
        ));
        // Listed as there until its jobs are handed back or written: it stops with the heartbeat.
        let presence = tokio::spawn(processes::presence(shared.clone(), heartbeat_stop.clone()));
        drop(finish_tx);
        Running {
            shared,
            stop,
            hard,
            tracker,
            tasks,
            finisher,
            abandon,
            heartbeat,
            heartbeat_stop,
            presence,
        }
    }
}

/// The workers of a started runtime. Stop them with [`Running::shutdown`].
#[derive(Debug)]
pub struct Running {
    shared: Arc<Shared>,
    stop: CancellationToken,
    hard: CancellationToken,
    tracker: TaskTracker,
    tasks: Vec<JoinHandle<()>>,
    finisher: JoinHandle<()>,
    abandon: CancellationToken,
    heartbeat: JoinHandle<()>,
    heartbeat_stop: CancellationToken,
    presence: JoinHandle<()>,
}

/// How long shutdown waits, after the grace period, for outcomes to be written.
const WRITE_BACK: Duration = Duration::from_secs(5);
/// How long shutdown waits for each remaining step (aborted handlers, leadership) when the
/// database hangs.
const STEP: Duration = Duration::from_secs(1);

impl Running {
    /// Stops claiming, lets running jobs finish for up to `grace`, then hands every unfinished job
    /// back (due now, its attempt given back), records every outcome, and gives up leadership.
    ///
    /// Bounded even when the database hangs: it returns within `grace` plus about 7 s (5 s to
    /// write outcomes, a second each for the last steps). An outcome not written by then is left
    /// to the rescuer, which finds the job by its expired lease.
    pub async fn shutdown(self, grace: Duration) {
        let deadline = tokio::time::Instant::now() + grace;
        self.stop.cancel();
        for mut t in self.tasks {
            // A loop stuck in a store call that hangs is stopped at the deadline.
            if tokio::time::timeout_at(deadline, &mut t).await.is_err() {
                t.abort();
            }
        }
        self.tracker.close();
        if tokio::time::timeout_at(deadline, self.tracker.wait())
            .await
            .is_err()
        {
            tracing::info!(
                running = self.shared.hub.held_count(),
                "grace period over; handing unfinished jobs back"
            );
            self.hard.cancel();
            let _ = tokio::time::timeout(STEP, self.tracker.wait()).await;
        }
        let mut finisher = self.finisher;
        if tokio::time::timeout(WRITE_BACK, &mut finisher)
            .await
            .is_err()
        {
            tracing::error!(
                "outcomes not written within {}; leaving them to the rescuer",
                policy::human(WRITE_BACK)
            );
            self.abandon.cancel();
            if tokio::time::timeout(STEP, &mut finisher).await.is_err() {
                finisher.abort();
            }
        }
        self.heartbeat_stop.cancel();
        let mut heartbeat = self.heartbeat;
        if tokio::time::timeout(STEP, &mut heartbeat).await.is_err() {
            heartbeat.abort();
        }
        // Its presence removed (bounded by its own second).
        let mut presence = self.presence;
        if tokio::time::timeout(STEP * 2, &mut presence).await.is_err() {
            presence.abort();
        }
        for name in [maintenance::LEADER, maintenance::PERIODIC_LEADER] {
            let _ = tokio::time::timeout(STEP, self.shared.store.resign(name, &self.shared.owner))
                .await;
        }
    }

    /// Runs until SIGINT or SIGTERM, then shuts down with `grace`.
    pub async fn run_until_signal(self, grace: Duration) {
        wait_for_signal().await;
        tracing::info!("stopping: finishing running jobs");
        self.shutdown(grace).await;
    }
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
