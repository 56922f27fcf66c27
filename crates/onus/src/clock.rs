//! The one source of time for the job layer.
//!
//! Every instant that decides a job's fate (when it runs, when its lease expires, when a rate window
//! closes, when it is pruned) comes from a [`Clock`]. Production uses [`SystemClock`]; tests use
//! [`ManualClock`] and move time forward by hand, so days of retry schedule run in milliseconds.
//! SQL never asks the database for the time.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use tokio::sync::watch;

/// A point in time, in UTC, with microsecond precision in storage.
pub type Timestamp = DateTime<Utc>;

/// Where the job layer reads the time from.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current time.
    fn now(&self) -> Timestamp;

    /// Whether this clock is meant to agree with the database's. The runtime measures the offset
    /// between them and acts on it (see `onus::runtime`'s clock-skew notes); a manual clock in
    /// tests says no.
    fn compare_with_database(&self) -> bool {
        true
    }

    /// A receiver that changes whenever time jumps by hand ([`ManualClock::advance`]).
    /// The runtime wakes on it to look for jobs that just became due. `None` for the system clock.
    fn jumps(&self) -> Option<watch::Receiver<Timestamp>> {
        None
    }
}

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Utc::now()
    }
}

/// A clock that only moves when told to. Cloning shares the same time.
///
/// ```
/// use std::time::Duration;
/// use onus::{Clock, ManualClock};
/// let clock = ManualClock::at("2026-01-01T00:00:00Z".parse().unwrap());
/// clock.advance(Duration::from_secs(5 * 24 * 3600));
/// assert_eq!(clock.now().to_rfc3339(), "2026-01-06T00:00:00+00:00");
/// ```
#[derive(Clone)]
pub struct ManualClock {
    inner: Arc<Mutex<Timestamp>>,
    tx: Arc<watch::Sender<Timestamp>>,
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManualClock")
            .field("now", &self.now())
            .finish()
    }
}

impl ManualClock {
    /// A clock standing at `start`.
    pub fn at(start: Timestamp) -> Self {
        let (tx, _) = watch::channel(start);
        Self {
            inner: Arc::new(Mutex::new(trunc(start))),
            tx: Arc::new(tx),
        }
    }

    /// A clock standing at the current wall-clock time.
    pub fn starting_now() -> Self {
        Self::at(Utc::now())
    }

    /// Moves time forward and wakes every runtime that uses this clock.
    pub fn advance(&self, by: Duration) {
        let now = {
            let mut t = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            *t = add(*t, by);
            *t
        };
        self.tx.send_replace(now);
    }

    /// Moves time to `to` if it lies in the future (time never goes back).
    pub fn advance_to(&self, to: Timestamp) {
        let now = {
            let mut t = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            if to > *t {
                *t = trunc(to);
            }
            *t
        };
        self.tx.send_replace(now);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn compare_with_database(&self) -> bool {
        false
    }

    fn jumps(&self) -> Option<watch::Receiver<Timestamp>> {
        Some(self.tx.subscribe())
    }
}

/// The system clock shifted by a fixed offset: a machine whose clock is off, for tests and fault
/// drills.
///
/// ```
/// use onus::{Clock, OffsetClock};
/// let ahead = OffsetClock::new(chrono::TimeDelta::seconds(30));
/// assert!(ahead.now() > chrono::Utc::now());
/// ```
#[derive(Debug, Clone, Copy)]
pub struct OffsetClock {
    offset: TimeDelta,
}

impl OffsetClock {
    /// The system clock plus `offset` (negative: behind).
    pub fn new(offset: TimeDelta) -> Self {
        OffsetClock { offset }
    }
}

impl Clock for OffsetClock {
    fn now(&self) -> Timestamp {
        let t = Utc::now();
        t.checked_add_signed(self.offset).unwrap_or(t)
    }
}

/// Truncates to the microsecond, the precision both stores keep. Only the time of day changes:
/// a round trip through microseconds since the epoch converted the date twice (about 140
/// instructions, twice per claimed job).
pub(crate) fn trunc(t: Timestamp) -> Timestamp {
    use chrono::Timelike;
    match t.nanosecond() {
        // A leap second has no microseconds of its own: it becomes the next second, as stored.
        n if n >= 1_000_000_000 => from_micros(t.timestamp_micros()),
        // On the naive time: `DateTime::with_nanosecond` goes through the offset and back.
        n => t
            .naive_utc()
            .with_nanosecond(n / 1_000 * 1_000)
            .map_or(t, |d| d.and_utc()),
    }
}

pub(crate) fn from_micros(us: i64) -> Timestamp {
    DateTime::from_timestamp_micros(us).unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// `t + d`, saturating instead of overflowing.
pub fn add(t: Timestamp, d: Duration) -> Timestamp {
    let d = TimeDelta::from_std(d).unwrap_or(TimeDelta::MAX);
    t.checked_add_signed(d).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// `t - d`, saturating at the earliest representable time instead of overflowing.
pub fn sub(t: Timestamp, d: Duration) -> Timestamp {
    let d = TimeDelta::from_std(d).unwrap_or(TimeDelta::MAX);
    t.checked_sub_signed(d).unwrap_or(DateTime::<Utc>::MIN_UTC)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn round_trip(t: Timestamp) -> Timestamp {
        from_micros(t.timestamp_micros())
    }

    proptest! {
        /// The same instant as a round trip through microseconds since the epoch, before 1970
        /// as after.
        #[test]
        fn trunc_keeps_the_microsecond_below(secs in -62_000_000_000i64..250_000_000_000i64, nanos in 0u32..1_000_000_000u32) {
            let t = DateTime::from_timestamp(secs, nanos).expect("in range");
            prop_assert_eq!(trunc(t), round_trip(t));
            prop_assert_eq!(trunc(t).timestamp_subsec_nanos() % 1_000, 0);
        }

        /// A leap second (a second's last, written with nanoseconds from 1e9) as well.
        #[test]
        fn trunc_of_a_leap_second(minutes in -1_000_000_000i64..4_000_000_000i64, nanos in 1_000_000_000u32..2_000_000_000u32) {
            let t = DateTime::from_timestamp(minutes * 60 + 59, nanos).expect("a leap second");
            prop_assert_eq!(trunc(t), round_trip(t));
        }
    }
}
