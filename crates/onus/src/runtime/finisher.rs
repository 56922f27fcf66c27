//! The finisher: writes attempts' outcomes in batches, retries what the database could not take,
//! and releases each job's hold once its outcome is written.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::attempt::QueuedOutcome;
use super::Shared;
use crate::outcome::Transition;
use crate::store::{Finish, StoreError};

/// How many times one outcome that the database refuses on its own is written again before it
/// is given up (its lease then runs out and the rescuer counts the attempt as lost).
const MAX_STRIKES: u32 = 3;
/// After this many failed batch writes in a row, even ones that look transient, the outcomes are
/// written one by one to find any that fail alone.
const SPLIT_AFTER: u32 = 3;
/// The most outcomes written in one batch.
const BATCH: usize = 512;

/// An outcome waiting to be written (its [`Finish`] kept apart, in [`Batch`]), and how its writes
/// have gone.
struct Pending {
    hold: Option<u64>,
    counted: Option<(Arc<super::metrics::KindMeters>, Option<Duration>)>,
    pre_completed: bool,
    /// Times the database refused it on its own.
    strikes: u32,
    /// When its writes started failing.
    failing_since: Option<Instant>,
}

/// Outcomes waiting to be written: their writes side by side, handed to the store as a slice (a
/// PostgreSQL batch of 64 and more is written from it; a smaller one, and SQLite's, is copied),
/// and what is known of each.
#[derive(Default)]
struct Batch {
    finishes: Vec<Finish>,
    pending: Vec<Pending>,
}

impl Batch {
    fn push(&mut self, o: QueuedOutcome) {
        let p = Pending {
            hold: o.hold,
            counted: o.counted,
            pre_completed: o.pre_completed,
            strikes: 0,
            failing_since: None,
        };
        self.push_pending(o.finish, p);
    }

    fn push_pending(&mut self, f: Finish, p: Pending) {
        self.finishes.push(f);
        self.pending.push(p);
    }

    fn len(&self) -> usize {
        self.finishes.len()
    }

    fn is_empty(&self) -> bool {
        self.finishes.is_empty()
    }
}

impl IntoIterator for Batch {
    type Item = (Finish, Pending);
    type IntoIter = std::iter::Zip<std::vec::IntoIter<Finish>, std::vec::IntoIter<Pending>>;

    fn into_iter(self) -> Self::IntoIter {
        self.finishes.into_iter().zip(self.pending)
    }
}

/// Records outcomes in batches, [`WRITERS`] batches at once: one batch's statement runs while
/// another waits for its durable commit, and under load outcomes no longer queue behind a single
/// write. Each writer takes what has arrived from the one channel, so a job's outcome is in
/// exactly one batch.
pub(crate) async fn finisher(
    shared: Arc<Shared>,
    rx: mpsc::UnboundedReceiver<QueuedOutcome>,
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
    rx: &tokio::sync::Mutex<mpsc::UnboundedReceiver<QueuedOutcome>>,
    abandon: &CancellationToken,
) {
    let mut batch = Batch::default();
    let mut failures = 0u32;
    let give_up_after = shared.options.lease_ttl.saturating_mul(2);
    loop {
        if batch.is_empty() {
            failures = 0;
            let mut fresh = Vec::with_capacity(BATCH);
            if rx.lock().await.recv_many(&mut fresh, BATCH).await == 0 {
                return;
            }
            batch.finishes.reserve(fresh.len());
            batch.pending.reserve(fresh.len());
            for o in fresh {
                batch.push(o);
            }
        } else if let Ok(mut rx) = rx.try_lock() {
            while batch.len() < BATCH {
                match rx.try_recv() {
                    Ok(o) => batch.push(o),
                    Err(_) => break,
                }
            }
        }
        // Completed in their handlers' own transactions (`complete_with`): written already.
        if batch.pending.iter().any(|p| p.pre_completed) {
            let (mut done, mut rest) = (Batch::default(), Batch::default());
            for (f, p) in std::mem::take(&mut batch) {
                if p.pre_completed {
                    done.push_pending(f, p);
                } else {
                    rest.push_pending(f, p);
                }
            }
            batch = rest;
            recorded(shared, &done, &vec![true; done.len()]);
            if batch.is_empty() {
                continue;
            }
        }
        let err = match shared.store.finish(&batch.finishes).await {
            Ok(applied) => {
                shared.hub.store_answered();
                recorded(shared, &std::mem::take(&mut batch), &applied);
                // The process went idle: nothing held, nothing to claim.
                if shared.hub.held_count() == 0 && shared.intakes.all_idle() {
                    shared.store.idle();
                }
                continue;
            }
            Err(e) => e,
        };
        if matches!(err, StoreError::Closed) || abandon.is_cancelled() {
            for (f, p) in std::mem::take(&mut batch) {
                give_up(shared, &f, p.hold, &err);
            }
            continue;
        }
        failures += 1;
        let now = Instant::now();
        for p in batch.pending.iter_mut() {
            p.failing_since.get_or_insert(now);
        }
        if failures == 1 {
            tracing::error!(error = %err, jobs = batch.len(), "cannot record job outcomes; trying again");
        }
        if !err.is_transient() || failures >= SPLIT_AFTER {
            failures = 0;
            batch = one_by_one(shared, std::mem::take(&mut batch), give_up_after).await;
            if batch.is_empty() {
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
async fn one_by_one(shared: &Shared, items: Batch, give_up_after: Duration) -> Batch {
    let mut kept = Batch::default();
    let mut written = false;
    let mut items = items.into_iter();
    while let Some((f, mut p)) = items.next() {
        let e = match shared.store.finish(std::slice::from_ref(&f)).await {
            Ok(applied) => {
                shared.hub.store_answered();
                let one = Batch {
                    finishes: vec![f],
                    pending: vec![p],
                };
                recorded(shared, &one, &applied);
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
                give_up(shared, &f, p.hold, &e);
                continue;
            }
            kept.push_pending(f, p);
            if !written && !answered {
                for (f, p) in items {
                    kept.push_pending(f, p); // the database is away: wait for it
                }
                return kept;
            }
            continue;
        }
        p.strikes += 1;
        if p.strikes >= MAX_STRIKES {
            give_up(shared, &f, p.hold, &e);
        } else {
            tracing::warn!(job = f.id, error = %e, "the database refused a job's outcome; trying again");
            kept.push_pending(f, p);
        }
    }
    kept
}

/// After a write: logs lost leases, releases holds, wakes workers where a slot or a job freed.
fn recorded(shared: &Shared, batch: &Batch, applied: &[bool]) {
    let mut woken = false;
    for ((f, p), &ok) in batch.finishes.iter().zip(&batch.pending).zip(applied) {
        if !ok {
            tracing::warn!(
                job = f.id,
                "outcome not recorded: the job's lease was lost to another process"
            );
        }
        if let Some(serial) = p.hold {
            shared.hub.release(f.id, serial);
            shared
                .unwritten
                .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
        if let (true, Some((meters, took))) = (ok, &p.counted) {
            meters.attempt(&f.transition, *took);
        }
        woken |= f.release_lease.is_some() || matches!(f.transition, Transition::Return);
    }
    if woken {
        shared.hub.wake_all();
    }
}

fn give_up(shared: &Shared, f: &Finish, hold: Option<u64>, e: &StoreError) {
    tracing::error!(
        job = f.id,
        error = %e,
        "giving up on recording a job's outcome; its lease will run out and the rescuer will count the attempt as lost"
    );
    if let Some(serial) = hold {
        shared.hub.release(f.id, serial);
        shared
            .unwritten
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}
