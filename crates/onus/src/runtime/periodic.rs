//! Periodic jobs: cron expressions or fixed intervals, enqueued exactly once per period.
//!
//! Only the leader enqueues. Each schedule has a row holding the latest period enqueued; the
//! enqueue and the move of that mark commit together and only when the mark is older, so a period
//! is enqueued once even across restarts and leader changes. Periods that came due within the
//! last minute (a leader failover) are each enqueued, so none is skipped; older ones, missed while
//! no process ran, follow the schedule's [`CatchUp`]: none, the latest once (the default), or each
//! up to a limit. A cron schedule is read in its time zone ([`Schedule::in_timezone`]). A paused
//! schedule enqueues nothing; resumed, it goes on from its next period. Periodic jobs get one
//! attempt by default: a failure waits for the next period, and the last failure is kept on the
//! schedule's row.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::job::NewJob;

/// When a periodic job is due.
#[derive(Clone)]
pub enum Schedule {
    /// A cron expression (5 fields, or 6 with seconds), evaluated in a time zone (UTC unless
    /// [`Schedule::in_timezone`] says otherwise).
    Cron(Box<CronIn>),
    /// Every fixed interval, aligned to the Unix epoch (so every process agrees on the periods).
    Every(Duration),
}

/// A cron expression, as written, and the time zone it is read in.
#[derive(Clone)]
pub struct CronIn {
    cron: croner::Cron,
    expr: String,
    tz: chrono_tz::Tz,
}

impl fmt::Debug for CronIn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.expr, self.tz.name())
    }
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

/// A schedule that cannot be used, with what to write instead.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    /// Not a cron expression.
    #[error("{expr:?} is not a cron expression ({source}); write it like \"0 3 * * *\"")]
    Cron {
        /// The expression as written.
        expr: String,
        /// What the cron parser found wrong.
        source: croner::errors::CronError,
    },
    /// A cron expression no date matches.
    #[error("cron expression {0:?} matches no date (30 February?); write one that comes round")]
    Never(String),
    /// An interval shorter than a second.
    #[error("a periodic interval must be at least 1s; got {}", crate::policy::human(*.0))]
    TooShort(Duration),
    /// Not a time zone of the IANA database.
    #[error("timezone {0:?} is not a time zone; write an IANA name like \"Europe/Berlin\", \"America/New_York\" or \"UTC\"")]
    TimeZone(String),
    /// A time zone given to an interval, which counts seconds wherever it runs.
    #[error(
        "a time zone applies to cron schedules; an interval (every ...) is the same everywhere"
    )]
    TimeZoneOnInterval,
    /// `every` followed by something that is not a duration.
    #[error("{0}")]
    BadInterval(String),
}

/// How far ahead a schedule with no next occurrence is put: a century, a time every store keeps.
const NEVER: Duration = Duration::from_secs(100 * 366 * 86_400);

impl Schedule {
    /// Parses a cron expression; the error says what is wrong with it.
    pub fn cron(expr: &str) -> Result<Self, ScheduleError> {
        let c = croner::Cron::new(expr)
            .with_seconds_optional()
            .parse()
            .map_err(|source| ScheduleError::Cron {
                expr: expr.to_string(),
                source,
            })?;
        // A date that never comes (30 February) parses, then never fires.
        let epoch = chrono::DateTime::<chrono::Utc>::UNIX_EPOCH;
        if c.find_next_occurrence(&epoch, false).is_err() {
            return Err(ScheduleError::Never(expr.to_string()));
        }
        Ok(Schedule::Cron(Box::new(CronIn {
            cron: c,
            expr: expr.to_string(),
            tz: chrono_tz::UTC,
        })))
    }

    /// The cron schedule read in time zone `tz` (an IANA name: `Europe/Berlin`). Across
    /// daylight-saving changes each period runs once: a local time the clocks skip (02:30 when
    /// they jump from 02:00 to 03:00) runs at the first local time after the gap (03:00), and a
    /// local time they pass twice (when they fall back) runs at its first passing only.
    pub fn in_timezone(self, tz: &str) -> Result<Self, ScheduleError> {
        let zone: chrono_tz::Tz = tz
            .trim()
            .parse()
            .map_err(|_| ScheduleError::TimeZone(tz.to_string()))?;
        match self {
            Schedule::Cron(c) => Ok(Schedule::Cron(Box::new(CronIn { tz: zone, ..*c }))),
            Schedule::Every(_) => Err(ScheduleError::TimeZoneOnInterval),
        }
    }

    /// The time zone a cron schedule is read in (UTC for an interval).
    pub fn timezone(&self) -> &str {
        match self {
            Schedule::Cron(c) => c.tz.name(),
            Schedule::Every(_) => "UTC",
        }
    }

    /// Every `d` (at least one second).
    pub fn every(d: Duration) -> Result<Self, ScheduleError> {
        if d < Duration::from_secs(1) {
            return Err(ScheduleError::TooShort(d));
        }
        Ok(Schedule::Every(d))
    }

    /// The first period boundary strictly after `t`.
    pub fn next_after(&self, t: Timestamp) -> Timestamp {
        match self {
            Schedule::Cron(c) => {
                let mut from = t.with_timezone(&c.tz);
                // A local time passed twice (clocks falling back) maps to its first passing,
                // which may lie before `t` (when `t` is in the second passing): that period
                // already ran, so look on from it. Each step moves the local time forward, so the
                // walk ends where the repeated hour does, whatever the schedule's resolution; it
                // never goes beyond a day of local time.
                let horizon = from.naive_local() + chrono::TimeDelta::days(1);
                loop {
                    match c.cron.find_next_occurrence(&from, false) {
                        Ok(n) if n.with_timezone(&chrono::Utc) > t => {
                            return n.with_timezone(&chrono::Utc)
                        }
                        Ok(n)
                            if n.naive_local() > from.naive_local()
                                && n.naive_local() <= horizon =>
                        {
                            from = n
                        }
                        // No occurrence after `t` (a schedule with none is refused when parsed:
                        // this is the year 5000) or no progress: a far but storable time.
                        _ => return crate::clock::add(t, NEVER),
                    }
                }
            }
            Schedule::Every(d) => {
                let step = d.as_micros() as i64;
                let now = t.timestamp_micros();
                let next = (now.div_euclid(step) + 1) * step;
                crate::clock::from_micros(next)
            }
        }
    }

    /// The schedule as written: `cron: 0 3 * * *` or `every: 5m`.
    pub fn describe(&self) -> String {
        match self {
            Schedule::Cron(c) if c.tz == chrono_tz::UTC => format!("cron: {}", c.expr),
            Schedule::Cron(c) => format!("cron: {} ({})", c.expr, c.tz.name()),
            Schedule::Every(d) => format!("every: {}", crate::policy::human(*d)),
        }
    }
}

impl FromStr for Schedule {
    type Err = ScheduleError;
    /// `every 5m`, `@every 5m`, or a cron expression.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if let Some(rest) = s.strip_prefix("@every").or_else(|| s.strip_prefix("every")) {
            let rest = rest.trim_start_matches(':').trim();
            let d = crate::policy::duration_str::parse(rest).map_err(ScheduleError::BadInterval)?;
            return Schedule::every(d);
        }
        Schedule::cron(s)
    }
}

/// What a schedule does with periods that came due while nothing ran (an outage, every process
/// stopped), beyond those of the last `periodic_catch_up` window ([`crate::Options`]), which are
/// each enqueued so that a leader's failover skips none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CatchUp {
    /// Run none of them: the schedule goes on from its next period.
    Skip,
    /// Run the latest of them once (the default).
    #[default]
    Latest,
    /// Run each of them, oldest first, at most `limit` (the latest ones).
    All {
        /// The most missed periods run.
        limit: u32,
    },
}

/// A periodic job: a name, a schedule, and the job to enqueue each period.
#[derive(Debug, Clone)]
pub struct Periodic {
    pub(crate) name: String,
    pub(crate) schedule: Schedule,
    pub(crate) job: NewJob,
    pub(crate) catch_up: CatchUp,
}

impl Periodic {
    /// Enqueues `job` on `schedule` under the unique `name`. The job gets one attempt unless it
    /// says otherwise (`NewJob::max_attempts`): a failure waits for the next period.
    pub fn new(name: impl Into<String>, schedule: Schedule, job: NewJob) -> Self {
        let job = if job.max_attempts.is_none() {
            job.max_attempts(1)
        } else {
            job
        };
        Periodic {
            name: name.into(),
            schedule,
            job,
            catch_up: CatchUp::default(),
        }
    }

    /// What to do with periods missed while nothing ran (default: run the latest once).
    pub fn catch_up(mut self, c: CatchUp) -> Self {
        self.catch_up = c;
        self
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its schedule.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }
}

/// The unique key a periodic job carries: names the schedule and the period.
pub(crate) fn unique_key(name: &str, period: Timestamp) -> String {
    format!("periodic:{name}@{}", period.timestamp_micros())
}

/// The schedule a job was enqueued for, from its unique key.
pub(crate) fn name_of(unique_key: Option<&str>) -> Option<String> {
    let rest = unique_key?.strip_prefix("periodic:")?;
    let (name, _) = rest.rsplit_once('@')?;
    Some(name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_find_the_next_boundary() {
        let t: Timestamp = "2026-01-01T10:07:30Z".parse().unwrap();
        let every = Schedule::from_str("every 5m").unwrap();
        assert_eq!(
            every.next_after(t).to_rfc3339(),
            "2026-01-01T10:10:00+00:00"
        );
        let cron = Schedule::from_str("0 3 * * *").unwrap();
        assert_eq!(cron.next_after(t).to_rfc3339(), "2026-01-02T03:00:00+00:00");
        let edge: Timestamp = "2026-01-02T03:00:00Z".parse().unwrap();
        assert_eq!(
            cron.next_after(edge).to_rfc3339(),
            "2026-01-03T03:00:00+00:00"
        );
        assert!(Schedule::from_str("61 * * *")
            .unwrap_err()
            .to_string()
            .contains("cron"));
        assert!(Schedule::from_str("every 0s").is_err());
    }

    #[test]
    fn regression_cron_in_a_time_zone_survives_the_repeated_hour() {
        // Berlin falls back at 01:00Z on 2026-10-25: 02:00-02:59 local passes twice. At 01:10Z
        // (02:10 local, second passing) every period of the hour already ran at its first
        // passing; the next is 03:00 local, 02:00Z. It used to be the end of time.
        let every5 = Schedule::cron("*/5 * * * *")
            .unwrap()
            .in_timezone("Europe/Berlin")
            .unwrap();
        let t: Timestamp = "2026-10-25T01:10:00Z".parse().unwrap();
        assert_eq!(
            every5.next_after(t).to_rfc3339(),
            "2026-10-25T02:00:00+00:00"
        );
        // Every second of the repeated hour: bounded by time, not by a count of tries.
        let every_second = Schedule::cron("* * * * * *")
            .unwrap()
            .in_timezone("Europe/Berlin")
            .unwrap();
        assert_eq!(
            every_second.next_after(t).to_rfc3339(),
            "2026-10-25T02:00:00+00:00"
        );
        // Walking the whole night, every step moves forward by 5 minutes, or 65 over the repeated hour.
        let mut at: Timestamp = "2026-10-24T23:00:00Z".parse().unwrap();
        while at < "2026-10-25T03:00:00Z".parse::<Timestamp>().unwrap() {
            let next = every5.next_after(at);
            assert!(
                next > at && next - at <= chrono::TimeDelta::minutes(65),
                "{at} -> {next}"
            );
            at = next;
        }
        // A date that never comes is refused when parsed, not found to be never later.
        assert!(Schedule::cron("0 0 30 2 *")
            .unwrap_err()
            .to_string()
            .contains("matches no date"));
    }

    #[test]
    fn a_cron_schedule_in_a_time_zone_runs_once_across_both_daylight_saving_changes() {
        let daily = Schedule::cron("30 2 * * *")
            .unwrap()
            .in_timezone("Europe/Berlin")
            .unwrap();
        let walk = |from: &str, n: usize| {
            let mut t: Timestamp = from.parse().unwrap();
            (0..n)
                .map(|_| {
                    t = daily.next_after(t);
                    t.to_rfc3339()
                })
                .collect::<Vec<_>>()
        };
        // Spring forward (29 March 2026, 02:00 CET -> 03:00 CEST): the skipped 02:30 runs at
        // 03:00 local, once.
        assert_eq!(
            walk("2026-03-27T12:00:00Z", 3),
            [
                "2026-03-28T01:30:00+00:00",
                "2026-03-29T01:00:00+00:00",
                "2026-03-30T00:30:00+00:00"
            ]
        );
        // Fall back (25 October 2026, 03:00 CEST -> 02:00 CET): 02:30 passes twice and runs at
        // the first passing only, also from inside the repeated hour.
        assert_eq!(
            walk("2026-10-23T12:00:00Z", 3),
            [
                "2026-10-24T00:30:00+00:00",
                "2026-10-25T00:30:00+00:00",
                "2026-10-26T01:30:00+00:00"
            ]
        );
        assert_eq!(
            walk("2026-10-25T01:10:00Z", 1),
            ["2026-10-26T01:30:00+00:00"]
        );
        assert_eq!(daily.describe(), "cron: 30 2 * * * (Europe/Berlin)");
        assert!(Schedule::cron("0 9 * * *")
            .unwrap()
            .in_timezone("Mars/Olympus")
            .unwrap_err()
            .to_string()
            .contains("IANA"));
        assert!(Schedule::from_str("every 1h")
            .unwrap()
            .in_timezone("UTC")
            .is_err());
    }

    #[test]
    fn periodic_names_round_trip_through_unique_keys() {
        let t: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        assert_eq!(
            name_of(Some(&unique_key("a@b:c", t))).as_deref(),
            Some("a@b:c")
        );
        assert_eq!(name_of(Some("other")), None);
    }
}
