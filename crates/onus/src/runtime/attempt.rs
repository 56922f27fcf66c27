//! Where an attempt's end becomes the write that records it ([`ended`]), and the outcome the
//! finisher writes ([`QueuedOutcome`]): used by in-process workers, pull answers and the rescuer
//! alike, so the kind's policy is applied in one place.

use std::time::Duration;

use super::Shared;
use crate::job::Job;
use crate::outcome::{decide, AttemptEnd, Transition};
use crate::store::Finish;

/// An attempt's outcome queued for the finisher, and the hold to release once it is written.
#[derive(Debug)]
pub(crate) struct QueuedOutcome {
    pub(crate) finish: Finish,
    pub(crate) hold: Option<u64>,
    /// The kind and how long the attempt ran, counted in the metrics once the outcome is
    /// recorded (an outcome refused by its lease guard was never this process's to count).
    pub(crate) counted: Option<(std::sync::Arc<super::metrics::KindMeters>, Option<Duration>)>,
    /// The handler completed the job in its own transaction
    /// ([`JobContext::complete_with`](crate::JobContext::complete_with)): the finisher writes
    /// nothing for it, only releases its hold and counts it.
    pub(crate) pre_completed: bool,
}

impl QueuedOutcome {
    /// An outcome for a job this process does not hold (a rescue).
    pub(crate) fn unheld(finish: Finish) -> Self {
        QueuedOutcome {
            finish,
            hold: None,
            counted: None,
            pre_completed: false,
        }
    }
}

/// The write that records `transition` for `job` (its lease owner, the lease key it lets go of:
/// a claimed job holds its key's slot, its schedule when it is a periodic job, whose failures
/// raise no alert).
pub(crate) fn finish_of(shared: &Shared, job: &Job, transition: Transition) -> Finish {
    let periodic = super::periodic_name_of(job.unique_key.as_deref());
    // A periodic job's failure waits for the next period and shows on its schedule: no alert.
    let transition = match transition {
        Transition::Discard { reason, entry, .. } if periodic.is_some() => Transition::Discard {
            reason,
            entry,
            alert: false,
        },
        t => t,
    };
    Finish {
        id: job.id,
        owner: job
            .lease_owner
            .clone()
            .unwrap_or_else(|| shared.owner.clone()),
        attempt: job.attempt,
        transition,
        now: shared.clock.now(),
        release_lease: job.lease_key.clone(),
        periodic,
        expired_before: None,
        result: None,
    }
}

/// The write that records an attempt's `end` (`None`: the attempt stopped without one and the job
/// is handed back): the kind's `policy` decides the transition.
pub(crate) fn ended(
    shared: &Shared,
    job: &Job,
    end: Option<AttemptEnd>,
    policy: &crate::Policy,
) -> Finish {
    let transition = match end {
        Some(end) => decide(
            job,
            end,
            policy,
            shared.clock.now(),
            &mut rand::thread_rng(),
        ),
        None => Transition::Return,
    };
    let f = finish_of(shared, job, transition);
    log_ending(job, &f.transition);
    f
}

/// Logs how an attempt ended, as the job layer decided it: the ending, not the handler's
/// classification (a retryable error on the last attempt is logged as the discard it became).
pub(crate) fn log_ending(job: &Job, t: &Transition) {
    let at = |t: &crate::Timestamp| t.format("%Y-%m-%d %H:%M:%S%.3f UTC").to_string();
    // The reason, without what it quotes of the other side's answer (a response body is not
    // ours to log), on one line.
    let said = |m: &str| {
        let own = m
            .split(crate::job::RESPONSE_QUOTE)
            .next()
            .unwrap_or_default();
        crate::job::shorten(own, 300)
    };
    let (id, kind, attempt) = (job.id, job.kind.as_str(), job.attempt);
    match t {
        Transition::Complete | Transition::Return => {}
        Transition::Retry { run_at, entry } => tracing::info!(
            job = id, kind, attempt, error = %said(&entry.message),
            "attempt {attempt} of {} failed; retrying at {}", job.max_attempts, at(run_at)
        ),
        Transition::Snooze { run_at, entry, .. } => tracing::info!(
            job = id,
            kind,
            attempt,
            "snoozed until {} ({})",
            at(run_at),
            said(&entry.message)
        ),
        Transition::Hold { run_at } => tracing::info!(
            job = id,
            kind,
            attempt,
            "held by its lease key's pause until {}",
            at(run_at)
        ),
        Transition::Defer { run_at, entry } => tracing::info!(
            job = id,
            kind,
            attempt,
            "retry deferred until {} ({})",
            at(run_at),
            said(&entry.message)
        ),
        Transition::Cancel { entry } => tracing::info!(
            job = id,
            kind,
            attempt,
            "cancelled while running ({})",
            said(&entry.message)
        ),
        Transition::Discard {
            reason,
            entry,
            alert,
        } => {
            let why = match reason {
                crate::job::DiscardReason::Exhausted if attempt == 1 => {
                    "exhausted after 1 attempt".to_string()
                }
                crate::job::DiscardReason::Exhausted => {
                    format!("exhausted after {attempt} attempts")
                }
                crate::job::DiscardReason::Permanent => "permanent failure".to_string(),
                crate::job::DiscardReason::Dropped => "dropped by its rate window".to_string(),
            };
            let alert = if *alert { "; alert raised" } else { "" };
            tracing::warn!(
                job = id, kind, attempt, error = %said(&entry.message),
                "discarded ({why}){alert}"
            );
        }
    }
}
