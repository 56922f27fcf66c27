//! Workers: claim due jobs in batches, run each handler with its kind's timeout, turn the answer
//! into a transition, and record outcomes in batches.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::hub::Hold;
use super::kind::JobContext;
use super::Shared;
use crate::clock::add;
use crate::job::Job;
use crate::outcome::{decide, AttemptEnd, Transition};
use crate::store::{ClaimRequest, Finish, LeaseDecision, StoreError};

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
    finish: mpsc::UnboundedSender<Outcome>,
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
        // A clock far off the database's writes leases others misread: take none until it agrees.
        if !super::skew::Skew::within_bound(&shared) {
            drop(first);
            tokio::select! {
                _ = tokio::time::sleep(shared.options.poll_interval) => {}
                _ = stop.cancelled() => break,
            }
            continue;
        }
        let mut permits = vec![first];
        while permits.len() < batch {
            match slots.clone().try_acquire_owned() {
                Ok(p) => permits.push(p),
                Err(_) => break,
            }
        }
        let now = shared.clock.now();
        let started = Instant::now(); // the claimed leases run from here
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
        // A claim that answered after most of a lease: the leases may run out before a renewal
        // reaches the database, so these jobs are handed back unstarted (a guarded write: if a
        // rescuer took one meanwhile, it stays the rescuer's) instead of run here.
        let claimed = if started.elapsed() >= super::maintenance::fence_after(&shared) {
            tracing::warn!(queue = %queue, jobs = claimed.len(), "a claim answered too late to run its jobs safely; handing them back");
            for job in &claimed {
                let _ = finish.send(Outcome::unheld(finish_of(
                    &shared,
                    job,
                    Transition::Return,
                    None,
                )));
            }
            Vec::new()
        } else {
            claimed
        };
        for job in claimed {
            let permit = permits.pop();
            // Held here before anything can await: the rescuer never takes it.
            let hold = shared.hub.register(job.id, job.attempt, started);
            let _ = ready.send(Ready {
                job,
                hold,
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
    hold: Hold,
    claimed: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// An outcome to write, and the hold to release once it is written.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub(crate) finish: Finish,
    pub(crate) hold: Option<u64>,
}

impl Outcome {
    /// An outcome for a job this process does not hold (a rescue).
    pub(crate) fn unheld(finish: Finish) -> Self {
        Outcome { finish, hold: None }
    }
}

/// Releases a held job when its attempt's task ends without queuing an outcome (no outcome to
/// write, or a panic in the runtime itself), so its lease runs out instead of being renewed.
struct Unhold<'a> {
    shared: &'a Shared,
    id: crate::job::JobId,
    serial: u64,
}

impl Drop for Unhold<'_> {
    fn drop(&mut self) {
        self.shared
            .hub
            .release_unless_finishing(self.id, self.serial);
    }
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
    finish: mpsc::UnboundedSender<Outcome>,
) {
    while let Some(Ready { job, hold, claimed }) = ready.recv().await {
        let run = tokio::select! {
            biased;
            _ = stop.cancelled() => None,
            _ = hold.lost.cancelled() => None,
            p = run_slots.clone().acquire_owned() => p.ok(),
        };
        let id = job.id;
        match run {
            _ if hold.lost.is_cancelled() => {} // the fence dropped it before it started
            Some(run) if !hold.cancel.is_cancelled() => {
                let (shared, hard, finish) = (shared.clone(), hard.clone(), finish.clone());
                tracker.spawn(async move {
                    let _unhold = Unhold {
                        shared: &shared,
                        id,
                        serial: hold.serial,
                    };
                    execute(&shared, job, &hold, hard, &finish).await;
                    drop(run);
                    drop(claimed);
                });
            }
            _ => {
                // The store turns this into a cancel when one was asked for.
                send(
                    &shared,
                    &finish,
                    finish_of(&shared, &job, Transition::Return, None),
                    &hold,
                );
            }
        }
    }
}

/// Queues the outcome of a held job; the finisher releases the hold once it is written.
fn send(shared: &Shared, finish: &mpsc::UnboundedSender<Outcome>, f: Finish, hold: &Hold) {
    let id = f.id;
    shared.hub.finishing(id, hold.serial);
    if finish
        .send(Outcome {
            finish: f,
            hold: Some(hold.serial),
        })
        .is_err()
    {
        shared.hub.release(id, hold.serial);
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
    hold: &Hold,
    hard: CancellationToken,
    finish: &mpsc::UnboundedSender<Outcome>,
) {
    let cancel = hold.cancel.clone();
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
        let decision = tokio::select! {
            biased;
            // Lost while waiting for the key: whatever the store did, a rescuer releases it.
            _ = hold.lost.cancelled() => return,
            d = shared
                .store
                .acquire_lease(key, kind.lease_slots, &job, &shared.owner, now, until) => d,
        };
        match decision {
            Ok(LeaseDecision::Acquired) => release_lease = Some(key.clone()),
            Ok(LeaseDecision::Busy(_)) => {
                // The store snoozed the job in the same write; it wakes when a slot frees.
                shared.hub.wake(&job.queue);
                return;
            }
            Err(e) => {
                tracing::warn!(job = job.id, error = %e, "cannot take the job's lease key; handing the job back");
                send(
                    shared,
                    finish,
                    finish_of(shared, &job, Transition::Return, None),
                    hold,
                );
                return;
            }
        }
    }

    if hold.lost.is_cancelled() {
        return; // fenced before it could start
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
            tokio::select! {
                biased;
                _ = hold.lost.cancelled() => {
                    handle.abort();
                    tracing::warn!(job = job.id, "dropped the attempt: this process lost its lease on it");
                    return;
                }
                r = tokio::time::timeout(shared.options.cancel_grace, &mut handle) => match r {
                    Ok(Ok(Ok(()))) => Some(AttemptEnd::Returned(Ok(()))),
                    Ok(_) => Some(AttemptEnd::Cancelled),
                    Err(_) => {
                        handle.abort();
                        Some(AttemptEnd::Cancelled)
                    }
                },
            }
        }
        _ = hard.cancelled() => {
            handle.abort();
            None
        }
        _ = hold.lost.cancelled() => {
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
    send(
        shared,
        finish,
        finish_of(shared, &job, transition, release_lease),
        hold,
    );
}

fn joined(r: Result<crate::JobResult, tokio::task::JoinError>) -> AttemptEnd {
    match r {
        Ok(res) => AttemptEnd::Returned(res),
        Err(e) if e.is_panic() => {
            AttemptEnd::Panicked(crate::outcome::panic_message(e.into_panic().as_ref()))
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

/// How many times one outcome that the database refuses on its own is written again before it
/// is given up (its lease then runs out and the rescuer counts the attempt as lost).
const MAX_STRIKES: u32 = 3;
/// After this many failed batch writes in a row, even ones that look transient, the outcomes are
/// written one by one to find any that fail alone.
const SPLIT_AFTER: u32 = 3;
/// The most outcomes written in one batch.
const BATCH: usize = 512;

/// Records outcomes in batches. A write the database cannot take now is tried again (the job
/// layer owns its own persistence), and outcomes that arrive meanwhile join the next try. A batch
/// that the database refuses, or that keeps failing, is written item by item, so one bad outcome
/// never holds up the others; an outcome that fails on its own while others are written is given
/// up after a few tries rather than retried forever. If the process dies first, the rescuer finds
/// the jobs by their expired leases. Once `abandon` fires (shutdown ran out of time) nothing more
/// is tried.
pub(crate) async fn finisher(
    shared: Arc<Shared>,
    mut rx: mpsc::UnboundedReceiver<Outcome>,
    abandon: CancellationToken,
) {
    let mut pending: Vec<Outcome> = Vec::with_capacity(BATCH);
    let mut strikes: HashMap<(crate::job::JobId, u32), u32> = HashMap::new();
    let mut failures = 0u32;
    loop {
        if pending.is_empty() {
            failures = 0;
            if rx.recv_many(&mut pending, BATCH).await == 0 {
                return;
            }
        } else {
            while pending.len() < BATCH {
                match rx.try_recv() {
                    Ok(o) => pending.push(o),
                    Err(_) => break,
                }
            }
        }
        let finishes: Vec<Finish> = pending.iter().map(|o| o.finish.clone()).collect();
        let err = match shared.store.finish(finishes).await {
            Ok(applied) => {
                recorded(&shared, &pending, &applied);
                if !strikes.is_empty() {
                    for o in &pending {
                        strikes.remove(&(o.finish.id, o.finish.attempt));
                    }
                }
                pending.clear();
                continue;
            }
            Err(e) => e,
        };
        if matches!(err, StoreError::Closed) || abandon.is_cancelled() {
            give_up(&shared, &pending, &err);
            pending.clear();
            continue;
        }
        failures += 1;
        if failures == 1 {
            tracing::error!(error = %err, jobs = pending.len(), "cannot record job outcomes; trying again");
        }
        if !err.is_transient() || failures >= SPLIT_AFTER {
            // One by one: what can be written is, and an outcome that fails while others are
            // written (or that the database refuses) is struck.
            let mut failed = Vec::new();
            let mut any_written = false;
            for o in std::mem::take(&mut pending) {
                match shared.store.finish(vec![o.finish.clone()]).await {
                    Ok(applied) => {
                        strikes.remove(&(o.finish.id, o.finish.attempt));
                        recorded(&shared, std::slice::from_ref(&o), &applied);
                        any_written = true;
                    }
                    Err(e) => failed.push((o, e)),
                }
            }
            for (o, e) in failed {
                if e.is_transient() && !any_written && !abandon.is_cancelled() {
                    pending.push(o); // the database is away: wait for it
                    continue;
                }
                let key = (o.finish.id, o.finish.attempt);
                let n = strikes.entry(key).or_insert(0);
                *n += 1;
                if *n >= MAX_STRIKES || abandon.is_cancelled() {
                    strikes.remove(&key);
                    give_up(&shared, std::slice::from_ref(&o), &e);
                } else {
                    tracing::warn!(job = o.finish.id, error = %e, "a job's outcome could not be written; trying again");
                    pending.push(o);
                }
            }
            if pending.is_empty() {
                continue;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = abandon.cancelled() => {}
        }
    }
}

/// After a write: logs lost leases, releases holds, wakes workers where a slot or a job freed.
fn recorded(shared: &Shared, outcomes: &[Outcome], applied: &[bool]) {
    let mut woken = false;
    for (o, ok) in outcomes.iter().zip(applied) {
        let f = &o.finish;
        if !ok {
            tracing::warn!(
                job = f.id,
                "outcome not recorded: the job's lease was lost to another process"
            );
        }
        if let Some(serial) = o.hold {
            shared.hub.release(f.id, serial);
        }
        woken |= f.release_lease.is_some() || matches!(f.transition, Transition::Return);
    }
    if woken {
        shared.hub.wake_all();
    }
}

fn give_up(shared: &Shared, outcomes: &[Outcome], e: &StoreError) {
    for o in outcomes {
        tracing::error!(
            job = o.finish.id,
            error = %e,
            "giving up on recording a job's outcome; its lease will run out and the rescuer will count the attempt as lost"
        );
        if let Some(serial) = o.hold {
            shared.hub.release(o.finish.id, serial);
        }
    }
}
