//! Regressions: each test reproduces a defect (a hung renewal, an orphaned running row, a NUL
//! that wedged the finisher, ...) and fails without its fix.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use onus::outcome::Transition;
use onus::store::{ClaimRequest, Finish, Retention};
use onus::{EntryClass, JobContext, JobError, JobFilter, JobState, Kind, NewJob, Onus, Options};
use serde_json::json;

use crate::faulty::Faulty;
use crate::harness::{fast_options, insert_id, wait_until, Env, DEADLINE};

/// Counts attempts in flight: up when it starts, down when it ends or is dropped.
#[derive(Default)]
struct Gauge {
    now: AtomicUsize,
    max: AtomicUsize,
    started: AtomicUsize,
    dropped: AtomicUsize,
}

struct InFlight(Arc<Gauge>);

impl InFlight {
    fn start(g: &Arc<Gauge>) -> Self {
        let n = g.now.fetch_add(1, Ordering::SeqCst) + 1;
        g.max.fetch_max(n, Ordering::SeqCst);
        g.started.fetch_add(1, Ordering::SeqCst);
        InFlight(g.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
        self.0.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

/// A kind whose first attempt never returns and whose later attempts succeed.
fn hangs_first(g: &Arc<Gauge>) -> Kind {
    let g = g.clone();
    Kind::new("long").handler(move |ctx: JobContext| {
        let g = g.clone();
        async move {
            let _in_flight = InFlight::start(&g);
            if ctx.attempt() == 1 {
                std::future::pending::<()>().await;
            }
            Ok(())
        }
    })
}

fn short_lease() -> Options {
    Options {
        lease_ttl: Duration::from_secs(1),
        ..fast_options()
    }
}

/// A renewal that never answers trips the fence, so a rescuer elsewhere never runs the job
/// beside the attempt that hung.
pub async fn regression_hung_heartbeat_trips_the_fence(env: Env) {
    let gauge = Arc::new(Gauge::default());
    let (faulty, faults) = Faulty::wrap(env.store.clone());
    let a = Onus::builder(faulty)
        .clock(env.clock.clone())
        .options(short_lease())
        .kind(hangs_first(&gauge))
        .build()
        .unwrap();
    let b = Onus::builder(env.reopen().await)
        .clock(env.clock.clone())
        .options(short_lease())
        .kind(hangs_first(&gauge))
        .build()
        .unwrap();
    let id = insert_id(&a.client(), NewJob::new("long", json!({}))).await;
    let ra = a.start();
    wait_until("attempt 1 runs", || async {
        gauge.started.load(Ordering::SeqCst) == 1
    })
    .await;
    faults.hang_heartbeats.store(true, Ordering::SeqCst);
    let rb = b.start();
    wait_until("the hung renewal trips the fence", || async {
        gauge.dropped.load(Ordering::SeqCst) == 1
    })
    .await;
    faults.hang_heartbeats.store(false, Ordering::SeqCst);
    // The lease runs out; some rescuer counts the lost attempt, and attempt 2 runs.
    // The clock moves only while attempt 1 holds the job or the job waits for its retry, and by
    // less than a lease: once the job is due it stands still, so a second attempt never sees its
    // own lease lapse under the test's hand (steps of two leases, taken until attempt 2 was seen
    // running, once let attempt 3 run on a loaded machine).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let j = loop {
        let j = env.job(id).await;
        if j.state == JobState::Completed {
            break j;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the job did not complete within 60 s: {j:?}"
        );
        let first_runs = j.state == JobState::Running && j.attempt == 1;
        let waits = j.state != JobState::Running && j.run_at > env.clock_now();
        if first_runs || waits {
            env.clock.advance(Duration::from_millis(500));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(j.attempt, 2);
    assert_eq!(j.errors[0].class, EntryClass::WorkerLost);
    assert_eq!(
        gauge.max.load(Ordering::SeqCst),
        1,
        "two attempts ran at once"
    );
    ra.shutdown(Duration::from_secs(1)).await;
    rb.shutdown(Duration::from_secs(1)).await;
}

/// A claim whose reply was lost after its commit leaves a `running` row this process
/// does not know; its lease is not renewed, so it runs out and the job is rescued.
pub async fn regression_a_lost_claim_reply_is_rescued(env: Env) {
    let (faulty, faults) = Faulty::wrap(env.store.clone());
    let release = Arc::new(tokio::sync::Notify::new());
    let r = release.clone();
    let keeping = Arc::new(AtomicUsize::new(0));
    let k = keeping.clone();
    // The system clock: leases really run out, and renewals really happen.
    let onus = Onus::builder(faulty)
        .options(short_lease())
        .kind(Kind::new("keeper").handler(move |_c: JobContext| {
            let (r, k) = (r.clone(), k.clone());
            async move {
                k.fetch_add(1, Ordering::SeqCst);
                r.notified().await;
                Ok(())
            }
        }))
        .kind(Kind::new("orphan").handler(|_c: JobContext| async { Ok(()) }))
        .build()
        .unwrap();
    let client = onus.client();
    let running = onus.start();
    // A job that keeps the heartbeat renewing.
    let keeper = insert_id(&client, NewJob::new("keeper", json!({}))).await;
    wait_until("the keeper runs", || async {
        keeping.load(Ordering::SeqCst) == 1
    })
    .await;
    faults.lose_claim_replies.store(1, Ordering::SeqCst);
    let orphan = insert_id(&client, NewJob::new("orphan", json!({}))).await;
    let j = env
        .wait_job(orphan, "rescued and completed", |j| {
            j.state == JobState::Completed
        })
        .await;
    assert_eq!(j.attempt, 2);
    assert_eq!(j.errors[0].class, EntryClass::WorkerLost);
    assert_eq!(env.job(keeper).await.state, JobState::Running);
    release.notify_one();
    env.wait_state(keeper, JobState::Completed).await;
    running.shutdown(Duration::from_secs(5)).await;
}

/// A renewal that finds a held job no longer leased here (rescued, claimed elsewhere)
/// stops that attempt at once and writes nothing for it.
pub async fn regression_a_lease_lost_elsewhere_stops_the_attempt_at_once(env: Env) {
    let gauge = Arc::new(Gauge::default());
    let onus = env.builder().kind(hangs_first(&gauge)).build().unwrap();
    let id = insert_id(&onus.client(), NewJob::new("long", json!({}))).await;
    let running = onus.start();
    wait_until("attempt 1 runs", || async {
        gauge.started.load(Ordering::SeqCst) == 1
    })
    .await;
    // As a rescuer would: the job goes back (due a moment from now, so only the claim below
    // can take it), and another process claims it.
    let now = env.clock_now();
    let later = now + chrono::TimeDelta::seconds(1);
    let applied = env
        .store
        .finish(&[Finish {
            id,
            owner: onus.owner().to_string(),
            attempt: 1,
            transition: Transition::Snooze {
                run_at: later,
                entry: onus::HistoryEntry {
                    at: now,
                    attempt: 1,
                    class: EntryClass::Snooze,
                    message: "taken back by the test".into(),
                },
                pause_key: None,
            },
            now,
            release_lease: None,
            periodic: None,
            expired_before: None,
            result: None,
        }])
        .await
        .unwrap();
    assert_eq!(applied, vec![true]);
    let claimed = env
        .store
        .claim(ClaimRequest {
            queue: "default".into(),
            kinds: vec!["long".into()],
            limit: 1,
            owner: "elsewhere".into(),
            now: later,
            lease_until: later + chrono::TimeDelta::seconds(30),
            caps: Vec::new(),
            lease_slots: Vec::new(),
        })
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    wait_until("the attempt stops", || async {
        gauge.dropped.load(Ordering::SeqCst) == 1
    })
    .await;
    running.shutdown(Duration::from_secs(5)).await;
    let j = env.job(id).await;
    assert_eq!(j.state, JobState::Running);
    assert_eq!(j.lease_owner.as_deref(), Some("elsewhere"));
    assert_eq!(j.attempt, 1);
    assert_eq!(
        j.errors.len(),
        1,
        "the lost attempt wrote nothing: {:?}",
        j.errors
    );
}

/// An error message with a NUL (PostgreSQL's jsonb refuses `\u0000`) or of any length is
/// stored cleaned and bounded, and never holds up another job's outcome.
pub async fn regression_a_nul_in_an_error_never_wedges_other_outcomes(env: Env) {
    let onus = env
        .builder()
        .kind(Kind::new("nul").handler(|_c: JobContext| async {
            let long = "x".repeat(100_000);
            Err(JobError::retryable(format!(
                "invalid type: string \"a\0b\", expected u64 {long}"
            )))
        }))
        .kind(Kind::new("ok").handler(|_c: JobContext| async { Ok(()) }))
        .build()
        .unwrap();
    let client = onus.client();
    let running = onus.start();
    let bad = insert_id(&client, NewJob::new("nul", json!({}))).await;
    let j = env.wait_state(bad, JobState::Retryable).await;
    let m = &j.errors[0].message;
    assert!(m.starts_with("invalid type: string \"ab\""), "{m}");
    assert!(m.len() <= onus::job::MAX_MESSAGE, "{} bytes", m.len());
    assert!(m.ends_with("more bytes cut)"), "{m}");
    let good = insert_id(&client, NewJob::new("ok", json!({}))).await;
    env.wait_state(good, JobState::Completed).await;
    // Args holding a NUL are refused at insert, with where it is.
    let e = client
        .insert(NewJob::new("ok", json!({"to": ["a", "b\u{0}c"]})))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("args.to[1] contains a NUL character"), "{e}");
    running.shutdown(Duration::from_secs(5)).await;
}

/// When the database refuses an outcome, the outcomes after it are still written (they join the
/// retries and are written one by one), and the refused one is not tried forever.
pub async fn regression_a_refused_outcome_does_not_hold_up_the_others(env: Env) {
    let (faulty, faults) = Faulty::wrap(env.store.clone());
    let gated = |name: &str, gate: &Arc<tokio::sync::Semaphore>| {
        let g = gate.clone();
        Kind::new(name).handler(move |_c: JobContext| {
            let g = g.clone();
            async move {
                g.acquire().await.map(|p| p.forget()).ok();
                Ok(())
            }
        })
    };
    let (bad_gate, good_gate) = (
        Arc::new(tokio::sync::Semaphore::new(0)),
        Arc::new(tokio::sync::Semaphore::new(0)),
    );
    let onus = Onus::builder(faulty)
        .clock(env.clock.clone())
        .options(fast_options())
        .kind(gated("bad", &bad_gate))
        .kind(gated("good", &good_gate))
        .build()
        .unwrap();
    let client = onus.client();
    let poison = insert_id(&client, NewJob::new("bad", json!({}))).await;
    let good: Vec<_> = client
        .insert_many((0..5).map(|_| NewJob::new("good", json!({}))).collect())
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.job.id)
        .collect();
    faults.refuse_finish_of.lock().unwrap().insert(poison);
    let running = onus.start();
    for id in good.iter().chain([&poison]) {
        env.wait_state(*id, JobState::Running).await;
    }
    bad_gate.add_permits(1);
    wait_until("the bad outcome is refused", || async {
        faults.refused.load(Ordering::SeqCst) >= 1
    })
    .await;
    good_gate.add_permits(5); // their outcomes queue behind the refused one
    for id in &good {
        env.wait_state(*id, JobState::Completed).await;
    }
    assert_eq!(env.job(poison).await.state, JobState::Running);
    faults.refuse_finish_of.lock().unwrap().clear();
    // Written at a later try, or given up and rescued once its lease runs out: never stuck.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let j = env.job(poison).await;
        if j.state == JobState::Completed {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "stuck: {j:?}");
        if j.state == JobState::Retryable {
            env.clock.advance_to(j.run_at);
            bad_gate.add_permits(1);
        } else {
            env.clock.advance(Duration::from_secs(31));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    running.shutdown(Duration::from_secs(5)).await;
}

/// A bulk retry over finished jobs sharing a unique key retries the newest of them and
/// reports the others, instead of failing whole.
pub async fn regression_bulk_retry_with_shared_unique_keys(env: Env) {
    let client = env.client();
    let mut same = Vec::new();
    for _ in 0..3 {
        let id = insert_id(&client, NewJob::new("u", json!({})).unique_key("k")).await;
        client.cancel(id).await.unwrap();
        same.push(id);
    }
    let plain = insert_id(&client, NewJob::new("u", json!({}))).await;
    client.cancel(plain).await.unwrap();
    let filter = JobFilter {
        states: vec![JobState::Cancelled],
        ..Default::default()
    };
    // The store alone, then the client (in chunks).
    let out = env.store.retry(&filter, env.clock_now()).await.unwrap();
    let mut retried = out.retried.clone();
    retried.sort();
    assert_eq!(retried, vec![same[2], plain]);
    let mut refused: Vec<_> = out.refused.iter().map(|r| r.id).collect();
    refused.sort();
    assert_eq!(refused, vec![same[0], same[1]]);
    assert!(
        out.refused[0].reason.contains("same unique key"),
        "{:?}",
        out.refused
    );
    // Again: now the retried one is unfinished and holds the key.
    client.cancel(same[2]).await.unwrap();
    client.cancel(plain).await.unwrap();
    let other = insert_id(&client, NewJob::new("u", json!({})).unique_key("k")).await;
    let out = client.retry_where(&filter).await.unwrap();
    assert_eq!(out.retried, vec![plain]);
    assert_eq!(out.refused.len(), 3);
    assert!(out
        .refused
        .iter()
        .any(|r| r.id == same[2] && r.reason.contains("another unfinished u job holds")));
    assert_eq!(env.job(other).await.state, JobState::Available);
}

/// A retention longer than the calendar can hold prunes nothing (it once pruned
/// everything on SQLite and panicked on PostgreSQL).
pub async fn regression_huge_retention_prunes_nothing(env: Env) {
    let client = env.client();
    let id = insert_id(&client, NewJob::new("k", json!({}))).await;
    client.cancel(id).await.unwrap();
    let forever = Duration::from_secs(300_000 * 365 * 86_400);
    let n = env
        .store
        .prune(
            env.clock_now(),
            Retention {
                completed: forever,
                discarded: forever,
            },
            100,
        )
        .await
        .unwrap();
    assert_eq!(n, 0);
    assert_eq!(env.job(id).await.state, JobState::Cancelled);
    let n = env
        .store
        .prune(
            env.clock_now(),
            Retention {
                completed: Duration::MAX,
                discarded: Duration::MAX,
            },
            100,
        )
        .await
        .unwrap();
    assert_eq!(n, 0);
}

/// Bulk cancel and retry run in chunks, never as one unbounded statement.
pub async fn regression_bulk_actions_run_in_chunks(env: Env) {
    let (faulty, faults) = Faulty::wrap(env.store.clone());
    let client = Onus::builder(faulty)
        .clock(env.clock.clone())
        .build()
        .unwrap()
        .client();
    client
        .insert_many((0..2500).map(|_| NewJob::new("bulk", json!({}))).collect())
        .await
        .unwrap();
    let filter = JobFilter {
        kinds: vec!["bulk".into()],
        ..Default::default()
    };
    let out = client.cancel_where(&filter).await.unwrap();
    assert_eq!(out.cancelled.len(), 2500);
    let out = client.retry_where(&filter).await.unwrap();
    assert_eq!(out.retried.len(), 2500);
    let calls = faults.bulk_calls.lock().unwrap().clone();
    assert!(calls.len() >= 6, "{calls:?}");
    assert!(
        calls
            .iter()
            .all(|c| c.is_some_and(|n| n <= onus::runtime::BULK_CHUNK)),
        "every statement is bounded: {calls:?}"
    );
    assert_eq!(env.count(JobState::Available).await, 2500);
}

/// Shutdown is bounded by its grace period (plus the write-back) even when every store
/// call hangs.
pub async fn regression_shutdown_is_bounded_when_the_store_hangs(env: Env) {
    let (faulty, faults) = Faulty::wrap(env.store.clone());
    let gauge = Arc::new(Gauge::default());
    let onus = Onus::builder(faulty)
        .clock(env.clock.clone())
        .options(fast_options())
        .kind(hangs_first(&gauge))
        .build()
        .unwrap();
    insert_id(&onus.client(), NewJob::new("long", json!({}))).await;
    let running = onus.start();
    wait_until("the attempt runs", || async {
        gauge.started.load(Ordering::SeqCst) == 1
    })
    .await;
    faults.hang_all.store(true, Ordering::SeqCst);
    tokio::time::timeout(DEADLINE, running.shutdown(Duration::from_millis(200)))
        .await
        .expect("shutdown returned although the database hangs");
    assert_eq!(
        gauge.now.load(Ordering::SeqCst),
        0,
        "the attempt was stopped"
    );
}

/// Waiters behind one busy lease key wake one at a time, not all at the holder's
/// `busy_until` as a herd that finds the key busy again (30 jobs once took 148 snoozes).
pub async fn regression_lease_waiters_wake_in_order(env: Env) {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let g = gate.clone();
    let started = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let s = started.clone();
    let onus = env
        .builder()
        .queue("default", 10)
        .kind(Kind::new("h").handler(move |_c: JobContext| {
            let g = g.clone();
            s.fetch_add(1, Ordering::SeqCst);
            async move {
                g.acquire().await.map(|p| p.forget()).ok();
                Ok(())
            }
        }))
        .build()
        .unwrap();
    let client = onus.client();
    client
        .insert_many(
            (0..30)
                .map(|_| NewJob::new("h", json!({})).lease_key("key"))
                .collect(),
        )
        .await
        .unwrap();
    let running = onus.start();
    let settled = || async {
        let now = env.clock_now();
        let all = env
            .store
            .list(&JobFilter::default(), 100, None)
            .await
            .unwrap();
        // Waiting in the database (snoozed until later) or in this process (claimed, kept
        // aside for the holder: running, but no handler started).
        let waiting = all
            .iter()
            .filter(|j| j.state == JobState::Snoozed && j.run_at > now)
            .count();
        let claimed = all.iter().filter(|j| j.state == JobState::Running).count();
        let renewed = env
            .store
            .lease_busy_until("key")
            .await
            .unwrap()
            .is_some_and(|t| t > now + chrono::TimeDelta::seconds(20));
        waiting + claimed == 30 && started.load(Ordering::SeqCst) == 1 && renewed
    };
    wait_until("one holds the key, 29 wait", settled).await;
    // The holder runs on for minutes: its slot is renewed, the waiters must not stampede.
    for _ in 0..6 {
        env.clock.advance(Duration::from_secs(20));
        wait_until("the waiters settle again", settled).await;
    }
    gate.add_permits(30);
    let env2 = &env;
    wait_until("all 30 complete", || async move {
        env2.count(JobState::Completed).await == 30
    })
    .await;
    let jobs = env
        .store
        .list(&JobFilter::default(), 100, None)
        .await
        .unwrap();
    let snoozes: u32 = jobs.iter().map(|j| j.snoozes).sum();
    assert!(
        snoozes <= 29 + 2 * 6,
        "30 jobs behind one key took {snoozes} snoozes"
    );
    running.shutdown(Duration::from_secs(5)).await;
}

/// A process whose clock runs ahead of the database's sees healthy leases as expired; it
/// measures its offset and refuses to rescue, so a job that is still running is left alone.
pub async fn regression_a_clock_ahead_never_rescues_healthy_jobs(env: Env) {
    let gauge = Arc::new(Gauge::default());
    let options = || Options {
        lease_ttl: Duration::from_secs(4),
        heartbeat_interval: Duration::from_millis(200),
        rescue_interval: Duration::from_millis(100),
        ..fast_options()
    };
    // Both on real clocks; b's runs 5 s ahead, more than a lease.
    let a = Onus::builder(env.store.clone())
        .options(options())
        .kind(hangs_first(&gauge))
        .kind(Kind::new("pulled"))
        .build()
        .unwrap();
    let b = Onus::builder(env.reopen().await)
        .clock(onus::OffsetClock::new(chrono::TimeDelta::seconds(5)))
        .options(options())
        .kind(hangs_first(&gauge))
        .kind(Kind::new("pulled"))
        .build()
        .unwrap();
    let id = insert_id(&a.client(), NewJob::new("long", json!({}))).await;
    let ra = a.start();
    wait_until("attempt 1 runs", || async {
        gauge.started.load(Ordering::SeqCst) == 1
    })
    .await;
    let rb = b.start();
    wait_until("b measures its clock", || async {
        b.database_clock_offset().is_some()
    })
    .await;
    let offset = b.database_clock_offset().unwrap();
    assert!(
        (offset + chrono::TimeDelta::seconds(5)).abs() < chrono::TimeDelta::seconds(1),
        "{offset}"
    );
    // Nor does it lease jobs to outside workers: its leases would be misread.
    let pulled = insert_id(&b.client(), NewJob::new("pulled", json!({}))).await;
    let refused = b
        .client()
        .claim_for_worker("default", &["pulled".to_string()], 1, Duration::ZERO)
        .await
        .unwrap_err();
    assert_eq!(refused.fault(), onus::Fault::Service, "{refused}");
    assert!(refused.to_string().contains("clock"), "{refused}");
    assert_eq!(env.job(pulled).await.state, JobState::Available);
    // A lease handed out by a, renewed through a but not through b.
    let mine = insert_id(&a.client(), NewJob::new("pulled", json!({}))).await;
    let claimed = a
        .client()
        .claim_for_worker("default", &["pulled".to_string()], 2, Duration::ZERO)
        .await
        .unwrap();
    let c = claimed.iter().find(|c| c.job.id == mine).unwrap();
    let refused = b
        .client()
        .heartbeat_lease(mine, &c.lease_token, None)
        .await
        .unwrap_err();
    assert_eq!(refused.fault(), onus::Fault::Service, "{refused}");
    assert!(refused.to_string().contains("clock"), "{refused}");
    a.client()
        .heartbeat_lease(mine, &c.lease_token, None)
        .await
        .unwrap();
    // Several of b's rescue passes go by while a renews its lease.
    for _ in 0..3 {
        let seen = env.job(id).await.lease_expires_at;
        wait_until("a renews its lease", || async {
            env.job(id).await.lease_expires_at != seen
        })
        .await;
    }
    let j = env.job(id).await;
    assert_eq!(j.state, JobState::Running);
    assert_eq!(j.lease_owner.as_deref(), Some(a.owner()));
    assert!(j.errors.is_empty(), "rescued while alive: {:?}", j.errors);
    assert_eq!(gauge.started.load(Ordering::SeqCst), 1);
    rb.shutdown(Duration::from_secs(1)).await;
    ra.shutdown(Duration::from_millis(100)).await;
}

/// An outcome whose write keeps timing out while the database answers everything else is given
/// up (it was once retried forever, its lease renewed forever, its job never rescued).
pub async fn regression_an_outcome_that_keeps_timing_out_is_given_up(env: Env) {
    let (faulty, faults) = Faulty::wrap(env.store.clone());
    let onus = Onus::builder(faulty)
        .clock(env.clock.clone())
        .options(short_lease())
        .kind(Kind::new("k").handler(|_c: JobContext| async { Ok(()) }))
        .build()
        .unwrap();
    let client = onus.client();
    let id = insert_id(&client, NewJob::new("k", json!({}))).await;
    // Only the first attempt: the clock steps below may pass the retry's time before the test
    // sees the rescue, and the second attempt must then complete.
    faults.time_out_completing.lock().unwrap().insert((id, 1));
    let running = onus.start();
    // Given up, its lease runs out and the rescuer counts the attempt as lost.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let j = loop {
        let j = env.job(id).await;
        if !j.errors.is_empty() {
            break j;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never given up: {j:?}"
        );
        env.clock.advance(Duration::from_secs(2));
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(j.errors[0].class, EntryClass::WorkerLost);
    env.clock.advance_to(j.run_at);
    let j = env.wait_state(id, JobState::Completed).await;
    assert_eq!(j.attempt, 2);
    running.shutdown(Duration::from_secs(5)).await;
}
