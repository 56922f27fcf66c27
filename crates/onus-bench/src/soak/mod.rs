//! The soak: real `onus serve` processes doing every kind of outbound work while things break,
//! then the invariants that must hold whatever broke.
//!
//! Several processes share one throwaway PostgreSQL cluster and one process has a SQLite file to
//! itself. Policies are overridden to short schedules (4 attempts 1 s apart, 1 s timeouts, 3 s
//! leases) so that every job ends within the run. The driver publishes events to endpoints of
//! several tenants on a chaos sink (every answer an endpoint can give, drawn from a seed), inserts
//! `http.request`, push and pull jobs through the API and answers the pull jobs itself, and
//! meanwhile SIGKILLs a random server process every few seconds and starts it again, restarts
//! PostgreSQL once and terminates database connections at random. One PostgreSQL process runs its
//! clock 30 s ahead (the `clock_offset` setting, meant for such drills). Then the faults stop,
//! every job is given a bounded time to end, and the invariants are counted.
//!
//! [`run`] is the scenario; `onus-bench soak --minutes N` and the test suite's short run call it.

mod invariants;
mod load;
mod world;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use onus::Job;
use onus_testkit::PgCluster;

use invariants::{check, Counters};
use world::{all_jobs, chaos, config, unfinished, Deployment, Proc, Tally, World};

/// What a soak runs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The `onus` binary.
    pub onus: PathBuf,
    /// How long the load and the faults last.
    pub faults_for: Duration,
    /// The longest the drain may take (every job ended) once the faults stop.
    pub drain_within: Duration,
    /// The seed of every random choice (the sink's answers, the faults, the pull workers').
    pub seed: u64,
    /// `onus serve` processes on PostgreSQL (the last one runs its clock 30 s ahead).
    pub pg_processes: usize,
    /// Events published per second, per deployment.
    pub events_per_s: f64,
    /// Jobs inserted per second, per deployment (http.request, push and pull in turn).
    pub jobs_per_s: f64,
    /// Where the processes' configuration and logs go (a temporary directory when `None`).
    pub dir: Option<PathBuf>,
}

impl Settings {
    /// A soak of `faults_for`, the rest at its defaults.
    pub fn new(onus: PathBuf, faults_for: Duration) -> Settings {
        Settings {
            onus,
            faults_for,
            drain_within: Duration::from_secs(120),
            seed: 1,
            pg_processes: 3,
            events_per_s: 6.0,
            jobs_per_s: 8.0,
            dir: None,
        }
    }
}

/// One invariant and how it fared.
#[derive(Debug, Clone)]
pub struct Invariant {
    /// What must hold.
    pub name: &'static str,
    /// How many things were checked.
    pub checked: u64,
    /// What broke it (empty when it held).
    pub violations: Vec<String>,
}

/// What a soak did and found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Figures of the run, in order.
    pub figures: Vec<(String, u64)>,
    /// Every invariant with its count.
    pub invariants: Vec<Invariant>,
    /// How long the drain took.
    pub drain: Duration,
}

impl Report {
    /// A figure by its name (0 when absent).
    pub fn figure(&self, name: &str) -> u64 {
        self.figures
            .iter()
            .find(|(k, _)| k == name)
            .map_or(0, |(_, v)| *v)
    }

    /// Whether every invariant held.
    pub fn held(&self) -> bool {
        self.invariants.iter().all(|i| i.violations.is_empty())
    }

    /// The report as text: figures, then each invariant with its count and its first violations.
    pub fn text(&self) -> String {
        let mut out = String::from("soak figures\n");
        for (k, v) in &self.figures {
            out.push_str(&format!("  {k:<44} {v:>9}\n"));
        }
        out.push_str(&format!(
            "  {:<44} {:>9.1}\n",
            "drain, seconds",
            self.drain.as_secs_f64()
        ));
        out.push_str("invariants (violations / checked)\n");
        for i in &self.invariants {
            let mark = if i.violations.is_empty() {
                "ok  "
            } else {
                "FAIL"
            };
            out.push_str(&format!(
                "  {mark} {:<62} {} / {}\n",
                i.name,
                i.violations.len(),
                i.checked
            ));
            for v in i.violations.iter().take(5) {
                out.push_str(&format!("         {v}\n"));
            }
        }
        out
    }
}

/// A mutex's guard, whether or not a holder panicked (the records stay readable).
trait Locked<T> {
    fn locked(&self) -> std::sync::MutexGuard<'_, T>;
}

impl<T> Locked<T> for Mutex<T> {
    fn locked(&self) -> std::sync::MutexGuard<'_, T> {
        self.lock().unwrap_or_else(|e| e.into_inner())
    }
}

const TOKEN: &str = "onus_soak_token_0123456789abcdefghijklmnopqrstuv";
const PULL: &str = "soak.pull";
const PUSH: &str = "soak.push";
/// The pull kind's lease (its timeout).
const PULL_LEASE: Duration = Duration::from_secs(3);
/// How much of a pull lease may have passed before the soak saw the claim's answer.
const LEASE_SLACK: Duration = Duration::from_secs(1);

/// Runs the soak and reports; an error means the scenario itself could not run (a process that
/// would not start, PostgreSQL missing), not a broken invariant.
pub async fn run(s: Settings) -> Result<Report, String> {
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let dir = s.dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let sink = chaos(s.seed).start().await;
    let pg = Arc::new(
        tokio::task::spawn_blocking(PgCluster::start)
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("cannot start PostgreSQL: {e}"))?,
    );
    let pg_url = pg
        .fresh_database()
        .await
        .map_err(|e| format!("cannot make the database: {e}"))?;
    let sqlite_url = format!("sqlite://{}", dir.join("soak.db").display());
    let deps = vec![
        Deployment::new("pg", &pg_url, &["t1", "t2", "t3"], 8),
        Deployment::new("sqlite", &sqlite_url, &["s1", "s2"], 6),
    ];
    let mut procs = Vec::new();
    for i in 0..s.pg_processes {
        let skewed = s.pg_processes > 1 && i == s.pg_processes - 1;
        procs.push(Proc::new(&dir, 0, &format!("pg-{i}"), skewed));
    }
    procs.push(Proc::new(&dir, 1, "sqlite-0", false));
    for p in &procs {
        let d = &deps[p.dep];
        std::fs::write(&p.config, config(d, &sink, p.skewed)).map_err(|e| e.to_string())?;
    }
    let world = Arc::new(World {
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| e.to_string())?,
        onus: s.onus.clone(),
        deps,
        procs: procs.into_iter().map(Mutex::new).collect(),
        stop_load: AtomicBool::new(false),
        stop_all: AtomicBool::new(false),
        tally: Tally::default(),
        pull: Mutex::default(),
        acked_jobs: Mutex::default(),
        acked_events: Mutex::default(),
        sent_events: Mutex::default(),
        seq: AtomicU64::new(0),
    });
    // Start every process, one after the other, then the endpoints.
    for i in 0..world.procs.len() {
        world.start(i).await?;
    }
    for d in 0..world.deps.len() {
        world.make_endpoints(d, &sink).await?;
    }
    eprintln!(
        "soak: {} processes up, {} endpoints; faults for {} s (seed {})",
        world.procs.len(),
        world
            .deps
            .iter()
            .map(|d| d.endpoints().len())
            .sum::<usize>(),
        s.faults_for.as_secs(),
        s.seed
    );

    // Load and faults.
    let mut tasks = tokio::task::JoinSet::new();
    let mut drain_tasks = tokio::task::JoinSet::new();
    for d in 0..world.deps.len() {
        let w = world.clone();
        let every = Duration::from_secs_f64(1.0 / s.events_per_s);
        let seed = s.seed ^ ((d as u64 + 1) * 0x9e37);
        tasks.spawn(async move { w.publish(d, every, seed).await });
        let w = world.clone();
        let every = Duration::from_secs_f64(1.0 / s.jobs_per_s);
        let url = sink.url("");
        tasks.spawn(async move { w.insert_jobs(d, every, seed, &url).await });
        for k in 0..2u64 {
            let w = world.clone();
            drain_tasks.spawn(async move { w.pull_worker(d, seed ^ ((k + 7) * 0x51ed)).await });
        }
    }
    {
        let w = world.clone();
        let seed = s.seed;
        tasks.spawn(async move { w.killer(seed).await });
    }
    {
        let w = world.clone();
        let url = pg_url.clone();
        let seed = s.seed;
        tasks.spawn(async move { w.terminator(&url, seed).await });
    }
    // PostgreSQL restarts once, halfway through.
    tokio::time::sleep(s.faults_for / 2).await;
    {
        let p = pg.clone();
        tokio::task::spawn_blocking(move || {
            p.stop()?;
            p.restart()
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("cannot restart PostgreSQL: {e}"))?;
        world.tally.add("PostgreSQL restarts", 1);
    }
    tokio::time::sleep(s.faults_for - s.faults_for / 2).await;
    world.stop_load.store(true, Ordering::SeqCst);
    while let Some(r) = tasks.join_next().await {
        r.map_err(|e| e.to_string())??;
    }
    // Every process up for the drain.
    for i in 0..world.procs.len() {
        if world.base(i).is_none() {
            world.start(i).await?;
        }
    }

    // Drain: every job ends.
    eprintln!("soak: faults stopped; draining");
    let stores = vec![
        onus::open(&pg_url).await.map_err(|e| e.to_string())?,
        onus::open(&sqlite_url).await.map_err(|e| e.to_string())?,
    ];
    let drain_started = Instant::now();
    loop {
        let mut open = 0;
        for st in &stores {
            open += unfinished(st.as_ref()).await?;
        }
        if open == 0 {
            break;
        }
        if drain_started.elapsed() > s.drain_within {
            eprintln!(
                "soak: {open} jobs still open after {} s",
                s.drain_within.as_secs()
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let drain = drain_started.elapsed();
    world.stop_all.store(true, Ordering::SeqCst);
    while let Some(r) = drain_tasks.join_next().await {
        r.map_err(|e| e.to_string())??;
    }
    // The counters of every process, then the processes go.
    let mut metrics = Vec::new();
    for i in 0..world.procs.len() {
        let name = world.procs[i].locked().name.clone();
        let skewed = world.procs[i].locked().skewed;
        if let Some(base) = world.base(i) {
            let text = world
                .http
                .get(format!("{base}/metrics"))
                .bearer_auth(TOKEN)
                .send()
                .await
                .map_err(|e| e.to_string())?
                .text()
                .await
                .map_err(|e| e.to_string())?;
            let _ = std::fs::write(dir.join(format!("{name}.metrics")), &text);
            metrics.push((name, skewed, Counters::parse(&text)));
        }
    }
    for i in 0..world.procs.len() {
        world.kill(i).await;
    }

    // Checks.
    let mut jobs: Vec<Vec<Job>> = Vec::new();
    for st in &stores {
        jobs.push(all_jobs(st.as_ref()).await?);
    }
    let received = sink.received();
    let mut report = check(&world, &jobs, &received, &sink, &metrics, drain);
    report.figures.insert(0, ("seed".into(), s.seed));
    report
        .figures
        .insert(1, ("faults, seconds".into(), s.faults_for.as_secs()));
    drop(pg);
    Ok(report)
}
