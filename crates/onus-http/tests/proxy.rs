//! Proxies named in the environment are ignored. In a test binary of its own: it changes the
//! process environment, which no other test may read at the same time.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::time::Duration;

use onus_http::{Class, HttpClient, HttpConfig, Request};
use onus_testkit::sink::{ConnCounter, HttpSink, Reply};

#[tokio::test]
async fn proxies_from_the_environment_are_ignored() {
    let proxy = ConnCounter::start("127.0.0.1:0").await.unwrap();
    let s = HttpSink::start(|_, _| Reply::status(200)).await;
    let p = format!("http://{}", proxy.addr());
    for var in ["HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"] {
        // Set before the client is built; no other test runs in this binary.
        unsafe_env_set(var, &p);
    }
    let c = HttpClient::new(&HttpConfig {
        allow_networks: vec!["127.0.0.1/32".into()],
        ..HttpConfig::default()
    })
    .unwrap();
    let sent = c
        .send(
            &Request {
                method: "GET".into(),
                url: s.url("/ok"),
                headers: vec![],
                body: None,
            },
            chrono::Utc::now(),
            Duration::ZERO,
        )
        .await;
    assert_eq!(sent.class, Class::Success);
    assert_eq!(proxy.settled_count().await, 0, "the proxy saw nothing");
}

fn unsafe_env_set(k: &str, v: &str) {
    // Edition 2021: setting the environment is safe to call; tests here do not read it concurrently.
    std::env::set_var(k, v);
}
