//! The metrics after a known workload hold the amplification invariant: every outbound request
//! is one attempt or one Retry-After snooze, and no attempt makes more than one. The recorder is
//! one per process, so this binary runs one test, each backend in turn, and reads differences.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

#[path = "api/harness.rs"]
#[allow(dead_code)]
mod harness;

use std::collections::BTreeMap;

use onus_testkit::sink::{HttpSink, Reply};
use onus_testkit::Backend;
use serde_json::json;

/// Every sample of the exposition, by its name and labels as written.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// The sum of the samples of `name` whose labels include every one of `with`.
fn sum(s: &BTreeMap<String, f64>, name: &str, with: &[&str]) -> f64 {
    s.iter()
        .filter(|(k, _)| {
            let (n, labels) = k.split_once('{').unwrap_or((k, ""));
            n == name && with.iter().all(|w| labels.contains(w))
        })
        .map(|(_, v)| v)
        .sum()
}

async fn scrape(w: &harness::World) -> BTreeMap<String, f64> {
    let res = w
        .http
        .get(format!("{}/metrics", w.base))
        .bearer_auth(&w.token)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    samples(&res.text().await.unwrap())
}

async fn workload(backend: Backend) {
    let sink = HttpSink::start(|r, _| match r.path.as_str() {
        "/down" => Reply::status(503),
        _ => Reply::status(200),
    })
    .await;
    let limited = HttpSink::start(|_, n| {
        if n == 1 {
            Reply::status(429).header("retry-after", "1")
        } else {
            Reply::status(200)
        }
    })
    .await;
    let toml = format!(
        "{}\n[kinds.\"webhook.deliver\".policy]\nmax_attempts = 4\nbackoff = {{ schedule = [\"100ms\"] }}\njitter = 0.0\nalert_on_exhaustion = true\n",
        harness::CONFIG
    );
    let w = harness::api_with(backend, &toml).await;
    let (s, _) = w.raw("GET", "/metrics", None, None).await;
    assert_eq!(s, 401, "/metrics needs the token unless metrics_public");
    let before = scrape(&w).await;

    let (_, e) = w
        .post("/api/v1/endpoints", json!({"url": sink.url("/down")}))
        .await;
    w.post(
        "/api/v1/events",
        json!({"type": "t", "payload": {}, "id": "down-1"}),
    )
    .await;
    let (_, j) = w
        .post("/api/v1/jobs", json!({"kind": "http.request", "args": {"method": "GET", "url": limited.url("/limited")}}))
        .await;
    let d = w
        .wait_get("/api/v1/events/down-1/deliveries", |v| {
            v["deliveries"][0]["state"] == "discarded"
        })
        .await;
    assert_eq!(
        d["deliveries"][0]["attempts"].as_array().unwrap().len(),
        4,
        "{d}"
    );
    let job = w
        .wait_job(j["id"].as_i64().unwrap(), |j| j["state"] == "completed")
        .await;
    assert_eq!(
        (&job["attempt"], &job["snoozes"]),
        (&json!(1), &json!(1)),
        "{job}"
    );
    assert_eq!(
        (sink.count(), limited.count()),
        (4, 2),
        "the services saw one request per attempt or snooze"
    );

    let after = scrape(&w).await;
    let delta = |name: &str, with: &[&str]| sum(&after, name, with) - sum(&before, name, with);
    let hooks = ["client=\"webhooks\"", "kind=\"webhook.deliver\""];
    let http = ["client=\"http\"", "kind=\"http.request\""];
    assert_eq!(delta("onus_outbound_requests_total", &hooks), 4.0);
    assert_eq!(
        delta(
            "onus_outbound_attempts_total",
            &[hooks[0], hooks[1], "sent=\"true\""]
        ),
        4.0
    );
    assert_eq!(
        delta("onus_outbound_retry_after_snoozes_total", &hooks),
        0.0
    );
    assert_eq!(delta("onus_outbound_requests_total", &http), 2.0);
    assert_eq!(
        delta(
            "onus_outbound_attempts_total",
            &[http[0], http[1], "sent=\"true\""]
        ),
        1.0
    );
    assert_eq!(delta("onus_outbound_retry_after_snoozes_total", &http), 1.0);
    // The invariant, over every client and kind.
    let requests = delta("onus_outbound_requests_total", &[]);
    let attempts = delta("onus_outbound_attempts_total", &["sent=\"true\""]);
    let snoozes = delta("onus_outbound_retry_after_snoozes_total", &[]);
    assert_eq!(
        requests,
        attempts + snoozes,
        "requests = attempts that sent one + Retry-After snoozes"
    );
    assert_eq!(
        delta("onus_webhook_responses_total", &["class=\"5xx\""]),
        4.0
    );
    let deliver = "kind=\"webhook.deliver\"";
    assert_eq!(
        delta("onus_attempts_total", &[deliver, "outcome=\"retryable\""]),
        3.0
    );
    assert_eq!(
        delta("onus_attempts_total", &[deliver, "outcome=\"discarded\""]),
        1.0
    );
    assert_eq!(delta("onus_snoozes_total", &["kind=\"http.request\""]), 1.0);
    // Four delivery attempts and two of the request (its snooze, then its run); the event
    // fanned out at its publish, without a job.
    assert!(
        delta("onus_pickup_delay_seconds_count", &[]) >= 6.0,
        "every claim is measured"
    );
    assert!(delta("onus_attempt_duration_seconds_count", &[deliver]) >= 4.0);
    // Gauges read at the scrape.
    assert!(
        sum(
            &after,
            "onus_jobs",
            &["state=\"discarded\"", "queue=\"default\""]
        ) >= 1.0
    );
    assert_eq!(
        sum(&after, "onus_webhook_endpoints", &["health=\"failing\""]),
        1.0
    );
    assert_eq!(
        sum(&after, "onus_alerts_open", &[]),
        1.0,
        "the exhausted delivery raised one"
    );
    assert!(after
        .keys()
        .any(|k| k.starts_with("onus_queue_oldest_waiting_seconds{queue=\"default\"}")));
    let _ = e;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_hold_the_amplification_invariant_on_both_backends() {
    workload(Backend::Sqlite).await;
    workload(Backend::Postgres).await;
}
