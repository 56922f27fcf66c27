//! A queue's producer: claims due jobs in batches, holds them ready, and starts each attempt in a
//! run slot ([`super::execute`]); and the door through which this process's own inserts reach an
//! idle queue ([`Intake`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::attempt::{finish_of, QueuedOutcome};
use super::execute::{execute, send};
use super::hub::Hold;
use super::kind::AttemptState;
use super::Shared;
use crate::clock::add;
use crate::job::Job;
use crate::outcome::Transition;
use crate::store::ClaimRequest;
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
    finish: mpsc::UnboundedSender<QueuedOutcome>,
) {
    let batch = shared.options.claim_batch.max(1);
    let slots = Arc::new(Semaphore::new(concurrency * 2)); // claimed: running or ready
    let started = Arc::new(AtomicU64::new(0));
    let mut target = ReadyTarget::new(slots.clone(), concurrency, batch, started.clone());
    let (ready, ready_rx) = mpsc::unbounded_channel::<Ready>();
    let (handed, handed_rx) = mpsc::unbounded_channel::<Ready>();
    let intake = Arc::new(Intake {
        slots: slots.clone(),
        idle: AtomicBool::new(false),
        ready: ready.clone(),
        handed,
        finish: finish.clone(),
    });
    shared.intakes.set(&queue, Some(intake.clone()));
    let dispatcher = tokio::spawn(dispatch(
        shared.clone(),
        Lanes {
            handed: handed_rx,
            ready: ready_rx,
        },
        RunSlots {
            free: Arc::new(Semaphore::new(concurrency)),
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
    let mut held: Vec<(Arc<AttemptState>, Hold)> = Vec::new();
    let mut held_permits = Vec::new();
    let (mut held_got, mut held_wanted) = (0usize, 0usize);
    // The last claim came back short: wait for a wake-up (or the poll) before claiming again.
    let mut drained = false;
    loop {
        // Idle: this process's own inserts may claim for this queue (see `Intake`).
        intake
            .idle
            .store(drained && inflight.is_empty(), Ordering::SeqCst);
        // Outcomes the finisher has not written yet hold their jobs (and their leases, which
        // renewals rewrite): while too many wait, claim nothing more, so a slow write holds the
        // claims back instead of letting held jobs pile up.
        let room = shared.unwritten.load(Ordering::SeqCst) < UNWRITTEN_LIMIT;
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
            _ = tokio::time::sleep(UNWRITTEN_POLL), if !room => {}
            first = slots.clone().acquire_owned(), if room && inflight.len() < MAX_CLAIMS_IN_FLIGHT && held_wanted == 0 && !drained => {
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
                    lease_slots: shared.lease_slots(&kinds),
                };
                let wanted = permits.len();
                let store = shared.store.clone();
                inflight.push(async move { (store.claim(req).await, permits, started, wanted) });
            }
            _ = notify.notified(), if drained && inflight.is_empty() => drained = false,
            _ = tokio::time::sleep(shared.options.poll_interval), if drained && inflight.is_empty() => drained = false,
            _ = super::skew::jumped(&mut jumps), if drained && inflight.is_empty() => drained = false,
        }
    }
    intake.idle.store(false, Ordering::SeqCst);
    shared.intakes.set(&queue, None);
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
    /// Jobs handed a lease slot by a finished attempt: they start before claimed ones.
    handed: mpsc::UnboundedSender<Ready>,
    finish: mpsc::UnboundedSender<QueuedOutcome>,
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

    /// Starts a job a finished attempt handed its lease slot to (`started`: when that attempt's
    /// completion began), ahead of the jobs claimed and waiting: it holds its key's slot, and takes
    /// the next run slot free, which the attempt that handed it on is about to give back.
    pub(crate) fn deliver_handed(
        &self,
        shared: &Arc<Shared>,
        queue: &str,
        job: Job,
        started: Instant,
    ) {
        let mut failing = false;
        let (held, _) = hold_claimed(
            shared,
            queue,
            &self.finish,
            Ok(vec![job]),
            started,
            &mut failing,
        );
        start_held(&self.handed, held, Vec::new());
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

/// The most outcomes queued and not yet written before a process's queues stop claiming: two
/// writers' batches twice over (see `finisher`).
pub(crate) const UNWRITTEN_LIMIT: usize = 2048;

/// How often a queue held back by unwritten outcomes looks again.
const UNWRITTEN_POLL: Duration = Duration::from_millis(2);

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
    finish: &mpsc::UnboundedSender<QueuedOutcome>,
    claimed: StoreResult<Vec<Job>>,
    started: Instant,
    failing: &mut bool,
) -> (Vec<(Arc<AttemptState>, Hold)>, usize) {
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
    if started.elapsed() >= super::skew::fence_after(shared) {
        tracing::warn!(queue = %queue, jobs = claimed.len(), "a claim answered too late to run its jobs safely; handing them back");
        for job in &claimed {
            let _ = finish.send(QueuedOutcome::unheld(finish_of(
                shared,
                job,
                Transition::Return,
            )));
        }
        return (Vec::new(), got);
    }
    let claimed_at = shared.clock.now();
    super::metrics::picked_up(queue, claimed.iter().map(|job| claimed_at - job.run_at));
    let held = claimed
        .into_iter()
        .map(|job| {
            let hold = shared.hub.register(job.id, job.attempt, started);
            // The attempt's state is made here: from now on the job moves as a pointer (a job
            // moved whole, sorted and queued, was 6% of a worker's instructions).
            (Arc::new(AttemptState::new(job)), hold)
        })
        .collect();
    (held, got)
}

/// Queues held jobs to start, in order (priority, run_at, id), each with one of `permits`.
fn start_held(
    ready: &mpsc::UnboundedSender<Ready>,
    mut jobs: Vec<(Arc<AttemptState>, Hold)>,
    mut permits: Vec<tokio::sync::OwnedSemaphorePermit>,
) {
    jobs.sort_by_key(|(s, _)| (s.job.priority, s.job.run_at, s.job.id));
    for (state, hold) in jobs {
        let _ = ready.send(Ready {
            state,
            hold,
            claimed: permits.pop(),
        });
    }
}

/// A claimed job waiting for a run slot.
struct Ready {
    state: Arc<AttemptState>,
    hold: Hold,
    claimed: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// A queue's run slots, and a count of the handlers started in them.
struct RunSlots {
    free: Arc<Semaphore>,
    started: Arc<AtomicU64>,
}

/// The jobs waiting for a run slot: those a finished attempt handed its lease slot to, which go
/// first, and those claimed.
struct Lanes {
    handed: mpsc::UnboundedReceiver<Ready>,
    ready: mpsc::UnboundedReceiver<Ready>,
}

/// Starts claimed jobs in claim order as run slots free up; at shutdown (or when cancelled before
/// it started) a job is handed back unstarted, its attempt unspent.
async fn dispatch(
    shared: Arc<Shared>,
    mut lanes: Lanes,
    run_slots: RunSlots,
    stop: CancellationToken,
    hard: CancellationToken,
    tracker: TaskTracker,
    finish: mpsc::UnboundedSender<QueuedOutcome>,
) {
    loop {
        // A job handed a lease slot goes first: it holds its key while it waits.
        let next = tokio::select! {
            biased;
            Some(r) = lanes.handed.recv() => Some(r),
            r = lanes.ready.recv() => r,
        };
        let Some(Ready {
            state,
            hold,
            claimed,
        }) = next
        else {
            break;
        };
        // A free slot is taken at once; only a wait for one listens for the stops (each wait
        // registered with the stop token costs about 200 instructions).
        let run = if stop.is_cancelled() || hold.signals.is_lost() {
            None
        } else {
            match run_slots.free.clone().try_acquire_owned() {
                Ok(p) => Some(p),
                Err(tokio::sync::TryAcquireError::Closed) => None,
                Err(tokio::sync::TryAcquireError::NoPermits) => tokio::select! {
                    biased;
                    _ = stop.cancelled() => None,
                    _ = hold.signals.lost() => None,
                    p = run_slots.free.clone().acquire_owned() => p.ok(),
                },
            }
        };
        let id = state.job.id;
        match run {
            _ if hold.signals.is_lost() => {} // the fence dropped it before it started
            Some(run) if !hold.signals.is_cancelled() => {
                let (shared, hard, finish) = (shared.clone(), hard.clone(), finish.clone());
                let started = run_slots.started.clone();
                // Boxed: the task then moves a pointer, not the attempt's whole state (a handler's
                // timers and cancellation waits, admission's), as it is created and ended (its
                // copies were about 7% of a worker's instructions per job).
                tracker.spawn(Box::pin(async move {
                    let _unhold = Unhold {
                        shared: &shared,
                        id,
                        serial: hold.serial,
                    };
                    execute(&shared, state, &hold, hard, &finish, &started).await;
                    drop(run);
                    drop(claimed);
                }));
            }
            _ => {
                // The store turns this into a cancel when one was asked for.
                send(
                    &shared,
                    &finish,
                    finish_of(&shared, &state.job, Transition::Return),
                    &hold,
                );
            }
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

/// Each running queue's door for this process's own inserts.
#[derive(Debug, Default)]
pub(crate) struct Intakes(std::sync::Mutex<HashMap<String, Arc<Intake>>>);

impl Intakes {
    /// Opens (`Some`) or closes `queue`'s door.
    pub(crate) fn set(&self, queue: &str, intake: Option<Arc<Intake>>) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match intake {
            Some(i) => m.insert(queue.to_string(), i),
            None => m.remove(queue),
        };
    }

    /// Whether every queue's worker found nothing at its last claim and has no claim out.
    pub(crate) fn all_idle(&self) -> bool {
        (self.0.lock().unwrap_or_else(|e| e.into_inner()))
            .values()
            .all(|i| i.is_idle())
    }

    /// Wakes the workers of every queue that found nothing at its last claim (another process
    /// wrote something, which may be a job for any of them).
    pub(crate) fn wake_idle(&self, hub: &super::Hub) {
        let idle: Vec<String> = (self.0.lock().unwrap_or_else(|e| e.into_inner()))
            .iter()
            .filter(|(_, i)| i.is_idle())
            .map(|(q, _)| q.clone())
            .collect();
        for q in idle {
            hub.wake(&q);
        }
    }

    /// `queue`'s door, while its worker runs.
    pub(crate) fn get(&self, queue: &str) -> Option<Arc<Intake>> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(queue)
            .cloned()
    }
}
