//! `onus-bench memory`: the peak resident memory (`VmHWM`) of a server process ([`crate::serve`],
//! `[queues] default = 64`) under each load, on each backend, each load in a fresh database and a
//! fresh process:
//!
//! - **idle**: started, migrated, two seconds without work;
//! - **no-op jobs**: `--jobs` (200,000) no-op jobs inserted through `POST /jobs/batch` (1,000 a
//!   batch, 4 clients) while the server runs them; the rate is jobs per second from the first
//!   insert until the database shows all completed;
//! - **backlog**: `--backlog` (1,000,000) jobs of a kind nothing runs, inserted the same way and
//!   left waiting;
//! - **pull workers**: `--jobs` / 4 jobs claimed 50 at a time and completed one by one through the
//!   API by 16 workers.
//!
//! The webhook fan-out's peak is in `onus-bench fanout`. The goal: under 64 MiB at 20,000 jobs/s.
//!
//! Options: `--jobs N`, `--backlog N`, `--backends sqlite,postgres`.

use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use onus::JobState;
use serde_json::{json, Value};

use crate::api::{block_on, exit_with};
use crate::backlog::backends;
use crate::contract::KIND;
use crate::serve::Child;

struct Opts {
    jobs: usize,
    backlog: usize,
    backends: Vec<String>,
}

fn opts() -> Result<Opts, String> {
    let mut o = Opts {
        jobs: 200_000,
        backlog: 1_000_000,
        backends: vec!["sqlite".into(), "postgres".into()],
    };
    let args: Vec<String> = std::env::args().skip(2).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let v = it.next().ok_or_else(|| format!("{a} needs a value"))?;
        let n = || {
            v.parse::<usize>()
                .map_err(|_| format!("{a} {v}: not a number"))
        };
        match a.as_str() {
            "--jobs" => o.jobs = n()?.max(1000),
            "--backlog" => o.backlog = n()?.max(1000),
            "--backends" => o.backends = backends(v)?,
            _ => return Err(format!("unknown option {a}; see the module docs")),
        }
    }
    Ok(o)
}

pub fn main() -> ExitCode {
    exit_with("memory", opts().and_then(|o| block_on(run(&o))))
}

const CONFIG: &str = "[queues]\ndefault = 64\n[kinds.\"bench.pull\"]\nqueue = \"pulled\"\n[kinds.\"bench.waits\"]\nqueue = \"waiting\"\n";

#[derive(Clone, Copy)]
enum Load {
    Idle,
    Noop,
    Backlog,
    Pull,
}

async fn run(o: &Opts) -> Result<(), String> {
    let pg = onus_testkit::PgCluster::start().map_err(|e| e.to_string())?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let loads = [
        (Load::Idle, "idle".to_string()),
        (
            Load::Noop,
            format!("{} no-op jobs, inserted and run at once", o.jobs),
        ),
        (Load::Backlog, format!("{} jobs waiting", o.backlog)),
        (
            Load::Pull,
            format!("{} jobs through 16 pull workers", o.jobs / 4),
        ),
    ];
    println!("| load | backend | jobs/s | server peak RSS MiB |");
    println!("|---|---|---|---|");
    let mut fresh = 0;
    for (load, label) in &loads {
        for backend in &o.backends {
            fresh += 1;
            let url = match backend.as_str() {
                "sqlite" => format!(
                    "sqlite://{}",
                    dir.path().join(format!("memory-{fresh}.db")).display()
                ),
                _ => pg.fresh_database().await.map_err(|e| e.to_string())?,
            };
            let server = Arc::new(Child::start(&url, CONFIG).await?);
            let store = onus::open(&url).await.map_err(|e| e.to_string())?;
            let rate = match load {
                Load::Idle => {
                    tokio::time::sleep(Duration::from_secs(2)).await; // the idle load is time
                    None
                }
                Load::Noop => Some(noop(&server, &store, o.jobs).await?),
                Load::Backlog => {
                    insert(&server, "bench.waits", o.backlog).await?;
                    None
                }
                Load::Pull => {
                    insert(&server, "bench.pull", o.jobs / 4).await?;
                    Some(pull(&server, o.jobs / 4).await?)
                }
            };
            let rss = server.peak_rss_mib()?;
            let rate = rate.map_or("-".to_string(), |r| format!("{r:.0}"));
            println!("| {label} | {backend} | {rate} | {rss:.1} |");
            eprintln!("memory: {label}, {backend}: {rate} jobs/s, {rss:.1} MiB");
        }
    }
    Ok(())
}

/// Inserts `n` jobs of `kind` through `POST /jobs/batch`, 1,000 a batch, from 4 clients.
async fn insert(server: &Arc<Child>, kind: &str, n: usize) -> Result<(), String> {
    let batch: Vec<Value> = (0..1000)
        .map(|i| json!({"kind": kind, "args": {"i": i}}))
        .collect();
    let body = Arc::new(json!({ "jobs": batch }));
    let left = Arc::new(AtomicUsize::new(n.div_ceil(1000)));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (server, body, left) = (server.clone(), body.clone(), left.clone());
        tasks.push(tokio::spawn(async move {
            while left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1))
                .is_ok()
            {
                server.post("/jobs/batch", &body).await?;
            }
            Ok::<_, String>(())
        }));
    }
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    Ok(())
}

/// No-op jobs inserted while the server runs them: jobs per second until all are completed.
async fn noop(server: &Arc<Child>, store: &Arc<dyn onus::Store>, n: usize) -> Result<f64, String> {
    let started = Instant::now();
    insert(server, KIND, n).await?;
    let want = (n.div_ceil(1000) * 1000) as u64;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let done: u64 = store
            .counts()
            .await
            .map_err(|e| e.to_string())?
            .iter()
            .filter(|c| c.state == JobState::Completed && c.kind == KIND)
            .map(|c| c.count)
            .sum();
        if done >= want {
            return Ok(want as f64 / started.elapsed().as_secs_f64());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "only {done} of {want} jobs completed in 10 minutes"
            ));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// 16 pull workers claim 50 at a time and complete each: jobs per second until none is left.
async fn pull(server: &Arc<Child>, n: usize) -> Result<f64, String> {
    let done = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (server, done) = (server.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let got = server
                    .post(
                        "/queues/pulled/claim",
                        &json!({"kinds": ["bench.pull"], "limit": 50}),
                    )
                    .await?;
                let jobs = got["jobs"].as_array().cloned().unwrap_or_default();
                if jobs.is_empty() {
                    return Ok::<_, String>(());
                }
                for j in jobs {
                    server
                        .post(
                            &format!("/jobs/{}/complete", j["id"]),
                            &json!({"lease_token": j["lease_token"]}),
                        )
                        .await?;
                    done.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    let done = done.load(Ordering::SeqCst);
    if done < n {
        return Err(format!("the pull workers completed {done} of {n} jobs"));
    }
    Ok(done as f64 / started.elapsed().as_secs_f64())
}
