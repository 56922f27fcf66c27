//! What a handler answers, and the state change that answer causes.
//!
//! A handler never sleeps, loops or decides when to try again. It returns `Ok(())`, or a
//! [`JobError`] that only *classifies* the failure; [`decide`] turns that class and the kind's
//! [`Policy`] into the next state and, for a retry, the next `run_at` (backoff plus jitter).

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use rand::Rng;

use crate::clock::{self, Timestamp};
use crate::job::{DiscardReason, EntryClass, HistoryEntry, Job};
use crate::policy::Policy;

/// Any error, boxed.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// What a handler returns.
pub type JobResult = Result<(), JobError>;

/// A failed attempt, classified by the handler.
///
/// `?` on any error gives [`JobError::Retryable`]: the job layer retries it under the kind's policy.
///
/// ```
/// use std::time::Duration;
/// use onus::{JobError, JobResult};
/// fn classify(status: u16) -> JobResult {
///     match status {
///         200..=299 => Ok(()),
///         429 => Err(JobError::snooze_for(Duration::from_secs(30), "rate limited")),
///         400..=499 => Err(JobError::discard(format!("rejected with {status}"))),
///         _ => Err(JobError::retryable(format!("server answered {status}"))),
///     }
/// }
/// assert!(classify(503).is_err());
/// ```
pub enum JobError {
    /// Try again later, when the policy says (spends an attempt).
    Retryable(BoxError),
    /// Run again at a named time; spends no attempt.
    Snooze {
        /// When to run again.
        until: SnoozeUntil,
        /// Why, kept in the job's history.
        reason: String,
    },
    /// Trying again cannot help: discard (reason *permanent*).
    Discard(BoxError),
    /// Dropped on purpose (a spent rate window whose policy is to drop): discard (reason *dropped*).
    Drop(String),
}

/// When a snoozed job runs again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnoozeUntil {
    /// This long from now.
    After(Duration),
    /// At this instant.
    At(Timestamp),
}

impl JobError {
    /// A retryable failure with a message.
    pub fn retryable(msg: impl Into<String>) -> Self {
        JobError::Retryable(msg.into().into())
    }

    /// A permanent failure: the job is discarded.
    pub fn discard(msg: impl Into<String>) -> Self {
        JobError::Discard(msg.into().into())
    }

    /// A permanent failure wrapping an error.
    pub fn discard_err<E: StdError + Send + Sync + 'static>(e: E) -> Self {
        JobError::Discard(Box::new(e))
    }

    /// Snooze for `d`; no attempt is spent.
    pub fn snooze_for(d: Duration, reason: impl Into<String>) -> Self {
        JobError::Snooze {
            until: SnoozeUntil::After(d),
            reason: reason.into(),
        }
    }

    /// Snooze until `t`; no attempt is spent.
    pub fn snooze_until(t: Timestamp, reason: impl Into<String>) -> Self {
        JobError::Snooze {
            until: SnoozeUntil::At(t),
            reason: reason.into(),
        }
    }
}

impl<E: StdError + Send + Sync + 'static> From<E> for JobError {
    fn from(e: E) -> Self {
        JobError::Retryable(Box::new(e))
    }
}

impl fmt::Debug for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JobError::Retryable(e) => write!(f, "retryable: {}", chain(e.as_ref())),
            JobError::Snooze {
                until: SnoozeUntil::After(d),
                reason,
            } => {
                write!(f, "snooze for {}: {reason}", crate::policy::human(*d))
            }
            JobError::Snooze {
                until: SnoozeUntil::At(t),
                reason,
            } => write!(f, "snooze until {t}: {reason}"),
            JobError::Discard(e) => write!(f, "discard: {}", chain(e.as_ref())),
            JobError::Drop(r) => write!(f, "dropped: {r}"),
        }
    }
}

/// An error and its sources, joined with `: `.
pub fn chain(e: &(dyn StdError + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// The message a panic carried.
pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into())
}

/// How an attempt ended, as the runtime saw it.
#[derive(Debug)]
pub enum AttemptEnd {
    /// The handler returned.
    Returned(JobResult),
    /// The handler panicked, with its message.
    Panicked(String),
    /// The attempt ran past the kind's timeout.
    TimedOut(Duration),
    /// The job was cancelled while it ran and the handler did not succeed.
    Cancelled,
    /// The process running it died (found by the rescuer).
    WorkerLost,
}

/// The state change the store writes for one finished attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum Transition {
    /// Success.
    Complete,
    /// Retryable failure: wait out the backoff.
    Retry {
        /// When to run again.
        run_at: Timestamp,
        /// The history entry.
        entry: HistoryEntry,
    },
    /// Snooze: the attempt is given back.
    Snooze {
        /// When to run again.
        run_at: Timestamp,
        /// The history entry.
        entry: HistoryEntry,
    },
    /// Discard, with or without an alert.
    Discard {
        /// Why.
        reason: DiscardReason,
        /// The history entry.
        entry: HistoryEntry,
        /// Whether to raise an alert.
        alert: bool,
    },
    /// Cancelled while running.
    Cancel {
        /// The history entry.
        entry: HistoryEntry,
    },
    /// Handed back unfinished at shutdown: the attempt is given back, due now.
    Return,
}

/// Decides the next state of `job` (as claimed: `attempt` already counts this attempt) after `end`,
/// under `policy`, at `now`. This is the whole of retry timing.
pub fn decide<R: Rng + ?Sized>(
    job: &Job,
    end: AttemptEnd,
    policy: &Policy,
    now: Timestamp,
    rng: &mut R,
) -> Transition {
    let entry = |class: EntryClass, message: String| HistoryEntry {
        at: now,
        attempt: job.attempt,
        class,
        message: crate::job::clean_message(&message),
    };
    let mut failed = |class: EntryClass, message: String| {
        if job.attempt >= job.max_attempts {
            Transition::Discard {
                reason: DiscardReason::Exhausted,
                entry: entry(class, message),
                alert: policy.alert_on_exhaustion,
            }
        } else {
            let delay = policy.delay_with(job.attempt, rng);
            Transition::Retry {
                run_at: clock::trunc(clock::add(now, delay)),
                entry: entry(class, message),
            }
        }
    };
    match end {
        AttemptEnd::Returned(Ok(())) => Transition::Complete,
        AttemptEnd::Returned(Err(JobError::Retryable(e))) => {
            failed(EntryClass::Error, chain(e.as_ref()))
        }
        AttemptEnd::Returned(Err(JobError::Snooze { until, reason })) => {
            let run_at = match until {
                SnoozeUntil::After(d) => clock::add(now, d),
                SnoozeUntil::At(t) => t.max(now),
            };
            Transition::Snooze {
                run_at: clock::trunc(run_at),
                entry: entry(EntryClass::Snooze, reason),
            }
        }
        AttemptEnd::Returned(Err(JobError::Discard(e))) => Transition::Discard {
            reason: DiscardReason::Permanent,
            entry: entry(EntryClass::Discard, chain(e.as_ref())),
            alert: false,
        },
        AttemptEnd::Returned(Err(JobError::Drop(r))) => Transition::Discard {
            reason: DiscardReason::Dropped,
            entry: entry(EntryClass::Dropped, r),
            alert: false,
        },
        AttemptEnd::Panicked(msg) => failed(EntryClass::Panic, format!("handler panicked: {msg}")),
        AttemptEnd::TimedOut(d) => failed(
            EntryClass::Timeout,
            format!(
                "attempt ran past the kind's timeout of {}",
                crate::policy::human(d)
            ),
        ),
        AttemptEnd::WorkerLost => {
            if job.cancel_requested {
                Transition::Cancel {
                    entry: entry(
                        EntryClass::Cancelled,
                        "cancelled; its worker was lost".into(),
                    ),
                }
            } else {
                failed(
                    EntryClass::WorkerLost,
                    format!(
                        "worker lost: process {} stopped renewing its lease",
                        job.lease_owner.as_deref().unwrap_or("(unknown)")
                    ),
                )
            }
        }
        AttemptEnd::Cancelled => Transition::Cancel {
            entry: entry(
                EntryClass::Cancelled,
                "cancelled by request while running".into(),
            ),
        },
    }
}
