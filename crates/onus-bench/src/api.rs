//! `onus-bench api`: the HTTP API's workloads against a real `onus serve` (in this process, on a
//! loopback listener) on SQLite and on a throwaway PostgreSQL (durable settings), each a fresh
//! database, several times in one run; prints medians as a Markdown table:
//!
//! - `POST /jobs`: jobs inserted per second, one per request, from `--clients` concurrent clients;
//! - `POST /jobs/batch`: jobs inserted per second, in batches of 1,000;
//! - pull workers: jobs claimed and completed per second by `--clients` concurrent workers
//!   (`POST /queues/{name}/claim` with `limit` 50, then one `POST /jobs/{id}/complete` each, or
//!   one `POST /jobs/answers` for all 50);
//! - beside them, `pgbench -N` with as many clients on a fresh database of the same PostgreSQL:
//!   the durable commits per second this machine allows one row at a time.
//!
//! Options: `--reps R` (3), `--n N` (single inserts, 5000; the batch and pull workloads use 10 N),
//! `--clients C` (16).

use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value};

const CONFIG: &str = "[queues]\ndefault = 10\n[kinds.\"bench.pull\"]\nqueue = \"pulled\"\n";

/// A real `onus serve` in this process on a loopback listener, and a client with its token.
pub(crate) struct Server {
    pub base: String,
    pub token: String,
    pub http: reqwest::Client,
    pub parts: onus_server::serve::Parts,
    _server: onus_server::serve::Server,
}

impl Server {
    async fn start(url: &str) -> Result<Server, String> {
        Server::start_with(url, CONFIG, |b| b).await
    }

    /// A server on `url` under `config`, with more set on the runtime's builder.
    pub async fn start_with(
        url: &str,
        config: &str,
        more: impl FnOnce(onus::Builder) -> onus::Builder,
    ) -> Result<Server, String> {
        let file = onus_server::config::parse(config).map_err(|e| e.to_string())?;
        let (parts, app) = onus_server::serve::prepare_with(&file, url, true, more)
            .await
            .map_err(|e| e.to_string())?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string())?;
        let server =
            onus_server::serve::Server::start(&parts, app, listener).map_err(|e| e.to_string())?;
        let token = parts
            .secrets
            .valid(onus_server::secrets::API_TOKEN, chrono::Utc::now())
            .await
            .map_err(|e| e.to_string())?
            .first()
            .map(|v| v.value.clone())
            .ok_or("no token")?;
        Ok(Server {
            base: format!("http://{}", server.addr),
            token,
            http: reqwest::Client::new(),
            parts,
            _server: server,
        })
    }

    async fn post(&self, path: &str, body: &Value) -> Result<Value, String> {
        post(&self.http, &self.base, &self.token, path, body).await
    }
}

/// `POST {base}/api/v1{path}` with a JSON body and the API token; the answer's JSON, or an error
/// naming the path, the status and the body.
pub(crate) async fn post(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    path: &str,
    body: &Value,
) -> Result<Value, String> {
    match onus_bench::post_api(http, base, token, path, body).await? {
        (200..=299, v) => Ok(v),
        (status, v) => Err(format!("{path}: {status} {v}")),
    }
}

/// Jobs per second through `POST /jobs`, one job per request.
async fn singles(s: &Arc<Server>, n: usize, clients: usize) -> Result<f64, String> {
    let left = Arc::new(AtomicUsize::new(n));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (s, left) = (s.clone(), left.clone());
        tasks.push(tokio::spawn(async move {
            while left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1))
                .is_ok()
            {
                s.post("/jobs", &json!({"kind": "bench.pull", "args": {"n": 1}}))
                    .await?;
            }
            Ok::<_, String>(())
        }));
    }
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// Jobs per second through `POST /jobs/batch`, 1,000 a batch.
async fn batches(s: &Server, n: usize) -> Result<f64, String> {
    let batch: Vec<Value> = (0..1000)
        .map(|i| json!({"kind": "bench.pull", "args": {"i": i}}))
        .collect();
    let body = json!({ "jobs": batch });
    let started = Instant::now();
    for _ in 0..n.div_ceil(1000) {
        s.post("/jobs/batch", &body).await?;
    }
    Ok((n.div_ceil(1000) * 1000) as f64 / started.elapsed().as_secs_f64())
}

/// Jobs per second claimed and completed by `clients` pull workers, until `n` are done: each
/// claim's jobs answered one call each, or (`together`) all in one `POST /jobs/answers`.
async fn pull(s: &Arc<Server>, n: usize, clients: usize, together: bool) -> Result<f64, String> {
    let done = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (s, done) = (s.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            while done.load(Ordering::SeqCst) < n {
                let got = s
                    .post(
                        "/queues/pulled/claim",
                        &json!({"kinds": ["bench.pull"], "limit": 50}),
                    )
                    .await?;
                let jobs = got["jobs"].as_array().cloned().unwrap_or_default();
                if jobs.is_empty() {
                    break;
                }
                if together {
                    let answers: Vec<Value> = jobs
                        .iter()
                        .map(|j| json!({"id": j["id"], "lease_token": j["lease_token"], "outcome": "complete"}))
                        .collect();
                    let got = s.post("/jobs/answers", &json!({ "answers": answers })).await?;
                    let applied = got["answers"]
                        .as_array()
                        .map_or(0, |a| a.iter().filter(|a| a["state"] == "completed").count());
                    if applied != jobs.len() {
                        return Err(format!("answers: {applied} of {} applied: {got}", jobs.len()));
                    }
                    done.fetch_add(jobs.len(), Ordering::SeqCst);
                    continue;
                }
                for j in jobs {
                    s.post(
                        &format!("/jobs/{}/complete", j["id"]),
                        &json!({"lease_token": j["lease_token"]}),
                    )
                    .await?;
                    done.fetch_add(1, Ordering::SeqCst);
                }
            }
            Ok::<_, String>(())
        }));
    }
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    Ok(done.load(Ordering::SeqCst) as f64 / started.elapsed().as_secs_f64())
}

struct Opts {
    reps: usize,
    n: usize,
    clients: usize,
}

fn opts() -> Result<Opts, String> {
    let mut o = Opts {
        reps: 3,
        n: 5000,
        clients: 16,
    };
    let args: Vec<String> = std::env::args().skip(2).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let v = it.next().ok_or_else(|| format!("{a} needs a value"))?;
        let n: usize = v.parse().map_err(|_| format!("{a} {v}: not a number"))?;
        match a.as_str() {
            "--reps" => o.reps = n.max(1),
            "--n" => o.n = n.max(1),
            "--clients" => o.clients = n.max(1),
            _ => return Err(format!("unknown option {a}; see the module docs")),
        }
    }
    Ok(o)
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

async fn run(o: &Opts) -> Result<(), String> {
    let pg = onus_testkit::PgCluster::start().map_err(|e| e.to_string())?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    println!(
        "| workload (median of {}) | SQLite jobs/s | PostgreSQL jobs/s |",
        o.reps
    );
    println!("|---|---|---|");
    let mut rows: Vec<(String, [Vec<f64>; 2])> = vec![
        (
            format!("`POST /jobs`, {} clients", o.clients),
            Default::default(),
        ),
        (
            "`POST /jobs/batch`, 1,000 a batch".into(),
            Default::default(),
        ),
        (
            format!("pull: claim 50 + complete each, {} workers", o.clients),
            Default::default(),
        ),
        (
            format!(
                "pull: claim 50 + one `POST /jobs/answers` for them, {} workers",
                o.clients
            ),
            Default::default(),
        ),
        (
            format!(
                "for comparison: `pgbench -N -c {}` (durable one-row transactions/s; PostgreSQL only)",
                o.clients
            ),
            Default::default(),
        ),
    ];
    for rep in 0..o.reps {
        for (b, backend) in ["sqlite", "postgres"].into_iter().enumerate() {
            let url = match backend {
                "sqlite" => format!(
                    "sqlite://{}",
                    dir.path().join(format!("api-{rep}.db")).display()
                ),
                _ => pg.fresh_database().await.map_err(|e| e.to_string())?,
            };
            let s = Arc::new(Server::start(&url).await?);
            rows[0].1[b].push(singles(&s, o.n, o.clients).await?);
            rows[1].1[b].push(batches(&s, o.n * 10).await?);
            rows[2].1[b].push(pull(&s, o.n * 10, o.clients, false).await?);
            batches(&s, o.n * 10).await?; // as many jobs again for the answers together
            rows[3].1[b].push(pull(&s, o.n * 10, o.clients, true).await?);
            if backend == "postgres" {
                let url = pg.fresh_database().await.map_err(|e| e.to_string())?;
                let p = crate::suite::pgbench(&pg, &url, o.clients, None)?;
                rows[4].1[b].push(p.tps);
            }
            eprintln!("rep {rep} {backend}: done");
        }
    }
    for (name, [sqlite, postgres]) in rows {
        let sqlite = match sqlite.is_empty() {
            true => "".to_string(),
            false => format!("{:.0}", median(sqlite)),
        };
        println!("| {name} | {sqlite} | {:.0} |", median(postgres));
    }
    Ok(())
}

pub fn main() -> ExitCode {
    exit_with("api", opts().and_then(|o| block_on(run(&o))))
}

/// Runs `f` to its end on a fresh Tokio runtime.
pub(crate) fn block_on<F: std::future::Future<Output = Result<(), String>>>(
    f: F,
) -> Result<(), String> {
    tokio::runtime::Runtime::new()
        .map_err(|e| e.to_string())?
        .block_on(f)
}

/// The exit code of a subcommand's result, its error on stderr.
pub(crate) fn exit_with(subcommand: &str, result: Result<(), String>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("onus-bench {subcommand}: {e}");
            ExitCode::FAILURE
        }
    }
}
