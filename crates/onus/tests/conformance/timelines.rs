//! Each preset's whole schedule, driven by the manual clock in milliseconds.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use onus::{DiscardReason, JobContext, JobError, JobState, Kind, NewJob, Policy};
use serde_json::json;

use crate::harness::Env;

/// Runs one always-failing job of a kind with `policy` through its whole schedule; returns the
/// time from its first attempt to its last.
async fn full_timeline(env: &Env, kind: &str, policy: Policy) -> Duration {
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let onus = env
        .builder()
        .kind(
            Kind::new(kind)
                .policy(policy.clone())
                .handler(move |_ctx: JobContext| {
                    c.fetch_add(1, Ordering::SeqCst);
                    async { Err(JobError::retryable("503 Service Unavailable")) }
                }),
        )
        .build()
        .unwrap();
    let id = crate::harness::insert_id(&onus.client(), NewJob::new(kind, json!({}))).await;
    let running = onus.start();
    let mut attempted = Vec::new();
    for attempt in 1..=policy.max_attempts {
        let j = env
            .wait_job(id, &format!("attempt {attempt} recorded"), |j| {
                j.attempt == attempt && matches!(j.state, JobState::Retryable | JobState::Discarded)
            })
            .await;
        attempted.push(j.attempted_at.unwrap());
        if attempt < policy.max_attempts {
            assert_eq!(j.state, JobState::Retryable);
            let wait = (j.run_at - env.clock_now()).to_std().unwrap();
            let nominal = policy.nominal_delay(attempt);
            let (lo, hi) = (
                nominal.mul_f64(1.0 - policy.jitter),
                nominal.mul_f64(1.0 + policy.jitter),
            );
            assert!(
                wait >= lo && wait <= hi,
                "attempt {attempt}: waited {wait:?}, nominal {nominal:?}"
            );
            env.clock.advance_to(j.run_at);
        }
    }
    let j = env.job(id).await;
    assert_eq!(j.state, JobState::Discarded);
    assert_eq!(j.discard_reason, Some(DiscardReason::Exhausted));
    assert_eq!(j.errors.len() as u32, policy.max_attempts);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        policy.max_attempts,
        "exactly one call per attempt"
    );
    running.shutdown(Duration::from_secs(5)).await;
    let alerts = env.store.alerts(true, 100).await.unwrap();
    assert_eq!(
        alerts.iter().any(|a| a.job_id == id),
        policy.alert_on_exhaustion,
        "an alert exactly when the policy asks for one"
    );
    (*attempted.last().unwrap() - attempted[0])
        .to_std()
        .unwrap()
}

fn days(d: Duration) -> f64 {
    d.as_secs_f64() / 86_400.0
}

pub async fn webhook_preset_full_timeline(env: Env) {
    let span = full_timeline(&env, "webhook.deliver", Policy::preset_webhook()).await;
    assert!(
        (days(span) - 5.316).abs() < 5.316 * 0.1,
        "18 attempts over about 5.3 days; took {} days",
        days(span)
    );
    // The same schedule with alerting switched on raises an alert once exhausted.
    let alerting = Policy {
        alert_on_exhaustion: true,
        ..Policy::preset_webhook()
    };
    full_timeline(&env, "webhook.deliver.alerting", alerting).await;
}

pub async fn mail_preset_full_timeline(env: Env) {
    let span = full_timeline(&env, "mail.send", Policy::preset_mail()).await;
    let hours = span.as_secs_f64() / 3600.0;
    assert!(
        (hours - 6.07).abs() < 6.07 * 0.1,
        "8 attempts over about 6.07 h; took {hours} h"
    );
}

pub async fn default_preset_full_timeline(env: Env) {
    let span = full_timeline(&env, "search.index", Policy::preset_default()).await;
    assert!(
        (span.as_secs_f64() - 511.0).abs() < 51.1,
        "10 attempts over about 511 s; took {span:?}"
    );
}
