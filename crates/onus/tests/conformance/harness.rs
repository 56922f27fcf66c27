//! The conformance harness: every test runs against each storage backend from one source.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use onus::{Builder, Job, JobFilter, JobId, JobState, ManualClock, Onus, Options, Store};

pub use onus_testkit::Backend;

/// One test's world: a fresh database, a manual clock, fast maintenance intervals.
pub struct Env {
    pub url: String,
    pub store: Arc<dyn Store>,
    pub clock: ManualClock,
    _db: onus_testkit::TestDb,
}

pub const DEADLINE: Duration = Duration::from_secs(20);

impl Env {
    pub async fn new(backend: Backend) -> Env {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_env("ONUS_TEST_LOG")
                    .unwrap_or_else(|_| "off".into()),
            )
            .with_test_writer()
            .try_init();
        let db = onus_testkit::TestDb::new(backend).await;
        let url = db.url.clone();
        let store = onus::open(&url).await.expect("open store");
        let clock = ManualClock::at("2026-03-01T00:00:00Z".parse().expect("time"));
        Env {
            url,
            store,
            clock,
            _db: db,
        }
    }

    /// A second, independent connection to the same database (as another process would have).
    pub async fn reopen(&self) -> Arc<dyn Store> {
        onus::open(&self.url).await.expect("reopen store")
    }

    /// A runtime builder on this env's store and clock, with fast intervals.
    pub fn builder(&self) -> Builder {
        Onus::builder(self.store.clone())
            .clock(self.clock.clone())
            .options(fast_options())
    }

    /// A client with no kinds registered (default policies).
    pub fn client(&self) -> onus::Client {
        self.builder().build().expect("build").client()
    }

    pub async fn job(&self, id: JobId) -> Job {
        self.store.get(id).await.expect("get").expect("job exists")
    }

    /// Waits until job `id` satisfies `f`, failing the test after the deadline.
    pub async fn wait_job(&self, id: JobId, what: &str, f: impl Fn(&Job) -> bool) -> Job {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let j = self.job(id).await;
            if f(&j) {
                return j;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "job {id} never reached: {what}; it is {} attempt {}/{} errors {:?}",
                j.state,
                j.attempt,
                j.max_attempts,
                j.errors
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    pub async fn wait_state(&self, id: JobId, state: JobState) -> Job {
        self.wait_job(id, &format!("state {state}"), |j| j.state == state)
            .await
    }

    pub async fn count(&self, state: JobState) -> usize {
        let f = JobFilter {
            states: vec![state],
            ..Default::default()
        };
        self.store
            .list(&f, 1_000_000, None)
            .await
            .expect("list")
            .len()
    }
}

pub fn fast_options() -> Options {
    Options {
        poll_interval: Duration::from_millis(100),
        heartbeat_interval: Duration::from_millis(100),
        rescue_interval: Duration::from_millis(100),
        maintenance_interval: Duration::from_millis(50),
        prune_interval: Duration::from_millis(100),
        cancel_grace: Duration::from_secs(2),
        ..Options::default()
    }
}

/// Waits until `f` returns true, failing the test with `what` after the deadline.
pub async fn wait_until<F, Fut>(what: &str, f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    wait_until_within(what, DEADLINE, f).await
}

/// [`wait_until`] with its own deadline, for waits on many processes' work (a test binary built
/// for debugging, on a shared machine, drains a few hundred jobs a second there).
pub async fn wait_until_within<F, Fut>(what: &str, within: Duration, f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    onus_testkit::wait_until(what, within, f).await
}

impl Env {
    pub fn clock_now(&self) -> onus::Timestamp {
        use onus::Clock;
        self.clock.now()
    }
}

/// Inserts `job` and returns its id.
pub async fn insert_id(client: &onus::Client, job: onus::NewJob) -> JobId {
    client.insert(job).await.expect("insert").job.id
}

/// Runs this test binary again as a child process in `mode` (see `child_worker_process`), its
/// stdout as given.
pub fn spawn_child(
    url: &str,
    mode: &str,
    index: usize,
    stdout: std::process::Stdio,
) -> tokio::process::Child {
    tokio::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "child_worker_process",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("ONUS_CHILD_URL", url)
        .env("ONUS_CHILD_MODE", mode)
        .env("ONUS_CHILD_INDEX", index.to_string())
        .stdout(stdout)
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the child process")
}

/// A handler body that counts how many run at once: `now` in flight, `max` ever.
pub async fn gauged(
    now: &std::sync::atomic::AtomicUsize,
    max: &std::sync::atomic::AtomicUsize,
) -> onus::JobResult {
    use std::sync::atomic::Ordering;
    let c = now.fetch_add(1, Ordering::SeqCst) + 1;
    max.fetch_max(c, Ordering::SeqCst);
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    now.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}
