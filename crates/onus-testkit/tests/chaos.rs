//! The chaos sink: the same seed answers each path the same way, every behaviour of the default
//! mix occurs, a reset reaches the client as a torn-down connection, and concurrency is counted
//! per path. All on loopback.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::collections::HashSet;
use std::time::Duration;

use onus_testkit::chaos::{Behaviour, Chaos, Mix};

/// Waits until `f` holds, for at most 10 s.
async fn until(what: &str, f: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[test]
fn the_same_seed_answers_each_path_the_same_way() {
    let (a, b, c) = (Chaos::new(7), Chaos::new(7), Chaos::new(8));
    let paths = ["/e/1", "/e/2", "/tenant/x/e/3"];
    let draws = |ch: &Chaos| -> Vec<Behaviour> {
        paths
            .iter()
            .flat_map(|p| (1..=200).map(move |n| (*p, n)))
            .map(|(p, n)| ch.behaviour(p, n))
            .collect()
    };
    assert_eq!(draws(&a), draws(&b), "one seed, one sequence per path");
    assert_ne!(draws(&a), draws(&c), "another seed, another sequence");
    assert_ne!(
        (1..=50).map(|n| a.behaviour("/e/1", n)).collect::<Vec<_>>(),
        (1..=50).map(|n| a.behaviour("/e/2", n)).collect::<Vec<_>>(),
        "paths draw apart"
    );
    // Every behaviour of the default mix occurs.
    let seen: HashSet<String> = (1..=3000)
        .map(|n| format!("{:?}", a.behaviour("/e/1", n)))
        .map(|s| s.split('(').next().unwrap().to_string())
        .collect();
    for b in [
        "Ok",
        "ServerError",
        "RequestTimeout",
        "TooMany",
        "TooManyAfter",
        "UnavailableAfter",
        "Gone",
        "Hang",
        "Reset",
        "Slow",
    ] {
        assert!(seen.contains(b), "{b} never drawn in 3000: {seen:?}");
    }
    // A rule wins over the default mix for its prefix only.
    let ruled = Chaos::new(1).rule("/dead/", Mix::only(Behaviour::Reset));
    assert!((1..=100).all(|n| ruled.behaviour("/dead/1", n) == Behaviour::Reset));
    assert!((1..=100).any(|n| ruled.behaviour("/alive/1", n) != Behaviour::Reset));
}

#[tokio::test]
async fn answers_reach_the_client_as_drawn_and_every_request_is_recorded() {
    let sink = Chaos::new(3)
        .rule("/reset/", Mix::only(Behaviour::Reset))
        .rule("/limited/", Mix::only(Behaviour::TooManyAfter(7)))
        .rule("/gone/", Mix::only(Behaviour::Gone))
        .otherwise(Mix::only(Behaviour::Ok))
        .start()
        .await;
    let http = reqwest::Client::new();
    let post = |path: &str| {
        http.post(sink.url(path))
            .header("webhook-id", format!("msg_{path}"))
            .body(format!("body of {path}"))
            .send()
    };

    let err = post("/reset/1").await.unwrap_err();
    assert!(err.status().is_none(), "a reset has no status: {err:?}");
    let limited = post("/limited/1").await.unwrap();
    assert_eq!(limited.status(), 429);
    assert_eq!(limited.headers()["retry-after"], "7");
    assert_eq!(post("/gone/1").await.unwrap().status(), 410);
    // The sink keeps serving on new connections after a reset.
    assert_eq!(post("/fine/1").await.unwrap().status(), 200);
    assert!(post("/reset/2").await.is_err());

    let got = sink.received();
    let paths: Vec<&str> = got.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(
        paths,
        ["/reset/1", "/limited/1", "/gone/1", "/fine/1", "/reset/2"]
    );
    for r in &got {
        assert_eq!(
            r.header("webhook-id"),
            Some(format!("msg_{}", r.path).as_str())
        );
        assert_eq!(r.body, format!("body of {}", r.path).into_bytes());
    }
    assert!(got.windows(2).all(|w| w[0].at <= w[1].at), "times in order");
}

#[tokio::test]
async fn concurrency_is_counted_per_path() {
    let sink = Chaos::new(5)
        .otherwise(Mix::only(Behaviour::Hang(Duration::from_secs(3600))))
        .start()
        .await;
    let http = reqwest::Client::new();
    let mut calls = Vec::new();
    // Two of the three requests to /a carry one webhook-id: one job's attempts overlapping.
    for (path, id) in [
        ("/a", "msg_1"),
        ("/a", "msg_2"),
        ("/a", "msg_1"),
        ("/b", "msg_1"),
    ] {
        let req = http.post(sink.url(path)).header("webhook-id", id).body("x");
        calls.push(tokio::spawn(async move { req.send().await }));
    }
    until("four requests in", || sink.count() == 4).await;
    let by_path = sink.max_in_flight_by_path();
    assert_eq!(by_path.get("/a"), Some(&3), "{by_path:?}");
    assert_eq!(by_path.get("/b"), Some(&1), "{by_path:?}");
    assert_eq!(sink.max_in_flight(), 4);
    let last_a = sink
        .received()
        .into_iter()
        .filter(|r| r.path == "/a")
        .map(|r| r.in_flight_path)
        .max();
    assert_eq!(last_a, Some(3));
    let same: Vec<(String, usize)> = sink
        .received()
        .into_iter()
        .map(|r| {
            let id = r.header("webhook-id").unwrap_or_default().to_string();
            (format!("{} {id}", r.path), r.in_flight_same)
        })
        .collect();
    let most = |key: &str| same.iter().filter(|(k, _)| k == key).map(|(_, n)| *n).max();
    assert_eq!(most("/a msg_1"), Some(2), "{same:?}");
    assert_eq!(most("/a msg_2"), Some(1), "{same:?}");
    assert_eq!(most("/b msg_1"), Some(1), "{same:?}");
    for c in calls {
        c.abort();
    }
}
