//! Retry budgets: at a steady insert rate, a kind whose every attempt fails starts at most the
//! budgeted share of retries in any window; every job still ends, none lost.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use onus::{
    Backoff, DiscardReason, EntryClass, Job, JobContext, JobError, JobFilter, JobState, Kind,
    NewJob, Policy, RetryBudget, Timestamp,
};
use serde_json::json;

use crate::harness::Env;

/// The jobs not finished yet.
async fn open(env: &Env) -> Vec<Job> {
    env.store
        .list(
            &JobFilter {
                states: vec![
                    JobState::Available,
                    JobState::Running,
                    JobState::Scheduled,
                    JobState::Retryable,
                    JobState::Snoozed,
                ],
                ..Default::default()
            },
            100_000,
            None,
        )
        .await
        .unwrap()
}

/// Every unfinished job waits for a later time: nothing due is left for the workers.
async fn settled(env: &Env) -> bool {
    let now = env.clock_now();
    open(env)
        .await
        .iter()
        .all(|j| j.state != JobState::Available && j.state != JobState::Running && j.run_at > now)
}

/// When the next unfinished job is due, if any is left.
async fn next_due(env: &Env) -> Option<Timestamp> {
    open(env).await.iter().map(|j| j.run_at).min()
}

pub async fn a_spent_retry_budget_defers_retries_and_loses_nothing(env: Env) {
    const WINDOW: Duration = Duration::from_secs(10);
    const MIN: usize = 4;
    let budget = RetryBudget::new(0.2, WINDOW, MIN as u32).unwrap();
    let starts: Arc<Mutex<Vec<(Timestamp, u32)>>> = Arc::default();
    let s = starts.clone();
    let onus = env
        .builder()
        .queue("default", 4)
        .kind(
            Kind::new("flaky")
                .policy(Policy {
                    max_attempts: 3,
                    backoff: Backoff::schedule(vec![Duration::from_secs(1)]),
                    jitter: 0.0,
                    ..Policy::preset_default()
                })
                .retry_budget(budget)
                .handler(move |c: JobContext| {
                    s.lock().unwrap().push((c.now(), c.attempt()));
                    async { Err(JobError::retryable("downstream is down")) }
                }),
        )
        .build()
        .unwrap();
    let client = onus.client();
    let running = onus.start();
    let mut ids = Vec::new();
    // Two jobs a second for 20 s, every attempt failing.
    for _ in 0..20 {
        for _ in 0..2 {
            ids.push(crate::harness::insert_id(&client, NewJob::new("flaky", json!({}))).await);
        }
        crate::harness::wait_until("the due jobs ran", || settled(&env)).await;
        env.clock.advance(Duration::from_secs(1));
    }
    // Then time passes, from one due job to the next, until every job has ended.
    for _ in 0..20_000 {
        crate::harness::wait_until("the due jobs ran", || settled(&env)).await;
        match next_due(&env).await {
            Some(t) => env.clock.advance_to(t),
            None => break,
        }
    }
    let mut deferred = 0;
    for id in &ids {
        let j = env.job(*id).await;
        assert_eq!(
            (j.state, j.discard_reason, j.attempt),
            (JobState::Discarded, Some(DiscardReason::Exhausted), 3),
            "every job ends after its attempts: {j:?}"
        );
        deferred += j
            .errors
            .iter()
            .filter(|e| e.class == EntryClass::Deferred)
            .count();
    }
    assert!(deferred > 0, "the budget deferred some retries");
    // Deferred retries come back at their turn, ahead of later ones: few deferrals per retry.
    assert!(
        deferred <= ids.len() * 2 * 3,
        "{deferred} deferrals for {} retries",
        ids.len() * 2
    );
    // In every window ending at an attempt's start, retries are within the budget.
    let starts = starts.lock().unwrap().clone();
    assert_eq!(
        starts.len(),
        ids.len() * 3,
        "each job made its three attempts"
    );
    for &(t, _) in &starts {
        let from = t - chrono::TimeDelta::from_std(WINDOW).unwrap();
        let inside: Vec<_> = starts
            .iter()
            .filter(|(s, _)| *s > from && *s <= t)
            .collect();
        let retries = inside.iter().filter(|(_, a)| *a > 1).count();
        let allowed = ((0.2 * inside.len() as f64).floor() as usize).max(MIN);
        assert!(
            retries <= allowed,
            "{retries} retries among {} attempts in the window ending {t}",
            inside.len()
        );
    }
    running.shutdown(Duration::from_secs(5)).await;
}
