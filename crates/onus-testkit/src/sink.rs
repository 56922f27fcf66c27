//! HTTP sinks on loopback for tests: they answer as scripted and record what they received.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::connect_info::{ConnectInfo, Connected};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::serve::IncomingStream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// One request the sink received.
#[derive(Debug, Clone)]
pub struct Received {
    /// The request method (`POST`, ...).
    pub method: String,
    /// Path and query.
    pub path: String,
    /// Headers, lower-case names.
    pub headers: Vec<(String, String)>,
    /// The request body as received.
    pub body: Vec<u8>,
    /// How many requests were in flight at the sink, this one included.
    pub in_flight: usize,
    /// How many requests to this path (without its query) were in flight, this one included.
    pub in_flight_path: usize,
    /// How many requests to this path with this `webhook-id` (the same webhook delivery or push
    /// job; the path alone without one) were in flight, this one included: above 1, one job's
    /// attempts overlapped.
    pub in_flight_same: usize,
    /// When the sink received it.
    pub at: std::time::Instant,
}

impl Received {
    /// The path without its query.
    pub fn path_only(&self) -> &str {
        self.path.split('?').next().unwrap_or_default()
    }

    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// What the sink answers.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The status code to answer.
    pub status: u16,
    /// Extra headers.
    pub headers: Vec<(String, String)>,
    /// The body to answer with.
    pub body: String,
    /// Time to wait before answering (a slow endpoint).
    pub delay: Duration,
    /// Reset the connection (after `delay`) instead of answering: the client sees the connection
    /// torn down (TCP RST), never a status.
    pub reset: bool,
}

impl Reply {
    /// A status with an empty body.
    pub fn status(status: u16) -> Self {
        Reply {
            status,
            headers: Vec::new(),
            body: String::new(),
            delay: Duration::ZERO,
            reset: false,
        }
    }

    /// No answer: the connection is reset.
    pub fn reset() -> Self {
        Reply {
            reset: true,
            ..Reply::status(500)
        }
    }

    /// Adds a header.
    pub fn header(mut self, k: &str, v: &str) -> Self {
        self.headers.push((k.into(), v.into()));
        self
    }

    /// Sets the body.
    pub fn body(mut self, b: &str) -> Self {
        self.body = b.into();
        self
    }

    /// Answers after `d`.
    pub fn delay(mut self, d: Duration) -> Self {
        self.delay = d;
        self
    }
}

type Script = dyn Fn(&Received, usize) -> Reply + Send + Sync;

struct Inner {
    script: Box<Script>,
    log: Mutex<Vec<Received>>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    /// Per path: (in flight now, most ever in flight at once).
    paths: Mutex<HashMap<String, (usize, usize)>>,
    /// Per path and `webhook-id`: in flight now.
    same: Mutex<HashMap<String, usize>>,
}

/// Counts a request to one path in flight until dropped (also when the client goes away and the
/// handler is dropped mid-delay).
struct InFlight<'a> {
    inner: &'a Inner,
    path: String,
    same: String,
}

/// Counts of requests in flight when one arrived: at the sink, at its path, at its path with its
/// `webhook-id`.
struct Counts {
    all: usize,
    path: usize,
    same: usize,
}

impl InFlight<'_> {
    fn enter<'a>(inner: &'a Inner, path: String, id: Option<&str>) -> (InFlight<'a>, Counts) {
        let all = inner.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        inner.max_in_flight.fetch_max(all, Ordering::SeqCst);
        let mut paths = inner.paths.lock().unwrap_or_else(|e| e.into_inner());
        let e = paths.entry(path.clone()).or_default();
        e.0 += 1;
        e.1 = e.1.max(e.0);
        let here = e.0;
        drop(paths);
        let same = format!("{path} {}", id.unwrap_or_default());
        let mut m = inner.same.lock().unwrap_or_else(|e| e.into_inner());
        let n = m.entry(same.clone()).or_default();
        *n += 1;
        let same_now = *n;
        drop(m);
        let counts = Counts {
            all,
            path: here,
            same: same_now,
        };
        (InFlight { inner, path, same }, counts)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.inner.in_flight.fetch_sub(1, Ordering::SeqCst);
        let mut paths = self.inner.paths.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = paths.get_mut(&self.path) {
            e.0 -= 1;
        }
        drop(paths);
        let mut m = self.inner.same.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = m.get_mut(&self.same) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.same);
            }
        }
    }
}

/// A scripted HTTP server on a loopback address.
#[derive(Clone)]
pub struct HttpSink {
    inner: Arc<Inner>,
    addr: SocketAddr,
}

impl std::fmt::Debug for HttpSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpSink")
            .field("addr", &self.addr)
            .finish()
    }
}

async fn handle(
    State(inner): State<Arc<Inner>>,
    ConnectInfo(conn): ConnectInfo<Conn>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_string();
    let id = headers.get("webhook-id").and_then(|v| v.to_str().ok());
    let (_counted, counts) = InFlight::enter(&inner, path, id);
    let rec = Received {
        method: method.to_string(),
        path: uri
            .path_and_query()
            .map(|p| p.to_string())
            .unwrap_or_default(),
        headers: headers
            .iter()
            .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
            .collect(),
        body: body.to_vec(),
        in_flight: counts.all,
        in_flight_path: counts.path,
        in_flight_same: counts.same,
        at: std::time::Instant::now(),
    };
    let n = {
        let mut log = inner.log.lock().unwrap_or_else(|e| e.into_inner());
        log.push(rec.clone());
        log.len()
    };
    let reply = (inner.script)(&rec, n);
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await; // the endpoint is slow on purpose
    }
    if reply.reset {
        // The connection fails its next write (this answer's), so the server drops it, and with
        // a zero linger the close is a reset.
        conn.0.store(true, Ordering::SeqCst);
    }
    let mut resp = (
        StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        reply.body,
    )
        .into_response();
    for (k, v) in reply.headers {
        if let (Ok(k), Ok(v)) = (
            axum::http::HeaderName::from_bytes(k.as_bytes()),
            axum::http::HeaderValue::from_str(&v),
        ) {
            resp.headers_mut().insert(k, v);
        }
    }
    resp
}

/// A connection's reset switch, as a handler sees it.
#[derive(Clone)]
struct Conn(Arc<AtomicBool>);

impl Connected<IncomingStream<'_, Listener>> for Conn {
    fn connect_info(stream: IncomingStream<'_, Listener>) -> Self {
        Conn(stream.io().reset.clone())
    }
}

/// The sink's listener: every connection closes with a zero linger (a reset, if closed early)
/// and carries a switch that makes its writes fail.
struct Listener(tokio::net::TcpListener);

impl axum::serve::Listener for Listener {
    type Io = Io;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Io, SocketAddr) {
        loop {
            match self.0.accept().await {
                Ok((stream, peer)) => {
                    let _ = stream.set_zero_linger();
                    let _ = stream.set_nodelay(true);
                    let io = Io {
                        stream,
                        reset: Arc::default(),
                    };
                    return (io, peer);
                }
                // Out of descriptors, say: wait a little rather than spin.
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.0.local_addr()
    }
}

/// A sink connection: the socket, failing every write once its switch is on.
struct Io {
    stream: tokio::net::TcpStream,
    reset: Arc<AtomicBool>,
}

impl Io {
    /// Fails once the script asked for a reset.
    fn switched(&self) -> std::io::Result<()> {
        if self.reset.load(Ordering::SeqCst) {
            Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "reset by the sink's script",
            ))
        } else {
            Ok(())
        }
    }
}

impl AsyncRead for Io {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

/// Writes fail once switched (vectored writes fall back to `poll_write`, so they do too).
impl AsyncWrite for Io {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.switched()?;
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.switched()?;
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

impl HttpSink {
    /// Starts a sink on `127.0.0.1` (any free port); `script(request, n)` answers the n-th request
    /// (from 1).
    pub async fn start(
        script: impl Fn(&Received, usize) -> Reply + Send + Sync + 'static,
    ) -> HttpSink {
        Self::start_on("127.0.0.1:0", script).await
    }

    /// Starts a sink on a given loopback address.
    pub async fn start_on(
        addr: &str,
        script: impl Fn(&Received, usize) -> Reply + Send + Sync + 'static,
    ) -> HttpSink {
        let inner = Arc::new(Inner {
            script: Box::new(script),
            log: Mutex::new(Vec::new()),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            paths: Mutex::default(),
            same: Mutex::default(),
        });
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .unwrap_or_else(|e| panic!("cannot bind {addr}: {e}"));
        let local = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(inner.clone())
            .into_make_service_with_connect_info::<Conn>();
        tokio::spawn(async move {
            let _ = axum::serve(Listener(listener), app).await;
        });
        HttpSink { inner, addr: local }
    }

    /// `http://127.0.0.1:PORT` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every request so far.
    pub fn received(&self) -> Vec<Received> {
        self.inner
            .log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// How many requests so far.
    pub fn count(&self) -> usize {
        self.inner
            .log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// The most requests ever in flight at once.
    pub fn max_in_flight(&self) -> usize {
        self.inner.max_in_flight.load(Ordering::SeqCst)
    }

    /// Per path (without its query), the most requests ever in flight at once.
    pub fn max_in_flight_by_path(&self) -> HashMap<String, usize> {
        self.inner
            .paths
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(p, (_, max))| (p.clone(), *max))
            .collect()
    }
}

/// A loopback listener that accepts and counts connections, to prove that none was made.
#[derive(Debug, Clone)]
pub struct ConnCounter {
    peers: Arc<Mutex<Vec<SocketAddr>>>,
    addr: SocketAddr,
}

impl ConnCounter {
    /// Listens on `addr` (a loopback address); `None` if it cannot be bound here (no IPv6, say).
    pub async fn start(addr: &str) -> Option<ConnCounter> {
        let listener = tokio::net::TcpListener::bind(addr).await.ok()?;
        let local = listener.local_addr().ok()?;
        let peers = Arc::new(Mutex::new(Vec::new()));
        let p = peers.clone();
        tokio::spawn(async move {
            while let Ok((_sock, peer)) = listener.accept().await {
                p.lock().unwrap_or_else(|e| e.into_inner()).push(peer);
            }
        });
        Some(ConnCounter { peers, addr: local })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections accepted before now, made certain by connecting once more and waiting until
    /// that probe is accepted (accepts are in order, so every earlier connection is in by then).
    pub async fn settled_count(&self) -> usize {
        let Ok(probe) = tokio::net::TcpStream::connect(self.addr).await else {
            return self.peers.lock().unwrap_or_else(|e| e.into_inner()).len();
        };
        let me = probe.local_addr().ok();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let peers = self.peers.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if let Some(i) = peers.iter().position(|p| Some(*p) == me) {
                return i;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the probe connection was never accepted"
            );
            tokio::task::yield_now().await;
        }
    }
}
