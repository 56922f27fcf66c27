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
