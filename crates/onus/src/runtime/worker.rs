//! Workers: claim due jobs in batches, run each handler with its kind's timeout, turn the answer
//! into a transition, and record outcomes in batches.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
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
use crate::StoreResult;

/// One queue's producer: claims due jobs in batches and spawns their attempts.
///
/// A queue runs at most `concurrency` attempts at once and holds more claimed jobs ready to start
/// (so the next claim overlaps the current attempts instead of waiting for a slot to free): as
/// many as it has slots, or, when its handlers finish faster than claims come back, what they
/// finish in two claim round trips (see [`ReadyTarget`]). Claimed jobs start in claim order; one
/// not started by shutdown is handed back.
pub(crate) async fn run_queue(
    shared: Arc<Shared>,
    queue: String,
    concurrency: usize,
    stop: CancellationToken,
    hard: CancellationToken,
    tracker: TaskTracker,
    finish: mpsc::UnboundedSender<Outcome>,
) {
    let batch = shared.options.claim_batch.max(1);
    let slots = Arc::new(Semaphore::new(concurrency * 2)); // claimed: running or ready
    let started = Arc::new(AtomicU64::new(0));
    let mut target = ReadyTarget::new(slots.clone(), concurrency, batch, started.clone());
    let (ready, ready_rx) = mpsc::unbounded_channel::<Ready>();
    let intake = Arc::new(Intake {
        slots: slots.clone(),
        idle: AtomicBool::new(false),
        ready: ready.clone(),
        finish: finish.clone(),
    });
    shared.hub.set_intake(&queue, Some(intake.clone()));
    let dispatcher = tokio::spawn(dispatch(
        shared.clone(),
        ready_rx,
        RunSlots {
            free: Arc::new(Semaphore::new(concurrency)),
            concurrency,
            started,
        },
        stop.clone(),
        hard.clone(),
        tracker.clone(),
        finish.clone(),
    ));
    let notify = shared.hub.queue(&queue);
    let mut jumps = shared.clock.jumps();
    let kinds = shared.handled_kinds();
    let mut failing = false;
    // No claim before this process knows how far its clock is from the database's.
    tokio::select! {
        _ = shared.skew.measured() => {}
        _ = stop.cancelled() => {}
    }
    // Up to two claims are in flight at once: each one's statement runs while the other waits for
    // its durable commit, so the disk's commit time no longer bounds how fast jobs are taken. The
    // two run concurrently, so either may take the jobs that come first: the jobs of an answer
    // that arrives while the other claim is still out are held at once (renewed by the heartbeat,
    // never rescued) but wait, no new claim starts meanwhile, and the jobs of both start together
    // in order (priority, run_at, id).
    let mut inflight = futures_util::stream::FuturesUnordered::new();
    // Jobs of answers waiting for the other claim's, their permits, and how many came of how many
    // asked for.
    let mut held: Vec<(Job, Hold)> = Vec::new();
    let mut held_permits = Vec::new();
    let (mut held_got, mut held_wanted) = (0usize, 0usize);
    // The last claim came back short: wait for a wake-up (or the poll) before claiming again.
    let mut drained = false;
    loop {
        // Idle: this process's own inserts may claim for this queue (see `Intake`).
        intake
            .idle
            .store(drained && inflight.is_empty(), Ordering::SeqCst);
        tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            Some((claimed, permits, started, wanted)) = inflight.next(), if !inflight.is_empty() => {
                target.answered(Instant::elapsed(&started));
                let (jobs, got) = hold_claimed(&shared, &queue, &finish, claimed, started, &mut failing);
                held.extend(jobs);
                held_permits.extend(permits);
                held_got += got;
                held_wanted += wanted;
                if inflight.is_empty() {
                    start_held(&ready, std::mem::take(&mut held), std::mem::take(&mut held_permits));
                    if held_got < held_wanted || held_got == 0 {
                        drained = true;
                    }
                    (held_got, held_wanted) = (0, 0);
                }
            }
            first = slots.clone().acquire_owned(), if inflight.len() < MAX_CLAIMS_IN_FLIGHT && held_wanted == 0 && !drained => {
                let Ok(first) = first else { break };
                // A clock far off the database's writes leases others misread: take none until
                // it agrees.
                if !super::skew::Skew::within_bound(&shared) {
                    drop(first);
                    tokio::select! {
                        _ = tokio::time::sleep(shared.options.poll_interval) => {}
                        _ = stop.cancelled() => break,
                    }
                    continue;
                }
                target.adjust();
                let permits = gather(&slots, first, target.claim_size(), &stop).await;
                let now = shared.clock.now();
                let started = Instant::now(); // the claimed leases run from here
                let req = ClaimRequest {
                    queue: queue.clone(),
                    kinds: kinds.clone(),
                    limit: permits.len(),
                    owner: shared.owner.clone(),
                    now,
                    lease_until: add(now, shared.options.lease_ttl),
                    caps: shared.caps(&kinds),
                };
                let wanted = permits.len();
                let store = shared.store.clone();
                inflight.push(async move { (store.claim(req).await, permits, started, wanted) });
            }
            _ = notify.notified(), if drained && inflight.is_empty() => drained = false,
            _ = tokio::time::sleep(shared.options.poll_interval), if drained && inflight.is_empty() => drained = false,
            _ = jumped(&mut jumps), if drained && inflight.is_empty() => drained = false,
        }
    }
    intake.idle.store(false, Ordering::SeqCst);
    shared.hub.set_intake(&queue, None);
    drop(intake);
    // Claims still in flight end here; what they took is handed back.
    while let Some((claimed, permits, started, _)) = inflight.next().await {
        held.extend(hold_claimed(&shared, &queue, &finish, claimed, started, &mut failing).0);
        held_permits.extend(permits);
    }
    start_held(&ready, held, held_permits);
    drop(ready);
    let _ = dispatcher.await;
}

/// A queue's door for the jobs its own process inserts while the queue is idle (its last claim
/// found nothing more and none is in flight): the insert claims them in its own transaction, one
/// commit for both, and hands them here to start, under the same slots, holds and fence as claimed
/// jobs. Under a backlog the queue is not idle and inserts wait their turn in the database.
pub(crate) struct Intake {
    slots: Arc<Semaphore>,
    idle: AtomicBool,
    ready: mpsc::UnboundedSender<Ready>,
    finish: mpsc::UnboundedSender<Outcome>,
}

impl std::fmt::Debug for Intake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Intake")
            .field("idle", &self.idle.load(Ordering::SeqCst))
            .field("free", &self.slots.available_permits())
            .finish()
    }
}

impl Intake {
    /// Whether the queue's worker found nothing at its last claim and runs nothing.
    pub(crate) fn is_idle(&self) -> bool {
        self.idle.load(Ordering::SeqCst)
    }

    /// A free slot for one inserted job, if the queue is idle.
    pub(crate) fn offer(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        if !self.idle.load(Ordering::SeqCst) {
            return None;
        }
        self.slots.clone().try_acquire_owned().ok()
    }

    /// Starts the jobs an insert claimed (`started`: when the insert began; their leases run from
    /// then). Unused permits are released.
    pub(crate) fn deliver(
        &self,
        shared: &Arc<Shared>,
        queue: &str,
        jobs: Vec<Job>,
        permits: Vec<tokio::sync::OwnedSemaphorePermit>,
        started: Instant,
    ) {
        let mut failing = false;
        let (held, _) = hold_claimed(shared, queue, &self.finish, Ok(jobs), started, &mut failing);
        start_held(&self.ready, held, permits);
    }
}

/// How many claimed jobs a queue holds beyond those running.
///
/// At least as many as the queue has slots: that covers handlers that take longer than a claim's
/// round trip, and holds no more jobs back from other processes than slots would. When handlers
/// finish faster than that (short jobs under a backlog), the ready jobs run out before the next
/// claim answers and the slots wait on the database; the target then grows to what the handlers
/// start in two claim round trips, both measured as the queue runs, up to four claim batches. It
/// shrinks again as the handlers slow down or the queue goes idle. Claims ask for half the claimed
/// jobs the queue may hold, up to `claim_batch`, so bigger targets mean fewer, larger claims: a
/// claim's statement and its durable commit cost about the same for 16 jobs as for 100.
struct ReadyTarget {
    /// The queue's claimed-job permits (running or ready): `concurrency + extra`.
    slots: Arc<Semaphore>,
    concurrency: usize,
    batch: usize,
    /// Permits beyond `concurrency`.
    extra: usize,
    /// Handlers the queue has started.
    started: Arc<AtomicU64>,
    /// When `rate` was last measured, and `started` then.
    mark: (Instant, u64),
    /// Handlers started per second, smoothed.
    rate: f64,
    /// A claim's round trip in seconds, smoothed.
    rtt: f64,
}

/// The shortest window the start rate is measured over.
const RATE_WINDOW: Duration = Duration::from_millis(5);

impl ReadyTarget {
    fn new(
        slots: Arc<Semaphore>,
        concurrency: usize,
        batch: usize,
        started: Arc<AtomicU64>,
    ) -> Self {
        ReadyTarget {
            slots,
            concurrency,
            batch,
            extra: concurrency,
            started,
            mark: (Instant::now(), 0),
            rate: 0.0,
            rtt: 0.0,
        }
    }

    /// The most claimed jobs held beyond the slots.
    fn cap(&self) -> usize {
        (self.batch * 4).max(self.concurrency)
    }

    /// A claim answered after `took`.
    fn answered(&mut self, took: Duration) {
        let t = took.as_secs_f64();
        self.rtt = if self.rtt == 0.0 {
            t
        } else {
            0.8 * self.rtt + 0.2 * t
        };
    }

    /// Measures the start rate and resizes the queue's permits toward the target.
    fn adjust(&mut self) {
        let now = Instant::now();
        let dt = now.duration_since(self.mark.0);
        if dt < RATE_WINDOW {
            return;
        }
        let n = self.started.load(Ordering::Relaxed);
        let r = n.saturating_sub(self.mark.1) as f64 / dt.as_secs_f64();
        self.mark = (now, n);
        self.rate = 0.5 * self.rate + 0.5 * r;
        let want =
            ((self.rate * self.rtt * 2.0).ceil() as usize).clamp(self.concurrency, self.cap());
        if want > self.extra {
            self.slots.add_permits(want - self.extra);
            self.extra = want;
        } else if want < self.extra {
            // Only free permits can go; the rest go at a later adjustment.
            self.extra -= self.slots.forget_permits(self.extra - want);
        }
    }

    /// How many jobs the next claim asks for, at most.
    fn claim_size(&self) -> usize {
        ((self.concurrency + self.extra) / 2).clamp(1, self.batch)
    }
}

/// The longest a claim waits for half its queue's slots to free.
const GATHER_FOR: Duration = Duration::from_millis(1);
/// Claims of one queue in flight at once.
const MAX_CLAIMS_IN_FLIGHT: usize = 2;

/// The permits a claim asks with: `first`, those free now, and, under load, those that free
/// within [`GATHER_FOR`] until there are `gather`. Slots free one at a time as attempts end, and a
/// claim started at the first would take a few jobs and pay a claim's fixed cost (a statement and
/// a durable commit) for each few; the other half of the slots still holds claimed jobs ready to
/// start, so handlers are not kept waiting.
async fn gather(
    slots: &Arc<Semaphore>,
    first: tokio::sync::OwnedSemaphorePermit,
    gather: usize,
    stop: &CancellationToken,
) -> Vec<tokio::sync::OwnedSemaphorePermit> {
    let mut permits = vec![first];
    while permits.len() < gather {
        match slots.clone().try_acquire_owned() {
            Ok(p) => permits.push(p),
            Err(_) => break,
        }
    }
    if permits.len() < gather {
        let until = tokio::time::Instant::now() + GATHER_FOR;
        while permits.len() < gather {
            tokio::select! {
                p = slots.clone().acquire_owned() => match p {
                    Ok(p) => permits.push(p),
                    Err(_) => break,
                },
                _ = tokio::time::sleep_until(until) => break,
                _ = stop.cancelled() => break,
            }
        }
    }
    permits
}

/// Takes a claim's answer: holds each job at once (from then on the heartbeat renews it and the
/// rescuer leaves it alone), or hands all back when the claim answered too late to run them
/// safely; returns the held jobs and how many came.
fn hold_claimed(
    shared: &Arc<Shared>,
    queue: &str,
    finish: &mpsc::UnboundedSender<Outcome>,
    claimed: StoreResult<Vec<Job>>,
    started: Instant,
    failing: &mut bool,
) -> (Vec<(Job, Hold)>, usize) {
    let claimed = match claimed {
        Ok(jobs) => {
            if *failing {
                tracing::info!(queue = %queue, "claiming works again");
                *failing = false;
            }
            jobs
        }
        Err(e) => {
            if !*failing {
                tracing::error!(queue = %queue, error = %e, "cannot claim jobs; will keep trying every poll interval");
                *failing = true;
            }
            Vec::new()
        }
    };
    let got = claimed.len();
    // A claim that answered after most of a lease: the leases may run out before a renewal
    // reaches the database, so these jobs are handed back unstarted (a guarded write: if a
    // rescuer took one meanwhile, it stays the rescuer's) instead of run here.
    if started.elapsed() >= super::maintenance::fence_after(shared) {
        tracing::warn!(queue = %queue, jobs = claimed.len(), "a claim answered too late to run its jobs safely; handing them back");
        for job in &claimed {
            let _ = finish.send(Outcome::unheld(finish_of(
                shared,
                job,
                Transition::Return,
                None,
            )));
        }
        return (Vec::new(), got);
    }
    let claimed_at = shared.clock.now();
    let held = claimed
        .into_iter()
        .map(|job| {
            super::metrics::picked_up(queue, claimed_at - job.run_at);
            let hold = shared.hub.register(job.id, job.attempt, started);
            (job, hold)
        })
        .collect();
    (held, got)
}

/// Queues held jobs to start, in order (priority, run_at, id), each with one of `permits`.
fn start_held(
    ready: &mpsc::UnboundedSender<Ready>,
    mut jobs: Vec<(Job, Hold)>,
    mut permits: Vec<tokio::sync::OwnedSemaphorePermit>,
) {
    jobs.sort_by_key(|(j, _)| (j.priority, j.run_at, j.id));
    for (job, hold) in jobs {
        let _ = ready.send(Ready {
            job,
            hold,
            claimed: permits.pop(),
        });
    }
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
    /// The kind and how long the attempt ran, counted in the metrics once the outcome is
    /// recorded (an outcome refused by its lease guard was never this process's to count).
    pub(crate) counted: Option<(String, Option<Duration>)>,
    /// The handler completed the job in its own transaction
    /// ([`JobContext::complete_with`](crate::JobContext::complete_with)): this write finds it
    /// done, which is no lost lease.
    pub(crate) pre_completed: bool,
    /// The attempt's count on its lease key, let go of (dropped) when this outcome is written or
    /// given up.
    pub(crate) _ticket: Option<super::hub::KeyTicket>,
}

impl Outcome {
    /// An outcome for a job this process does not hold (a rescue).
    pub(crate) fn unheld(finish: Finish) -> Self {
        Outcome {
            finish,
            hold: None,
            counted: None,
            pre_completed: false,
            _ticket: None,
        }
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

/// The most jobs of one lease key kept aside in a queue, per slot of the key.
const PARKED_PER_SLOT: usize = 8;

/// A queue's run slots, and a count of the handlers started in them.
struct RunSlots {
    free: Arc<Semaphore>,
    concurrency: usize,
    started: Arc<AtomicU64>,
}

/// Jobs a queue keeps aside because this process already takes their lease key in all its
/// slots (see [`super::hub::KeyGates`]): they wait here, held and renewed but in no run slot,
/// and try the key when one of this process's attempts lets go of it, instead of each asking the
/// database, finding the key busy and sleeping until a release wakes it. At most
/// [`PARKED_PER_SLOT`] per slot of a key, and at most as many in all as the queue has slots: each
/// holds one of the queue's claimed-job permits, of which there are at least twice the slots, so
/// while a run slot is free a claim still finds a permit for the jobs of other keys. The others
/// take the usual path.
#[derive(Default)]
struct Parked {
    by_key: HashMap<String, std::collections::VecDeque<Ready>>,
    count: usize,
}

impl Parked {
    /// Keeps `r` aside if its key is taken here in all its slots and there is room; else gives
    /// it back.
    fn park(&mut self, shared: &Shared, r: Ready, concurrency: usize) -> Option<Ready> {
        let Some(key) = r.job.lease_key.as_deref() else {
            return Some(r);
        };
        let slots = shared.kinds.get(&r.job.kind).map_or(1, |k| k.lease_slots);
        let waiting = self.by_key.get(key).map_or(0, |q| q.len());
        if self.count >= concurrency.max(1)
            || waiting >= PARKED_PER_SLOT * slots as usize
            || !shared.hub.keys.full(key, slots)
        {
            return Some(r);
        }
        self.by_key.entry(key.to_string()).or_default().push_back(r);
        self.count += 1;
        None
    }

    /// The next job kept aside for `key`.
    fn take(&mut self, key: &str) -> Option<Ready> {
        let q = self.by_key.get_mut(key)?;
        let r = q.pop_front();
        if q.is_empty() {
            self.by_key.remove(key);
        }
        if r.is_some() {
            self.count -= 1;
        }
        r
    }

    fn drain(&mut self) -> Vec<Ready> {
        self.count = 0;
        self.by_key.drain().flat_map(|(_, q)| q).collect()
    }
}

/// Starts claimed jobs in claim order as run slots free up; at shutdown (or when cancelled before
/// it started) a job is handed back unstarted, its attempt unspent.
async fn dispatch(
    shared: Arc<Shared>,
    mut ready: mpsc::UnboundedReceiver<Ready>,
    run_slots: RunSlots,
    stop: CancellationToken,
    hard: CancellationToken,
    tracker: TaskTracker,
    finish: mpsc::UnboundedSender<Outcome>,
) {
    let mut parked = Parked::default();
    let mut freed = shared.hub.keys.watch();
    loop {
        let next = tokio::select! {
            biased;
            Some(key) = freed.recv() => match parked.take(&key) {
                Some(r) => r,
                None => continue,
            },
            r = ready.recv() => match r {
                Some(r) => r,
                None => break,
            },
        };
        let Some(Ready { job, hold, claimed }) = parked.park(&shared, next, run_slots.concurrency)
        else {
            continue;
        };
        let run = tokio::select! {
            biased;
            _ = stop.cancelled() => None,
            _ = hold.lost.cancelled() => None,
            p = run_slots.free.clone().acquire_owned() => p.ok(),
        };
        let id = job.id;
        match run {
            _ if hold.lost.is_cancelled() => {} // the fence dropped it before it started
            Some(run) if !hold.cancel.is_cancelled() => {
                let (shared, hard, finish) = (shared.clone(), hard.clone(), finish.clone());
                let started = run_slots.started.clone();
                let ticket = job.lease_key.as_deref().map(|k| shared.hub.keys.enter(k));
                tracker.spawn(async move {
                    let _unhold = Unhold {
                        shared: &shared,
                        id,
                        serial: hold.serial,
                    };
                    execute(&shared, job, &hold, hard, &finish, &started, ticket).await;
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
    // Stopping: jobs kept aside are handed back unstarted, as any other not started.
    for Ready { job, hold, .. } in parked.drain() {
        if !hold.lost.is_cancelled() {
            send(
                &shared,
                &finish,
                finish_of(&shared, &job, Transition::Return, None),
                &hold,
            );
        }
    }
}

/// Queues the outcome of a held job; the finisher releases the hold once it is written.
fn send(shared: &Shared, finish: &mpsc::UnboundedSender<Outcome>, f: Finish, hold: &Hold) {
    send_outcome(shared, finish, f, hold, None, false, None);
}

fn send_outcome(
    shared: &Shared,
    finish: &mpsc::UnboundedSender<Outcome>,
    f: Finish,
    hold: &Hold,
    counted: Option<(String, Option<Duration>)>,
    pre_completed: bool,
    ticket: Option<super::hub::KeyTicket>,
) {
    let id = f.id;
    shared.hub.finishing(id, hold.serial);
    if finish
        .send(Outcome {
            finish: f,
            hold: Some(hold.serial),
            counted,
            pre_completed,
            _ticket: ticket,
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
    started: &AtomicU64,
    ticket: Option<super::hub::KeyTicket>,
) {
    let cancel = hold.cancel.clone();
    let Some(kind) = shared.kinds.get(&job.kind).cloned() else {
        return; // claims only ask for known kinds
    };
    let Some(handler) = kind.handler.clone() else {
        return;
    };
    let policy = &kind.policy;
    // A retry over its kind's budget waits for it, before it takes anything.
    if let Some(defer) = shared.admit(&job) {
        send(shared, finish, finish_of(shared, &job, defer, None), hold);
        return;
    }
    let mut release_lease = None;
    if let Some(key) = &job.lease_key {
        let now = shared.clock.now();
        let until = add(now, shared.options.lease_ttl);
        let decision = tokio::select! {
            biased;
            // Lost while waiting for the key: a slot taken meanwhile is released by the rescue or
            // lapses within a lease (nobody renews it).
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
            // The store held the job in the same write until the key's pause ends.
            Ok(LeaseDecision::Paused(_)) => return,
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

    // A spent rate window snoozes or drops the job, letting go of its lease key.
    if let Some(t) = shared.take_rate(&job).await {
        send(
            shared,
            finish,
            finish_of(shared, &job, t, release_lease),
            hold,
        );
        return;
    }
    if hold.lost.is_cancelled() {
        return; // fenced before it could start
    }
    // Counted for the ready buffer once the handler starts: a job that found its lease key busy
    // ran nothing, and counting it would grow the buffer with more jobs of busy keys.
    started.fetch_add(1, Ordering::Relaxed);
    let job = Arc::new(job);
    let completed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let kept = Arc::new(std::sync::Mutex::new(None));
    let ctx = JobContext {
        job: job.clone(),
        cancel: cancel.clone(),
        clock: shared.clock.clone(),
        store: shared.store.clone(),
        client: super::Client {
            shared: shared.clone(),
        },
        held_lease: release_lease.clone(),
        completed: completed.clone(),
        result: kept.clone(),
    };
    let span = tracing::info_span!("job", id = job.id, kind = %job.kind, attempt = job.attempt);
    let began = Instant::now();
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
            if completed.load(std::sync::atomic::Ordering::SeqCst) {
                // Not lost: the handler completed the job in its own transaction, and a renewal
                // found it no longer running. Its outcome is recorded as that completion.
                Some(AttemptEnd::Returned(Ok(())))
            } else {
                tracing::warn!(job = job.id, "dropped the attempt: this process lost its lease on it");
                return; // no outcome: the job's lease is void and a rescuer decides
            }
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
    // Completed in the handler's own transaction: that is the outcome, whatever came after.
    let pre_completed = completed.load(std::sync::atomic::Ordering::SeqCst);
    let transition = if pre_completed {
        Transition::Complete
    } else {
        transition
    };
    // A completion keeps the result its handler set (one completed in the handler's own
    // transaction wrote it there).
    let result = match transition {
        Transition::Complete if !pre_completed => {
            kept.lock().unwrap_or_else(|e| e.into_inner()).take()
        }
        _ => None,
    };
    send_outcome(
        shared,
        finish,
        Finish {
            result,
            ..finish_of(shared, &job, transition, release_lease)
        },
        hold,
        Some((job.kind.clone(), Some(began.elapsed()))),
        pre_completed,
        // Let go of once this outcome, which releases the key, is written.
        ticket,
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
        result: None,
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

/// An outcome waiting to be written, and how its writes have gone.
struct Pending {
    outcome: Outcome,
    /// Times the database refused it on its own.
    strikes: u32,
    /// When its writes started failing.
    failing_since: Option<Instant>,
}

impl Pending {
    fn of(outcome: Outcome) -> Self {
        Pending {
            outcome,
            strikes: 0,
            failing_since: None,
        }
    }
}

/// Records outcomes in batches, [`WRITERS`] batches at once: one batch's statement runs while
/// another waits for its durable commit, and under load outcomes no longer queue behind a single
/// write. Each writer takes what has arrived from the one channel, so a job's outcome is in
/// exactly one batch.
pub(crate) async fn finisher(
    shared: Arc<Shared>,
    rx: mpsc::UnboundedReceiver<Outcome>,
    abandon: CancellationToken,
) {
    let rx = tokio::sync::Mutex::new(rx);
    let writers = (0..WRITERS).map(|_| write_outcomes(&shared, &rx, &abandon));
    futures_util::future::join_all(writers).await;
}

/// Batches of outcomes written at once.
const WRITERS: usize = 2;

/// One writer of outcomes. A write the database cannot take now is tried again (the job
/// layer owns its own persistence), and outcomes that arrive meanwhile join the next try. A batch
/// that the database refuses, or that keeps failing, is written item by item, so one bad outcome
/// never holds up the others. No outcome is tried forever: one the database refuses on its own is
/// given up after a few tries, and one that keeps failing for two leases while the database
/// answers other writes (renewals included) is given up too; given up, its lease runs out and the
/// rescuer counts the attempt as lost. While the database answers nothing, outcomes wait for it.
/// Once `abandon` fires (shutdown ran out of time) nothing more is tried.
async fn write_outcomes(
    shared: &Arc<Shared>,
    rx: &tokio::sync::Mutex<mpsc::UnboundedReceiver<Outcome>>,
    abandon: &CancellationToken,
) {
    let mut pending: Vec<Pending> = Vec::with_capacity(BATCH);
    let mut failures = 0u32;
    let give_up_after = shared.options.lease_ttl.saturating_mul(2);
    loop {
        if pending.is_empty() {
            failures = 0;
            let mut fresh = Vec::with_capacity(BATCH);
            if rx.lock().await.recv_many(&mut fresh, BATCH).await == 0 {
                return;
            }
            pending.extend(fresh.into_iter().map(Pending::of));
        } else if let Ok(mut rx) = rx.try_lock() {
            while pending.len() < BATCH {
                match rx.try_recv() {
                    Ok(o) => pending.push(Pending::of(o)),
                    Err(_) => break,
                }
            }
        }
        let finishes: Vec<Finish> = pending.iter().map(|p| p.outcome.finish.clone()).collect();
        let err = match shared.store.finish(finishes).await {
            Ok(applied) => {
                shared.hub.store_answered();
                let done: Vec<Outcome> = pending.drain(..).map(|p| p.outcome).collect();
                recorded(shared, &done, &applied);
                continue;
            }
            Err(e) => e,
        };
        if matches!(err, StoreError::Closed) || abandon.is_cancelled() {
            for p in pending.drain(..) {
                give_up(shared, &p.outcome, &err);
            }
            continue;
        }
        failures += 1;
        let now = Instant::now();
        for p in pending.iter_mut() {
            p.failing_since.get_or_insert(now);
        }
        if failures == 1 {
            tracing::error!(error = %err, jobs = pending.len(), "cannot record job outcomes; trying again");
        }
        if !err.is_transient() || failures >= SPLIT_AFTER {
            failures = 0;
            pending = one_by_one(shared, std::mem::take(&mut pending), give_up_after).await;
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

/// Writes the outcomes one at a time; returns the ones to try again. A transient failure before
/// anything was written means the database is away: the pass stops there and everything waits.
async fn one_by_one(shared: &Shared, items: Vec<Pending>, give_up_after: Duration) -> Vec<Pending> {
    let mut kept = Vec::new();
    let mut written = false;
    let mut items = items.into_iter();
    while let Some(mut p) = items.next() {
        let e = match shared.store.finish(vec![p.outcome.finish.clone()]).await {
            Ok(applied) => {
                shared.hub.store_answered();
                recorded(shared, std::slice::from_ref(&p.outcome), &applied);
                written = true;
                continue;
            }
            Err(e) => e,
        };
        if e.is_transient() {
            let since = p.failing_since.unwrap_or_else(Instant::now);
            // Failing this long while the database answered other calls since: give up.
            let answered = shared.hub.store_answered_since(since);
            if answered && since.elapsed() >= give_up_after {
                give_up(shared, &p.outcome, &e);
                continue;
            }
            kept.push(p);
            if !written && !answered {
                kept.extend(items); // the database is away: wait for it
                return kept;
            }
            continue;
        }
        p.strikes += 1;
        if p.strikes >= MAX_STRIKES {
            give_up(shared, &p.outcome, &e);
        } else {
            tracing::warn!(job = p.outcome.finish.id, error = %e, "the database refused a job's outcome; trying again");
            kept.push(p);
        }
    }
    kept
}

/// After a write: logs lost leases, releases holds, wakes workers where a slot or a job freed.
fn recorded(shared: &Shared, outcomes: &[Outcome], applied: &[bool]) {
    let mut woken = false;
    for (o, ok) in outcomes.iter().zip(applied) {
        let f = &o.finish;
        let ok = *ok || o.pre_completed;
        if !ok {
            tracing::warn!(
                job = f.id,
                "outcome not recorded: the job's lease was lost to another process"
            );
        }
        if let Some(serial) = o.hold {
            shared.hub.release(f.id, serial);
        }
        if let (true, Some((kind, took))) = (ok, &o.counted) {
            super::metrics::attempt(kind, &f.transition, *took);
        }
        woken |= f.release_lease.is_some() || matches!(f.transition, Transition::Return);
    }
    if woken {
        shared.hub.wake_all();
    }
}

fn give_up(shared: &Shared, o: &Outcome, e: &StoreError) {
    tracing::error!(
        job = o.finish.id,
        error = %e,
        "giving up on recording a job's outcome; its lease will run out and the rescuer will count the attempt as lost"
    );
    if let Some(serial) = o.hold {
        shared.hub.release(o.finish.id, serial);
    }
}
