//! Lease keys and rate windows.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use onus::{DiscardReason, EntryClass, JobContext, JobState, Kind, NewJob, RateWindow, WhenSpent};
use serde_json::json;

use crate::harness::Env;

/// `jobs` jobs on one key in a queue of 8 slots, claimed together: each claim takes the key's free
/// slots for the first of them, and the others wait in the database for a release, without
/// running, spending an attempt or writing anything in their history.
async fn run_leased(env: Env, slots: u32, jobs: usize) {
    let now = Arc::new(AtomicUsize::new(0));
    let max = Arc::new(AtomicUsize::new(0));
    let (n, m) = (now.clone(), max.clone());
    let onus = env
        .builder()
        .queue("default", 8)
        .kind(
            Kind::new("leased")
                .lease_slots(slots)
                .handler(move |c: JobContext| {
                    let (n, m) = (n.clone(), m.clone());
                    // Only the jobs on the contended key count; the one on endpoint:2 may
                    // run beside them.
                    let contended = c.job().lease_key.as_deref() == Some("endpoint:1");
                    async move {
                        if contended {
                            crate::harness::gauged(&n, &m).await
                        } else {
                            Ok(())
                        }
                    }
                }),
        )
        .build()
        .unwrap();
    let client = onus.client();
    let rows = client
        .insert_many(
            (0..jobs)
                .map(|_| NewJob::new("leased", json!({})).lease_key("endpoint:1"))
                .collect(),
        )
        .await
        .unwrap();
    let free = crate::harness::insert_id(
        &client,
        NewJob::new("leased", json!({})).lease_key("endpoint:2"),
    )
    .await;
    let running = onus.start();
    for r in &rows {
        let j = env.wait_state(r.job.id, JobState::Completed).await;
        assert_eq!(j.attempt, 1, "waiting for a lease spends no attempt");
        assert_eq!(j.snoozes, 0, "waiting for a lease is not a snooze");
        assert!(
            j.errors.is_empty(),
            "nothing in the history: {:?}",
            j.errors
        );
    }
    env.wait_state(free, JobState::Completed).await;
    assert!(
        max.load(Ordering::SeqCst) <= slots as usize,
        "at most {slots} at once; saw {}",
        max.load(Ordering::SeqCst)
    );
    running.shutdown(Duration::from_secs(5)).await;
}

pub async fn lease_key_runs_one_at_a_time(env: Env) {
    run_leased(env, 1, 20).await;
}

pub async fn lease_key_allows_n_slots(env: Env) {
    run_leased(env, 2, 20).await;
}

/// Many jobs on a few keys, claimed together: every busy check races the holders' releases, and
/// none of those races may leave a waiter asleep while its key has a free slot (it would sleep
/// for a lease, 30 s, past the deadline). At most one runs per key at any time.
pub async fn lease_keys_under_contention_lose_no_wakeup(env: Env) {
    const KEYS: usize = 3;
    let gauges: Arc<Vec<(AtomicUsize, AtomicUsize)>> = Arc::new(
        (0..KEYS)
            .map(|_| (AtomicUsize::new(0), AtomicUsize::new(0)))
            .collect(),
    );
    let g = gauges.clone();
    let onus = env
        .builder()
        .queue("default", 16)
        .kind(Kind::new("contended").handler(move |c: JobContext| {
            let g = g.clone();
            let k: usize = c.job().args["k"].as_u64().unwrap_or(0) as usize;
            async move { crate::harness::gauged(&g[k].0, &g[k].1).await }
        }))
        .build()
        .unwrap();
    let client = onus.client();
    let rows = client
        .insert_many(
            (0..KEYS * 20)
                .map(|i| {
                    let k = i % KEYS;
                    NewJob::new("contended", json!({ "k": k })).lease_key(format!("key:{k}"))
                })
                .collect(),
        )
        .await
        .unwrap();
    let running = onus.start();
    for r in &rows {
        let j = env.wait_state(r.job.id, JobState::Completed).await;
        assert_eq!(j.attempt, 1, "waiting for a lease spends no attempt");
    }
    for (k, (_, max)) in gauges.iter().enumerate() {
        assert_eq!(max.load(Ordering::SeqCst), 1, "key {k}: one at a time");
    }
    running.shutdown(Duration::from_secs(5)).await;
}

/// Jobs of a busy key are not handed to a worker to find it busy: the claim that takes them gives
/// the key's slot to the first and sets the others asleep in the same transaction, and each
/// release wakes the next. Of 20 jobs on one key, claimed 8 at a time, none writes a snooze.
pub async fn jobs_of_a_busy_key_wait_in_the_claim(env: Env) {
    let gauge = Arc::new((AtomicUsize::new(0), AtomicUsize::new(0)));
    let g = gauge.clone();
    let onus = env
        .builder()
        .queue("default", 8)
        .kind(Kind::new("keyed").handler(move |_c: JobContext| {
            let g = g.clone();
            async move { crate::harness::gauged(&g.0, &g.1).await }
        }))
        .build()
        .unwrap();
    let rows = onus
        .client()
        .insert_many(
            (0..20)
                .map(|i| NewJob::new("keyed", json!({ "i": i })).lease_key("one"))
                .collect(),
        )
        .await
        .unwrap();
    let running = onus.start();
    for r in &rows {
        let j = env.wait_state(r.job.id, JobState::Completed).await;
        assert_eq!(j.attempt, 1, "waiting for a lease spends no attempt");
        assert_eq!(j.snoozes, 0, "{j:?}");
    }
    assert_eq!(gauge.1.load(Ordering::SeqCst), 1, "one at a time");
    running.shutdown(Duration::from_secs(5)).await;
}

async fn rated(env: &Env, when_spent: WhenSpent) -> onus::Onus {
    let limit = RateWindow::new("mail.recipient", 2, Duration::from_secs(3600), when_spent);
    env.builder()
        .queue("default", 1)
        .kind(Kind::new("mail").handler(move |ctx: JobContext| {
            let limit = limit.clone();
            async move {
                ctx.take(&limit, ctx.job().args["to"].as_str().unwrap_or(""))
                    .await?;
                Ok(())
            }
        }))
        .build()
        .unwrap()
}

pub async fn rate_window_snoozes_to_the_next_window(env: Env) {
    env.clock.advance(Duration::from_secs(600)); // 00:10, inside the 00:00-01:00 window
    let onus = rated(&env, WhenSpent::Snooze).await;
    let client = onus.client();
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(
            crate::harness::insert_id(
                &client,
                NewJob::new("mail", json!({"to": "bob@example.com"})),
            )
            .await,
        );
    }
    let other = crate::harness::insert_id(
        &client,
        NewJob::new("mail", json!({"to": "eve@example.com"})),
    )
    .await;
    let running = onus.start();
    env.wait_state(ids[0], JobState::Completed).await;
    env.wait_state(ids[1], JobState::Completed).await;
    env.wait_state(other, JobState::Completed).await;
    let j = env.wait_state(ids[2], JobState::Snoozed).await;
    assert_eq!(j.attempt, 0);
    assert_eq!(
        j.run_at.to_rfc3339(),
        "2026-03-01T01:00:00+00:00",
        "snoozed to the next window"
    );
    assert!(j.errors[0].message.contains("bob@example.com"));
    env.clock.advance_to(j.run_at);
    let j = env.wait_state(ids[2], JobState::Completed).await;
    assert_eq!(j.attempt, 1);
    running.shutdown(Duration::from_secs(5)).await;
}

pub async fn rate_window_drops_on_purpose(env: Env) {
    let onus = rated(&env, WhenSpent::Drop).await;
    let client = onus.client();
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(
            crate::harness::insert_id(&client, NewJob::new("mail", json!({"to": "owner-7"}))).await,
        );
    }
    let running = onus.start();
    env.wait_state(ids[0], JobState::Completed).await;
    env.wait_state(ids[1], JobState::Completed).await;
    let j = env.wait_state(ids[2], JobState::Discarded).await;
    assert_eq!(j.discard_reason, Some(DiscardReason::Dropped));
    assert_eq!(j.errors[0].class, EntryClass::Dropped);
    assert!(j.errors[0].message.contains("dropped on purpose"));
    running.shutdown(Duration::from_secs(5)).await;
}

pub async fn lease_slot_outlives_its_ttl_while_the_holder_runs(env: Env) {
    let gate = Arc::new(tokio::sync::Notify::new());
    let g = gate.clone();
    let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel::<()>();
    let onus = env
        .builder()
        .kind(Kind::new("slow").handler(move |ctx: JobContext| {
            let (g, started_tx) = (g.clone(), started_tx.clone());
            async move {
                if ctx.job().args["hold"] == true {
                    let _ = started_tx.send(());
                    g.notified().await;
                }
                Ok(())
            }
        }))
        .build()
        .unwrap();
    let client = onus.client();
    let holder = crate::harness::insert_id(
        &client,
        NewJob::new("slow", json!({"hold": true})).lease_key("ep"),
    )
    .await;
    let running = onus.start();
    // Its handler runs (not only its claim committed: a clock moved between the claim's commit
    // and the runtime taking the answer would let the rescuer see a lease that nobody holds yet).
    tokio::time::timeout(crate::harness::DEADLINE, started.recv())
        .await
        .expect("the holder started")
        .expect("the handler's channel is open");
    let before = env.wait_state(holder, JobState::Running).await;
    // Far past the lease TTL: the heartbeat renews the job's lease and its slot together.
    env.clock.advance(Duration::from_secs(120));
    let moved = env.clock_now();
    env.wait_job(holder, "lease renewed after the clock moved", |j| {
        j.lease_expires_at.is_some_and(|t| t > moved)
            && j.lease_expires_at != before.lease_expires_at
    })
    .await;
    // Another process (a runtime with its own connections, running a kind this one does not)
    // claims a job of the key: the database says it is still held, and the job waits asleep.
    let other = onus::Onus::builder(env.reopen().await)
        .clock(env.clock.clone())
        .options(crate::harness::fast_options())
        .kind(Kind::new("elsewhere").handler(|_ctx: JobContext| async { Ok(()) }))
        .build()
        .unwrap();
    let other_running = other.start();
    let waiter = crate::harness::insert_id(
        &other.client(),
        NewJob::new("elsewhere", json!({})).lease_key("ep"),
    )
    .await;
    let w = env
        .wait_job(waiter, "asleep behind the holder", |j| {
            j.state == JobState::Snoozed
        })
        .await;
    assert_eq!(w.attempt, 0, "the slot is still held: no second job ran");
    gate.notify_one();
    env.wait_state(holder, JobState::Completed).await;
    let w = env.wait_state(waiter, JobState::Completed).await;
    assert_eq!(w.attempt, 1);
    other_running.shutdown(Duration::from_secs(5)).await;
    running.shutdown(Duration::from_secs(5)).await;
}

pub async fn a_handler_snooze_on_a_leased_job_keeps_its_time(env: Env) {
    let onus = env
        .builder()
        .kind(Kind::new("limited").handler(|_c: JobContext| async {
            Err(onus::JobError::snooze_for(
                Duration::from_secs(3600),
                "429 Retry-After: 3600",
            ))
        }))
        .build()
        .unwrap();
    let client = onus.client();
    let id =
        crate::harness::insert_id(&client, NewJob::new("limited", json!({})).lease_key("ep")).await;
    let running = onus.start();
    let j = env.wait_state(id, JobState::Snoozed).await;
    assert_eq!(
        j.run_at,
        env.clock_now() + chrono::TimeDelta::seconds(3600),
        "releasing the lease did not wake it"
    );
    running.shutdown(Duration::from_secs(5)).await;
    let j = env.job(id).await;
    assert_eq!((j.state, j.attempt), (JobState::Snoozed, 0));
}

pub async fn limits_hold_across_processes(env: Env) {
    // Two runtimes with their own connections to one database, as two processes would have.
    let now = Arc::new(AtomicUsize::new(0));
    let max = Arc::new(AtomicUsize::new(0));
    let limit = RateWindow::new("per-owner", 3, Duration::from_secs(3600), WhenSpent::Snooze);
    let mut running = Vec::new();
    for _ in 0..2 {
        let (n, m, limit) = (now.clone(), max.clone(), limit.clone());
        let onus = onus::Onus::builder(env.reopen().await)
            .clock(env.clock.clone())
            .options(crate::harness::fast_options())
            .queue("default", 8)
            .kind(Kind::new("leased").handler(move |_c: JobContext| {
                let (n, m) = (n.clone(), m.clone());
                async move { crate::harness::gauged(&n, &m).await }
            }))
            .kind(Kind::new("rated").handler(move |ctx: JobContext| {
                let limit = limit.clone();
                async move { ctx.take(&limit, "owner-1").await }
            }))
            .build()
            .unwrap();
        running.push(onus.start());
    }
    let client = env.client();
    let leased = client
        .insert_many(
            (0..16)
                .map(|_| NewJob::new("leased", json!({})).lease_key("endpoint:9"))
                .collect(),
        )
        .await
        .unwrap();
    let rated = client
        .insert_many((0..10).map(|_| NewJob::new("rated", json!({}))).collect())
        .await
        .unwrap();
    for r in &leased {
        // Each process's claims take the key's slot in their own transactions: a job that found
        // it busy waited without running or spending its attempt.
        let j = env.wait_state(r.job.id, JobState::Completed).await;
        assert_eq!((j.attempt, j.snoozes), (1, 0), "{j:?}");
    }
    assert_eq!(
        max.load(Ordering::SeqCst),
        1,
        "one at a time across both processes"
    );
    let env2 = &env;
    let rated_ids: Vec<i64> = rated.iter().map(|r| r.job.id).collect();
    let ids = &rated_ids;
    crate::harness::wait_until("every rated job ran or snoozed", || async move {
        let mut done = 0;
        for id in ids {
            let j = env2.job(*id).await;
            if matches!(j.state, JobState::Completed | JobState::Snoozed) {
                done += 1;
            }
        }
        done == ids.len()
    })
    .await;
    let mut completed = 0;
    for id in &rated_ids {
        if env.job(*id).await.state == JobState::Completed {
            completed += 1;
        }
    }
    assert_eq!(completed, 3, "three uses per window across both processes");
    for r in running {
        r.shutdown(Duration::from_secs(5)).await;
    }
}

/// A kind capped at three running jobs, run by two runtimes (as two processes) with eight slots
/// each: never more than three at once, every job done.
pub async fn max_running_caps_a_kind_across_processes(env: Env) {
    let now = Arc::new(AtomicUsize::new(0));
    let max = Arc::new(AtomicUsize::new(0));
    let mut running = Vec::new();
    let mut client = None;
    for _ in 0..2 {
        let (n, m) = (now.clone(), max.clone());
        let onus = onus::Onus::builder(env.reopen().await)
            .clock(env.clock.clone())
            .options(crate::harness::fast_options())
            .queue("default", 8)
            .kind(
                Kind::new("capped")
                    .max_running(3)
                    .handler(move |_c: JobContext| {
                        let (n, m) = (n.clone(), m.clone());
                        async move {
                            let c = n.fetch_add(1, Ordering::SeqCst) + 1;
                            m.fetch_max(c, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(5)).await; // holds its slot a moment, as real work does
                            n.fetch_sub(1, Ordering::SeqCst);
                            Ok(())
                        }
                    }),
            )
            .build()
            .unwrap();
        client.get_or_insert_with(|| onus.client());
        running.push(onus.start());
    }
    let client = client.unwrap();
    let rows = client
        .insert_many(
            (0..60)
                .map(|i| NewJob::new("capped", json!({ "i": i })))
                .collect(),
        )
        .await
        .unwrap();
    for r in &rows {
        let j = env.wait_state(r.job.id, JobState::Completed).await;
        assert_eq!(j.attempt, 1);
    }
    assert!(
        max.load(Ordering::SeqCst) <= 3,
        "at most 3 at once across both; saw {}",
        max.load(Ordering::SeqCst)
    );
    for r in running {
        r.shutdown(Duration::from_secs(5)).await;
    }
}

/// A rate window from a kind's definition (as configuration gives push and pull kinds), keyed by
/// the args: two per customer per hour, the rest snoozed to the next window without running.
pub async fn a_kinds_rate_window_is_taken_before_each_attempt(env: Env) {
    let ran = Arc::new(AtomicUsize::new(0));
    let r = ran.clone();
    let onus = env
        .builder()
        .kind(
            Kind::new("rated")
                .rate_from(
                    RateWindow::new("rated", 2, Duration::from_secs(3600), WhenSpent::Snooze),
                    onus::KeyTemplate::parse("customer:{customer}").unwrap(),
                )
                .handler(move |_c: JobContext| {
                    r.fetch_add(1, Ordering::SeqCst);
                    async { Ok(()) }
                }),
        )
        .build()
        .unwrap();
    let client = onus.client();
    let e = client
        .insert(NewJob::new("rated", json!({})))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("customer"),
        "a job without the key's field is refused: {e}"
    );
    let ids: Vec<_> = client
        .insert_many(
            (0..5)
                .map(|i| NewJob::new("rated", json!({ "customer": "acme", "i": i })))
                .collect(),
        )
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.job.id)
        .collect();
    let running = onus.start();
    let mut done = 0;
    for id in &ids {
        let j = env
            .wait_job(*id, "completed or snoozed by the window", |j| {
                j.state == JobState::Completed || j.state == JobState::Snoozed
            })
            .await;
        if j.state == JobState::Completed {
            done += 1;
        } else {
            assert_eq!(j.attempt, 0);
            assert_eq!(j.errors[0].class, EntryClass::Snooze);
            assert!(
                j.errors[0].message.contains("customer:acme"),
                "{:?}",
                j.errors
            );
        }
    }
    assert_eq!((done, ran.load(Ordering::SeqCst)), (2, 2));
    running.shutdown(Duration::from_secs(5)).await;
}

/// A completion written in the handler's own transaction hands the key's slot to the key's next
/// job in that same commit, on a store that hands slots on (SQLite): inside the transaction the
/// next job is already running, claimed for this process (no wake-up, no second claim). On every
/// store the jobs run one at a time, each at attempt 1 without a snooze.
pub async fn a_completion_hands_the_key_to_its_next_job_in_the_same_commit(env: Env) {
    use onus::sql::{Sql, Tx};
    static RUNNING: Sql = Sql::new(
        "onus_jobs",
        "SELECT id FROM onus_jobs WHERE lease_key = $1 AND state = 'running' AND id != $2",
    );
    type Seen = Arc<std::sync::Mutex<Vec<(i64, Vec<i64>)>>>;
    let seen: Seen = Arc::default();
    let gauge = Arc::new((AtomicUsize::new(0), AtomicUsize::new(0)));
    let (s, g) = (seen.clone(), gauge.clone());
    let onus = env
        .builder()
        .queue("default", 8)
        .kind(Kind::new("handed").handler(move |ctx: JobContext| {
            let (s, g) = (s.clone(), g.clone());
            async move {
                crate::harness::gauged(&g.0, &g.1).await?;
                let id = ctx.job().id;
                ctx.complete_with(move |tx| {
                    Box::pin(async move {
                        let rows = tx.query(&RUNNING, &["k".into(), id.into()]).await?;
                        let next = rows
                            .iter()
                            .map(|r| r.get::<i64>("id"))
                            .collect::<Result<Vec<_>, _>>()?;
                        s.lock().unwrap().push((id, next));
                        Ok::<_, onus::JobError>(())
                    })
                })
                .await
            }
        }))
        .build()
        .unwrap();
    let rows = onus
        .client()
        .insert_many(
            (0..6)
                .map(|i| NewJob::new("handed", json!({ "i": i })).lease_key("k"))
                .collect(),
        )
        .await
        .unwrap();
    let running = onus.start();
    for r in &rows {
        let j = env.wait_state(r.job.id, JobState::Completed).await;
        assert_eq!((j.attempt, j.snoozes), (1, 0), "{j:?}");
    }
    assert_eq!(gauge.1.load(Ordering::SeqCst), 1, "one at a time");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 6, "{seen:?}");
    let handed: Vec<i64> = seen.iter().flat_map(|(_, next)| next.clone()).collect();
    if !env.store.hands_on_lease_slots() {
        // This store releases the slot and wakes the next job for a claim instead.
        assert!(handed.is_empty(), "{seen:?}");
        running.shutdown(Duration::from_secs(5)).await;
        return;
    }
    // Each completion but the last saw the next job running in its own transaction.
    assert_eq!(handed.len(), 5, "five hand-overs: {seen:?}");
    assert_eq!(
        seen[1..].iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        handed,
        "each job ran as the one before handed it the key: {seen:?}"
    );
    running.shutdown(Duration::from_secs(5)).await;
}
