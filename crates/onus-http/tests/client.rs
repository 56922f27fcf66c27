//! The client against real HTTP servers on loopback. Refused destinations are loopback addresses
//! left off the allow-list: no packet ever goes to any other address.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::time::Duration;

use onus_http::{CallError, Class, HttpClient, HttpConfig, Request};
use onus_testkit::sink::{ConnCounter, HttpSink, Reply};

fn client() -> HttpClient {
    HttpClient::new(&HttpConfig {
        timeout: Duration::from_millis(500),
        allow_networks: vec!["127.0.0.1/32".into()],
        ..HttpConfig::default()
    })
    .unwrap()
}

fn get(url: &str) -> Request {
    Request {
        method: "GET".into(),
        url: url.into(),
        headers: vec![],
        body: None,
    }
}

fn now() -> onus::Timestamp {
    chrono::Utc::now()
}

async fn sink() -> HttpSink {
    HttpSink::start(|r, _| match r.path.as_str() {
        "/ok" => Reply::status(200).body("fine"),
        "/fail" => Reply::status(500),
        "/missing" => Reply::status(404),
        "/gone" => Reply::status(410),
        "/redirect" => Reply::status(301).header("location", "/target"),
        "/target" => Reply::status(200),
        "/busy" => Reply::status(429).header("retry-after", "2"),
        "/slow" => Reply::status(200).delay(Duration::from_secs(3)),
        "/ua" => Reply::status(200).body(r.header("user-agent").unwrap_or("")),
        _ => Reply::status(404),
    })
    .await
}

#[tokio::test]
async fn one_attempt_classified_once() {
    let s = sink().await;
    let c = client();
    let cap = Duration::from_secs(36_000);
    let sent = c.send(&get(&s.url("/ok")), now(), cap).await;
    assert_eq!(
        (sent.class.clone(), sent.status, sent.excerpt.as_str()),
        (Class::Success, Some(200), "fine")
    );
    assert!(matches!(
        c.send(&get(&s.url("/fail")), now(), cap).await.class,
        Class::Retryable(_)
    ));
    assert!(matches!(
        c.send(&get(&s.url("/missing")), now(), cap).await.class,
        Class::Permanent(_)
    ));
    assert!(matches!(
        c.send(&get(&s.url("/gone")), now(), cap).await.class,
        Class::Permanent(_)
    ));
    let t = now();
    match c.send(&get(&s.url("/busy")), t, cap).await.class {
        Class::Snooze { until, .. } => assert_eq!(until, t + chrono::TimeDelta::seconds(2)),
        other => panic!("{other:?}"),
    }
    // Redirects are not followed: a 3xx is a retryable answer, and the target never sees a request.
    assert!(matches!(
        c.send(&get(&s.url("/redirect")), now(), cap).await.class,
        Class::Retryable(_)
    ));
    assert!(s.received().iter().all(|r| r.path != "/target"));
    // A timeout is retryable.
    let slow = c.send(&get(&s.url("/slow")), now(), cap).await;
    assert!(
        matches!(slow.class, Class::Retryable(_)),
        "{:?}",
        slow.class
    );
    assert!(slow.error.unwrap().contains("timed out"));
    // Every call names Onus.
    let ua = c.send(&get(&s.url("/ua")), now(), cap).await;
    assert!(ua.excerpt.starts_with("onus/"), "{}", ua.excerpt);
    // Exactly one request per call, no retries by the client.
    assert_eq!(s.count(), 8);
}

#[tokio::test]
async fn a_connection_failure_is_retryable() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let sent = client()
        .send(
            &get(&format!("http://127.0.0.1:{closed}/")),
            now(),
            Duration::ZERO,
        )
        .await;
    assert!(
        matches!(sent.class, Class::Retryable(_)),
        "{:?}",
        sent.class
    );
}

#[tokio::test]
async fn refused_destinations_send_nothing() {
    let v4 = ConnCounter::start("127.0.0.2:0").await.unwrap();
    let port = v4.addr().port();
    let v6 = ConnCounter::start(&format!("[::1]:{port}")).await;
    let c = client();
    for url in [
        format!("http://127.0.0.2:{port}/hook"),
        format!("http://[::1]:{port}/hook"),
        format!("http://localhost:{port}/hook"),
        format!("http://2130706434:{port}/hook"),
        format!("http://0x7f000002:{port}/hook"),
        format!("http://0177.0.0.2:{port}/hook"),
        format!("http://[::ffff:127.0.0.2]:{port}/hook"),
    ] {
        let sent = c.send(&get(&url), now(), Duration::ZERO).await;
        assert!(
            matches!(sent.class, Class::Permanent(_)),
            "{url}: {:?}",
            sent.class
        );
        assert!(
            sent.blocked.is_some() && !sent.attempted,
            "{url}: nothing sent"
        );
        match c.call_once(&get(&url), Duration::from_millis(200)).await {
            Err(CallError::Blocked(_)) => {}
            other => panic!("{url}: {other:?}"),
        }
    }
    assert_eq!(
        v4.settled_count().await,
        0,
        "no connection reached 127.0.0.2"
    );
    if let Some(v6) = v6 {
        assert_eq!(v6.settled_count().await, 0, "no connection reached ::1");
    }
}

#[tokio::test]
async fn a_name_resolving_to_a_refused_address_is_refused_at_resolution() {
    // `localhost.` with the trailing dot is refused by name; a name from /etc/hosts is resolved
    // and refused by address. `ip6-localhost` exists in Debian's /etc/hosts.
    let v4 = ConnCounter::start("127.0.0.1:0").await.unwrap();
    let c = HttpClient::new(&HttpConfig::default()).unwrap(); // nothing allowed
    let hosts = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
    let name = ["ip6-localhost", "ip6-loopback"]
        .into_iter()
        .find(|n| hosts.contains(n));
    if let Some(name) = name {
        let sent = c
            .send(
                &get(&format!("http://{name}:{}/", v4.addr().port())),
                now(),
                Duration::ZERO,
            )
            .await;
        assert!(sent.blocked.is_some(), "{name}: {:?}", sent);
    }
    let sent = c
        .send(
            &get(&format!("http://127.0.0.1:{}/", v4.addr().port())),
            now(),
            Duration::ZERO,
        )
        .await;
    assert!(sent.blocked.is_some());
    assert_eq!(v4.settled_count().await, 0);
}

#[tokio::test]
async fn call_once_answers_at_once_and_never_retries() {
    let s = sink().await;
    let c = client();
    match c
        .call_once(&get(&s.url("/fail")), Duration::from_millis(300))
        .await
    {
        Err(CallError::Unavailable(m)) => assert!(m.contains("500"), "{m}"),
        other => panic!("{other:?}"),
    }
    match c
        .call_once(&get(&s.url("/busy")), Duration::from_millis(300))
        .await
    {
        Err(CallError::Unavailable(m)) => assert!(m.contains("429"), "{m}"),
        other => panic!("{other:?}"),
    }
    match c
        .call_once(&get(&s.url("/slow")), Duration::from_millis(100))
        .await
    {
        Err(CallError::Unavailable(_)) => {}
        other => panic!("{other:?}"),
    }
    match c
        .call_once(&get(&s.url("/missing")), Duration::from_millis(300))
        .await
    {
        Err(CallError::Rejected(m)) => assert!(m.contains("404")),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        c.call_once(&get(&s.url("/ok")), Duration::from_millis(300))
            .await
            .unwrap(),
        (200, "fine".into())
    );
    assert_eq!(s.count(), 5, "one request per call");
    match c
        .call_once(&get("ftp://127.0.0.1/x"), Duration::from_millis(300))
        .await
    {
        Err(CallError::Invalid(m)) => assert!(m.contains("scheme")),
        other => panic!("{other:?}"),
    }
}

/// An endpoint that answers with a body of 4 GiB (and would send it all) is read only as far as
/// the excerpt: the call ends with its 1 KiB, and the endpoint could write no more than what the
/// sockets' buffers hold before the client hung up.
#[tokio::test]
async fn a_gigabyte_answer_is_cut_at_the_excerpt_without_being_read_whole() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        let mut b = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut b).await.unwrap();
            assert!(n > 0, "the request never ended");
            head.extend_from_slice(&b[..n]);
        }
        s.write_all(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4294967296\r\n\r\n")
            .await
            .unwrap();
        let chunk = vec![b'x'; 64 * 1024];
        let mut sent = 0usize;
        // Until the client goes away (or, if it never did, the whole 4 GiB).
        while sent < (4usize << 30) {
            match s.write_all(&chunk).await {
                Ok(()) => sent += chunk.len(),
                Err(_) => break,
            }
        }
        sent
    });
    let c = client();
    let sent = c
        .send(
            &get(&format!("http://{addr}/huge")),
            now(),
            Duration::from_secs(36_000),
        )
        .await;
    assert_eq!(sent.status, Some(500));
    assert!(
        sent.excerpt.len() <= onus_http::EXCERPT_BYTES && sent.excerpt.starts_with("xxxx"),
        "{} bytes of excerpt",
        sent.excerpt.len()
    );
    let written = tokio::time::timeout(Duration::from_secs(20), server)
        .await
        .expect("the client hung up instead of reading on")
        .unwrap();
    assert!(
        written < 64 << 20,
        "the endpoint wrote {written} bytes before the client hung up"
    );
}
