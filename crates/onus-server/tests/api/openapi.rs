//! The OpenAPI document is generated from the handlers and matches the router.

use serde_json::json;

use crate::harness::World;

/// Every call the API promises, as `METHOD /path` under `/api/v1`.
const PROMISED: &[&str] = &[
    "POST /jobs",
    "GET /jobs",
    "POST /jobs/batch",
    "GET /jobs/{id}",
    "GET /jobs/{id}/mail",
    "DELETE /jobs/{id}",
    "POST /jobs/{id}/retry",
    "POST /jobs/{id}/cancel",
    "POST /jobs/retry",
    "POST /jobs/cancel",
    "POST /jobs/delete",
    "GET /kinds",
    "GET /queues",
    "POST /queues/{name}/pause",
    "POST /queues/{name}/resume",
    "GET /periodic",
    "GET /processes",
    "POST /periodic/{name}/pause",
    "POST /periodic/{name}/resume",
    "POST /periodic/{name}/run",
    "GET /keys",
    "POST /keys/{key}/pause",
    "POST /keys/{key}/resume",
    "POST /endpoints",
    "GET /endpoints",
    "GET /endpoints/{id}",
    "PATCH /endpoints/{id}",
    "DELETE /endpoints/{id}",
    "POST /endpoints/{id}/enable",
    "POST /endpoints/{id}/disable",
    "POST /endpoints/{id}/rotate-secret",
    "POST /endpoints/{id}/test",
    "POST /endpoints/{id}/redeliver",
    "GET /endpoints/{id}/attempts",
    "POST /events",
    "GET /events",
    "GET /events/{id}",
    "GET /events/{id}/deliveries",
    "POST /queues/{name}/claim",
    "POST /jobs/{id}/complete",
    "POST /jobs/{id}/fail",
    "POST /jobs/{id}/snooze",
    "POST /jobs/{id}/heartbeat",
    "POST /jobs/answers",
    "POST /jobs/heartbeats",
    "GET /alerts",
    "POST /alerts/{id}/ack",
];

pub async fn every_documented_route_is_served_and_every_route_documented(w: World) {
    let (s, doc) = w.raw("GET", "/api/v1/openapi.json", None, None).await;
    assert_eq!(s, 200);
    assert_eq!(doc["openapi"], json!("3.1.0"));
    let mut documented = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            documented.push(format!(
                "{} {}",
                method.to_uppercase(),
                path.trim_start_matches("/api/v1")
            ));
            // Served: the router answers it (not the fallback's 404, not 405).
            let concrete = path
                .replace("{id}", "1")
                .replace("{name}", "default")
                .replace("{key}", "k");
            let (s, body) = w.call(&method.to_uppercase(), &concrete, None).await;
            assert_ne!(s, 405, "{method} {path} is documented but not routed");
            assert!(
                !(s == 404
                    && body["error"]["message"]
                        .as_str()
                        .unwrap_or_default()
                        .starts_with("no such route")),
                "{method} {path} is documented but not routed"
            );
        }
    }
    documented.sort();
    let mut promised: Vec<String> = PROMISED.iter().map(|s| s.to_string()).collect();
    promised.sort();
    assert_eq!(
        documented, promised,
        "the document lists exactly the calls the API promises"
    );
    // Every route is generated from a handler with its schema: the error shape is a component.
    assert!(doc["components"]["schemas"]["ErrorBody"].is_object());
    assert!(doc["components"]["schemas"]["Job"].is_object());
}

/// Checks the served document with a standard validator (`openapi-spec-validator`, which refused
/// it for repeated operation ids) and every answer in `answers` (`[path, status, body]`) against
/// the schema the document gives that GET's 200: a typed client decodes what it is sent.
const CHECK: &str = r#"
import json, sys
from openapi_spec_validator import validate
from jsonschema import Draft202012Validator
doc = json.load(open(sys.argv[1]))
validate(doc)
answers = json.load(open(sys.argv[2]))
bad = []
for path, template, body in answers:
    schema = doc["paths"][template]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    v = Draft202012Validator({"components": doc["components"], "allOf": [schema]})
    for e in v.iter_errors(body):
        bad.append(f"GET {path}: {'/'.join(map(str, e.absolute_path))}: {e.message}"[:400])
print("\n".join(bad))
sys.exit(1 if bad else 0)
"#;

pub async fn regression_the_document_is_valid_and_every_get_answer_fits_it(w: World) {
    use crate::harness::FAIL;
    // Something of everything: a job with a result that is an array, a retried and an exhausted
    // job (an alert), a paused key, an endpoint with an event and its delivery attempts.
    let sink =
        onus_testkit::sink::HttpSink::start(|_, _| onus_testkit::sink::Reply::status(200)).await;
    let (_, j) = w
        .post(
            "/api/v1/jobs",
            json!({"kind": "report.build", "args": [1, "two"], "tags": ["t"]}),
        )
        .await;
    let job = j["id"].as_i64().unwrap();
    let (_, c) = w
        .post(
            "/api/v1/queues/reports/claim",
            json!({"kinds": ["report.build"], "wait": 0}),
        )
        .await;
    let (s, _) = w
        .post(
            &format!("/api/v1/jobs/{job}/complete"),
            json!({"lease_token": c["jobs"][0]["lease_token"], "result": [1, {"a": null}]}),
        )
        .await;
    assert_eq!(s, 200);
    let (_, f) = w.post("/api/v1/jobs", json!({"kind": FAIL})).await;
    let failed = f["id"].as_i64().unwrap();
    w.wait_job(failed, |j| j["state"] == "discarded").await;
    w.post(
        "/api/v1/jobs",
        json!({"kind": "report.build", "lease_key": "k"}),
    )
    .await;
    w.post("/api/v1/keys/k/pause", json!({"seconds": 600}))
        .await;
    let (s, ep) = w
        .post(
            "/api/v1/endpoints",
            json!({"url": sink.url("/hook"), "tenant": "acme"}),
        )
        .await;
    assert_eq!(s, 201, "{ep}");
    let ep = ep["id"].as_str().unwrap().to_string();
    let (_, ev) = w
        .post(
            "/api/v1/events",
            json!({"type": "a.b", "payload": ["x"], "tenant": "acme"}),
        )
        .await;
    let ev = ev["id"].as_str().unwrap().to_string();
    w.wait_get(&format!("/api/v1/endpoints/{ep}/attempts"), |a| {
        a["attempts"].as_array().is_some_and(|v| !v.is_empty())
    })
    .await;
    let gets = [
        ("/jobs".to_string(), "/jobs"),
        (format!("/jobs/{job}"), "/jobs/{id}"),
        (format!("/jobs/{failed}"), "/jobs/{id}"),
        ("/kinds".into(), "/kinds"),
        ("/queues".into(), "/queues"),
        ("/periodic".into(), "/periodic"),
        ("/keys".into(), "/keys"),
        ("/endpoints".into(), "/endpoints"),
        (format!("/endpoints/{ep}"), "/endpoints/{id}"),
        (
            format!("/endpoints/{ep}/attempts"),
            "/endpoints/{id}/attempts",
        ),
        ("/events".into(), "/events"),
        (format!("/events/{ev}"), "/events/{id}"),
        (
            format!("/events/{ev}/deliveries"),
            "/events/{id}/deliveries",
        ),
        ("/alerts".into(), "/alerts"),
    ];
    let mut answers = Vec::new();
    for (path, template) in gets {
        let (s, body) = w.get(&format!("/api/v1{path}")).await;
        assert_eq!(s, 200, "GET {path}: {body}");
        answers.push(json!([path, format!("/api/v1{template}"), body]));
    }
    let (_, doc) = w.raw("GET", "/api/v1/openapi.json", None, None).await;
    let dir = tempfile::tempdir().unwrap();
    let (doc_file, answers_file, script) = (
        dir.path().join("openapi.json"),
        dir.path().join("answers.json"),
        dir.path().join("check.py"),
    );
    std::fs::write(&doc_file, doc.to_string()).unwrap();
    std::fs::write(&answers_file, serde_json::to_string(&answers).unwrap()).unwrap();
    std::fs::write(&script, CHECK).unwrap();
    let bin = onus_testkit::python::venv(
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")),
        "openapi-spec-validator==0.9.0",
    );
    let out = tokio::process::Command::new(bin.join("python"))
        .arg(&script)
        .arg(&doc_file)
        .arg(&answers_file)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
