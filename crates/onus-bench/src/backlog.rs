//! `onus-bench backlog`: what a claim costs as the backlog grows. For each backend (SQLite, and a
//! throwaway PostgreSQL with durable settings) and each size, a fresh database holds that many
//! waiting no-op jobs (10k, 100k and 1M by default), and one more holds 10k waiting behind 1M
//! finished ones. In each:
//!
//! - **per-claim time**: `--claims` claims of 16 jobs straight through the store, each followed by
//!   the completion of what it took, one at a time; the time of the claim call alone, median and
//!   p90;
//! - **throughput**: a worker with 16 slots drains `--drain` jobs from the head of the backlog; jobs
//!   per second from its start until the database shows them completed.
//!
//! The ratio column divides each per-claim median by the one at the smallest backlog of the same
//! backend, in the same run. Filling is untimed: waiting jobs are batch-inserted; finished ones are
//! inserted, claimed and completed in batches of 2,000 through the store, so their rows look as a
//! worker leaves them. PostgreSQL is analysed after filling, as autovacuum would have done.
//!
//! Options: `--sizes 10000,100000,1000000`, `--finished 1000000` (0 leaves that database out),
//! `--claims 200`, `--drain 5000`, `--backends sqlite,postgres`.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{TimeDelta, Utc};
use onus::outcome::Transition;
use onus::store::{ClaimRequest, Finish};
use onus::{JobContext, JobState, Kind, NewJob, Onus, Store};
use serde_json::json;

use crate::api::{block_on, exit_with, median};
use crate::contract::KIND;

struct Opts {
    sizes: Vec<usize>,
    finished: usize,
    claims: usize,
    drain: usize,
    backends: Vec<String>,
}

pub(crate) fn list(flag: &str, v: &str) -> Result<Vec<usize>, String> {
    v.split(',')
        .map(|s| {
            s.trim()
                .parse::<usize>()
                .map_err(|_| format!("{flag}: {s:?} is not a number"))
        })
        .collect()
}

pub(crate) fn backends(v: &str) -> Result<Vec<String>, String> {
    let out: Vec<String> = v.split(',').map(|s| s.trim().to_string()).collect();
    match out
        .iter()
        .find(|b| !["sqlite", "postgres"].contains(&b.as_str()))
    {
        Some(b) => Err(format!("--backends: {b:?} is not sqlite or postgres")),
        None => Ok(out),
    }
}

fn opts() -> Result<Opts, String> {
    let mut o = Opts {
        sizes: vec![10_000, 100_000, 1_000_000],
        finished: 1_000_000,
        claims: 200,
        drain: 5_000,
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
            "--sizes" => o.sizes = list(a, v)?,
            "--finished" => o.finished = n()?,
            "--claims" => o.claims = n()?.max(10),
            "--drain" => o.drain = n()?.max(100),
            "--backends" => o.backends = backends(v)?,
            _ => return Err(format!("unknown option {a}; see the module docs")),
        }
    }
    if o.sizes.is_empty() {
        return Err("--sizes: name at least one size".into());
    }
    Ok(o)
}

pub fn main() -> ExitCode {
    exit_with("backlog", opts().and_then(|o| block_on(run(&o))))
}

/// One database's figures.
struct Row {
    claim_p50_ms: f64,
    claim_p90_ms: f64,
    jobs_per_s: f64,
}

async fn run(o: &Opts) -> Result<(), String> {
    let pg = onus_testkit::PgCluster::start().map_err(|e| e.to_string())?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let smallest = o.sizes.iter().copied().min().unwrap_or(10_000);
    let mut cases: Vec<(usize, usize)> = o.sizes.iter().map(|&s| (s, 0)).collect();
    if o.finished > 0 {
        cases.push((smallest, o.finished));
    }
    println!("| backend | waiting jobs | finished jobs | claim of 16, p50 ms | p90 ms | p50 / p50 at {smallest} waiting | drain, jobs/s ({} jobs, 16 slots) |", o.drain);
    println!("|---|---|---|---|---|---|---|");
    for backend in &o.backends {
        let mut base = None;
        for (i, &(waiting, finished)) in cases.iter().enumerate() {
            let url = match backend.as_str() {
                "sqlite" => format!(
                    "sqlite://{}",
                    dir.path().join(format!("backlog-{i}.db")).display()
                ),
                _ => pg.fresh_database().await.map_err(|e| e.to_string())?,
            };
            let r = one(o, &url, waiting, finished).await?;
            if waiting == smallest && finished == 0 {
                base = Some(r.claim_p50_ms);
            }
            let ratio = base.map_or(f64::NAN, |b| r.claim_p50_ms / b);
            println!(
                "| {backend} | {waiting} | {finished} | {:.3} | {:.3} | {ratio:.2} | {:.0} |",
                r.claim_p50_ms, r.claim_p90_ms, r.jobs_per_s
            );
            eprintln!("backlog: {backend} {waiting} waiting, {finished} finished: done");
        }
    }
    Ok(())
}

const OWNER: &str = "bench-backlog";

fn request(limit: usize) -> ClaimRequest {
    let now = Utc::now();
    ClaimRequest {
        queue: "default".into(),
        kinds: vec![KIND.into()],
        limit,
        owner: OWNER.into(),
        now,
        lease_until: now + TimeDelta::seconds(60),
        caps: Vec::new(),
        lease_slots: Vec::new(),
    }
}

/// Completes what a claim took, as a worker would.
async fn complete(store: &Arc<dyn Store>, jobs: Vec<onus::Job>) -> Result<(), String> {
    let now = Utc::now();
    let batch: Vec<Finish> = jobs
        .into_iter()
        .map(|j| Finish {
            id: j.id,
            owner: OWNER.into(),
            attempt: j.attempt,
            transition: Transition::Complete,
            now,
            release_lease: None,
            periodic: None,
            expired_before: None,
            result: None,
        })
        .collect();
    store.finish(&batch).await.map_err(|e| e.to_string())?;
    Ok(())
}

async fn insert(client: &onus::Client, n: usize) -> Result<(), String> {
    let mut left = n;
    while left > 0 {
        let k = left.min(5_000);
        client
            .insert_many((0..k).map(|_| NewJob::new(KIND, json!({}))).collect())
            .await
            .map_err(|e| e.to_string())?;
        left -= k;
    }
    Ok(())
}

async fn completed(store: &Arc<dyn Store>) -> Result<u64, String> {
    Ok(store
        .counts()
        .await
        .map_err(|e| e.to_string())?
        .iter()
        .filter(|c| c.state == JobState::Completed)
        .map(|c| c.count)
        .sum())
}

async fn one(o: &Opts, url: &str, waiting: usize, finished: usize) -> Result<Row, String> {
    let store = onus::open(url).await.map_err(|e| e.to_string())?;
    let client = Onus::builder(store.clone())
        .build()
        .map_err(|e| e.to_string())?
        .client();
    // Filling, untimed.
    insert(&client, finished).await?;
    while completed(&store).await? < finished as u64 {
        let jobs = store
            .claim(request(2_000))
            .await
            .map_err(|e| e.to_string())?;
        if jobs.is_empty() {
            return Err("the finished jobs could not all be claimed".into());
        }
        complete(&store, jobs).await?;
    }
    insert(&client, waiting).await?;
    if url.starts_with("postgres") {
        let (c, conn) =
            onus::postgres::tokio_postgres::connect(url, onus::postgres::tokio_postgres::NoTls)
                .await
                .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        c.batch_execute("VACUUM ANALYZE onus_job_rows, onus_live")
            .await
            .map_err(|e| e.to_string())?;
    }

    // Per-claim time, straight through the store.
    let mut times = Vec::with_capacity(o.claims);
    for _ in 0..o.claims {
        let t = Instant::now();
        let jobs = store.claim(request(16)).await.map_err(|e| e.to_string())?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
        if jobs.len() != 16 {
            return Err(format!("a claim of 16 took {} jobs", jobs.len()));
        }
        complete(&store, jobs).await?;
    }
    times.sort_by(f64::total_cmp);
    let p90 = times[times.len() * 9 / 10];

    // Throughput: a worker drains the next jobs from the head of the backlog.
    let before = completed(&store).await?;
    let target = before + o.drain.min(waiting.saturating_sub(o.claims * 16)) as u64;
    let calls = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = calls.clone();
    let onus = Onus::builder(store.clone())
        .queue("default", 16)
        .kind(Kind::new(KIND).handler(move |_ctx: JobContext| {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async { Ok(()) }
        }))
        .build()
        .map_err(|e| e.to_string())?;
    let t = Instant::now();
    let running = onus.start();
    let deadline = t + Duration::from_secs(600);
    let mut done = before;
    while done < target {
        if Instant::now() > deadline {
            return Err(format!(
                "only {} of {} jobs drained in 10 minutes",
                done - before,
                target - before
            ));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
        done = completed(&store).await?;
    }
    let secs = t.elapsed().as_secs_f64();
    running.shutdown(Duration::from_secs(30)).await;
    // Every handler call completed its job, once: a job run twice would show more calls than
    // completions.
    let (calls, drained) = (
        calls.load(std::sync::atomic::Ordering::SeqCst),
        completed(&store).await? - before,
    );
    if calls != drained {
        return Err(format!(
            "{calls} handler calls for {drained} jobs completed while draining"
        ));
    }
    Ok(Row {
        claim_p50_ms: median(times),
        claim_p90_ms: p90,
        jobs_per_s: (done - before) as f64 / secs,
    })
}
