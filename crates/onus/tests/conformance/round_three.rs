//! Regressions of the third correctness round: each test reproduces a defect and fails without
//! its fix.

use std::time::Duration;

use onus::store::ClaimRequest;
use onus::{
    Backoff, CatchUp, DiscardReason, EntryClass, JobContext, JobError, JobFilter, JobState, Kind,
    NewJob, Periodic, Policy, RetryBudget, Schedule,
};
use serde_json::json;

use crate::harness::{insert_id, wait_until, Env};

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

fn claim_of(env: &Env, kinds: &[&str], limit: usize, caps: &[(&str, u32)]) -> ClaimRequest {
    let now = env.clock_now();
    ClaimRequest {
        queue: "default".into(),
        kinds: kinds.iter().map(|k| k.to_string()).collect(),
        limit,
        owner: "claimer".into(),
        now,
        lease_until: now + chrono::TimeDelta::seconds(30),
        caps: caps.iter().map(|(k, n)| (k.to_string(), *n)).collect(),
        lease_slots: Vec::new(),
    }
}

/// A kind capped by `max_running` beside an uncapped backlog in the same queue used to be
/// claimed only after the uncapped kinds filled the claim: three `bulk` jobs and one `urgent` of
/// priority -100, four claims of one each, returned bulk, bulk, bulk, urgent.
pub async fn regression_a_capped_kind_keeps_its_priority(env: Env) {
    let client = env.client();
    for _ in 0..3 {
        insert_id(&client, NewJob::new("bulk", json!({}))).await;
    }
    let urgent = insert_id(&client, NewJob::new("urgent", json!({})).priority(-100)).await;
    let mut order = Vec::new();
    for _ in 0..4 {
        let got = env
            .store
            .claim(claim_of(&env, &["bulk", "urgent"], 1, &[("urgent", 5)]))
            .await
            .unwrap();
        assert_eq!(got.len(), 1);
        order.push(got[0].kind.clone());
    }
    assert_eq!(order, ["urgent", "bulk", "bulk", "bulk"]);
    assert_eq!(env.job(urgent).await.state, JobState::Running);
    // Each capped kind is held to its room in that one claim, and the rest of the claim is
    // filled from the others even when the capped kind's backlog sorts first.
    for _ in 0..10 {
        insert_id(&client, NewJob::new("urgent", json!({})).priority(-100)).await;
        insert_id(&client, NewJob::new("bulk", json!({}))).await;
    }
    let got = env
        .store
        .claim(claim_of(&env, &["bulk", "urgent"], 8, &[("urgent", 3)]))
        .await
        .unwrap();
    let urgent_taken = got.iter().filter(|j| j.kind == "urgent").count();
    assert_eq!(
        (got.len(), urgent_taken),
        (8, 2),
        "one urgent already runs: room for two more, the rest bulk"
    );
    assert!(
        got.iter().take(2).all(|j| j.kind == "urgent"),
        "priority order"
    );
    // No room left: the capped kind is not claimed at all.
    let got = env
        .store
        .claim(claim_of(&env, &["urgent"], 8, &[("urgent", 3)]))
        .await
        .unwrap();
    assert!(got.is_empty(), "{got:?}");
}

/// The kind periodic schedules enqueue here: it completes at once.
fn tick() -> Kind {
    Kind::new("tick")
        .policy(Policy::preset_periodic())
        .handler(|_c: JobContext| async { Ok(()) })
}

/// A runtime with a five-minute cron schedule in Europe/Berlin and `catch_up`.
fn berlin(env: &Env, catch_up: CatchUp) -> onus::Onus {
    env.builder()
        .kind(tick())
        .periodic(
            Periodic::new(
                "five",
                Schedule::cron("*/5 * * * *")
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

async fn schedule_row(env: &Env, name: &str) -> onus::store::PeriodicRow {
    env.store
        .list_periodic()
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.name == name)
        .unwrap()
}

/// In the second passing of Berlin's repeated hour (2026-10-25T01:10Z) the next run of a
/// five-minute schedule was the end of time (three tries of the first passing, then
/// `Timestamp::MAX`): registering, resuming and a late enqueue there all stored it.
pub async fn regression_cron_in_a_time_zone_survives_the_repeated_hour(env: Env) {
    let sane: onus::Timestamp = "2026-10-25T02:00:00Z".parse().unwrap();
    // A late enqueue: registered at 00:52Z (next 00:55Z), then no process until 01:10Z.
    env.clock
        .advance_to("2026-10-25T00:52:00Z".parse().unwrap());
    let first = berlin(&env, CatchUp::Latest).start();
    wait_until("registered", || async {
        !env.store.list_periodic().await.unwrap().is_empty()
    })
    .await;
    assert_eq!(
        schedule_row(&env, "five").await.next_run_at,
        Some("2026-10-25T00:55:00Z".parse().unwrap())
    );
    first.shutdown(Duration::from_secs(5)).await;
    env.clock
        .advance_to("2026-10-25T01:10:00Z".parse().unwrap());
    let onus = berlin(&env, CatchUp::Latest);
    let client = onus.client();
    let running = onus.start();
    wait_until("the missed period enqueued late", || async {
        schedule_row(&env, "five").await.last_period_at
            == Some("2026-10-25T00:55:00Z".parse().unwrap())
    })
    .await;
    assert_eq!(schedule_row(&env, "five").await.next_run_at, Some(sane));
    // Registering there (a process starting at that instant) and resuming there.
    running.shutdown(Duration::from_secs(5)).await;
    let again = berlin(&env, CatchUp::Latest).start();
    client.pause_periodic("five").await.unwrap();
    client.resume_periodic("five").await.unwrap();
    let row = schedule_row(&env, "five").await;
    assert_eq!((row.paused_at, row.next_run_at), (None, Some(sane)));
    again.shutdown(Duration::from_secs(5)).await;
    // A fresh registration at that instant.
    env.store.pause_periodic("five", None, None).await.unwrap();
    let fresh = onus::Onus::builder(env.store.clone())
        .clock(env.clock.clone())
        .options(crate::harness::fast_options())
        .kind(tick())
        .periodic(Periodic::new(
            "five-fresh",
            Schedule::cron("*/5 * * * *")
                .unwrap()
                .in_timezone("Europe/Berlin")
                .unwrap(),
            NewJob::new("tick", json!({})),
        ))
        .build()
        .unwrap()
        .start();
    wait_until("registered at 01:10Z", || async {
        env.store
            .list_periodic()
            .await
            .unwrap()
            .iter()
            .any(|r| r.name == "five-fresh")
    })
    .await;
    assert_eq!(
        schedule_row(&env, "five-fresh").await.next_run_at,
        Some(sane)
    );
    fresh.shutdown(Duration::from_secs(5)).await;
}

/// An hourly schedule with `catch_up = all`.
fn hourly_all(env: &Env) -> onus::Onus {
    env.builder()
        .kind(tick())
        .periodic(
            Periodic::new(
                "hourly",
                Schedule::every(Duration::from_secs(3600)).unwrap(),
                NewJob::new("tick", json!({})),
            )
            .catch_up(CatchUp::All { limit: 100 }),
        )
        .build()
        .unwrap()
}

/// A resume of a schedule that was not paused moved it past the periods it missed, losing
/// what its catch-up policy promised; and a pause did not stop an enqueue the leader had
/// already decided on.
pub async fn regression_resuming_an_unpaused_schedule_changes_nothing(env: Env) {
    env.clock
        .advance_to("2026-05-01T12:30:00Z".parse().unwrap());
    let first = hourly_all(&env).start();
    wait_until("registered", || async {
        !env.store.list_periodic().await.unwrap().is_empty()
    })
    .await;
    first.shutdown(Duration::from_secs(5)).await;
    // Five hours with no process; then a resume of the schedule, which is not paused.
    env.clock.advance(Duration::from_secs(5 * 3600));
    let onus = hourly_all(&env);
    let client = onus.client();
    client.resume_periodic("hourly").await.unwrap();
    assert_eq!(
        schedule_row(&env, "hourly").await.next_run_at,
        Some("2026-05-01T13:00:00Z".parse().unwrap()),
        "the resume changed nothing"
    );
    let running = onus.start();
    wait_until("the five missed periods enqueued", || async {
        schedule_row(&env, "hourly").await.last_period_at
            == Some("2026-05-01T17:00:00Z".parse().unwrap())
    })
    .await;
    let ticks = env
        .store
        .list(
            &JobFilter {
                kinds: vec!["tick".into()],
                ..Default::default()
            },
            100,
            None,
        )
        .await
        .unwrap();
    assert_eq!(ticks.len(), 5, "{ticks:?}");
    running.shutdown(Duration::from_secs(5)).await;
    // A pause answered before the leader's enqueue is written stops that enqueue.
    let now = env.clock_now();
    assert!(env
        .store
        .pause_periodic("hourly", Some(now), None)
        .await
        .unwrap());
    let row = client
        .prepare(NewJob::new("tick", json!({})).unique_key("late"))
        .unwrap();
    let period: onus::Timestamp = "2026-05-01T18:00:00Z".parse().unwrap();
    assert_eq!(
        env.store
            .enqueue_period("hourly", period, period + chrono::TimeDelta::hours(1), row)
            .await
            .unwrap(),
        None,
        "nothing enqueued after the pause"
    );
    assert_eq!(
        schedule_row(&env, "hourly").await.last_period_at,
        Some("2026-05-01T17:00:00Z".parse().unwrap())
    );
}

/// A cancel asked of a job an outside worker runs was only a flag its heartbeats reported: a
/// worker that went on was never stopped, its key slot and its kind's room held for ever. After
/// `cancel_grace` its heartbeats are refused and the rescuer ends it cancelled.
pub async fn regression_a_requested_cancel_is_enforced_on_pull_jobs(env: Env) {
    let onus = env
        .builder()
        .kind(
            Kind::new("remote")
                .lease_key_from(onus::KeyTemplate::parse("account:{account}").unwrap())
                .max_running(1),
        )
        .build()
        .unwrap();
    let client = onus.client();
    let running = onus.start();
    let kinds = ["remote".to_string()];
    let id = insert_id(&client, NewJob::new("remote", json!({"account": 7}))).await;
    let next = insert_id(&client, NewJob::new("remote", json!({"account": 7}))).await;
    let claimed = client
        .claim_for_worker("default", &kinds, 5, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1, "max_running 1");
    let token = claimed[0].lease_token.clone();
    assert_eq!(claimed[0].job.id, id);
    client.cancel(id).await.unwrap();
    // Told to cancel, its lease no longer reaches past the grace (2 s here).
    let beat = client.heartbeat_lease(id, &token, None).await.unwrap();
    assert!(beat.cancel_requested);
    assert!(beat.lease_expires_at <= env.clock_now() + chrono::TimeDelta::seconds(2));
    env.clock.advance(Duration::from_secs(1));
    let beat = client.heartbeat_lease(id, &token, None).await.unwrap();
    assert!(beat.lease_expires_at <= env.clock_now() + chrono::TimeDelta::seconds(1));
    env.clock.advance(Duration::from_secs(2));
    let refused = client.heartbeat_lease(id, &token, None).await.unwrap_err();
    assert!(
        matches!(refused, onus::Error::Store(onus::StoreError::Conflict(_))),
        "{refused}"
    );
    // Refused for its cancel, or (when the rescuer, woken by the clock's step, came first)
    // because the job has already ended cancelled.
    assert!(
        refused.to_string().contains("cancel_requested")
            || env.job(id).await.state == JobState::Cancelled,
        "{refused}"
    );
    // The rescuer ends it cancelled, its slot and room free: the next job of the key runs.
    let j = env.wait_state(id, JobState::Cancelled).await;
    assert_eq!(j.lease_owner, None);
    wait_until("the next job of the key is claimed", || async {
        !client
            .claim_for_worker("default", &kinds, 5, Duration::ZERO)
            .await
            .unwrap()
            .is_empty()
    })
    .await;
    assert_eq!(env.job(next).await.state, JobState::Running);
    // A worker that never answers again: the cancel cut its lease to the grace, and the rescuer
    // ends the job cancelled once that lapses, without a heartbeat.
    client.cancel(next).await.unwrap();
    let cut = env.job(next).await.lease_expires_at.unwrap();
    assert!(
        cut <= env.clock_now() + chrono::TimeDelta::seconds(2),
        "{cut}"
    );
    env.clock.advance(Duration::from_secs(3));
    env.wait_state(next, JobState::Cancelled).await;
    running.shutdown(Duration::from_secs(5)).await;
}
