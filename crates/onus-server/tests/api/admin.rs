//! Kinds, queues (pause and resume), periodic jobs and alerts.

use serde_json::json;

use crate::harness::{World, ECHO, FAIL};

pub async fn kinds_show_how_each_is_handled_and_its_timeline(w: World) {
    let (s, k) = w.get("/api/v1/kinds").await;
    assert_eq!(s, 200, "{k}");
    let kinds = k["kinds"].as_array().unwrap();
    let by = |name: &str| {
        kinds
            .iter()
            .find(|k| k["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {k}"))
            .clone()
    };
    let report = by("report.build");
    assert_eq!(
        (&report["handled_by"], &report["queue"]),
        (&json!("pull"), &json!("reports"))
    );
    assert_eq!(report["policy"]["max_attempts"], json!(3));
    let waits: Vec<_> = report["timeline"]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["wait"].clone())
        .collect();
    assert_eq!(waits, vec![json!("0s"), json!("10s"), json!("1m")]);
    assert_eq!(report["span_seconds"], json!(70.0));
    assert_eq!(by("webhook.deliver")["handled_by"], json!("process"));
    assert_eq!(by(ECHO)["handled_by"], json!("process"));
}

pub async fn a_paused_queue_runs_nothing_until_resumed(w: World) {
    let (s, q) = w.post("/api/v1/queues/default/pause", json!({})).await;
    assert_eq!((s, &q["paused"]), (200, &json!(true)), "{q}");
    let (_, held) = w.post("/api/v1/jobs", json!({"kind": ECHO})).await;
    let held = held["id"].as_i64().unwrap();
    // A job in another queue runs meanwhile: the workers are alive, the pause holds.
    let (_, other) = w
        .post("/api/v1/jobs", json!({"kind": ECHO, "queue": "reports"}))
        .await;
    w.wait_job(other["id"].as_i64().unwrap(), |j| j["state"] == "completed")
        .await;
    let (_, j) = w.get(&format!("/api/v1/jobs/{held}")).await;
    assert_eq!(j["state"], json!("available"), "{j}");
    let (_, qs) = w.get("/api/v1/queues").await;
    let default = qs["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["name"] == "default")
        .unwrap()
        .clone();
    assert_eq!(
        (&default["paused"], &default["waiting"]),
        (&json!(true), &json!(1)),
        "{qs}"
    );
    assert!(default["oldest_waiting_seconds"].as_f64().unwrap() >= 0.0);
    let (s, q) = w.post("/api/v1/queues/default/resume", json!({})).await;
    assert_eq!((s, &q["paused"]), (200, &json!(false)), "{q}");
    w.wait_job(held, |j| j["state"] == "completed").await;
    let (s, e) = w.post("/api/v1/queues/%20/pause", json!({})).await;
    assert_eq!(s, 422, "{e}");
}

pub async fn periodic_jobs_are_listed_with_their_next_run(w: World) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (s, p) = w.get("/api/v1/periodic").await;
        assert_eq!(s, 200);
        if let Some(row) = p["periodic"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "nightly-report")
        {
            assert_eq!(row["kind"], json!("report.build"));
            assert!(row["next_run_at"].is_string(), "{row}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the periodic job was never recorded: {p}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

pub async fn an_exhausted_job_raises_an_alert_that_is_acknowledged(w: World) {
    let (_, j) = w.post("/api/v1/jobs", json!({"kind": FAIL})).await;
    let id = j["id"].as_i64().unwrap();
    let done = w.wait_job(id, |j| j["state"] == "discarded").await;
    assert_eq!(done["discard_reason"], json!("exhausted"), "{done}");
    assert_eq!(
        done["errors"][0]["message"],
        json!("the test says no"),
        "{done}"
    );
    let (s, a) = w.get("/api/v1/alerts").await;
    assert_eq!((s, &a["open"]), (200, &json!(1)), "{a}");
    let alert = a["alerts"][0].clone();
    assert_eq!(
        (&alert["job_id"], &alert["acked_at"]),
        (&json!(id), &json!(null))
    );
    let (s, acked) = w
        .post(&format!("/api/v1/alerts/{}/ack", alert["id"]), json!({}))
        .await;
    assert_eq!(s, 200, "{acked}");
    assert!(acked["acked_at"].is_string(), "{acked}");
    let (_, a) = w.get("/api/v1/alerts").await;
    assert_eq!(a["open"], json!(0), "{a}");
}

/// `clock_offset` (fault drills) shifts the server's clock: what it writes is stamped that far
/// ahead of the machine's time.
pub async fn clock_offset_shifts_what_the_server_stamps(w: World) {
    let backend = w.backend;
    drop(w);
    let toml = format!("clock_offset = \"45s\"\n{}", crate::harness::CONFIG);
    let w = crate::harness::api_with(backend, &toml).await;
    let before = chrono::Utc::now();
    let (s, j) = w
        .post(
            "/api/v1/jobs",
            serde_json::json!({"kind": "report.build", "args": {}, "run_at": "2099-01-01T00:00:00Z"}),
        )
        .await;
    assert_eq!(s, 201, "{j}");
    let after = chrono::Utc::now();
    let created: chrono::DateTime<chrono::Utc> = j["created_at"].as_str().unwrap().parse().unwrap();
    let ahead = created - before;
    assert!(
        ahead >= chrono::TimeDelta::seconds(44)
            && created - after <= chrono::TimeDelta::seconds(46),
        "created {created}, between {before} and {after} plus 45 s"
    );
}

/// A periodic job declared in the configuration, in a time zone, paused, resumed and run now
/// through the API.
pub async fn a_configured_periodic_job_is_paused_resumed_and_run(w: World) {
    let backend = w.backend;
    drop(w);
    let toml = format!(
        r#"{}
[periodic."daily-report"]
cron = "0 9 * * MON-FRI"
timezone = "Europe/Berlin"
kind = "report.build"
args = {{ format = "pdf" }}
catch_up = "all"
catch_up_limit = 5
"#,
        crate::harness::CONFIG
    );
    let w = crate::harness::api_with(backend, &toml).await;
    let row = w
        .wait_get("/api/v1/periodic", |p| {
            p["periodic"]
                .as_array()
                .is_some_and(|a| a.iter().any(|r| r["name"] == "daily-report"))
        })
        .await;
    let row = row["periodic"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "daily-report")
        .unwrap()
        .clone();
    assert_eq!(row["schedule"], "cron: 0 9 * * MON-FRI (Europe/Berlin)");
    let next: chrono::DateTime<chrono::Utc> = row["next_run_at"].as_str().unwrap().parse().unwrap();
    let local = next.with_timezone(&chrono_tz::Europe::Berlin);
    assert_eq!(local.format("%H:%M").to_string(), "09:00", "{next}");
    let (s, p) = w
        .post("/api/v1/periodic/daily-report/pause", json!({}))
        .await;
    assert_eq!(s, 200, "{p}");
    assert!(p["paused_at"].is_string(), "{p}");
    let (s, j) = w.post("/api/v1/periodic/daily-report/run", json!({})).await;
    assert_eq!(s, 201, "{j}");
    assert_eq!(
        (&j["kind"], &j["args"]),
        (&json!("report.build"), &json!({"format": "pdf"}))
    );
    let (s, p) = w
        .post("/api/v1/periodic/daily-report/resume", json!({}))
        .await;
    assert_eq!(s, 200, "{p}");
    assert_eq!(p["paused_at"], json!(null));
    let (s, e) = w.post("/api/v1/periodic/nope/run", json!({})).await;
    assert_eq!(s, 404, "{e}");
    assert!(e.to_string().contains("daily-report"), "{e}");
}
