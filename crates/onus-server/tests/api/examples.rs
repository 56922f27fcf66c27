//! The README's worked examples, run as the README has them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use onus_testkit::sink::{HttpSink, Reply};
use serde_json::{json, Value};

use crate::harness::World;

fn readme() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap()
}

/// The first fenced block of `lang` after `marker` in the README.
fn block_after(marker: &str, lang: &str) -> String {
    let text = readme();
    let at = text
        .find(marker)
        .unwrap_or_else(|| panic!("the README has {marker:?}"));
    let fence = format!("```{lang}\n");
    let start = at + text[at..].find(&fence).unwrap() + fence.len();
    let len = text[start..].find("```").unwrap();
    text[start..start + len].to_string()
}

pub async fn the_search_indexing_example_survives_two_503s(w: World) {
    let n = Arc::new(AtomicUsize::new(0));
    let seen = n.clone();
    let engine = HttpSink::start(move |_, _| {
        if seen.fetch_add(1, Ordering::SeqCst) < 2 {
            Reply::status(503)
        } else {
            Reply::status(202).body("{\"taskUid\": 1}")
        }
    })
    .await;
    let text = block_after("**Worked example: search indexing.**", "json")
        .replace("http://127.0.0.1:7700", &engine.url(""));
    let body: Value = serde_json::from_str(&text).unwrap();
    let (s, j) = w.post("/api/v1/jobs", body.clone()).await;
    assert_eq!(s, 201, "{j}");
    assert_eq!(j["max_attempts"], json!(10), "the default policy");
    let done = w
        .wait_job(j["id"].as_i64().unwrap(), |j| j["state"] == "completed")
        .await;
    assert_eq!(done["attempt"], json!(3), "{done}");
    let got = engine.received();
    assert_eq!(
        got.len(),
        3,
        "one request per attempt, no retries beneath the job layer"
    );
    for r in &got {
        assert_eq!(
            (r.method.as_str(), r.path.as_str()),
            ("POST", "/indexes/movies/documents?primaryKey=id")
        );
        assert_eq!(r.header("authorization"), Some("Bearer MEILI_MASTER_KEY"));
        let sent: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(
            sent, body["args"]["body"],
            "the same idempotent upsert every time"
        );
    }
}
