//! Pull workers: claims, answers with the lease token, heartbeats, rescue, and the README's
//! Python worker draining a thousand jobs.

use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::World;

async fn claim(w: &World, queue: &str, kinds: &[&str], limit: usize, wait: f64) -> Vec<Value> {
    let (s, c) = w
        .post(
            &format!("/api/v1/queues/{queue}/claim"),
            json!({"kinds": kinds, "limit": limit, "wait": wait}),
        )
        .await;
    assert_eq!(s, 200, "{c}");
    c["jobs"].as_array().unwrap().clone()
}

fn lease(job: &Value) -> Value {
    json!({"lease_token": job["lease_token"]})
}

pub async fn a_claimed_job_is_answered_once_with_its_lease(w: World) {
    let (_, a) = w
        .post(
            "/api/v1/jobs",
            json!({"kind": "report.build", "args": {"n": 1}}),
        )
        .await;
    let (_, b) = w
        .post(
            "/api/v1/jobs",
            json!({"kind": "report.build", "args": {"n": 2}}),
        )
        .await;
    let got = claim(&w, "reports", &["report.build"], 10, 0.0).await;
    assert_eq!(got.len(), 2, "{got:?}");
    let first = got.iter().find(|j| j["id"] == a["id"]).unwrap().clone();
    assert_eq!(
        (&first["attempt"], &first["max_attempts"], &first["args"]),
        (&json!(1), &json!(3), &json!({"n": 1}))
    );
    assert!(first["lease_expires_at"].is_string());
    assert!(
        claim(&w, "reports", &["report.build"], 10, 0.0)
            .await
            .is_empty(),
        "claimed jobs are not claimed twice"
    );
    let id = first["id"].as_i64().unwrap();
    let (s, done) = w
        .post(&format!("/api/v1/jobs/{id}/complete"), lease(&first))
        .await;
    assert_eq!((s, &done["state"]), (200, &json!("completed")), "{done}");
    let (s, e) = w
        .post(&format!("/api/v1/jobs/{id}/complete"), lease(&first))
        .await;
    assert_eq!(s, 409, "answered twice: {e}");
    // A failure is classified by the job layer: retryable under the kind's policy.
    let second = got.iter().find(|j| j["id"] == b["id"]).unwrap().clone();
    let bid = second["id"].as_i64().unwrap();
    let (s, f) = w
        .post(
            &format!("/api/v1/jobs/{bid}/fail"),
            json!({"lease_token": second["lease_token"], "message": "upstream said no"}),
        )
        .await;
    assert_eq!(
        (s, &f["state"], &f["errors"][0]["message"]),
        (200, &json!("retryable"), &json!("upstream said no")),
        "{f}"
    );
    let (s, e) = w
        .post(
            &format!("/api/v1/jobs/{bid}/complete"),
            json!({"lease_token": "nonsense"}),
        )
        .await;
    assert_eq!(s, 422, "{e}");
    // Only pull kinds are claimed; a bad claim says which field.
    let (s, e) = w
        .post(
            "/api/v1/queues/default/claim",
            json!({"kinds": ["test.echo"]}),
        )
        .await;
    assert!(
        s == 422
            && e["error"]["message"]
                .as_str()
                .unwrap()
                .contains("run by the server"),
        "{e}"
    );
    let (s, e) = w
        .post(
            "/api/v1/queues/default/claim",
            json!({"kinds": ["report.build"], "wait": 31}),
        )
        .await;
    assert_eq!(s, 422, "{e}");
}

pub async fn a_snooze_spends_no_attempt_and_a_discard_ends_the_job(w: World) {
    w.post("/api/v1/jobs", json!({"kind": "report.build"}))
        .await;
    let j = claim(&w, "reports", &["report.build"], 1, 0.0)
        .await
        .remove(0);
    let id = j["id"].as_i64().unwrap();
    let (s, sn) = w
        .post(
            &format!("/api/v1/jobs/{id}/snooze"),
            json!({"lease_token": j["lease_token"], "seconds": 3600, "reason": "rate limited"}),
        )
        .await;
    assert_eq!(
        (s, &sn["state"], &sn["snoozes"], &sn["attempt"]),
        (200, &json!("snoozed"), &json!(1), &json!(0)),
        "{sn}"
    );
    w.post(&format!("/api/v1/jobs/{id}/retry"), json!({})).await;
    let j = claim(&w, "reports", &["report.build"], 1, 0.0)
        .await
        .remove(0);
    let (s, d) = w
        .post(
            &format!("/api/v1/jobs/{id}/fail"),
            json!({"lease_token": j["lease_token"], "message": "bad input", "discard": true}),
        )
        .await;
    assert_eq!(
        (s, &d["state"], &d["discard_reason"]),
        (200, &json!("discarded"), &json!("permanent")),
        "{d}"
    );
    let (s, e) = w
        .post(
            &format!("/api/v1/jobs/{id}/snooze"),
            json!({"lease_token": j["lease_token"]}),
        )
        .await;
    assert!(s == 422 || s == 409, "{e}");
}

pub async fn a_late_answer_after_a_rescue_is_refused(w: World) {
    w.post("/api/v1/jobs", json!({"kind": "quick.pull"})).await;
    let j = claim(&w, "default", &["quick.pull"], 1, 0.0)
        .await
        .remove(0);
    let id = j["id"].as_i64().unwrap();
    // The worker goes quiet past its 1 s lease: the job is rescued as "worker lost".
    let rescued = w.wait_job(id, |v| v["state"] != "running").await;
    assert_eq!(rescued["state"], json!("retryable"), "{rescued}");
    assert!(
        rescued["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("lost"),
        "{rescued}"
    );
    let (s, e) = w
        .post(&format!("/api/v1/jobs/{id}/complete"), lease(&j))
        .await;
    assert_eq!((s, &e["error"]["code"]), (409, &json!("conflict")), "{e}");
    let (s, _) = w
        .post(&format!("/api/v1/jobs/{id}/heartbeat"), lease(&j))
        .await;
    assert_eq!(s, 409);
    // Its second and last attempt fails: discarded, exhausted, with an alert.
    let again = claim(&w, "default", &["quick.pull"], 1, 10.0)
        .await
        .remove(0);
    assert_eq!(again["attempt"], json!(2));
    let (s, d) = w
        .post(
            &format!("/api/v1/jobs/{id}/fail"),
            json!({"lease_token": again["lease_token"], "message": "still broken"}),
        )
        .await;
    assert_eq!(
        (s, &d["state"], &d["discard_reason"]),
        (200, &json!("discarded"), &json!("exhausted")),
        "{d}"
    );
    let (_, alerts) = w.get("/api/v1/alerts").await;
    assert_eq!(alerts["alerts"][0]["job_id"], json!(id), "{alerts}");
}

pub async fn a_cancel_reaches_the_worker_through_its_heartbeat(w: World) {
    w.post("/api/v1/jobs", json!({"kind": "report.build"}))
        .await;
    let j = claim(&w, "reports", &["report.build"], 1, 0.0)
        .await
        .remove(0);
    let id = j["id"].as_i64().unwrap();
    let (s, b) = w
        .post(&format!("/api/v1/jobs/{id}/heartbeat"), lease(&j))
        .await;
    assert_eq!((s, &b["cancel_requested"]), (200, &json!(false)), "{b}");
    let (_, c) = w
        .post(&format!("/api/v1/jobs/{id}/cancel"), json!({}))
        .await;
    assert_eq!(
        (&c["state"], &c["cancel_requested"]),
        (&json!("running"), &json!(true)),
        "{c}"
    );
    let (_, b) = w
        .post(&format!("/api/v1/jobs/{id}/heartbeat"), lease(&j))
        .await;
    assert_eq!(b["cancel_requested"], json!(true), "{b}");
    let (_, f) = w
        .post(
            &format!("/api/v1/jobs/{id}/fail"),
            json!({"lease_token": j["lease_token"], "message": "stopped"}),
        )
        .await;
    assert_eq!(f["state"], json!("cancelled"), "{f}");
}

pub async fn a_long_poll_returns_when_a_job_arrives(w: World) {
    let http = w.http.clone();
    let url = format!("{}/api/v1/queues/reports/claim", w.base);
    let token = w.token.clone();
    let waiting = tokio::spawn(async move {
        let r = http
            .post(url)
            .bearer_auth(token)
            .header("content-type", "application/json")
            .body(json!({"kinds": ["report.build"], "wait": 20}).to_string())
            .send()
            .await
            .unwrap();
        let v: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
        v
    });
    // The claim is waiting (nothing is due); then a job arrives and the claim answers with it.
    let (_, j) = w
        .post("/api/v1/jobs", json!({"kind": "report.build"}))
        .await;
    let got = tokio::time::timeout(Duration::from_secs(15), waiting)
        .await
        .expect("the long poll answered")
        .unwrap();
    assert_eq!(got["jobs"][0]["id"], j["id"], "{got}");
}

/// The Python worker of the README, as the README has it.
fn readme_worker() -> String {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let start = readme
        .find("```python\n#!/usr/bin/env python3\n\"\"\"An Onus pull worker")
        .expect("the README has a Python worker")
        + "```python\n".len();
    let len = readme[start..].find("```").unwrap();
    readme[start..start + len].to_string()
}

pub async fn the_readme_python_worker_drains_a_thousand_jobs_once_each(w: World) {
    let jobs: Vec<Value> = (0..1000)
        .map(|i| json!({"kind": "report.build", "args": {"i": i}}))
        .collect();
    assert_eq!(
        w.post("/api/v1/jobs/batch", json!({"jobs": jobs})).await.0,
        201
    );
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("worker.py");
    std::fs::write(&script, readme_worker()).unwrap();
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new("python3")
            .arg(&script)
            .env("ONUS_URL", &w.base)
            .env("ONUS_API_TOKEN", &w.token)
            // The README's own queue and kinds (the configuration example's).
            .env("ONUS_CLAIMERS", "4")
            .env("ONUS_EXIT_WHEN_IDLE", "1")
            .output(),
    )
    .await
    .expect("the worker finished")
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answered: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("answered "))
        .collect();
    assert_eq!(answered.len(), 1000, "{stdout}");
    assert!(
        answered.iter().all(|l| l.ends_with(": 200")),
        "every answer accepted, none twice"
    );
    let mut ids: Vec<&str> = answered
        .iter()
        .map(|l| l.split(' ').nth(1).unwrap())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 1000, "each job ran once");
    let (_, done) = w
        .get("/api/v1/jobs?state=completed&kind=report.build&limit=1000")
        .await;
    let done = done["jobs"].as_array().unwrap();
    assert_eq!(done.len(), 1000);
    assert!(done.iter().all(|j| j["attempt"] == 1), "no job ran twice");
}

/// A pull worker reports progress with its heartbeat and keeps a result with its completion;
/// both are on the job. Reports out of range, and results over the limit, are refused.
pub async fn a_pull_worker_reports_progress_and_keeps_a_result(w: World) {
    let (_, j) = w
        .post("/api/v1/jobs", json!({"kind": "report.build", "args": {}}))
        .await;
    let id = j["id"].as_i64().unwrap();
    let got = claim(&w, "reports", &["report.build"], 1, 0.0).await;
    let token = got[0]["lease_token"].clone();
    let (s, b) = w
        .post(
            &format!("/api/v1/jobs/{id}/heartbeat"),
            json!({"lease_token": token, "progress": 0.4, "message": "page 4 of 10"}),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    let (_, j) = w.get(&format!("/api/v1/jobs/{id}")).await;
    assert_eq!(
        (&j["progress"]["fraction"], &j["progress"]["message"]),
        (&json!(0.4), &json!("page 4 of 10")),
        "{j}"
    );
    for (body, says) in [
        (json!({"lease_token": token, "progress": 2}), "0 to 1"),
        (
            json!({"lease_token": token, "message": "alone"}),
            "with progress",
        ),
    ] {
        let (s, e) = w.post(&format!("/api/v1/jobs/{id}/heartbeat"), body).await;
        assert_eq!(s, 422, "{e}");
        assert!(e.to_string().contains(says), "{e}");
    }
    let huge = "x".repeat(70_000);
    let (s, e) = w
        .post(
            &format!("/api/v1/jobs/{id}/complete"),
            json!({"lease_token": token, "result": {"blob": huge}}),
        )
        .await;
    assert_eq!(s, 422, "{e}");
    assert!(e.to_string().contains("at most"), "{e}");
    let (s, done) = w
        .post(
            &format!("/api/v1/jobs/{id}/complete"),
            json!({"lease_token": token, "result": {"pages": 10, "url": "https://reports.example/7"}}),
        )
        .await;
    assert_eq!(s, 200, "{done}");
    assert_eq!(done["state"], "completed");
    assert_eq!(
        done["result"],
        json!({"pages": 10, "url": "https://reports.example/7"})
    );
    assert_eq!(done["progress"]["fraction"], json!(0.4));
}

/// Many answers in one call: each is applied or refused on its own, the refused ones say why
/// with the status their own call would answer, and a refused answer changes nothing.
pub async fn many_answers_in_one_call_are_each_applied_or_refused_alone(w: World) {
    let jobs: Vec<Value> = (0..5)
        .map(|i| json!({"kind": "report.build", "args": {"i": i}}))
        .collect();
    assert_eq!(
        w.post("/api/v1/jobs/batch", json!({"jobs": jobs})).await.0,
        201
    );
    let mut got = claim(&w, "reports", &["report.build"], 10, 0.0).await;
    got.sort_by_key(|j| j["id"].as_i64());
    assert_eq!(got.len(), 5, "{got:?}");
    let id = |i: usize| got[i]["id"].as_i64().unwrap();
    let token = |i: usize| got[i]["lease_token"].clone();
    // The fourth job is answered on its own first: its lease is then no longer current.
    let (s, _) = w
        .post(&format!("/api/v1/jobs/{}/complete", id(3)), lease(&got[3]))
        .await;
    assert_eq!(s, 200);
    let (s, a) = w
        .post(
            "/api/v1/jobs/answers",
            json!({"answers": [
                {"id": id(0), "lease_token": token(0), "outcome": "complete", "result": {"rows": 7}},
                {"id": id(1), "lease_token": token(1), "outcome": "fail", "message": "upstream said no"},
                {"id": id(2), "lease_token": token(2), "outcome": "snooze", "seconds": 3600, "reason": "later"},
                {"id": id(3), "lease_token": token(3), "outcome": "complete"},
                {"id": id(4), "lease_token": token(4), "outcome": "complete", "message": "misplaced"},
                {"id": id(0), "lease_token": token(0), "outcome": "complete"},
            ]}),
        )
        .await;
    assert_eq!(s, 200, "{a}");
    let a = a["answers"].as_array().unwrap().clone();
    assert_eq!(a.len(), 6, "{a:?}");
    assert_eq!(
        a.iter()
            .map(|x| x["id"].as_i64().unwrap())
            .collect::<Vec<_>>(),
        vec![id(0), id(1), id(2), id(3), id(4), id(0)],
        "in the order sent"
    );
    assert_eq!(
        (&a[0]["state"], &a[1]["state"], &a[2]["state"]),
        (&json!("completed"), &json!("retryable"), &json!("snoozed")),
        "{a:?}"
    );
    assert_eq!(
        (&a[3]["error"]["status"], &a[3]["error"]["code"]),
        (&json!(409), &json!("conflict")),
        "the stale lease alone is refused: {a:?}"
    );
    assert!(a[3].get("state").is_none(), "{a:?}");
    assert_eq!(a[4]["error"]["status"], json!(422), "{a:?}");
    assert!(
        a[4]["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("answers[4].message"),
        "names the item and its field: {a:?}"
    );
    assert_eq!(
        a[5]["error"]["status"],
        json!(422),
        "twice in one call: {a:?}"
    );
    // What each job now is, read back on its own.
    let job = |i: usize| {
        let w = &w;
        async move { w.get(&format!("/api/v1/jobs/{}", id(i))).await.1 }
    };
    let first = job(0).await;
    assert_eq!(
        (&first["state"], &first["result"]),
        (&json!("completed"), &json!({"rows": 7})),
        "{first}"
    );
    let second = job(1).await;
    assert_eq!(
        second["errors"][0]["message"],
        json!("upstream said no"),
        "{second}"
    );
    let third = job(2).await;
    assert_eq!(
        (&third["snoozes"], &third["attempt"]),
        (&json!(1), &json!(0))
    );
    let fifth = job(4).await;
    assert_eq!(
        fifth["state"],
        json!("running"),
        "a refused answer changes nothing"
    );
    // The refused one is answered again, alone and right.
    let (s, a) = w
        .post(
            "/api/v1/jobs/answers",
            json!({"answers": [{"id": id(4), "lease_token": token(4), "outcome": "fail", "message": "bad input", "discard": true}]}),
        )
        .await;
    assert_eq!(
        (s, &a["answers"][0]["state"]),
        (200, &json!("discarded")),
        "{a}"
    );
    // A call that is wrong as a whole says so and answers nothing.
    // Over the limit, counted over every item, those refused on their own included.
    let many: Vec<Value> = (0..1001)
        .map(|i| match i % 2 {
            0 => json!({"id": i, "lease_token": "x.1", "outcome": "complete"}),
            _ => json!({"id": i, "lease_token": "x.1", "outcome": "complete", "message": "misplaced"}),
        })
        .collect();
    let (s, e) = w
        .post("/api/v1/jobs/answers", json!({ "answers": many }))
        .await;
    assert!(
        s == 422
            && e["error"]["message"]
                .as_str()
                .unwrap()
                .contains("at most 1000"),
        "{e}"
    );
    let (s, e) = w
        .post(
            "/api/v1/jobs/answers",
            json!({"answers": [{"id": 1, "lease_token": "x.1", "outcome": "finish"}]}),
        )
        .await;
    assert!(s == 400 || s == 422, "an unknown outcome: {e}");
}

/// Many heartbeats in one call: each renewed or refused on its own, a cancel reaching its job.
pub async fn many_heartbeats_in_one_call_are_each_renewed_or_refused_alone(w: World) {
    let jobs: Vec<Value> = (0..3)
        .map(|i| json!({"kind": "report.build", "args": {"i": i}}))
        .collect();
    w.post("/api/v1/jobs/batch", json!({"jobs": jobs})).await;
    let mut got = claim(&w, "reports", &["report.build"], 10, 0.0).await;
    got.sort_by_key(|j| j["id"].as_i64());
    let id = |i: usize| got[i]["id"].as_i64().unwrap();
    let token = |i: usize| got[i]["lease_token"].clone();
    w.post(&format!("/api/v1/jobs/{}/cancel", id(1)), json!({}))
        .await;
    w.post(&format!("/api/v1/jobs/{}/complete", id(2)), lease(&got[2]))
        .await;
    let (s, b) = w
        .post(
            "/api/v1/jobs/heartbeats",
            json!({"heartbeats": [
                {"id": id(0), "lease_token": token(0), "progress": 0.5, "message": "half"},
                {"id": id(1), "lease_token": token(1)},
                {"id": id(2), "lease_token": token(2)},
                {"id": id(0), "lease_token": token(0), "message": "no progress"},
                {"id": id(0), "lease_token": token(0)},
            ]}),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    let b = b["heartbeats"].as_array().unwrap().clone();
    assert_eq!(
        (&b[0]["cancel_requested"], &b[1]["cancel_requested"]),
        (&json!(false), &json!(true)),
        "{b:?}"
    );
    assert!(b[0]["lease_expires_at"].is_string(), "{b:?}");
    assert_eq!(
        b[2]["error"]["status"],
        json!(409),
        "answered already: {b:?}"
    );
    assert_eq!(b[3]["error"]["status"], json!(422), "{b:?}");
    assert!(
        b[4]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("two heartbeats"),
        "one job twice in a call: {b:?}"
    );
    let (_, j) = w.get(&format!("/api/v1/jobs/{}", id(0))).await;
    assert_eq!(j["progress"]["message"], json!("half"), "{j}");
}

pub async fn processes_list_this_server_and_the_named_pull_workers(w: World) {
    let (s, p) = w.get("/api/v1/processes").await;
    assert_eq!(s, 200, "{p}");
    let runtimes: Vec<&Value> = p["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["role"] == "runtime")
        .collect();
    assert_eq!(runtimes.len(), 1, "this server: {p}");
    let me = runtimes[0];
    assert_eq!(me["live"], true, "{me}");
    assert!(
        me["queues"]
            .as_array()
            .unwrap()
            .iter()
            .any(|q| q["name"] == "default" && q["slots"].as_u64() > Some(0)),
        "{me}"
    );
    assert!(
        me["kinds"]
            .as_array()
            .unwrap()
            .iter()
            .any(|k| k == "http.request"),
        "{me}"
    );

    // A named pull worker is listed by its claim; its leases are counted apart.
    let (_, job) = w
        .post("/api/v1/jobs", json!({"kind": "report.build", "args": {}}))
        .await;
    let (s, c) = w
        .post(
            "/api/v1/queues/reports/claim",
            json!({"kinds": ["report.build"], "worker": "reports-1:4121"}),
        )
        .await;
    assert_eq!(s, 200, "{c}");
    assert_eq!(c["jobs"][0]["id"], job["id"]);
    let (_, p) = w.get("/api/v1/processes").await;
    let worker = p["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["role"] == "pull")
        .unwrap_or_else(|| panic!("{p}"));
    assert_eq!(
        (&worker["id"], &worker["kinds"], &worker["live"]),
        (
            &json!("reports-1:4121"),
            &json!(["report.build"]),
            &json!(true)
        )
    );
    assert_eq!(p["pulled_running"], 1, "{p}");
    let (s, e) = w
        .post(
            "/api/v1/queues/reports/claim",
            json!({"kinds": ["report.build"], "worker": ""}),
        )
        .await;
    assert_eq!(s, 422, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("worker: give a name"),
        "{e}"
    );
}
