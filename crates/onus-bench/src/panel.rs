//! `onus-bench panel`: how long the tasks panel's pages take on a big database. For each size
//! (10k, 100k and 1M jobs by default) and each backend (SQLite, and a throwaway PostgreSQL with
//! durable settings), a fresh database is filled the way a service fills it: jobs inserted in
//! batches and run by in-process workers (90% complete, 5% are discarded, 3% wait for an outside
//! worker, 2% are scheduled for later, a quarter of those cancelled). Then each page is fetched
//! `--reps` times, one request at a time, through a logged-in session; the table gives the
//! median in milliseconds.
//!
//! Options: `--reps R` (15), `--sizes 10000,100000,1000000`, `--backends sqlite,postgres`.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use onus::{JobContext, JobError, JobFilter, JobState, Kind, NewJob, Policy};
use serde_json::json;

use crate::api::{block_on, exit_with, median, Server};

const CONFIG: &str = "[queues]\ndefault = 16\n[kinds.\"bench.wait\"]\nqueue = \"outside\"\n";

/// The pages timed, as (row label, path).
const PAGES: &[(&str, &str)] = &[
    ("overview (counts, charts, queues)", "/"),
    ("jobs, first page", "/jobs"),
    ("jobs, state = discarded", "/jobs?state=discarded"),
    (
        "jobs, kind + queue + state",
        "/jobs?kind=bench.fail&queue=default&state=discarded",
    ),
    ("jobs, tag", "/jobs?tag=t3"),
    ("jobs, text in args (matches)", "/jobs?q=customer-7"),
    (
        "jobs, text in args (no match)",
        "/jobs?q=nowhere-to-be-found",
    ),
    (
        "jobs, second page of a text search",
        "/jobs?q=customer-7&cursor=SECOND",
    ),
];

struct Opts {
    reps: usize,
    sizes: Vec<usize>,
    backends: Vec<String>,
}

fn opts() -> Result<Opts, String> {
    let mut o = Opts {
        reps: 15,
        sizes: vec![10_000, 100_000, 1_000_000],
        backends: vec!["sqlite".into(), "postgres".into()],
    };
    let args: Vec<String> = std::env::args().skip(2).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let v = it.next().ok_or_else(|| format!("{a} needs a value"))?;
        match a.as_str() {
            "--reps" => {
                o.reps = v
                    .parse::<usize>()
                    .map_err(|_| format!("--reps {v}"))?
                    .max(1)
            }
            "--sizes" => {
                o.sizes = v
                    .split(',')
                    .map(|s| {
                        s.trim()
                            .parse::<usize>()
                            .map_err(|_| format!("--sizes: {s:?}"))
                    })
                    .collect::<Result<_, _>>()?
            }
            "--backends" => {
                o.backends = v.split(',').map(|s| s.trim().to_string()).collect();
                if let Some(b) = o
                    .backends
                    .iter()
                    .find(|b| !["sqlite", "postgres"].contains(&b.as_str()))
                {
                    return Err(format!("--backends: {b:?} is not sqlite or postgres"));
                }
            }
            _ => return Err(format!("unknown option {a}; see the module docs")),
        }
    }
    Ok(o)
}

/// Fills a fresh server's database with `n` jobs and runs them to their states.
async fn fill(s: &Server, n: usize) -> Result<(), String> {
    let client = s.parts.onus.client();
    let later = client.now() + chrono::TimeDelta::days(30);
    let mut scheduled = 0;
    for chunk in (0..n).collect::<Vec<_>>().chunks(5_000) {
        let jobs: Vec<NewJob> = chunk
            .iter()
            .map(|&i| {
                let args = json!({"i": i, "customer": format!("customer-{}", i % 1000), "note": "a job like any other"});
                let job = match i % 100 {
                    0..=89 => NewJob::new("bench.echo", args),
                    90..=94 => NewJob::new("bench.fail", args),
                    95..=97 => NewJob::new("bench.wait", args),
                    _ => {
                        scheduled += 1;
                        NewJob::new("bench.wait", args).run_at(later)
                    }
                };
                job.tag(format!("t{}", i % 10))
            })
            .collect();
        client.insert_many(jobs).await.map_err(|e| e.to_string())?;
    }
    let finished = n / 100 * 95;
    let deadline = Instant::now() + Duration::from_secs(1800);
    loop {
        let counts = client.store().counts().await.map_err(|e| e.to_string())?;
        let done: u64 = counts
            .iter()
            .filter(|c| matches!(c.state, JobState::Completed | JobState::Discarded))
            .map(|c| c.count)
            .sum();
        if done as usize >= finished {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "only {done} of {finished} jobs finished in 30 minutes"
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    client
        .cancel_where(&JobFilter {
            states: vec![JobState::Scheduled],
            limit: Some(scheduled / 4),
            ..Default::default()
        })
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// A logged-in panel session's cookie.
async fn login(s: &Server, http: &reqwest::Client) -> Result<String, String> {
    let r = http
        .post(format!("{}/login", s.base))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("token={}", s.token))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let cookie = r
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| format!("login answered {} without a cookie", r.status()))?;
    Ok(cookie.split(';').next().unwrap_or_default().to_string())
}

/// The median time of `reps` fetches of each page, in milliseconds.
async fn time_pages(s: &Server, reps: usize) -> Result<Vec<f64>, String> {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| e.to_string())?;
    let cookie = login(s, &http).await?;
    // The second page of a text search starts where the API's first page stopped.
    let first = s
        .http
        .get(format!("{}/api/v1/jobs?q=customer-7&limit=50", s.base))
        .bearer_auth(&s.token)
        .send()
        .await
        .map_err(|e| e.to_string())?
        .text()
        .await
        .map_err(|e| e.to_string())?;
    let first: serde_json::Value = serde_json::from_str(&first).map_err(|e| e.to_string())?;
    let second = first["next_cursor"].as_str().unwrap_or("").to_string();
    let mut out = Vec::new();
    for (_, path) in PAGES {
        let path = path.replace("SECOND", &second);
        let mut times = Vec::new();
        for _ in 0..reps {
            let started = Instant::now();
            let r = http
                .get(format!("{}{path}", s.base))
                .header("cookie", &cookie)
                .send()
                .await
                .map_err(|e| e.to_string())?;
            let status = r.status();
            let body = r.text().await.map_err(|e| e.to_string())?;
            if !status.is_success() {
                return Err(format!("{path}: {status} {body}"));
            }
            times.push(started.elapsed().as_secs_f64() * 1e3);
        }
        out.push(median(times));
    }
    Ok(out)
}

async fn run(o: &Opts) -> Result<(), String> {
    let pg = onus_testkit::PgCluster::start().map_err(|e| e.to_string())?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut columns: Vec<(String, Vec<f64>)> = Vec::new();
    for &n in &o.sizes {
        for backend in o.backends.iter().map(String::as_str) {
            let url = match backend {
                "sqlite" => format!(
                    "sqlite://{}",
                    dir.path().join(format!("panel-{n}.db")).display()
                ),
                _ => pg.fresh_database().await.map_err(|e| e.to_string())?,
            };
            let s = Server::start_with(&url, CONFIG, |b| {
                b.kind(Kind::new("bench.echo").handler(|_ctx: JobContext| async { Ok(()) }))
                    .kind(
                        Kind::new("bench.fail")
                            .policy(Policy {
                                max_attempts: 1,
                                ..Policy::preset_default()
                            })
                            .handler(|_ctx: JobContext| async {
                                Err(JobError::retryable("the bench says no"))
                            }),
                    )
            })
            .await?;
            let started = Instant::now();
            fill(&s, n).await?;
            eprintln!(
                "{backend} {n}: filled in {:.0} s",
                started.elapsed().as_secs_f64()
            );
            columns.push((format!("{backend} {n}"), time_pages(&s, o.reps).await?));
        }
    }
    let head: Vec<String> = columns.iter().map(|(c, _)| c.clone()).collect();
    println!(
        "| page (median of {} fetches, ms) | {} |",
        o.reps,
        head.join(" | ")
    );
    println!("|---|{}", "---|".repeat(head.len()));
    for (i, (label, _)) in PAGES.iter().enumerate() {
        let cells: Vec<String> = columns
            .iter()
            .map(|(_, t)| format!("{:.1}", t[i]))
            .collect();
        println!("| {label} | {} |", cells.join(" | "));
    }
    Ok(())
}

pub fn main() -> ExitCode {
    exit_with("panel", opts().and_then(|o| block_on(run(&o))))
}
