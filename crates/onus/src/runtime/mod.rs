//! The runtime: a client to insert and manage jobs, workers that claim and run them, and the
//! maintenance loops (heartbeat, rescuer, leader election, periodic jobs, retention).
//!
//! The runtime is the only code that turns a handler's answer into the next state, through
//! [`crate::outcome::decide`] and the kind's [`Policy`](crate::Policy).

mod client;
mod kind;
mod maintenance;
mod periodic;
mod worker;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use client::{Client, Error};
pub use kind::{Handler, HandlerFuture, JobContext, Kind};
pub(crate) use periodic::{name_of as periodic_name_of, unique_key as periodic_unique_key};
pub use periodic::{Periodic, Schedule};

use crate::clock::{Clock, SystemClock};
use crate::job::{JobArgs, JobId};
use crate::outcome::JobResult;
use crate::policy::PolicyOverride;
use crate::store::{Finish, Retention, Store};

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
    /// Most jobs claimed in one statement.
    pub claim_batch: usize,
    /// Periodic periods that came due within this window are each enqueued (a leader failover
    /// skips none); after a longer outage only the latest missed period is.
    pub periodic_catch_up: Duration,
    /// How long a cancelled handler may take to return before it is dropped.
    pub cancel_grace: Duration,
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
            claim_batch: 100,
            periodic_catch_up: Duration::from_secs(60),
            cancel_grace: Duration::from_secs(5),
        }
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
pub(crate) struct Trouble(std::sync::atomic::AtomicBool);

impl Trouble {
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

/// In-process signals shared by the client and the workers.
#[derive(Debug)]
pub(crate) struct Hub {
    queues: Mutex<HashMap<String, Arc<Notify>>>,
    running: Mutex<HashMap<JobId, CancellationToken>>,
    /// Bumped when this process lost contact with the database for longer than a lease: every
    /// running attempt is dropped without an outcome, since another process may rescue it.
    fence: tokio::sync::watch::Sender<u64>,
}

impl Default for Hub {
    fn default() -> Self {
        Hub {
            queues: Mutex::default(),
            running: Mutex::default(),
            fence: tokio::sync::watch::Sender::new(0),
        }
    }
}

impl Hub {
    pub(crate) fn queue(&self, name: &str) -> Arc<Notify> {
        let mut q = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        q.entry(name.to_string()).or_default().clone()
    }

    /// Tells the workers of `queue` that a job may be due.
    pub(crate) fn wake(&self, queue: &str) {
        let q = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = q.get(queue) {
            n.notify_one();
        }
    }

    pub(crate) fn wake_all(&self) {
        let q = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        for n in q.values() {
            n.notify_one();
        }
    }

    pub(crate) fn cancel_running(&self, id: JobId) -> bool {
        let r = self.running.lock().unwrap_or_else(|e| e.into_inner());
        match r.get(&id) {
            Some(t) => {
                t.cancel();
                true
            }
            None => false,
        }
    }

    fn running_ids(&self) -> usize {
        self.running.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Marks a claimed job as running in this process; returns its cancellation token.
    pub(crate) fn register(&self, id: JobId) -> CancellationToken {
        let t = CancellationToken::new();
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, t.clone());
        t
    }

    pub(crate) fn unregister(&self, id: JobId) {
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    }

    pub(crate) fn is_running(&self, id: JobId) -> bool {
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&id)
    }

    pub(crate) fn fence_subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.fence.subscribe()
    }

    /// Drops every running attempt without an outcome (see `fence`).
    pub(crate) fn fence_all(&self) {
        self.fence.send_modify(|n| *n += 1);
    }
}

pub(crate) struct Shared {
    pub(crate) trouble: Trouble,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) kinds: HashMap<String, Kind>,
    pub(crate) queues: BTreeMap<String, usize>,
    pub(crate) periodics: Vec<Periodic>,
    pub(crate) options: Options,
    pub(crate) hub: Hub,
    pub(crate) owner: String,
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

/// Sets up a runtime: kinds, queues, periodic jobs, clock and options.
#[derive(Debug)]
pub struct Builder {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    kinds: BTreeMap<String, Kind>,
    queues: BTreeMap<String, usize>,
    periodics: Vec<Periodic>,
    overrides: Vec<(String, PolicyOverride)>,
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

    /// Overrides a kind's policy from configuration.
    pub fn policy_override(mut self, kind: impl Into<String>, o: PolicyOverride) -> Self {
        self.overrides.push((kind.into(), o));
        self
    }

    /// Replaces the tuning options.
    pub fn options(mut self, o: Options) -> Self {
        self.options = o;
        self
    }

    /// Checks the set-up and builds the runtime (not started yet).
    pub fn build(mut self) -> Result<Onus, BuildError> {
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
        for k in self.kinds.values() {
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
            std::env::var("HOSTNAME").unwrap_or_else(|_| "onus".into()),
            std::process::id(),
            rand::random::<u32>()
        );
        let shared = Shared {
            trouble: Trouble::default(),
            store: self.store,
            clock: self.clock,
            kinds: self.kinds.into_iter().collect(),
            queues: self.queues,
            periodics: self.periodics,
            options: self.options,
            hub: Hub::default(),
            owner,
        };
        for q in shared.queues.keys() {
            shared.hub.queue(q);
        }
        Ok(Onus {
            shared: Arc::new(shared),
        })
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
            clock: Arc::new(SystemClock),
            kinds: BTreeMap::new(),
            queues: BTreeMap::new(),
            periodics: Vec::new(),
            overrides: Vec::new(),
            options: Options::default(),
        }
    }

    /// A client sharing this runtime's store, clock, kinds and wake-ups.
    pub fn client(&self) -> Client {
        Client {
            shared: self.shared.clone(),
        }
    }

    /// A kind by name.
    pub fn kind(&self, name: &str) -> Option<&Kind> {
        self.shared.kinds.get(name)
    }

    /// The identity this process leases jobs under.
    pub fn owner(&self) -> &str {
        &self.shared.owner
    }

    /// Starts the workers and maintenance loops. Needs a Tokio runtime.
    pub fn start(&self) -> Running {
        let shared = self.shared.clone();
        let stop = CancellationToken::new();
        let hard = CancellationToken::new();
        let tracker = TaskTracker::new();
        let (finish_tx, finish_rx) = mpsc::unbounded_channel::<Finish>();
        let finisher = tokio::spawn(worker::finisher(shared.clone(), finish_rx));
        let mut tasks = Vec::new();
        if !shared.handled_kinds().is_empty() {
            for (q, conc) in &shared.queues {
                tasks.push(tokio::spawn(worker::run_queue(
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
        drop(finish_tx);
        Running {
            shared,
            stop,
            hard,
            tracker,
            tasks,
            finisher,
            heartbeat,
            heartbeat_stop,
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
    heartbeat: JoinHandle<()>,
    heartbeat_stop: CancellationToken,
}

impl Running {
    /// Stops claiming, lets running jobs finish for up to `grace`, then hands every unfinished job
    /// back (due now, its attempt given back), records every outcome, and gives up leadership.
    pub async fn shutdown(self, grace: Duration) {
        self.stop.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
        self.tracker.close();
        if tokio::time::timeout(grace, self.tracker.wait())
            .await
            .is_err()
        {
            tracing::info!(
                running = self.shared.hub.running_ids(),
                "grace period over; handing unfinished jobs back"
            );
            self.hard.cancel();
            self.tracker.wait().await;
        }
        let _ = self.finisher.await;
        self.heartbeat_stop.cancel();
        let _ = self.heartbeat.await;
        for name in [maintenance::LEADER, maintenance::PERIODIC_LEADER] {
            let _ = self.shared.store.resign(name, &self.shared.owner).await;
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
