//! Nothing is lost: rescue after a dead process, graceful shutdown, SIGKILL, many writers, retention.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use onus::store::ClaimRequest;
use onus::{Clock, EntryClass, JobContext, JobFilter, JobState, Kind, NewJob, Onus};
use serde_json::json;

use crate::harness::{fast_options, wait_until, Env};

/// Claims every due job of `kind` as a process that then "dies" (never heartbeats).
async fn claim_as_dead_process(env: &Env, kind: &str) -> Vec<onus::Job> {
    let now = env.clock_now();
    env.store
        .claim(ClaimRequest {
            queue: "default".into(),
            kinds: vec![kind.into()],
            limit: 100,
            owner: "dead-process".into(),
            now,
            lease_until: now + chrono::TimeDelta::seconds(30),
            caps: Vec::new(),
            lease_slots: Vec::new(),
        })
        .await
        .unwrap()
}

pub async fn rescuer_turns_expired_leases_into_failed_attempts(env: Env) {
    let onus = env
        .builder()
        .kind(Kind::new("k").handler(|_c: JobContext| async { Ok(()) }))
        .build()
        .unwrap();
    let client = onus.client();
    let id = crate::harness::insert_id(&client, NewJob::new("k", json!({})).lease_key("ep")).await;
    let claimed = claim_as_dead_process(&env, "k").await;
    assert_eq!(claimed.len(), 1);
    let now = env.clock_now();
    assert_eq!(
        env.store
            .acquire_lease(
                "ep",
                1,
                &claimed[0],
                "dead-process",
                now,
                now + chrono::TimeDelta::seconds(30)
            )
            .await
            .unwrap(),
        onus::store::LeaseDecision::Acquired
    );
    // A second job whose process died longer ago: once it is rescued, the rescuer has looked.
    let older = crate::harness::insert_id(&client, NewJob::new("k", json!({}))).await;
    let now = env.clock_now();
    env.store
        .claim(ClaimRequest {
            queue: "default".into(),
            kinds: vec!["k".into()],
            limit: 1,
            owner: "dead-long-ago".into(),
            now,
            lease_until: now - chrono::TimeDelta::seconds(1),
            caps: Vec::new(),
            lease_slots: Vec::new(),
        })
        .await
        .unwrap();
    let running = onus.start();
    env.wait_state(older, JobState::Retryable).await;
    assert_eq!(
        env.job(id).await.state,
        JobState::Running,
        "a live lease is left alone"
    );
    env.clock.advance(Duration::from_secs(31));
    let j = env.wait_state(id, JobState::Retryable).await;
    assert_eq!(j.attempt, 1);
    assert_eq!(j.errors[0].class, EntryClass::WorkerLost);
    assert_eq!(j.lease_owner, None);
    env.clock.advance_to(j.run_at);
    let j = env.wait_state(id, JobState::Completed).await;
    assert_eq!(
        j.attempt, 2,
        "the lost attempt counted, then the job ran again"
    );
    // The dead process's lease-key slot was released with the rescue.
    let same_key =
        crate::harness::insert_id(&client, NewJob::new("k", json!({})).lease_key("ep")).await;
    let j = env.wait_state(same_key, JobState::Completed).await;
    assert_eq!(j.snoozes, 0);
    running.shutdown(Duration::from_secs(5)).await;
}

pub async fn rescuer_ignores_unknown_kinds(env: Env) {
    let onus = env
        .builder()
        .kind(Kind::new("k").handler(|_c: JobContext| async { Ok(()) }))
        .build()
        .unwrap();
    let client = onus.client();
    let unknown = crate::harness::insert_id(&client, NewJob::new("stranger", json!({}))).await;
    let known = crate::harness::insert_id(&client, NewJob::new("k", json!({}))).await;
    claim_as_dead_process(&env, "stranger").await;
    claim_as_dead_process(&env, "k").await;
    let running = onus.start();
    env.clock.advance(Duration::from_secs(31));
    env.wait_state(known, JobState::Retryable).await;
    let u = env.job(unknown).await;
    assert_eq!(
        u.state,
        JobState::Running,
        "never rescued by a process that does not know its kind"
    );
    assert!(u.errors.is_empty());
    running.shutdown(Duration::from_secs(5)).await;
}

pub async fn graceful_shutdown_returns_jobs_unspent(env: Env) {
    let gate = Arc::new(tokio::sync::Notify::new());
    let g = gate.clone();
    let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let st = started.clone();
    let onus = env
        .builder()
        .kind(Kind::new("stuck").handler(|_c: JobContext| async {
            std::future::pending::<()>().await;
            Ok(())
        }))
        .kind(Kind::new("quick").handler(move |_c: JobContext| {
            let (g, st) = (g.clone(), st.clone());
            async move {
                st.store(true, std::sync::atomic::Ordering::SeqCst);
                g.notified().await;
                Ok(())
            }
        }))
        .build()
        .unwrap();
    let client = onus.client();
    let stuck: Vec<i64> = client
        .insert_many((0..3).map(|_| NewJob::new("stuck", json!({}))).collect())
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.job.id)
        .collect();
    let quick = crate::harness::insert_id(&client, NewJob::new("quick", json!({}))).await;
    let running = onus.start();
    for id in stuck.iter().chain([&quick]) {
        env.wait_state(*id, JobState::Running).await;
    }
    // Claimed is not started: a claimed job not yet started at shutdown is handed back.
    wait_until("the quick job's handler runs", || async {
        started.load(std::sync::atomic::Ordering::SeqCst)
    })
    .await;
    let shutdown = tokio::spawn(running.shutdown(Duration::from_millis(300)));
    gate.notify_one(); // the quick job finishes inside the grace period
    shutdown.await.unwrap();
    assert_eq!(env.job(quick).await.state, JobState::Completed);
    for id in stuck {
        let j = env.job(id).await;
        assert_eq!(
            (j.state, j.attempt),
            (JobState::Available, 0),
            "handed back with its attempt unspent"
        );
        assert_eq!(j.lease_owner, None);
        assert!(j.errors.is_empty());
    }
}

pub async fn sigkill_loses_no_job(env: Env) {
    let client = env.client();
    let ids: Vec<i64> = client
        .insert_many(
            (0..50)
                .map(|i| NewJob::new("hold", json!({"i": i})))
                .collect(),
        )
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.job.id)
        .collect();
    let mut child = crate::harness::spawn_child(&env.url, "hold", 0, std::process::Stdio::null());
    // 20 slots, and as many claimed jobs ready to start.
    wait_until("the child holds 40 claimed jobs", || async {
        env.count(JobState::Running).await == 40
    })
    .await;
    child.start_kill().unwrap(); // SIGKILL
    let status = child.wait().await.unwrap();
    assert!(!status.success());

    // A new process: once the dead one's leases expire, the rescuer recovers every job.
    env.clock
        .advance_to(chrono::Utc::now() + chrono::TimeDelta::seconds(CHILD_LEASE_SECS + 1));
    let onus = env
        .builder()
        .kind(Kind::new("hold").handler(|_c: JobContext| async { Ok(()) }))
        .build()
        .unwrap();
    let running = onus.start();
    wait_until("no job left running", || async {
        env.count(JobState::Running).await == 0
    })
    .await;
    env.clock.advance(Duration::from_secs(10));
    let mut lost = 0;
    for id in ids {
        let j = env.wait_state(id, JobState::Completed).await;
        if j.errors.iter().any(|e| e.class == EntryClass::WorkerLost) {
            lost += 1;
            assert_eq!(j.attempt, 2);
        } else {
            assert_eq!(j.attempt, 1);
        }
    }
    assert_eq!(
        lost, 40,
        "exactly the 40 jobs the killed process held were rescued"
    );
    running.shutdown(Duration::from_secs(5)).await;
}

pub const CHILD_LEASE_SECS: i64 = 60;

/// The body of the child processes the tests kill: `hold` holds 20 running jobs forever;
/// `insert` inserts jobs one by one and prints each id once the insert is confirmed;
/// `insert_concurrently` does so from 16 tasks at once (inserts that share commits, every other
/// one with a unique key).
pub fn child_main(url: &str, mode: &str) {
    if let Some(tasks) = match mode {
        "insert" => Some(1),
        "insert_concurrently" => Some(16),
        _ => None,
    } {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let client = Onus::builder(onus::open(url).await.unwrap())
                .build()
                .unwrap()
                .client();
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            for t in 0..tasks {
                let (client, tx) = (client.clone(), tx.clone());
                tokio::spawn(async move {
                    for i in 0.. {
                        let mut job = NewJob::new("durable", json!({"t": t, "i": i}));
                        if tasks > 1 && i % 2 == 1 {
                            // A unique key takes the other shared path: the insert flow in a
                            // transaction shared with other callers' operations.
                            job = job.unique_key(format!("{t}-{i}"));
                        }
                        let id = crate::harness::insert_id(&client, job).await;
                        if tx.send(id).is_err() {
                            return;
                        }
                    }
                });
            }
            let mut out = std::io::stdout();
            while let Some(id) = rx.recv().await {
                use std::io::Write;
                writeln!(out, "confirmed {id}").unwrap();
                out.flush().unwrap();
            }
        });
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let store = onus::open(url).await.unwrap();
        let onus = Onus::builder(store)
            .queue("default", 20)
            .options(onus::Options {
                lease_ttl: Duration::from_secs(CHILD_LEASE_SECS as u64),
                ..fast_options()
            })
            .kind(Kind::new("hold").handler(|_c: JobContext| async {
                std::future::pending::<()>().await;
                Ok(())
            }))
            .build()
            .unwrap();
        let _running = onus.start();
        std::future::pending::<()>().await;
    });
}

pub async fn many_workers_complete_each_job_exactly_once(env: Env) {
    const N: usize = 10_000;
    let runs: Arc<Vec<AtomicU32>> = Arc::new((0..N).map(|_| AtomicU32::new(0)).collect());
    let client = env.client();
    for chunk in (0..N).collect::<Vec<_>>().chunks(1000) {
        client
            .insert_many(
                chunk
                    .iter()
                    .map(|i| NewJob::new("count", json!({"i": i})))
                    .collect(),
            )
            .await
            .unwrap();
    }
    let mut workers = Vec::new();
    for _ in 0..4 {
        let r = runs.clone();
        let onus = Onus::builder(env.reopen().await)
            .clock(env.clock.clone())
            .options(fast_options())
            .queue("default", 8)
            .kind(Kind::new("count").handler(move |ctx: JobContext| {
                let i = ctx.job().args["i"].as_u64().unwrap() as usize;
                r[i].fetch_add(1, Ordering::SeqCst);
                async { Ok(()) }
            }))
            .build()
            .unwrap();
        workers.push(onus.start());
    }
    let env2 = &env;
    wait_until("10,000 jobs completed", || async move {
        env2.count(JobState::Completed).await == N
    })
    .await;
    for w in workers {
        w.shutdown(Duration::from_secs(5)).await;
    }
    let twice: Vec<usize> = (0..N)
        .filter(|i| runs[*i].load(Ordering::SeqCst) != 1)
        .collect();
    assert!(
        twice.is_empty(),
        "jobs not run exactly once: {:?}",
        &twice[..twice.len().min(10)]
    );
    let all = env
        .store
        .list(&JobFilter::default(), N + 1, None)
        .await
        .unwrap();
    assert!(all
        .iter()
        .all(|j| j.state == JobState::Completed && j.attempt == 1 && j.errors.is_empty()));
}

pub async fn retention_prunes_finished_jobs(env: Env) {
    let onus = env
        .builder()
        .kind(Kind::new("ok").handler(|_c: JobContext| async { Ok(()) }))
        .kind(
            Kind::new("bad").handler(|_c: JobContext| async { Err(onus::JobError::discard("no")) }),
        )
        .build()
        .unwrap();
    let client = onus.client();
    let done = crate::harness::insert_id(&client, NewJob::new("ok", json!({}))).await;
    let bad = crate::harness::insert_id(&client, NewJob::new("bad", json!({}))).await;
    let cancelled = crate::harness::insert_id(&client, NewJob::new("x", json!({}))).await;
    let waiting = crate::harness::insert_id(&client, NewJob::new("x", json!({}))).await;
    client.cancel(cancelled).await.unwrap();
    let running = onus.start();
    env.wait_state(done, JobState::Completed).await;
    env.wait_state(bad, JobState::Discarded).await;
    env.clock.advance(Duration::from_secs(86_400 + 1));
    wait_until("completed job pruned after a day", || async {
        env.store.get(done).await.unwrap().is_none()
    })
    .await;
    assert!(env.store.get(bad).await.unwrap().is_some());
    assert!(env.store.get(cancelled).await.unwrap().is_some());
    env.clock.advance(Duration::from_secs(6 * 86_400));
    wait_until("discarded and cancelled pruned after a week", || async {
        env.store.get(bad).await.unwrap().is_none()
            && env.store.get(cancelled).await.unwrap().is_none()
    })
    .await;
    assert!(
        env.store.get(waiting).await.unwrap().is_some(),
        "unfinished jobs are never pruned"
    );
    let _ = env.clock.now();
    running.shutdown(Duration::from_secs(5)).await;
}

pub async fn confirmed_inserts_survive_a_crash(env: Env) {
    confirmed_inserts_of(env, "insert").await;
}

/// Inserts from many tasks at once share commits (group commit), with unique keys or without:
/// each is confirmed only once the commit holding it is done, so a crash loses none that was
/// confirmed.
pub async fn confirmed_concurrent_inserts_survive_a_crash(env: Env) {
    confirmed_inserts_of(env, "insert_concurrently").await;
}

async fn confirmed_inserts_of(env: Env, mode: &str) {
    use tokio::io::AsyncBufReadExt;
    let mut child = crate::harness::spawn_child(&env.url, mode, 0, std::process::Stdio::piped());
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut confirmed = Vec::new();
    while confirmed.len() < 300 {
        let line = lines
            .next_line()
            .await
            .unwrap()
            .expect("the child died early");
        if let Some(id) = line.strip_prefix("confirmed ") {
            confirmed.push(id.parse::<i64>().unwrap());
        }
    }
    child.start_kill().unwrap(); // SIGKILL, mid-insert
    child.wait().await.unwrap();
    while let Ok(Some(line)) = lines.next_line().await {
        if let Some(id) = line.strip_prefix("confirmed ") {
            confirmed.push(id.parse::<i64>().unwrap());
        }
    }
    let store = env.reopen().await;
    for id in &confirmed {
        let j = store.get(*id).await.unwrap();
        assert!(
            j.is_some_and(|j| j.state == JobState::Available),
            "confirmed job {id} was lost"
        );
    }
}

pub async fn cancel_from_another_process_reaches_the_handler(env: Env) {
    let onus = env
        .builder()
        .kind(Kind::new("long").handler(|ctx: JobContext| async move {
            ctx.cancelled().await;
            Err(onus::JobError::retryable("interrupted"))
        }))
        .build()
        .unwrap();
    let id = crate::harness::insert_id(&onus.client(), NewJob::new("long", json!({}))).await;
    let running = onus.start();
    env.wait_state(id, JobState::Running).await;
    // Another process (the CLI, say) shares only the database.
    let other = Onus::builder(env.reopen().await).build().unwrap().client();
    assert_eq!(other.cancel(id).await.unwrap().requested, vec![id]);
    let j = env.wait_state(id, JobState::Cancelled).await;
    assert_eq!(j.errors.last().unwrap().class, EntryClass::Cancelled);
    running.shutdown(Duration::from_secs(5)).await;
}
