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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use onus::{EntryClass, Job, JobFilter, JobState, Store};
use onus_testkit::chaos::{Behaviour, Chaos, Mix};
use onus_testkit::sink::{HttpSink, Received};
use onus_testkit::PgCluster;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

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

/// The chaos sink's script: endpoints never answer 410 except the `/gone/` ones (a 410 disables
/// an endpoint, and the run needs endpoints), everything else draws from the whole mix.
fn chaos(seed: u64) -> Chaos {
    let hooks = |gone: u32| {
        Mix::new(&[
            (Behaviour::Ok, 60),
            (Behaviour::ServerError, 10),
            (Behaviour::RequestTimeout, 3),
            (Behaviour::TooMany, 3),
            (Behaviour::TooManyAfter(1), 5),
            (Behaviour::UnavailableAfter(1), 3),
            (Behaviour::Gone, gone),
            (Behaviour::Hang(Duration::from_secs(3600)), 3),
            (Behaviour::Reset, 5),
            (Behaviour::Slow(Duration::from_millis(300)), 8),
        ])
    };
    Chaos::new(seed)
        .rule("/hook/", hooks(0))
        .rule("/gone/", hooks(2))
        .otherwise(Mix::default())
}

/// One database and the endpoints on it.
struct Deployment {
    name: &'static str,
    url: String,
    tenants: Vec<&'static str>,
    per_tenant: usize,
    /// Path to (tenant, secret).
    endpoints: Mutex<BTreeMap<String, (String, String)>>,
    /// Endpoint id to path.
    ids: Mutex<HashMap<String, String>>,
}

impl Deployment {
    fn new(name: &'static str, url: &str, tenants: &[&'static str], per_tenant: usize) -> Self {
        Deployment {
            name,
            url: url.to_string(),
            tenants: tenants.to_vec(),
            per_tenant,
            endpoints: Mutex::default(),
            ids: Mutex::default(),
        }
    }

    fn endpoints(&self) -> BTreeMap<String, (String, String)> {
        self.endpoints.locked().clone()
    }
}

fn config(d: &Deployment, sink: &HttpSink, skewed: bool) -> String {
    let policy = |timeout: &str| {
        format!("max_attempts = 4\nbackoff = {{ schedule = [\"1s\"] }}\njitter = 0.1\ntimeout = \"{timeout}\"\nalert_on_exhaustion = false\n")
    };
    let mut c = format!(
        "database_url = \"{url}\"\napi_token = \"{TOKEN}\"\nlease_ttl = \"3s\"\n",
        url = d.url
    );
    if skewed {
        c.push_str("clock_offset = \"30s\"\n");
    }
    c.push_str(&format!(
        "[queues]\ndefault = 8\n\
         [webhooks]\ntimeout = \"1s\"\ncooldown = \"1s\"\nallow_networks = [\"127.0.0.1/32\"]\n\
         [http]\ntimeout = \"1s\"\nallow_networks = [\"127.0.0.1/32\"]\n\
         [kinds.\"webhook.fanout\".policy]\n{deliver}\
         [kinds.\"webhook.deliver\".policy]\n{deliver}\
         [kinds.\"http.request\".policy]\n{http}\
         [kinds.\"{PUSH}\"]\nurl = \"{push}\"\ntimeout = \"1s\"\n\
         [kinds.\"{PUSH}\".policy]\n{push_policy}\
         [kinds.\"{PULL}\"]\n\
         [kinds.\"{PULL}\".policy]\n{pull}",
        deliver = policy("5s"),
        http = policy("5s"),
        push = sink.url(&format!("/push/{}", d.name)),
        push_policy = policy("5s"),
        pull = policy(&format!("{}s", PULL_LEASE.as_secs())),
    ));
    c
}

/// One server process (its current incarnation).
struct Proc {
    dep: usize,
    name: String,
    config: PathBuf,
    log: PathBuf,
    skewed: bool,
    port: u16,
    base: Option<String>,
    child: Option<tokio::process::Child>,
}

impl Proc {
    fn new(dir: &Path, dep: usize, name: &str, skewed: bool) -> Proc {
        Proc {
            dep,
            name: name.to_string(),
            config: dir.join(format!("{name}.toml")),
            log: dir.join(format!("{name}.log")),
            skewed,
            port: 0,
            base: None,
            child: None,
        }
    }
}

/// Counts of what happened, by name.
#[derive(Default)]
struct Tally(Mutex<BTreeMap<String, u64>>);

impl Tally {
    fn add(&self, k: &str, n: u64) {
        *self.0.locked().entry(k.to_string()).or_default() += n;
    }
    fn get(&self, k: &str) -> u64 {
        self.0.locked().get(k).copied().unwrap_or(0)
    }
}

/// The driver's own record of the pull jobs it holds.
#[derive(Default)]
struct PullBook {
    /// Job (deployment, id) to when it was claimed and whether it was answered since.
    held: HashMap<(usize, i64), (Instant, bool)>,
    /// Jobs handed out while an earlier claim of them was still leased and unanswered.
    twice: Vec<String>,
    claims: u64,
}

struct World {
    http: reqwest::Client,
    onus: PathBuf,
    deps: Vec<Deployment>,
    procs: Vec<Mutex<Proc>>,
    stop_load: AtomicBool,
    stop_all: AtomicBool,
    tally: Tally,
    pull: Mutex<PullBook>,
    /// Jobs whose insert was answered with their id: (deployment, id).
    acked_jobs: Mutex<Vec<(usize, i64)>>,
    /// Events whose publication was answered: (deployment, id).
    acked_events: Mutex<Vec<(usize, String)>>,
    /// Every event id published, answered or not.
    sent_events: Mutex<HashSet<String>>,
    seq: AtomicU64,
}

impl World {
    fn base(&self, i: usize) -> Option<String> {
        self.procs[i].locked().base.clone()
    }

    /// A process of deployment `d` that is up, at random (`skewed` too or not).
    fn pick(&self, d: usize, rng: &mut StdRng) -> Option<String> {
        let up: Vec<String> = self
            .procs
            .iter()
            .filter_map(|p| {
                let p = p.locked();
                (p.dep == d).then(|| p.base.clone()).flatten()
            })
            .collect();
        (!up.is_empty()).then(|| up[rng.gen_range(0..up.len())].clone())
    }

    /// Starts process `i` and waits until it answers `/healthz`. A process that exits at start
    /// (its database is restarting, or its port was taken meanwhile) is started again, for up to
    /// a minute in all.
    async fn start(&self, i: usize) -> Result<(), String> {
        let until = Instant::now() + Duration::from_secs(60);
        while Instant::now() < until {
            let (config, log, name, mut port) = {
                let p = self.procs[i].locked();
                (p.config.clone(), p.log.clone(), p.name.clone(), p.port)
            };
            if port == 0 {
                port = free_port()?;
            }
            let log_file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .map_err(|e| e.to_string())?;
            let mut child = tokio::process::Command::new(&self.onus)
                .arg("serve")
                .env("ONUS_CONFIG", &config)
                .env("ONUS_LISTEN", format!("127.0.0.1:{port}"))
                .env("ONUS_LOG", "warn")
                .env_remove("ONUS_DATABASE_URL")
                .env_remove("ONUS_API_TOKEN")
                .env_remove("ONUS_ENCRYPTION_KEY")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log_file)
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| format!("cannot start {}: {e}", self.onus.display()))?;
            let logged = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
            let base = format!("http://127.0.0.1:{port}");
            let mut exited = false;
            while Instant::now() < until {
                if let Ok(Some(_)) = child.try_wait() {
                    exited = true;
                    break;
                }
                let ok = self
                    .http
                    .get(format!("{base}/healthz"))
                    .timeout(Duration::from_secs(2))
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success());
                if ok {
                    let mut p = self.procs[i].locked();
                    p.port = port;
                    p.base = Some(base);
                    p.child = Some(child);
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let _ = child.start_kill();
            let _ = child.wait().await;
            if !exited {
                return Err(format!(
                    "{name} did not become healthy within 60 s; see {}",
                    log.display()
                ));
            }
            let said = std::fs::read(&log)
                .map(|b| String::from_utf8_lossy(&b[(logged as usize).min(b.len())..]).into_owned())
                .unwrap_or_default();
            if said.contains("cannot listen") {
                self.procs[i].locked().port = 0; // taken meanwhile: another one
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let log = self.procs[i].locked().log.clone();
        Err(format!(
            "process {i} did not stay up within 60 s; see {}",
            log.display()
        ))
    }

    /// SIGKILLs process `i` (if up).
    async fn kill(&self, i: usize) {
        let child = {
            let mut p = self.procs[i].locked();
            p.base = None;
            p.child.take()
        };
        if let Some(mut c) = child {
            let _ = c.start_kill();
            let _ = c.wait().await;
        }
    }

    async fn post(&self, base: &str, path: &str, body: &Value) -> Result<(u16, Value), String> {
        crate::post_api(&self.http, base, TOKEN, path, body).await
    }

    async fn make_endpoints(&self, d: usize, sink: &HttpSink) -> Result<(), String> {
        let dep = &self.deps[d];
        let base = self
            .pick(d, &mut StdRng::seed_from_u64(0))
            .ok_or("no process up")?;
        for t in &dep.tenants {
            for n in 0..dep.per_tenant {
                let root = if n == 0 && *t == dep.tenants[0] {
                    "gone"
                } else {
                    "hook"
                };
                let path = format!("/{root}/{}/{t}/{n}", dep.name);
                let (status, v) = self
                    .post(
                        &base,
                        "/endpoints",
                        &json!({"url": sink.url(&path), "tenant": t}),
                    )
                    .await?;
                if status != 201 {
                    return Err(format!("POST /endpoints: {status} {v}"));
                }
                let secret = v["secret"].as_str().unwrap_or_default().to_string();
                let id = v["id"].as_str().unwrap_or_default().to_string();
                dep.ids.locked().insert(id, path.clone());
                dep.endpoints.locked().insert(path, (t.to_string(), secret));
            }
        }
        Ok(())
    }

    /// Publishes events of random tenants until the load stops; an event whose answer was lost
    /// is published again with the same id (which delivers nothing twice).
    async fn publish(&self, d: usize, every: Duration, seed: u64) -> Result<(), String> {
        let mut rng = StdRng::seed_from_u64(seed);
        let dep = &self.deps[d];
        while !self.stop_load.load(Ordering::SeqCst) {
            let t = dep.tenants[rng.gen_range(0..dep.tenants.len())];
            let seq = self.seq.fetch_add(1, Ordering::SeqCst);
            let id = format!("evt_{}_{t}_{seq}", dep.name);
            self.sent_events.locked().insert(id.clone());
            let body = json!({"type": "soak.event", "id": id, "tenant": t,
                              "payload": {"tenant": t, "seq": seq}});
            if self.send(d, &mut rng, "/events", &body).await.is_some() {
                self.acked_events.locked().push((d, id));
                self.tally.add("events published (acknowledged)", 1);
            }
            tokio::time::sleep(every).await;
        }
        Ok(())
    }

    /// Sends an idempotent call (an event with its id, a job with its unique key) to a live
    /// process of deployment `d`, and again to another if no answer came, three times at most;
    /// the answer of the one that took it.
    async fn send(&self, d: usize, rng: &mut StdRng, path: &str, body: &Value) -> Option<Value> {
        for _ in 0..3 {
            let Some(base) = self.pick(d, rng) else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            match self.post(&base, path, body).await {
                Ok((200..=202, v)) => return Some(v),
                _ => self.tally.add("API calls failed (faults)", 1),
            }
        }
        None
    }

    /// Inserts http.request, push and pull jobs in turn until the load stops.
    async fn insert_jobs(
        &self,
        d: usize,
        every: Duration,
        seed: u64,
        sink: &str,
    ) -> Result<(), String> {
        let mut rng = StdRng::seed_from_u64(seed ^ 0xabcd);
        let dep = &self.deps[d];
        let mut n = 0u64;
        while !self.stop_load.load(Ordering::SeqCst) {
            n += 1;
            let unique = format!("soak-{}-{n}", dep.name);
            let (kind, body) = match n % 3 {
                0 => (
                    "http.request",
                    json!({"kind": "http.request", "unique_key": unique, "args": {
                        "method": "POST", "url": format!("{sink}/http/{}/{n}", dep.name),
                        "body": {"n": n}}}),
                ),
                1 => (
                    PUSH,
                    json!({"kind": PUSH, "unique_key": unique, "args": {"n": n}}),
                ),
                _ => (
                    PULL,
                    json!({"kind": PULL, "unique_key": unique, "args": {"n": n}}),
                ),
            };
            let answer = self.send(d, &mut rng, "/jobs", &body).await;
            if let Some(id) = answer.and_then(|v| v["id"].as_i64()) {
                self.acked_jobs.locked().push((d, id));
                self.tally
                    .add(&format!("{kind} jobs inserted (acknowledged)"), 1);
            }
            tokio::time::sleep(every).await;
        }
        Ok(())
    }

    /// A pull worker: claims, then completes, fails, snoozes or abandons each job (an abandoned
    /// job's lease lapses and it is rescued), until the drain ends.
    async fn pull_worker(&self, d: usize, seed: u64) -> Result<(), String> {
        let mut rng = StdRng::seed_from_u64(seed);
        while !self.stop_all.load(Ordering::SeqCst) {
            let Some(base) = self.pick(d, &mut rng) else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let claim = json!({"kinds": [PULL], "limit": 4, "wait": 1});
            let jobs = match self.post(&base, "/queues/default/claim", &claim).await {
                Ok((200, v)) => v["jobs"].as_array().cloned().unwrap_or_default(),
                Ok((503, v)) if v.to_string().contains("clock") => {
                    self.tally
                        .add("pull claims refused by the skewed process", 1);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                _ => {
                    self.tally.add("API calls failed (faults)", 1);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            for j in jobs {
                let id = j["id"].as_i64().unwrap_or_default();
                let token = j["lease_token"].as_str().unwrap_or_default().to_string();
                let claimed = Instant::now();
                {
                    let mut book = self.pull.locked();
                    book.claims += 1;
                    if let Some((at, answered)) = book.held.get(&(d, id)) {
                        let since = at.elapsed();
                        if !answered && since + LEASE_SLACK < PULL_LEASE {
                            let line = format!(
                                "{} job {id} handed out again {} ms after an unanswered claim",
                                self.deps[d].name,
                                since.as_millis()
                            );
                            book.twice.push(line);
                        }
                    }
                    book.held.insert((d, id), (claimed, false));
                }
                let roll = rng.gen_range(0..100);
                let (path, body) = match roll {
                    0..70 => ("complete", json!({"lease_token": token})),
                    70..82 => (
                        "fail",
                        json!({"lease_token": token, "message": "soak: failed"}),
                    ),
                    82..92 => (
                        "snooze",
                        json!({"lease_token": token, "seconds": 1, "reason": "soak"}),
                    ),
                    _ => {
                        self.tally
                            .add("pull jobs abandoned (lease left to lapse)", 1);
                        continue;
                    }
                };
                // Answered once sent: whether or not the reply comes back, the lease may be over.
                self.pull.locked().held.insert((d, id), (claimed, true));
                match self.post(&base, &format!("/jobs/{id}/{path}"), &body).await {
                    Ok((200, _)) => self.tally.add(&format!("pull answers: {path}"), 1),
                    Ok((409, v)) => {
                        let since = claimed.elapsed();
                        if since + LEASE_SLACK < PULL_LEASE {
                            // Nobody may take a job whose lease is current.
                            self.pull.locked().twice.push(format!(
                                "{} job {id}: answer refused as stale {} ms after its claim: {v}",
                                self.deps[d].name,
                                since.as_millis()
                            ));
                        }
                        self.tally.add("pull answers refused as stale (409)", 1);
                    }
                    _ => self.tally.add("API calls failed (faults)", 1),
                }
            }
        }
        Ok(())
    }

    /// SIGKILLs a random process (not the skewed one, whose counters prove it ran nothing) every
    /// 2 to 4 seconds and starts it again.
    async fn killer(&self, seed: u64) -> Result<(), String> {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x4b1);
        let victims: Vec<usize> = (0..self.procs.len())
            .filter(|i| !self.procs[*i].locked().skewed)
            .collect();
        loop {
            let wait = Duration::from_millis(rng.gen_range(2000..4000));
            let until = Instant::now() + wait;
            while Instant::now() < until {
                if self.stop_load.load(Ordering::SeqCst) {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let i = victims[rng.gen_range(0..victims.len())];
            self.kill(i).await;
            self.tally.add("processes killed (SIGKILL)", 1);
            self.start(i).await?;
            self.tally.add("processes restarted", 1);
        }
    }

    /// Terminates a random database connection of the PostgreSQL deployment every 0.5 to 2 s.
    async fn terminator(&self, url: &str, seed: u64) -> Result<(), String> {
        use onus::postgres::tokio_postgres;
        let mut rng = StdRng::seed_from_u64(seed ^ 0x7e4);
        while !self.stop_load.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(rng.gen_range(500..2000))).await;
            let Ok((client, conn)) = tokio_postgres::connect(url, tokio_postgres::NoTls).await
            else {
                continue; // PostgreSQL is restarting
            };
            let conn = tokio::spawn(conn);
            let n = client
                .query(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                     WHERE datname = current_database() AND pid <> pg_backend_pid()
                     ORDER BY random() LIMIT 1",
                    &[],
                )
                .await
                .map(|rows| rows.iter().filter(|r| r.get::<_, bool>(0)).count() as u64)
                .unwrap_or(0);
            self.tally.add("database connections terminated", n);
            drop(client);
            let _ = conn.await;
        }
        Ok(())
    }
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| e.to_string())
}

/// Every state a job has not ended in.
const OPEN: [JobState; 5] = [
    JobState::Available,
    JobState::Scheduled,
    JobState::Retryable,
    JobState::Snoozed,
    JobState::Running,
];

/// How many jobs have not ended (0 when the database cannot be read counts as not known: 1).
async fn unfinished(store: &dyn Store) -> Result<usize, String> {
    let f = JobFilter {
        states: OPEN.to_vec(),
        ..Default::default()
    };
    Ok(match store.count(&f).await {
        Ok(n) => usize::try_from(n).unwrap_or(usize::MAX),
        Err(_) => 1,
    })
}

async fn all_jobs(store: &dyn Store) -> Result<Vec<Job>, String> {
    let mut out = Vec::new();
    let mut before = None;
    loop {
        let page = store
            .list(&JobFilter::default(), 1000, before)
            .await
            .map_err(|e| e.to_string())?;
        let Some(last) = page.last() else { break };
        before = Some(last.id);
        out.extend(page);
    }
    Ok(out)
}

/// Sums of a process's outbound counters.
#[derive(Debug, Default, Clone, Copy)]
struct Counters {
    requests: f64,
    attempts_sent: f64,
    retry_after: f64,
    attempts: f64,
}

impl Counters {
    fn parse(text: &str) -> Counters {
        let mut c = Counters::default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((name, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let v: f64 = value.parse().unwrap_or(0.0);
            let metric = name.split('{').next().unwrap_or_default();
            match metric {
                onus_http::metrics::REQUESTS => c.requests += v,
                onus_http::metrics::ATTEMPTS if name.contains("sent=\"true\"") => {
                    c.attempts_sent += v
                }
                onus_http::metrics::RETRY_AFTER_SNOOZES => c.retry_after += v,
                onus::runtime::metrics::ATTEMPTS => c.attempts += v,
                _ => {}
            }
        }
        c
    }
}

/// How many of a job's snoozes came from a `Retry-After`.
fn retry_after_snoozes(j: &Job) -> u64 {
    j.errors
        .iter()
        .filter(|e| {
            e.class == EntryClass::Snooze && onus_http::classify::is_retry_after(&e.message)
        })
        .count() as u64
}

fn check(
    world: &World,
    jobs: &[Vec<Job>],
    received: &[Received],
    sink: &HttpSink,
    metrics: &[(String, bool, Counters)],
    drain: Duration,
) -> Report {
    let mut r = Report {
        drain,
        ..Report::default()
    };
    let acked_jobs = world.acked_jobs.locked().clone();
    let acked_events = world.acked_events.locked().clone();
    let by_id: Vec<HashMap<i64, &Job>> = jobs
        .iter()
        .map(|v| v.iter().map(|j| (j.id, j)).collect())
        .collect();

    // 1. Everything accounted for.
    let mut lost = Vec::new();
    for (d, id) in &acked_jobs {
        if !by_id[*d].contains_key(id) {
            lost.push(format!(
                "{} job {id} acknowledged, not in the database",
                world.deps[*d].name
            ));
        }
    }
    let mut fanned: Vec<HashSet<String>> = vec![HashSet::new(); jobs.len()];
    for (d, v) in jobs.iter().enumerate() {
        for j in v
            .iter()
            .filter(|j| j.kind == "webhook.fanout" && j.state == JobState::Completed)
        {
            if let Some(e) = j.args["event_id"].as_str() {
                fanned[d].insert(e.to_string());
            }
        }
    }
    // Every event has a delivery to every endpoint of its tenant (those never answer 410, so
    // they stay enabled).
    let delivered: HashSet<(usize, String, String)> = jobs
        .iter()
        .enumerate()
        .flat_map(|(d, v)| {
            v.iter()
                .filter(|j| j.kind == "webhook.deliver")
                .map(move |j| {
                    let ev = j.args["event_id"].as_str().unwrap_or_default().to_string();
                    let ep = j.args["endpoint_id"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string();
                    (d, ev, ep)
                })
        })
        .collect();
    for (d, id) in &acked_events {
        let dep = &world.deps[*d];
        if !fanned[*d].contains(id) {
            lost.push(format!(
                "{} event {id} acknowledged, never fanned out",
                dep.name
            ));
        }
        let tenant = id.split('_').nth(2).unwrap_or_default();
        let endpoints = dep.endpoints();
        for (ep, path) in dep.ids.locked().iter() {
            let ours = endpoints.get(path).is_some_and(|(t, _)| t == tenant);
            if ours
                && path.starts_with("/hook/")
                && !delivered.contains(&(*d, id.clone(), ep.clone()))
            {
                lost.push(format!("{} event {id}: no delivery to {path}", dep.name));
            }
        }
    }
    r.invariants.push(Invariant {
        name: "acknowledged jobs and events all there (none lost)",
        checked: (acked_jobs.len() + acked_events.len()) as u64,
        violations: lost,
    });
    let mut open = Vec::new();
    let mut unexplained = Vec::new();
    let mut states: BTreeMap<String, u64> = BTreeMap::new();
    let mut total = 0;
    for (d, v) in jobs.iter().enumerate() {
        for j in v {
            total += 1;
            *states
                .entry(format!("{:?}", j.state).to_lowercase())
                .or_default() += 1;
            match j.state {
                JobState::Completed | JobState::Cancelled => {}
                JobState::Discarded => {
                    let said = j
                        .errors
                        .last()
                        .is_some_and(|e| !e.message.trim().is_empty());
                    if j.discard_reason.is_none() || !said {
                        unexplained.push(format!(
                            "{} job {} discarded without a reason",
                            world.deps[d].name, j.id
                        ));
                    }
                }
                s => open.push(format!(
                    "{} job {} ({}) still {s:?}",
                    world.deps[d].name, j.id, j.kind
                )),
            }
        }
    }
    r.invariants.push(Invariant {
        name: "every job ended (none waiting, none running past its lease)",
        checked: total,
        violations: open,
    });
    r.invariants.push(Invariant {
        name: "every discarded job says why",
        checked: states.get("discarded").copied().unwrap_or(0),
        violations: unexplained,
    });

    // 2. One request in flight per endpoint.
    let endpoints: HashMap<String, (usize, String, String)> = world
        .deps
        .iter()
        .enumerate()
        .flat_map(|(d, dep)| {
            dep.endpoints()
                .into_iter()
                .map(move |(p, (t, s))| (p, (d, t, s)))
        })
        .collect();
    let by_path = sink.max_in_flight_by_path();
    let twice: Vec<String> = endpoints
        .keys()
        .filter_map(|p| {
            let m = by_path.get(p).copied().unwrap_or(0);
            (m > 1).then(|| format!("{p}: {m} requests in flight at once"))
        })
        .collect();
    r.invariants.push(Invariant {
        name: "no endpoint ever had two requests in flight",
        checked: endpoints.len() as u64,
        violations: twice,
    });

    // 3. No amplification: per job, requests <= attempts + Retry-After snoozes.
    let mut requests: HashMap<String, u64> = HashMap::new();
    for q in received {
        let key = format!(
            "{} {}",
            q.path_only(),
            q.header("webhook-id").unwrap_or_default()
        );
        *requests.entry(key).or_default() += 1;
    }
    let mut over = Vec::new();
    let mut outbound_jobs = 0u64;
    // Several jobs may aim at one key: an insert whose answer was lost is sent again with its
    // unique key, which makes a second job when the first has already ended. Their bounds add up.
    let mut keyed: HashMap<String, (u64, String)> = HashMap::new();
    for (d, v) in jobs.iter().enumerate() {
        let dep = &world.deps[d];
        for j in v {
            let key = match j.kind.as_str() {
                "http.request" => {
                    let url = j.args["url"].as_str().unwrap_or_default();
                    let path = url.splitn(4, '/').nth(3).map(|p| format!("/{p}"));
                    path.map(|p| format!("{p} "))
                }
                k if k == PUSH => Some(format!("/push/{} job_{}", dep.name, j.id)),
                _ => None,
            };
            if let Some(key) = key {
                outbound_jobs += 1;
                let bound = u64::from(j.attempt) + retry_after_snoozes(j);
                let e = keyed
                    .entry(key)
                    .or_insert((0, format!("{} {}", dep.name, j.kind)));
                e.0 += bound;
                e.1.push_str(&format!(" job {}", j.id));
            }
        }
    }
    // Deliveries: their key is the endpoint's path and the event's id; the endpoint's path comes
    // from its id, which only the API knows, so match by the event's id over the endpoint paths.
    let mut deliveries = 0u64;
    let mut delivery_bound: HashMap<(usize, String, String), u64> = HashMap::new();
    for (d, v) in jobs.iter().enumerate() {
        for j in v.iter().filter(|j| j.kind == "webhook.deliver") {
            deliveries += 1;
            let ev = j.args["event_id"].as_str().unwrap_or_default().to_string();
            let ep = j.args["endpoint_id"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            *delivery_bound.entry((d, ev, ep)).or_default() +=
                u64::from(j.attempt) + retry_after_snoozes(j);
        }
    }
    for (key, (bound, what)) in &keyed {
        let n = requests.get(key).copied().unwrap_or(0);
        if n > *bound {
            over.push(format!("{what}: {n} requests, bound {bound}"));
        }
    }
    // Per delivery: the requests to one endpoint with one event's id.
    let ep_paths = endpoint_paths(world);
    for ((d, ev, ep), bound) in &delivery_bound {
        let Some(path) = ep_paths.get(&(*d, ep.clone())) else {
            over.push(format!(
                "delivery of {ev} to an endpoint the soak never made: {ep}"
            ));
            continue;
        };
        let n = requests.get(&format!("{path} {ev}")).copied().unwrap_or(0);
        if n > *bound {
            over.push(format!(
                "delivery of {ev} to {path}: {n} requests, bound {bound}"
            ));
        }
    }
    r.invariants.push(Invariant {
        name: "no job drew more requests than attempts + Retry-After snoozes",
        checked: outbound_jobs + deliveries,
        violations: over,
    });
    let mut unequal = Vec::new();
    for (name, _, c) in metrics {
        if (c.requests - (c.attempts_sent + c.retry_after)).abs() > 0.5 {
            unequal.push(format!(
                "{name}: {} requests != {} attempts sent + {} Retry-After snoozes",
                c.requests, c.attempts_sent, c.retry_after
            ));
        }
    }
    r.invariants.push(Invariant {
        name: "metrics: requests == attempts sent + Retry-After snoozes",
        checked: metrics.len() as u64,
        violations: unequal,
    });

    // 4 and 5. Tenants, ids and signatures.
    let sent = world.sent_events.locked().clone();
    let mut crossed = Vec::new();
    let mut unsigned = Vec::new();
    let mut hook_requests = 0u64;
    for q in received {
        let path = q.path_only();
        let Some((_, tenant, secret)) = endpoints.get(path) else {
            continue;
        };
        hook_requests += 1;
        let id = q.header("webhook-id").unwrap_or_default();
        let envelope: Value = serde_json::from_slice(&q.body).unwrap_or(Value::Null);
        // The event's payload: the envelope's data (the endpoints are made with the default).
        let body = &envelope["data"];
        let event_tenant = id.split('_').nth(2).unwrap_or_default();
        let seq = id.rsplit('_').next().and_then(|n| n.parse::<u64>().ok());
        if seq.is_none() || body["seq"].as_u64() != seq {
            unsigned.push(format!(
                "{path}: webhook-id {id:?} is not the id of the body's event"
            ));
        }
        if event_tenant != tenant || body["tenant"].as_str() != Some(tenant.as_str()) {
            crossed.push(format!(
                "{path} (tenant {tenant}) got {id} of tenant {event_tenant}"
            ));
        }
        let ts: i64 = q
            .header("webhook-timestamp")
            .and_then(|t| t.parse().ok())
            .unwrap_or_default();
        if !sent.contains(id)
            || onus_webhooks::signing::verify(secret, &q.headers, &q.body, ts).is_err()
        {
            unsigned.push(format!(
                "{path}: webhook-id {id:?} unknown or its signature does not verify"
            ));
        }
    }
    r.invariants.push(Invariant {
        name: "no event reached an endpoint of another tenant",
        checked: hook_requests,
        violations: crossed,
    });
    r.invariants.push(Invariant {
        name: "every webhook request had the event's id and a valid signature",
        checked: hook_requests,
        violations: unsigned,
    });

    // 6. No job ran twice at once: no two requests of one job in flight together, and no pull
    // job handed out while an earlier claim of it was leased and unanswered.
    let mut overlapped: Vec<String> = received
        .iter()
        .filter(|q| q.in_flight_same > 1)
        .map(|q| {
            format!(
                "{} {}: {} requests of one job in flight at once",
                q.path_only(),
                q.header("webhook-id").unwrap_or_default(),
                q.in_flight_same
            )
        })
        .collect();
    let book = world.pull.locked();
    overlapped.extend(book.twice.iter().cloned());
    r.invariants.push(Invariant {
        name: "no job ran in two places at once (requests, pull leases)",
        checked: received.len() as u64 + book.claims,
        violations: overlapped,
    });

    // 7. The skewed process took no lease: it ran no attempt, sent nothing, and its log (of its
    // whole life: it is never killed) shows no rescue.
    let mut stole = Vec::new();
    for p in &world.procs {
        let p = p.locked();
        if p.skewed {
            let log = std::fs::read_to_string(&p.log).unwrap_or_default();
            stole.extend(
                log.lines()
                    .filter(|l| l.contains("rescuing a job"))
                    .map(|l| format!("{} rescued: {l}", p.name)),
            );
        }
    }
    let mut skewed = 0;
    for (name, is_skewed, c) in metrics {
        if *is_skewed {
            skewed += 1;
            if c.attempts > 0.0 || c.requests > 0.0 {
                stole.push(format!(
                    "{name} (clock 30 s ahead) ran {} attempts and sent {} requests",
                    c.attempts, c.requests
                ));
            }
        }
    }
    r.invariants.push(Invariant {
        name: "the skewed clock claimed, rescued and ran nothing",
        checked: skewed,
        violations: stole,
    });

    // Figures.
    let t = &world.tally;
    let mut fig = |k: &str, v: u64| r.figures.push((k.to_string(), v));
    fig(
        "events published (acknowledged)",
        t.get("events published (acknowledged)"),
    );
    fig("webhook deliveries (jobs)", deliveries);
    fig("webhook requests at the sink", hook_requests);
    fig(
        "http.request jobs",
        t.get("http.request jobs inserted (acknowledged)"),
    );
    fig(
        "push jobs",
        t.get(&format!("{PUSH} jobs inserted (acknowledged)")),
    );
    fig(
        "pull jobs",
        t.get(&format!("{PULL} jobs inserted (acknowledged)")),
    );
    fig("requests at the sink, all", received.len() as u64);
    fig("jobs in the databases", total);
    for (s, n) in &states {
        fig(&format!("  of them {s}"), *n);
    }
    for k in [
        "processes killed (SIGKILL)",
        "processes restarted",
        "PostgreSQL restarts",
        "database connections terminated",
        "pull claims refused by the skewed process",
        "pull answers: complete",
        "pull answers: fail",
        "pull answers: snooze",
        "pull jobs abandoned (lease left to lapse)",
        "pull answers refused as stale (409)",
        "API calls failed (faults)",
    ] {
        fig(k, t.get(k));
    }
    let lost_attempts: u64 = jobs
        .iter()
        .flatten()
        .map(|j| {
            j.errors
                .iter()
                .filter(|e| e.class == EntryClass::WorkerLost)
                .count() as u64
        })
        .sum();
    fig("attempts lost with a process and rescued", lost_attempts);
    r
}

/// Each endpoint's path by (deployment, its id).
fn endpoint_paths(world: &World) -> HashMap<(usize, String), String> {
    let mut out = HashMap::new();
    for (d, dep) in world.deps.iter().enumerate() {
        for (id, path) in dep.ids.locked().iter() {
            out.insert((d, id.clone()), path.clone());
        }
    }
    out
}
