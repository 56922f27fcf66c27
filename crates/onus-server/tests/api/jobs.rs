//! Jobs through the API: insert, batch, list with every filter and the cursor, show, retry,
//! cancel, delete, and the bulk actions over every match.

use serde_json::{json, Value};

use crate::harness::{World, ECHO};

fn ids(page: &Value) -> Vec<i64> {
    page["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_i64().unwrap())
        .collect()
}

pub async fn insert_show_and_a_unique_key_answers_the_holder(w: World) {
    let body = json!({"kind": "report.build", "args": {"customer": "Ada"}, "unique_key": "r-1",
                      "tags": ["monthly"], "priority": 2});
    let (s, a) = w.post("/api/v1/jobs", body.clone()).await;
    assert_eq!(s, 201, "{a}");
    assert_eq!(
        (
            &a["kind"],
            &a["queue"],
            &a["state"],
            &a["max_attempts"],
            &a["tags"],
            &a["priority"]
        ),
        (
            &json!("report.build"),
            &json!("reports"),
            &json!("available"),
            &json!(3),
            &json!(["monthly"]),
            &json!(2)
        )
    );
    for field in [
        "id",
        "attempt",
        "snoozes",
        "args",
        "run_at",
        "created_at",
        "attempted_at",
        "finalized_at",
        "discard_reason",
        "errors",
    ] {
        assert!(a.get(field).is_some(), "a job in JSON has {field}: {a}");
    }
    let (s, again) = w.post("/api/v1/jobs", body).await;
    assert_eq!((s, &again["id"]), (200, &a["id"]), "{again}");
    let (s, shown) = w.get(&format!("/api/v1/jobs/{}", a["id"])).await;
    assert_eq!((s, &shown["args"]), (200, &json!({"customer": "Ada"})));
    // run_at in the future: scheduled.
    let (s, later) = w
        .post(
            "/api/v1/jobs",
            json!({"kind": "report.build", "run_at": "2999-01-01T00:00:00Z"}),
        )
        .await;
    assert_eq!(
        (s, &later["state"], &later["args"]),
        (201, &json!("scheduled"), &json!({}))
    );
}

pub async fn a_batch_answers_in_order_and_inserts_all_or_nothing(w: World) {
    w.post(
        "/api/v1/jobs",
        json!({"kind": "report.build", "unique_key": "held"}),
    )
    .await;
    let (s, a) = w
        .post(
            "/api/v1/jobs/batch",
            json!({"jobs": [
                {"kind": "report.build", "args": {"n": 1}},
                {"kind": "report.build", "unique_key": "held"},
                {"kind": "report.build", "args": {"n": 3}, "queue": "other"},
            ]}),
        )
        .await;
    assert_eq!(s, 201, "{a}");
    let jobs = a["jobs"].as_array().unwrap();
    assert_eq!(
        jobs.iter()
            .map(|j| (j["duplicate"].clone(), j["queue"].clone()))
            .collect::<Vec<_>>(),
        vec![
            (json!(false), json!("reports")),
            (json!(true), json!("reports")),
            (json!(false), json!("other"))
        ]
    );
    assert_eq!(jobs[0]["args"], json!({"n": 1}));
    let before = w.fingerprint().await;
    let (s, e) = w
        .post(
            "/api/v1/jobs/batch",
            json!({"jobs": [{"kind": "report.build"}, {"kind": "report.build"}, {"kind": "nope"}]}),
        )
        .await;
    assert_eq!(s, 422, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("jobs[2].kind: unknown kind"),
        "{e}"
    );
    let many: Vec<Value> = (0..10_001)
        .map(|_| json!({"kind": "report.build"}))
        .collect();
    let (s, e) = w.post("/api/v1/jobs/batch", json!({"jobs": many})).await;
    assert_eq!(s, 422, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("at most 10000"),
        "{e}"
    );
    assert_eq!(
        w.fingerprint().await,
        before,
        "a refused batch inserts nothing"
    );
    // The batch takes bodies over the default 1 MiB limit.
    let big: Vec<Value> = (0..2_000)
        .map(|i| json!({"kind": "report.build", "args": {"pad": "x".repeat(1000), "i": i}}))
        .collect();
    let (s, a) = w.post("/api/v1/jobs/batch", json!({"jobs": big})).await;
    assert_eq!(s, 201, "{a}");
    assert_eq!(a["jobs"][1999]["args"]["i"], json!(1999));
}

pub async fn list_filters_and_pages_stably_while_jobs_arrive(w: World) {
    let mut made = Vec::new();
    for i in 0..7 {
        let tags = if i % 2 == 0 {
            json!(["even"])
        } else {
            json!([])
        };
        let (_, j) = w
            .post("/api/v1/jobs", json!({"kind": "report.build", "args": {"who": format!("Client {i}")}, "tags": tags}))
            .await;
        made.push(j["id"].as_i64().unwrap());
    }
    let (_, p1) = w.get("/api/v1/jobs?kind=report.build&limit=3").await;
    assert_eq!(ids(&p1), vec![made[6], made[5], made[4]], "newest first");
    // New jobs arrive between pages: the walk neither repeats nor skips.
    w.post("/api/v1/jobs", json!({"kind": "report.build"}))
        .await;
    let cursor = p1["next_cursor"].as_str().unwrap().to_string();
    let (_, p2) = w
        .get(&format!(
            "/api/v1/jobs?kind=report.build&limit=3&cursor={cursor}"
        ))
        .await;
    assert_eq!(ids(&p2), vec![made[3], made[2], made[1]]);
    let cursor = p2["next_cursor"].as_str().unwrap().to_string();
    let (_, p3) = w
        .get(&format!(
            "/api/v1/jobs?kind=report.build&limit=3&cursor={cursor}"
        ))
        .await;
    assert_eq!(ids(&p3), vec![made[0]]);
    assert_eq!(p3["next_cursor"], Value::Null);
    let (_, even) = w.get("/api/v1/jobs?tag=even&limit=100").await;
    assert_eq!(ids(&even), vec![made[6], made[4], made[2], made[0]]);
    let (_, text) = w.get("/api/v1/jobs?q=CLIENT%203").await;
    assert_eq!(
        ids(&text),
        vec![made[3]],
        "text in args, any case, spaces ignored"
    );
    let (_, none) = w.get("/api/v1/jobs?state=completed,discarded").await;
    assert!(ids(&none).is_empty());
    let (_, queue) = w
        .get("/api/v1/jobs?queue=reports&state=available&limit=1000")
        .await;
    assert_eq!(ids(&queue).len(), 8);
    let (_, future) = w
        .get("/api/v1/jobs?created_after=2999-01-01T00:00:00Z")
        .await;
    assert!(ids(&future).is_empty());
    let (_, past) = w
        .get("/api/v1/jobs?created_before=2999-01-01T00:00:00%2B01:00&limit=2")
        .await;
    assert_eq!(ids(&past).len(), 2);
}

pub async fn retry_cancel_and_delete_one_job(w: World) {
    let (_, j) = w
        .post("/api/v1/jobs", json!({"kind": "report.build"}))
        .await;
    let id = j["id"].as_i64().unwrap();
    let (s, e) = w.call("DELETE", &format!("/api/v1/jobs/{id}"), None).await;
    assert_eq!(s, 409, "an unfinished job is not deleted: {e}");
    let (s, c) = w
        .post(&format!("/api/v1/jobs/{id}/cancel"), json!({}))
        .await;
    assert_eq!((s, &c["state"]), (200, &json!("cancelled")), "{c}");
    let (s, e) = w
        .post(&format!("/api/v1/jobs/{id}/cancel"), json!({}))
        .await;
    assert_eq!(s, 409, "{e}");
    let (s, r) = w.post(&format!("/api/v1/jobs/{id}/retry"), json!({})).await;
    assert_eq!((s, &r["state"]), (200, &json!("available")), "{r}");
    let (s, e) = w.post(&format!("/api/v1/jobs/{id}/retry"), json!({})).await;
    assert_eq!(s, 409, "an available job is not retried: {e}");
    w.post(&format!("/api/v1/jobs/{id}/cancel"), json!({}))
        .await;
    let (s, _) = w.call("DELETE", &format!("/api/v1/jobs/{id}"), None).await;
    assert_eq!(s, 204);
    let (s, e) = w.get(&format!("/api/v1/jobs/{id}")).await;
    assert_eq!((s, &e["error"]["code"]), (404, &json!("not_found")));
    // An in-process job runs to completion and can then be deleted.
    let (_, done) = w.post("/api/v1/jobs", json!({"kind": ECHO})).await;
    let id = done["id"].as_i64().unwrap();
    w.wait_job(id, |j| j["state"] == "completed").await;
    assert_eq!(
        w.call("DELETE", &format!("/api/v1/jobs/{id}"), None)
            .await
            .0,
        204
    );
}

pub async fn bulk_actions_reach_every_match_and_a_dry_run_changes_nothing(w: World) {
    let batch: Vec<Value> = (0..2_500)
        .map(|i| json!({"kind": "report.build", "tags": [if i < 2_000 { "old" } else { "new" }]}))
        .collect();
    assert_eq!(
        w.post("/api/v1/jobs/batch", json!({"jobs": batch})).await.0,
        201
    );
    let before = w.fingerprint().await;
    let (s, d) = w
        .post(
            "/api/v1/jobs/cancel",
            json!({"tags": ["old"], "dry_run": true}),
        )
        .await;
    assert_eq!(s, 200, "{d}");
    assert_eq!(
        (&d["matched"], &d["cancelled"], &d["dry_run"]),
        (&json!(2000), &json!(2000), &json!(true))
    );
    assert_eq!(w.fingerprint().await, before, "a dry run changes nothing");
    // More than one page and more than one chunk: every match.
    let (_, c) = w
        .post("/api/v1/jobs/cancel", json!({"tags": ["old"]}))
        .await;
    assert_eq!(
        (&c["matched"], &c["cancelled"], &c["refused"]),
        (&json!(2000), &json!(2000), &json!(0)),
        "{c}"
    );
    let (_, r) = w
        .post(
            "/api/v1/jobs/retry",
            json!({"states": ["cancelled"], "kinds": ["report.build"]}),
        )
        .await;
    assert_eq!(
        (&r["matched"], &r["retried"]),
        (&json!(2000), &json!(2000)),
        "{r}"
    );
    w.post("/api/v1/jobs/cancel", json!({"kinds": ["report.build"]}))
        .await;
    let (_, d) = w
        .post("/api/v1/jobs/delete", json!({"tags": ["new"]}))
        .await;
    assert_eq!(
        (&d["matched"], &d["deleted"]),
        (&json!(500), &json!(500)),
        "{d}"
    );
    let (_, all) = w.get("/api/v1/jobs?limit=1000&tag=new").await;
    assert!(ids(&all).is_empty());
    // A bulk action names at least one condition.
    let before = w.fingerprint().await;
    let (s, e) = w.post("/api/v1/jobs/delete", json!({})).await;
    assert_eq!(s, 422, "{e}");
    let (s, e) = w.post("/api/v1/jobs/retry", json!({"dry_run": true})).await;
    assert_eq!(s, 422, "{e}");
    assert_eq!(w.fingerprint().await, before);
}

pub async fn a_filtered_list_reads_a_bounded_window_and_its_cursor_goes_on(w: World) {
    const WINDOW: usize = onus_server::api::jobs::SEARCH_WINDOW as usize;
    let client = w.parts.onus.client();
    // The one match is the oldest job (the only scheduled one); a window's worth of newer jobs
    // sits above it.
    let later = client.now() + chrono::TimeDelta::days(1);
    client
        .insert(
            onus::NewJob::new("report.build", json!({"needle": "Haystack-Needle"}))
                .tag("rare")
                .run_at(later),
        )
        .await
        .unwrap();
    let filler: Vec<onus::NewJob> = (0..WINDOW + 10)
        .map(|i| onus::NewJob::new("report.build", json!({ "i": i })))
        .collect();
    for chunk in filler.chunks(10_000) {
        client.insert_many(chunk.to_vec()).await.unwrap();
    }
    for filter in ["q=haystack%20-%20needle", "tag=rare", "state=scheduled"] {
        let (s, first) = w.get(&format!("/api/v1/jobs?{filter}&limit=10")).await;
        assert_eq!(s, 200, "{first}");
        assert!(
            first["jobs"].as_array().unwrap().is_empty(),
            "{filter}: not among the newest {WINDOW}"
        );
        let cursor = first["next_cursor"]
            .as_str()
            .expect("the search goes on below the window");
        let (_, second) = w
            .get(&format!("/api/v1/jobs?{filter}&limit=10&cursor={cursor}"))
            .await;
        let found = second["jobs"].as_array().unwrap();
        assert_eq!(found.len(), 1, "{filter}: {second}");
        assert_eq!(found[0]["args"]["needle"], "Haystack-Needle");
        assert_eq!(
            second["next_cursor"],
            Value::Null,
            "{filter}: nothing older is left"
        );
    }
    // A kind alone (an index walk) is not windowed: the oldest jobs are on one page.
    let (_, by_kind) = w
        .get(&format!(
            "/api/v1/jobs?kind=report.build&limit=1000&cursor={}",
            12
        ))
        .await;
    assert_eq!(by_kind["jobs"].as_array().unwrap().len(), 11);
}
