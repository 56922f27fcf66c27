//! Regressions of the third correctness round: each test reproduces a defect and fails without
//! its fix.

use std::time::Duration;

use onus::{
    Backoff, DiscardReason, EntryClass, JobContext, JobError, JobState, Kind, NewJob, Policy,
    RetryBudget,
};
use serde_json::json;

use crate::harness::{insert_id, Env};

/// A kind that always fails, three attempts a second apart, under `budget`.
fn failing_under(budget: RetryBudget) -> Kind {
    Kind::new("flaky")
        .policy(Policy {
            max_attempts: 3,
            backoff: Backoff::schedule(vec![Duration::from_secs(1)]),
            jitter: 0.0,
            ..Policy::preset_default()
        })
        .retry_budget(budget)
        .handler(|_c: JobContext| async { Err(JobError::retryable("downstream is down")) })
}

/// A lone failing job under a budget with no `min_per_window` (0.2 of two attempts allows no
/// retry) used to be deferred for ever; it is retried within two windows and ends, exhausted
/// with an alert. So is one under `ratio = 0`.
pub async fn regression_a_retry_budget_never_stalls_a_job(env: Env) {
    const WINDOW: Duration = Duration::from_secs(5);
    for (kind_budget, name) in [
        (RetryBudget::new(0.2, WINDOW, 0).unwrap(), "ratio 0.2"),
        (RetryBudget::new(0.0, WINDOW, 0).unwrap(), "ratio 0"),
    ] {
        let onus = env
            .builder()
            .queue("default", 1)
            .kind(failing_under(kind_budget))
            .build()
            .unwrap();
        let client = onus.client();
        let running = onus.start();
        let start = env.clock_now();
        let id = insert_id(&client, NewJob::new("flaky", json!({}))).await;
        // Time moves only to the job's next due time; within two windows it must be done.
        let mut ended = None;
        for _ in 0..50 {
            let j = env
                .wait_job(id, "waits for a later time or ends", |j| {
                    j.state.is_finished()
                        || (j.state != JobState::Running && j.run_at > env.clock_now())
                })
                .await;
            if j.state.is_finished() {
                ended = Some(j);
                break;
            }
            assert!(
                j.run_at - start <= chrono::TimeDelta::from_std(WINDOW * 2).unwrap(),
                "{name}: the job waits until {} ({:?})",
                j.run_at,
                j.errors
            );
            env.clock.advance_to(j.run_at);
        }
        let j = ended.unwrap_or_else(|| panic!("{name}: the job never ended"));
        assert_eq!(
            (j.state, j.discard_reason, j.attempt),
            (JobState::Discarded, Some(DiscardReason::Exhausted), 3),
            "{name}: {j:?}"
        );
        assert!(
            j.errors.iter().any(|e| e.class == EntryClass::Deferred),
            "{name}: the budget deferred its second retry: {:?}",
            j.errors
        );
        assert!(
            env.store
                .alerts(false, 10)
                .await
                .unwrap()
                .iter()
                .any(|a| a.job_id == id),
            "{name}: the exhausted job raised an alert"
        );
        running.shutdown(Duration::from_secs(5)).await;
    }
}
