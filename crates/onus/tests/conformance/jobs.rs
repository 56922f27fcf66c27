//! Inserting, running and classifying jobs.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use onus::{
    Backoff, DiscardReason, EntryClass, JobContext, JobError, JobState, Kind, NewJob, Onus,
    Options, Policy,
};
use serde_json::json;

use crate::harness::{wait_until, Env};

fn policy(max: u32) -> Policy {
    Policy {
        max_attempts: max,
        ..Policy::preset_default()
    }
}

pub async fn insert_and_complete(env: Env) {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let onus = env
        .builder()
        .kind(Kind::new("greet").handler(move |ctx: JobContext| {
            let c = c.clone();
            async move {
                assert_eq!(ctx.job().args["name"], "Ada");
                c.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        }))
        .build()
        .unwrap();
    let client = onus.client();
    let ins = client
        .insert(NewJob::new("greet", json!({"name": "Ada"})))
        .await
        .unwrap();
    assert!(ins.inserted);
    assert_eq!(ins.job.state, JobState::Available);
    assert_eq!(ins.job.max_attempts, 10);
    assert_eq!(ins.job.queue, "default");
    let running = onus.start();
    let job = env.wait_state(ins.job.id, JobState::Completed).await;
    assert_eq!(job.attempt, 1);
    assert_eq!(job.finalized_at, Some(env.clock_now()));
    assert!(job.errors.is_empty());
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    running.shutdown(Duration::from_secs(5)).await;
}

#[derive(serde::Deserialize, serde::Serialize)]
struct Greet {
    name: String,
    count: u32,
}

pub async fn args_that_fail_to_decode_are_discarded_naming_the_field(env: Env) {
    let onus = env
        .builder()
        .kind(Kind::new("greet").typed(|_ctx: JobContext, _a: Greet| async move { Ok(()) }))
        .build()
        .unwrap();
    let client = onus.client();
    let bad = client
        .insert(NewJob::new("greet", json!({"name": "x", "count": "many"})))
        .await
        .unwrap()
        .job;
    let missing = client
        .insert(NewJob::new("greet", json!({"count": 2})))
        .await
        .unwrap()
        .job;
    let good = client
        .insert(NewJob::new("greet", json!({"name": "x", "count": 2})))
        .await
        .unwrap()
        .job;
    let running = onus.start();
    let bad = env.wait_state(bad.id, JobState::Discarded).await;
    assert_eq!(bad.discard_reason, Some(DiscardReason::Permanent));
    assert_eq!(bad.errors.len(), 1);
    assert!(
        bad.errors[0].message.contains("count"),
        "{}",
        bad.errors[0].message
    );
    let missing = env.wait_state(missing.id, JobState::Discarded).await;
    assert!(
        missing.errors[0].message.contains("name"),
        "{}",
        missing.errors[0].message
    );
    env.wait_state(good.id, JobState::Completed).await;
    running.shutdown(Duration::from_secs(5)).await;
}

pub async fn retryable_error_waits_out_the_backoff(env: Env) {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let onus = env
        .builder()
        .kind(
            Kind::new("flaky")
                .policy(policy(5))
                .handler(move |_ctx: JobContext| {
                    let n = c.fetch_add(1, Ordering::SeqCst);
                    async move {
                        if n == 0 {
                            Err(std::io::Error::other("connection reset"))?;
                        }
                        Ok(())
                    }
                }),
        )
        .build()
        .unwrap();
    let id = crate::harness::insert_id(&onus.client(), NewJob::new("flaky", json!({}))).await;
    let running = onus.start();
    let failed = env.wait_state(id, JobState::Retryable).await;
    assert_eq!(failed.attempt, 1);
    assert_eq!(failed.errors.len(), 1);
    assert_eq!(failed.errors[0].class, EntryClass::Error);
    assert!(failed.errors[0].message.contains("connection reset"));
    let delay = (failed.run_at - env.clock_now()).to_std().unwrap();
    assert!(
        delay >= Duration::from_millis(900) && delay <= Duration::from_millis(1100),
        "delay {delay:?}"
    );
    // Nothing runs before the backoff is over: once a job inserted after the clock moved has
    // run, the worker has claimed since then, and it left the retryable job alone.
    env.clock.advance(Duration::from_millis(850));
    let probe = crate::harness::insert_id(&onus.client(), NewJob::new("flaky", json!({}))).await;
    env.wait_state(probe, JobState::Completed).await;
    assert_eq!(env.job(id).await.state, JobState::Retryable);
    env.clock.advance_to(failed.run_at);
    let done = env.wait_state(id, JobState::Completed).await;
    assert_eq!(done.attempt, 2);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    running.shutdown(Duration::from_secs(5)).await;
}

pub async fn snooze_spends_no_attempt(env: Env) {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let onus = env
        .builder()
        .kind(
            Kind::new("waits")
                .policy(policy(1))
                .handler(move |_ctx: JobContext| {
                    let n = c.fetch_add(1, Ordering::SeqCst);
                    async move {
                        if n < 2 {
                            return Err(JobError::snooze_for(Duration::from_secs(30), "not yet"));
                        }
                        Ok(())
                    }
                }),
        )
        .build()
        .unwrap();
    let id = crate::harness::insert_id(&onus.client(), NewJob::new("waits", json!({}))).await;
    let running = onus.start();
    for round in 1..=2u32 {
        let j = env
            .wait_job(id, "snoozed again", |j| {
                j.state == JobState::Snoozed && j.snoozes == round
            })
            .await;
        assert_eq!(j.attempt, 0, "a snooze spends no attempt");
        assert_eq!(j.errors.last().unwrap().class, EntryClass::Snooze);
        assert_eq!(j.errors.last().unwrap().message, "not yet");
        assert_eq!(j.run_at, env.clock_now() + chrono::TimeDelta::seconds(30));
        env.clock.advance(Duration::from_secs(30));
    }
    // max_attempts is 1, yet two snoozes later the one real attempt still runs.
    let done = env.wait_state(id, JobState::Completed).await;
    assert_eq!(done.attempt, 1);
    assert_eq!(done.snoozes, 2);
    running.shutdown(Duration::from_secs(5)).await;
}

pub async fn discard_is_permanent(env: Env) {
    let onus = env
        .builder()
        .kind(
            Kind::new("bad")
                .handler(|_ctx: JobContext| async move { Err(JobError::discard("404 not found")) }),
        )
        .build()
        .unwrap();
    let id = crate::harness::insert_id(&onus.client(), NewJob::new("bad", json!({}))).await;
    let running = onus.start();
    let j = env.wait_state(id, JobState::Discarded).await;
    assert_eq!(j.discard_reason, Some(DiscardReason::Permanent));
    assert_eq!(j.attempt, 1);
    assert_eq!(j.errors[0].class, EntryClass::Discard);
    assert!(
        env.store.alerts(true, 10).await.unwrap().is_empty(),
        "a permanent failure raises no alert"
    );
    running.shutdown(Duration::from_secs(5)).await;
}

pub async fn panic_counts_as_a_retryable_failure(env: Env) {
    let onus = env
        .builder()
        .kind(
            Kind::new("boom")
                .policy(policy(3))
                .handler(|_ctx: JobContext| async move {
                    if true {
                        panic!("index out of bounds");
                    }
                    Ok(())
                }),
        )
        .build()
        .unwrap();
    let id = crate::harness::insert_id(&onus.client(), NewJob::new("boom", json!({}))).await;
    let running = onus.start();
    let j = env.wait_state(id, JobState::Retryable).await;
    assert_eq!(j.attempt, 1);
    assert_eq!(j.errors[0].class, EntryClass::Panic);
    assert!(j.errors[0].message.contains("index out of bounds"));
    running.shutdown(Duration::from_secs(5)).await;
}

pub async fn timeout_counts_as_a_retryable_failure(env: Env) {
    let p = Policy {
        timeout: Duration::from_millis(50),
        ..policy(3)
    };
    let onus = env
        .builder()
        .kind(
            Kind::new("slow")
                .policy(p)
                .handler(|_ctx: JobContext| async move {
                    std::future::pending::<()>().await;
                    Ok(())
                }),
        )
        .build()
        .unwrap();
    let id = crate::harness::insert_id(&onus.client(), NewJob::new("slow", json!({}))).await;
    let running = onus.start();
    let j = env.wait_state(id, JobState::Retryable).await;
    assert_eq!(j.errors[0].class, EntryClass::Timeout);
    assert!(
        j.errors[0].message.contains("50ms"),
        "{}",
        j.errors[0].message
    );
    running.shutdown(Duration::from_secs(5)).await;
}

pub async fn unique_key_returns_the_unfinished_job(env: Env) {
    let onus = env
        .builder()
        .kind(Kind::new("idx").handler(|_c: JobContext| async { Ok(()) }))
        .build()
        .unwrap();
    let client = onus.client();
    let a = client
        .insert(NewJob::new("idx", json!({"v": 1})).unique_key("doc-1"))
        .await
        .unwrap();
    let b = client
        .insert(NewJob::new("idx", json!({"v": 2})).unique_key("doc-1"))
        .await
        .unwrap();
    assert!(a.inserted && !b.inserted);
    assert_eq!(a.job.id, b.job.id);
    assert_eq!(b.job.args["v"], 1);
    // Another kind may use the same key.
    let other = client
        .insert(NewJob::new("idx2", json!({})).unique_key("doc-1"))
        .await
        .unwrap();
    assert!(other.inserted);
    // A batch holding a duplicate of itself inserts once.
    let batch = client
        .insert_many(vec![
            NewJob::new("idx", json!({})).unique_key("doc-2"),
            NewJob::new("idx", json!({})).unique_key("doc-2"),
        ])
        .await
        .unwrap();
    assert!(batch[0].inserted && !batch[1].inserted);
    assert_eq!(batch[0].job.id, batch[1].job.id);
    let running = onus.start();
    env.wait_state(a.job.id, JobState::Completed).await;
    // Once finished, the key is free again.
    let c = client
        .insert(NewJob::new("idx", json!({})).unique_key("doc-1"))
        .await
        .unwrap();
    assert!(c.inserted);
    assert_ne!(c.job.id, a.job.id);
    running.shutdown(Duration::from_secs(5)).await;
}

pub async fn scheduled_jobs_wait_and_priorities_order(env: Env) {
    let order = Arc::new(Mutex::new(Vec::new()));
    let o = order.clone();
    let onus = env
        .builder()
        .queue("default", 1)
        .kind(Kind::new("p").handler(move |ctx: JobContext| {
            o.lock()
                .unwrap()
                .push(ctx.job().args["n"].as_i64().unwrap());
            async { Ok(()) }
        }))
        .build()
        .unwrap();
    let client = onus.client();
    let later = client
        .insert(NewJob::new("p", json!({"n": 0})).run_after(Duration::from_secs(3600)))
        .await
        .unwrap();
    assert_eq!(later.job.state, JobState::Scheduled);
    let mut ids = Vec::new();
    for (n, prio) in [(3, 3), (1, 1), (2, 2), (4, 3)] {
        ids.push(
            crate::harness::insert_id(&client, NewJob::new("p", json!({"n": n})).priority(prio))
                .await,
        );
    }
    let running = onus.start();
    for id in ids {
        env.wait_state(id, JobState::Completed).await;
    }
    assert_eq!(*order.lock().unwrap(), vec![1, 2, 3, 4]);
    assert_eq!(env.job(later.job.id).await.state, JobState::Scheduled);
    env.clock.advance(Duration::from_secs(3600));
    env.wait_state(later.job.id, JobState::Completed).await;
    assert_eq!(*order.lock().unwrap(), vec![1, 2, 3, 4, 0]);
    running.shutdown(Duration::from_secs(5)).await;
}

pub async fn queues_have_their_own_concurrency(env: Env) {
    struct Gauge {
        now: AtomicUsize,
        max: AtomicUsize,
    }
    let gauges: Arc<Vec<Gauge>> = Arc::new(
        (0..2)
            .map(|_| Gauge {
                now: AtomicUsize::new(0),
                max: AtomicUsize::new(0),
            })
            .collect(),
    );
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let (g, gt) = (gauges.clone(), gate.clone());
    let onus = env
        .builder()
        .queue("a", 2)
        .queue("b", 1)
        .kind(Kind::new("w").handler(move |ctx: JobContext| {
            let (g, gt) = (g.clone(), gt.clone());
            async move {
                let q = if ctx.job().queue == "a" { 0 } else { 1 };
                let now = g[q].now.fetch_add(1, Ordering::SeqCst) + 1;
                g[q].max.fetch_max(now, Ordering::SeqCst);
                gt.acquire().await.unwrap().forget();
                g[q].now.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            }
        }))
        .build()
        .unwrap();
    let client = onus.client();
    let mut ids = Vec::new();
    for i in 0..9 {
        let q = if i < 6 { "a" } else { "b" };
        ids.push(crate::harness::insert_id(&client, NewJob::new("w", json!({})).queue(q)).await);
    }
    let running = onus.start();
    let gg = gauges.clone();
    wait_until("both queues full", || {
        let gg = gg.clone();
        async move { gg[0].now.load(Ordering::SeqCst) == 2 && gg[1].now.load(Ordering::SeqCst) == 1 }
    })
    .await;
    gate.add_permits(9);
    for id in ids {
        env.wait_state(id, JobState::Completed).await;
    }
    assert_eq!(gauges[0].max.load(Ordering::SeqCst), 2);
    assert_eq!(gauges[1].max.load(Ordering::SeqCst), 1);
    running.shutdown(Duration::from_secs(5)).await;
}

pub async fn batch_insert_is_all_or_nothing(env: Env) {
    let client = env.client();
    let err = client
        .insert_many(vec![
            NewJob::new("ok", json!({})),
            NewJob::new("", json!({})),
        ])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("kind must not be empty"), "{err}");
    assert_eq!(env.count(JobState::Available).await, 0);
    let rows = client
        .insert_many(
            (0..500)
                .map(|i| NewJob::new("ok", json!({"i": i})))
                .collect(),
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 500);
    assert!(
        rows.windows(2).all(|w| w[0].job.id < w[1].job.id),
        "ids follow insertion order"
    );
    assert_eq!(env.count(JobState::Available).await, 500);
}

pub async fn never_claims_unknown_kinds(env: Env) {
    let onus = env
        .builder()
        .kind(Kind::new("known").handler(|_c: JobContext| async { Ok(()) }))
        .build()
        .unwrap();
    let client = onus.client();
    let unknown = crate::harness::insert_id(&client, NewJob::new("unknown", json!({}))).await;
    let known = crate::harness::insert_id(&client, NewJob::new("known", json!({}))).await;
    let running = onus.start();
    env.wait_state(known, JobState::Completed).await;
    env.clock.advance(Duration::from_secs(3600));
    let k2 = crate::harness::insert_id(&client, NewJob::new("known", json!({}))).await;
    env.wait_state(k2, JobState::Completed).await;
    let u = env.job(unknown).await;
    assert_eq!((u.state, u.attempt), (JobState::Available, 0));
    running.shutdown(Duration::from_secs(5)).await;
}

pub async fn exhausted_jobs_raise_an_alert(env: Env) {
    let p = Policy {
        max_attempts: 2,
        backoff: Backoff::none(),
        ..Policy::preset_default()
    };
    let onus = env
        .builder()
        .kind(
            Kind::new("doomed")
                .policy(p)
                .handler(|_c: JobContext| async { Err(JobError::retryable("upstream down")) }),
        )
        .build()
        .unwrap();
    let id = crate::harness::insert_id(&onus.client(), NewJob::new("doomed", json!({}))).await;
    let running = onus.start();
    let j = env.wait_state(id, JobState::Discarded).await;
    assert_eq!(j.discard_reason, Some(DiscardReason::Exhausted));
    assert_eq!((j.attempt, j.errors.len()), (2, 2));
    let alerts = env.store.alerts(false, 10).await.unwrap();
    assert_eq!(alerts.len(), 1);
    assert_eq!((alerts[0].job_id, alerts[0].kind.as_str()), (id, "doomed"));
    assert!(alerts[0].message.contains("upstream down"));
    assert!(env
        .store
        .ack_alert(alerts[0].id, env.clock_now())
        .await
        .unwrap());
    assert!(env.store.alerts(false, 10).await.unwrap().is_empty());
    assert_eq!(env.store.alerts(true, 10).await.unwrap().len(), 1);
    running.shutdown(Duration::from_secs(5)).await;
}

/// A handler that completes its job together with a follow-up job ("send, then mark"): both
/// commit or neither, a failed step rolls both back, and the completion releases the job's lease
/// key.
pub async fn complete_with_commits_the_job_and_its_writes_together(env: Env) {
    let fail_step = Arc::new(AtomicUsize::new(1)); // the first attempt's step fails
    let f = fail_step.clone();
    let onus = env
        .builder()
        .queue("default", 4)
        .kind(
            Kind::new("send")
                .policy(policy(3))
                .handler(move |ctx: JobContext| {
                    let f = f.clone();
                    async move {
                        let marked = ctx
                            .client()
                            .prepare(NewJob::new("marked", json!({"of": ctx.job().id})))?;
                        let fail = f
                            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                            .is_ok();
                        ctx.complete_with(move |tx| {
                            Box::pin(async move {
                                use onus::store::JobTx;
                                tx.insert_job(marked).await?;
                                if fail {
                                    return Err(JobError::retryable("the step failed"));
                                }
                                Ok(())
                            })
                        })
                        .await?;
                        // Completed: an error now changes nothing.
                        Err(JobError::discard("after the commit"))
                    }
                }),
        )
        .kind(Kind::new("marked"))
        .build()
        .unwrap();
    let client = onus.client();
    let id =
        crate::harness::insert_id(&client, NewJob::new("send", json!({})).lease_key("k")).await;
    let waiter =
        crate::harness::insert_id(&client, NewJob::new("send", json!({})).lease_key("k")).await;
    let running = onus.start();
    wait_until("the first attempt's step failed", || async {
        env.count(JobState::Retryable).await == 1
    })
    .await;
    // The waiter ran and completed in its own transaction, which released the key at once
    // (the clock has not moved, so no lease ran out).
    wait_until("the waiter completed", || async {
        env.count(JobState::Completed).await == 1
    })
    .await;
    assert_eq!(
        env.store.lease_busy_until("k").await.unwrap(),
        None,
        "the completion released the lease key"
    );
    env.clock.advance(Duration::from_secs(60)); // past its backoff
    for id in [id, waiter] {
        let j = env
            .wait_job(id, "completed", |j| j.state == JobState::Completed)
            .await;
        assert!(j.discard_reason.is_none());
    }
    let marks = client
        .list(
            &onus::JobFilter {
                kinds: vec!["marked".into()],
                ..Default::default()
            },
            10,
            None,
        )
        .await
        .unwrap();
    assert_eq!(
        marks.len(),
        2,
        "one mark per completed job, none from the rolled-back step"
    );
    let first = env.job(id).await;
    let second = env.job(waiter).await;
    let failed = if first.attempt == 2 { &first } else { &second };
    assert_eq!(failed.attempt, 2, "the rolled-back attempt was retried");
    assert_eq!(failed.errors[0].class, EntryClass::Error);
    assert!(failed.errors[0].message.contains("the step failed"));
    running.shutdown(Duration::from_secs(5)).await;
}

/// A kind's args check refuses a bad insert with its message, and writes nothing.
pub async fn a_kinds_args_check_refuses_bad_inserts(env: Env) {
    let onus = env
        .builder()
        .kind(Kind::new("checked").check_args(|a| match a.get("to") {
            Some(serde_json::Value::String(_)) => Ok(()),
            _ => Err("to: give an address".into()),
        }))
        .build()
        .unwrap();
    let client = onus.client();
    let e = client
        .insert(NewJob::new("checked", json!({"to": 1})))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, onus::Error::Invalid(m) if m == "to: give an address"),
        "{e}"
    );
    let e = client
        .insert_many(vec![
            NewJob::new("checked", json!({"to": "a@example.com"})),
            NewJob::new("checked", json!({})),
        ])
        .await
        .unwrap_err();
    assert!(matches!(e, onus::Error::Invalid(_)));
    assert_eq!(
        env.count(JobState::Available).await,
        0,
        "nothing was written"
    );
    client
        .insert(NewJob::new("checked", json!({"to": "a@example.com"})))
        .await
        .unwrap();
}
/// A job another process inserts wakes an idle worker here long before its poll: PostgreSQL's
/// notice, or on SQLite the writer's watch for other processes' commits.
pub async fn another_process_insert_wakes_an_idle_worker_long_before_its_poll(env: Env) {
    let onus = Onus::builder(env.store.clone())
        .options(Options {
            poll_interval: Duration::from_secs(600),
            ..Options::default()
        })
        .kind(Kind::new("ping").handler(|_c: JobContext| async { Ok(()) }))
        .build()
        .unwrap();
    let running = onus.start();
    // Let the worker make its first (empty) claim and go idle: a job it then runs came by notice.
    let warm = crate::harness::insert_id(&onus.client(), NewJob::new("ping", json!({}))).await;
    env.wait_state(warm, JobState::Completed).await;
    // Another process inserts: nothing in this process hears of it but the notice.
    let other = Onus::builder(env.reopen().await).build().unwrap().client();
    for _ in 0..5 {
        let id = crate::harness::insert_id(&other, NewJob::new("ping", json!({}))).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if env.job(id).await.state == JobState::Completed {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "not picked up; the poll interval is 10 minutes"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    running.shutdown(Duration::from_secs(5)).await;
}

/// An insert whose queue has an idle worker in this process claims the job in its own
/// transaction (one commit) and hands it over at once; a job this process does not run, one due
/// later, one with a unique key, and one in a paused queue are inserted as before.
pub async fn an_insert_claims_its_job_for_an_idle_worker_of_its_own_process(env: Env) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<i64>();
    let onus = Onus::builder(env.store.clone())
        .options(Options {
            poll_interval: Duration::from_secs(600),
            ..Options::default()
        })
        .queue("default", 4)
        .kind(Kind::new("ping").handler(move |c: JobContext| {
            let _ = tx.send(c.job().id);
            async { Ok(()) }
        }))
        .build()
        .unwrap();
    let client = onus.client();
    // No worker running: inserted as usual.
    let before = client.insert(NewJob::new("ping", json!({}))).await.unwrap();
    assert_eq!(before.job.state, JobState::Available);
    let running = onus.start();
    env.wait_state(before.job.id, JobState::Completed).await;
    // Once the worker has found nothing more to claim, an insert claims for it.
    let taken = std::sync::Arc::new(std::sync::Mutex::new(None));
    wait_until("an insert claimed by the insert itself", || {
        let (client, taken) = (client.clone(), taken.clone());
        async move {
            let i = client.insert(NewJob::new("ping", json!({}))).await.unwrap();
            let ok = i.job.state == JobState::Running;
            if ok {
                *taken.lock().unwrap() = Some(i.job);
            }
            ok
        }
    })
    .await;
    let job = taken.lock().unwrap().take().unwrap();
    assert_eq!(job.attempt, 1);
    assert!(job.lease_owner.is_some() && job.lease_expires_at.is_some());
    let done = env.wait_state(job.id, JobState::Completed).await;
    assert_eq!(done.attempt, 1, "run once");
    let mut calls = Vec::new();
    while let Ok(id) = rx.try_recv() {
        calls.push(id);
    }
    assert_eq!(calls.iter().filter(|i| **i == job.id).count(), 1);
    // Not for this process, not due yet, uniquely keyed: inserted as before.
    let elsewhere = client
        .insert(NewJob::new("elsewhere", json!({})))
        .await
        .unwrap();
    assert_eq!(elsewhere.job.state, JobState::Available);
    let later = client
        .insert(
            NewJob::new("ping", json!({})).run_at(chrono::Utc::now() + chrono::TimeDelta::hours(1)),
        )
        .await
        .unwrap();
    assert_eq!(later.job.state, JobState::Scheduled);
    let keyed = client
        .insert(NewJob::new("ping", json!({})).unique_key("only-one"))
        .await
        .unwrap();
    assert_eq!(keyed.job.state, JobState::Available);
    env.wait_state(keyed.job.id, JobState::Completed).await;
    // A paused queue claims nothing, not even this way.
    client.pause_queue("default").await.unwrap();
    let paused = client.insert(NewJob::new("ping", json!({}))).await.unwrap();
    assert_eq!(paused.job.state, JobState::Available);
    client.resume_queue("default").await.unwrap();
    env.wait_state(paused.job.id, JobState::Completed).await;
    running.shutdown(Duration::from_secs(5)).await;
}
