//! Hostile clients at the front door: slow and silent ones, floods of idle connections, oversized
//! headers, bodies that stall, deeply nested JSON and invalid UTF-8 each get a clear 4xx or a
//! closed connection, and the server keeps answering everyone else.

use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::harness::World;

const LIMITS: &str = "header_timeout = \"300ms\"\nbody_timeout = \"300ms\"\nmax_connections = 16\n";

/// Reads what the server sends until it closes the connection (at most 10 s: a connection still
/// open then fails the test); the status of its answer, if it answered.
async fn until_closed(mut s: TcpStream) -> Option<u16> {
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => panic!(
                "the server kept the connection open for 10 s; it sent {:?}",
                String::from_utf8_lossy(&got)
            ),
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&got);
    text.strip_prefix("HTTP/1.1 ")
        .and_then(|t| t.get(..3))
        .and_then(|c| c.parse().ok())
}

/// Sends `head` and `body` as they are, then lets the server answer (the connection is asked to
/// close after the answer).
async fn exchange(w: &World, head: &str, body: &[u8]) -> (u16, Value) {
    let addr = w.base.trim_start_matches("http://").to_string();
    let mut s = TcpStream::connect(&addr).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    let text = String::from_utf8_lossy(&got).to_string();
    let status = text[9..12].parse().unwrap();
    let json = text
        .split("\r\n\r\n")
        .nth(1)
        .and_then(|b| serde_json::from_str(b).ok())
        .unwrap_or(Value::Null);
    (status, json)
}

fn post_head(w: &World, len: usize) -> String {
    format!(
        "POST /api/v1/jobs HTTP/1.1\r\nHost: onus\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n",
        w.token
    )
}

pub async fn hostile_clients_get_a_clear_4xx_or_a_closed_connection(w: World) {
    let w = crate::harness::api_with(w.backend, LIMITS).await;
    let addr = w.base.trim_start_matches("http://").to_string();

    // Silent and slow clients are closed after the header timeout: more of them than
    // max_connections, so a server that kept them would have no room left for anyone else.
    let mut idle = Vec::new();
    for i in 0..40 {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        if i % 2 == 0 {
            // Half a request line, then nothing.
            s.write_all(b"GET /api/v1/jobs HTTP/1.1\r\nHost: on")
                .await
                .unwrap();
        }
        idle.push(tokio::spawn(until_closed(s)));
    }
    for t in idle {
        let status = t.await.unwrap();
        assert!(
            status.is_none() || status.is_some_and(|s| (400..500).contains(&s)),
            "a silent client gets a 4xx or just a closed connection, not {status:?}"
        );
    }
    let (s, h) = w.raw("GET", "/healthz", None, None).await;
    assert_eq!(s, 200, "still answering after the flood: {h}");

    // A body that stops arriving: 408, saying which setting.
    let addr2 = addr.clone();
    let mut s = TcpStream::connect(&addr2).await.unwrap();
    s.write_all(post_head(&w, 100).as_bytes()).await.unwrap();
    s.write_all(b"{\"kind\": \"echo\",").await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("body_timeout"), "{text}");

    // Headers far over the library's limit: 431 or a closed connection, never a crash.
    let mut s = TcpStream::connect(&addr).await.unwrap();
    let huge = format!(
        "GET /healthz HTTP/1.1\r\nHost: onus\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(1 << 20)
    );
    let _ = s.write_all(huge.as_bytes()).await; // the server may close before it is all sent
    let status = until_closed(s).await;
    assert!(
        status.is_none() || status == Some(431),
        "oversized headers: {status:?}"
    );

    // Deeply nested JSON: a 400 that says so, not a stack overflow.
    let nested = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let body = nested.into_bytes();
    let (s, e) = exchange(&w, &post_head(&w, body.len()), &body).await;
    assert_eq!(s, 400, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not valid JSON"),
        "{e}"
    );

    // Invalid UTF-8: a 400 naming it.
    let body = b"{\"kind\": \"echo\", \"args\": {\"x\": \"\xff\xfe\"}}".to_vec();
    let (s, e) = exchange(&w, &post_head(&w, body.len()), &body).await;
    assert_eq!(s, 400, "{e}");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("UTF-8"),
        "{e}"
    );

    // Nothing of that was inserted, and the server is fine.
    let (s, list) = w.get("/api/v1/jobs").await;
    assert_eq!(s, 200);
    assert_eq!(list["jobs"].as_array().map(Vec::len), Some(0), "{list}");
    let (s, _) = w.raw("GET", "/healthz", None, None).await;
    assert_eq!(s, 200);
}
