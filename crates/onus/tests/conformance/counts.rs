//! The counters behind the panel, /queues and /metrics: exact after every kind of change,
//! folded or not, and a per-minute history of outcomes.

use std::collections::BTreeMap;
use std::time::Duration;

use onus::{Backoff, JobContext, JobError, JobFilter, JobState, Kind, NewJob, Policy};
use serde_json::json;

use crate::harness::Env;

type Tally = BTreeMap<(JobState, String, String), u64>;

/// The counters, as the store reports them.
async fn counted(env: &Env) -> Tally {
    env.store
        .counts()
        .await
        .expect("counts")
        .into_iter()
        .map(|c| ((c.state, c.kind, c.queue), c.count))
        .collect()
}

/// The truth, by counting the jobs themselves.
async fn scanned(env: &Env) -> Tally {
    let mut out = Tally::new();
    for state in JobState::ALL {
        for kind in ["ok", "fail", "idle"] {
            for queue in ["default", "q2"] {
                let n = env
                    .store
                    .count(&JobFilter {
                        states: vec![state],
                        kinds: vec![kind.into()],
                        queues: vec![queue.into()],
                        ..Default::default()
                    })
                    .await
                    .expect("count");
                if n > 0 {
                    out.insert((state, kind.into(), queue.into()), n);
                }
            }
        }
    }
    out
}

async fn agree(env: &Env, when: &str) {
    assert_eq!(
        counted(env).await,
        scanned(env).await,
        "counters after {when}"
    );
}

pub async fn counters_follow_every_change_folded_or_not(env: Env) {
    let onus = env
        .builder()
        .queue("q2", 2)
        .kind(Kind::new("ok").handler(|_ctx: JobContext| async { Ok(()) }))
        .kind(
            Kind::new("fail")
                .policy(Policy {
                    max_attempts: 2,
                    backoff: Backoff::none(),
                    ..Policy::preset_default()
                })
                .handler(|_ctx: JobContext| async { Err(JobError::retryable("down")) }),
        )
        .build()
        .unwrap();
    let client = onus.client();
    agree(&env, "nothing").await;

    let mut jobs = Vec::new();
    for i in 0..30 {
        jobs.push(NewJob::new("ok", json!({ "i": i })));
    }
    for i in 0..20 {
        jobs.push(NewJob::new("ok", json!({ "i": i })).queue("q2"));
    }
    for i in 0..10 {
        jobs.push(NewJob::new("fail", json!({ "i": i })));
    }
    for i in 0..15 {
        // No handler here: these wait (some later than now) until cancelled.
        let job = NewJob::new("idle", json!({ "i": i })).queue("q2");
        jobs.push(if i % 3 == 0 {
            job.run_at(env.clock_now() + chrono::TimeDelta::hours(1))
        } else {
            job
        });
    }
    client.insert_many(jobs).await.unwrap();
    agree(&env, "a batch insert").await;
    // One by one, and a unique key met twice: the second insert returns the first job and
    // counts nothing.
    for _ in 0..2 {
        client
            .insert(
                NewJob::new("idle", json!({ "u": 1 }))
                    .queue("q2")
                    .unique_key("u-1"),
            )
            .await
            .unwrap();
    }
    client
        .insert_many(vec![
            NewJob::new("idle", json!({ "u": 2 }))
                .queue("q2")
                .unique_key("u-1"),
            NewJob::new("idle", json!({ "u": 3 })).queue("q2"),
        ])
        .await
        .unwrap();
    agree(&env, "single inserts and a unique key met again").await;
    env.store.fold_counts(env.clock_now()).await.unwrap();
    agree(&env, "a fold").await;

    let running = onus.start();
    crate::harness::wait_until("ok and fail jobs finish", || async {
        env.count(JobState::Completed).await == 50 && env.count(JobState::Discarded).await == 10
    })
    .await;
    running.shutdown(Duration::from_secs(5)).await;
    agree(&env, "running, failing and discarding").await;

    let cancelled = client
        .cancel_where(&JobFilter {
            kinds: vec!["idle".into()],
            limit: Some(5),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(cancelled.cancelled.len(), 5);
    agree(&env, "cancelling").await;
    let retried = client
        .retry_where(&JobFilter {
            kinds: vec!["fail".into()],
            limit: Some(4),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(retried.retried.len(), 4);
    agree(&env, "retrying").await;
    let deleted = client
        .delete_where(&JobFilter {
            kinds: vec!["ok".into()],
            queues: vec!["q2".into()],
            limit: Some(7),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(deleted.len(), 7);
    agree(&env, "deleting").await;
    env.store.fold_counts(env.clock_now()).await.unwrap();
    agree(&env, "a second fold").await;
    // A second store (another process) reads the same counters.
    let other = env.reopen().await;
    let mut from_other: Vec<_> = other.counts().await.unwrap();
    let mut here = env.store.counts().await.unwrap();
    from_other.sort_by(|a, b| (a.state, &a.kind, &a.queue).cmp(&(b.state, &b.kind, &b.queue)));
    here.sort_by(|a, b| (a.state, &a.kind, &a.queue).cmp(&(b.state, &b.kind, &b.queue)));
    assert_eq!(from_other, here);

    // The history records arrivals at the minute of the manual clock (deletions leave it alone).
    let since = env.clock_now() - chrono::TimeDelta::hours(1);
    let history = env.store.history(since).await.unwrap();
    let arrived = |kind: &str, state: JobState| -> u64 {
        history
            .iter()
            .filter(|h| h.kind == kind && h.state == state)
            .map(|h| h.count)
            .sum()
    };
    assert_eq!(arrived("ok", JobState::Completed), 50, "{history:?}");
    assert_eq!(arrived("fail", JobState::Retryable), 10, "{history:?}");
    assert_eq!(arrived("fail", JobState::Discarded), 10, "{history:?}");
    let minute = env.clock_now().timestamp() / 60 * 60;
    assert!(
        history.iter().all(|h| h.minute.timestamp() == minute),
        "every arrival at the clock's minute: {history:?}"
    );
    // Folding with a cut-off after that minute drops the history, never the counts.
    env.store
        .fold_counts(env.clock_now() + chrono::TimeDelta::hours(1))
        .await
        .unwrap();
    assert!(env.store.history(since).await.unwrap().is_empty());
    agree(&env, "dropping old history").await;
}
