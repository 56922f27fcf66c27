//! `onus-bench suite`: every workload, one table each, in one run. First every mode of the driver
//! contract on SQLite and on a throwaway PostgreSQL, several times, each run a fresh database and
//! a fresh process, with medians and the ratios between backends; then `onus-bench backlog`,
//! `onus-bench fanout` (20 endpoints and 500 events, then 200 endpoints and 100 events),
//! `onus-bench api` and `onus-bench memory` with their defaults (see each one's docs).
//!
//! Options (all optional): `--reps R` (3), `--n N` (throughput jobs, 20000), `--latency-n N` (300),
//! `--concurrency C` (16), `--only contract,backlog,fanout,api,memory` (all).

use std::process::ExitCode;

use serde_json::Value;

struct Opts {
    reps: usize,
    n: usize,
    latency_n: usize,
    concurrency: usize,
    only: Vec<String>,
}

const PARTS: [&str; 5] = ["contract", "backlog", "fanout", "api", "memory"];

fn opts() -> Result<Opts, String> {
    let mut o = Opts {
        reps: 3,
        n: 20_000,
        latency_n: 300,
        concurrency: 16,
        only: PARTS.iter().map(|p| p.to_string()).collect(),
    };
    let args: Vec<String> = std::env::args().skip(2).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let v = it.next().ok_or_else(|| format!("{a} needs a value"))?;
        if a == "--only" {
            o.only = v.split(',').map(|p| p.trim().to_string()).collect();
            if let Some(p) = o.only.iter().find(|p| !PARTS.contains(&p.as_str())) {
                return Err(format!("--only: {p:?} is not one of {}", PARTS.join(", ")));
            }
            continue;
        }
        let n: usize = v.parse().map_err(|_| format!("{a} {v}: not a number"))?;
        match a.as_str() {
            "--reps" => o.reps = n.max(1),
            "--n" => o.n = n,
            "--latency-n" => o.latency_n = n,
            "--concurrency" => o.concurrency = n.max(1),
            _ => return Err(format!("unknown option {a}; see the module docs")),
        }
    }
    Ok(o)
}

fn run_once(url: &str, env: &[(&str, String)]) -> Result<Value, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = std::process::Command::new(exe);
    cmd.env("DATABASE_URL", url).env_remove("ONUS_BENCH_ROLE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd
        .stderr(std::process::Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    let line = String::from_utf8_lossy(&out.stdout);
    let v: Value =
        serde_json::from_str(line.trim()).map_err(|e| format!("bad output {line:?}: {e}"))?;
    if let Some(e) = v.get("error") {
        return Err(format!("run failed: {e}"));
    }
    Ok(v)
}

/// A workload: its name, the contract's environment, and the metrics reported (label, key).
type Workload = (
    String,
    Vec<(&'static str, String)>,
    Vec<(&'static str, &'static str)>,
);

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

pub fn main() -> ExitCode {
    match suite() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("onus-bench suite: {e}");
            ExitCode::FAILURE
        }
    }
}

fn suite() -> Result<(), String> {
    let o = opts()?;
    if o.only.iter().any(|p| p == "contract") {
        println!("### Throughput and pick-up latency (driver contract)\n");
        contract(&o)?;
    }
    for (part, args, title) in [
        ("backlog", &[][..], "Claim cost as the backlog grows"),
        (
            "fanout",
            &[][..],
            "Webhook fan-out to 20 endpoints, with and without a dead endpoint",
        ),
        (
            "fanout",
            &["--endpoints", "200", "--events", "100"][..],
            "Webhook fan-out to 200 endpoints, with and without a dead endpoint",
        ),
        (
            "api",
            &[][..],
            "The HTTP API: single inserts, event publishes, pull workers, beside pgbench",
        ),
        ("memory", &[][..], "Peak memory of a server process"),
    ] {
        if o.only.iter().any(|p| p == part) {
            let shown = std::iter::once(part)
                .chain(args.iter().copied())
                .collect::<Vec<_>>()
                .join(" ");
            println!("\n### {title} (`onus-bench {shown}`)\n");
            use std::io::Write;
            let _ = std::io::stdout().flush();
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            let status = std::process::Command::new(exe)
                .arg(part)
                .args(args)
                .env_remove("ONUS_BENCH_ROLE")
                .status()
                .map_err(|e| e.to_string())?;
            if !status.success() {
                return Err(format!("onus-bench {part} failed ({status})"));
            }
        }
    }
    Ok(())
}

fn contract(o: &Opts) -> Result<(), String> {
    let pg = onus_testkit::PgCluster::start().map_err(|e| e.to_string())?;
    let rt = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut fresh = 0;
    let mut url_for = |backend: &str| -> Result<String, String> {
        fresh += 1;
        match backend {
            "sqlite" => Ok(format!(
                "sqlite://{}",
                dir.path().join(format!("bench-{fresh}.db")).display()
            )),
            _ => rt.block_on(pg.fresh_database()).map_err(|e| e.to_string()),
        }
    };
    let c = o.concurrency.to_string();
    let throughput = |procs: &str, slots: usize| -> Vec<(&'static str, String)> {
        vec![
            ("MODE", "throughput".into()),
            ("N", o.n.to_string()),
            ("CONCURRENCY", slots.to_string()),
            ("WORKER_PROCS", procs.into()),
        ]
    };
    let latency = |client: &str| -> Vec<(&'static str, String)> {
        vec![
            ("MODE", "latency".into()),
            ("N", o.latency_n.to_string()),
            ("CONCURRENCY", c.clone()),
            ("LATENCY_GAP_MS", "5".into()),
            ("LATENCY_WARMUP", "20".into()),
            ("LATENCY_CLIENT", client.into()),
        ]
    };
    let mut workloads: Vec<Workload> = Vec::new();
    for slots in [o.concurrency, o.concurrency * 4] {
        for procs in [1, 2, 4] {
            let mut metrics = vec![("throughput", "jobs_per_s")];
            if procs == 1 && slots == o.concurrency {
                metrics.push(("batch insert (chunks of 1,000)", "insert_jobs_per_s"));
            }
            workloads.push((
                format!("{} jobs, {slots} slots in {procs} process(es)", o.n),
                throughput(&procs.to_string(), slots),
                metrics,
            ));
        }
    }
    for client in ["same", "other"] {
        workloads.push((
            format!(
                "pick-up, {} samples, client in {}",
                o.latency_n,
                if client == "same" {
                    "the worker's process"
                } else {
                    "another process"
                }
            ),
            latency(client),
            vec![("latency p50", "p50_ms"), ("latency p99", "p99_ms")],
        ));
    }
    println!(
        "| workload | metric | unit | onus-sqlite (median) | onus-postgres (median) | sqlite / postgres |"
    );
    println!("|---|---|---|---|---|---|");
    // The physical limit the pick-up latencies are read against, in the same run.
    // Back to back, and paced as the pick-up samples are (one every 5 to 10 ms plus the sample):
    // on an idle machine a commit also pays for waking the database and the disk's queue, and
    // the pick-up samples are taken on an idle machine.
    let sqlite_busy = sqlite_commit_ms(&url_for("sqlite")?, None)?;
    let pg_busy = pgbench_commit_ms(&pg, &url_for("postgres")?, None)?;
    println!(
        "| one durable commit of one row, back to back (SQLite: 300 inserts in a loop; PostgreSQL: `pgbench -N -c 1 -T 5`) | commit | ms | {sqlite_busy:.2} | {pg_busy:.2} | {:.2} |",
        sqlite_busy / pg_busy
    );
    let sqlite_commit = sqlite_commit_ms(&url_for("sqlite")?, Some(PACE))?;
    let pg_commit = pgbench_commit_ms(&pg, &url_for("postgres")?, Some(PACE))?;
    println!(
        "| one durable commit of one row, paced as the pick-up samples (SQLite: one insert every {} ms; PostgreSQL: `pgbench -N -c 1 -T 5 --rate {}`) | commit | ms | {sqlite_commit:.2} | {pg_commit:.2} | {:.2} |",
        PACE.as_millis(),
        1000 / PACE.as_millis(),
        sqlite_commit / pg_commit
    );
    for (name, env, metrics) in &workloads {
        // medians[metric][backend]
        let mut vals: Vec<[Vec<f64>; 2]> = vec![Default::default(); metrics.len()];
        for (b, backend) in ["sqlite", "postgres"].into_iter().enumerate() {
            let env = env.clone();
            for _ in 0..o.reps {
                let v = run_once(&url_for(backend)?, &env)?;
                eprintln!("{backend} {name}: {v}");
                for (m, (_, key)) in metrics.iter().enumerate() {
                    vals[m][b].push(v[*key].as_f64().ok_or_else(|| format!("no {key} in {v}"))?);
                }
            }
        }
        for (m, (label, key)) in metrics.iter().enumerate() {
            let [sq, pgv] = [median(vals[m][0].clone()), median(vals[m][1].clone())];
            let unit = if key.ends_with("_ms") { "ms" } else { "jobs/s" };
            println!(
                "| {name} | {label} | {unit} | {sq:.1} | {pgv:.1} | {:.2} |",
                sq / pgv
            );
            if key.ends_with("_ms") {
                println!(
                    "| {name} | {label} in durable commits (paced) | ratio | {:.2} | {:.2} | |",
                    sq / sqlite_commit,
                    pgv / pg_commit
                );
            }
        }
    }
    Ok(())
}

/// How far apart the paced commits are: about as far as the pick-up samples (`LATENCY_GAP_MS=5`
/// plus up to 5 ms more, plus the sample itself).
const PACE: std::time::Duration = std::time::Duration::from_millis(10);

/// The median time of one durable commit of a one-row insert on SQLite (`synchronous = FULL`,
/// WAL, as the store runs), back to back or one every `pace`.
fn sqlite_commit_ms(url: &str, pace: Option<std::time::Duration>) -> Result<f64, String> {
    use onus::sqlite::rusqlite::Connection;
    let path = url.trim_start_matches("sqlite://");
    let c = Connection::open(path).map_err(|e| e.to_string())?;
    c.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;
         CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL);",
    )
    .map_err(|e| e.to_string())?;
    let mut times = Vec::new();
    for i in 0..300 {
        let t = std::time::Instant::now();
        c.execute("INSERT INTO t (v) VALUES (?1)", [format!("row {i}")])
            .map_err(|e| e.to_string())?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
        if let Some(pace) = pace {
            std::thread::sleep(pace.saturating_sub(t.elapsed())); // the pace of the measurement
        }
    }
    Ok(median(times))
}

/// `pgbench -N -c 1 -T 5` on a fresh database of the suite's cluster, back to back or at one
/// transaction every `pace`: its average latency.
fn pgbench_commit_ms(
    pg: &onus_testkit::PgCluster,
    url: &str,
    pace: Option<std::time::Duration>,
) -> Result<f64, String> {
    pgbench(pg, url, 1, pace).map(|p| p.latency_ms)
}

/// What `pgbench -N` measured.
pub(crate) struct Pgbench {
    /// Transactions per second.
    pub tps: f64,
    /// Average latency of one transaction.
    pub latency_ms: f64,
}

/// `pgbench -N -c clients -T 5` on a fresh database `url` of `pg`, back to back or at one
/// transaction every `pace`: the durable commit rate of this machine, beside Onus in the same run.
pub(crate) fn pgbench(
    pg: &onus_testkit::PgCluster,
    url: &str,
    clients: usize,
    pace: Option<std::time::Duration>,
) -> Result<Pgbench, String> {
    let bin = onus_testkit::bindir()
        .map_err(|e| e.to_string())?
        .join("pgbench");
    let db = url.rsplit('/').next().unwrap_or("postgres").to_string();
    let port = pg.port().to_string();
    let run = |args: &[&str]| -> Result<String, String> {
        let out = std::process::Command::new(&bin)
            .args(["-h", "127.0.0.1", "-p", &port, "-U", "postgres"])
            .args(args)
            .arg(&db)
            .output()
            .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
        if !out.status.success() {
            return Err(format!(
                "pgbench failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    run(&["-i", "-q"])?;
    let rate = pace.map(|p| format!("--rate={}", (1000 / p.as_millis().max(1)).max(1)));
    let clients = clients.to_string();
    let mut args = vec!["-N", "-c", &clients, "-j", "2", "-T", "5", "-n"];
    args.extend(rate.as_deref());
    let out = run(&args)?;
    let read = |prefix: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or_else(|| format!("no {prefix:?} in pgbench's output: {out}"))
    };
    Ok(Pgbench {
        tps: read("tps = ")?,
        latency_ms: read("latency average = ")?,
    })
}
