//! Admission before an attempt starts, the same for in-process workers and pull claims: the
//! kind's retry budget, then the kind's rate window. The job's lease key was taken by the claim
//! that handed it out (a job whose key was busy or paused waits in the database and is never
//! handed out).

use super::Shared;
use crate::job::Job;
use crate::limits::{RateWindow, WhenSpent};
use crate::outcome::Transition;

/// What admission decided for a claimed job.
#[derive(Debug)]
pub(crate) enum Admission {
    /// Run it (holding its lease key's slot, released with its outcome).
    Run,
    /// Not run: write this transition (a budget deferral, a spent rate window, or handed back
    /// when the database could not be asked), letting go of the lease key's slot.
    Write(Transition),
}

/// Admits `job`, claimed with its lease key's slot, to start an attempt.
pub(crate) async fn admit(shared: &Shared, job: &Job) -> Admission {
    // A retry over its kind's budget waits for it.
    if let Some(defer) = budget(shared, job) {
        return Admission::Write(defer);
    }
    // A spent rate window snoozes or drops the job.
    match rate(shared, job).await {
        Some(t) => Admission::Write(t),
        None => Admission::Run,
    }
}

/// Admits the attempt `job` is about to start under its kind's retry budget: `None` to run
/// it, or the deferral to write when the budget is spent.
fn budget(shared: &Shared, job: &Job) -> Option<crate::outcome::Transition> {
    let budget = shared
        .kinds
        .get(&job.kind)
        .and_then(|k| k.retry_budget)
        .or(shared.options.retry_budget)?;
    let now = shared.clock.now();
    let until = shared
        .budgets
        .admit(
            &job.kind,
            &budget,
            job.attempt > 1,
            job.errors
                .last()
                .is_some_and(|e| e.class == crate::job::EntryClass::Deferred),
            now,
        )
        .err()?;
    Some(crate::outcome::Transition::Defer {
        run_at: until,
        entry: crate::job::HistoryEntry {
            at: now,
            attempt: job.attempt,
            class: crate::job::EntryClass::Deferred,
            message: format!(
                "retry deferred to {until}: the kind's retry budget ({:.0}% of attempts per {}, at least {}) is spent",
                budget.ratio * 100.0,
                crate::policy::human(budget.window),
                budget.min_per_window.max(1)
            ),
        },
    })
}

/// Takes a use of the rate window `job`'s kind has from configuration, once the attempt
/// holds everything else it needs (its lease key), so a use is spent only by an attempt that
/// then runs. `None` to run it, or the state change to write instead (a snooze to the next
/// window, a drop, or a hand-back when the database could not be asked).
async fn rate(shared: &Shared, job: &Job) -> Option<crate::outcome::Transition> {
    let kind = shared.kinds.get(&job.kind)?;
    let (limit, template) = kind.rate.as_ref()?;
    let now = shared.clock.now();
    let answer = match template.render(&job.args) {
        Ok(key) => {
            // A paused rate key holds the job until its pause ends, as a paused lease key does.
            match shared.store.paused_until(&key, now).await {
                Ok(Some(until)) => return Some(crate::outcome::Transition::Hold { run_at: until }),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(job = job.id, error = %e, "cannot read the rate key's pause; handing the job back");
                    return Some(crate::outcome::Transition::Return);
                }
            }
            take_rates(&*shared.store, now, &[(limit, &key)]).await
        }
        Err(e) => Err(crate::JobError::discard(e)),
    };
    match answer {
        Ok(()) => None,
        Err(crate::JobError::Retryable(e)) => {
            tracing::warn!(job = job.id, error = %e, "cannot take the kind's rate window; handing the job back");
            Some(crate::outcome::Transition::Return)
        }
        Err(e) => Some(crate::outcome::decide(
            job,
            crate::outcome::AttemptEnd::Returned(Err(e)),
            &kind.policy,
            now,
            &mut rand::thread_rng(),
        )),
    }
}

/// Takes one use of each `(limit, key)` at `now`, all or none: when any window is spent nothing
/// is taken and the error is the job's answer (a snooze to the next window, or a drop; a spent
/// limit that drops wins).
pub(crate) async fn take_rates(
    store: &dyn crate::store::Store,
    now: crate::Timestamp,
    limits: &[(&RateWindow, &str)],
) -> Result<(), crate::JobError> {
    use crate::store::{RateAsk, RateDecision};
    use crate::JobError;
    if limits.is_empty() {
        return Ok(());
    }
    let asks: Vec<RateAsk> = limits
        .iter()
        .map(|(l, key)| RateAsk {
            key: format!("{}:{key}", l.name),
            max: l.max,
            window: l.window,
        })
        .collect();
    let answers = store
        .take_rates(&asks, now)
        .await
        .map_err(|e| JobError::Retryable(Box::new(e)))?;
    let spent: Vec<(&RateWindow, &str, crate::Timestamp)> = limits
        .iter()
        .zip(&answers)
        .filter_map(|((l, k), a)| match a {
            RateDecision::Spent(next) => Some((*l, *k, *next)),
            RateDecision::Taken { .. } => None,
        })
        .collect();
    let say = |l: &RateWindow, key: &str| {
        format!(
            "rate window {} spent for {key} ({} per {})",
            l.name,
            l.max,
            crate::policy::human(l.window)
        )
    };
    if let Some((l, key, _)) = spent
        .iter()
        .find(|(l, _, _)| l.when_spent == WhenSpent::Drop)
    {
        return Err(JobError::Drop(format!(
            "{}: dropped on purpose",
            say(l, key)
        )));
    }
    match spent.iter().max_by_key(|(_, _, next)| *next) {
        None => Ok(()),
        Some((l, key, next)) => Err(JobError::snooze_until(*next, say(l, key))),
    }
}
