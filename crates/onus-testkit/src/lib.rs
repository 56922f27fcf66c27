//! Throwaway services for tests and benchmarks.
//!
//! - [`Backend`], [`TestDb`] and [`both!`]: the backend matrix every component's tests run on.
//! - [`PgCluster`]: a private PostgreSQL server.
//! - [`sink::HttpSink`]: a scripted HTTP server on loopback that records every request.
//! - [`sink::ConnCounter`]: a loopback listener that only counts connections.
//! - [`TcpProxy`]: a loopback TCP proxy that can freeze its connections.
//! - [`chaos::Chaos`]: a sink answering at random from a seed, every way an endpoint misbehaves.
//! - [`SmallDisk`]: a tmpfs of a fixed size, to fill up on purpose.
//!
//! [`PgCluster`] starts a private PostgreSQL server from the binaries installed on the machine
//! (`pg_config --bindir`, or Debian's `/usr/lib/postgresql/<version>/bin`), on a temporary
//! directory and a free loopback port, with the server's normal durable settings (fsync and
//! synchronous commit on). When run as root it runs the server as the `postgres` user, since
//! `initdb` refuses root. The cluster is stopped and its directory removed when the
//! [`PgCluster`] is dropped, and by a watchdog if the process dies first.

pub mod backend;
pub mod chaos;
pub mod disk;
mod postgres;
pub mod proxy;
pub mod python;
pub mod sink;
pub mod smtp;

pub use backend::{Backend, TestDb, WriteLock};
pub use disk::SmallDisk;
pub use postgres::{bindir, make_certificates, PgCluster, PgError};
pub use proxy::TcpProxy;

/// Waits until `f` returns true, checking every 2 ms, and panics naming `what` once `within` has
/// passed: tests wait on conditions with a deadline, never for a fixed time.
pub async fn wait_until<F, Fut>(what: &str, within: std::time::Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    while !f().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never happened within {within:?}: {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
}
