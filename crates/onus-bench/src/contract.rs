//! The driver contract: one measured run, configured by the environment, one JSON line out.

use std::io::{BufRead, BufReader, Write};
use std::process::{ExitCode, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use onus::{JobContext, JobState, Kind, NewJob, Onus, Options};
use serde_json::{json, Value};

pub const KIND: &str = "bench.noop";

#[derive(Debug, Clone)]
pub struct Config {
    pub url: String,
    pub mode: String,
    pub n: usize,
    pub concurrency: usize,
    pub procs: usize,
    pub insert_chunk: usize,
    pub gap_ms: u64,
    pub warmup: usize,
    pub timeout: Duration,
    /// `same`: the latency run's inserting client is in the worker's process; `other`: in another.
    pub latency_client: String,
}

/// The most worker processes a throughput run starts.
pub const MAX_PROCS: usize = 4;

fn var<T: std::str::FromStr>(name: &str, default: Option<T>) -> Result<T, String> {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .map_err(|_| format!("{name}={v:?} is not a valid number")),
        Err(_) => default.ok_or_else(|| format!("{name} is not set")),
    }
}

impl Config {
    pub fn from_env() -> Result<Config, String> {
        let url =
            std::env::var("DATABASE_URL").map_err(|_| "DATABASE_URL is not set".to_string())?;
        let mode = std::env::var("MODE").unwrap_or_else(|_| "throughput".into());
        if mode != "throughput" && mode != "latency" {
            return Err(format!("MODE={mode:?}: use throughput or latency"));
        }
        let procs: usize = var("WORKER_PROCS", Some(1))?;
        if !(1..=MAX_PROCS).contains(&procs) {
            return Err(format!("WORKER_PROCS={procs}: use 1 to {MAX_PROCS}"));
        }
        let latency_client = std::env::var("LATENCY_CLIENT").unwrap_or_else(|_| "same".into());
        if latency_client != "same" && latency_client != "other" {
            return Err(format!(
                "LATENCY_CLIENT={latency_client:?}: use same (the client in the worker's process) or other (in another process)"
            ));
        }
        let concurrency: usize = var("CONCURRENCY", Some(10))?;
        if concurrency < procs {
            return Err(format!(
                "CONCURRENCY={concurrency} must be at least WORKER_PROCS={procs}"
            ));
        }
        Ok(Config {
            url,
            mode,
            n: var("N", Some(10_000))?,
            concurrency,
            procs,
            insert_chunk: var::<usize>("INSERT_CHUNK", Some(1000))?.max(1),
            gap_ms: var("LATENCY_GAP_MS", Some(0))?,
            warmup: var("LATENCY_WARMUP", Some(0))?,
            timeout: Duration::from_secs(var("RUN_TIMEOUT_S", Some(600))?),
            latency_client,
        })
    }

    pub fn peer(&self) -> &'static str {
        if self.url.starts_with("sqlite:") {
            "onus-sqlite"
        } else {
            "onus-postgres"
        }
    }
}

pub fn main() -> ExitCode {
    let peer_of = |url: &str| {
        if url.starts_with("sqlite:") {
            "onus-sqlite"
        } else {
            "onus-postgres"
        }
    };
    let mode = std::env::var("MODE").unwrap_or_else(|_| "throughput".into());
    let url = std::env::var("DATABASE_URL").unwrap_or_default();
    let fail = |error: String| {
        println!(
            "{}",
            json!({"peer": peer_of(&url), "mode": mode, "error": error})
        );
        ExitCode::FAILURE
    };
    let cfg = match Config::from_env() {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => return fail(e.to_string()),
    };
    let result = rt.block_on(async {
        match tokio::time::timeout(cfg.timeout, run(&cfg)).await {
            Ok(r) => r,
            Err(_) => Err(format!(
                "the run did not finish within RUN_TIMEOUT_S={}",
                cfg.timeout.as_secs()
            )),
        }
    });
    match result {
        Ok(v) => {
            println!("{v}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

async fn run(cfg: &Config) -> Result<Value, String> {
    let store = onus::open(&cfg.url).await.map_err(|e| e.to_string())?; // schema installed, untimed
    match cfg.mode.as_str() {
        "throughput" => throughput(cfg, store).await,
        _ => latency(cfg, store).await,
    }
}

/// Where a throughput run stands when it calls its [`Probe`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Before the first insert.
    Start,
    /// Every job inserted; no worker started yet.
    Inserted,
    /// The database shows every job completed; the workers are still running.
    Completed,
    /// The workers stopped and exited.
    Stopped,
}

/// Called at each [`Phase`] of a throughput run, to measure around it (`onus-bench rows`).
pub(crate) trait Probe {
    async fn at(&mut self, phase: Phase) -> Result<(), String>;
}

/// The driver contract's runs measure nothing around themselves.
impl Probe for () {
    async fn at(&mut self, _: Phase) -> Result<(), String> {
        Ok(())
    }
}

async fn throughput(cfg: &Config, store: Arc<dyn onus::Store>) -> Result<Value, String> {
    throughput_probed(cfg, store, &mut ()).await
}

/// A throughput run (see the contract) that calls `probe` at each [`Phase`].
pub(crate) async fn throughput_probed(
    cfg: &Config,
    store: Arc<dyn onus::Store>,
    probe: &mut impl Probe,
) -> Result<Value, String> {
    probe.at(Phase::Start).await?;
    let client = Onus::builder(store.clone())
        .build()
        .map_err(|e| e.to_string())?
        .client();
    let t = Instant::now();
    let mut left = cfg.n;
    while left > 0 {
        let k = left.min(cfg.insert_chunk);
        client
            .insert_many((0..k).map(|_| NewJob::new(KIND, json!({}))).collect())
            .await
            .map_err(|e| e.to_string())?;
        left -= k;
    }
    let insert_s = t.elapsed().as_secs_f64();
    eprintln!("inserted {} jobs in {insert_s:.3}s", cfg.n);
    probe.at(Phase::Inserted).await?;

    // Worker processes, each with its share of the slots.
    let mut workers = Vec::new();
    for p in 0..cfg.procs {
        let slots = cfg.concurrency / cfg.procs + usize::from(p < cfg.concurrency % cfg.procs);
        workers.push(spawn_worker(cfg, slots, false)?);
    }
    // Each worker reports on its own thread: "ready", then "calls <count> <last call, unix µs>".
    let calls: Arc<Vec<AtomicU64>> = Arc::new((0..cfg.procs).map(|_| AtomicU64::new(0)).collect());
    let last: Arc<Vec<AtomicU64>> = Arc::new((0..cfg.procs).map(|_| AtomicU64::new(0)).collect());
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<usize>();
    let mut readers = Vec::new();
    let mut stdins = Vec::new();
    let mut children = Vec::new();
    for (i, (child, stdin, mut stdout)) in workers.into_iter().enumerate() {
        let (calls, last, ready_tx) = (calls.clone(), last.clone(), ready_tx.clone());
        readers.push(std::thread::spawn(move || {
            let mut line = String::new();
            while stdout.read_line(&mut line).unwrap_or(0) > 0 {
                let mut parts = line.split_whitespace();
                match parts.next() {
                    Some("ready") => {
                        let _ = ready_tx.send(i);
                    }
                    Some("calls") => {
                        let c = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0);
                        let t = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0);
                        calls[i].store(c, Ordering::SeqCst);
                        last[i].store(t, Ordering::SeqCst);
                    }
                    _ => {}
                }
                line.clear();
            }
        }));
        stdins.push(stdin);
        children.push(child);
    }
    drop(ready_tx);
    for _ in 0..cfg.procs {
        ready_rx
            .recv()
            .map_err(|_| "a worker process exited before it was ready".to_string())?;
    }
    let start_us = unix_us();
    for s in stdins.iter_mut() {
        writeln!(s, "go").map_err(|e| e.to_string())?;
        s.flush().map_err(|e| e.to_string())?;
    }
    let n = cfg.n as u64;
    loop {
        let total: u64 = calls.iter().map(|c| c.load(Ordering::SeqCst)).sum();
        if total >= n {
            break;
        }
        for c in children.iter_mut() {
            if let Ok(Some(status)) = c.try_wait() {
                return Err(format!("a worker process exited early ({status})"));
            }
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let handler_us = last
        .iter()
        .map(|t| t.load(Ordering::SeqCst))
        .max()
        .unwrap_or(start_us);
    // The run ends when the database shows all N completed, not at the N-th handler call:
    // outcomes written late are part of the cost.
    let done_us = loop {
        let completed: u64 = store
            .counts()
            .await
            .map_err(|e| e.to_string())?
            .iter()
            .filter(|c| c.state == JobState::Completed)
            .map(|c| c.count)
            .sum();
        if completed >= n {
            break unix_us();
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    let handler_s = (handler_us.saturating_sub(start_us)) as f64 / 1e6;
    let run_s = (done_us.saturating_sub(start_us)) as f64 / 1e6;
    probe.at(Phase::Completed).await?;
    for s in stdins.iter_mut() {
        let _ = writeln!(s, "stop");
        let _ = s.flush();
    }
    for mut c in children {
        let _ = c.wait();
    }
    for r in readers {
        let _ = r.join();
    }
    probe.at(Phase::Stopped).await?;
    let counts = store.counts().await.map_err(|e| e.to_string())?;
    let completed: u64 = counts
        .iter()
        .filter(|c| c.state == JobState::Completed)
        .map(|c| c.count)
        .sum();
    let remaining: u64 = counts
        .iter()
        .filter(|c| c.state != JobState::Completed)
        .map(|c| c.count)
        .sum();
    let mut notes = Vec::new();
    if completed != n {
        notes.push(format!("expected {n} completed jobs, found {completed}"));
    }
    Ok(json!({
        "peer": cfg.peer(),
        "version": env!("CARGO_PKG_VERSION"),
        "mode": "throughput",
        "n": cfg.n,
        "concurrency": cfg.concurrency,
        "procs": cfg.procs,
        "insert_s": insert_s,
        "insert_jobs_per_s": cfg.n as f64 / insert_s,
        "handler_s": handler_s,
        "run_s": run_s,
        "jobs_per_s": cfg.n as f64 / run_s,
        "db_completed": completed,
        "db_remaining": remaining,
        "notes": notes,
    }))
}

/// A worker process with `slots` handler slots, its stdin and stdout; with `report_starts` it
/// prints `start <unix µs>` as each handler starts (a latency run's other-process worker).
pub(crate) fn spawn_worker(
    cfg: &Config,
    slots: usize,
    report_starts: bool,
) -> Result<
    (
        std::process::Child,
        std::process::ChildStdin,
        BufReader<std::process::ChildStdout>,
    ),
    String,
> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = std::process::Command::new(&exe)
        .env("ONUS_BENCH_ROLE", "worker")
        .env("ONUS_BENCH_SLOTS", slots.to_string())
        .env(
            "ONUS_BENCH_REPORT",
            if report_starts { "starts" } else { "calls" },
        )
        .env("DATABASE_URL", &cfg.url)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start a worker process: {e}"))?;
    let stdin = child.stdin.take().ok_or("no worker stdin")?;
    let stdout = BufReader::new(child.stdout.take().ok_or("no worker stdout")?);
    Ok((child, stdin, stdout))
}

pub fn unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

async fn latency(cfg: &Config, store: Arc<dyn onus::Store>) -> Result<Value, String> {
    if cfg.latency_client == "other" {
        return latency_other(cfg, store).await;
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let onus = Onus::builder(store.clone())
        .queue("default", cfg.concurrency)
        .kind(Kind::new(KIND).handler(move |_ctx: JobContext| {
            let _ = tx.send(Instant::now());
            async { Ok(()) }
        }))
        .build()
        .map_err(|e| e.to_string())?;
    let client = onus.client();
    let running = onus.start();
    let mut samples = Vec::with_capacity(cfg.n);
    let mut enqueue = Vec::with_capacity(cfg.n);
    for i in 0..cfg.n + cfg.warmup {
        let t0 = Instant::now();
        client
            .insert(NewJob::new(KIND, json!({})))
            .await
            .map_err(|e| e.to_string())?;
        let t1 = Instant::now();
        let started = rx.recv().await.ok_or("the worker stopped")?;
        if i >= cfg.warmup {
            samples.push(started.saturating_duration_since(t0).as_secs_f64() * 1000.0);
            enqueue.push((t1 - t0).as_secs_f64() * 1000.0);
        }
        if cfg.gap_ms > 0 {
            let extra = rand::random::<u64>() % (cfg.gap_ms + 1);
            tokio::time::sleep(Duration::from_millis(cfg.gap_ms + extra)).await;
        }
    }
    running.shutdown(Duration::from_secs(10)).await;
    let notes = vec!["the inserting client and the worker share one process: an insert wakes the worker directly".to_string()];
    Ok(latency_report(cfg, samples, enqueue, notes))
}

/// Latency with the inserting client in this process and the idle worker in another: the worker
/// learns of each job from the database (PostgreSQL's NOTIFY; on SQLite the writer's check for other processes' commits). Start times are
/// the worker's wall clock (one machine, one clock).
async fn latency_other(cfg: &Config, store: Arc<dyn onus::Store>) -> Result<Value, String> {
    let client = Onus::builder(store)
        .build()
        .map_err(|e| e.to_string())?
        .client();
    let (mut child, mut stdin, mut stdout) = spawn_worker(cfg, cfg.concurrency, true)?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
    let reader = std::thread::spawn(move || {
        let mut line = String::new();
        while stdout.read_line(&mut line).unwrap_or(0) > 0 {
            let mut parts = line.split_whitespace();
            match (
                parts.next(),
                parts.next().and_then(|v| v.parse::<u64>().ok()),
            ) {
                (Some("ready"), _) => {
                    let _ = tx.send(0);
                }
                (Some("start"), Some(t)) => {
                    let _ = tx.send(t);
                }
                _ => {}
            }
            line.clear();
        }
    });
    let ready = rx.recv().await;
    if ready != Some(0) {
        return Err("the worker process exited before it was ready".into());
    }
    writeln!(stdin, "go").map_err(|e| e.to_string())?;
    stdin.flush().map_err(|e| e.to_string())?;
    let mut samples = Vec::with_capacity(cfg.n);
    let mut enqueue = Vec::with_capacity(cfg.n);
    for i in 0..cfg.n + cfg.warmup {
        let t0 = unix_us();
        let e0 = Instant::now();
        client
            .insert(NewJob::new(KIND, json!({})))
            .await
            .map_err(|e| e.to_string())?;
        let e1 = Instant::now();
        let started = rx.recv().await.ok_or("the worker process stopped")?;
        if i >= cfg.warmup {
            samples.push(started.saturating_sub(t0) as f64 / 1000.0);
            enqueue.push((e1 - e0).as_secs_f64() * 1000.0);
        }
        if cfg.gap_ms > 0 {
            let extra = rand::random::<u64>() % (cfg.gap_ms + 1);
            tokio::time::sleep(Duration::from_millis(cfg.gap_ms + extra)).await;
        }
    }
    let _ = writeln!(stdin, "stop");
    let _ = stdin.flush();
    let _ = child.wait();
    let _ = reader.join();
    let notes = vec!["the inserting client is another process than the worker: the worker learns of a job from the database".to_string()];
    Ok(latency_report(cfg, samples, enqueue, notes))
}

fn latency_report(
    cfg: &Config,
    mut samples: Vec<f64>,
    mut enqueue: Vec<f64>,
    mut notes: Vec<String>,
) -> Value {
    samples.sort_by(f64::total_cmp);
    enqueue.sort_by(f64::total_cmp);
    let pct = |v: &[f64], p: f64| -> f64 {
        if v.is_empty() {
            return 0.0;
        }
        let i = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
        v[i.min(v.len() - 1)]
    };
    let mean = if samples.is_empty() {
        0.0
    } else {
        samples.iter().sum::<f64>() / samples.len() as f64
    };
    if cfg.procs != 1 {
        notes.push(format!(
            "WORKER_PROCS={} is ignored in latency mode: one worker process",
            cfg.procs
        ));
    }
    json!({
        "peer": cfg.peer(),
        "version": env!("CARGO_PKG_VERSION"),
        "mode": "latency",
        "latency_client": cfg.latency_client,
        "n": cfg.n,
        "samples": samples.len(),
        "p50_ms": pct(&samples, 50.0),
        "p90_ms": pct(&samples, 90.0),
        "p99_ms": pct(&samples, 99.0),
        "max_ms": samples.last().copied().unwrap_or(0.0),
        "mean_ms": mean,
        "enqueue_p50_ms": pct(&enqueue, 50.0),
        "notify": true,
        "poll_interval_ms": Options::default().poll_interval.as_millis() as u64,
        "notes": notes,
    })
}
