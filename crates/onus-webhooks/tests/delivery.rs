//! Webhook delivery against a real HTTP sink on loopback, on both storage backends. The manual
//! clock drives days of schedule in milliseconds.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use onus::{Clock, DiscardReason, Job, JobFilter, JobState, ManualClock, Onus, Options, Running};
use onus_testkit::sink::{ConnCounter, HttpSink, Received, Reply};
use onus_testkit::{wait_until, Backend, TestDb};
use onus_webhooks::{signing, Endpoint, NewEndpoint, WebhookConfig, Webhooks, DELIVER};
use serde_json::json;

struct World {
    url: String,
    store: Arc<dyn onus::Store>,
    client: onus::Client,
    clock: ManualClock,
    hooks: Webhooks,
    running: Option<Running>,
    _db: TestDb,
}

async fn world(backend: Backend, cfg: WebhookConfig) -> World {
    let db = TestDb::new(backend).await;
    let url = db.url.clone();
    let store = onus::open(&url).await.unwrap();
    let clock = ManualClock::at("2026-03-01T00:00:00Z".parse().unwrap());
    let cfg = WebhookConfig {
        allow_networks: vec!["127.0.0.1/32".into()],
        ..cfg
    };
    let hooks = Webhooks::open(store.clone(), cfg).await.unwrap();
    let onus = Onus::builder(store.clone())
        .component(&hooks)
        .clock(clock.clone())
        .queue("default", 8)
        .options(Options {
            poll_interval: Duration::from_millis(100),
            rescue_interval: Duration::from_millis(100),
            heartbeat_interval: Duration::from_millis(100),
            ..Options::default()
        })
        .build()
        .unwrap();
    let running = Some(onus.start());
    World {
        url,
        store,
        client: onus.client(),
        clock,
        hooks,
        running,
        _db: db,
    }
}

impl World {
    async fn endpoint(&self, url: String) -> (Endpoint, String) {
        self.hooks
            .create_endpoint(NewEndpoint {
                url,
                ..Default::default()
            })
            .await
            .unwrap()
    }

    async fn deliveries(&self, event: &str) -> Vec<Job> {
        let f = JobFilter {
            kinds: vec![DELIVER.into()],
            ..Default::default()
        };
        let all = self.store.list(&f, 10_000, None).await.unwrap();
        all.into_iter()
            .filter(|j| j.args["event_id"] == event)
            .collect()
    }

    /// Waits until the event's single delivery job satisfies `f`.
    async fn wait_delivery(&self, event: &str, what: &str, f: impl Fn(&Job) -> bool) -> Job {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let d = self.deliveries(event).await;
            if let Some(j) = d.first() {
                if f(j) {
                    return j.clone();
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "delivery of {event} never reached: {what}; {d:?}"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Waits until the event's fan-out is done: at its publish (few endpoints, no fan-out job)
    /// or by its fan-out job.
    async fn wait_fanned_out(&self, event: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let f = JobFilter {
                kinds: vec![onus_webhooks::FANOUT.into()],
                ..Default::default()
            };
            let done = self
                .store
                .list(&f, 10_000, None)
                .await
                .unwrap()
                .iter()
                .all(|j| j.args["event_id"] != event || j.state == JobState::Completed);
            if done {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the fan-out of {event} never finished"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    async fn stop(mut self) {
        if let Some(r) = self.running.take() {
            r.shutdown(Duration::from_secs(5)).await;
        }
    }
}

fn verify(secret: &str, r: &Received) -> Result<(), signing::SignError> {
    let ts: i64 = r.header("webhook-timestamp").unwrap().parse().unwrap();
    signing::verify(secret, &r.headers, &r.body, ts)
}

onus_testkit::both!(
    regression_a_consumer_can_tell_what_it_received,
    fails_twice_then_delivers_with_one_id_and_fresh_signatures,
    retry_after_snoozes_without_spending_an_attempt,
    a_429_with_retry_after_holds_the_endpoints_other_deliveries,
    gone_disables_the_endpoint_at_once,
    an_always_failing_endpoint_gets_exactly_the_policys_requests,
    a_failing_endpoint_gets_new_deliveries_after_a_cooldown,
    never_two_requests_at_once_to_one_endpoint,
    five_days_of_failure_disable_and_a_stale_failure_does_not,
    redeliver_after_the_fix_delivers_every_discarded_event,
    regression_a_refused_address_is_refused_at_registration_and_starts_no_cooldown,
    publish_commits_with_the_callers_transaction_or_not_at_all,
    a_rotated_secret_signs_alongside_the_previous_one,
    busy_until_shows_the_delivery_in_flight,
    old_events_are_pruned_and_their_deliveries_discarded,
    endless_retry_after_spends_attempts_after_five_snoozes,
    a_fanout_that_runs_again_delivers_nothing_twice,
    an_event_for_many_endpoints_fans_out_in_a_job_and_one_for_few_at_its_publish,
    concurrent_publishes_share_commits_and_a_conflicting_one_fails_alone,
    a_connection_failure_is_recorded_as_an_attempt,
    regression_a_2xx_with_a_nul_in_its_body_is_a_success,
    regression_oversized_or_nul_payloads_are_refused_and_secrets_never_debug_print,
);

/// A 2xx answer whose body holds a NUL (PostgreSQL's TEXT refuses it) is one successful
/// delivery, recorded, and the endpoint's health is updated.
async fn regression_a_2xx_with_a_nul_in_its_body_is_a_success(backend: Backend) {
    let sink = HttpSink::start(|_, n| {
        if n == 1 {
            Reply::status(500).body("oops\0")
        } else {
            Reply::status(200).body("ok\0thanks")
        }
    })
    .await;
    let w = world(backend, WebhookConfig::default()).await;
    let (ep, _) = w.endpoint(sink.url("/hook")).await;
    let ev = w.hooks.publish("a.b", json!({}), None).await.unwrap();
    let j = w
        .wait_delivery(&ev.id, "failed once", |j| j.state == JobState::Retryable)
        .await;
    assert!(w
        .hooks
        .endpoint(&ep.id)
        .await
        .unwrap()
        .failing_since
        .is_some());
    w.clock.advance_to(j.run_at);
    let j = w
        .wait_delivery(&ev.id, "delivered", |j| j.state == JobState::Completed)
        .await;
    assert_eq!(j.attempt, 2);
    assert_eq!(sink.received().len(), 2);
    let attempts = w.hooks.attempts(&ev.id).await.unwrap();
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[0].response_excerpt, "oops");
    assert_eq!(attempts[1].response_excerpt, "okthanks");
    assert_eq!(attempts[1].outcome, onus_webhooks::AttemptOutcome::Success);
    assert_eq!(
        w.hooks.endpoint(&ep.id).await.unwrap().failing_since,
        None,
        "the success cleared the endpoint's failure"
    );
    w.stop().await;
}

/// An endpoint's `Debug` hides its secrets; an oversized or NUL-holding payload is
/// refused with what to fix, and nothing is stored.
async fn regression_oversized_or_nul_payloads_are_refused_and_secrets_never_debug_print(
    backend: Backend,
) {
    let w = world(backend, WebhookConfig::default()).await;
    let (ep, secret) = w.endpoint("http://127.0.0.1:9/hook".into()).await;
    let ep = w.hooks.endpoint(&ep.id).await.unwrap();
    assert_eq!(ep.secrets.len(), 1);
    let shown = format!("{ep:?}");
    assert!(!shown.contains(&secret), "{shown}");
    assert!(shown.contains("1 hidden"), "{shown}");
    let big = "x".repeat(onus_webhooks::MAX_PAYLOAD_BYTES);
    let e = w
        .hooks
        .publish("a.b", json!({ "big": big }), Some("too-big".into()))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("the most is 262144"), "{e}");
    let e = w
        .hooks
        .publish("a.b", json!({ "name": "a\u{0}b" }), Some("nul".into()))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("payload.name contains a NUL"), "{e}");
    for id in ["too-big", "nul"] {
        assert!(w.hooks.event(id).await.is_err(), "{id} was stored");
    }
    w.stop().await;
}

/// A delivery's body was the bare payload: a consumer could not tell an `invoice.paid` from an
/// `invoice.void`. It is the Standard Webhooks envelope `{"type", "timestamp", "data"}` (signed
/// as sent) unless the endpoint asks for `payload = "raw"`; a test event has the same shape.
async fn regression_a_consumer_can_tell_what_it_received(backend: Backend) {
    let sink = HttpSink::start(|_, _| Reply::status(200)).await;
    let w = world(backend, WebhookConfig::default()).await;
    let (enveloped, secret) = w.endpoint(sink.url("/envelope")).await;
    assert_eq!(enveloped.payload, onus_webhooks::PayloadFormat::Envelope);
    let (raw, raw_secret) = w
        .hooks
        .create_endpoint(NewEndpoint {
            url: sink.url("/raw"),
            payload: onus_webhooks::PayloadFormat::Raw,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(raw.payload, onus_webhooks::PayloadFormat::Raw);
    let ev = w
        .hooks
        .publish("invoice.void", json!({"invoice": 8}), None)
        .await
        .unwrap();
    wait_until("both delivered", Duration::from_secs(20), || async {
        sink.count() == 2
    })
    .await;
    let body = |path: &str| {
        let r = sink
            .received()
            .into_iter()
            .find(|r| r.path_only() == path)
            .unwrap();
        (
            serde_json::from_slice::<serde_json::Value>(&r.body).unwrap(),
            r,
        )
    };
    let (b, r) = body("/envelope");
    assert_eq!(
        b,
        json!({
            "type": "invoice.void",
            "timestamp": ev.created_at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            "data": {"invoice": 8}
        })
    );
    assert_eq!(
        verify(&secret, &r),
        Ok(()),
        "the signature covers the envelope"
    );
    let (b, r) = body("/raw");
    assert_eq!(b, json!({"invoice": 8}));
    assert_eq!(verify(&raw_secret, &r), Ok(()));
    // A test event is an event like any other: enveloped, its type webhook.test.
    w.hooks.send_test(enveloped.id.as_str()).await.unwrap();
    wait_until("the test delivered", Duration::from_secs(20), || async {
        sink.count() == 3
    })
    .await;
    let test = sink.received().pop().unwrap();
    let b: serde_json::Value = serde_json::from_slice(&test.body).unwrap();
    assert_eq!(b["type"], json!(onus_webhooks::TEST_EVENT), "{b}");
    assert_eq!(
        b["data"]["endpoint_id"],
        json!(enveloped.id.as_str()),
        "{b}"
    );
    // The format can be changed.
    let up = w
        .hooks
        .update_endpoint(
            raw.id.as_str(),
            onus_webhooks::EndpointUpdate {
                payload: Some(onus_webhooks::PayloadFormat::Envelope),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(up.payload, onus_webhooks::PayloadFormat::Envelope);
    w.stop().await;
}

async fn fails_twice_then_delivers_with_one_id_and_fresh_signatures(backend: Backend) {
    let sink = HttpSink::start(|_, n| {
        if n <= 2 {
            Reply::status(500)
        } else {
            Reply::status(200)
        }
    })
    .await;
    let w = world(backend, WebhookConfig::default()).await;
    let (ep, secret) = w.endpoint(sink.url("/hook")).await;
    assert!(secret.starts_with("whsec_"));
    let ev = w
        .hooks
        .publish("invoice.paid", json!({"invoice": 7}), None)
        .await
        .unwrap();
    for attempt in 1..=2 {
        let j = w
            .wait_delivery(&ev.id, "failed", |j| {
                j.state == JobState::Retryable && j.attempt == attempt
            })
            .await;
        w.clock.advance_to(j.run_at);
    }
    let j = w
        .wait_delivery(&ev.id, "delivered", |j| j.state == JobState::Completed)
        .await;
    assert_eq!(j.attempt, 3);
    let got = sink.received();
    assert_eq!(got.len(), 3);
    let stamps: Vec<&str> = got
        .iter()
        .map(|r| r.header("webhook-timestamp").unwrap())
        .collect();
    assert!(
        stamps[0] < stamps[1] && stamps[1] < stamps[2],
        "a fresh timestamp on every attempt: {stamps:?}"
    );
    for r in &got {
        assert_eq!(
            r.header("webhook-id"),
            Some(ev.id.as_str()),
            "the same webhook-id on every attempt"
        );
        assert_eq!(verify(&secret, r), Ok(()));
        // The Standard Webhooks envelope: the type, the event's time, the payload as data.
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&r.body).unwrap(),
            json!({
                "type": "invoice.paid",
                "timestamp": ev.created_at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
                "data": {"invoice": 7}
            })
        );
        assert_eq!(r.method, "POST");
    }
    let attempts = w.hooks.attempts(&ev.id).await.unwrap();
    assert_eq!(
        attempts.iter().map(|a| a.status).collect::<Vec<_>>(),
        vec![Some(500), Some(500), Some(200)]
    );
    assert_eq!(attempts[2].outcome, onus_webhooks::AttemptOutcome::Success);
    assert_eq!(
        w.hooks.endpoint(&ep.id).await.unwrap().failing_since,
        None,
        "one success clears it"
    );
    w.stop().await;
}

async fn retry_after_snoozes_without_spending_an_attempt(backend: Backend) {
    let sink = HttpSink::start(|_, n| {
        if n == 1 {
            Reply::status(429).header("retry-after", "2")
        } else {
            Reply::status(200)
        }
    })
    .await;
    let w = world(backend, WebhookConfig::default()).await;
    w.endpoint(sink.url("/hook")).await;
    let ev = w
        .hooks
        .publish("user.created", json!({}), None)
        .await
        .unwrap();
    let j = w
        .wait_delivery(&ev.id, "snoozed", |j| j.state == JobState::Snoozed)
        .await;
    assert_eq!((j.attempt, j.snoozes), (0, 1), "no attempt spent");
    assert_eq!(j.run_at, w.clock.now() + chrono::TimeDelta::seconds(2));
    w.clock.advance(Duration::from_secs(2));
    let j = w
        .wait_delivery(&ev.id, "delivered", |j| j.state == JobState::Completed)
        .await;
    assert_eq!(j.attempt, 1);
    let got = sink.received();
    let t: Vec<i64> = got
        .iter()
        .map(|r| r.header("webhook-timestamp").unwrap().parse().unwrap())
        .collect();
    assert_eq!(t[1] - t[0], 2, "sent again 2 s later");
    w.stop().await;
}

/// The endpoint's limit is its own, not one delivery's: its other deliveries wait with the one
/// that was told, held (no request, no attempt, no snooze of their own) until the time it named.
async fn a_429_with_retry_after_holds_the_endpoints_other_deliveries(backend: Backend) {
    let sink = HttpSink::start(|_, n| {
        if n == 1 {
            Reply::status(429).header("retry-after", "60")
        } else {
            Reply::status(200)
        }
    })
    .await;
    // No cooldown for the endpoint the 429 marks failing: its new deliveries are due at once,
    // so only the pause keeps them from being sent.
    let cfg = WebhookConfig {
        cooldown: Duration::ZERO,
        ..WebhookConfig::default()
    };
    let w = world(backend, cfg).await;
    let (ep, _) = w.endpoint(sink.url("/hook")).await;
    let first = w
        .hooks
        .publish("order.paid", json!({"n": 0}), None)
        .await
        .unwrap();
    let until = w.clock.now() + chrono::TimeDelta::seconds(60);
    let j = w
        .wait_delivery(&first.id, "snoozed", |j| j.state == JobState::Snoozed)
        .await;
    assert_eq!((j.attempt, j.snoozes, j.run_at), (0, 1, until));
    let mut later = Vec::new();
    for n in 1..=5 {
        later.push(
            w.hooks
                .publish("order.paid", json!({"n": n}), None)
                .await
                .unwrap(),
        );
    }
    for ev in &later {
        let j = w
            .wait_delivery(&ev.id, "held", |j| {
                j.state == JobState::Scheduled && j.run_at == until
            })
            .await;
        assert_eq!((j.attempt, j.snoozes, j.errors.len()), (0, 0, 0), "{j:?}");
    }
    assert_eq!(
        sink.count(),
        1,
        "nothing more was sent to the limited endpoint"
    );
    let paused = w.client.paused_keys().await.unwrap();
    assert_eq!(paused.len(), 1);
    assert_eq!(paused[0].key, onus_webhooks::lease_key(&ep.id));
    assert_eq!(paused[0].held, 5);
    w.clock.advance(Duration::from_secs(60));
    for ev in later.iter().chain([&first]) {
        let j = w
            .wait_delivery(&ev.id, "delivered", |j| j.state == JobState::Completed)
            .await;
        assert_eq!(j.attempt, 1);
    }
    assert_eq!(sink.count(), 7);
    w.stop().await;
}

async fn gone_disables_the_endpoint_at_once(backend: Backend) {
    let sink = HttpSink::start(|_, _| Reply::status(410)).await;
    let w = world(backend, WebhookConfig::default()).await;
    let (ep, _) = w.endpoint(sink.url("/hook")).await;
    let ev = w
        .hooks
        .publish("order.shipped", json!({}), None)
        .await
        .unwrap();
    let j = w
        .wait_delivery(&ev.id, "discarded", |j| j.state == JobState::Discarded)
        .await;
    assert_eq!(
        (j.attempt, j.discard_reason),
        (1, Some(DiscardReason::Permanent))
    );
    let ep = w.hooks.endpoint(&ep.id).await.unwrap();
    assert!(!ep.enabled);
    assert!(ep.disabled_reason.unwrap().contains("410"));
    let ev2 = w
        .hooks
        .publish("order.shipped", json!({}), None)
        .await
        .unwrap();
    w.wait_fanned_out(&ev2.id).await;
    assert!(
        w.deliveries(&ev2.id).await.is_empty(),
        "a disabled endpoint gets no deliveries"
    );
    assert_eq!(sink.count(), 1, "no further request");
    w.stop().await;
}

async fn an_always_failing_endpoint_gets_exactly_the_policys_requests(backend: Backend) {
    let sink = HttpSink::start(|_, _| Reply::status(503)).await;
    // Auto-disable is tested on its own below; here only the retry count matters.
    let w = world(
        backend,
        WebhookConfig {
            disable_after: Duration::from_secs(30 * 86_400),
            ..Default::default()
        },
    )
    .await;
    w.endpoint(sink.url("/hook")).await;
    let ev = w
        .hooks
        .publish("invoice.paid", json!({}), None)
        .await
        .unwrap();
    for attempt in 1..=18u32 {
        let j = w
            .wait_delivery(&ev.id, "attempt recorded", |j| {
                j.attempt == attempt && matches!(j.state, JobState::Retryable | JobState::Discarded)
            })
            .await;
        assert_eq!(sink.count(), attempt as usize, "one request per attempt");
        if j.state == JobState::Retryable {
            w.clock.advance_to(j.run_at);
        }
    }
    let j = w.deliveries(&ev.id).await.remove(0);
    assert_eq!(
        (j.state, j.discard_reason),
        (JobState::Discarded, Some(DiscardReason::Exhausted))
    );
    let span = j.finalized_at.unwrap() - j.created_at;
    assert!(
        (span.num_hours() as f64 / 24.0 - 5.3).abs() < 0.6,
        "about 5.3 days: {span}"
    );
    assert_eq!(sink.count(), 18, "exactly 18 requests for one delivery");
    w.stop().await;
}

async fn a_failing_endpoint_gets_new_deliveries_after_a_cooldown(backend: Backend) {
    let fail = Arc::new(AtomicBool::new(true));
    let f = fail.clone();
    let sink = HttpSink::start(move |_, _| {
        if f.load(Ordering::SeqCst) {
            Reply::status(500)
        } else {
            Reply::status(200)
        }
    })
    .await;
    let w = world(backend, WebhookConfig::default()).await;
    w.endpoint(sink.url("/hook")).await;
    let first = w.hooks.publish("a", json!({}), None).await.unwrap();
    let j = w
        .wait_delivery(&first.id, "failed", |j| j.state == JobState::Retryable)
        .await;
    let second = w.hooks.publish("a", json!({}), None).await.unwrap();
    let d = w
        .wait_delivery(&second.id, "scheduled", |j| j.state == JobState::Scheduled)
        .await;
    assert_eq!(
        d.run_at,
        w.clock.now() + chrono::TimeDelta::minutes(5),
        "cooldown: 5 minutes out"
    );
    fail.store(false, Ordering::SeqCst);
    w.clock.advance_to(j.run_at);
    w.wait_delivery(&first.id, "delivered", |j| j.state == JobState::Completed)
        .await;
    let third = w.hooks.publish("a", json!({}), None).await.unwrap();
    let d = w
        .wait_delivery(&third.id, "delivered", |j| j.state == JobState::Completed)
        .await;
    assert_eq!(
        d.run_at, d.created_at,
        "a healthy endpoint gets deliveries at once"
    );
    w.stop().await;
}

async fn never_two_requests_at_once_to_one_endpoint(backend: Backend) {
    let sink = HttpSink::start(|_, _| Reply::status(200).delay(Duration::from_millis(10))).await;
    let w = world(backend, WebhookConfig::default()).await;
    w.endpoint(sink.url("/hook")).await;
    let mut ids = Vec::new();
    for i in 0..50 {
        ids.push(
            w.hooks
                .publish("tick", json!({"i": i}), None)
                .await
                .unwrap()
                .id,
        );
    }
    for id in &ids {
        w.wait_delivery(id, "delivered", |j| j.state == JobState::Completed)
            .await;
    }
    assert_eq!(sink.count(), 50);
    assert_eq!(
        sink.max_in_flight(),
        1,
        "the sink never saw two concurrent requests"
    );
    w.stop().await;
}

async fn five_days_of_failure_disable_and_a_stale_failure_does_not(backend: Backend) {
    let sink = HttpSink::start(|_, _| Reply::status(500)).await;
    let w = world(backend, WebhookConfig::default()).await;
    // A stale failure, then one six days later: a new run of failures, no disable.
    let (stale, _) = w.endpoint(sink.url("/stale")).await;
    let ev = w.hooks.publish("x", json!({}), None).await.unwrap();
    let j = w
        .wait_delivery(&ev.id, "failed", |j| j.state == JobState::Retryable)
        .await;
    w.client.cancel(j.id).await.unwrap();
    w.clock.advance(Duration::from_secs(6 * 86_400));
    let ev2 = w.hooks.publish("x", json!({}), None).await.unwrap();
    let d = w
        .wait_delivery(&ev2.id, "cooled down", |j| j.state == JobState::Scheduled)
        .await;
    w.clock.advance_to(d.run_at);
    w.wait_delivery(&ev2.id, "failed again", |j| j.state == JobState::Retryable)
        .await;
    let ep = w.hooks.endpoint(&stale.id).await.unwrap();
    assert!(ep.enabled, "one stale failure cannot disable an endpoint");
    assert_eq!(
        ep.failing_since,
        Some(w.clock.now()),
        "a new run of failures starts"
    );
    w.hooks.delete_endpoint(&stale.id).await.unwrap();

    // Failing continuously for five days: disabled, and its pending deliveries discarded.
    let (ep, _) = w.endpoint(sink.url("/down")).await;
    let ev = w.hooks.publish("y", json!({}), None).await.unwrap();
    let mut pending = None;
    loop {
        let j = w
            .wait_delivery(&ev.id, "attempted", |j| {
                j.state != JobState::Running && j.attempt > 0
            })
            .await;
        if j.state == JobState::Discarded {
            assert!(
                j.errors.last().unwrap().message.contains("disabled"),
                "{:?}",
                j.errors.last()
            );
            break;
        }
        if pending.is_none() {
            pending = Some(w.hooks.publish("y", json!({}), None).await.unwrap().id);
            w.wait_delivery(pending.as_ref().unwrap(), "cooling", |j| {
                j.state == JobState::Scheduled
            })
            .await;
        }
        w.clock.advance_to(j.run_at);
    }
    let e = w.hooks.endpoint(&ep.id).await.unwrap();
    assert!(
        !e.enabled
            && e.disabled_reason
                .as_deref()
                .unwrap()
                .contains("failing continuously"),
        "{e:?}"
    );
    let since = e.failing_since.unwrap();
    assert!(w.clock.now() - since >= chrono::TimeDelta::days(5));
    let p = w
        .wait_delivery(pending.as_ref().unwrap(), "discarded", |j| {
            j.state == JobState::Discarded
        })
        .await;
    assert!(p.errors.last().unwrap().message.contains("disabled"));
    w.stop().await;
}

async fn redeliver_after_the_fix_delivers_every_discarded_event(backend: Backend) {
    let fixed = Arc::new(AtomicBool::new(false));
    let f = fixed.clone();
    let sink = HttpSink::start(move |_, _| {
        if f.load(Ordering::SeqCst) {
            Reply::status(200)
        } else {
            Reply::status(400)
        }
    })
    .await;
    let w = world(backend, WebhookConfig::default()).await;
    let (ep, _) = w.endpoint(sink.url("/hook")).await;
    let mut ids = Vec::new();
    for i in 0..3 {
        let id = w
            .hooks
            .publish("z", json!({"i": i}), None)
            .await
            .unwrap()
            .id;
        loop {
            // After the first failure the endpoint is failing: later deliveries cool down first.
            let j = w
                .wait_delivery(&id, "discarded or cooling", |j| {
                    matches!(j.state, JobState::Discarded | JobState::Scheduled)
                })
                .await;
            if j.state == JobState::Discarded {
                break;
            }
            w.clock.advance_to(j.run_at);
        }
        ids.push(id);
    }
    fixed.store(true, Ordering::SeqCst);
    let retried = w.hooks.redeliver(&ep.id).await.unwrap();
    assert_eq!(retried.len(), 3);
    for id in &ids {
        let j = w
            .wait_delivery(id, "delivered", |j| j.state == JobState::Completed)
            .await;
        assert_eq!(j.attempt, 2, "one more attempt each");
    }
    assert_eq!(sink.count(), 6);
    w.stop().await;
}

/// A literal address the guard always refuses is refused when the endpoint is registered (or
/// its URL changed), naming the setting that would allow it; a name that resolves to one is
/// refused at delivery without a connection, and that refusal starts no failure cooldown.
async fn regression_a_refused_address_is_refused_at_registration_and_starts_no_cooldown(
    backend: Backend,
) {
    let v4 = ConnCounter::start("127.0.0.2:0").await.unwrap();
    let port = v4.addr().port();
    let v6 = ConnCounter::start(&format!("[::1]:{port}")).await;
    let w = world(backend, WebhookConfig::default()).await;
    for host in [
        "127.0.0.2",
        "[::1]",
        "2130706434",
        "0x7f000002",
        "169.254.169.254",
    ] {
        let e = w
            .hooks
            .create_endpoint(NewEndpoint {
                url: format!("http://{host}:{port}/hook"),
                ..Default::default()
            })
            .await
            .unwrap_err();
        let m = e.to_string();
        assert!(
            matches!(e, onus_webhooks::Error::Invalid(_))
                && m.contains("refused")
                && m.contains("[webhooks] allow_networks"),
            "{host}: {m}"
        );
    }
    assert!(w.hooks.endpoints().await.unwrap().is_empty());
    // A name is checked when resolved, at each delivery.
    let (ep, _) = w.endpoint(format!("http://localhost:{port}/hook")).await;
    let moved = w
        .hooks
        .update_endpoint(
            ep.id.as_str(),
            onus_webhooks::EndpointUpdate {
                url: Some(format!("http://127.0.0.2:{port}/hook")),
                ..Default::default()
            },
        )
        .await;
    assert!(
        moved.is_err(),
        "a change to a refused address is refused too"
    );
    let ev = w
        .hooks
        .publish("secret.leak", json!({}), None)
        .await
        .unwrap();
    let j = w
        .wait_delivery(&ev.id, "discarded", |j| j.state == JobState::Discarded)
        .await;
    assert_eq!(j.attempt, 1);
    assert!(
        j.errors[0].message.contains("refused to connect"),
        "{:?}",
        j.errors
    );
    let after = w.hooks.endpoint(ep.id.as_str()).await.unwrap();
    assert_eq!(
        (after.failing_since, after.last_failure_at),
        (None, None),
        "a guard refusal is not the endpoint failing: no cooldown"
    );
    assert_eq!(
        v4.settled_count().await,
        0,
        "no connection reached 127.0.0.2"
    );
    if let Some(v6) = v6 {
        assert_eq!(v6.settled_count().await, 0, "no connection reached ::1");
    }
    w.stop().await;
}

async fn publish_commits_with_the_callers_transaction_or_not_at_all(backend: Backend) {
    let sink = HttpSink::start(|_, _| Reply::status(200)).await;
    let w = world(backend, WebhookConfig::default()).await;
    w.endpoint(sink.url("/hook")).await;
    let (rolled_back, committed) = if backend == Backend::Sqlite {
        use onus::sqlite::rusqlite::Connection;
        let mut conn = Connection::open(w.url.trim_start_matches("sqlite://")).unwrap();
        conn.busy_timeout(Duration::from_secs(10)).unwrap();
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)", ())
            .unwrap();
        let tx = conn.transaction().unwrap();
        tx.execute("INSERT INTO orders (id) VALUES (1)", ())
            .unwrap();
        let a = w
            .hooks
            .publish_in(
                &onus::sql::SqliteTx::new(&tx),
                "order.created",
                json!({"id": 1}),
                None,
            )
            .await
            .unwrap();
        tx.rollback().unwrap();
        let tx = conn.transaction().unwrap();
        tx.execute("INSERT INTO orders (id) VALUES (2)", ())
            .unwrap();
        let b = w
            .hooks
            .publish_in(
                &onus::sql::SqliteTx::new(&tx),
                "order.created",
                json!({"id": 2}),
                None,
            )
            .await
            .unwrap();
        tx.commit().unwrap();
        w.client.notify_inserted("default");
        (a, b)
    } else {
        let (mut db, conn) = tokio_postgres::connect(&w.url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        db.batch_execute("CREATE TABLE orders (id bigint PRIMARY KEY)")
            .await
            .unwrap();
        let tx = db.transaction().await.unwrap();
        tx.execute("INSERT INTO orders VALUES (1)", &[])
            .await
            .unwrap();
        let a = w
            .hooks
            .publish_in(
                &onus::sql::PgTx::new(&tx),
                "order.created",
                json!({"id": 1}),
                None,
            )
            .await
            .unwrap();
        tx.rollback().await.unwrap();
        let tx = db.transaction().await.unwrap();
        tx.execute("INSERT INTO orders VALUES (2)", &[])
            .await
            .unwrap();
        let b = w
            .hooks
            .publish_in(
                &onus::sql::PgTx::new(&tx),
                "order.created",
                json!({"id": 2}),
                None,
            )
            .await
            .unwrap();
        tx.commit().await.unwrap();
        (a, b)
    };
    w.wait_delivery(&committed, "delivered", |j| j.state == JobState::Completed)
        .await;
    assert!(
        w.hooks.event(&rolled_back).await.is_err(),
        "a rolled-back event never exists"
    );
    assert!(w.deliveries(&rolled_back).await.is_empty());
    let fanouts = w
        .store
        .list(
            &JobFilter {
                kinds: vec![onus_webhooks::FANOUT.into()],
                ..Default::default()
            },
            100,
            None,
        )
        .await
        .unwrap();
    assert!(
        fanouts.is_empty(),
        "an event for one endpoint fans out in its publish's transaction, without a job: {fanouts:?}"
    );
    assert_eq!(sink.count(), 1);
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&sink.received()[0].body).unwrap()["data"],
        json!({"id": 2})
    );
    w.stop().await;
}

async fn a_rotated_secret_signs_alongside_the_previous_one(backend: Backend) {
    let sink = HttpSink::start(|_, _| Reply::status(200)).await;
    let w = world(backend, WebhookConfig::default()).await;
    let (ep, old) = w.endpoint(sink.url("/hook")).await;
    let new = w.hooks.rotate_secret(&ep.id, None).await.unwrap();
    assert_ne!(old, new);
    let ev = w.hooks.publish("k", json!({}), None).await.unwrap();
    w.wait_delivery(&ev.id, "delivered", |j| j.state == JobState::Completed)
        .await;
    let r = &sink.received()[0];
    assert_eq!(r.header("webhook-signature").unwrap().split(' ').count(), 2);
    assert_eq!(
        verify(&old, r),
        Ok(()),
        "consumers still on the old secret verify"
    );
    assert_eq!(
        verify(&new, r),
        Ok(()),
        "consumers on the new secret verify"
    );
    w.stop().await;
}

async fn busy_until_shows_the_delivery_in_flight(backend: Backend) {
    let sink = HttpSink::start(|_, _| Reply::status(200).delay(Duration::from_millis(400))).await;
    let w = world(backend, WebhookConfig::default()).await;
    let (ep, _) = w.endpoint(sink.url("/hook")).await;
    assert_eq!(ep.busy_until, None);
    let ev = w.hooks.publish("k", json!({}), None).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while sink.count() == 0 {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let busy = w.hooks.endpoint(&ep.id).await.unwrap().busy_until;
    assert!(busy.is_some_and(|t| t > w.clock.now()), "{busy:?}");
    w.wait_delivery(&ev.id, "delivered", |j| j.state == JobState::Completed)
        .await;
    assert_eq!(
        w.hooks.endpoint(&ep.id).await.unwrap().busy_until,
        None,
        "released"
    );
    w.stop().await;
}

async fn old_events_are_pruned_and_their_deliveries_discarded(backend: Backend) {
    let sink = HttpSink::start(|_, _| Reply::status(500)).await;
    let w = world(backend, WebhookConfig::default()).await;
    w.endpoint(sink.url("/hook")).await;
    let ev = w.hooks.publish("old", json!({}), None).await.unwrap();
    let j = w
        .wait_delivery(&ev.id, "failed", |j| j.state == JobState::Retryable)
        .await;
    assert_eq!(w.hooks.attempts(&ev.id).await.unwrap().len(), 1);
    // The hourly prune is registered; pruning as of a month on removes the event and attempts.
    let schedules = w.store.list_periodic().await.unwrap();
    assert!(
        schedules
            .iter()
            .any(|p| p.name == onus_webhooks::PRUNE && p.schedule == "every: 1h"),
        "{schedules:?}"
    );
    assert_eq!(
        w.hooks
            .prune(w.clock.now() + chrono::TimeDelta::days(31))
            .await
            .unwrap(),
        1
    );
    assert!(w.hooks.event(&ev.id).await.is_err());
    assert!(w.hooks.attempts(&ev.id).await.unwrap().is_empty());
    // Its pending delivery finds the event gone and is discarded, sending nothing.
    w.clock.advance_to(j.run_at);
    let d = w
        .wait_delivery(&ev.id, "discarded", |j| j.state == JobState::Discarded)
        .await;
    assert!(
        d.errors.last().unwrap().message.contains("pruned"),
        "{:?}",
        d.errors
    );
    assert_eq!(sink.count(), 1);
    w.stop().await;
}

async fn endless_retry_after_spends_attempts_after_five_snoozes(backend: Backend) {
    let sink = HttpSink::start(|_, _| Reply::status(429).header("retry-after", "0")).await;
    let w = world(backend, WebhookConfig::default()).await;
    w.endpoint(sink.url("/hook")).await;
    let ev = w.hooks.publish("x", json!({}), None).await.unwrap();
    for n in 1..=5u32 {
        let j = w
            .wait_delivery(&ev.id, "snoozed", |j| {
                j.state == JobState::Snoozed && j.snoozes == n
            })
            .await;
        assert_eq!(j.attempt, 0);
        assert_eq!(
            j.run_at,
            w.clock.now() + chrono::TimeDelta::seconds(1),
            "at least a second, whatever Retry-After says"
        );
        w.clock.advance_to(j.run_at);
    }
    let j = w
        .wait_delivery(&ev.id, "failed", |j| j.state == JobState::Retryable)
        .await;
    assert_eq!(
        (j.attempt, j.snoozes),
        (1, 5),
        "the sixth 429 in a row spends an attempt"
    );
    assert!(j.errors.last().unwrap().message.contains("in a row"));
    assert_eq!(sink.count(), 6);
    w.stop().await;
}

async fn a_fanout_that_runs_again_delivers_nothing_twice(backend: Backend) {
    let sink = HttpSink::start(|_, _| Reply::status(200)).await;
    let w = world(backend, WebhookConfig::default()).await;
    w.endpoint(sink.url("/hook")).await;
    let ev = w.hooks.publish("x", json!({}), None).await.unwrap();
    w.wait_delivery(&ev.id, "delivered", |j| j.state == JobState::Completed)
        .await;
    // The fan-out runs again after its deliveries finished (its worker was lost after the commit).
    let again = w
        .client
        .insert(onus::NewJob::new(
            onus_webhooks::FANOUT,
            json!({"event_id": ev.id}),
        ))
        .await
        .unwrap();
    assert!(again.inserted);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while w.store.get(again.job.id).await.unwrap().unwrap().state != JobState::Completed {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(
        w.deliveries(&ev.id).await.len(),
        1,
        "no second delivery job"
    );
    // Publishing the same id again delivers nothing either.
    let same = w
        .hooks
        .publish("x", json!({}), Some(ev.id.to_string()))
        .await
        .unwrap();
    assert_eq!(same.id, ev.id);
    assert_eq!(sink.count(), 1);
    w.stop().await;
}

async fn a_connection_failure_is_recorded_as_an_attempt(backend: Backend) {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let w = world(backend, WebhookConfig::default()).await;
    w.endpoint(format!("http://127.0.0.1:{closed}/hook")).await;
    let ev = w.hooks.publish("x", json!({}), None).await.unwrap();
    w.wait_delivery(&ev.id, "failed", |j| j.state == JobState::Retryable)
        .await;
    let a = w.hooks.attempts(&ev.id).await.unwrap();
    assert_eq!(a.len(), 1);
    assert_eq!((a[0].status, a[0].outcome.as_str()), (None, "retryable"));
    assert!(
        a[0].error.as_deref().unwrap_or("").contains("connect"),
        "{:?}",
        a[0].error
    );
    w.stop().await;
}

/// An event for a few endpoints, up to 64, gets its deliveries in its publish's transaction; one
/// for more gets them from a fan-out job, every endpoint once.
async fn an_event_for_many_endpoints_fans_out_in_a_job_and_one_for_few_at_its_publish(
    backend: Backend,
) {
    let sink = HttpSink::start(|_, _| Reply::status(200)).await;
    let w = world(backend, WebhookConfig::default()).await;
    w.endpoint(sink.url("/hook")).await;
    let fanouts = |event: String| {
        let w = &w;
        async move {
            let f = JobFilter {
                kinds: vec![onus_webhooks::FANOUT.into()],
                ..Default::default()
            };
            let all = w.store.list(&f, 1000, None).await.unwrap();
            all.into_iter()
                .filter(|j| j.args["event_id"] == event.as_str())
                .count()
        }
    };
    let few = w.hooks.publish("x", json!({}), None).await.unwrap();
    assert_eq!(
        w.deliveries(&few.id).await.len(),
        1,
        "written with the publish, before any job ran"
    );
    assert_eq!(fanouts(few.id.to_string()).await, 0);
    for _ in 0..63 {
        w.endpoint(sink.url("/hook")).await;
    }
    // 64 endpoints: still written by the publish.
    let most = w.hooks.publish("x", json!({}), None).await.unwrap();
    assert_eq!(w.deliveries(&most.id).await.len(), 64);
    assert_eq!(fanouts(most.id.to_string()).await, 0);
    w.endpoint(sink.url("/hook")).await;
    let many = w.hooks.publish("x", json!({}), None).await.unwrap();
    assert_eq!(fanouts(many.id.to_string()).await, 1);
    w.wait_fanned_out(&many.id).await;
    let d = w.deliveries(&many.id).await;
    let mut endpoints: Vec<&str> = d
        .iter()
        .map(|j| j.args["endpoint_id"].as_str().unwrap())
        .collect();
    endpoints.sort_unstable();
    endpoints.dedup();
    assert_eq!((d.len(), endpoints.len()), (65, 65), "every endpoint once");
    w.stop().await;
}

/// Publishes sent together share commits (`Db::tx_shared`): every one is stored with its
/// deliveries; one that reuses another's id with a different payload is refused alone, and so is
/// one whose row the database refuses inside the shared transaction (the others are written).
async fn concurrent_publishes_share_commits_and_a_conflicting_one_fails_alone(backend: Backend) {
    static POISON: onus::sql::Sql = onus::sql::Sql::per_backend(
        "onus_events",
        "CREATE TRIGGER poisoned_event BEFORE INSERT ON onus_events WHEN NEW.type = 'poison'
         BEGIN SELECT RAISE(ABORT, 'poisoned event'); END",
        "ALTER TABLE onus_events ADD CONSTRAINT poisoned_event CHECK (type <> 'poison')",
    );
    let sink = HttpSink::start(|_, _| Reply::status(200)).await;
    let w = world(backend, WebhookConfig::default()).await;
    onus::store::Db::new(w.store.clone())
        .execute(&POISON, vec![])
        .await
        .unwrap();
    let (ep, _) = w.endpoint(sink.url("/hook")).await;
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..26 {
        let hooks = w.hooks.clone();
        // The 25th reuses the id of the sixth with another payload; the 26th is refused.
        let (id, n) = if i == 24 { (5, 99) } else { (i, i) };
        calls.spawn(async move {
            let kind = if i == 25 { "poison" } else { "x" };
            let r = hooks
                .publish(kind, json!({ "n": n }), Some(format!("e-{id}")))
                .await;
            (i, r)
        });
    }
    let mut refused = Vec::new();
    while let Some(call) = calls.join_next().await {
        let (i, r) = call.unwrap();
        match r {
            Ok(e) => assert_eq!(
                e.id.to_string(),
                format!("e-{}", if i == 24 { 5 } else { i })
            ),
            Err(onus_webhooks::Error::Conflict(msg)) => refused.push((i, msg)),
            Err(e) => {
                assert_eq!(i, 25, "publish {i}: {e}");
                assert!(e.to_string().contains("poisoned"), "{e}");
            }
        }
    }
    assert!(
        w.hooks.event("e-25").await.is_err(),
        "nothing of the refused publish is stored"
    );
    assert_eq!(
        refused.len(),
        1,
        "only one of the two e-5 fails: {refused:?}"
    );
    assert!(refused[0].0 == 5 || refused[0].0 == 24, "{refused:?}");
    for i in 0..24 {
        let event = format!("e-{i}");
        let d = w.deliveries(&event).await;
        assert_eq!(d.len(), 1, "{event} has its delivery");
        assert_eq!(d[0].args["endpoint_id"], ep.id.to_string());
        let stored = w.hooks.event(&event).await.unwrap();
        if i != 5 {
            assert_eq!(stored.payload, json!({ "n": i }));
        }
    }
    w.stop().await;
}
