//! Periodic jobs: cron expressions or fixed intervals, enqueued exactly once per period.
//!
//! Only the leader enqueues. Each schedule has a row holding the latest period enqueued; the
//! enqueue and the move of that mark commit together and only when the mark is older, so a period
//! is enqueued once even across restarts and leader changes. A period missed while no process ran
//! is caught up once, as the latest missed period (not once per missed period); periods that came
//! due within the last minute (a leader failover) are each enqueued, so none is skipped. Periodic jobs get one attempt by default: a
//! failure waits for the next period, and the last failure is kept on the schedule's row.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::clock::Timestamp;
use crate::job::NewJob;

/// When a periodic job is due.
#[derive(Clone)]
pub enum Schedule {
    /// A cron expression (5 fields, or 6 with seconds), evaluated in UTC.
    Cron(Box<croner::Cron>, String),
    /// Every fixed interval, aligned to the Unix epoch (so every process agrees on the periods).
    Every(Duration),
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
    /// An interval shorter than a second.
    #[error("a periodic interval must be at least 1s; got {}", crate::policy::human(*.0))]
    TooShort(Duration),
    /// `every` followed by something that is not a duration.
    #[error("{0}")]
    BadInterval(String),
}

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
        Ok(Schedule::Cron(Box::new(c), expr.to_string()))
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
            Schedule::Cron(c, _) => c
                .find_next_occurrence(&t, false)
                .unwrap_or(Timestamp::MAX_UTC),
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
            Schedule::Cron(_, e) => format!("cron: {e}"),
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

/// A periodic job: a name, a schedule, and the job to enqueue each period.
#[derive(Debug, Clone)]
pub struct Periodic {
    pub(crate) name: String,
    pub(crate) schedule: Schedule,
    pub(crate) job: NewJob,
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
        }
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
    fn periodic_names_round_trip_through_unique_keys() {
        let t: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        assert_eq!(
            name_of(Some(&unique_key("a@b:c", t))).as_deref(),
            Some("a@b:c")
        );
        assert_eq!(name_of(Some("other")), None);
    }
}
