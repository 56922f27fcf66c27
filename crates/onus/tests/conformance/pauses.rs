//! Paused keys: the waiting jobs of a lease key held until a time without a claim, an attempt or
//! a snooze of their own.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use onus::{Job, JobContext, JobError, JobFilter, JobState, Kind, NewJob};
use serde_json::json;

use crate::harness::Env;

/// Held: scheduled until the pause ends, nothing spent, nothing written.
fn assert_held(j: &Job, until: onus::Timestamp) {
    assert_eq!(
        (j.state, j.attempt, j.snoozes, j.errors.len(), j.run_at),
        (JobState::Scheduled, 0, 0, 0, until),
        "job {} is not held until {until}: {j:?}",
        j.id
    );
}

async fn jobs_of(env: &Env, key: &str) -> Vec<Job> {
    env.store
        .list(
            &JobFilter {
                lease_keys: vec![key.into()],
                ..Default::default()
            },
            100_000,
            None,
        )
        .await
        .unwrap()
}

pub async fn a_paused_key_holds_its_jobs_until_the_pause_ends(env: Env) {
    const N: usize = 1000;
    let (now, max, ran) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let (n, m, r) = (now.clone(), max.clone(), ran.clone());
    let onus = env
        .builder()
        .queue("default", 2)
        .kind(
            Kind::new("send")
                .lease_slots(2)
                .handler(move |c: JobContext| {
                    let (n, m, r) = (n.clone(), m.clone(), r.clone());
                    let paused = c.job().lease_key.as_deref() == Some("ep");
                    async move {
                        if paused {
                            r.fetch_add(1, Ordering::SeqCst);
                            crate::harness::gauged(&n, &m).await
                        } else {
                            Ok(())
                        }
                    }
                }),
        )
        .build()
        .unwrap();
    let client = onus.client();
    client
        .insert_many(
            (0..N)
                .map(|i| NewJob::new("send", json!({ "i": i })).lease_key("ep"))
                .collect(),
        )
        .await
        .unwrap();
    let until = env.clock_now() + chrono::TimeDelta::hours(1);
    assert!(
        client.pause_key("ep", env.clock_now(), "").await.is_err(),
        "a pause that ends now is refused"
    );
    let held = client
        .pause_key("ep", until, "upstream maintenance")
        .await
        .unwrap();
    assert_eq!(
        (held.key.as_str(), held.until, held.held),
        ("ep", until, N as u64),
        "the pause as written"
    );
    let paused = client.paused_keys().await.unwrap();
    assert_eq!(paused.len(), 1);
    assert_eq!(
        (paused[0].key.as_str(), paused[0].until, paused[0].held),
        ("ep", until, N as u64)
    );
    assert_eq!(paused[0].reason, "upstream maintenance");

    // A job of another key runs; none of the paused key's is claimed, even one inserted now.
    let running = onus.start();
    let free =
        crate::harness::insert_id(&client, NewJob::new("send", json!({})).lease_key("other")).await;
    let late =
        crate::harness::insert_id(&client, NewJob::new("send", json!({})).lease_key("ep")).await;
    env.wait_state(free, JobState::Completed).await;
    let j = env
        .wait_job(late, "held at its claim", |j| {
            j.state == JobState::Scheduled
        })
        .await;
    assert_held(&j, until);
    env.clock.advance(Duration::from_secs(1800));
    // A claim at the new time (it runs a job of another key) passes them over.
    let free =
        crate::harness::insert_id(&client, NewJob::new("send", json!({})).lease_key("other")).await;
    env.wait_state(free, JobState::Completed).await;
    assert_eq!(ran.load(Ordering::SeqCst), 0, "a held job ran");
    let jobs = jobs_of(&env, "ep").await;
    assert_eq!(jobs.len(), N + 1);
    for j in &jobs {
        assert_held(j, until);
    }
    assert_eq!(client.paused_keys().await.unwrap()[0].held, N as u64 + 1);

    // At its end they run, at most the key's two slots at once.
    env.clock.advance(Duration::from_secs(1800));
    // A thousand jobs through one key's two slots (a debug build on a shared machine).
    crate::harness::wait_until_within(
        "every held job completed",
        Duration::from_secs(120),
        || async {
            jobs_of(&env, "ep")
                .await
                .iter()
                .all(|j| j.state == JobState::Completed)
        },
    )
    .await;
    assert_eq!(ran.load(Ordering::SeqCst), N + 1);
    assert!(
        max.load(Ordering::SeqCst) <= 2,
        "at most 2 at once; saw {}",
        max.load(Ordering::SeqCst)
    );
    for j in jobs_of(&env, "ep").await {
        assert_eq!(j.attempt, 1, "the pause spent no attempt: {j:?}");
        assert!(
            j.errors.iter().all(|e| !e.message.contains("paused")),
            "the pause wrote nothing to job {}: {:?}",
            j.id,
            j.errors
        );
    }
    assert!(
        client.paused_keys().await.unwrap().is_empty(),
        "an ended pause is not listed"
    );
    running.shutdown(Duration::from_secs(5)).await;
}

fn limited() -> Kind {
    Kind::new("limited").handler(|c: JobContext| {
        let first = c.job().args["first"].as_bool().unwrap_or(false);
        async move {
            if first {
                Err(
                    JobError::snooze_for(Duration::from_secs(600), "HTTP 429 Retry-After: 600")
                        .pausing_key(),
                )
            } else {
                Ok(())
            }
        }
    })
}

pub async fn a_handler_that_pauses_its_key_holds_the_others_and_a_resume_frees_them(env: Env) {
    let onus = env.builder().kind(limited()).build().unwrap();
    let client = onus.client();
    // The key's other jobs wait in a queue no worker serves yet, so none is claimed before the
    // answer: the pause itself must hold them.
    let others: Vec<_> = client
        .insert_many(
            (0..10)
                .map(|i| {
                    NewJob::new("limited", json!({ "i": i }))
                        .lease_key("api:acme")
                        .queue("parked")
                })
                .collect(),
        )
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.job.id)
        .collect();
    let first = crate::harness::insert_id(
        &client,
        NewJob::new("limited", json!({ "first": true })).lease_key("api:acme"),
    )
    .await;
    let running = onus.start();
    let until = env.clock_now() + chrono::TimeDelta::seconds(600);
    // The job that got the answer records its own snooze; the others are held without one.
    let j = env.wait_state(first, JobState::Snoozed).await;
    assert_eq!((j.attempt, j.snoozes, j.run_at), (0, 1, until));
    for id in &others {
        assert_held(&env.job(*id).await, until);
    }
    let paused = client.paused_keys().await.unwrap();
    assert_eq!(
        (paused[0].key.as_str(), paused[0].until, paused[0].held),
        ("api:acme", until, 10)
    );
    assert!(paused[0].reason.contains("429"), "{}", paused[0].reason);

    // A resume frees the held jobs at once; the snoozed one keeps its own time.
    assert_eq!(client.resume_key("api:acme").await.unwrap(), Some(10));
    assert_eq!(client.resume_key("api:acme").await.unwrap(), None);
    let parked = env
        .builder()
        .queue("parked", 4)
        .kind(limited())
        .build()
        .unwrap()
        .start();
    for id in &others {
        let j = env.wait_state(*id, JobState::Completed).await;
        assert_eq!(j.attempt, 1);
        // Run one at a time afterwards, some may have found the key busy; the pause wrote nothing.
        assert!(
            j.errors.iter().all(|e| e.message.contains("busy")),
            "{:?}",
            j.errors
        );
    }
    assert_eq!(env.job(first).await.state, JobState::Snoozed);
    parked.shutdown(Duration::from_secs(5)).await;
    running.shutdown(Duration::from_secs(5)).await;
}

pub async fn an_operators_pause_is_replaced_and_a_jobs_only_lengthened(env: Env) {
    let client = env.client();
    let now = env.clock_now();
    let hour = now + chrono::TimeDelta::hours(1);
    let minute = now + chrono::TimeDelta::minutes(1);
    let ids: Vec<_> = client
        .insert_many(
            (0..3)
                .map(|_| NewJob::new("k", json!({})).lease_key("ep"))
                .collect(),
        )
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.job.id)
        .collect();
    assert_eq!(client.pause_key("ep", hour, "").await.unwrap().held, 3);
    for id in &ids {
        assert_held(&env.job(*id).await, hour);
    }
    // An operator's second pause replaces the first, shorter too, and moves the held jobs.
    assert_eq!(client.pause_key("ep", minute, "").await.unwrap().held, 3);
    for id in &ids {
        assert_held(&env.job(*id).await, minute);
    }
    // A pause asked by a job's answer only lengthens one in force.
    env.store
        .pause_key(
            "ep",
            now + chrono::TimeDelta::seconds(5),
            now,
            "HTTP 429",
            onus::store::PauseMode::Extend,
        )
        .await
        .unwrap();
    assert_eq!(client.paused_keys().await.unwrap()[0].until, minute);
    assert_eq!(client.paused_keys().await.unwrap()[0].reason, "HTTP 429");
    assert!(
        client.pause_key("", hour, "").await.is_err(),
        "an empty key is refused"
    );
    assert_eq!(client.resume_key("never-paused").await.unwrap(), None);
    assert_eq!(client.resume_key("ep").await.unwrap(), Some(3));
    for id in &ids {
        let j = env.job(*id).await;
        assert_eq!(
            (j.state, j.run_at),
            (JobState::Scheduled, now),
            "due now: {j:?}"
        );
    }
}

/// A pause of a kind's rate key (from its definition, as configuration gives push and pull kinds)
/// holds the jobs that take that key, as one of a lease key does.
pub async fn a_paused_rate_key_holds_the_jobs_that_take_it(env: Env) {
    let onus = env
        .builder()
        .kind(
            Kind::new("rated")
                .rate_from(
                    onus::RateWindow::new(
                        "rated",
                        1000,
                        Duration::from_secs(3600),
                        onus::WhenSpent::Snooze,
                    ),
                    onus::KeyTemplate::parse("customer:{customer}").unwrap(),
                )
                .handler(|_c: JobContext| async { Ok(()) }),
        )
        .build()
        .unwrap();
    let client = onus.client();
    let waiting: Vec<_> = client
        .insert_many(
            (0..3)
                .map(|i| NewJob::new("rated", json!({ "customer": "acme", "i": i })))
                .collect(),
        )
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.job.id)
        .collect();
    let until = env.clock_now() + chrono::TimeDelta::hours(1);
    assert_eq!(
        client
            .pause_key("customer:acme", until, "")
            .await
            .unwrap()
            .held,
        3
    );
    let running = onus.start();
    // One inserted during the pause is held when its attempt would take the key.
    let late = crate::harness::insert_id(
        &client,
        NewJob::new("rated", json!({ "customer": "acme", "late": true })),
    )
    .await;
    let other = crate::harness::insert_id(
        &client,
        NewJob::new("rated", json!({ "customer": "globex" })),
    )
    .await;
    env.wait_state(other, JobState::Completed).await;
    let j = env
        .wait_job(late, "held at its claim", |j| {
            j.state == JobState::Scheduled
        })
        .await;
    assert_held(&j, until);
    for id in &waiting {
        assert_held(&env.job(*id).await, until);
    }
    assert_eq!(client.paused_keys().await.unwrap()[0].held, 4);
    assert_eq!(client.resume_key("customer:acme").await.unwrap(), Some(4));
    for id in waiting.iter().chain([&late]) {
        let j = env.wait_state(*id, JobState::Completed).await;
        assert_eq!((j.attempt, j.snoozes), (1, 0));
    }
    running.shutdown(Duration::from_secs(5)).await;
}
