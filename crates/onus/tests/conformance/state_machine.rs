//! Property tests of the state machine, run through the real store: random sequences of
//! handler answers, lost workers, manual retries, cancels and clock moves.

use std::time::Duration;

use onus::outcome::{decide, AttemptEnd};
use onus::store::{ClaimRequest, Finish};
use onus::{Backoff, JobError, JobFilter, JobState, NewJob, Policy};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::json;

use crate::harness::Env;

#[derive(Debug, Clone)]
enum Step {
    Run(Answer),
    WorkerLost,
    ManualRetry,
    Cancel,
    Advance(u64),
}

#[derive(Debug, Clone)]
enum Answer {
    Success,
    Error,
    Snooze(u64),
    Discard,
    Panic,
    Timeout,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => prop_oneof![
            1 => Just(Answer::Success),
            4 => Just(Answer::Error),
            2 => (1u64..600).prop_map(Answer::Snooze),
            1 => Just(Answer::Discard),
            1 => Just(Answer::Panic),
            1 => Just(Answer::Timeout),
        ].prop_map(Step::Run),
        1 => Just(Step::WorkerLost),
        1 => Just(Step::ManualRetry),
        1 => Just(Step::Cancel),
        4 => (0u64..4000).prop_map(Step::Advance),
    ]
}

fn end_of(a: &Answer) -> AttemptEnd {
    match a {
        Answer::Success => AttemptEnd::Returned(Ok(())),
        Answer::Error => AttemptEnd::Returned(Err(JobError::retryable("boom"))),
        Answer::Snooze(s) => {
            AttemptEnd::Returned(Err(JobError::snooze_for(Duration::from_secs(*s), "later")))
        }
        Answer::Discard => AttemptEnd::Returned(Err(JobError::discard("bad request"))),
        Answer::Panic => AttemptEnd::Panicked("oops".into()),
        Answer::Timeout => AttemptEnd::TimedOut(Duration::from_secs(1)),
    }
}

async fn run_case(env: &Env, max_attempts: u32, steps: Vec<Step>) -> Result<(), TestCaseError> {
    let policy = Policy {
        max_attempts,
        backoff: Backoff::schedule(vec![
            Duration::from_secs(10),
            Duration::from_secs(100),
            Duration::from_secs(1000),
        ]),
        jitter: 0.1,
        ..Policy::preset_default()
    };
    let client = env.client();
    let kind = format!("k{}", rand_suffix());
    let id = crate::harness::insert_id(
        &client,
        NewJob::new(kind.clone(), json!({})).max_attempts(max_attempts),
    )
    .await;
    let mut manual_retries = 0;
    for step in steps {
        let before = env.job(id).await;
        let now = env.clock_now();
        match &step {
            Step::Run(_) | Step::WorkerLost => {
                let claimed = env
                    .store
                    .claim(ClaimRequest {
                        queue: "default".into(),
                        kinds: vec![kind.clone()],
                        limit: 10,
                        owner: "w".into(),
                        now,
                        lease_until: now + chrono::TimeDelta::seconds(30),
                        caps: Vec::new(),
                        lease_slots: Vec::new(),
                    })
                    .await
                    .unwrap();
                let due = before.state.is_waiting() && before.run_at <= now;
                prop_assert_eq!(
                    claimed.len(),
                    usize::from(due),
                    "claimed exactly when due: {:?}",
                    before.state
                );
                let Some(job) = claimed.into_iter().next() else {
                    continue;
                };
                prop_assert_eq!(job.attempt, before.attempt + 1);
                let end = match &step {
                    Step::Run(a) => end_of(a),
                    _ => AttemptEnd::WorkerLost,
                };
                let t = decide(&job, end, &policy, now, &mut rand::thread_rng());
                if let onus::outcome::Transition::Retry { run_at, .. } = &t {
                    let wait = (*run_at - now).to_std().unwrap();
                    let nominal = policy.nominal_delay(job.attempt);
                    prop_assert!(
                        wait >= nominal.mul_f64(0.9) && wait <= nominal.mul_f64(1.1),
                        "delay {:?} vs {:?}",
                        wait,
                        nominal
                    );
                }
                let f = Finish {
                    id,
                    owner: "w".into(),
                    attempt: job.attempt,
                    transition: t.clone(),
                    now,
                    release_lease: None,
                    periodic: None,
                    expired_before: None,
                    result: None,
                };
                prop_assert_eq!(env.store.finish(&[f]).await.unwrap(), vec![true]);
                let after = env.job(id).await;
                if let Step::Run(Answer::Snooze(_)) = step {
                    prop_assert_eq!(after.attempt, before.attempt, "a snooze spends no attempt");
                    prop_assert_eq!(after.snoozes, before.snoozes + 1);
                    prop_assert_eq!(after.state, JobState::Snoozed);
                }
            }
            Step::ManualRetry => {
                let r = env.store.retry(&JobFilter::id(id), now).await;
                let retryable = matches!(
                    before.state,
                    JobState::Discarded
                        | JobState::Cancelled
                        | JobState::Retryable
                        | JobState::Scheduled
                        | JobState::Snoozed
                );
                prop_assert_eq!(r.is_ok(), retryable);
                if retryable {
                    manual_retries += 1;
                    let after = env.job(id).await;
                    prop_assert_eq!(after.state, JobState::Available);
                    prop_assert!(
                        after.max_attempts > after.attempt,
                        "a manual retry allows one more attempt"
                    );
                }
            }
            Step::Cancel => {
                let r = env.store.cancel(&JobFilter::id(id), now).await;
                prop_assert_eq!(r.is_ok(), !before.state.is_finished());
            }
            Step::Advance(s) => env.clock.advance(Duration::from_secs(*s)),
        }
        let after = env.job(id).await;
        prop_assert!(
            after.attempt <= after.max_attempts,
            "attempt {} > max {}",
            after.attempt,
            after.max_attempts
        );
        if manual_retries == 0 {
            prop_assert_eq!(
                after.max_attempts,
                max_attempts,
                "only a manual retry raises max_attempts"
            );
        }
        if before.state.is_finished() && !matches!(step, Step::ManualRetry) {
            prop_assert_eq!(
                after.state,
                before.state,
                "a finished job changes only by manual retry"
            );
            prop_assert_eq!(after.attempt, before.attempt);
        }
        if after.state == JobState::Discarded
            && after.attempt >= after.max_attempts
            && after.discard_reason == Some(onus::DiscardReason::Exhausted)
        {
            prop_assert_eq!(after.errors.last().map(|e| e.attempt), Some(after.attempt));
        }
    }
    Ok(())
}

fn rand_suffix() -> u64 {
    rand::random()
}

pub async fn state_machine_invariants(env: Env) {
    let handle = tokio::runtime::Handle::current();
    tokio::task::block_in_place(|| {
        let mut runner = TestRunner::new(Config {
            cases: 48,
            failure_persistence: None,
            ..Config::default()
        });
        let strategy = (1u32..6, proptest::collection::vec(step(), 1..40));
        runner
            .run(&strategy, |(max, steps)| {
                handle.block_on(run_case(&env, max, steps))
            })
            .unwrap();
    });
}
