//! `onus-bench suite`: every mode on SQLite and on a throwaway PostgreSQL, several times in one
//! run, each run a fresh database and a fresh process obeying the driver contract; prints the
//! medians and the ratios between backends as a Markdown table.
//!
//! Options (all optional): `--reps R` (3), `--n N` (throughput jobs, 20000), `--latency-n N` (300),
//! `--concurrency C` (10).

use std::process::ExitCode;

use serde_json::Value;

struct Opts {
    reps: usize,
    n: usize,
    latency_n: usize,
    concurrency: usize,
}

fn opts() -> Result<Opts, String> {
    let mut o = Opts {
        reps: 3,
        n: 20_000,
        latency_n: 300,
        concurrency: 10,
    };
    let args: Vec<String> = std::env::args().skip(2).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let v = it.next().ok_or_else(|| format!("{a} needs a value"))?;
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

/// A workload: its name, the contract's environment, and the metric reported.
type Workload = (String, Vec<(&'static str, String)>, &'static str);

fn median(mut v: Vec<f64>) -> f64 {
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
    let throughput = |procs: &str| -> Vec<(&'static str, String)> {
        vec![
            ("MODE", "throughput".into()),
            ("N", o.n.to_string()),
            ("CONCURRENCY", c.clone()),
            ("WORKER_PROCS", procs.into()),
        ]
    };
    let latency = vec![
        ("MODE", "latency".into()),
        ("N", o.latency_n.to_string()),
        ("CONCURRENCY", c.clone()),
        ("LATENCY_GAP_MS", "5".into()),
        ("LATENCY_WARMUP", "20".into()),
    ];
    let workloads: Vec<Workload> = vec![
        (
            format!("throughput, {} jobs, 1 process", o.n),
            throughput("1"),
            "jobs_per_s",
        ),
        (
            format!("throughput, {} jobs, 2 processes", o.n),
            throughput("2"),
            "jobs_per_s",
        ),
        (
            format!("batch insert, {} jobs", o.n),
            throughput("1"),
            "insert_jobs_per_s",
        ),
        (
            format!("pick-up latency p50, {} samples", o.latency_n),
            latency.clone(),
            "p50_ms",
        ),
        (
            format!("pick-up latency p99, {} samples", o.latency_n),
            latency,
            "p99_ms",
        ),
    ];
    println!(
        "| workload | metric | onus-sqlite (median) | onus-postgres (median) | sqlite / postgres |"
    );
    println!("|---|---|---|---|---|");
    for (name, env, metric) in &workloads {
        let mut medians = Vec::new();
        for backend in ["sqlite", "postgres"] {
            let mut vals = Vec::new();
            for _ in 0..o.reps {
                let v = run_once(&url_for(backend)?, env)?;
                eprintln!("{backend} {name}: {v}");
                vals.push(
                    v[*metric]
                        .as_f64()
                        .ok_or_else(|| format!("no {metric} in {v}"))?,
                );
            }
            medians.push(median(vals));
        }
        println!(
            "| {name} | {metric} | {:.1} | {:.1} | {:.2} |",
            medians[0],
            medians[1],
            medians[0] / medians[1]
        );
    }
    Ok(())
}
