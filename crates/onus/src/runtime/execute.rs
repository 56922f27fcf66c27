//! One attempt: admission (retry budget, rate window; the claim took its lease key), the handler
//! under its kind's timeout and the job's cancellation, and its outcome queued for the finisher.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::admission::{self, Admission};
use super::attempt::{self, finish_of, QueuedOutcome};
use super::hub::Hold;
use super::kind::{AttemptState, JobContext};
use super::Shared;
use crate::outcome::{AttemptEnd, Transition};
use crate::store::Finish;

/// Queues the outcome of a held job; the finisher releases the hold once it is written.
pub(crate) fn send(
    shared: &Shared,
    finish: &mpsc::UnboundedSender<QueuedOutcome>,
    f: Finish,
    hold: &Hold,
) {
    send_outcome(shared, finish, f, hold, None, false);
}

pub(crate) fn send_outcome(
    shared: &Shared,
    finish: &mpsc::UnboundedSender<QueuedOutcome>,
    f: Finish,
    hold: &Hold,
    counted: Option<(Arc<super::metrics::KindMeters>, Option<Duration>)>,
    pre_completed: bool,
) {
    let id = f.id;
    shared.hub.finishing(id, hold.serial);
    shared
        .unwritten
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    if finish
        .send(QueuedOutcome {
            finish: f,
            hold: Some(hold.serial),
            counted,
            pre_completed,
        })
        .is_err()
    {
        shared
            .unwritten
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        shared.hub.release(id, hold.serial);
    }
}

/// Runs one attempt of the job in `state` and queues its outcome.
pub(crate) async fn execute(
    shared: &Arc<Shared>,
    state: Arc<AttemptState>,
    hold: &Hold,
    hard: CancellationToken,
    finish: &mpsc::UnboundedSender<QueuedOutcome>,
    started: &AtomicU64,
) {
    let job = &state.job;
    let Some(kind) = shared.kinds.get(&job.kind) else {
        return; // claims only ask for known kinds
    };
    let Some(handler) = kind.handler.as_ref() else {
        return;
    };
    let policy = &kind.policy;
    // Lost while being admitted: its slot is released by the rescue or lapses within a lease
    // (nobody renews it). Admission mostly answers at once; only a wait listens for the loss.
    if hold.signals.is_lost() {
        return;
    }
    let admitted = {
        let mut admit = std::pin::pin!(admission::admit(shared, job));
        match admit.as_mut().now_or_never() {
            Some(a) => a,
            None => tokio::select! {
                biased;
                _ = hold.signals.lost() => return,
                a = &mut admit => a,
            },
        }
    };
    match admitted {
        Admission::Run => {}
        Admission::Write(t) => {
            let f = finish_of(shared, job, t);
            super::attempt::log_ending(job, &f.transition);
            send(shared, finish, f, hold);
            return;
        }
    }
    if hold.signals.is_lost() {
        return; // fenced before it could start
    }
    // Counted for the ready buffer once the handler starts: a job deferred or snoozed by
    // admission ran nothing.
    started.fetch_add(1, Ordering::Relaxed);
    let ctx = JobContext {
        attempt: state.clone(),
        signals: hold.signals.clone(),
        clock: shared.clock.clone(),
        store: shared.store.clone(),
        client: super::Client {
            shared: shared.clone(),
        },
    };
    let completed = &state.completed;
    let span = tracing::info_span!("job", id = job.id, kind = %job.kind, attempt = job.attempt);
    let began = Instant::now();
    // The handler runs in this attempt's own task (no second task per job): a panic is caught
    // as it unwinds out of the handler's future (the call itself is inside it, so a panic before
    // its first await is caught too), and whatever ends the attempt (a timeout, a lost lease, a
    // hard stop) drops its future at the end of this block, as aborting a task of its own would
    // at its next await. The handler is polled first: one that finished while it held the thread
    // (no await for longer than its timeout) is recorded as it ended, not as timed out.
    let timeout = policy.timeout;
    let end: Option<AttemptEnd> = {
        let call = async move { handler.call(ctx).await };
        let mut handle = std::pin::pin!(std::panic::AssertUnwindSafe(
            tracing::Instrument::instrument(call, span)
        )
        .catch_unwind());
        tokio::select! {
            biased;
            r = &mut handle => Some(joined(r)),
            _ = tokio::time::sleep(timeout) => Some(AttemptEnd::TimedOut(timeout)),
            _ = hold.signals.cancelled() => {
                tokio::select! {
                    biased;
                    _ = hold.signals.lost() => {
                        tracing::warn!(job = job.id, "dropped the attempt: this process lost its lease on it");
                        return;
                    }
                    r = tokio::time::timeout(shared.options.cancel_grace, &mut handle) => match r {
                        Ok(Ok(Ok(()))) => Some(AttemptEnd::Returned(Ok(()))),
                        _ => Some(AttemptEnd::Cancelled),
                    },
                }
            }
            _ = hard.cancelled() => None,
            _ = hold.signals.lost() => {
                if completed.load(std::sync::atomic::Ordering::SeqCst) {
                    // Not lost: the handler completed the job in its own transaction, and a
                    // renewal found it no longer running. Its outcome is recorded as that
                    // completion.
                    Some(AttemptEnd::Returned(Ok(())))
                } else {
                    tracing::warn!(job = job.id, "dropped the attempt: this process lost its lease on it");
                    return; // no outcome: the job's lease is void and a rescuer decides
                }
            }
        }
    };
    // A handler that saw the cancellation and returned an error ends cancelled, whichever
    // branch above noticed first; one that succeeded anyway stays completed.
    let end = match end {
        Some(AttemptEnd::Returned(Ok(()))) => Some(AttemptEnd::Returned(Ok(()))),
        Some(_) if hold.signals.is_cancelled() => Some(AttemptEnd::Cancelled),
        other => other,
    };
    let mut f = attempt::ended(shared, job, end, policy);
    // Completed in the handler's own transaction: that is the outcome, whatever came after.
    let pre_completed = completed.load(std::sync::atomic::Ordering::SeqCst);
    if pre_completed {
        f.transition = Transition::Complete;
    } else if matches!(f.transition, Transition::Complete) {
        // A completion keeps the result its handler set (one completed in the handler's own
        // transaction wrote it there).
        f.result = state
            .result
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
    }
    send_outcome(
        shared,
        finish,
        f,
        hold,
        Some((kind.meters.clone(), Some(began.elapsed()))),
        pre_completed,
    );
}

fn joined(r: std::thread::Result<crate::JobResult>) -> AttemptEnd {
    match r {
        Ok(res) => AttemptEnd::Returned(res),
        Err(panic) => AttemptEnd::Panicked(crate::outcome::panic_message(panic.as_ref())),
    }
}
