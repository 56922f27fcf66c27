//! Webhook endpoints and events through the API: tenants, health, secrets, tests, redelivery.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use onus_testkit::sink::{HttpSink, Reply};
use serde_json::{json, Value};

use crate::harness::{verifies, World};

async fn endpoint(w: &World, body: Value) -> Value {
    let (s, e) = w.post("/api/v1/endpoints", body).await;
    assert_eq!(s, 201, "{e}");
    e
}

/// Waits until every delivery of the event is finished; returns them.
async fn delivered(w: &World, event: &str, n: usize) -> Vec<Value> {
    let v = w
        .wait_get(&format!("/api/v1/events/{event}/deliveries"), |v| {
            let d = v["deliveries"].as_array().unwrap();
            d.len() == n
                && d.iter()
                    .all(|d| matches!(d["state"].as_str(), Some("completed" | "discarded")))
        })
        .await;
    v["deliveries"].as_array().unwrap().clone()
}

pub async fn an_event_reaches_only_its_tenants_endpoints(w: World) {
    let sink = HttpSink::start(|_, _| Reply::status(200)).await;
    let a1 = endpoint(
        &w,
        json!({"url": sink.url("/a1"), "tenant": "acme", "headers": {"x-team": "billing"}}),
    )
    .await;
    let a2 = endpoint(
        &w,
        json!({"url": sink.url("/a2"), "tenant": "acme", "event_types": ["invoice.paid"]}),
    )
    .await;
    let b1 = endpoint(&w, json!({"url": sink.url("/b1"), "tenant": "globex"})).await;
    let n1 = endpoint(&w, json!({"url": sink.url("/n1")})).await;
    assert!(a1["secret"].as_str().unwrap().starts_with("whsec_"), "{a1}");
    assert_eq!(
        (&a1["tenant"], &n1["tenant"]),
        (&json!("acme"), &json!(null))
    );
    let (_, mine) = w.get("/api/v1/endpoints?tenant=acme").await;
    assert_eq!(mine["endpoints"].as_array().unwrap().len(), 2, "{mine}");

    let (s, ev) = w
        .post("/api/v1/events", json!({"type": "invoice.paid", "payload": {"invoice": 7}, "tenant": "acme", "id": "inv-7"}))
        .await;
    assert_eq!((s, &ev["tenant"]), (202, &json!("acme")), "{ev}");
    let d = delivered(&w, "inv-7", 2).await;
    let to: Vec<&str> = d
        .iter()
        .map(|d| d["endpoint_id"].as_str().unwrap())
        .collect();
    assert!(
        to.contains(&a1["id"].as_str().unwrap()) && to.contains(&a2["id"].as_str().unwrap()),
        "{d:?}"
    );
    for x in &d {
        assert!(x["job_id"].is_i64(), "{x}");
        assert_eq!(x["state"], json!("completed"));
        assert_eq!(x["attempts"][0]["status"], json!(200), "{x}");
    }
    // An event without a tenant reaches only endpoints without one.
    w.post(
        "/api/v1/events",
        json!({"type": "invoice.paid", "payload": {}, "id": "plain-1"}),
    )
    .await;
    delivered(&w, "plain-1", 1).await;
    let paths: Vec<String> = sink.received().iter().map(|r| r.path.clone()).collect();
    assert_eq!(
        paths.iter().filter(|p| *p == "/b1").count(),
        0,
        "another tenant's endpoint got it: {paths:?}"
    );
    assert_eq!(
        paths.iter().filter(|p| p.starts_with("/a")).count(),
        2,
        "{paths:?}"
    );
    assert_eq!(paths.iter().filter(|p| *p == "/n1").count(), 1, "{paths:?}");
    // Signed per Standard Webhooks with the endpoint's secret; its headers sent along.
    let got = sink
        .received()
        .into_iter()
        .find(|r| r.path == "/a1")
        .unwrap();
    assert_eq!(got.header("webhook-id"), Some("inv-7"));
    assert_eq!(got.header("x-team"), Some("billing"));
    assert!(
        verifies(a1["secret"].as_str().unwrap(), &got),
        "the signature verifies"
    );
    let _ = b1;
    // The events of one tenant.
    let (_, page) = w.get("/api/v1/events?tenant=acme").await;
    assert_eq!(
        page["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["id"].clone())
            .collect::<Vec<_>>(),
        vec![json!("inv-7")]
    );
}

pub async fn one_event_id_is_one_event(w: World) {
    let body = json!({"type": "order.shipped", "payload": {"order": 1}, "id": "ord-1"});
    let (s, first) = w.post("/api/v1/events", body.clone()).await;
    assert_eq!(s, 202, "{first}");
    let (s, again) = w.post("/api/v1/events", body).await;
    assert_eq!(
        (s, &again["created_at"]),
        (200, &first["created_at"]),
        "{again}"
    );
    let before = w.fingerprint().await;
    let (s, e) = w
        .post(
            "/api/v1/events",
            json!({"type": "order.shipped", "payload": {"order": 2}, "id": "ord-1"}),
        )
        .await;
    assert_eq!((s, &e["error"]["code"]), (409, &json!("conflict")), "{e}");
    let (s, e) = w
        .post(
            "/api/v1/events",
            json!({"type": "order.shipped", "payload": {}, "id": "no spaces"}),
        )
        .await;
    assert_eq!(s, 422, "{e}");
    let (s, e) = w.post("/api/v1/events", json!({"payload": {}})).await;
    assert!(
        s == 422 && e["error"]["message"].as_str().unwrap().contains("type"),
        "{e}"
    );
    assert_eq!(w.fingerprint().await, before);
    for i in 0..3 {
        w.post("/api/v1/events", json!({"type": "t", "payload": {"i": i}}))
            .await;
    }
    let (_, p1) = w.get("/api/v1/events?type=t&limit=2").await;
    assert_eq!(p1["events"].as_array().unwrap().len(), 2, "{p1}");
    let c = p1["next_cursor"].as_str().unwrap();
    let (_, p2) = w
        .get(&format!("/api/v1/events?type=t&limit=2&cursor={c}"))
        .await;
    assert_eq!(p2["events"].as_array().unwrap().len(), 1, "{p2}");
    assert_eq!(p2["next_cursor"], json!(null));
    let (s, shown) = w.get("/api/v1/events/ord-1").await;
    assert_eq!((s, &shown["payload"]), (200, &json!({"order": 1})));
    assert_eq!(w.get("/api/v1/events/nope").await.0, 404);
}

pub async fn endpoints_are_managed_and_bad_ones_refused(w: World) {
    let sink = HttpSink::start(|_, _| Reply::status(200)).await;
    let before = w.fingerprint().await;
    for (body, want) in [
        (json!({"url": "not a url"}), "url:"),
        (
            json!({"url": "ftp://127.0.0.1/x"}),
            "url: \"ftp://127.0.0.1/x\" has another scheme than http or https",
        ),
        (json!({"url": sink.url("/x"), "secret": "weak"}), "secret"),
        (
            json!({"url": sink.url("/x"), "headers": {"webhook-signature": "x"}}),
            "headers: webhook-signature is set by Onus",
        ),
        (json!({"url": sink.url("/x"), "tenant": ""}), "tenant:"),
        (
            json!({"url": sink.url("/x"), "colour": "red"}),
            "unknown field `colour`",
        ),
    ] {
        let (s, e) = w.post("/api/v1/endpoints", body.clone()).await;
        assert_eq!(s, 422, "{body}: {e}");
        assert!(
            e["error"]["message"].as_str().unwrap().contains(want),
            "{body}: {e}"
        );
    }
    assert_eq!(
        w.fingerprint().await,
        before,
        "a refused endpoint is not created"
    );
    let e = endpoint(&w, json!({"url": sink.url("/x"), "description": "first"})).await;
    let id = e["id"].as_str().unwrap();
    // Refused changes to an endpoint change nothing, secrets included.
    let before = w.fingerprint().await;
    for (method, path, body) in [
        (
            "PATCH",
            format!("/api/v1/endpoints/{id}"),
            json!({"url": "ftp://127.0.0.1/x"}),
        ),
        (
            "PATCH",
            format!("/api/v1/endpoints/{id}"),
            json!({"headers": {"host": "x"}}),
        ),
        (
            "POST",
            format!("/api/v1/endpoints/{id}/rotate-secret"),
            json!({"secret": "weak"}),
        ),
        (
            "POST",
            format!("/api/v1/endpoints/{id}/redeliver"),
            json!({"since": "soon"}),
        ),
    ] {
        let (s, e) = w.call(method, &path, Some(body)).await;
        assert_eq!(s, 422, "{method} {path}: {e}");
    }
    assert_eq!(w.fingerprint().await, before);
    let (s, up) = w
        .call(
            "PATCH",
            &format!("/api/v1/endpoints/{id}"),
            Some(json!({"description": "second", "headers": {"x-a": "1"}})),
        )
        .await;
    assert_eq!(
        (s, &up["description"], &up["headers"]),
        (200, &json!("second"), &json!({"x-a": "1"})),
        "{up}"
    );
    let (s, r) = w
        .post(&format!("/api/v1/endpoints/{id}/rotate-secret"), json!({}))
        .await;
    assert!(
        s == 200 && r["secret"].as_str().unwrap().starts_with("whsec_"),
        "{r}"
    );
    assert_ne!(r["secret"], e["secret"]);
    let (s, d) = w
        .call("POST", &format!("/api/v1/endpoints/{id}/disable"), None)
        .await;
    assert_eq!(
        (s, &d["enabled"], &d["disabled_reason"]),
        (200, &json!(false), &json!("disabled by request")),
        "{d}"
    );
    let (s, t) = w
        .post(&format!("/api/v1/endpoints/{id}/test"), json!({}))
        .await;
    assert_eq!(s, 409, "a disabled endpoint gets no test: {t}");
    let (s, en) = w
        .post(&format!("/api/v1/endpoints/{id}/enable"), json!({}))
        .await;
    assert_eq!(
        (s, &en["enabled"], &en["disabled_at"]),
        (200, &json!(true), &json!(null))
    );
    let (s, t) = w
        .post(&format!("/api/v1/endpoints/{id}/test"), json!({}))
        .await;
    assert_eq!((s, &t["type"]), (202, &json!("webhook.test")), "{t}");
    delivered(&w, t["id"].as_str().unwrap(), 1).await;
    let (_, at) = w.get(&format!("/api/v1/endpoints/{id}/attempts")).await;
    assert_eq!(at["attempts"][0]["event_id"], t["id"], "{at}");
    assert_eq!(
        w.call("DELETE", &format!("/api/v1/endpoints/{id}"), None)
            .await
            .0,
        204
    );
    assert_eq!(w.get(&format!("/api/v1/endpoints/{id}")).await.0, 404);
    assert_eq!(
        w.post(&format!("/api/v1/endpoints/{id}/enable"), json!({}))
            .await
            .0,
        404
    );
}

pub async fn a_fixed_endpoint_gets_its_discarded_deliveries_again(w: World) {
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
    let e = endpoint(&w, json!({"url": sink.url("/broken")})).await;
    let id = e["id"].as_str().unwrap();
    w.post(
        "/api/v1/events",
        json!({"type": "a", "payload": {}, "id": "ev-a"}),
    )
    .await;
    let d = delivered(&w, "ev-a", 1).await;
    assert_eq!(
        d[0]["state"],
        json!("discarded"),
        "a 400 is permanent: {d:?}"
    );
    fixed.store(true, Ordering::SeqCst);
    let (s, r) = w
        .post(
            &format!("/api/v1/endpoints/{id}/redeliver"),
            json!({"since": "2000-01-01T00:00:00Z"}),
        )
        .await;
    assert_eq!((s, &r["retried"]), (200, &json!(1)), "{r}");
    w.wait_get("/api/v1/events/ev-a/deliveries", |v| {
        v["deliveries"][0]["state"] == "completed"
    })
    .await;
    let (s, e) = w
        .post(
            &format!("/api/v1/endpoints/{id}/redeliver"),
            json!({"since": "soon"}),
        )
        .await;
    assert_eq!(s, 422, "{e}");
}
