//! SQLite specifics: the outbox in the caller's own rusqlite transaction, and claim plans that
//! never scan finished jobs.

use std::time::Duration;

use onus::sqlite::rusqlite::{self, Connection};
use onus::{JobContext, JobState, Kind, NewJob};
use serde_json::json;

use crate::harness::{Backend, Env};

fn db_path(env: &Env) -> String {
    env.url.trim_start_matches("sqlite://").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_job_commits_with_the_callers_data_or_not_at_all() {
    let env = Env::new(Backend::Sqlite).await;
    let onus = env
        .builder()
        .kind(Kind::new("receipt.send").handler(|_c: JobContext| async { Ok(()) }))
        .build()
        .unwrap();
    let client = onus.client();
    let mut conn = Connection::open(db_path(&env)).unwrap();
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    conn.execute(
        "CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER NOT NULL)",
        (),
    )
    .unwrap();

    // Rolled back: neither the order nor its job exists.
    let tx = conn.transaction().unwrap();
    tx.execute("INSERT INTO orders (id, total) VALUES (1, 100)", ())
        .unwrap();
    let ins = onus::sqlite::insert_tx(
        &tx,
        client
            .prepare(NewJob::new("receipt.send", json!({"order": 1})))
            .unwrap(),
    )
    .unwrap();
    let ghost = ins.job.id;
    tx.rollback().unwrap();
    assert!(
        env.store.get(ghost).await.unwrap().is_none(),
        "a rolled-back job never exists"
    );
    assert_eq!(env.count(JobState::Available).await, 0);

    // Committed: both exist, and the job runs.
    let tx = conn.transaction().unwrap();
    tx.execute("INSERT INTO orders (id, total) VALUES (2, 200)", ())
        .unwrap();
    let row = client
        .prepare(NewJob::new("receipt.send", json!({"order": 2})).unique_key("order-2"))
        .unwrap();
    let ins = onus::sqlite::insert_tx(&tx, row.clone()).unwrap();
    // The unique key holds inside the caller's transaction too.
    let again = onus::sqlite::insert_tx(&tx, row).unwrap();
    assert!(ins.inserted && !again.inserted && again.job.id == ins.job.id);
    tx.commit().unwrap();
    let running = onus.start();
    client.notify_inserted("default");
    env.wait_state(ins.job.id, JobState::Completed).await;
    let orders: i64 = conn
        .query_row("SELECT COUNT(*) FROM orders", (), |r| r.get(0))
        .unwrap();
    assert_eq!(orders, 1);
    running.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_read_only_the_partial_indexes_of_waiting_jobs() {
    let env = Env::new(Backend::Sqlite).await;
    let client = env.client();
    // A backlog of finished jobs must not be on the claim's path.
    let rows = client
        .insert_many((0..2000).map(|_| NewJob::new("old", json!({}))).collect())
        .await
        .unwrap();
    let ids: Vec<i64> = rows.iter().map(|r| r.job.id).collect();
    client
        .cancel_where(&onus::JobFilter {
            ids,
            ..Default::default()
        })
        .await
        .unwrap();
    let conn = Connection::open(db_path(&env)).unwrap();
    conn.execute("ANALYZE", ()).unwrap();
    let sql = include_str!("../../src/store/sqlite/claim.sql");
    let plan: Vec<String> = conn
        .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
        .unwrap()
        .query_map(
            rusqlite::params![0i64, "w", 0i64, "default", "[\"k\"]", 10i64],
            |r| r.get::<_, String>(3),
        )
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let text = plan.join("\n");
    assert!(text.contains("USING INDEX onus_jobs_available"), "{text}");
    assert!(text.contains("USING INDEX onus_jobs_delayed"), "{text}");
    assert!(
        !text.contains("SCAN onus_jobs"),
        "a claim never scans the jobs table:\n{text}"
    );
}
