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

/// `POST /jobs` took the server's own kinds: a caller could insert a `webhook.deliver` that
/// sends one tenant's event to another tenant's endpoint. They are refused, saying what to call.
pub async fn regression_post_jobs_refuses_the_servers_own_kinds(w: World) {
    for kind in ["webhook.deliver", "webhook.fanout"] {
        let (s, e) = w
            .post(
                "/api/v1/jobs",
                json!({"kind": kind, "args": {"event_id": "msg_x", "endpoint_id": "ep_y"}}),
            )
            .await;
        assert_eq!(s, 422, "{kind}: {e}");
        let m = e["error"]["message"].as_str().unwrap();
        assert!(
            m.starts_with("kind:") && m.contains("POST /api/v1/events"),
            "{m}"
        );
    }
    let (s, e) = w
        .post("/api/v1/jobs", json!({"kind": "webhook.prune"}))
        .await;
    assert_eq!(s, 422, "{e}");
    assert!(e.to_string().contains("housekeeping"), "{e}");
    let (s, e) = w
        .post(
            "/api/v1/jobs/batch",
            json!({"jobs": [{"kind": crate::harness::ECHO}, {"kind": "webhook.deliver"}]}),
        )
        .await;
    assert_eq!(s, 422, "{e}");
    assert!(e.to_string().contains("jobs[1].kind"), "{e}");
    let (_, list) = w.get("/api/v1/jobs?kind=webhook.deliver").await;
    assert_eq!(list["jobs"], json!([]), "nothing inserted: {list}");
}

/// A pull claim for a kind configured in another queue came back empty for ever; it is a 422
/// naming the kind's queue, unless jobs of the kind were inserted into the queue asked for.
pub async fn regression_a_claim_from_the_wrong_queue_names_the_kinds_queue(w: World) {
    insert(&w, json!({"kind": "report.build"})).await;
    let (s, e) = claim(&w, "default", &["report.build"], 1, 0).await;
    assert_eq!(s, 422, "{e}");
    let m = e["error"]["message"].as_str().unwrap();
    assert!(
        m.contains("\"reports\"") && m.contains("/queues/reports/claim"),
        "{m}"
    );
    let (s, c) = claim(&w, "reports", &["report.build"], 1, 0).await;
    assert_eq!((s, c["jobs"].as_array().unwrap().len()), (200, 1), "{c}");
    // Jobs put in another queue by name are claimed from there.
    let id = insert(&w, json!({"kind": "report.build", "queue": "default"})).await;
    let (s, c) = claim(&w, "default", &["report.build"], 1, 0).await;
    assert_eq!(s, 200, "{c}");
    assert_eq!(c["jobs"][0]["id"], json!(id));
}

/// A pull lease token was the job's `lease_owner` plus the attempt: whoever could read the job
/// could answer for it. The token's secret is not in the job, nor anything it can be made from.
pub async fn regression_a_lease_token_is_not_readable_from_the_job(w: World) {
    let id = insert(&w, json!({"kind": "report.build"})).await;
    let (_, c) = claim(&w, "reports", &["report.build"], 1, 0).await;
    let token = c["jobs"][0]["lease_token"].as_str().unwrap().to_string();
    let (secret, attempt) = token.rsplit_once('.').unwrap();
    let (_, job) = w.get(&format!("/api/v1/jobs/{id}")).await;
    let shown = job.to_string();
    assert!(!shown.contains(secret), "the job shows the token: {shown}");
    let owner = job["lease_owner"].as_str().unwrap();
    assert!(owner.starts_with("pull:"), "{owner}");
    // A token forged from what the job shows is not a lease.
    let forged = format!("{}.{attempt}", owner.trim_start_matches("pull:"));
    let (s, e) = w
        .post(
            &format!("/api/v1/jobs/{id}/complete"),
            json!({"lease_token": forged}),
        )
        .await;
    assert!(s == 409 || s == 422, "{s} {e}");
    assert!(
        !e.to_string().contains(&forged),
        "the refusal echoes no token: {e}"
    );
    let (_, j) = w.get(&format!("/api/v1/jobs/{id}")).await;
    assert_eq!(j["state"], json!("running"));
    // A token of the form handed out before this version is a stale lease (409), not bad input.
    let (s, e) = w
        .post(
            &format!("/api/v1/jobs/{id}/heartbeat"),
            json!({"lease_token": format!("{}.1", "a".repeat(24))}),
        )
        .await;
    assert_eq!(s, 409, "{e}");
    // The real one answers.
    let (s, j) = w
        .post(
            &format!("/api/v1/jobs/{id}/complete"),
            json!({"lease_token": token}),
        )
        .await;
    assert_eq!((s, &j["state"]), (200, &json!("completed")), "{j}");
}
