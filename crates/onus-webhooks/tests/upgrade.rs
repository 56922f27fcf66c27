//! Databases made before the shared migration runner upgrade in place: a frozen fixture of that
//! schema, with jobs, endpoints, events and attempts in it, is opened by this code, on both
//! backends, and every row is found intact and working.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::time::Duration;

use onus::{Clock, DiscardReason, EntryClass, JobContext, JobState, Kind, ManualClock, Onus};
use onus_testkit::sink::{HttpSink, Reply};
use onus_testkit::{Backend, TestDb};
use onus_webhooks::{AttemptOutcome, WebhookConfig, Webhooks};
use serde_json::json;

const SQLITE: &str = include_str!("fixtures/before_shared_migrations.sqlite.sql");
const POSTGRES: &str = include_str!("fixtures/before_shared_migrations.postgres.sql");
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn at(s: &str) -> onus::Timestamp {
    s.parse().unwrap()
}

async fn load_fixture(db: &TestDb, sink: &str) {
    let fixture = match db.backend {
        Backend::Sqlite => SQLITE,
        Backend::Postgres => POSTGRES,
    };
    db.batch_execute(&fixture.replace("{{SINK}}", sink)).await;
}

async fn an_existing_database_upgrades_in_place(backend: Backend) {
    let sink = HttpSink::start(|_, _| Reply::status(204)).await;
    let db = TestDb::new(backend).await;
    let hook_url = sink.url("/hook");
    load_fixture(&db, &hook_url).await;

    // Before: nothing recorded in onus_migrations yet; the runner adopts the old records.
    let store = onus::open_with(&db.url, false).await.unwrap();
    let before = store
        .migrations(&[&onus_webhooks::MIGRATIONS])
        .await
        .unwrap();
    assert_eq!(
        before
            .iter()
            .map(|l| (l.line.as_str(), l.version))
            .collect::<Vec<_>>(),
        vec![("jobs", 1), ("webhooks", 1)],
        "{before:?}"
    );

    // The new code starts on it: migrations apply, twice is a no-op.
    let store = onus::open(&db.url).await.unwrap();
    let clock = ManualClock::at(at("2026-03-02T00:00:00Z"));
    let cfg = WebhookConfig {
        allow_networks: vec!["127.0.0.1/32".into()],
        ..WebhookConfig::default()
    };
    let hooks = Webhooks::open(store.clone(), cfg.clone()).await.unwrap();
    assert!(store
        .migrate(&[&onus_webhooks::MIGRATIONS])
        .await
        .unwrap()
        .is_empty());
    let status = store
        .migrations(&[&onus_webhooks::MIGRATIONS])
        .await
        .unwrap();
    assert!(status.iter().all(|l| l.is_current()), "{status:?}");

    // Every row intact.
    let j1 = store.get(1).await.unwrap().unwrap();
    assert_eq!(
        (
            j1.kind.as_str(),
            j1.state,
            &j1.args,
            j1.run_at,
            j1.max_attempts
        ),
        (
            "fixture.noop",
            JobState::Available,
            &json!({"n": 1}),
            at("2026-03-01T00:00:00Z"),
            25
        )
    );
    let j2 = store.get(2).await.unwrap().unwrap();
    assert_eq!(j2.state, JobState::Discarded);
    assert_eq!(j2.discard_reason, Some(DiscardReason::Exhausted));
    assert_eq!(j2.unique_key.as_deref(), Some("u-2"));
    assert_eq!(
        j2.errors
            .iter()
            .map(|e| (e.attempt, e.class, e.message.as_str()))
            .collect::<Vec<_>>(),
        vec![
            (1, EntryClass::Error, "boom 1"),
            (2, EntryClass::Error, "boom 2"),
            (3, EntryClass::Error, "boom 3")
        ]
    );
    assert_eq!(j2.finalized_at, Some(at("2026-03-01T02:00:00Z")));
    let j3 = store.get(3).await.unwrap().unwrap();
    assert_eq!(
        (j3.state, j3.lease_key.as_deref()),
        (JobState::Completed, Some("webhook-endpoint:ep_fixture1"))
    );
    let alerts = store.alerts(true, 10).await.unwrap();
    assert_eq!(
        alerts
            .iter()
            .map(|a| (a.job_id, a.message.as_str()))
            .collect::<Vec<_>>(),
        vec![(2, "boom 3")]
    );
    let periodic = store.list_periodic().await.unwrap();
    assert_eq!(periodic.len(), 1);
    assert_eq!(periodic[0].next_run_at, Some(at("2026-03-01T01:00:00Z")));

    let onus = Onus::builder(store.clone())
        .component(&hooks)
        .kind(Kind::new("fixture.noop").handler(|_ctx: JobContext| async { Ok(()) }))
        .clock(clock.clone())
        .options(onus::Options {
            poll_interval: Duration::from_millis(50),
            ..onus::Options::default()
        })
        .build()
        .unwrap();
    let e1 = hooks.endpoint("ep_fixture1").await.unwrap();
    assert_eq!(e1.url, hook_url);
    assert_eq!(e1.description, "the fixture's endpoint");
    assert_eq!(e1.event_types, vec!["invoice.paid".to_string()]);
    assert_eq!(e1.secrets, vec![SECRET.to_string()]);
    assert!(e1.enabled);
    assert_eq!((e1.failing_since, e1.last_failure_at), (None, None));
    assert_eq!(e1.created_at, at("2026-03-01T00:00:00Z"));
    let e2 = hooks.endpoint("ep_fixture2").await.unwrap();
    assert!(!e2.enabled);
    assert_eq!(
        e2.disabled_reason.as_deref(),
        Some("gone: the endpoint answered 410")
    );
    assert_eq!(e2.failing_since, Some(at("2026-02-27T00:00:00Z")));
    assert_eq!(e2.last_failure_at, Some(at("2026-02-28T00:00:00Z")));
    let ev = hooks.event("msg_fixture1").await.unwrap();
    assert_eq!(
        (ev.event_type.as_str(), &ev.payload, ev.created_at),
        (
            "invoice.paid",
            &json!({"invoice": 7, "lines": [1, 2]}),
            at("2026-03-01T00:00:00Z")
        )
    );
    let att = hooks.attempts("msg_fixture1").await.unwrap();
    assert_eq!(att.len(), 1);
    assert_eq!(
        (
            att[0].id.as_str(),
            att[0].job_id,
            att[0].attempt,
            att[0].status,
            att[0].outcome
        ),
        ("att_fixture1", 3, 1, Some(200), AttemptOutcome::Success)
    );
    assert_eq!(att[0].attempted_at, at("2026-03-01T00:00:01Z"));
    assert_eq!(att[0].duration_ms, 1.5);
    assert_eq!(att[0].response_excerpt, "ok");

    // And working: the waiting job runs, the discarded one retries, the old endpoint gets a new
    // event signed with its old secret, and the old event is not published twice.
    let running = onus.start();
    let client = onus.client();
    client
        .wait_for(
            1,
            |j| j.state == JobState::Completed,
            Duration::from_secs(20),
        )
        .await
        .unwrap();
    client.retry(2).await.unwrap();
    client
        .wait_for(
            2,
            |j| j.state == JobState::Completed,
            Duration::from_secs(20),
        )
        .await
        .unwrap();
    let again = hooks
        .publish(
            "invoice.paid",
            json!({"invoice": 7, "lines": [1, 2]}),
            Some("msg_fixture1".into()),
        )
        .await
        .unwrap();
    assert_eq!(
        (again.created_at, again.tenant),
        (at("2026-03-01T00:00:00Z"), None)
    );
    // The same id with another payload names another event: refused.
    assert!(matches!(
        hooks
            .publish("invoice.paid", json!({}), Some("msg_fixture1".into()))
            .await,
        Err(onus_webhooks::Error::Conflict(_))
    ));
    let new = hooks
        .publish("invoice.paid", json!({"invoice": 8}), None)
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while sink.count() == 0 {
        assert!(tokio::time::Instant::now() < deadline, "never delivered");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let r = &sink.received()[0];
    assert_eq!(r.header("webhook-id"), Some(new.id.as_str()));
    let ts: i64 = r.header("webhook-timestamp").unwrap().parse().unwrap();
    assert_eq!(ts, clock.now().timestamp());
    assert_eq!(
        onus_webhooks::signing::verify(SECRET, &r.headers, &r.body, ts),
        Ok(())
    );
    // An endpoint made before body formats existed keeps the bare payload its consumer reads.
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&r.body).unwrap(),
        json!({"invoice": 8})
    );
    running.shutdown(Duration::from_secs(5)).await;
    assert_eq!(sink.count(), 1, "the old event was not delivered again");
}

onus_testkit::both!(an_existing_database_upgrades_in_place);
