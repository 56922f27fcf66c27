//! Webhook secrets encrypted at rest: plaintext ones encrypted at the first start with a key,
//! deliveries still signed with the secret itself, another key refused at start, re-encryption.

use onus_testkit::sink::{HttpSink, Received, Reply};
use serde_json::json;

use crate::harness::{verifies, World, CONFIG};

async fn stored(w: &World, id: &str) -> Vec<String> {
    w.parts.webhooks.endpoint(id).await.unwrap().secrets
}

async fn delivered(w: &World, sink: &HttpSink, event: &str) -> Received {
    w.post(
        "/api/v1/events",
        json!({"type": "t", "payload": {}, "id": event}),
    )
    .await;
    w.wait_get(&format!("/api/v1/events/{event}/deliveries"), |v| {
        v["deliveries"][0]["state"] == "completed"
    })
    .await;
    sink.received()
        .into_iter()
        .find(|r| r.header("webhook-id") == Some(event))
        .unwrap()
}

pub async fn secrets_are_encrypted_at_rest_once_a_key_is_configured(w: World) {
    let sink = HttpSink::start(|_, _| Reply::status(200)).await;
    let (_, e) = w
        .post("/api/v1/endpoints", json!({"url": sink.url("/x")}))
        .await;
    let id = e["id"].as_str().unwrap().to_string();
    let secret = e["secret"].as_str().unwrap().to_string();
    assert_eq!(
        stored(&w, &id).await,
        vec![secret.clone()],
        "no key: stored as it is"
    );

    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key");
    let other = dir.path().join("other");
    std::fs::write(&key, onus_webhooks::crypto::Key::generate()).unwrap();
    std::fs::write(&other, onus_webhooks::crypto::Key::generate()).unwrap();
    let with =
        |path: &std::path::Path| format!("encryption_key_file = '{}'\n{CONFIG}", path.display());

    // The first start with a key encrypts what is stored; deliveries sign with the secret itself,
    // and the API token (kept in the database too) still opens the API.
    let token = w.token.clone();
    let w = w.restart(&with(&key)).await.unwrap();
    assert_eq!(w.token, token, "the token is opened with the key");
    assert_eq!(w.get("/api/v1/kinds").await.0, 200);
    let at_rest = stored(&w, &id).await;
    assert!(
        at_rest[0].starts_with("enc:v1:") && !at_rest[0].contains(&secret[6..]),
        "{at_rest:?}"
    );
    assert!(verifies(&secret, &delivered(&w, &sink, "e1").await));
    let (_, r) = w
        .post(&format!("/api/v1/endpoints/{id}/rotate-secret"), json!({}))
        .await;
    let newer = r["secret"].as_str().unwrap().to_string();
    assert!(stored(&w, &id)
        .await
        .iter()
        .all(|s| s.starts_with("enc:v1:")));
    let got = delivered(&w, &sink, "e2").await;
    assert!(
        verifies(&newer, &got) && verifies(&secret, &got),
        "signed with both during the switch"
    );

    // Another key cannot open them: the start is refused, saying so.
    let err = w.restart(&with(&other)).await.err().expect("refused");
    assert!(
        err.contains("does not decrypt with the configured encryption key"),
        "{err}"
    );
}

pub async fn secrets_are_re_encrypted_under_a_new_key(w: World) {
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = (
        onus_webhooks::crypto::Key::generate(),
        onus_webhooks::crypto::Key::generate(),
    );
    let (old_file, new_file) = (dir.path().join("old"), dir.path().join("new"));
    std::fs::write(&old_file, &old).unwrap();
    std::fs::write(&new_file, &new).unwrap();
    let with =
        |path: &std::path::Path| format!("encryption_key_file = '{}'\n{CONFIG}", path.display());
    let w = w.restart(&with(&old_file)).await.unwrap();
    let sink = HttpSink::start(|_, _| Reply::status(200)).await;
    let (_, e) = w
        .post("/api/v1/endpoints", json!({"url": sink.url("/x")}))
        .await;
    let secret = e["secret"].as_str().unwrap().to_string();
    let key = onus_webhooks::crypto::Key::from_base64(&new).unwrap();
    assert_eq!(w.parts.reencrypt(&key).await.unwrap().0, 1);
    let w = w.restart(&with(&new_file)).await.unwrap();
    assert!(verifies(&secret, &delivered(&w, &sink, "after").await));
}
