//! The HTTP server's front door: accepts connections and serves the API and the panel on them,
//! with limits no client can talk its way around. A client gets `header_timeout` to send a
//! request's headers (a slow or silent client, or an idle keep-alive connection, is closed after
//! it); a request body gets `body_timeout` between bytes (then 408); at most `max_connections`
//! are served at once (more wait in the kernel's listen queue instead of each costing a task and
//! buffers here). Header size is bounded by the HTTP library (431 beyond its limit), body size by
//! `body_limit` (413).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::ServiceExt as _;

use crate::api::Limits;

/// Serves `router` on `listener` until `shutdown` resolves, then lets the requests in flight end
/// (the caller bounds how long it waits).
pub(crate) async fn serve(
    listener: TcpListener,
    router: axum::Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // HTTP/1.1 only: protocol detection would wait for a silent client's first bytes with no
    // timeout at all (plain-text HTTP/2 needs prior knowledge, which no client of the API uses).
    let mut builder = Builder::new(TokioExecutor::new()).http1_only();
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let graceful = GracefulShutdown::new();
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let ended = Arc::new(tokio::sync::Notify::new());
    let mut shutdown = std::pin::pin!(shutdown);
    // Saturation is logged at most once a minute.
    let mut warned: Option<tokio::time::Instant> = None;
    loop {
        let permit = match permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                if warned.is_none_or(|w| w.elapsed() >= Duration::from_secs(60)) {
                    warned = Some(tokio::time::Instant::now());
                    tracing::warn!(
                        max_connections = limits.max_connections,
                        "every connection slot is taken; new connections wait to be accepted"
                    );
                }
                tokio::select! {
                    p = permits.clone().acquire_owned() => match p {
                        Ok(p) => p,
                        Err(_) => break,
                    },
                    _ = &mut shutdown => break,
                }
            }
        };
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // Out of file descriptors, say: the error is the system's, not a client's.
                    // Accept again once a connection ends (which frees one), or after 50 ms.
                    tracing::warn!(error = %e, "cannot accept a connection; waiting for one to end");
                    drop(permit);
                    let _ = tokio::time::timeout(Duration::from_millis(50), ended.notified()).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let svc = router.clone().map_request(
            move |mut req: axum::http::Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(ConnectInfo::<SocketAddr>(peer));
                req.map(axum::body::Body::new)
            },
        );
        let conn = builder
            .serve_connection(TokioIo::new(stream), TowerToHyperService::new(svc))
            .into_owned();
        let conn = graceful.watch(conn);
        let ended = ended.clone();
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(permit);
            ended.notify_one();
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
