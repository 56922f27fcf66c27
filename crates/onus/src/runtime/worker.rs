//! Workers: claim due jobs in batches, run each handler with its kind's timeout, turn the answer
//! into a transition, and record outcomes in batches.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::kind::JobContext;
use super::Shared;
use crate::clock::add;
use crate::job::Job;
use crate::outcome::{decide, AttemptEnd, Transition};
use crate::store::{ClaimRequest, Finish, LeaseDecision};

/// One queue's producer: claims due jobs in batches and spawns their attempts.
///
/// A queue runs at most `concurrency` attempts at once and holds at most as many more claimed
/// jobs ready to start (so the next claim overlaps the current attempts instead of waiting for a
/// slot to free). Claimed jobs start in claim order; one not started by shutdown is handed back.
pub(crate) async fn run_queue(
    shared: Arc<Shared>,
    queue: String,
    concurrency: usize,
    stop: CancellationToken,
    hard: CancellationToken,
    tracker: TaskTracker,
    finish: mpsc::UnboundedSender<Finish>,
) {
    let slots = Arc::new(Semaphore::new(concurrency * 2)); // claimed: running or ready
    let (ready, ready_rx) = mpsc::unbounded_channel::<Ready>();
    let dispatcher = tokio::spawn(dispatch(
        shared.clone(),
        ready_rx,
        Arc::new(Semaphore::new(concurrency)),
        stop.clone(),
        hard.clone(),
        tracker.clone(),
        finish.clone(),
    ));
    let notify = shared.hub.queue(&queue);
    let mut jumps = shared.clock.jumps();
    let kinds = shared.handled_kinds();
    let batch = shared.options.claim_batch.max(1);
    let mut failing = false;
    loop {
        let first = tokio::select! {
            p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            _ = stop.cancelled() => break,
        };
        let mut permits = vec![first];
        while permits.len() < batch {
            match slots.clone().try_acquire_owned() {
                Ok(p) => permits.push(p),
                Err(_) => break,
            }
        }
        let now = shared.clock.now();
        let req = ClaimRequest {
            queue: queue.clone(),
            kinds: kinds.clone(),
            limit: permits.len(),
            owner: shared.owner.clone(),
            now,
            lease_until: add(now, shared.options.lease_ttl),
        };
        let wanted = permits.len();
        let claimed = match shared.store.claim(req).await {
            Ok(jobs) => {
                if failing {
                    tracing::info!(queue = %queue, "claiming works again");
                    failing = false;
                }
                jobs
            }
            Err(e) => {
                if !failing {
                    tracing::error!(queue = %queue, error = %e, "cannot claim jobs; will keep trying every poll interval");
                    failing = true;
                }
                Vec::new()
            }
        };
        let got = claimed.len();
        for job in claimed {
            let permit = permits.pop();
            // Known as running here before anything can await: the rescuer never takes it.
            let cancel = shared.hub.register(job.id);
            let _ = ready.send(Ready {
                job,
                cancel,
                claimed: permit,
            });
        }
        drop(permits);
        if got == wanted && got > 0 {
            continue; // more may be due right now
        }
        let poll = shared.options.poll_interval;
        tokio::select! {
            _ = notify.notified() => {}
            _ = tokio::time::sleep(poll) => {}
            _ = jumped(&mut jumps) => {}
            _ = stop.cancelled() => break,
        }
    }
    drop(ready);
    let _ = dispatcher.await;
}

/// A claimed job waiting for a run slot.
struct Ready {
    job: Job,
    cancel: CancellationToken,
    claimed: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// Starts claimed jobs in claim order as run slots free up; at shutdown (or when cancelled before
/// it started) a job is handed back unstarted, its attempt unspent.
async fn dispatch(
    shared: Arc<Shared>,
    mut ready: mpsc::UnboundedReceiver<Ready>,
    run_slots: Arc<Semaphore>,
    stop: CancellationToken,
    hard: CancellationToken,
    tracker: TaskTracker,
    finish: mpsc::UnboundedSender<Finish>,
) {
    while let Some(Ready {
        job,
        cancel,
        claimed,
    }) = ready.recv().await
    {
        let run = tokio::select! {
            biased;
            _ = stop.cancelled() => None,
            p = run_slots.clone().acquire_owned() => p.ok(),
        };
        let id = job.id;
        match run {
            Some(run) if !cancel.is_cancelled() => {
                let (shared, hard, finish) = (shared.clone(), hard.clone(), finish.clone());
                tracker.spawn(async move {
                    execute(&shared, job, cancel, hard, finish).await;
                    shared.hub.unregister(id);
                    drop(run);
                    drop(claimed);
                });
            }
            _ => {
                // The store turns this into a cancel when one was asked for.
                let _ = finish.send(finish_of(&shared, &job, Transition::Return, None));
                shared.hub.unregister(id);
            }
        }
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

/// Runs one attempt of `job` and queues its outcome.
async fn execute(
    shared: &Arc<Shared>,
    job: Job,
    cancel: CancellationToken,
    hard: CancellationToken,
    finish: mpsc::UnboundedSender<Finish>,
) {
    let mut fence = shared.hub.fence_subscribe();
    let Some(kind) = shared.kinds.get(&job.kind).cloned() else {
        return; // claims only ask for known kinds
    };
    let Some(handler) = kind.handler.clone() else {
        return;
    };
    let policy = &kind.policy;
    let mut release_lease = None;
    if let Some(key) = &job.lease_key {
        let now = shared.clock.now();
        let until = add(now, shared.options.lease_ttl);
        match shared
            .store
            .acquire_lease(key, kind.lease_slots, &job, &shared.owner, now, until)
            .await
        {
            Ok(LeaseDecision::Acquired) => release_lease = Some(key.clone()),
            Ok(LeaseDecision::Busy(_)) => {
                // The store snoozed the job in the same write; it wakes when a slot frees.
                shared.hub.wake(&job.queue);
                return;
            }
            Err(e) => {
                tracing::warn!(job = job.id, error = %e, "cannot take the job's lease key; handing the job back");
                let _ = finish.send(finish_of(shared, &job, Transition::Return, None));
                return;
            }
        }
    }

    let job = Arc::new(job);
    let ctx = JobContext {
        job: job.clone(),
        cancel: cancel.clone(),
        clock: shared.clock.clone(),
        store: shared.store.clone(),
        client: super::Client {
            shared: shared.clone(),
        },
    };
    let span = tracing::info_span!("job", id = job.id, kind = %job.kind, attempt = job.attempt);
    let mut handle = tokio::spawn(tracing::Instrument::instrument(handler.call(ctx), span));
    let timeout = policy.timeout;
    let end: Option<AttemptEnd> = tokio::select! {
        r = &mut handle => Some(joined(r)),
        _ = tokio::time::sleep(timeout) => {
            handle.abort();
            Some(AttemptEnd::TimedOut(timeout))
        }
        _ = cancel.cancelled() => {
            match tokio::time::timeout(shared.options.cancel_grace, &mut handle).await {
                Ok(Ok(Ok(()))) => Some(AttemptEnd::Returned(Ok(()))),
                Ok(_) => Some(AttemptEnd::Cancelled),
                Err(_) => {
                    handle.abort();
                    Some(AttemptEnd::Cancelled)
                }
            }
        }
        _ = hard.cancelled() => {
            handle.abort();
            None
        }
        _ = fence.changed() => {
            handle.abort();
            tracing::warn!(job = job.id, "dropped the attempt: this process lost its lease on it");
            return; // no outcome: the job's lease is void and a rescuer decides
        }
    };
    // A handler that saw the cancellation and returned an error ends cancelled, whichever
    // branch above noticed first; one that succeeded anyway stays completed.
    let end = match end {
        Some(AttemptEnd::Returned(Ok(()))) => Some(AttemptEnd::Returned(Ok(()))),
        Some(_) if cancel.is_cancelled() => Some(AttemptEnd::Cancelled),
        other => other,
    };
    let now = shared.clock.now();
    let transition = match end {
        Some(end) => {
            if let AttemptEnd::Returned(Err(e)) = &end {
                tracing::info!(job = job.id, kind = %job.kind, attempt = job.attempt, error = %e, "attempt failed");
            }
            decide(&job, end, policy, now, &mut rand::thread_rng())
        }
        None => Transition::Return,
    };
    let _ = finish.send(finish_of(shared, &job, transition, release_lease));
}

fn joined(r: Result<crate::JobResult, tokio::task::JoinError>) -> AttemptEnd {
    match r {
        Ok(res) => AttemptEnd::Returned(res),
        Err(e) if e.is_panic() => {
            let p = e.into_panic();
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic payload".into());
            AttemptEnd::Panicked(msg)
        }
        Err(_) => AttemptEnd::Cancelled,
    }
}

pub(crate) fn finish_of(
    shared: &Shared,
    job: &Job,
    transition: Transition,
    release_lease: Option<String>,
) -> Finish {
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
        release_lease,
        periodic,
        expired_before: None,
    }
}

/// Records outcomes in batches. A failed write is tried again (the job layer owns its own
/// persistence); if the process dies first, the rescuer finds the jobs by their expired leases.
pub(crate) async fn finisher(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<Finish>) {
    let mut batch = Vec::with_capacity(512);
    while rx.recv_many(&mut batch, 512).await > 0 {
        let mut tries = 0u32;
        loop {
            match shared.store.finish(batch.clone()).await {
                Ok(applied) => {
                    let mut woken = false;
                    for (f, ok) in batch.iter().zip(applied) {
                        if !ok {
                            tracing::warn!(
                                job = f.id,
                                "outcome not recorded: the job's lease was lost to another process"
                            );
                        }
                        woken |=
                            f.release_lease.is_some() || matches!(f.transition, Transition::Return);
                    }
                    if woken {
                        shared.hub.wake_all();
                    }
                    break;
                }
                Err(e) => {
                    tries += 1;
                    if tries == 1 {
                        tracing::error!(error = %e, jobs = batch.len(), "cannot record job outcomes; trying again");
                    }
                    if rx.is_closed() && tries > 30 {
                        tracing::error!(jobs = batch.len(), "giving up on recording outcomes at shutdown; the rescuer will find these jobs");
                        break;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
        batch.clear();
    }
}
