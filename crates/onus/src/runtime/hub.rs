//! In-process signals shared by the client, the workers and the heartbeat: queue wake-ups, and
//! the jobs this process holds.
//!
//! A job is *held* from the moment its claim returns until its outcome is written (or given up):
//! while claimed and waiting to start, while its handler runs, and while its outcome waits in the
//! finisher. The heartbeat renews exactly the held jobs, nothing else of this process's, so a row
//! the process lost track of is never renewed and is rescued once its lease runs out.
//!
//! Each held job carries the start time of the last renewal that reached the database (or of its
//! claim). A job not renewed for most of a lease is *lost* here: its attempt is stopped without an
//! outcome, because another process may rescue it (the fence).

use std::collections::hash_map::Entry as Slot;
use std::collections::HashMap;

use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::job::JobId;
use crate::store::HeldJob;

/// One held job.
#[derive(Debug)]
struct Entry {
    /// Tells this registration apart from a later one of the same job.
    serial: u64,
    attempt: u32,
    /// What stops its attempt.
    signals: Arc<Signals>,
    /// Start of the last renewal (or claim) that reached the database.
    renewed: Instant,
    /// The attempt ended and its outcome is queued for writing.
    finishing: bool,
}

/// This process's hold on a job it claimed (from the claim until its outcome is written): the
/// registration's serial, and the signals that stop its attempt when it is cancelled or lost.
#[derive(Debug, Clone)]
pub(crate) struct Hold {
    pub(crate) serial: u64,
    pub(crate) signals: Arc<Signals>,
}

/// What stops a held job's attempt: someone asked to cancel the job (its handler is told and
/// given its grace), or this process no longer leases it (the attempt stops at once). Each is a
/// flag set once; whoever waits on either is woken through one [`Notify`].
///
/// One allocation a job, and a check is an atomic load: the two `CancellationToken`s a held job
/// had before were made, cloned, checked under their locks and dropped about 20 times a job,
/// 1,100 instructions, a twentieth of a worker's (callgrind).
#[derive(Debug, Default)]
pub(crate) struct Signals {
    cancelled: AtomicBool,
    lost: AtomicBool,
    wake: Notify,
}

impl Signals {
    /// Asks the attempt to stop: its handler sees it and has its grace.
    pub(crate) fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
        self.wake.notify_waiters();
    }

    /// This process lost the job's lease: the attempt stops at once.
    pub(crate) fn lose(&self) {
        self.lost.store(true, Ordering::SeqCst);
        self.wake.notify_waiters();
    }

    pub(crate) fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// Resolves once the job is cancelled.
    pub(crate) async fn cancelled(&self) {
        self.until(&self.cancelled).await
    }

    /// Resolves once the job is lost.
    pub(crate) async fn lost(&self) {
        self.until(&self.lost).await
    }

    async fn until(&self, flag: &AtomicBool) {
        loop {
            // Registered before the flag is read: a signal between the two still wakes it.
            let mut woken = std::pin::pin!(self.wake.notified());
            woken.as_mut().enable();
            if flag.load(Ordering::SeqCst) {
                return;
            }
            woken.await;
        }
    }
}

/// A snapshot of one held job, for the heartbeat.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Snapshot {
    pub(crate) job: HeldJob,
    pub(crate) serial: u64,
    pub(crate) renewed: Instant,
    /// Its outcome is queued: renewed, but never fenced.
    pub(crate) finishing: bool,
}

/// In-process signals shared by the client and the workers.
#[derive(Debug, Default)]
pub(crate) struct Hub {
    queues: Mutex<HashMap<String, Arc<Notify>>>,
    held: Mutex<FxHashMap<JobId, Entry>>,
    serial: AtomicU64,
    /// When a write of this process (a renewal, an outcome) last reached the database.
    answered: Mutex<Option<Instant>>,
}

impl Hub {
    fn held(&self) -> std::sync::MutexGuard<'_, FxHashMap<JobId, Entry>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn queue(&self, name: &str) -> Arc<Notify> {
        let mut q = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        q.entry(name.to_string()).or_default().clone()
    }

    /// Tells the workers of `queue` that a job may be due.
    pub(crate) fn wake(&self, queue: &str) {
        let q = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = q.get(queue) {
            n.notify_one();
        }
    }

    pub(crate) fn wake_all(&self) {
        let q = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        for n in q.values() {
            n.notify_one();
        }
    }

    /// Signals cancellation to a held job; false when it is not held here.
    pub(crate) fn cancel_running(&self, id: JobId) -> bool {
        match self.held().get(&id) {
            Some(e) => {
                e.signals.cancel();
                true
            }
            None => false,
        }
    }

    /// Notes that a write just reached the database.
    pub(crate) fn store_answered(&self) {
        *self.answered.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }

    /// Whether a write reached the database after `since`.
    pub(crate) fn store_answered_since(&self, since: Instant) -> bool {
        self.answered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|t| t > since)
    }

    /// How many jobs this process holds.
    pub(crate) fn held_count(&self) -> usize {
        self.held().len()
    }

    /// Holds a claimed job whose claim started at `claimed` (its lease runs from then).
    pub(crate) fn register(&self, id: JobId, attempt: u32, claimed: Instant) -> Hold {
        let serial = self.serial.fetch_add(1, Ordering::Relaxed);
        let hold = Hold {
            serial,
            signals: Arc::default(),
        };
        self.held().insert(
            id,
            Entry {
                serial,
                attempt,
                signals: hold.signals.clone(),
                renewed: claimed,
                finishing: false,
            },
        );
        hold
    }

    /// The attempt ended and its outcome is queued: keep renewing the lease until it is written.
    pub(crate) fn finishing(&self, id: JobId, serial: u64) {
        if let Some(e) = self.held().get_mut(&id).filter(|e| e.serial == serial) {
            e.finishing = true;
        }
    }

    /// Stops holding the job (its outcome is written, or there is none to write).
    pub(crate) fn release(&self, id: JobId, serial: u64) {
        if let Slot::Occupied(e) = self.held().entry(id) {
            if e.get().serial == serial {
                e.remove();
            }
        }
    }

    /// Stops holding the job unless its outcome is queued (then the finisher releases it).
    pub(crate) fn release_unless_finishing(&self, id: JobId, serial: u64) {
        if let Slot::Occupied(e) = self.held().entry(id) {
            if e.get().serial == serial && !e.get().finishing {
                e.remove();
            }
        }
    }

    /// True when the job is held here (the rescuer leaves it alone).
    pub(crate) fn is_held(&self, id: JobId) -> bool {
        self.held().contains_key(&id)
    }

    /// Every held job, for a renewal.
    pub(crate) fn snapshot(&self) -> Vec<Snapshot> {
        self.held()
            .iter()
            .map(|(id, e)| Snapshot {
                job: HeldJob {
                    id: *id,
                    attempt: e.attempt,
                },
                serial: e.serial,
                renewed: e.renewed,
                finishing: e.finishing,
            })
            .collect()
    }

    /// Records a renewal that started at `started` for these jobs (as snapshotted).
    pub(crate) fn renewed(&self, jobs: &[(JobId, u64)], started: Instant) {
        let mut h = self.held();
        for (id, serial) in jobs {
            if let Some(e) = h.get_mut(id).filter(|e| e.serial == *serial) {
                e.renewed = e.renewed.max(started);
            }
        }
    }

    /// This process no longer leases the job: stops its attempt at once, without an outcome.
    /// A job whose outcome is already queued is left to the finisher (its write is guarded).
    pub(crate) fn lose(&self, id: JobId, serial: u64) -> bool {
        let mut h = self.held();
        match h.get(&id) {
            Some(e) if e.serial == serial && !e.finishing => {
                e.signals.lose();
                h.remove(&id);
                true
            }
            _ => false,
        }
    }

    /// The fence: loses every job not renewed within `fence_after` of `now`; returns how many.
    pub(crate) fn fence_overdue(&self, now: Instant, fence_after: Duration) -> usize {
        let mut h = self.held();
        let overdue: Vec<JobId> = h
            .iter()
            .filter(|(_, e)| {
                !e.finishing && now.saturating_duration_since(e.renewed) >= fence_after
            })
            .map(|(id, _)| *id)
            .collect();
        for id in &overdue {
            if let Some(e) = h.remove(id) {
                e.signals.lose();
            }
        }
        overdue.len()
    }

    /// When the earliest held job that can still be lost falls due for the fence.
    pub(crate) fn next_fence(&self, fence_after: Duration) -> Option<Instant> {
        self.held()
            .values()
            .filter(|e| !e.finishing)
            .map(|e| e.renewed + fence_after)
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;

    #[tokio::test]
    async fn a_signal_wakes_its_waiters_and_only_them() {
        let s = Arc::new(Signals::default());
        let lost = tokio::spawn({
            let s = s.clone();
            async move { s.lost().await }
        });
        let cancelled = tokio::spawn({
            let s = s.clone();
            async move { s.cancelled().await }
        });
        tokio::task::yield_now().await;
        s.cancel();
        tokio::time::timeout(Duration::from_secs(10), cancelled)
            .await
            .expect("a cancel wakes who waits for it")
            .unwrap();
        assert!(s.is_cancelled() && !s.is_lost());
        // Woken by the cancel too (one runtime thread: it ran at these yields), the wait for the
        // loss goes on.
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
        assert!(!lost.is_finished());
        assert!(std::pin::pin!(s.lost()).now_or_never().is_none());
        s.lose();
        tokio::time::timeout(Duration::from_secs(10), lost)
            .await
            .expect("a loss wakes who waits for it")
            .unwrap();
        // Set once, a signal answers at once from then on.
        assert!(s.lost().now_or_never().is_some() && s.cancelled().now_or_never().is_some());
    }

    #[test]
    fn a_held_job_is_cancelled_and_lost_through_its_hold() {
        let hub = Hub::default();
        let hold = hub.register(7, 1, Instant::now());
        assert!(hub.cancel_running(7));
        assert!(hold.signals.is_cancelled() && !hold.signals.is_lost());
        assert!(
            !hub.lose(7, hold.serial + 1),
            "another registration's serial"
        );
        assert!(hub.lose(7, hold.serial));
        assert!(hold.signals.is_lost());
        assert!(!hub.is_held(7));
    }
}
