//! Paused keys through the API: pause, list, resume; a pull worker's snooze that pauses its
//! job's key; lease keys from configuration on a pulled kind.

use serde_json::{json, Value};

use crate::harness::{api_with, World, CONFIG};

async fn claim(w: &World, kinds: &[&str], limit: usize) -> Vec<Value> {
    let (s, c) = w
        .post(
            "/api/v1/queues/default/claim",
            json!({"kinds": kinds, "limit": limit, "wait": 0}),
        )
        .await;
    assert_eq!(s, 200, "{c}");
    c["jobs"].as_array().unwrap().clone()
}

async fn insert(w: &World, kind: &str, args: Value) -> i64 {
    let (s, j) = w
        .post("/api/v1/jobs", json!({"kind": kind, "args": args}))
        .await;
    assert_eq!(s, 201, "{j}");
    j["id"].as_i64().unwrap()
}

fn config() -> String {
    format!(
        r#"{CONFIG}
[kinds."sync.customer"]
lease_key = "customer:{{customer}}"
slots = 1
"#
    )
}

pub async fn a_key_is_paused_listed_and_resumed_through_the_api(w: World) {
    let backend = w.backend;
    drop(w);
    let w = api_with(backend, &config()).await;
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(insert(&w, "sync.customer", json!({"customer": "a/1", "i": i})).await);
    }
    let other = insert(&w, "sync.customer", json!({"customer": "b"})).await;
    // The key is percent-encoded in the path (it holds a '/').
    let (s, p) = w
        .post(
            "/api/v1/keys/customer%3Aa%2F1/pause",
            json!({"seconds": 3600, "reason": "their maintenance window"}),
        )
        .await;
    assert_eq!(s, 200, "{p}");
    assert_eq!(
        (&p["key"], &p["held"], &p["reason"]),
        (
            &json!("customer:a/1"),
            &json!(3),
            &json!("their maintenance window")
        )
    );
    let (s, list) = w.get("/api/v1/keys").await;
    assert_eq!(s, 200);
    assert_eq!(list["keys"].as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list["keys"][0]["until"], p["until"]);
    assert_eq!(
        list["keys"][0]["paused_at"], p["paused_at"],
        "the pause's answer shows the times as stored"
    );
    // Only the other customer's job is handed out; the held ones spent nothing.
    let got = claim(&w, &["sync.customer"], 10).await;
    assert_eq!(
        got.iter()
            .map(|j| j["id"].as_i64().unwrap())
            .collect::<Vec<_>>(),
        vec![other]
    );
    for id in &ids {
        let (_, j) = w.get(&format!("/api/v1/jobs/{id}")).await;
        assert_eq!(
            (&j["state"], &j["attempt"], &j["errors"]),
            (&json!("scheduled"), &json!(0), &json!([])),
            "{j}"
        );
    }
    // Bad pauses say what to fix.
    for (body, says) in [
        (
            json!({"seconds": 10, "until": "2030-01-01T00:00:00Z"}),
            "either seconds or until",
        ),
        (
            json!({"until": "2001-01-01T00:00:00Z"}),
            "until: a pause lasts at least 1 s",
        ),
        (json!({"until": "tomorrow"}), "RFC 3339"),
        (json!({"seconds": -1}), "seconds"),
    ] {
        let (s, e) = w.post("/api/v1/keys/customer%3Aa%2F1/pause", body).await;
        assert_eq!(s, 422, "{e}");
        assert!(e.to_string().contains(says), "{e}");
    }
    // A resume frees them at once; one slot per customer hands out one at a time.
    let (s, r) = w
        .post("/api/v1/keys/customer%3Aa%2F1/resume", json!({}))
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(
        (&r["was_paused"], &r["released"]),
        (&json!(true), &json!(3))
    );
    let (_, r) = w
        .post("/api/v1/keys/customer%3Aa%2F1/resume", json!({}))
        .await;
    assert_eq!(
        (&r["was_paused"], &r["released"]),
        (&json!(false), &json!(0))
    );
    let (_, list) = w.get("/api/v1/keys").await;
    assert_eq!(list["keys"], json!([]));
    let got = claim(&w, &["sync.customer"], 10).await;
    assert_eq!(got.len(), 1, "one slot for customer a/1: {got:?}");
    let id = got[0]["id"].as_i64().unwrap();
    let (s, _) = w
        .post(
            &format!("/api/v1/jobs/{id}/complete"),
            json!({"lease_token": got[0]["lease_token"]}),
        )
        .await;
    assert_eq!(s, 200);
}

pub async fn a_pull_workers_snooze_can_pause_its_jobs_key(w: World) {
    let backend = w.backend;
    drop(w);
    let w = api_with(backend, &config()).await;
    let first = insert(&w, "sync.customer", json!({"customer": "c"})).await;
    let got = claim(&w, &["sync.customer"], 10).await;
    assert_eq!(got.len(), 1);
    let rest = [
        insert(&w, "sync.customer", json!({"customer": "c", "n": 2})).await,
        insert(&w, "sync.customer", json!({"customer": "c", "n": 3})).await,
    ];
    let (s, j) = w
        .post(
            &format!("/api/v1/jobs/{first}/snooze"),
            json!({"lease_token": got[0]["lease_token"], "seconds": 600,
                   "reason": "HTTP 429 from their API", "pause_key": true}),
        )
        .await;
    assert_eq!(s, 200, "{j}");
    assert_eq!((&j["state"], &j["snoozes"]), (&json!("snoozed"), &json!(1)));
    let (_, list) = w.get("/api/v1/keys").await;
    assert_eq!(
        (&list["keys"][0]["key"], &list["keys"][0]["held"]),
        (&json!("customer:c"), &json!(2)),
        "{list}"
    );
    assert!(claim(&w, &["sync.customer"], 10).await.is_empty());
    for id in rest {
        let (_, j) = w.get(&format!("/api/v1/jobs/{id}")).await;
        assert_eq!(
            (&j["state"], &j["snoozes"]),
            (&json!("scheduled"), &json!(0)),
            "{j}"
        );
    }
    // A job without a lease key has no key to pause: said, and nothing changes.
    let plain = insert(&w, "report.build", json!({})).await;
    let (s, c) = w
        .post(
            "/api/v1/queues/reports/claim",
            json!({"kinds": ["report.build"], "limit": 1, "wait": 0}),
        )
        .await;
    assert_eq!(s, 200, "{c}");
    let (s, e) = w
        .post(
            &format!("/api/v1/jobs/{plain}/snooze"),
            json!({"lease_token": c["jobs"][0]["lease_token"], "seconds": 60, "pause_key": true}),
        )
        .await;
    assert_eq!(s, 422, "{e}");
    assert!(e.to_string().contains("holds no lease key"), "{e}");
    let (_, j) = w.get(&format!("/api/v1/jobs/{plain}")).await;
    assert_eq!(j["state"], "running");
}
