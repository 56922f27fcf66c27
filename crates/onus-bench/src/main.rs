//! `onus-bench`: the benchmark program.
//!
//! Speed is measured here, never by timed tests. The program obeys a driver contract so that an
//! outside harness can run it side by side with other queues:
//!
//! - input, from the environment: `DATABASE_URL` (`sqlite://...` or `postgres://...`, an empty
//!   database whose schema is installed untimed), `MODE` (`throughput` or `latency`), `N`,
//!   `CONCURRENCY` (total handler slots), `WORKER_PROCS` (1 to 4 worker processes sharing the
//!   slots), `LATENCY_CLIENT` (`same` or `other`: the inserting client in a worker's process or in
//!   its own), `INSERT_CHUNK` (jobs per batch insert, default 1000), `LATENCY_GAP_MS` (pause after
//!   each latency sample, plus a random 0 to that much more), `LATENCY_WARMUP` (samples dropped)
//!   and `RUN_TIMEOUT_S`;
//! - output: logs on stderr and exactly one JSON line on stdout; on failure
//!   `{"peer", "mode", "error"}` and a non-zero exit.
//!
//! `onus-bench suite` runs every mode on SQLite and on a throwaway PostgreSQL (durable settings)
//! several times in one run and prints medians and ratios; `onus-bench api` runs the HTTP API's
//! workloads (inserts through `POST /jobs` and `POST /jobs/batch`, pull workers) the same way;
//! `onus-bench panel` times the tasks panel's pages at 10k, 100k and 1M jobs on both backends;
//! `onus-bench backlog` measures claims as the backlog grows, `onus-bench fanout` webhook delivery
//! with and without a dead endpoint, `onus-bench memory` a server's peak memory under load, and
//! `onus-bench rows` what a job's life writes on PostgreSQL and how the queue fares while another
//! session holds a snapshot open.
//! `onus-bench soak --minutes N` runs real `onus serve` processes under faults and checks the
//! invariants (`onus_bench::soak`).

mod api;
mod backlog;
mod contract;
mod fanout;
mod memory;
mod panel;
mod rows;
mod serve;
mod suite;
mod worker;

use std::process::ExitCode;

const USAGE: &str = "\
onus-bench: Onus's benchmark program (docs/benchmarks.md)

Usage:
  onus-bench                 one run of the driver contract, configured by the environment:
                             DATABASE_URL (sqlite://... or postgres://..., an empty database),
                             MODE (throughput | latency), N, CONCURRENCY, WORKER_PROCS (1-4),
                             LATENCY_CLIENT (same | other), INSERT_CHUNK, LATENCY_GAP_MS,
                             LATENCY_WARMUP, RUN_TIMEOUT_S; prints one JSON line
  onus-bench suite           every workload on SQLite and a throwaway PostgreSQL, one table each
                             [--reps R] [--n N] [--latency-n N] [--concurrency C]
                             [--only contract,backlog,fanout,api,memory]
  onus-bench backlog         claim cost at 10k, 100k and 1M waiting jobs, and with 1M finished
  onus-bench fanout          webhook delivery to 20 endpoints, with and without a dead one
                             [--events N] [--paced N] [--endpoints N] [--reps R] [--backends B]
  onus-bench memory          a server's peak memory under each load
  onus-bench api             inserts through the HTTP API, and pull workers
  onus-bench panel           the tasks panel's pages at 10k, 100k and 1M jobs
  onus-bench rows            what a job's life writes on PostgreSQL (WAL by record type, HOT
                             share, dead row versions, size, CPU and statements per job), and
                             throughput with a snapshot held open on both backends
                             [--n N] [--reps R] [--slots 16,64] [--procs 1,2,4] [--hold-s S]
                             [--only cost,longtx] [--backends sqlite,postgres]
  onus-bench soak            `onus serve` processes on PostgreSQL and SQLite under faults
                             (SIGKILLs, a PostgreSQL restart, dropped connections, a skewed
                             clock, a chaos sink), then every invariant with its count
                             [--minutes N] [--seconds N] [--seed S] [--dir D]; runs the onus
                             binary beside this one (cargo build --release -p onus-server) or
                             ONUS_BIN
  onus-bench --help          this text
";

fn main() -> ExitCode {
    match std::env::var("ONUS_BENCH_ROLE").as_deref() {
        Ok("worker") => return worker::main(),
        Ok("serve") => return serve::main(),
        _ => {}
    }
    match std::env::args().nth(1).as_deref() {
        Some("suite") => return suite::main(),
        Some("api") => return api::main(),
        Some("panel") => return panel::main(),
        Some("backlog") => return backlog::main(),
        Some("fanout") => return fanout::main(),
        Some("memory") => return memory::main(),
        Some("rows") => return rows::main(),
        Some("soak") => return soak(),
        Some("-h" | "--help" | "help") => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Some(other) => {
            eprint!("onus-bench: unknown subcommand {other:?}\n\n{USAGE}");
            return ExitCode::from(2);
        }
        _ => {}
    }
    contract::main()
}

/// `onus-bench soak`.
fn soak() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(2).collect();
    let parsed = (|| -> Result<onus_bench::soak::Settings, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let onus = match std::env::var_os("ONUS_BIN") {
            Some(p) => std::path::PathBuf::from(p),
            None => exe.with_file_name("onus"),
        };
        if !onus.is_file() {
            return Err(format!(
                "the soak runs the onus binary, and {} is not there: build it with `cargo build --release -p onus-server`, or set ONUS_BIN",
                onus.display()
            ));
        }
        let mut s = onus_bench::soak::Settings::new(onus, std::time::Duration::from_secs(30 * 60));
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
            let number = || {
                value
                    .parse::<u64>()
                    .map_err(|_| format!("{flag} {value:?}: give a whole number"))
            };
            match flag.as_str() {
                "--minutes" => s.faults_for = std::time::Duration::from_secs(number()? * 60),
                "--seconds" => s.faults_for = std::time::Duration::from_secs(number()?),
                "--seed" => s.seed = number()?,
                "--dir" => s.dir = Some(value.into()),
                other => return Err(format!("unknown flag {other}; see onus-bench --help")),
            }
        }
        if s.faults_for < std::time::Duration::from_secs(10) {
            return Err("the soak needs at least 10 seconds of faults".into());
        }
        Ok(s)
    })();
    let settings = match parsed {
        Ok(s) => s,
        Err(e) => {
            eprintln!("onus-bench soak: {e}");
            return ExitCode::from(2);
        }
    };
    api::exit_with(
        "soak",
        api::block_on(async {
            let report = onus_bench::soak::run(settings).await?;
            print!("{}", report.text());
            if report.held() {
                Ok(())
            } else {
                Err("an invariant broke (FAIL above)".into())
            }
        }),
    )
}
