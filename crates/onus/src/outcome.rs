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
        /// Whether the job's lease key is paused until then too, holding every other waiting
        /// job of the key without a claim or a snooze of its own ([`JobError::pausing_key`]).
        pause_key: bool,
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
            pause_key: false,
        }
    }

    /// Snooze until `t`; no attempt is spent.
    pub fn snooze_until(t: Timestamp, reason: impl Into<String>) -> Self {
        JobError::Snooze {
            until: SnoozeUntil::At(t),
            reason: reason.into(),
            pause_key: false,
        }
    }

    /// For a snooze: the job's lease key is limited until the same time, so every other job
    /// waiting on that key is held until then too (not claimed, no attempt spent, no snooze
    /// written for it); this job records its own snooze as usual. Say it when the answer is about
    /// the key's upstream as a whole (a 429 or 503 with `Retry-After`). A job without a lease key
    /// just snoozes. Other errors are returned unchanged.
    ///
    /// ```
    /// use std::time::Duration;
    /// use onus::JobError;
    /// let e = JobError::snooze_for(Duration::from_secs(60), "HTTP 429").pausing_key();
    /// assert!(matches!(e, JobError::Snooze { pause_key: true, .. }));
    /// ```
    pub fn pausing_key(self) -> Self {
        match self {
            JobError::Snooze { until, reason, .. } => JobError::Snooze {
                until,
                reason,
                pause_key: true,
            },
            e => e,
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
                ..
            } => {
                write!(f, "snooze for {}: {reason}", crate::policy::human(*d))
            }
            JobError::Snooze {
                until: SnoozeUntil::At(t),
                reason,
                ..
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
        let cause = c.to_string();
        // An error that already prints its cause is not repeated.
        if !s.ends_with(&cause) {
            s.push_str(": ");
            s.push_str(&cause);
        }
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
    /// The attempt succeeded: the job is completed.
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
        /// The lease key paused until `run_at` as well (the job's own, when its handler asked
        /// for it with [`JobError::pausing_key`]).
        pause_key: Option<String>,
    },
    /// Held by a paused key, found when the attempt tried to take the key: the attempt is given
    /// back, nothing is written to the job's history, and it waits (as `scheduled`) until the
    /// pause ends.
    Hold {
        /// When the pause ends.
        run_at: Timestamp,
    },
    /// Discard, with or without an alert.
    Discard {
        /// Why it was discarded.
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
    /// A retry held back by its kind's spent retry budget before it started: the attempt is
    /// given back and the job waits (as `scheduled`) until the budget allows.
    Defer {
        /// When the budget allows it.
        run_at: Timestamp,
        /// The history entry (class `deferred`).
        entry: HistoryEntry,
    },
}

/// The columns one recorded attempt writes: a [`Transition`] lowered by the job layer, so a store
/// runs one guarded `UPDATE` with these values and decides nothing.
#[derive(Debug, Clone, PartialEq)]
pub struct RowWrite {
    /// The new state.
    pub state: crate::job::JobState,
    /// The new run time (`None`: unchanged).
    pub run_at: Option<Timestamp>,
    /// Whether the attempt is given back (`attempt - 1`): a snooze or a hand-back.
    pub give_back_attempt: bool,
    /// Whether it counts as a snooze (`snoozes + 1`).
    pub snoozed: bool,
    /// When the job finished, for a final state.
    pub finalized_at: Option<Timestamp>,
    /// Why it was discarded.
    pub discard_reason: Option<DiscardReason>,
    /// The entry appended to its history.
    pub entry: Option<HistoryEntry>,
    /// The message of the alert to raise.
    pub alert: Option<String>,
    /// Whether it now waits for a busy lease key (woken first when a slot frees).
    pub lease_wait: bool,
    /// Whether it is due at once (idle workers should be woken).
    pub wake: bool,
    /// What its periodic schedule records, if the job belongs to one.
    pub periodic: Option<PeriodicResult>,
}

/// The result a periodic schedule records for its latest job.
#[derive(Debug, Clone, PartialEq)]
pub struct PeriodicResult {
    /// How the job's attempt ended (`completed`, `retryable`, `discarded`, `cancelled`).
    pub state: crate::job::JobState,
    /// The failure's message, for a failure.
    pub failure: Option<String>,
}

/// The write for attempt `attempt` ending in `t` at `now`: a job asked to cancel (`cancel_requested`,
/// as stored) ends cancelled instead of waiting to run again; every message is as stored
/// ([`crate::job::clean_message`]), so no message can make the write fail; a snooze behind a busy
/// lease key (`lease_wait`) is marked so that a release wakes it.
pub fn row_write(
    t: &Transition,
    cancel_requested: bool,
    lease_wait: bool,
    now: Timestamp,
    attempt: u32,
) -> RowWrite {
    use crate::job::JobState as S;
    let cancelled = |message: String| Transition::Cancel {
        entry: HistoryEntry {
            at: now,
            attempt,
            class: EntryClass::Cancelled,
            message,
        },
    };
    let t = match t {
        Transition::Retry { entry, .. } | Transition::Snooze { entry, .. } if cancel_requested => {
            cancelled(format!(
                "cancelled by request (the attempt ended: {})",
                entry.message
            ))
        }
        Transition::Return | Transition::Hold { .. } | Transition::Defer { .. }
            if cancel_requested =>
        {
            cancelled("cancelled by request".into())
        }
        t => t.clone(),
    };
    let base = RowWrite {
        state: S::Completed,
        run_at: None,
        give_back_attempt: false,
        snoozed: false,
        finalized_at: None,
        discard_reason: None,
        entry: None,
        alert: None,
        lease_wait: false,
        wake: false,
        periodic: None,
    };
    let periodic = |state: S, failure: Option<&HistoryEntry>| {
        Some(PeriodicResult {
            state,
            failure: failure.map(|e| crate::job::clean_message(&e.message)),
        })
    };
    match &t {
        Transition::Complete => RowWrite {
            finalized_at: Some(now),
            periodic: periodic(S::Completed, None),
            ..base
        },
        Transition::Retry { run_at, entry } => RowWrite {
            state: S::Retryable,
            run_at: Some(*run_at),
            entry: Some(entry.cleaned()),
            periodic: periodic(S::Retryable, Some(entry)),
            ..base
        },
        Transition::Snooze { run_at, entry, .. } => RowWrite {
            state: S::Snoozed,
            run_at: Some(*run_at),
            give_back_attempt: true,
            snoozed: true,
            entry: Some(entry.cleaned()),
            lease_wait,
            ..base
        },
        Transition::Discard {
            reason,
            entry,
            alert,
        } => RowWrite {
            state: S::Discarded,
            finalized_at: Some(now),
            discard_reason: Some(*reason),
            alert: alert.then(|| crate::job::clean_message(&entry.message)),
            entry: Some(entry.cleaned()),
            periodic: periodic(S::Discarded, Some(entry)),
            ..base
        },
        Transition::Cancel { entry } => RowWrite {
            state: S::Cancelled,
            finalized_at: Some(now),
            entry: Some(entry.cleaned()),
            periodic: periodic(S::Cancelled, None),
            ..base
        },
        Transition::Return => RowWrite {
            state: S::Available,
            run_at: Some(now),
            give_back_attempt: true,
            wake: true,
            ..base
        },
        Transition::Defer { run_at, entry } => RowWrite {
            state: S::Scheduled,
            run_at: Some(*run_at),
            give_back_attempt: true,
            entry: Some(entry.cleaned()),
            ..base
        },
        // `lease_wait` on a scheduled job marks it held by its key's pause: a resume finds it.
        Transition::Hold { run_at } => RowWrite {
            state: S::Scheduled,
            run_at: Some(*run_at),
            give_back_attempt: true,
            lease_wait: true,
            ..base
        },
    }
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
        AttemptEnd::Returned(Err(JobError::Snooze {
            until,
            reason,
            pause_key,
        })) => {
            let run_at = match until {
                SnoozeUntil::After(d) => clock::add(now, d),
                SnoozeUntil::At(t) => t.max(now),
            };
            Transition::Snooze {
                run_at: clock::trunc(run_at),
                entry: entry(EntryClass::Snooze, reason),
                pause_key: job.lease_key.clone().filter(|_| pause_key),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::JobState;

    fn at() -> Timestamp {
        "2026-03-01T00:00:00Z".parse().unwrap_or_default()
    }

    fn entry(message: &str) -> HistoryEntry {
        HistoryEntry {
            at: at(),
            attempt: 2,
            class: EntryClass::Error,
            message: message.into(),
        }
    }

    #[test]
    fn a_cancel_request_wins_over_waiting_to_run_again() {
        let retry = Transition::Retry {
            run_at: at(),
            entry: entry("boom"),
        };
        let w = row_write(&retry, true, false, at(), 2);
        assert_eq!(w.state, JobState::Cancelled);
        assert_eq!(w.finalized_at, Some(at()));
        assert_eq!(
            w.entry.map(|e| (e.class, e.message)),
            Some((
                EntryClass::Cancelled,
                "cancelled by request (the attempt ended: boom)".to_string()
            ))
        );
        // A completed attempt stays completed.
        let w = row_write(&Transition::Complete, true, false, at(), 2);
        assert_eq!(w.state, JobState::Completed);
        // A hand-back gives the attempt back and wakes workers, unless cancelled.
        let w = row_write(&Transition::Return, false, false, at(), 2);
        assert!(w.give_back_attempt && w.wake && w.state == JobState::Available);
        assert_eq!(
            row_write(&Transition::Return, true, false, at(), 2).state,
            JobState::Cancelled
        );
    }

    #[test]
    fn messages_are_cleaned_and_periodic_results_mapped() {
        let discard = Transition::Discard {
            reason: DiscardReason::Exhausted,
            entry: entry("bad\0byte"),
            alert: true,
        };
        let w = row_write(&discard, false, false, at(), 2);
        assert_eq!(w.alert.as_deref(), Some("badbyte"));
        assert_eq!(w.entry.map(|e| e.message), Some("badbyte".to_string()));
        assert_eq!(
            w.periodic,
            Some(PeriodicResult {
                state: JobState::Discarded,
                failure: Some("badbyte".into())
            })
        );
        let snooze = Transition::Snooze {
            run_at: at(),
            entry: entry("busy"),
            pause_key: None,
        };
        let w = row_write(&snooze, false, true, at(), 2);
        assert!(w.lease_wait && w.snoozed && w.give_back_attempt && w.periodic.is_none());
        assert!(!row_write(&snooze, false, false, at(), 2).lease_wait);
    }
}
