//! Manual actions: retry and cancel, singly and in bulk.

use std::time::Duration;

use onus::{
    Backoff, EntryClass, JobContext, JobError, JobFilter, JobState, Kind, NewJob, Policy,
    StoreError,
};
use serde_json::json;

use crate::harness::Env;

fn discarding(env: &Env) -> onus::Onus {
    env.builder()
        .kind(
            Kind::new("d")
                .policy(Policy {
                    max_attempts: 2,
                    backoff: Backoff::none(),
                    ..Policy::preset_default()
                })
                .handler(|ctx: JobContext| async move {
                    if ctx.job().args["ok_after"]
                        .as_u64()
                        .is_some_and(|n| u64::from(ctx.attempt()) > n)
                    {
                        return Ok(());
                    }
                    Err(JobError::retryable("still failing"))
                }),
        )
        .build()
        .unwrap()
}

pub async fn manual_retry_runs_now_with_one_more_attempt(env: Env) {
    let onus = discarding(&env);
    let client = onus.client();
    let id = crate::harness::insert_id(&client, NewJob::new("d", json!({"ok_after": 2}))).await;
    let running = onus.start();
    let j = env.wait_state(id, JobState::Discarded).await;
    assert_eq!((j.attempt, j.max_attempts), (2, 2));
    let retried = client.retry(id).await.unwrap();
    assert_eq!(
        retried.max_attempts, 3,
        "max_attempts is raised to attempt + 1"
    );
    let j = env.wait_state(id, JobState::Completed).await;
    assert_eq!(j.attempt, 3);
    assert_eq!(j.discard_reason, None);
    assert_eq!(j.errors.len(), 2, "history is kept across a manual retry");
    running.shutdown(Duration::from_secs(5)).await;
}

pub async fn bulk_retry_acts_on_every_matching_job(env: Env) {
    let onus = discarding(&env);
    let client = onus.client();
    let jobs: Vec<NewJob> = (0..250)
        .map(|_| NewJob::new("d", json!({"ok_after": 2})))
        .collect();
    client.insert_many(jobs).await.unwrap();
    let other = crate::harness::insert_id(&client, NewJob::new("other", json!({}))).await;
    let running = onus.start();
    let env2 = &env;
    crate::harness::wait_until("all 250 discarded", || async move {
        env2.count(JobState::Discarded).await == 250
    })
    .await;
    let filter = JobFilter {
        states: vec![JobState::Discarded],
        kinds: vec!["d".into()],
        ..Default::default()
    };
    let out = client.retry_where(&filter).await.unwrap();
    assert_eq!(
        out.retried.len(),
        250,
        "bulk retry acts on every match, not a page"
    );
    assert!(out.refused.is_empty());
    crate::harness::wait_until("all 250 completed", || async move {
        env2.count(JobState::Completed).await == 250
    })
    .await;
    assert_eq!(env.job(other).await.state, JobState::Available);
    running.shutdown(Duration::from_secs(5)).await;
}

pub async fn cancel_waiting_job_at_once(env: Env) {
    let client = env.client();
    let id = crate::harness::insert_id(
        &client,
        NewJob::new("x", json!({})).run_after(Duration::from_secs(60)),
    )
    .await;
    let out = client.cancel(id).await.unwrap();
    assert_eq!(out.cancelled, vec![id]);
    let j = env.job(id).await;
    assert_eq!(j.state, JobState::Cancelled);
    assert_eq!(j.finalized_at, Some(env.clock_now()));
    assert_eq!(j.errors.last().unwrap().class, EntryClass::Cancelled);
    // A cancelled job can be retried by hand.
    client.retry(id).await.unwrap();
    assert_eq!(env.job(id).await.state, JobState::Available);
}

pub async fn cancel_running_job_signals_the_handler(env: Env) {
    let (seen_tx, seen_rx) = tokio::sync::oneshot::channel::<()>();
    let seen_tx = std::sync::Mutex::new(Some(seen_tx));
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let started_tx = std::sync::Mutex::new(Some(started_tx));
    let onus = env
        .builder()
        .kind(Kind::new("long").handler(move |ctx: JobContext| {
            let tx = seen_tx.lock().unwrap().take();
            if let Some(s) = started_tx.lock().unwrap().take() {
                let _ = s.send(());
            }
            async move {
                ctx.cancelled().await;
                if let Some(tx) = tx {
                    let _ = tx.send(());
                }
                Err(JobError::retryable("stopped early"))
            }
        }))
        .build()
        .unwrap();
    let client = onus.client();
    let id = crate::harness::insert_id(&client, NewJob::new("long", json!({}))).await;
    let running = onus.start();
    // Claimed is `running` already; the handler itself must have started (a job cancelled while
    // it waits to start is cancelled without running).
    tokio::time::timeout(Duration::from_secs(20), started_rx)
        .await
        .expect("the handler started")
        .unwrap();
    let out = client.cancel(id).await.unwrap();
    assert_eq!(out.requested, vec![id]);
    tokio::time::timeout(Duration::from_secs(20), seen_rx)
        .await
        .expect("the handler saw the cancellation in time")
        .expect("the handler saw the cancellation");
    let j = env.wait_state(id, JobState::Cancelled).await;
    assert_eq!(j.errors.last().unwrap().class, EntryClass::Cancelled);
    running.shutdown(Duration::from_secs(5)).await;
}

pub async fn bulk_cancel_acts_on_every_matching_job(env: Env) {
    let client = env.client();
    let jobs: Vec<NewJob> = (0..300)
        .map(|_| NewJob::new("c", json!({})).queue("slow"))
        .collect();
    client.insert_many(jobs).await.unwrap();
    let keep = crate::harness::insert_id(&client, NewJob::new("c", json!({}))).await;
    let out = client
        .cancel_where(&JobFilter {
            queues: vec!["slow".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(out.cancelled.len(), 300);
    assert_eq!(env.count(JobState::Cancelled).await, 300);
    assert_eq!(env.job(keep).await.state, JobState::Available);
}

pub async fn retry_and_cancel_refuse_with_a_reason(env: Env) {
    let onus = env
        .builder()
        .kind(Kind::new("ok").handler(|_c: JobContext| async { Ok(()) }))
        .build()
        .unwrap();
    let client = onus.client();
    let id = crate::harness::insert_id(&client, NewJob::new("ok", json!({}))).await;
    let running = onus.start();
    env.wait_state(id, JobState::Completed).await;
    let e = client.retry(id).await.unwrap_err();
    assert!(e.to_string().contains("completed"), "{e}");
    let e = client.cancel(id).await.unwrap_err();
    assert!(e.to_string().contains("already finished"), "{e}");
    match client.retry(999_999).await.unwrap_err() {
        onus::Error::Store(StoreError::NotFound(999_999)) => {}
        e => panic!("unexpected {e}"),
    }
    running.shutdown(Duration::from_secs(5)).await;
}

pub async fn cancel_with_no_filter_cancels_everything_waiting(env: Env) {
    let client = env.client();
    client
        .insert_many(
            (0..20)
                .map(|i| NewJob::new(format!("k{}", i % 3), json!({})))
                .collect(),
        )
        .await
        .unwrap();
    let out = client.cancel_where(&JobFilter::default()).await.unwrap();
    assert_eq!(out.cancelled.len(), 20);
    assert_eq!(env.count(JobState::Cancelled).await, 20);
}

pub async fn a_cancel_requested_elsewhere_wins_over_a_failed_attempt(env: Env) {
    let gate = std::sync::Arc::new(tokio::sync::Notify::new());
    let g = gate.clone();
    let onus = env
        .builder()
        .options(onus::Options {
            heartbeat_interval: Duration::from_secs(3600),
            lease_ttl: Duration::from_secs(3 * 3600),
            ..crate::harness::fast_options()
        })
        .kind(Kind::new("stubborn").handler(move |_ctx: JobContext| {
            let g = g.clone();
            async move {
                g.notified().await; // ignores the cancellation signal
                Err(JobError::retryable("upstream said 503"))
            }
        }))
        .build()
        .unwrap();
    let id = crate::harness::insert_id(&onus.client(), NewJob::new("stubborn", json!({}))).await;
    let running = onus.start();
    env.wait_state(id, JobState::Running).await;
    // Another process asks to cancel; no heartbeat carries it here before the attempt fails.
    let other = onus::Onus::builder(env.reopen().await)
        .build()
        .unwrap()
        .client();
    assert_eq!(other.cancel(id).await.unwrap().requested, vec![id]);
    assert_eq!(
        other.cancel(id).await.unwrap().requested,
        vec![id],
        "asking twice is no error"
    );
    gate.notify_one();
    // Whether the request reached the handler (a notice) or only the outcome (no heartbeat yet),
    // the job ends cancelled and does not run again.
    let j = env.wait_state(id, JobState::Cancelled).await;
    assert!(
        j.errors
            .last()
            .unwrap()
            .message
            .contains("cancelled by request"),
        "{:?}",
        j.errors
    );
    running.shutdown(Duration::from_secs(5)).await;
}
