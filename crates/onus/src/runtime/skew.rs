//! Clock skew between this process and the database.
//!
//! Leases are written with one machine's clock and compared with another's, so clocks that
//! disagree can rescue a job that is still running. Each process measures its offset to the
//! database's clock (a read for measurement only: decisions still use the [`Clock`]) at start and
//! with every rescue pass, warns above [`WARN_ABOVE`], shortens its own fence by the offset (a
//! process whose clock runs behind writes leases that run out early), and while its offset
//! (with the measurement's uncertainty) exceeds a fifth of a lease neither rescues (its rescues
//! could take jobs whose holders are alive) nor claims (its leases would be misread).
//!
//! [`Clock`]: crate::Clock

use std::sync::Mutex;
use std::time::Duration;

use chrono::TimeDelta;

use super::Shared;

/// Offsets above this are logged as a warning: keep clocks in sync (NTP).
pub const WARN_ABOVE: Duration = Duration::from_secs(1);

/// How long one measurement may take before it is given up.
const MEASURE_TIMEOUT: Duration = Duration::from_secs(5);

/// One measurement: the database's clock minus this process's, and how unsure it is (half the
/// round trip).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reading {
    pub(crate) offset: TimeDelta,
    pub(crate) uncertainty: Duration,
}

impl Reading {
    /// The most this process's clock may be off, either way.
    pub(crate) fn worst(&self) -> Duration {
        self.offset
            .abs()
            .to_std()
            .unwrap_or(Duration::MAX)
            .saturating_add(self.uncertainty)
    }
}

/// The latest reading, and whether the last one was reported.
#[derive(Debug)]
pub(crate) struct Skew {
    latest: Mutex<Option<Reading>>,
    warned: std::sync::atomic::AtomicBool,
    refusing: std::sync::atomic::AtomicBool,
    /// Becomes true once the first measurement was tried (whatever its outcome).
    tried: tokio::sync::watch::Sender<bool>,
}

impl Default for Skew {
    fn default() -> Self {
        Skew {
            latest: Mutex::default(),
            warned: Default::default(),
            refusing: Default::default(),
            tried: tokio::sync::watch::Sender::new(false),
        }
    }
}

impl Skew {
    /// Resolves once the first measurement was tried.
    pub(crate) async fn measured(&self) {
        let _ = self.tried.subscribe().wait_for(|t| *t).await;
    }

    /// Whether the first measurement was tried.
    pub(crate) fn tried(&self) -> bool {
        *self.tried.borrow()
    }

    /// [`Skew::within_bound`], measuring first when no measurement was tried yet (a runtime
    /// that has not started its workers, or a call that came before their first reading).
    pub(crate) async fn within_bound_now(shared: &Shared) -> bool {
        if !shared.skew.tried() {
            Self::measure(shared).await;
        }
        Self::within_bound(shared)
    }

    pub(crate) fn latest(&self) -> Option<Reading> {
        *self.latest.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The largest offset at which this process still rescues: a fifth of a lease.
    pub(crate) fn rescue_bound(shared: &Shared) -> Duration {
        shared.options.lease_ttl / 5
    }

    /// Measures the offset now (no-op for a clock not meant to agree with the database's, such
    /// as a manual clock in tests).
    pub(crate) async fn measure(shared: &Shared) {
        let r = Self::read(shared).await;
        shared.skew.tried.send_replace(true);
        let Some(reading) = r else {
            return;
        };
        *shared.skew.latest.lock().unwrap_or_else(|e| e.into_inner()) = Some(reading);
        use std::sync::atomic::Ordering::Relaxed;
        let off = reading.offset.abs().to_std().unwrap_or(Duration::MAX);
        let secs = reading.offset.num_milliseconds() as f64 / 1000.0;
        if off > WARN_ABOVE {
            if !shared.skew.warned.swap(true, Relaxed) {
                tracing::warn!(
                    offset_s = secs,
                    "this machine's clock is {:.1} s {} the database's; keep clocks in sync (NTP)",
                    secs.abs(),
                    if secs > 0.0 { "behind" } else { "ahead of" }
                );
            }
        } else if shared.skew.warned.swap(false, Relaxed) {
            tracing::info!(
                offset_s = secs,
                "this machine's clock agrees with the database's again"
            );
        }
    }

    /// One reading: the database's time against this clock's at the middle of the query's round
    /// trip (a wait for a pooled connection does not count).
    async fn read(shared: &Shared) -> Option<Reading> {
        if !shared.clock.compare_with_database() {
            return None;
        }
        let t = match tokio::time::timeout(MEASURE_TIMEOUT, shared.store.database_time()).await {
            Ok(Ok(t)) => t,
            _ => return None, // unreachable: the previous reading stands
        };
        let local = crate::clock::sub(
            shared.clock.now(),
            t.answered.elapsed().saturating_add(t.round_trip / 2),
        );
        Some(Reading {
            offset: t.at - local,
            uncertainty: t.round_trip / 2,
        })
    }

    /// Whether this process's clock is within the bound (or not measured yet).
    pub(crate) fn within_bound(shared: &Shared) -> bool {
        let bound = Self::rescue_bound(shared);
        shared.skew.latest().is_none_or(|r| r.worst() <= bound)
    }

    /// Whether rescues are safe now; says so once when that changes.
    pub(crate) fn may_rescue(shared: &Shared) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let bound = Self::rescue_bound(shared);
        let unsafe_now = !Self::within_bound(shared);
        if unsafe_now != shared.skew.refusing.swap(unsafe_now, Relaxed) {
            if unsafe_now {
                tracing::error!(
                    "not claiming or rescuing jobs: this machine's clock is off from the database's by more than {}, so its leases would be misread (a lease that looks expired here may belong to a live process)",
                    crate::policy::human(bound)
                );
            } else {
                tracing::info!("claiming and rescuing jobs again: the clocks agree");
            }
        }
        !unsafe_now
    }
}

/// Resolves when a manual clock moves; never for the system clock.
pub(crate) async fn jumped(rx: &mut Option<tokio::sync::watch::Receiver<crate::Timestamp>>) {
    match rx {
        Some(rx) => {
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await
            }
        }
        None => std::future::pending::<()>().await,
    }
}

/// How long a held job may go without a renewal reaching the database before this process must
/// assume another process will rescue it: three quarters of a lease, less this process's measured
/// clock offset (see [`Skew`]).
pub(crate) fn fence_after(shared: &Shared) -> Duration {
    let skew = shared.skew.latest().map_or(Duration::ZERO, |r| r.worst());
    shared.options.lease_ttl.mul_f64(0.75).saturating_sub(skew)
}
