//! The short soak: the `onus` binary, three processes on one PostgreSQL (one with its clock 30 s
//! ahead) and one on SQLite, under SIGKILLs, a PostgreSQL restart, terminated connections and a
//! chaos sink, then every invariant of `onus_bench::soak` (`onus-bench soak --minutes N` is the
//! long run of the same scenario). Its own binary: it starts processes and needs the machine.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_soak_under_faults_keeps_every_invariant() {
    let mut settings =
        onus_bench::soak::Settings::new(env!("CARGO_BIN_EXE_onus").into(), Duration::from_secs(40));
    // Another seed draws other answers and faults: ONUS_SOAK_SEED=7 cargo test --test soak.
    if let Some(seed) = std::env::var("ONUS_SOAK_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        settings.seed = seed;
    }
    let report = onus_bench::soak::run(settings).await.unwrap();
    let text = report.text();
    println!("{text}");
    assert!(report.held(), "{text}");
    // The faults happened and the work was of every sort.
    for (figure, at_least) in [
        ("processes killed (SIGKILL)", 5),
        ("processes restarted", 5),
        ("PostgreSQL restarts", 1),
        ("database connections terminated", 5),
        ("events published (acknowledged)", 100),
        ("webhook requests at the sink", 500),
        ("http.request jobs", 30),
        ("push jobs", 30),
        ("pull jobs", 30),
        ("pull claims refused by the skewed process", 1),
        ("attempts lost with a process and rescued", 1),
    ] {
        assert!(
            report.figure(figure) >= at_least,
            "{figure}: {} < {at_least}\n{text}",
            report.figure(figure)
        );
    }
    assert!(report.drain < Duration::from_secs(120), "{text}");
}
