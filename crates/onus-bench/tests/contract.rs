//! The driver contract is exact: one JSON line on stdout with exactly the documented keys, on
//! SQLite and PostgreSQL alike, and a documented error line with a non-zero exit on failure.
//! (Speed is never asserted here: the suite measures it.)

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::collections::BTreeSet;
use std::process::Command;

fn run(env: &[(&str, String)]) -> (bool, serde_json::Value) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_onus-bench"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        stdout.lines().count(),
        1,
        "exactly one line on stdout: {stdout:?}"
    );
    (
        out.status.success(),
        serde_json::from_str(stdout.trim()).unwrap(),
    )
}

fn keys(v: &serde_json::Value) -> BTreeSet<String> {
    v.as_object().unwrap().keys().cloned().collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

async fn urls(dir: &std::path::Path) -> Vec<String> {
    vec![
        format!("sqlite://{}", dir.join("bench.db").display()),
        onus_testkit::PgCluster::shared()
            .fresh_database()
            .await
            .unwrap(),
    ]
}

#[tokio::test]
async fn throughput_reports_exactly_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    for url in urls(dir.path()).await {
        for procs in ["1", "2", "4"] {
            let url = if url.starts_with("sqlite") {
                format!(
                    "sqlite://{}",
                    dir.path().join(format!("t{procs}.db")).display()
                )
            } else {
                onus_testkit::PgCluster::shared()
                    .fresh_database()
                    .await
                    .unwrap()
            };
            let env = vec![
                ("DATABASE_URL", url.clone()),
                ("MODE", "throughput".into()),
                ("N", "300".into()),
                ("CONCURRENCY", "4".into()),
                ("WORKER_PROCS", procs.into()),
                ("INSERT_CHUNK", "100".into()),
                ("RUN_TIMEOUT_S", "120".into()),
            ];
            let (ok, v) = tokio::task::spawn_blocking(move || run(&env))
                .await
                .unwrap();
            assert!(ok, "{v}");
            assert_eq!(
                keys(&v),
                set(&[
                    "peer",
                    "version",
                    "mode",
                    "n",
                    "concurrency",
                    "procs",
                    "insert_s",
                    "insert_jobs_per_s",
                    "handler_s",
                    "run_s",
                    "jobs_per_s",
                    "db_completed",
                    "db_remaining",
                    "notes"
                ])
            );
            assert_eq!(
                v["peer"],
                if url.starts_with("sqlite") {
                    "onus-sqlite"
                } else {
                    "onus-postgres"
                }
            );
            assert_eq!(
                (
                    v["n"].as_u64(),
                    v["db_completed"].as_u64(),
                    v["db_remaining"].as_u64()
                ),
                (Some(300), Some(300), Some(0))
            );
            assert_eq!(v["procs"].as_u64(), Some(procs.parse().unwrap()));
            assert!(v["jobs_per_s"].as_f64().unwrap() > 0.0);
            // The run ends when the database shows every job completed, after the last call.
            let (handler_s, run_s) = (
                v["handler_s"].as_f64().unwrap(),
                v["run_s"].as_f64().unwrap(),
            );
            assert!(0.0 < handler_s && handler_s <= run_s, "{v}");
        }
    }
}

#[tokio::test]
async fn latency_reports_exactly_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    for (url, client) in urls(dir.path())
        .await
        .into_iter()
        .flat_map(|u| [(u.clone(), "same"), (u, "other")])
    {
        let env = vec![
            ("DATABASE_URL", url),
            ("LATENCY_CLIENT", client.into()),
            ("MODE", "latency".into()),
            ("N", "20".into()),
            ("LATENCY_GAP_MS", "1".into()),
            ("LATENCY_WARMUP", "3".into()),
            ("RUN_TIMEOUT_S", "120".into()),
        ];
        let (ok, v) = tokio::task::spawn_blocking(move || run(&env))
            .await
            .unwrap();
        assert!(ok, "{v}");
        assert_eq!(
            keys(&v),
            set(&[
                "peer",
                "version",
                "mode",
                "latency_client",
                "n",
                "samples",
                "p50_ms",
                "p90_ms",
                "p99_ms",
                "max_ms",
                "mean_ms",
                "enqueue_p50_ms",
                "notify",
                "poll_interval_ms",
                "notes"
            ])
        );
        assert_eq!(
            v["samples"].as_u64(),
            Some(20),
            "warm-up samples are dropped"
        );
        let (p50, p99, max) = (
            v["p50_ms"].as_f64().unwrap(),
            v["p99_ms"].as_f64().unwrap(),
            v["max_ms"].as_f64().unwrap(),
        );
        assert!(p50 > 0.0 && p50 <= p99 && p99 <= max, "{v}");
        assert_eq!(v["latency_client"], client);
    }
}

#[test]
fn failures_report_the_error_line_and_exit_non_zero() {
    let (ok, v) = run(&[
        ("DATABASE_URL", "sqlite:///no/such/dir/x.db".into()),
        ("MODE", "throughput".into()),
    ]);
    assert!(!ok);
    assert_eq!(keys(&v), set(&["peer", "mode", "error"]));
    assert!(
        v["error"].as_str().unwrap().contains("does not exist"),
        "{v}"
    );
    let (ok, v) = run(&[
        ("DATABASE_URL", "sqlite://x.db".into()),
        ("MODE", "sprint".into()),
    ]);
    assert!(!ok);
    assert!(v["error"].as_str().unwrap().contains("MODE"), "{v}");
    for (var, value, says) in [
        ("WORKER_PROCS", "5", "WORKER_PROCS=5: use 1 to 4"),
        ("LATENCY_CLIENT", "remote", "LATENCY_CLIENT=\"remote\""),
    ] {
        let (ok, v) = run(&[
            ("DATABASE_URL", "sqlite://x.db".into()),
            (var, value.into()),
        ]);
        assert!(!ok);
        assert!(v["error"].as_str().unwrap().contains(says), "{v}");
    }
}

/// The workloads beyond the contract run to the end at small sizes on both backends, print their
/// table, and check their own results (no job completed twice, no event delivered twice).
#[test]
fn the_other_workloads_run_and_print_their_tables() {
    for (args, rows) in [
        (
            vec![
                "backlog",
                "--sizes",
                "2000",
                "--finished",
                "2000",
                "--claims",
                "10",
                "--drain",
                "500",
            ],
            4, // two databases on each backend
        ),
        (
            vec![
                "fanout",
                "--events",
                "5",
                "--paced",
                "10",
                "--endpoints",
                "3",
                "--reps",
                "1",
            ],
            6, // two variants on each backend, and a ratio row each
        ),
        (vec!["memory", "--jobs", "2000", "--backlog", "2000"], 8), // four loads, two backends
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_onus-bench"))
            .args(&args)
            .env("RUST_LOG", "warn")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{args:?} failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let table: Vec<&str> = stdout
            .lines()
            .filter(|l| l.starts_with("| ") && !l.starts_with("|---"))
            .collect();
        assert_eq!(
            table.len(),
            rows + 1,
            "{args:?}: a header and {rows} rows:\n{stdout}"
        );
        for l in &table[1..] {
            assert!(
                !l.contains("NaN") && !l.contains("inf"),
                "{args:?}: a figure could not be measured: {l}"
            );
        }
    }
}

/// `--help` prints every subcommand and the contract's settings; a mistyped subcommand is an
/// error that shows the same text, not a driver run that complains about `DATABASE_URL`.
#[test]
fn help_lists_the_subcommands_and_an_unknown_one_is_refused() {
    let bin = env!("CARGO_BIN_EXE_onus-bench");
    let help = Command::new(bin).arg("--help").output().unwrap();
    assert!(help.status.success());
    let text = String::from_utf8(help.stdout).unwrap();
    for word in [
        "suite",
        "backlog",
        "fanout",
        "memory",
        "api",
        "panel",
        "DATABASE_URL",
        "WORKER_PROCS",
        "LATENCY_CLIENT",
    ] {
        assert!(text.contains(word), "--help names {word}: {text}");
    }
    let typo = Command::new(bin).arg("suit").output().unwrap();
    assert_eq!(typo.status.code(), Some(2));
    let err = String::from_utf8(typo.stderr).unwrap();
    assert!(err.contains("unknown subcommand \"suit\""), "{err}");
    assert!(
        typo.stdout.is_empty(),
        "nothing on stdout for a driver to misread"
    );
}
