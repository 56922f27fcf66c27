//! `onus-bench rows`: what a job's life writes in the database, and how the queue fares while
//! another session holds a snapshot open.
//!
//! - **cost** (PostgreSQL): throughput runs of the driver contract (`N` no-op jobs, slots in one
//!   process or several) on a throwaway cluster with `pg_stat_statements` loaded, measured around
//!   each phase: WAL bytes and records per job by record type (`pg_waldump --stats`: row versions
//!   written, HOT or not, deletions, row locks, index entries), the share of updates that were
//!   HOT, the dead row versions and the size of the job tables after the run, CPU per job of
//!   PostgreSQL (every server process) and of Onus (the worker processes; the inserting client),
//!   and the statements' time per job.
//! - **longtx**: the same throughput run with and without another session holding a snapshot
//!   open from before the workers start until they stop (PostgreSQL: `REPEATABLE READ`; SQLite: a
//!   read transaction on another connection), with the dead row versions left (PostgreSQL).
//! - **steady** (PostgreSQL; only when asked for): jobs inserted at a steady rate for minutes while
//!   a worker process drains them, with every 10 s the jobs done, the backlog, the dead row
//!   versions and the size of each job table, and autovacuum's passes: whether the queue keeps
//!   up and the tables stay small.
//!
//! Options (all optional): `--n N` (100000), `--reps R` (3), `--slots 16,64`, `--procs 1`
//! (worker processes; several lists cells for each), `--hold-s S` (60: the longest a snapshot is
//! held; it ends when the run does), `--only cost,longtx` (both; or `steady`), `--backends
//! sqlite,postgres` (the long-transaction cell's backends; the cost table is PostgreSQL's),
//! `--steady-s S` (600) and `--rate R` (10000 jobs/s) for the steady run, which uses the first of
//! `--slots` in one process. The cluster runs with `autovacuum_naptime = 10s`, as the README
//! advises for a queue of thousands of jobs a second, and the settings in `ONUS_BENCH_PG_SETTINGS`
//! (space-separated `name=value`s, such as auto_explain's to log slow plans).

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use onus_testkit::PgCluster;
use serde_json::Value;

use crate::contract::{throughput_probed, Config, Phase, Probe};
use crate::suite::median;

struct Opts {
    steady: Duration,
    rate: usize,
    n: usize,
    reps: usize,
    slots: Vec<usize>,
    procs: Vec<usize>,
    hold: Duration,
    only: Vec<String>,
    backends: Vec<String>,
}

fn opts() -> Result<Opts, String> {
    let mut o = Opts {
        steady: Duration::from_secs(600),
        rate: 10_000,
        n: 100_000,
        reps: 3,
        slots: vec![16, 64],
        procs: vec![1],
        hold: Duration::from_secs(60),
        only: vec!["cost".into(), "longtx".into()],
        backends: vec!["sqlite".into(), "postgres".into()],
    };
    let args: Vec<String> = std::env::args().skip(2).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let v = it.next().ok_or_else(|| format!("{a} needs a value"))?;
        let number = || {
            v.parse::<usize>()
                .map_err(|_| format!("{a} {v}: give a whole number"))
        };
        match a.as_str() {
            "--n" => o.n = number()?.max(1),
            "--reps" => o.reps = number()?.max(1),
            "--slots" => o.slots = crate::backlog::list(a, v)?,
            "--procs" => o.procs = crate::backlog::list(a, v)?,
            "--hold-s" => o.hold = Duration::from_secs(number()? as u64),
            "--steady-s" => o.steady = Duration::from_secs(number()?.max(10) as u64),
            "--rate" => o.rate = number()?.max(10),
            "--backends" => o.backends = crate::backlog::backends(v)?,
            "--only" => {
                o.only = v.split(',').map(|p| p.trim().to_string()).collect();
                if let Some(p) = o
                    .only
                    .iter()
                    .find(|p| !["cost", "longtx", "steady"].contains(&p.as_str()))
                {
                    return Err(format!("--only: {p:?} is not one of cost, longtx, steady"));
                }
            }
            _ => return Err(format!("unknown option {a}; see onus-bench --help")),
        }
    }
    if let Some(p) = o
        .procs
        .iter()
        .find(|p| !(1..=crate::contract::MAX_PROCS).contains(p))
    {
        return Err(format!(
            "--procs {p}: use 1 to {}",
            crate::contract::MAX_PROCS
        ));
    }
    Ok(o)
}

pub fn main() -> ExitCode {
    crate::api::exit_with(
        "rows",
        (|| {
            let o = opts()?;
            // More server settings from ONUS_BENCH_PG_SETTINGS, space-separated `name=value`s (to
            // log slow plans with auto_explain, say).
            let mut settings: Vec<String> = vec![
                "shared_preload_libraries=pg_stat_statements".into(),
                "autovacuum_naptime=10s".into(),
            ];
            if let Ok(more) = std::env::var("ONUS_BENCH_PG_SETTINGS") {
                settings.extend(more.split_whitespace().map(String::from));
            }
            let pg = PgCluster::start_with_settings(settings).map_err(|e| e.to_string())?;
            let rt = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
            rt.block_on(run(&o, &pg))
        })(),
    )
}

async fn run(o: &Opts, pg: &PgCluster) -> Result<(), String> {
    if o.only.iter().any(|p| p == "cost") {
        cost(o, pg).await?;
    }
    if o.only.iter().any(|p| p == "longtx") {
        longtx(o, pg).await?;
    }
    if o.only.iter().any(|p| p == "steady") {
        steady(o, pg).await?;
    }
    Ok(())
}

fn config(url: String, n: usize, slots: usize, procs: usize) -> Config {
    Config {
        url,
        mode: "throughput".into(),
        n,
        concurrency: slots,
        procs,
        insert_chunk: 1000,
        gap_ms: 0,
        warmup: 0,
        timeout: Duration::from_secs(600),
        latency_client: "same".into(),
    }
}

/// One throughput run of `cfg`, measured by `probe`.
async fn probed(cfg: &Config, probe: &mut impl Probe) -> Result<Value, String> {
    let store = onus::open(&cfg.url).await.map_err(|e| e.to_string())?;
    let v = throughput_probed(cfg, store, probe).await?;
    if v["db_completed"].as_u64() != Some(cfg.n as u64) {
        return Err(format!("the run did not complete every job: {v}"));
    }
    Ok(v)
}

// ---------------------------------------------------------------------------------------------
// Per-job cost on PostgreSQL.

async fn cost(o: &Opts, pg: &PgCluster) -> Result<(), String> {
    let mut cells: Vec<(String, BTreeMap<&'static str, Vec<f64>>)> = Vec::new();
    let mut statements: Vec<(String, Vec<Statement>)> = Vec::new();
    for &procs in &o.procs {
        for &slots in &o.slots {
            let name = format!("{slots} slots, {procs} process(es)");
            let mut metrics: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
            for rep in 0..o.reps {
                let url = pg.fresh_database().await.map_err(|e| e.to_string())?;
                let mut probe = PgProbe::connect(pg, &url, None).await?;
                let v = probed(&config(url, o.n, slots, procs), &mut probe).await?;
                eprintln!("rows cost {name}: {v}");
                let n = o.n as f64;
                for (k, x) in probe.per_job(n)? {
                    metrics.entry(k).or_default().push(x);
                }
                metrics
                    .entry("jobs/s")
                    .or_default()
                    .push(num(&v, "jobs_per_s")?);
                metrics
                    .entry("batch insert, jobs/s")
                    .or_default()
                    .push(num(&v, "insert_jobs_per_s")?);
                if rep == 0 {
                    statements.push((name.clone(), probe.statements.clone()));
                }
            }
            cells.push((name, metrics));
        }
    }
    println!(
        "### Per-job database work on PostgreSQL ({} no-op jobs, medians of {})\n",
        o.n, o.reps
    );
    print!("| per job |");
    for (name, _) in &cells {
        print!(" {name} |");
    }
    println!();
    print!("|---|");
    for _ in &cells {
        print!("---|");
    }
    println!();
    for key in METRICS {
        print!("| {key} |");
        for (_, m) in &cells {
            let v = m.get(key).map(|v| median(v.clone())).unwrap_or(f64::NAN);
            if v.abs() >= 100.0 {
                print!(" {v:.0} |");
            } else {
                print!(" {v:.2} |");
            }
        }
        println!();
    }
    for (name, st) in statements {
        println!("\nStatements, {name} (first run; µs of execution per job, calls, rows):\n");
        println!("| phase | statement | µs per job | calls | rows |");
        println!("|---|---|---|---|---|");
        for s in st.iter().take(12) {
            println!(
                "| {} | `{}` | {:.2} | {} | {} |",
                s.phase,
                s.text,
                s.total_ms * 1000.0 / o.n as f64,
                s.calls,
                s.rows
            );
        }
    }
    println!();
    Ok(())
}

/// The rows of the cost table, in order.
const METRICS: [&str; 23] = [
    "jobs/s",
    "batch insert, jobs/s",
    "insert: WAL bytes",
    "insert: WAL records",
    "insert: index entries",
    "insert: PostgreSQL CPU µs",
    "insert: Onus CPU µs (client)",
    "run: WAL bytes",
    "run: WAL records",
    "run: full-page image bytes",
    "run: row versions (insert)",
    "run: row versions (update, not HOT)",
    "run: row versions (HOT update)",
    "run: deletions",
    "run: row locks",
    "run: index entries",
    "run: commits",
    "run: PostgreSQL CPU µs",
    "run: Onus CPU µs (workers)",
    "HOT share of updates (whole life)",
    "dead row versions after the run (all job tables)",
    "dead row versions after the run, counted in the pages",
    "job tables' size after the run, bytes",
];

fn num(v: &Value, key: &str) -> Result<f64, String> {
    v[key].as_f64().ok_or_else(|| format!("no {key} in {v}"))
}

/// A statement's totals in `pg_stat_statements` for one phase.
#[derive(Debug, Clone)]
struct Statement {
    phase: &'static str,
    text: String,
    calls: i64,
    rows: i64,
    total_ms: f64,
}

/// What the cluster had done at one phase of a run.
#[derive(Debug, Clone, Default)]
struct Snap {
    lsn: String,
    pg_cpu_s: f64,
    self_cpu_s: f64,
    children_cpu_s: f64,
}

/// The table statistics of the run's database after it.
#[derive(Debug, Clone, Default)]
struct Tables {
    updates: f64,
    hot: f64,
    dead: f64,
    /// Dead row versions found in the tables' pages (`pgstattuple`), with the line pointers of
    /// those pruned but not yet vacuumed: what is left whatever the statistics say (each
    /// connection reports its deletions up to a second late, so a report arriving after a
    /// vacuum counts versions that vacuum removed).
    dead_counted: f64,
    bytes: f64,
}

/// Measures a throughput run on PostgreSQL around its phases; with `hold`, holds a snapshot
/// open on another session from the end of the inserts until the workers stop.
struct PgProbe<'a> {
    pg: &'a PgCluster,
    url: String,
    client: tokio_postgres::Client,
    postmaster: u32,
    snaps: BTreeMap<&'static str, Snap>,
    wal: BTreeMap<&'static str, BTreeMap<String, (f64, f64, f64)>>,
    tables: Tables,
    statements: Vec<Statement>,
    /// How long to hold a snapshot open, if at all.
    hold: Option<Duration>,
    /// Ends the held snapshot early (when the workers stop).
    holder: Option<tokio::sync::oneshot::Sender<()>>,
}

async fn connect(url: &str) -> Result<tokio_postgres::Client, String> {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .map_err(|e| format!("cannot connect to {url}: {e}"))?;
    tokio::spawn(conn);
    Ok(client)
}

fn pg_err(e: tokio_postgres::Error) -> String {
    e.as_db_error()
        .map(|d| d.message().to_string())
        .unwrap_or_else(|| e.to_string())
}

impl<'a> PgProbe<'a> {
    async fn connect(
        pg: &'a PgCluster,
        url: &str,
        hold: Option<Duration>,
    ) -> Result<PgProbe<'a>, String> {
        let client = connect(url).await?;
        client
            .batch_execute(
                "CREATE EXTENSION IF NOT EXISTS pg_stat_statements; \
                 CREATE EXTENSION IF NOT EXISTS pgstattuple; CREATE EXTENSION IF NOT EXISTS pageinspect",
            )
            .await
            .map_err(pg_err)?;
        Ok(PgProbe {
            pg,
            url: url.to_string(),
            client,
            postmaster: pg.postmaster_pid().map_err(|e| e.to_string())?,
            snaps: BTreeMap::new(),
            wal: BTreeMap::new(),
            tables: Tables::default(),
            statements: Vec::new(),
            hold,
            holder: None,
        })
    }

    async fn snap(&self, lsn_fn: &str) -> Result<Snap, String> {
        let row = self
            .client
            .query_one(&format!("SELECT {lsn_fn}()::text"), &[])
            .await
            .map_err(pg_err)?;
        let (self_cpu_s, children_cpu_s) = own_cpu()?;
        Ok(Snap {
            lsn: row.get(0),
            pg_cpu_s: cluster_cpu(self.postmaster)?,
            self_cpu_s,
            children_cpu_s,
        })
    }

    /// The statements of the run's database since the last reset, the costliest first.
    async fn take_statements(&mut self, phase: &'static str) -> Result<(), String> {
        let rows = self
            .client
            .query(
                "SELECT left(regexp_replace(regexp_replace(query, '--[^\\n]*', '', 'g'), '\\s+', ' ', 'g'), 90),
                        calls, rows, total_exec_time
                 FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
                 WHERE d.datname = current_database() AND query NOT LIKE '%pg_stat_statements%'
                 ORDER BY total_exec_time DESC LIMIT 8",
                &[],
            )
            .await
            .map_err(pg_err)?;
        for r in rows {
            self.statements.push(Statement {
                phase,
                text: r.get::<_, String>(0).replace('|', "\\|"),
                calls: r.get(1),
                rows: r.get(2),
                total_ms: r.get(3),
            });
        }
        self.client
            .batch_execute("SELECT pg_stat_statements_reset()")
            .await
            .map_err(pg_err)
    }

    /// WAL records by type between two phases (`pg_waldump --stats=record`): for each type its
    /// count, record bytes and full-page-image bytes.
    fn waldump(&self, from: &str, to: &str) -> Result<BTreeMap<String, (f64, f64, f64)>, String> {
        let bin = onus_testkit::bindir()
            .map_err(|e| e.to_string())?
            .join("pg_waldump");
        let wal = self.pg.data_dir().join("pg_wal");
        let out = std::process::Command::new(&bin)
            .arg("--stats=record")
            .arg("--path")
            .arg(&wal)
            .args(["--start", from, "--end", to])
            .output()
            .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
        if !out.status.success() {
            return Err(format!(
                "pg_waldump failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let mut types = BTreeMap::new();
        for line in text.lines() {
            // "Heap/HOT_UPDATE   1000 ( 12.34)   82000 ( 10.00)   0 ( 0.00)   82000 ( 9.00)"
            let mut parts = line.split_whitespace();
            let (Some(name), Some(count)) = (parts.next(), parts.next()) else {
                continue;
            };
            if !name.contains('/') {
                continue;
            }
            let Ok(count) = count.parse::<f64>() else {
                continue;
            };
            let nums: Vec<f64> = parts
                .filter(|p| !p.starts_with('(') && !p.ends_with(')'))
                .filter_map(|p| p.parse().ok())
                .collect();
            let rec = nums.first().copied().unwrap_or(0.0);
            let fpi = nums.get(1).copied().unwrap_or(0.0);
            types.insert(name.to_string(), (count, rec, fpi));
        }
        Ok(types)
    }

    /// The cost table's figures for this run, per job.
    fn per_job(&self, n: f64) -> Result<Vec<(&'static str, f64)>, String> {
        let s = |p: &str| self.snaps.get(p).cloned().ok_or(format!("no {p} snapshot"));
        let (start, inserted, completed, stopped) =
            (s("start")?, s("inserted")?, s("completed")?, s("stopped")?);
        let count = |phase: &str, f: &dyn Fn(&str) -> bool| -> f64 {
            self.wal
                .get(phase)
                .map(|t| t.iter().filter(|(k, _)| f(k)).map(|(_, v)| v.0).sum())
                .unwrap_or(0.0)
                / n
        };
        let bytes = |phase: &str| -> f64 {
            self.wal
                .get(phase)
                .map(|t| t.values().map(|v| v.1 + v.2).sum())
                .unwrap_or(0.0)
                / n
        };
        let index = |k: &str| k.starts_with("Btree/INSERT") || k.starts_with("Btree/SPLIT");
        let fpi = |phase: &str| -> f64 {
            self.wal
                .get(phase)
                .map(|t| t.values().map(|v| v.2).sum())
                .unwrap_or(0.0)
                / n
        };
        let us = |a: f64, b: f64| (b - a) / n * 1e6;
        // An empty sum of floats is -0.0.
        let count = |phase: &str, f: &dyn Fn(&str) -> bool| count(phase, f) + 0.0;
        Ok(vec![
            ("insert: WAL bytes", bytes("insert")),
            ("insert: WAL records", count("insert", &|_| true)),
            ("insert: index entries", count("insert", &index)),
            (
                "insert: PostgreSQL CPU µs",
                us(start.pg_cpu_s, inserted.pg_cpu_s),
            ),
            (
                "insert: Onus CPU µs (client)",
                us(start.self_cpu_s, inserted.self_cpu_s),
            ),
            ("run: WAL bytes", bytes("run")),
            ("run: WAL records", count("run", &|_| true)),
            ("run: full-page image bytes", fpi("run")),
            (
                "run: row versions (insert)",
                count("run", &|k| k.starts_with("Heap/INSERT")),
            ),
            (
                "run: row versions (update, not HOT)",
                count("run", &|k| k.starts_with("Heap/UPDATE")),
            ),
            (
                "run: row versions (HOT update)",
                count("run", &|k| k.starts_with("Heap/HOT_UPDATE")),
            ),
            (
                "run: deletions",
                count("run", &|k| k.starts_with("Heap/DELETE")),
            ),
            (
                "run: row locks",
                count("run", &|k| k.starts_with("Heap/LOCK")),
            ),
            ("run: index entries", count("run", &index)),
            (
                "run: commits",
                count("run", &|k| k.starts_with("Transaction/COMMIT")),
            ),
            (
                "run: PostgreSQL CPU µs",
                us(inserted.pg_cpu_s, completed.pg_cpu_s),
            ),
            (
                "run: Onus CPU µs (workers)",
                us(inserted.children_cpu_s, stopped.children_cpu_s),
            ),
            (
                "HOT share of updates (whole life)",
                if self.tables.updates > 0.0 {
                    self.tables.hot / self.tables.updates
                } else {
                    0.0
                },
            ),
            (
                "dead row versions after the run (all job tables)",
                self.tables.dead,
            ),
            (
                "dead row versions after the run, counted in the pages",
                self.tables.dead_counted,
            ),
            ("job tables' size after the run, bytes", self.tables.bytes),
        ])
    }
}

impl Probe for PgProbe<'_> {
    async fn at(&mut self, phase: Phase) -> Result<(), String> {
        match phase {
            Phase::Start => {
                self.client
                    .batch_execute("CHECKPOINT; SELECT pg_stat_statements_reset()")
                    .await
                    .map_err(pg_err)?;
                let snap = self.snap("pg_current_wal_insert_lsn").await?;
                self.snaps.insert("start", snap);
            }
            Phase::Inserted => {
                let snap = self.snap("pg_current_wal_flush_lsn").await?;
                let types = self.waldump(&self.snaps["start"].lsn, &snap.lsn)?;
                self.wal.insert("insert", types);
                self.snaps.insert("inserted", snap);
                self.take_statements("insert").await?;
                if let Some(hold) = self.hold {
                    let holder = connect(&self.url).await?;
                    holder
                        .batch_execute(
                            "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM onus_jobs WHERE id = 0",
                        )
                        .await
                        .map_err(pg_err)?;
                    let (end, ended) = tokio::sync::oneshot::channel();
                    tokio::spawn(async move {
                        let _ = tokio::time::timeout(hold, ended).await;
                        let _ = holder.batch_execute("ROLLBACK").await;
                    });
                    self.holder = Some(end);
                }
            }
            Phase::Completed => {
                let snap = self.snap("pg_current_wal_flush_lsn").await?;
                let types = self.waldump(&self.snaps["inserted"].lsn, &snap.lsn)?;
                self.wal.insert("run", types);
                self.snaps.insert("completed", snap);
            }
            Phase::Stopped => {
                if let Some(end) = self.holder.take() {
                    let _ = end.send(());
                }
                let snap = self.snap("pg_current_wal_flush_lsn").await?;
                self.snaps.insert("stopped", snap);
                self.take_statements("run").await?;
                // Backends flush their table statistics at most once a second.
                tokio::time::sleep(Duration::from_millis(1100)).await; // statistics' flush interval
                let row = self
                    .client
                    .query_one(
                        "SELECT coalesce(sum(n_tup_upd), 0)::float8, coalesce(sum(n_tup_hot_upd), 0)::float8,
                                coalesce(sum(n_dead_tup), 0)::float8,
                                coalesce(sum(pg_total_relation_size(relid)), 0)::float8
                         FROM pg_stat_user_tables WHERE relname LIKE 'onus\\_%'",
                        &[],
                    )
                    .await
                    .map_err(pg_err)?;
                let counted = self
                    .client
                    .query_one(
                        "SELECT coalesce(sum(t.dead_tuple_count + p.dead_pointers), 0)::float8
                         FROM pg_stat_user_tables s,
                              LATERAL pgstattuple(s.relid) t,
                              LATERAL (SELECT count(*) AS dead_pointers
                                       FROM generate_series(0, pg_relation_size(s.relid) / 8192 - 1) b,
                                            LATERAL heap_page_items(get_raw_page(s.relname::text, b::int)) i
                                       WHERE i.lp_flags = 3) p
                         WHERE s.relname LIKE 'onus\\_%'",
                        &[],
                    )
                    .await
                    .map_err(pg_err)?;
                self.tables = Tables {
                    updates: row.get(0),
                    hot: row.get(1),
                    dead: row.get(2),
                    dead_counted: counted.get(0),
                    bytes: row.get(3),
                };
            }
        }
        Ok(())
    }
}

/// The kernel's clock ticks per second in /proc/<pid>/stat (USER_HZ: 100 on Linux).
const TICKS: f64 = 100.0;

/// Fields of `/proc/<pid>/stat` after the command name.
fn stat_fields(pid: &str) -> Result<Vec<u64>, String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|e| format!("cannot read /proc/{pid}/stat: {e}"))?;
    let rest = text.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    Ok(rest
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect())
}

/// This process's CPU seconds, and those of its children that exited and were waited for.
fn own_cpu() -> Result<(f64, f64), String> {
    let f = stat_fields("self")?;
    // After the name: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14).
    let get = |i: usize| f.get(i).copied().unwrap_or(0) as f64 / TICKS;
    Ok((get(11) + get(12), get(13) + get(14)))
}

/// The CPU seconds of every process of the cluster: the postmaster with the children it waited
/// for (backends that exited), and its children alive now.
fn cluster_cpu(postmaster: u32) -> Result<f64, String> {
    let f = stat_fields(&postmaster.to_string())?;
    let get = |f: &[u64], i: usize| f.get(i).copied().unwrap_or(0) as f64 / TICKS;
    let mut total = get(&f, 11) + get(&f, 12) + get(&f, 13) + get(&f, 14);
    for e in std::fs::read_dir("/proc")
        .map_err(|e| e.to_string())?
        .flatten()
    {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Ok(c) = stat_fields(pid) else { continue };
        if c.get(1).copied() == Some(u64::from(postmaster)) {
            total += get(&c, 11) + get(&c, 12);
        }
    }
    Ok(total)
}

// ---------------------------------------------------------------------------------------------
// Throughput with a snapshot held open.

/// Holds a read transaction open on another SQLite connection from the end of the inserts until
/// the workers stop.
struct SqliteHolder {
    path: String,
    hold: Option<Duration>,
    end: Option<(std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>)>,
}

impl Probe for SqliteHolder {
    async fn at(&mut self, phase: Phase) -> Result<(), String> {
        match phase {
            Phase::Inserted => {
                let Some(hold) = self.hold else {
                    return Ok(());
                };
                let c = onus::sqlite::rusqlite::Connection::open(&self.path)
                    .map_err(|e| e.to_string())?;
                c.execute_batch("BEGIN; SELECT count(*) FROM onus_jobs WHERE id = 0;")
                    .map_err(|e| e.to_string())?;
                let (end, ended) = std::sync::mpsc::channel::<()>();
                let t = std::thread::spawn(move || {
                    let _ = ended.recv_timeout(hold);
                    let _ = c.execute_batch("ROLLBACK");
                });
                self.end = Some((end, t));
            }
            Phase::Stopped => {
                if let Some((end, t)) = self.end.take() {
                    let _ = end.send(());
                    let _ = t.join();
                }
            }
            _ => {}
        }
        Ok(())
    }
}

async fn longtx(o: &Opts, pg: &PgCluster) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let slots = o.slots.first().copied().unwrap_or(16);
    println!(
        "### Throughput with a snapshot held open ({} no-op jobs, {slots} slots, medians of {}; \
         runs alternate)\n",
        o.n, o.reps
    );
    println!("| backend | without: jobs/s | with: jobs/s | with / without | dead row versions after, without | with |");
    println!("|---|---|---|---|---|---|");
    let mut fresh = 0;
    for backend in &o.backends {
        let mut rates: [Vec<f64>; 2] = Default::default();
        let mut dead: [Vec<f64>; 2] = Default::default();
        for _ in 0..o.reps {
            for (i, hold) in [false, true].into_iter().enumerate() {
                let started = Instant::now();
                let v = if backend == "sqlite" {
                    fresh += 1;
                    let path = dir.path().join(format!("longtx-{fresh}.db"));
                    let url = format!("sqlite://{}", path.display());
                    let mut h = SqliteHolder {
                        path: path.display().to_string(),
                        hold: hold.then_some(o.hold),
                        end: None,
                    };
                    probed(&config(url, o.n, slots, 1), &mut h).await?
                } else {
                    let url = pg.fresh_database().await.map_err(|e| e.to_string())?;
                    let mut p = PgProbe::connect(pg, &url, hold.then_some(o.hold)).await?;
                    let v = probed(&config(url, o.n, slots, 1), &mut p).await?;
                    dead[i].push(p.tables.dead);
                    v
                };
                if started.elapsed() > o.hold {
                    eprintln!(
                        "rows longtx: the run took {:?}, longer than --hold-s",
                        started.elapsed()
                    );
                }
                eprintln!("rows longtx {backend} hold={hold}: {v}");
                rates[i].push(num(&v, "jobs_per_s")?);
            }
        }
        let [without, with] = [median(rates[0].clone()), median(rates[1].clone())];
        let shown = |v: &Vec<f64>| {
            if v.is_empty() {
                "n/a".to_string()
            } else {
                format!("{:.0}", median(v.clone()))
            }
        };
        println!(
            "| {backend} | {without:.0} | {with:.0} | {:.2} | {} | {} |",
            with / without,
            shown(&dead[0]),
            shown(&dead[1])
        );
    }
    println!();
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// A steady load for minutes.

async fn steady(o: &Opts, pg: &PgCluster) -> Result<(), String> {
    use std::io::{BufRead, Write};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    let url = pg.fresh_database().await.map_err(|e| e.to_string())?;
    let store = onus::open(&url).await.map_err(|e| e.to_string())?;
    let client = onus::Onus::builder(store.clone())
        .build()
        .map_err(|e| e.to_string())?
        .client();
    let slots = o.slots.first().copied().unwrap_or(16);
    let cfg = config(url.clone(), o.rate, slots, 1);
    let (mut child, mut stdin, mut stdout) = crate::contract::spawn_worker(&cfg, slots, false)?;
    let calls = Arc::new(AtomicU64::new(0));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    let counted = calls.clone();
    let reader = std::thread::spawn(move || {
        let mut line = String::new();
        while stdout.read_line(&mut line).unwrap_or(0) > 0 {
            let mut parts = line.split_whitespace();
            match parts.next() {
                Some("ready") => {
                    let _ = ready_tx.send(());
                }
                Some("calls") => {
                    let c = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0);
                    counted.store(c, Ordering::SeqCst);
                }
                _ => {}
            }
            line.clear();
        }
    });
    ready_rx
        .recv()
        .map_err(|_| "the worker process exited before it was ready".to_string())?;
    writeln!(stdin, "go").map_err(|e| e.to_string())?;
    stdin.flush().map_err(|e| e.to_string())?;
    let db = connect(&url).await?;
    db.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .await
        .map_err(pg_err)?;
    println!(
        "### A steady load on PostgreSQL: {} jobs/s inserted for {} s, {slots} slots in one process \
         (`autovacuum_naptime = 10s`)\n",
        o.rate,
        o.steady.as_secs()
    );
    println!("| s | jobs done/s | backlog | onus_live dead / live rows | onus_live size, MB | job rows dead | job rows size, MB | autovacuum passes (live, rows) |");
    // (Job rows: onus_job_rows, or onus_jobs before jobs migration 10.)
    println!("|---|---|---|---|---|---|---|---|");
    let start = Instant::now();
    let tick = Duration::from_millis(100);
    let per_tick = (o.rate / 10).max(1);
    let mut inserted: u64 = 0;
    let mut next_report = Duration::from_secs(10);
    let mut done_before = 0u64;
    let mut rates = Vec::new();
    while start.elapsed() < o.steady {
        let due = start.elapsed();
        client
            .insert_many(
                (0..per_tick)
                    .map(|_| onus::NewJob::new(crate::contract::KIND, serde_json::json!({})))
                    .collect(),
            )
            .await
            .map_err(|e| e.to_string())?;
        inserted += per_tick as u64;
        if due >= next_report {
            let done = calls.load(Ordering::SeqCst);
            let rate = (done - done_before) as f64 / 10.0;
            rates.push(rate);
            done_before = done;
            let rows = db
                .query(
                    "SELECT relname, n_dead_tup::float8, n_live_tup::float8,
                            pg_total_relation_size(relid)::float8 / 1e6, autovacuum_count::float8
                     FROM pg_stat_user_tables WHERE relname IN ('onus_live', 'onus_job_rows', 'onus_jobs')
                     ORDER BY relname",
                    &[],
                )
                .await
                .map_err(pg_err)?;
            // Before jobs migration 10 the job rows were the table onus_jobs (and no onus_live).
            let get = |name: &str, i: usize| -> f64 {
                let name = match name {
                    "onus_job_rows" if !rows.iter().any(|r| r.get::<_, String>(0) == name) => {
                        "onus_jobs"
                    }
                    n => n,
                };
                rows.iter()
                    .find(|r| r.get::<_, String>(0) == name)
                    .map(|r| r.get::<_, f64>(i))
                    .unwrap_or(f64::NAN)
            };
            println!(
                "| {} | {rate:.0} | {} | {:.0} / {:.0} | {:.1} | {:.0} | {:.1} | {:.0}, {:.0} |",
                next_report.as_secs(),
                inserted.saturating_sub(done),
                get("onus_live", 1),
                get("onus_live", 2),
                get("onus_live", 3),
                get("onus_job_rows", 1),
                get("onus_job_rows", 3),
                get("onus_live", 4),
                get("onus_job_rows", 4),
            );
            use std::io::Write as _;
            let _ = std::io::stdout().flush();
            next_report += Duration::from_secs(10);
        }
        let next = tick * (inserted / per_tick as u64) as u32;
        if let Some(wait) = next.checked_sub(start.elapsed()) {
            tokio::time::sleep(wait).await; // the producer's pace
        }
    }
    let _ = writeln!(stdin, "stop");
    let _ = stdin.flush();
    let _ = child.wait();
    let _ = reader.join();
    let top = db
        .query(
            "SELECT left(regexp_replace(regexp_replace(query, '--[^\\n]*', '', 'g'), '\\s+', ' ', 'g'), 90),
                    calls, total_exec_time / greatest(calls, 1)
             FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
             WHERE d.datname = current_database() ORDER BY total_exec_time DESC LIMIT 6",
            &[],
        )
        .await
        .map_err(pg_err)?;
    println!("\n| statement | calls | mean ms |\n|---|---|---|");
    for r in top {
        println!(
            "| `{}` | {} | {:.2} |",
            r.get::<_, String>(0).replace('|', "\\|"),
            r.get::<_, i64>(1),
            r.get::<_, f64>(2)
        );
    }
    if !rates.is_empty() {
        let (lo, hi) = rates
            .iter()
            .fold((f64::MAX, 0.0f64), |(lo, hi), r| (lo.min(*r), hi.max(*r)));
        println!(
            "\nJobs done per 10 s window: median {:.0}/s, lowest {lo:.0}, highest {hi:.0}.\n",
            median(rates.clone())
        );
    }
    Ok(())
}
