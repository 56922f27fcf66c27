//! Refused calls: each answers the error shape with a fitting status and a message naming the
//! field, and changes nothing.

use serde_json::{json, Value};

use crate::harness::World;

fn message(v: &Value) -> &str {
    v["error"]["message"].as_str().unwrap_or_default()
}

pub async fn refused_calls_say_why_and_change_nothing(w: World) {
    let (_, j) = w
        .post("/api/v1/jobs", json!({"kind": "report.build"}))
        .await;
    let id = j["id"].as_i64().unwrap();
    let before = w.fingerprint().await;
    let job = serde_json::to_vec(&json!({"kind": "report.build"})).unwrap();

    // 401: no token, a wrong one, another scheme; before the body is read.
    for token in [None, Some("wrong"), Some("")] {
        let (s, e) = w
            .raw("POST", "/api/v1/jobs", token, Some(job.clone()))
            .await;
        assert_eq!(
            (s, &e["error"]["code"]),
            (401, &json!("unauthorized")),
            "{e}"
        );
    }
    for (method, path) in [
        ("GET", "/api/v1/jobs"),
        ("GET", "/api/v1/kinds"),
        ("POST", "/api/v1/events"),
        ("POST", "/api/v1/endpoints"),
        ("POST", "/api/v1/queues/default/pause"),
        ("POST", "/api/v1/queues/default/claim"),
        ("POST", "/api/v1/jobs/1/complete"),
        ("GET", "/api/v1/alerts"),
        ("GET", "/metrics"),
    ] {
        let (s, e) = w
            .raw(method, path, Some("wrong"), Some(b"{}".to_vec()))
            .await;
        assert_eq!(s, 401, "{method} {path}: {e}");
    }
    // 413 and 400 on other calls too.
    let big = serde_json::to_vec(&json!({"url": "x".repeat(2 << 20)})).unwrap();
    assert_eq!(
        w.raw("POST", "/api/v1/endpoints", Some(&w.token), Some(big))
            .await
            .0,
        413
    );
    assert_eq!(
        w.raw(
            "POST",
            "/api/v1/events",
            Some(&w.token),
            Some(b"[1,".to_vec())
        )
        .await
        .0,
        400
    );
    let almost = format!("{}x", w.token);
    assert_eq!(
        w.raw("GET", "/api/v1/jobs", Some(&almost), None).await.0,
        401
    );
    let (s, _) = w
        .raw(
            "GET",
            "/api/v1/jobs",
            Some(&w.token[..w.token.len() - 1]),
            None,
        )
        .await;
    assert_eq!(s, 401);

    // 400: not JSON, or no body.
    let (s, e) = w
        .raw(
            "POST",
            "/api/v1/jobs",
            Some(&w.token),
            Some(b"{\"kind\":".to_vec()),
        )
        .await;
    assert_eq!((s, &e["error"]["code"]), (400, &json!("malformed")), "{e}");
    let (s, e) = w.raw("POST", "/api/v1/jobs", Some(&w.token), None).await;
    assert_eq!(s, 400, "{e}");

    // 413: 2 MiB over the 1 MiB default.
    let big =
        serde_json::to_vec(&json!({"kind": "report.build", "args": {"pad": "x".repeat(2 << 20)}}))
            .unwrap();
    let (s, e) = w
        .raw("POST", "/api/v1/jobs", Some(&w.token), Some(big))
        .await;
    assert_eq!((s, &e["error"]["code"]), (413, &json!("too_large")), "{e}");

    // 422: each names its field.
    let cases = [
        (
            json!({"kind": "nope"}),
            "kind: unknown kind \"nope\"; known kinds: http.request, mail.send, quick.pull, report.build",
        ),
        (
            json!({"kind": "report.build", "run_at": "tomorrow"}),
            "run_at: \"tomorrow\" is not an RFC 3339 instant",
        ),
        (
            json!({"kind": "report.build", "priority": "high"}),
            "priority: invalid type",
        ),
        (
            json!({"kind": "report.build", "colour": "red"}),
            "unknown field `colour`",
        ),
        (
            json!({"kind": "report.build", "queue": ""}),
            "queue must not be empty",
        ),
        (json!({"args": {}}), "missing field `kind`"),
        (
            json!({"kind": "http.request", "args": {"method": "GET", "url": "not a url"}}),
            "args.url: \"not a url\" is not a URL",
        ),
        (
            json!({"kind": "http.request", "args": {"method": "GET", "url": "ftp://127.0.0.1/x"}}),
            "args.url: \"ftp://127.0.0.1/x\" has the scheme \"ftp\"",
        ),
        (
            json!({"kind": "http.request", "args": {"url": "http://127.0.0.1/"}}),
            "args: missing field `method`",
        ),
        (
            json!({"kind": "report.build", "tags": ["a\u{0}b"]}),
            "body.tags[0] contains a NUL character",
        ),
    ];
    for (body, want) in cases {
        let (s, e) = w.post("/api/v1/jobs", body.clone()).await;
        assert_eq!(s, 422, "{body}: {e}");
        assert!(message(&e).contains(want), "{body}: {e}");
    }
    for (path, want) in [
        ("/api/v1/jobs?state=lost", "state: \"lost\" is not a state"),
        ("/api/v1/jobs?limit=5000", "limit: \"5000\""),
        ("/api/v1/jobs?cursor=abc", "cursor: \"abc\""),
        (
            "/api/v1/jobs?created_after=yesterday",
            "created_after: \"yesterday\"",
        ),
        ("/api/v1/jobs?colour=red", "unknown field `colour`"),
        ("/api/v1/endpoints?tenant=a%00b", "NUL character"),
        ("/api/v1/jobs?q=%00", "NUL character"),
    ] {
        let (s, e) = w.get(path).await;
        assert_eq!(s, 422, "{path}: {e}");
        assert!(message(&e).contains(want), "{path}: {e}");
    }
    let (s, e) = w
        .post("/api/v1/jobs/retry", json!({"states": ["lost"]}))
        .await;
    assert!(s == 422 && message(&e).contains("states: \"lost\""), "{e}");

    // 404: no such job, alert or route.
    for (method, path) in [
        ("GET", "/api/v1/jobs/999999"),
        ("GET", "/api/v1/jobs/abc"),
        ("POST", "/api/v1/jobs/999999/retry"),
        ("POST", "/api/v1/jobs/999999/cancel"),
        ("DELETE", "/api/v1/jobs/999999"),
        ("POST", "/api/v1/alerts/999999/ack"),
        ("GET", "/api/v1/nothing-here"),
    ] {
        let (s, e) = w.call(method, path, None).await;
        assert_eq!(
            (s, &e["error"]["code"]),
            (404, &json!("not_found")),
            "{method} {path}: {e}"
        );
    }

    // 409: the action does not apply in the job's state.
    let (s, e) = w.post(&format!("/api/v1/jobs/{id}/retry"), json!({})).await;
    assert_eq!((s, &e["error"]["code"]), (409, &json!("conflict")), "{e}");
    let (s, e) = w.call("DELETE", &format!("/api/v1/jobs/{id}"), None).await;
    assert_eq!(s, 409, "{e}");

    assert_eq!(
        w.fingerprint().await,
        before,
        "no refused call changed anything"
    );
}

pub async fn healthz_needs_no_token_and_the_body_limit_is_configurable(w: World) {
    let (s, h) = w.raw("GET", "/healthz", None, None).await;
    assert_eq!((s, &h["status"]), (200, &json!("ok")), "{h}");
    drop(w);
    let w = crate::harness::api_with(
        onus_testkit::Backend::Sqlite,
        "body_limit = \"2KiB\"\n[kinds.\"report.build\"]\n",
    )
    .await;
    let (s, e) = w
        .post(
            "/api/v1/jobs",
            json!({"kind": "report.build", "args": {"pad": "x".repeat(3000)}}),
        )
        .await;
    assert_eq!(s, 413, "{e}");
    assert!(message(&e).contains("2048 bytes"), "{e}");
    let (s, _) = w
        .post(
            "/api/v1/jobs",
            json!({"kind": "report.build", "args": {"pad": "x".repeat(1000)}}),
        )
        .await;
    assert_eq!(s, 201);
}
