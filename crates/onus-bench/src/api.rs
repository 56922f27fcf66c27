//! `onus-bench api`: the HTTP API's workloads against a real `onus serve` (in this process, on a
//! loopback listener) on SQLite and on a throwaway PostgreSQL (durable settings), each a fresh
//! database, several times in one run; prints medians as a Markdown table:
//!
//! - `POST /jobs`: jobs inserted per second, one per request, from `--clients` concurrent clients;
//! - `POST /events`: events published per second (no endpoint subscribed: the event and its
//!   fan-out job), one per request, from as many clients;
//! - `POST /jobs/batch`: jobs inserted per second, in batches of 1,000;
//! - pull workers: jobs claimed and completed per second by the first `--clients` count of workers
//!   (`POST /queues/{name}/claim` with `limit` 50, then one `POST /jobs/{id}/complete` each, or
//!   one `POST /jobs/answers` for all 50);
//! - beside them, `pgbench -N` with as many clients on a fresh database of the same PostgreSQL:
//!   the durable commits per second this machine allows one row at a time.
//!
//! Options: `--reps R` (3), `--n N` (single requests, 5000; the batch and pull workloads use 10 N),
//! `--clients C,...` (16,64: each count for the single requests and pgbench; the first for the
//! pull workers).

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

/// Requests per second through `POST {path}`, one job or event per request (`body(i)` for the
/// i-th), from `clients` clients at once.
async fn singles(
    s: &Arc<Server>,
    n: usize,
    clients: usize,
    path: &'static str,
    body: fn(usize) -> Value,
) -> Result<f64, String> {
    let left = Arc::new(AtomicUsize::new(n));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (s, left) = (s.clone(), left.clone());
        tasks.push(tokio::spawn(async move {
            while let Ok(i) =
                left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1))
            {
                s.post(path, &body(i)).await?;
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
    /// The client counts of the single requests and pgbench; the pull workers are the first.
    clients: Vec<usize>,
}

fn opts() -> Result<Opts, String> {
    let mut o = Opts {
        reps: 3,
        n: 5000,
        clients: vec![16, 64],
    };
    let args: Vec<String> = std::env::args().skip(2).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let v = it.next().ok_or_else(|| format!("{a} needs a value"))?;
        let ns: Vec<usize> = v
            .split(',')
            .map(|n| n.trim().parse().map(|n: usize| n.max(1)))
            .collect::<Result<_, _>>()
            .map_err(|_| format!("{a} {v}: not a number (or a list of numbers with commas)"))?;
        match a.as_str() {
            "--reps" => o.reps = ns[0],
            "--n" => o.n = ns[0],
            "--clients" => o.clients = ns,
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
    let pullers = o.clients[0];
    let mut rows: Vec<(String, [Vec<f64>; 2])> = Vec::new();
    for c in &o.clients {
        rows.push((format!("`POST /jobs`, {c} clients"), Default::default()));
    }
    for c in &o.clients {
        rows.push((
            format!("`POST /events` (no endpoint), {c} clients"),
            Default::default(),
        ));
    }
    let batch_row = rows.len();
    for name in [
        "`POST /jobs/batch`, 1,000 a batch".to_string(),
        format!("pull: claim 50 + complete each, {pullers} workers"),
        format!("pull: claim 50 + one `POST /jobs/answers` for them, {pullers} workers"),
    ] {
        rows.push((name, Default::default()));
    }
    let pgbench_row = rows.len();
    for c in &o.clients {
        rows.push((
            format!("for comparison: `pgbench -N -c {c}` (durable one-row transactions/s; PostgreSQL only)"),
            Default::default(),
        ));
    }
    let k = o.clients.len();
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
            for (i, c) in o.clients.iter().enumerate() {
                let job = |_| json!({"kind": "bench.pull", "args": {"n": 1}});
                rows[i].1[b].push(singles(&s, o.n, *c, "/jobs", job).await?);
                let event = |i| json!({"type": "bench.event", "payload": {"i": i}});
                rows[k + i].1[b].push(singles(&s, o.n, *c, "/events", event).await?);
            }
            rows[batch_row].1[b].push(batches(&s, o.n * 10).await?);
            rows[batch_row + 1].1[b].push(pull(&s, o.n * 10, pullers, false).await?);
            batches(&s, o.n * 10).await?; // as many jobs again for the answers together
            rows[batch_row + 2].1[b].push(pull(&s, o.n * 10, pullers, true).await?);
            if backend == "postgres" {
                for (i, c) in o.clients.iter().enumerate() {
                    let url = pg.fresh_database().await.map_err(|e| e.to_string())?;
                    let p = crate::suite::pgbench(&pg, &url, *c, None)?;
                    rows[pgbench_row + i].1[b].push(p.tps);
                }
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
