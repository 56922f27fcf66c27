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

fn zoned(env: &Env, catch_up: onus::CatchUp) -> onus::Onus {
    env.builder()
        .kind(
            Kind::new("tick")
                .policy(Policy::preset_periodic())
                .handler(|_c: JobContext| async { Ok(()) }),
        )
        .periodic(
            Periodic::new(
                "hourly",
                Schedule::cron("30 2 * * *")
                    .unwrap()
                    .in_timezone("Europe/Berlin")
                    .unwrap(),
                NewJob::new("tick", json!({})),
            )
            .catch_up(catch_up),
        )
        .build()
        .unwrap()
}

async fn schedule_row(env: &Env) -> onus::store::PeriodicRow {
    env.store.list_periodic().await.unwrap().pop().unwrap()
}

/// Walks the manual clock from one run of the schedule to the next until `to`, and returns the
/// periods it enqueued (as UTC instants).
async fn walk(env: &Env, to: &str) -> Vec<String> {
    let to: onus::Timestamp = to.parse().unwrap();
    let mut seen = Vec::new();
    loop {
        let next = schedule_row(env).await.next_run_at.unwrap();
        if next > to {
            return seen;
        }
        env.clock.advance_to(next);
        wait_until("the period enqueued", || async {
            schedule_row(env).await.last_period_at == Some(next)
        })
        .await;
        seen.push(next.to_rfc3339());
    }
}

pub async fn a_daily_schedule_in_a_time_zone_runs_once_across_both_dst_changes(env: Env) {
    env.clock
        .advance_to("2026-03-27T12:00:00Z".parse().unwrap());
    let running = zoned(&env, onus::CatchUp::Skip).start();
    wait_until("registered", || async {
        !env.store.list_periodic().await.unwrap().is_empty()
    })
    .await;
    // Both sides of the spring change: 02:30 does not exist on 29 March; it runs at 03:00 CEST.
    assert_eq!(
        walk(&env, "2026-03-30T12:00:00Z").await,
        [
            "2026-03-28T01:30:00+00:00",
            "2026-03-29T01:00:00+00:00",
            "2026-03-30T00:30:00+00:00"
        ]
    );
    // Months later (the missed periods skipped), both sides of the autumn change: 02:30 passes
    // twice on 25 October and runs once.
    env.clock
        .advance_to("2026-10-23T12:00:00Z".parse().unwrap());
    wait_until("the missed periods skipped", || async {
        schedule_row(&env).await.next_run_at == Some("2026-10-24T00:30:00Z".parse().unwrap())
    })
    .await;
    assert_eq!(
        walk(&env, "2026-10-26T12:00:00Z").await,
        [
            "2026-10-24T00:30:00+00:00",
            "2026-10-25T00:30:00+00:00",
            "2026-10-26T01:30:00+00:00"
        ]
    );
    running.shutdown(Duration::from_secs(5)).await;
}

/// Five days without any process running: `skip` runs none of the missed days, `latest` the
/// last one, `all` each of them up to the limit.
pub async fn missed_periods_follow_the_catch_up_policy_after_an_outage(env: Env) {
    for (catch_up, want) in [
        (onus::CatchUp::Skip, 0),
        (onus::CatchUp::Latest, 1),
        (onus::CatchUp::All { limit: 3 }, 3),
        (onus::CatchUp::All { limit: 100 }, 5),
    ] {
        let name = format!("{catch_up:?}");
        // Registered (its next run set), then every process stops.
        let rt = zoned(&env, catch_up);
        let store = env.store.clone();
        let first = rt.start();
        wait_until("registered", || async {
            !store.list_periodic().await.unwrap().is_empty()
        })
        .await;
        first.shutdown(Duration::from_secs(5)).await;
        let next = schedule_row(&env).await.next_run_at.unwrap();
        let back = next + chrono::TimeDelta::days(4) + chrono::TimeDelta::hours(6);
        env.clock.advance_to(back);
        let running = zoned(&env, catch_up).start();
        // Every policy ends with the schedule moved past now; one that runs missed periods
        // runs the latest of them last.
        let latest = next + chrono::TimeDelta::days(4);
        wait_until(&format!("{name}: the schedule caught up"), || async {
            let row = schedule_row(&env).await;
            row.next_run_at.unwrap() > env.clock_now()
                && (want == 0 || row.last_period_at == Some(latest))
        })
        .await;
        // The jobs enqueued since the restart (older ones are pruned by retention by now).
        let since = || async {
            ticks(&env)
                .await
                .into_iter()
                .filter(|j| j.created_at >= back)
                .collect::<Vec<_>>()
        };
        wait_until(&format!("{name}: its jobs completed"), || async {
            since().await.iter().all(|j| j.state.is_finished())
        })
        .await;
        assert_eq!(since().await.len(), want, "{name}");
        running.shutdown(Duration::from_secs(5)).await;
    }
}

pub async fn a_schedule_is_paused_resumed_and_run_now(env: Env) {
    env.clock
        .advance_to("2026-05-01T12:00:00Z".parse().unwrap());
    let onus = zoned(&env, onus::CatchUp::Latest);
    let client = onus.client();
    let running = onus.start();
    wait_until("registered", || async {
        !env.store.list_periodic().await.unwrap().is_empty()
    })
    .await;
    client.pause_periodic("hourly").await.unwrap();
    assert!(schedule_row(&env).await.paused_at.is_some());
    // Paused across two of its periods: nothing enqueued.
    env.clock.advance(Duration::from_secs(2 * 86_400));
    let job = client.run_periodic("hourly").await.unwrap();
    env.wait_state(job.id, JobState::Completed).await;
    assert_eq!(ticks(&env).await.len(), 1, "only the run asked for");
    wait_until("the run recorded on the schedule", || async {
        schedule_row(&env).await.last_state.as_deref() == Some("completed")
    })
    .await;
    // Resumed: on from its next period; the ones missed while paused are not run.
    client.resume_periodic("hourly").await.unwrap();
    let row = schedule_row(&env).await;
    assert_eq!(row.paused_at, None);
    assert_eq!(
        row.next_run_at,
        Some("2026-05-04T00:30:00Z".parse().unwrap())
    );
    assert!(matches!(
        client.pause_periodic("nope").await,
        Err(onus::Error::NotFound(m)) if m.contains("hourly")
    ));
    env.clock
        .advance_to("2026-05-04T00:30:00Z".parse().unwrap());
    wait_ticks(&env, 2).await;
    running.shutdown(Duration::from_secs(5)).await;
}
