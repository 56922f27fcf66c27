//! Regressions of the third correctness round, reproduced from outside through the API as a new
//! user met them: each fails without its fix.

use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::{api_with, World, CONFIG};

async fn insert(w: &World, body: Value) -> i64 {
    let (s, j) = w.post("/api/v1/jobs", body).await;
    assert_eq!(s, 201, "{j}");
    j["id"].as_i64().unwrap()
}

async fn claim(w: &World, queue: &str, kinds: &[&str], limit: usize, wait: u64) -> (u16, Value) {
    w.post(
        &format!("/api/v1/queues/{queue}/claim"),
        json!({"kinds": kinds, "limit": limit, "wait": wait}),
    )
    .await
}

/// `[kinds."flaky"] retry_budget = { ratio = 0.2, window = ... }` with no `min_per_window`: a
/// pulled job that failed once was never handed out again (deferred one window after another).
/// It is retried within two windows and ends, exhausted.
pub async fn regression_a_budget_without_a_minimum_retries_a_lone_pulled_job(w: World) {
    let backend = w.backend;
    drop(w);
    let w = api_with(
        backend,
        &format!(
            r#"{CONFIG}
[kinds."flaky"]
retry_budget = {{ ratio = 0.2, window = "2s" }}
[kinds."flaky".policy]
max_attempts = 3
backoff = {{ schedule = ["1s"] }}
jitter = 0.0
"#
        ),
    )
    .await;
    let id = insert(&w, json!({"kind": "flaky"})).await;
    let started = tokio::time::Instant::now();
    let mut attempts = 0;
    while attempts < 3 {
        let (s, c) = claim(&w, "default", &["flaky"], 1, 5).await;
        assert_eq!(s, 200, "{c}");
        let Some(job) = c["jobs"].as_array().unwrap().first().cloned() else {
            let (_, j) = w.get(&format!("/api/v1/jobs/{id}")).await;
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the retry never came: {j}"
            );
            continue;
        };
        attempts += 1;
        assert_eq!(job["attempt"], json!(attempts), "{job}");
        let (s, _) = w
            .post(
                &format!("/api/v1/jobs/{id}/fail"),
                json!({"lease_token": job["lease_token"], "message": "downstream is down"}),
            )
            .await;
        assert_eq!(s, 200);
    }
    let (_, j) = w.get(&format!("/api/v1/jobs/{id}")).await;
    assert_eq!(
        (&j["state"], &j["discard_reason"]),
        (&json!("discarded"), &json!("exhausted")),
        "{j}"
    );
}

/// `[kinds."urgent"] max_running = 5` beside an uncapped `bulk` kind in the same queue: four
/// claims of one job each returned bulk, bulk, bulk, then the urgent job of priority -100.
pub async fn regression_a_capped_kind_is_claimed_in_priority_order(w: World) {
    let backend = w.backend;
    drop(w);
    let w = api_with(
        backend,
        &format!("{CONFIG}\n[kinds.\"urgent\"]\nmax_running = 5\n[kinds.\"bulk\"]\n"),
    )
    .await;
    for _ in 0..3 {
        insert(&w, json!({"kind": "bulk"})).await;
    }
    insert(&w, json!({"kind": "urgent", "priority": -100})).await;
    let mut order = Vec::new();
    for _ in 0..4 {
        let (s, c) = claim(&w, "default", &["bulk", "urgent"], 1, 0).await;
        assert_eq!(s, 200, "{c}");
        order.push(c["jobs"][0]["kind"].as_str().unwrap().to_string());
    }
    assert_eq!(order, ["urgent", "bulk", "bulk", "bulk"]);
}

/// `POST /keys/k1/pause {"seconds": 0.0005}` answered 500 (after holding the key's jobs): the
/// answer was a second read, which missed a pause already over. A pause under a second is a 422
/// naming `seconds` that changes nothing; the answer is the pause as written.
pub async fn regression_a_short_key_pause_is_refused_naming_seconds(w: World) {
    let backend = w.backend;
    drop(w);
    let w = api_with(
        backend,
        &format!("{CONFIG}\n[kinds.\"sync\"]\nlease_key = \"k{{n}}\"\n"),
    )
    .await;
    let id = insert(&w, json!({"kind": "sync", "args": {"n": 1}})).await;
    for seconds in [0.0005, 0.005, 0.0001, 0.5] {
        let (s, e) = w
            .post("/api/v1/keys/k1/pause", json!({"seconds": seconds}))
            .await;
        assert_eq!(s, 422, "{seconds}: {e}");
        assert!(
            e["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with("seconds:"),
            "{e}"
        );
    }
    let soon = (chrono::Utc::now() + chrono::TimeDelta::milliseconds(100)).to_rfc3339();
    let (s, e) = w
        .post("/api/v1/keys/k1/pause", json!({"until": soon}))
        .await;
    assert_eq!(s, 422, "{e}");
    assert!(e.to_string().contains("until:"), "{e}");
    // Nothing was held by the refused pauses.
    let (_, j) = w.get(&format!("/api/v1/jobs/{id}")).await;
    assert_eq!(j["state"], json!("available"), "{j}");
    let (_, keys) = w.get("/api/v1/keys").await;
    assert_eq!(keys["keys"], json!([]));
    // A second is enough, and the answer is what was written.
    let (s, p) = w
        .post(
            "/api/v1/keys/k1/pause",
            json!({"seconds": 1, "reason": "brief"}),
        )
        .await;
    assert_eq!(s, 200, "{p}");
    assert_eq!(
        (&p["key"], &p["held"], &p["reason"]),
        (&json!("k1"), &json!(1), &json!("brief"))
    );
}
