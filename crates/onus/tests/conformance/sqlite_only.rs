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
    let ins = onus::sql::ready(client.insert_in(
        &onus::sql::SqliteTx::new(&tx),
        NewJob::new("receipt.send", json!({"order": 1})),
    ))
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
    let job = NewJob::new("receipt.send", json!({"order": 2})).unique_key("order-2");
    let in_tx = onus::sql::SqliteTx::new(&tx);
    let ins = onus::sql::ready(client.insert_in(&in_tx, job.clone())).unwrap();
    // The unique key holds inside the caller's transaction too.
    let again = onus::sql::ready(client.insert_in(&in_tx, job)).unwrap();
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
    assert!(text.contains("USING INDEX onus_live_available"), "{text}");
    assert!(text.contains("USING INDEX onus_live_delayed"), "{text}");
    assert!(
        !text.contains("SCAN onus_live") && !text.contains("SCAN onus_job_rows"),
        "a claim never scans the jobs table:\n{text}"
    );
}

/// Polls `f` once, so a store write it makes is queued on the writer, and returns it to finish.
async fn queued<F: std::future::Future>(f: F) -> std::pin::Pin<Box<F>> {
    let mut f = Box::pin(f);
    std::future::poll_fn(|cx| {
        let _ = f.as_mut().poll(cx);
        std::task::Poll::Ready(())
    })
    .await;
    f
}

fn sqlite(env: &Env) -> &onus::sqlite::SqliteStore {
    env.store
        .as_any()
        .downcast_ref::<onus::sqlite::SqliteStore>()
        .expect("a SQLite store")
}

async fn tags(env: &Env) -> Vec<String> {
    let mut t: Vec<String> = env
        .store
        .list(&onus::JobFilter::default(), 100, None)
        .await
        .unwrap()
        .iter()
        .map(|j| j.args["tag"].as_str().unwrap_or_default().to_string())
        .collect();
    t.sort();
    t
}

/// When SQLite rolls a whole transaction back (here SQLITE_FULL on a one-row insert, which
/// has no statement journal), no write of that batch is reported done, and none runs after it in
/// autocommit mode: what a caller is told always matches what is in the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_rolled_back_transaction_fails_its_whole_batch() {
    let env = Env::new(Backend::Sqlite).await;
    let client = env.client();
    let store = sqlite(&env);
    store
        .write(|conn| {
            let pages: i64 = conn
                .query_row("PRAGMA page_count", [], |r| r.get(0))
                .map_err(|e| onus::StoreError::Query(e.to_string(), None))?;
            conn.execute_batch(&format!(
                "CREATE TABLE filler (b BLOB); PRAGMA max_page_count = {}",
                pages + 30
            ))
            .map_err(|e| onus::StoreError::Query(e.to_string(), None))
        })
        .await
        .unwrap();
    let (open, wait) = std::sync::mpsc::channel::<()>();
    let blocker = queued(store.write(move |_conn| {
        let _ = wait.recv();
        Ok(())
    }))
    .await;
    let before = queued(client.insert(NewJob::new("k", json!({"tag": "before"})))).await;
    // A component's one-row insert into a table of its own: no statement journal.
    let full = queued(store.write(|conn| {
        conn.execute("INSERT INTO filler (b) VALUES (zeroblob(400000))", [])
            .map_err(|e| onus::StoreError::Query(e.to_string(), None))
    }))
    .await;
    let after = queued(client.insert(NewJob::new("k", json!({"tag": "after"})))).await;
    open.send(()).unwrap();
    let (blocker, before, full, after) = (blocker.await, before.await, full.await, after.await);
    let e = full.unwrap_err().to_string();
    assert!(e.contains("full"), "{e}");
    let stored = tags(&env).await;
    for (tag, ok) in [("before", before.is_ok()), ("after", after.is_ok())] {
        assert_eq!(
            ok,
            stored.contains(&tag.to_string()),
            "{tag}: the caller was told {ok} but the database holds {stored:?}"
        );
    }
    assert!(before.is_err(), "undone with its batch");
    assert!(blocker.is_err(), "undone with its batch");
    // The store keeps working.
    store
        .write(|conn| {
            conn.execute_batch("PRAGMA max_page_count = 1073741823")
                .map_err(|e| onus::StoreError::Query(e.to_string(), None))
        })
        .await
        .unwrap();
    client
        .insert(NewJob::new("k", json!({"tag": "later"})))
        .await
        .unwrap();
}

/// A panic inside a write is that write's error; the writer thread and the store live on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_panic_in_a_write_is_contained() {
    let env = Env::new(Backend::Sqlite).await;
    let e = sqlite(&env)
        .write(|_conn| -> onus::store::StoreResult<()> { panic!("boom in a component's write") })
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("a write panicked: boom in a component's write"),
        "{e}"
    );
    env.client()
        .insert(NewJob::new("k", json!({})))
        .await
        .unwrap();
}

/// Another process holding the write lock long makes every queued write fail together
/// after one busy timeout, not one per busy timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_long_external_lock_fails_queued_writes_together() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("onus.db");
    let store = std::sync::Arc::new(
        onus::sqlite::SqliteStore::open(onus::sqlite::SqliteOptions {
            busy_timeout: Duration::from_millis(300),
            ..onus::sqlite::SqliteOptions::new(&path)
        })
        .await
        .unwrap(),
    );
    let other = Connection::open(&path).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let writes: Vec<_> = (0..5)
        .map(|_| {
            let s = store.clone();
            tokio::spawn(async move { s.write(|_conn| Ok(())).await })
        })
        .collect();
    crate::harness::wait_until("the first write gives up", || async {
        writes.iter().any(|w| w.is_finished())
    })
    .await;
    other.execute_batch("ROLLBACK").unwrap();
    for w in writes {
        let e = w.await.unwrap().unwrap_err();
        assert!(e.is_transient(), "{e}");
        assert!(
            e.to_string().contains("cannot begin a write transaction"),
            "{e}"
        );
    }
    store.write(|_conn| Ok(())).await.unwrap();
}

/// A full disk: inserts fail with an error that names it, never an "ok" for a job that was not
/// written; every insert answered "ok" is there; once there is room again inserts work without
/// a restart, and a fresh open of the file finds every confirmed job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_inserts_clearly_and_loses_no_confirmed_one() {
    let disk = onus_testkit::SmallDisk::mount(8 << 20).unwrap_or_else(|e| panic!("{e}"));
    let ballast = disk.path().join("ballast");
    std::fs::write(&ballast, vec![7u8; 4 << 20]).unwrap();
    let url = format!("sqlite://{}", disk.path().join("onus.db").display());
    let store = onus::open(&url).await.unwrap();
    let onus = onus::Onus::builder(store.clone()).build().unwrap();
    let client = onus.client();
    let pad = "x".repeat(16_000);
    let mut confirmed = Vec::new();
    let mut refused = None;
    for i in 0..2_000 {
        match client
            .insert(NewJob::new("disk.fill", json!({"i": i, "pad": pad})))
            .await
        {
            Ok(ins) => confirmed.push(ins.job.id),
            Err(e) => {
                refused = Some(e.to_string());
                break;
            }
        }
    }
    let refused = refused.expect("4 MiB left fill up before 2,000 jobs of 16 KB");
    assert!(
        refused.contains("full") && refused.contains("free space"),
        "the error names the full disk and what to do: {refused}"
    );
    assert!(
        confirmed.len() > 10,
        "some inserts fit: {}",
        confirmed.len()
    );
    for id in &confirmed {
        assert!(
            store.get(*id).await.unwrap().is_some(),
            "confirmed job {id} is there"
        );
    }

    // Room again: the next insert works, no restart needed.
    std::fs::remove_file(&ballast).unwrap();
    let after = client
        .insert(NewJob::new("disk.fill", json!({"after": true})))
        .await
        .expect("inserts work again once the disk has room");
    confirmed.push(after.job.id);

    // A fresh open of the file (as after a crash) finds every confirmed job.
    drop(client);
    drop(onus);
    drop(store);
    let reopened = onus::open(&url).await.unwrap();
    for id in &confirmed {
        assert!(
            reopened.get(*id).await.unwrap().is_some(),
            "job {id} after reopen"
        );
    }
    drop(reopened);
    drop(disk);
}

/// A SQLite file on a read-only filesystem: opening it for work fails at once with an error that
/// says so and what to do, and once the filesystem is writable again the same file opens with
/// every job it had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_file_is_refused_at_open_saying_why() {
    let disk = onus_testkit::SmallDisk::mount(8 << 20).unwrap_or_else(|e| panic!("{e}"));
    let url = format!("sqlite://{}", disk.path().join("onus.db").display());
    let store = onus::open(&url).await.unwrap();
    let id = onus::Onus::builder(store.clone())
        .build()
        .unwrap()
        .client()
        .insert(NewJob::new("ro.check", json!({})))
        .await
        .unwrap()
        .job
        .id;
    drop(store);
    disk.read_only(true).unwrap_or_else(|e| panic!("{e}"));
    let e = match onus::open(&url).await {
        Ok(_) => panic!("a read-only database opened for work"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("cannot open the SQLite database at") && e.contains("is writable"),
        "the error names the file and what to check: {e}"
    );
    disk.read_only(false).unwrap();
    let store = onus::open(&url).await.unwrap();
    assert!(store.get(id).await.unwrap().is_some());
    drop(store);
    drop(disk);
}

/// The SQLite file removed while the store has it open: a write would go into the unlinked file
/// and be lost at the next open, so every write from then on fails saying what happened, and
/// none is answered "ok".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_removed_under_the_store_fails_writes_instead_of_losing_them() {
    let env = Env::new(Backend::Sqlite).await;
    let client = env.client();
    client
        .insert(NewJob::new("rm.check", json!({"before": true})))
        .await
        .unwrap();
    let path = db_path(&env);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{path}{suffix}"));
    }
    for i in 0..3 {
        let e = client
            .insert(NewJob::new("rm.check", json!({"after": i})))
            .await
            .expect_err("a write into a removed file is refused")
            .to_string();
        assert!(e.contains("removed or replaced"), "{e}");
        assert!(e.contains("nothing of this write was kept"), "{e}");
    }
    // The health check (what `/healthz` asks) says so too.
    let h = env.store.health().await.expect_err("unhealthy").to_string();
    assert!(h.contains("removed or replaced"), "{h}");
}
