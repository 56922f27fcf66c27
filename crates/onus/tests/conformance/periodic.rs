//! Periodic jobs: once per period, across restarts and processes; no retries.

use std::time::Duration;

use onus::{JobContext, JobError, JobFilter, JobState, Kind, NewJob, Periodic, Policy, Schedule};
use serde_json::json;

use crate::harness::{wait_until, Env};

fn runtime(env: &Env, schedule: &str, fail: bool) -> onus::Onus {
    env.builder()
        .kind(Kind::new("tick").policy(Policy::preset_periodic()).handler(
            move |_c: JobContext| async move {
                if fail {
                    return Err(JobError::retryable("report server down"));
                }
                Ok(())
            },
        ))
        .periodic(Periodic::new(
            "hourly",
            schedule.parse::<Schedule>().unwrap(),
            NewJob::new("tick", json!({})),
        ))
        .build()
        .unwrap()
}

async fn ticks(env: &Env) -> Vec<onus::Job> {
    let f = JobFilter {
        kinds: vec!["tick".into()],
        ..Default::default()
    };
    let mut v = env.store.list(&f, 1000, None).await.unwrap();
    v.reverse();
    v
}

async fn wait_ticks(env: &Env, n: usize) -> Vec<onus::Job> {
    wait_until(&format!("{n} periodic jobs completed"), || async move {
        let t = ticks(env).await;
        t.len() == n && t.iter().all(|j| j.state.is_finished())
    })
    .await;
    ticks(env).await
}

pub async fn interval_enqueues_once_per_period_across_restarts(env: Env) {
    // Two processes with the same schedule: only the leader enqueues.
    let a = runtime(&env, "every 1h", false).start();
    let other_store = env.reopen().await;
    let b_rt = onus::Onus::builder(other_store)
        .clock(env.clock.clone())
        .options(crate::harness::fast_options())
        .kind(
            Kind::new("tick")
                .policy(Policy::preset_periodic())
                .handler(|_c: JobContext| async { Ok(()) }),
        )
        .periodic(Periodic::new(
            "hourly",
            "every 1h".parse().unwrap(),
            NewJob::new("tick", json!({})),
        ))
        .build()
        .unwrap();
    let b = b_rt.start();
    wait_until("schedule registered", || async {
        env.store
            .list_periodic()
            .await
            .unwrap()
            .first()
            .and_then(|r| r.next_run_at)
            .is_some()
    })
    .await;
    let row = &env.store.list_periodic().await.unwrap()[0];
    assert_eq!(
        row.next_run_at.unwrap().to_rfc3339(),
        "2026-03-01T01:00:00+00:00"
    );
    assert!(
        ticks(&env).await.is_empty(),
        "nothing runs before the first period"
    );

    env.clock.advance(Duration::from_secs(3600));
    let t = wait_ticks(&env, 1).await;
    assert_eq!(t[0].state, JobState::Completed);
    env.clock.advance(Duration::from_secs(3600));
    wait_ticks(&env, 2).await;

    // Restart both: no period is enqueued twice.
    a.shutdown(Duration::from_secs(5)).await;
    b.shutdown(Duration::from_secs(5)).await;
    let c = runtime(&env, "every 1h", false).start();
    wait_until("restarted process leads", || async {
        // A probe that takes only an already-expired leadership: false once a live leader holds it.
        let now = env.clock_now();
        let expired = now - chrono::TimeDelta::microseconds(1);
        !env.store
            .try_lead("onus.periodic", "probe", now, expired)
            .await
            .unwrap()
    })
    .await;
    assert_eq!(ticks(&env).await.len(), 2);
    c.shutdown(Duration::from_secs(5)).await;

    // Down for five periods: caught up once, not five times.
    env.clock.advance(Duration::from_secs(5 * 3600));
    let d = runtime(&env, "every 1h", false).start();
    let t = wait_ticks(&env, 3).await;
    assert_eq!(t.len(), 3);
    let row = &env.store.list_periodic().await.unwrap()[0];
    assert_eq!(
        row.last_period_at.unwrap().to_rfc3339(),
        "2026-03-01T07:00:00+00:00",
        "the latest missed period"
    );
    assert_eq!(
        row.next_run_at.unwrap().to_rfc3339(),
        "2026-03-01T08:00:00+00:00",
        "then the next one to come"
    );
    d.shutdown(Duration::from_secs(5)).await;
    assert_eq!(ticks(&env).await.len(), 3);

    // The store refuses a second enqueue for a period already taken.
    let row = &env.store.list_periodic().await.unwrap()[0];
    let period = row.last_period_at.unwrap();
    let job = env
        .client()
        .prepare(NewJob::new("tick", json!({})))
        .unwrap();
    assert_eq!(
        env.store
            .enqueue_period("hourly", period, period, job)
            .await
            .unwrap(),
        None
    );
}

pub async fn cron_schedule_enqueues_at_its_time(env: Env) {
    let r = runtime(&env, "30 3 * * *", false).start();
    wait_until("schedule registered", || async {
        !env.store.list_periodic().await.unwrap().is_empty()
    })
    .await;
    assert_eq!(
        env.store.list_periodic().await.unwrap()[0]
            .next_run_at
            .unwrap()
            .to_rfc3339(),
        "2026-03-01T03:30:00+00:00"
    );
    env.clock.advance(Duration::from_secs(3 * 3600));
    assert!(ticks(&env).await.is_empty());
    env.clock.advance(Duration::from_secs(30 * 60));
    let t = wait_ticks(&env, 1).await;
    assert_eq!(t[0].max_attempts, 1);
    let row = &env.store.list_periodic().await.unwrap()[0];
    assert_eq!(
        row.next_run_at.unwrap().to_rfc3339(),
        "2026-03-02T03:30:00+00:00"
    );
    assert_eq!(row.last_job_id, Some(t[0].id));
    r.shutdown(Duration::from_secs(5)).await;
}

pub async fn periodic_failure_waits_for_the_next_period(env: Env) {
    let r = runtime(&env, "every 1h", true).start();
    wait_until("schedule registered", || async {
        !env.store.list_periodic().await.unwrap().is_empty()
    })
    .await;
    env.clock.advance(Duration::from_secs(3600));
    let t = wait_ticks(&env, 1).await;
    assert_eq!(t[0].state, JobState::Discarded, "one attempt, no retry");
    assert_eq!(t[0].attempt, 1);
    wait_until("failure recorded", || async {
        env.store.list_periodic().await.unwrap()[0]
            .last_error
            .is_some()
    })
    .await;
    let row = &env.store.list_periodic().await.unwrap()[0];
    assert_eq!(row.last_state.as_deref(), Some("discarded"));
    assert!(row
        .last_error
        .as_deref()
        .unwrap()
        .contains("report server down"));
    assert!(row.last_failure_at.is_some());
    // Nothing more until the next period; then it runs again.
    assert_eq!(ticks(&env).await.len(), 1);
    env.clock.advance(Duration::from_secs(3600));
    wait_ticks(&env, 2).await;
    r.shutdown(Duration::from_secs(5)).await;
}
