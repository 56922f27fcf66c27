//! PostgreSQL specifics: many processes on one database, a server restart, leader failover,
//! NOTIFY wake-ups, the outbox in the caller's own transaction, and clear connection errors.

use std::time::Duration;

use onus::postgres::tokio_postgres::{self, NoTls};
use onus::{
    Clock, EntryClass, JobContext, JobFilter, JobState, Kind, NewJob, Onus, Options, Periodic,
    Store,
};
use onus_testkit::PgCluster;
use serde_json::json;

use crate::harness::{wait_until, wait_until_within, Backend, Env};

async fn sql(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(conn);
    client
}

fn child(url: &str, mode: &str, index: usize) -> tokio::process::Child {
    crate::harness::spawn_child(url, mode, index, std::process::Stdio::null())
}

fn child_options() -> Options {
    Options {
        poll_interval: Duration::from_millis(200),
        lease_ttl: Duration::from_secs(2),
        heartbeat_interval: Duration::from_millis(400),
        rescue_interval: Duration::from_millis(250),
        maintenance_interval: Duration::from_millis(100),
        leader_ttl: Duration::from_secs(2),
        ..Options::default()
    }
}

/// Child process bodies for the tests below (selected by `ONUS_CHILD_MODE`).
pub fn child_main(url: &str, mode: &str) {
    let index: i32 = std::env::var("ONUS_CHILD_INDEX")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async move {
        let store = onus::open(url).await.unwrap();
        let b = Onus::builder(store).options(child_options());
        let b = match mode {
            "work" => {
                let check = std::sync::Arc::new(sql(url).await);
                b.queue("default", 10).kind(Kind::new("work").handler(move |ctx: JobContext| {
                    let check = check.clone();
                    async move {
                        let id = ctx.job().id;
                        check
                            .execute(
                                "INSERT INTO runs (job_id, process, started_at) VALUES ($1, $2, clock_timestamp())",
                                &[&id, &index],
                            )
                            .await?;
                        tokio::time::sleep(Duration::from_millis(3)).await; // the work itself
                        check
                            .execute(
                                "UPDATE runs SET finished_at = clock_timestamp()
                                 WHERE job_id = $1 AND process = $2 AND finished_at IS NULL",
                                &[&id, &index],
                            )
                            .await?;
                        Ok(())
                    }
                }))
            }
            "periodic" => b
                .kind(Kind::new("tick").policy(onus::Policy::preset_periodic()).handler(|_c: JobContext| async { Ok(()) }))
                .periodic(Periodic::new("every-second", "every 1s".parse().unwrap(), NewJob::new("tick", json!({})))),
            other => panic!("unknown child mode {other}"),
        };
        let _running = b.build().unwrap().start();
        std::future::pending::<()>().await;
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_one_killed_every_job_completes_and_none_runs_twice_at_once() {
    let env = Env::new(Backend::Postgres).await;
    let check = sql(&env.url).await;
    check
        .batch_execute("CREATE TABLE runs (job_id bigint NOT NULL, process integer NOT NULL, started_at timestamptz NOT NULL, finished_at timestamptz)")
        .await
        .unwrap();
    let client = env.client();
    for chunk in (0..5000).collect::<Vec<i32>>().chunks(1000) {
        client
            .insert_many(
                chunk
                    .iter()
                    .map(|i| NewJob::new("work", json!({"i": i})))
                    .collect(),
            )
            .await
            .unwrap();
    }
    let mut children: Vec<_> = (0..3).map(|i| child(&env.url, "work", i)).collect();
    wait_until("a fifth of the jobs completed", || async {
        env.count(JobState::Completed).await >= 1000
    })
    .await;
    let killed_pid = children[0].id().unwrap();
    children[0].start_kill().unwrap(); // SIGKILL, mid-run
    children[0].wait().await.unwrap();
    let killed_at: chrono::DateTime<chrono::Utc> = check
        .query_one("SELECT clock_timestamp()", &[])
        .await
        .unwrap()
        .get(0);
    wait_until_within(
        "all 5,000 jobs completed",
        Duration::from_secs(90),
        || async { env.count(JobState::Completed).await == 5000 },
    )
    .await;
    for c in children.iter_mut() {
        let _ = c.start_kill();
        let _ = c.wait().await;
    }
    let overlaps: i64 = check
        .query_one(
            "SELECT count(*) FROM runs a JOIN runs b ON a.job_id = b.job_id AND a.process < b.process
             WHERE a.started_at < COALESCE(b.finished_at, $1) AND b.started_at < COALESCE(a.finished_at, $1)",
            &[&killed_at],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(overlaps, 0, "no job ever ran in two processes at once");
    let unfinished: i64 = check
        .query_one(
            "SELECT count(*) FROM runs WHERE finished_at IS NULL AND process != 0",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(unfinished, 0);
    let all = env
        .store
        .list(&JobFilter::default(), 10_000, None)
        .await
        .unwrap();
    let lost: std::collections::HashSet<i64> = all
        .iter()
        .filter(|j| j.errors.iter().any(|e| e.class == EntryClass::WorkerLost))
        .map(|j| j.id)
        .collect();
    let interrupted: Vec<i64> = check
        .query(
            "SELECT job_id FROM runs WHERE finished_at IS NULL AND process = 0",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        interrupted.iter().all(|id| lost.contains(id)),
        "every job cut off by the kill was rescued as worker lost: {interrupted:?} vs {lost:?}"
    );
    // Rescued were only jobs the killed process held (cut off mid-run, claimed but not started, or
    // run but not yet recorded), never a live process's.
    let killed_owner = format!(":{killed_pid}:");
    let wrongly: Vec<String> = all
        .iter()
        .flat_map(|j| j.errors.iter())
        .filter(|e| e.class == EntryClass::WorkerLost && !e.message.contains(&killed_owner))
        .map(|e| e.message.clone())
        .collect();
    assert!(
        wrongly.is_empty(),
        "a live process's job was rescued: {wrongly:?}"
    );
    assert!(!lost.is_empty(), "the kill hit jobs in flight");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_mid_run_is_survived() {
    let pg = PgCluster::start().unwrap();
    let url = pg.fresh_database().await.unwrap();
    let store = onus::open(&url).await.unwrap();
    let onus = Onus::builder(store.clone())
        .options(Options {
            poll_interval: Duration::from_millis(100),
            ..Options::default()
        })
        .queue("default", 8)
        .kind(Kind::new("work").handler(|_c: JobContext| async {
            tokio::time::sleep(Duration::from_millis(1)).await; // the work itself
            Ok(())
        }))
        .build()
        .unwrap();
    let client = onus.client();
    client
        .insert_many((0..3000).map(|_| NewJob::new("work", json!({}))).collect())
        .await
        .unwrap();
    let running = onus.start();
    let count = |state: JobState| {
        let store = store.clone();
        async move {
            let f = JobFilter {
                states: vec![state],
                ..Default::default()
            };
            store
                .list(&f, 10_000, None)
                .await
                .map(|v| v.len())
                .unwrap_or(0)
        }
    };
    wait_until("some jobs completed", || {
        count(JobState::Completed).then(|n| async move { n >= 300 })
    })
    .await;
    pg.stop().unwrap();
    assert!(store.get(1).await.is_err(), "the server is down");
    pg.restart().unwrap();
    wait_until("every job completed after the restart", || {
        count(JobState::Completed).then(|n| async move { n == 3000 })
    })
    .await;
    // Jobs whose attempt was cut off by the restart ran again at most; none was lost.
    let all = store
        .list(&JobFilter::default(), 10_000, None)
        .await
        .unwrap();
    assert!(all.iter().all(|j| j.state == JobState::Completed));
    running.shutdown(Duration::from_secs(5)).await;
}

use futures_util::FutureExt as _;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_failover_keeps_one_enqueue_per_period() {
    let env = Env::new(Backend::Postgres).await;
    let db = sql(&env.url).await;
    let holder = || async {
        db.query_opt(
            "SELECT holder FROM onus_leader WHERE name = 'onus.periodic' AND expires_at > now()",
            &[],
        )
        .await
        .unwrap()
        .map(|r| r.get::<_, String>(0))
    };
    let mut a = child(&env.url, "periodic", 0);
    let a_pid = a.id().unwrap();
    wait_until("the first process leads", || async {
        holder()
            .await
            .is_some_and(|h| h.contains(&format!(":{a_pid}:")))
    })
    .await;
    let mut b = child(&env.url, "periodic", 1);
    let b_pid = b.id().unwrap();
    let ticks = || async {
        let f = JobFilter {
            kinds: vec!["tick".into()],
            ..Default::default()
        };
        env.store.list(&f, 10_000, None).await.unwrap()
    };
    wait_until("three periods enqueued", || async {
        ticks().await.len() >= 3
    })
    .await;
    a.start_kill().unwrap(); // SIGKILL the leader
    a.wait().await.unwrap();
    let killed = std::time::Instant::now();
    wait_until("the second process leads", || async {
        holder()
            .await
            .is_some_and(|h| h.contains(&format!(":{b_pid}:")))
    })
    .await;
    assert!(
        killed.elapsed() < Duration::from_secs(10),
        "took over within a few seconds"
    );
    let before = ticks().await.len();
    wait_until("four more periods enqueued", || async {
        ticks().await.len() >= before + 4
    })
    .await;
    b.start_kill().unwrap();
    b.wait().await.unwrap();
    let mut periods: Vec<i64> = ticks()
        .await
        .iter()
        .map(|j| {
            j.unique_key
                .as_deref()
                .unwrap()
                .rsplit_once('@')
                .unwrap()
                .1
                .parse()
                .unwrap()
        })
        .collect();
    periods.sort_unstable();
    let n = periods.len();
    periods.dedup();
    assert_eq!(periods.len(), n, "no period enqueued twice");
    for w in periods.windows(2) {
        assert_eq!(w[1] - w[0], 1_000_000, "no period skipped: {periods:?}");
    }
    let _ = env.clock.now();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_job_commits_with_the_callers_transaction_or_not_at_all() {
    let env = Env::new(Backend::Postgres).await;
    let onus = Onus::builder(env.store.clone())
        .options(Options {
            poll_interval: Duration::from_secs(600),
            ..Options::default()
        })
        .kind(Kind::new("receipt.send").handler(|_c: JobContext| async { Ok(()) }))
        .build()
        .unwrap();
    let client = onus.client();
    let running = onus.start();
    let mut db = sql(&env.url).await;
    db.batch_execute("CREATE TABLE orders (id bigint PRIMARY KEY, total bigint NOT NULL)")
        .await
        .unwrap();

    let tx = db.transaction().await.unwrap();
    tx.execute("INSERT INTO orders VALUES (1, 100)", &[])
        .await
        .unwrap();
    let ghost = client
        .insert_in(
            &onus::sql::PgTx::new(&tx),
            NewJob::new("receipt.send", json!({"order": 1})),
        )
        .await
        .unwrap()
        .job
        .id;
    tx.rollback().await.unwrap();
    assert!(
        env.store.get(ghost).await.unwrap().is_none(),
        "a rolled-back job never exists"
    );

    let tx = db.transaction().await.unwrap();
    tx.execute("INSERT INTO orders VALUES (2, 200)", &[])
        .await
        .unwrap();
    let id = client
        .insert_in(
            &onus::sql::PgTx::new(&tx),
            NewJob::new("receipt.send", json!({"order": 2})),
        )
        .await
        .unwrap()
        .job
        .id;
    tx.commit().await.unwrap();
    // Picked up by the commit's notice (the poll interval is 10 minutes).
    env.wait_state(id, JobState::Completed).await;
    let orders: i64 = db
        .query_one("SELECT count(*) FROM orders", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(orders, 1);
    running.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_and_credentials_fail_at_start_with_what_is_wrong() {
    let pg = PgCluster::shared();
    let e = onus::open(&pg.url("no_such_db"))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("database \"no_such_db\" does not exist"), "{e}");
    let e = onus::open(&format!(
        "postgres://nobody:secret@127.0.0.1:{}/postgres",
        pg.port()
    ))
    .await
    .unwrap_err()
    .to_string();
    assert!(e.contains("role \"nobody\" does not exist"), "{e}");
    assert!(!e.contains("secret"), "the password is never shown: {e}");
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let e = onus::open(&format!("postgres://postgres@127.0.0.1:{closed}/x"))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("cannot connect to PostgreSQL") && e.contains("ONUS_DATABASE_URL"),
        "{e}"
    );
    let e = onus::open("postgres://host:notaport/db")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a PostgreSQL URL"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_cut_off_longer_than_its_lease_drops_its_attempts() {
    struct Dropped(std::sync::Arc<std::sync::atomic::AtomicBool>);
    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
    let pg = PgCluster::start().unwrap();
    let url = pg.fresh_database().await.unwrap();
    let store = onus::open(&url).await.unwrap();
    let dropped = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let d = dropped.clone();
    let onus = Onus::builder(store.clone())
        .options(Options {
            lease_ttl: Duration::from_secs(2),
            heartbeat_interval: Duration::from_millis(200),
            rescue_interval: Duration::from_millis(200),
            poll_interval: Duration::from_millis(200),
            ..Options::default()
        })
        .kind(Kind::new("long").handler(move |ctx: JobContext| {
            let d = d.clone();
            async move {
                if ctx.attempt() == 1 {
                    let _guard = Dropped(d);
                    std::future::pending::<()>().await;
                }
                Ok(())
            }
        }))
        .build()
        .unwrap();
    let id = crate::harness::insert_id(&onus.client(), NewJob::new("long", json!({}))).await;
    let running = onus.start();
    wait_until("the first attempt runs", || async {
        store
            .get(id)
            .await
            .ok()
            .flatten()
            .is_some_and(|j| j.state == JobState::Running)
    })
    .await;
    pg.stop().unwrap();
    // Cut off for most of a lease: the attempt is dropped, so no rescuer elsewhere can overlap it.
    wait_until("the attempt was dropped", || async {
        dropped.load(std::sync::atomic::Ordering::SeqCst)
    })
    .await;
    pg.restart().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let j = loop {
        if let Ok(Some(j)) = store.get(id).await {
            if j.state == JobState::Completed {
                break j;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the job was never rescued and completed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(j.attempt, 2);
    assert_eq!(j.errors[0].class, EntryClass::WorkerLost);
    running.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_read_only_the_partial_indexes_of_waiting_jobs() {
    let env = Env::new(Backend::Postgres).await;
    let client = env.client();
    let rows = client
        .insert_many((0..2000).map(|_| NewJob::new("old", json!({}))).collect())
        .await
        .unwrap();
    let ids: Vec<i64> = rows.iter().map(|r| r.job.id).collect();
    client
        .cancel_where(&JobFilter {
            ids,
            ..Default::default()
        })
        .await
        .unwrap();
    let db = sql(&env.url).await;
    db.batch_execute("ANALYZE onus_live; SET enable_seqscan = off")
        .await
        .unwrap();
    let claim = include_str!("../../src/store/postgres/claim.sql");
    let now = chrono::Utc::now();
    let kinds = vec!["k".to_string()];
    // The claim's plan for `limit` jobs, as text.
    let explain = async |limit: i64| -> String {
        let plan: Vec<String> = db
            .query(
                &format!("EXPLAIN {claim}"),
                &[&now, &"w", &now, &"default", &kinds, &limit],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        plan.join("\n")
    };
    let text = explain(10).await;
    assert!(text.contains("onus_live_available"), "{text}");
    assert!(text.contains("onus_live_delayed"), "{text}");
    assert!(!text.contains("Seq Scan on onus_live"), "{text}");
    assert!(!text.contains("Seq Scan on onus_job_rows"), "{text}");

    // A backlog, then a vacuum: the table's statistics now say what it held then, and the claim,
    // in its transaction's settings (`CLAIM_PLAN`), still walks the index of available jobs in
    // its order and stops at its LIMIT; it never reads every waiting job through a bitmap to sort
    // them, as a claim's generic plan did once a vacuum had run during a backlog of 100,000 (seen
    // with auto_explain; not reproduced at this size, where the planner already walks the index).
    // A claim's statement is prepared once and runs many times: its plan is the generic one.
    db.batch_execute("RESET enable_seqscan; SET plan_cache_mode = force_generic_plan")
        .await
        .unwrap();
    client
        .insert_many((0..2000).map(|_| NewJob::new("k", json!({}))).collect())
        .await
        .unwrap();
    db.batch_execute("VACUUM onus_live").await.unwrap();
    // The plan a prepared claim runs with (`EXPLAIN` of the statement itself would plan it for
    // these parameters' values).
    db.batch_execute(&format!(
        "PREPARE claim AS {claim}; BEGIN; {}",
        onus::postgres::CLAIM_PLAN
    ))
    .await
    .unwrap();
    let plan: Vec<String> = db
        .query(
            &format!(
                "EXPLAIN EXECUTE claim('{at}', 'w', '{at}', 'default', ARRAY['k'], 500)",
                at = now.to_rfc3339()
            ),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let text = plan.join("\n");
    db.batch_execute("ROLLBACK; DEALLOCATE claim")
        .await
        .unwrap();
    assert!(
        text.contains("$4"),
        "a generic plan, with its parameters: {text}"
    );
    assert!(
        text.contains("Index Scan using onus_live_available"),
        "{text}"
    );
    assert!(
        !text.contains("Bitmap Index Scan on onus_live_available"),
        "{text}"
    );
    assert!(!text.contains("Seq Scan on onus_live"), "{text}");
}

/// A process whose database connection freezes (a proxy that stops
/// forwarding: no error, no reset, only silence) drops its attempt before the lease runs out, so
/// the rescuer's attempt in another process never runs beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_frozen_connection_never_runs_an_attempt_beside_the_rescuers() {
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    #[derive(Default)]
    struct Runs(Mutex<Vec<(u32, Instant, Option<Instant>)>>);
    struct Run(Arc<Runs>, usize);
    impl Drop for Run {
        fn drop(&mut self) {
            self.0 .0.lock().unwrap()[self.1].2 = Some(Instant::now());
        }
    }
    fn kind(runs: &Arc<Runs>) -> Kind {
        let runs = runs.clone();
        Kind::new("long").handler(move |ctx: JobContext| {
            let runs = runs.clone();
            async move {
                let i = {
                    let mut r = runs.0.lock().unwrap();
                    r.push((ctx.attempt(), Instant::now(), None));
                    r.len() - 1
                };
                let _run = Run(runs, i);
                if ctx.attempt() == 1 {
                    std::future::pending::<()>().await;
                }
                Ok(())
            }
        })
    }
    let options = || Options {
        lease_ttl: Duration::from_secs(2),
        heartbeat_interval: Duration::from_millis(200),
        rescue_interval: Duration::from_millis(200),
        poll_interval: Duration::from_millis(200),
        ..Options::default()
    };
    let env = Env::new(Backend::Postgres).await;
    let pg = PgCluster::shared();
    let proxy = onus_testkit::TcpProxy::start(([127, 0, 0, 1], pg.port()).into())
        .await
        .unwrap();
    let via_proxy = env.url.replace(
        &format!(":{}/", pg.port()),
        &format!(":{}/", proxy.addr().port()),
    );
    let runs = Arc::new(Runs::default());
    let a = Onus::builder(onus::open(&via_proxy).await.unwrap())
        .options(options())
        .kind(kind(&runs))
        .build()
        .unwrap();
    let id = crate::harness::insert_id(&a.client(), NewJob::new("long", json!({}))).await;
    let ra = a.start();
    wait_until("attempt 1 runs", || async {
        runs.0.lock().unwrap().len() == 1
    })
    .await;
    proxy.freeze();
    let b = Onus::builder(env.reopen().await)
        .options(options())
        .kind(kind(&runs))
        .build()
        .unwrap();
    let rb = b.start();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let j = loop {
        let j = env.job(id).await;
        if j.state == JobState::Completed {
            break j;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never rescued: {j:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(j.attempt, 2);
    assert_eq!(j.errors[0].class, EntryClass::WorkerLost);
    let r = runs.0.lock().unwrap().clone();
    assert_eq!(r.len(), 2, "{r:?}");
    let first_ended = r[0].2.expect("attempt 1 was dropped");
    assert!(
        first_ended < r[1].1,
        "attempt 2 started {:?} before attempt 1 was dropped",
        first_ended - r[1].1
    );
    rb.shutdown(Duration::from_secs(1)).await;
    proxy.thaw();
    ra.shutdown(Duration::from_secs(1)).await;
}

/// Two finishers whose batches release the same lease keys in opposite orders take the
/// keys' locks in one order, so they cannot deadlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_finishers_take_lease_key_locks_in_one_order() {
    use onus::store::{ClaimRequest, Finish};
    let env = Env::new(Backend::Postgres).await;
    let client = env.client();
    let mut ids = Vec::new();
    for key in ["k1", "k2", "k2", "k1"] {
        ids.push(
            crate::harness::insert_id(&client, NewJob::new("k", json!({})).lease_key(key)).await,
        );
    }
    let now = env.clock_now();
    let until = now + chrono::TimeDelta::seconds(30);
    let jobs = env
        .store
        .claim(ClaimRequest {
            queue: "default".into(),
            kinds: vec!["k".into()],
            limit: 10,
            owner: "o".into(),
            now,
            lease_until: until,
            caps: Vec::new(),
            // Two slots a key: the claim takes a slot for each of the four.
            lease_slots: vec![("k".into(), 2)],
        })
        .await
        .unwrap();
    assert_eq!(jobs.len(), 4);
    let done = |id: i64, key: &str| Finish {
        id,
        owner: "o".into(),
        attempt: 1,
        transition: onus::outcome::Transition::Complete,
        now,
        release_lease: Some(key.into()),
        periodic: None,
        expired_before: None,
        result: None,
    };
    let lock = sql(&env.url).await;
    lock.execute(
        "SELECT pg_advisory_lock(hashtextextended('onus.lease:' || $1, 0))",
        &[&"k1"],
    )
    .await
    .unwrap();
    let waiting = || async {
        let n: i64 = lock
            .query_one(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        n
    };
    let (s1, s2) = (env.store.clone(), env.store.clone());
    let a = vec![done(ids[0], "k1"), done(ids[1], "k2")];
    let b = vec![done(ids[2], "k2"), done(ids[3], "k1")];
    let f1 = tokio::spawn(async move { s1.finish(&a).await });
    wait_until("the first finisher waits for k1", || async {
        waiting().await == 1
    })
    .await;
    let f2 = tokio::spawn(async move { s2.finish(&b).await });
    wait_until("the second finisher waits too", || async {
        waiting().await == 2
    })
    .await;
    lock.execute(
        "SELECT pg_advisory_unlock(hashtextextended('onus.lease:' || $1, 0))",
        &[&"k1"],
    )
    .await
    .unwrap();
    assert_eq!(f1.await.unwrap().unwrap(), vec![true, true]);
    assert_eq!(f2.await.unwrap().unwrap(), vec![true, true]);
}

/// A renewal never waits for a row lock. A held job whose row another transaction has locked
/// (a completion batch being written) is skipped: neither renewed nor lost. Renewals that waited
/// instead deadlocked with completion batches, each holding rows the other needed, and PostgreSQL
/// failed one of them after a second (seen with thousands of jobs held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_renewal_skips_a_row_being_written_instead_of_waiting() {
    use onus::store::{ClaimRequest, HeldJob};
    let env = Env::new(Backend::Postgres).await;
    let client = env.client();
    for _ in 0..2 {
        crate::harness::insert_id(&client, NewJob::new("k", json!({}))).await;
    }
    let now = env.clock_now();
    let jobs = env
        .store
        .claim(ClaimRequest {
            queue: "default".into(),
            kinds: vec!["k".into()],
            limit: 2,
            owner: "o".into(),
            now,
            lease_until: now + chrono::TimeDelta::seconds(30),
            caps: Vec::new(),
            lease_slots: Vec::new(),
        })
        .await
        .unwrap();
    assert_eq!(jobs.len(), 2);
    let held: Vec<HeldJob> = jobs
        .iter()
        .map(|j| HeldJob {
            id: j.id,
            attempt: j.attempt,
        })
        .collect();
    let (locked, free) = (jobs[0].id, jobs[1].id);
    let mut lock = sql(&env.url).await;
    let tx = lock.transaction().await.unwrap();
    tx.execute(
        "SELECT 1 FROM onus_live WHERE id = $1 FOR UPDATE",
        &[&locked],
    )
    .await
    .unwrap();
    let later = now + chrono::TimeDelta::seconds(90);
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        env.store.heartbeat("o", &held, later),
    )
    .await
    .expect("the renewal does not wait for the locked row")
    .unwrap();
    assert_eq!(r.renewed, vec![free]);
    assert!(r.lost.is_empty(), "a locked row is still this process's");
    tx.rollback().await.unwrap();
    let get = |id| {
        let store = env.store.clone();
        async move { store.get(id).await.unwrap().unwrap().lease_expires_at }
    };
    assert_eq!(get(free).await, Some(later));
    assert_eq!(
        get(locked).await,
        Some(now + chrono::TimeDelta::seconds(30))
    );
    // Unlocked, the next renewal takes it.
    let r = env.store.heartbeat("o", &held, later).await.unwrap();
    assert_eq!(r.renewed.len(), 2);
    assert_eq!(get(locked).await, Some(later));
}

/// Every pull claim has an owner of its own; the claim cursors were keyed by owner and grew by
/// one entry a claim for ever. 10,000 claims leave the map small.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_pull_claims_leave_the_cursor_map_bounded() {
    use onus::store::{ClaimRequest, InsertRow};
    let env = Env::new(Backend::Postgres).await;
    let store = onus::postgres::PostgresStore::open(&env.url).await.unwrap();
    let client = env.client();
    const N: usize = 10_000;
    let rows: Vec<InsertRow> = (0..N)
        .map(|i| {
            let kind = if i % 2 == 0 { "a" } else { "b" };
            client.prepare(NewJob::new(kind, json!({}))).unwrap()
        })
        .collect();
    for chunk in rows.chunks(1000) {
        env.store.insert(chunk.to_vec()).await.unwrap();
    }
    let now = env.clock_now();
    let mut claimed = 0;
    for i in 0..N {
        // Outside workers ask for either kind or both, each claim under a new owner.
        let kinds: Vec<String> = match i % 3 {
            0 => vec!["a".into()],
            1 => vec!["b".into()],
            _ => vec!["b".into(), "a".into()],
        };
        claimed += store
            .claim(ClaimRequest {
                queue: "default".into(),
                kinds,
                limit: 1,
                owner: format!("pull:{i:024}"),
                now,
                lease_until: now + chrono::TimeDelta::seconds(60),
                caps: Vec::new(),
                lease_slots: Vec::new(),
            })
            .await
            .unwrap()
            .len();
        assert!(
            store.claim_cursors() <= 3,
            "{} cursors after {i} claims",
            store.claim_cursors()
        );
    }
    assert!(claimed > N / 2, "the claims took jobs: {claimed}");
}

/// A pull worker's heartbeat on a row another transaction held for a moment (a completion batch,
/// a cancel) was answered "lease lost" (409) although the lease was current: it waits for the
/// row, and when the row stays locked longer it says to try again (503), never 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_pull_heartbeat_on_a_locked_row_is_not_lease_lost() {
    let env = Env::new(Backend::Postgres).await;
    let onus = env.builder().kind(Kind::new("remote")).build().unwrap();
    let client = onus.client();
    let id = crate::harness::insert_id(&client, NewJob::new("remote", json!({}))).await;
    let claimed = client
        .claim_for_worker("default", &["remote".to_string()], 1, Duration::ZERO)
        .await
        .unwrap();
    let token = claimed[0].lease_token.clone();
    let mut lock = sql(&env.url).await;
    // Held for longer than a heartbeat waits: "try again", a service fault, not a conflict.
    let tx = lock.transaction().await.unwrap();
    tx.execute("SELECT 1 FROM onus_live WHERE id = $1 FOR UPDATE", &[&id])
        .await
        .unwrap();
    let refused = client.heartbeat_lease(id, &token, None).await.unwrap_err();
    assert_eq!(refused.fault(), onus::Fault::Service, "{refused}");
    assert!(refused.to_string().contains("again"), "{refused}");
    // Held briefly: the heartbeat waits for the row and renews.
    let beat = {
        let (client, token) = (client.clone(), token.clone());
        tokio::spawn(async move { client.heartbeat_lease(id, &token, None).await })
    };
    // The lock stays through a few of the heartbeat's looks at the row.
    tokio::time::sleep(Duration::from_millis(200)).await;
    tx.commit().await.unwrap();
    // It renewed once the row was free; on a machine stalled past its wait it said "try
    // again" (never "lease lost"), and the next heartbeat renews.
    if let Err(e) = beat.await.unwrap() {
        assert_eq!(e.fault(), onus::Fault::Service, "{e}");
        client.heartbeat_lease(id, &token, None).await.unwrap();
    }
    let done = client.answer(id, &token, Ok(())).await.unwrap();
    assert_eq!(done.state, JobState::Completed);
}

/// The table of unfinished jobs is vacuumed by the process that ends its jobs (not when
/// autovacuum next looks): once 5,000 have ended since its last pass, or as many as the table's
/// live rows then if more, or 5,000 whatever the live rows when a claim finds nothing or the
/// process holds no job; while a snapshot is held open elsewhere (which keeps what a pass would
/// remove), twice as many as the last pass waited for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_table_of_unfinished_jobs_is_vacuumed_as_its_jobs_end() {
    use onus::outcome::Transition;
    use onus::store::{ClaimRequest, Finish, InsertRow};
    let env = Env::new(Backend::Postgres).await;
    let store = onus::postgres::PostgresStore::open(&env.url).await.unwrap();
    let client = env.client();
    let db = sql(&env.url).await;
    // Autovacuum stays out of the way (a pass of its own would make ours skip the table).
    db.batch_execute("ALTER TABLE onus_live SET (autovacuum_enabled = false)")
        .await
        .unwrap();
    let now = env.clock_now();
    let insert = async |n: usize| {
        for _ in 0..n / 1000 {
            let rows: Vec<InsertRow> = (0..1000)
                .map(|_| client.prepare(NewJob::new("k", json!({}))).unwrap())
                .collect();
            store.insert(rows).await.unwrap();
        }
    };
    // Claims and completes `n` jobs through `store`, in batches of up to 1,000; answers how many
    // it found.
    let work = async |n: usize| -> usize {
        let mut found = 0;
        while found < n {
            let jobs = store
                .claim(ClaimRequest {
                    queue: "default".into(),
                    kinds: vec!["k".into()],
                    limit: (n - found).min(1000),
                    owner: "w".into(),
                    now,
                    lease_until: now + chrono::TimeDelta::seconds(60),
                    caps: Vec::new(),
                    lease_slots: Vec::new(),
                })
                .await
                .unwrap();
            if jobs.is_empty() {
                break;
            }
            found += jobs.len();
            let done = store
                .finish(
                    &jobs
                        .iter()
                        .map(|j| Finish {
                            id: j.id,
                            owner: "w".into(),
                            attempt: j.attempt,
                            transition: Transition::Complete,
                            now,
                            release_lease: None,
                            periodic: None,
                            expired_before: None,
                            result: None,
                        })
                        .collect::<Vec<_>>(),
                )
                .await
                .unwrap();
            assert!(done.iter().all(|d| *d));
        }
        found
    };
    let run = async |n: usize| {
        insert(n).await;
        assert_eq!(work(n).await, n);
    };
    // The passes made, and the dead row versions counted in the table's pages (the statistics'
    // count is reported up to a second late, and after a pass counts versions it removed).
    db.batch_execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
        .await
        .unwrap();
    let vacuums = async || -> (i64, i64) {
        let r = db
            .query_one(
                "SELECT vacuum_count, (SELECT dead_tuple_count FROM pgstattuple('onus_live'))
                 FROM pg_stat_user_tables WHERE relname = 'onus_live'",
                &[],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    run(4000).await;
    assert_eq!(store.vacuum_passes(), 0, "no pass before 5,000 jobs ended");
    run(1000).await;
    assert_eq!(store.vacuum_passes(), 1);
    wait_until("the pass over onus_live", async || vacuums().await.0 == 1).await;
    // The 10,000 dead versions the jobs left are gone.
    assert!(
        vacuums().await.1 < 5000,
        "dead versions left: {:?}",
        vacuums().await
    );

    // A backlog of 40,000: the next pass comes once as many jobs ended as the table's live rows.
    insert(40_000).await;
    assert_eq!(work(6000).await, 6000);
    assert_eq!(store.vacuum_passes(), 2, "after 5,000 jobs ended");
    wait_until("the pass over the backlog", async || vacuums().await.0 == 2).await;
    assert_eq!(work(20_000).await, 20_000);
    assert_eq!(
        store.vacuum_passes(),
        2,
        "no pass before as many as its live rows ended"
    );
    // Once the process holds no job, 5,000 are enough; that pass waits for one already running
    // (here a lock as another process's pass holds it) rather than skipping the table. Jobs
    // nobody claims here keep the table's live rows above what ends next.
    let others = client
        .insert_many((0..10_000).map(|_| NewJob::new("z", json!({}))).collect())
        .await
        .unwrap();
    let locker = sql(&env.url).await;
    locker
        .batch_execute("BEGIN; LOCK TABLE onus_live IN SHARE UPDATE EXCLUSIVE MODE")
        .await
        .unwrap();
    store.idle();
    assert_eq!(
        store.vacuum_passes(),
        3,
        "a pass when the process holds nothing"
    );
    wait_until("the pass waiting for the other", async || {
        db.query_one(
            "SELECT count(*) FROM pg_locks WHERE relation = 'onus_live'::regclass AND NOT granted",
            &[],
        )
        .await
        .unwrap()
        .get::<_, i64>(0)
            == 1
    })
    .await;
    assert_eq!(vacuums().await.0, 2);
    locker.batch_execute("COMMIT").await.unwrap();
    wait_until("the pass after the other", async || vacuums().await.0 == 3).await;
    // So is a claim that finds nothing: 14,000 ended, fewer than the 24,000 live rows.
    assert_eq!(work(20_000).await, 14_000);
    assert_eq!(
        store.vacuum_passes(),
        4,
        "a pass when a claim found nothing"
    );
    wait_until("the idle pass", async || vacuums().await.0 == 4).await;
    client
        .cancel_where(&JobFilter {
            ids: others.iter().map(|r| r.job.id).collect(),
            ..Default::default()
        })
        .await
        .unwrap();

    // A snapshot held open elsewhere keeps every version the next pass would remove.
    let holder = sql(&env.url).await;
    holder
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM onus_jobs")
        .await
        .unwrap();
    // A snapshot counts once it is older than a second (a claim's or a completion's is not).
    wait_until("a snapshot older than a second", async || {
        db.query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_xmin IS NOT NULL
               AND xact_start < statement_timestamp() - interval '1 second'",
            &[],
        )
        .await
        .unwrap()
        .get::<_, i64>(0)
            >= 1
    })
    .await;
    // (The last pass saw about 10,000 live rows, the jobs of kind z, as estimated by the vacuum:
    // the next is due after as many. The estimate can read higher, the statistics of the last
    // claims and completions arriving apart: the process going idle then starts the pass.)
    run(15_000).await;
    store.idle();
    assert_eq!(store.vacuum_passes(), 5);
    wait_until("the pass under the snapshot", async || {
        vacuums().await.0 == 5
    })
    .await;
    let left = vacuums().await.1;
    assert!(
        left >= 18_000,
        "the held snapshot kept the versions: {left}"
    );
    // The next pass waits for twice as many jobs to end, even when the queue runs dry.
    run(5000).await;
    assert_eq!(work(1).await, 0);
    store.idle();
    assert_eq!(
        store.vacuum_passes(),
        5,
        "no pass before twice as many ended while the snapshot is held"
    );
    holder.batch_execute("ROLLBACK").await.unwrap();
    run(5000).await;
    assert_eq!(store.vacuum_passes(), 6);
    wait_until("the pass after the snapshot", async || {
        vacuums().await.0 == 6
    })
    .await;
    assert!(
        vacuums().await.1 < 5000,
        "dead versions left: {:?}",
        vacuums().await
    );
}
