//! Maintenance loops: heartbeats (lease renewal and cancel requests), the rescuer, and the
//! leader's work (periodic jobs and retention).
//!
//! The rescuer runs in every process but only for kinds that process knows, so a job is never
//! rescued under a policy its rescuer has not seen; its writes are guarded by the lost lease, so
//! two rescuers never both act on one job. Periodic enqueues and pruning run on the leader only.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::skew::Skew;
use super::worker::{finish_of, jumped, Outcome};
use super::Shared;
use crate::clock::add;
use crate::job::{JobId, NewJob};
use crate::outcome::{decide, AttemptEnd};
use crate::store::HeldJob;

/// The leadership that retention needs (any process may hold it).
pub(crate) const LEADER: &str = "onus";
/// The leadership that enqueues periodic jobs, contended only by processes that define some:
/// every process that defines periodic jobs should define the same set.
pub(crate) const PERIODIC_LEADER: &str = "onus.periodic";

/// How long a held job may go without a renewal reaching the database before this process must
/// assume another process will rescue it: three quarters of a lease, less this process's measured
/// clock offset (see [`super::skew`]).
pub(crate) fn fence_after(shared: &Shared) -> Duration {
    let skew = shared.skew.latest().map_or(Duration::ZERO, |r| r.worst());
    shared.options.lease_ttl.mul_f64(0.75).saturating_sub(skew)
}

/// Renews the leases of the jobs this process holds and delivers cancel requests made elsewhere.
///
/// Every renewal has a deadline: the moment the oldest held job would go three quarters of a lease
/// without a renewal that reached the database, measured from the *start* of the last one that
/// did (the lease it wrote runs from then). A renewal that fails, or hangs past that deadline, or
/// finds a job no longer leased to this process, stops those attempts at once without an outcome
/// (the fence): no job ever runs in two processes at once, even when the database is out of reach
/// or a connection hangs.
pub(crate) async fn heartbeat(shared: Arc<Shared>, stop: CancellationToken) {
    let mut failing = false;
    loop {
        let fence_after = fence_after(&shared);
        let mut wake = Instant::now() + shared.options.heartbeat_interval;
        if let Some(fence) = shared.hub.next_fence(fence_after) {
            wake = wake.min(fence);
        }
        tokio::select! {
            _ = tokio::time::sleep_until(wake.into()) => {}
            _ = stop.cancelled() => return,
        }
        fence(&shared, fence_after);
        let held = shared.hub.snapshot();
        if held.is_empty() {
            continue;
        }
        let started = Instant::now();
        // The deadline of the oldest job that can still be fenced; jobs whose outcome is queued
        // are renewed too but never fenced (their attempt is over).
        let deadline = held
            .iter()
            .filter(|h| !h.finishing)
            .map(|h| h.renewed + fence_after)
            .min()
            .unwrap_or(started + fence_after);
        let until = add(shared.clock.now(), shared.options.lease_ttl);
        let jobs: Vec<HeldJob> = held.iter().map(|h| h.job).collect();
        let renewal = tokio::time::timeout_at(
            deadline.into(),
            shared.store.heartbeat(&shared.owner, &jobs, until),
        )
        .await;
        let serial: HashMap<JobId, u64> = held.iter().map(|h| (h.job.id, h.serial)).collect();
        match renewal {
            Ok(Ok(r)) => {
                shared.hub.store_answered();
                if failing {
                    tracing::info!("renewing job leases again");
                }
                failing = false;
                let renewed: Vec<(JobId, u64)> = r
                    .renewed
                    .iter()
                    .filter_map(|id| serial.get(id).map(|s| (*id, *s)))
                    .collect();
                shared.hub.renewed(&renewed, started);
                for id in r.cancel {
                    shared.hub.cancel_running(id);
                }
                for id in r.lost {
                    if serial.get(&id).is_some_and(|s| shared.hub.lose(id, *s)) {
                        tracing::warn!(
                            job = id,
                            "stopped an attempt: its lease is no longer this process's (rescued elsewhere)"
                        );
                    }
                }
            }
            Ok(Err(e)) => {
                if !failing {
                    tracing::error!(error = %e, "cannot renew job leases; will keep trying");
                    failing = true;
                }
            }
            Err(_) => {
                if !failing {
                    tracing::error!(
                        "renewing job leases got no answer within {}; will keep trying",
                        crate::policy::human(deadline.saturating_duration_since(started))
                    );
                    failing = true;
                }
            }
        }
        fence(&shared, fence_after);
    }
}

/// Drops the attempts of every held job not renewed within `fence_after`.
fn fence(shared: &Shared, fence_after: Duration) {
    let n = shared.hub.fence_overdue(Instant::now(), fence_after);
    if n > 0 {
        tracing::error!(
            dropped = n,
            "leases not renewed for {}: dropping those attempts so no other process runs them at the same time",
            crate::policy::human(fence_after)
        );
    }
}

/// Turns expired leases of known kinds into failed attempts ("worker lost") under their policy:
/// the kinds this process runs and those it only knows (run by outside workers, which hold
/// their leases through the API).
pub(crate) async fn rescuer(
    shared: Arc<Shared>,
    stop: CancellationToken,
    finish: mpsc::UnboundedSender<Outcome>,
) {
    let mut kinds: Vec<String> = shared.kinds.keys().cloned().collect();
    kinds.sort();
    if kinds.is_empty() {
        return;
    }
    let mut jumps = shared.clock.jumps();
    loop {
        Skew::measure(&shared).await;
        let now = shared.clock.now();
        let found = if Skew::may_rescue(&shared) {
            shared.store.expired(&kinds, now, 500).await
        } else {
            Ok(Vec::new())
        };
        match found {
            Ok(jobs) => {
                // A job running here is alive whatever its lease says (a manual clock may have
                // jumped past it); one of ours that is not (dropped by a fence) is rescued too.
                for job in jobs.into_iter().filter(|j| !shared.hub.is_held(j.id)) {
                    let Some(kind) = shared.kinds.get(&job.kind) else {
                        continue;
                    };
                    tracing::warn!(job = job.id, kind = %job.kind, owner = ?job.lease_owner, "rescuing a job whose worker was lost");
                    // A job asked to cancel whose worker stopped answering (or was refused
                    // once its grace ran out) ends cancelled, not retried.
                    let end = if job.cancel_requested {
                        AttemptEnd::Cancelled
                    } else {
                        AttemptEnd::WorkerLost
                    };
                    let t = decide(&job, end, &kind.policy, now, &mut rand::thread_rng());
                    let release = job.lease_key.clone();
                    let mut f = finish_of(&shared, &job, t, release);
                    f.expired_before = Some(now); // unless a heartbeat renewed it meanwhile
                    let mut o = Outcome::unheld(f);
                    o.counted = Some((job.kind.clone(), None));
                    let _ = finish.send(o);
                }
            }
            Err(e) => shared
                .trouble
                .report("the rescuer cannot read expired leases", &e),
        }
        tokio::select! {
            _ = tokio::time::sleep(shared.options.rescue_interval) => {}
            _ = jumped(&mut jumps) => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// Leader election, then (as leader) periodic enqueues, folding the job counters, and retention.
pub(crate) async fn leader(shared: Arc<Shared>, stop: CancellationToken) {
    let mut jumps = shared.clock.jumps();
    let mut retention = Leadership::new(LEADER);
    let mut periodic = Leadership::new(PERIODIC_LEADER);
    let mut last_prune: Option<Instant> = None;
    let mut registered = shared.periodics.is_empty();
    loop {
        if !registered {
            registered = register_periodics(&shared).await;
        }
        if retention.hold(&shared).await {
            fold_counts(&shared).await;
            let due = last_prune.is_none_or(|t| t.elapsed() >= shared.options.prune_interval);
            if due {
                prune(&shared).await;
                last_prune = Some(Instant::now());
            }
        }
        // Only processes that define periodic jobs contend for enqueuing them.
        if !shared.periodics.is_empty() && registered && periodic.hold(&shared).await {
            enqueue_due_periods(&shared).await;
        }
        tokio::select! {
            _ = tokio::time::sleep(shared.options.maintenance_interval) => {}
            _ = jumped(&mut jumps) => { last_prune = None; }
            _ = stop.cancelled() => return,
        }
    }
}

/// One named leadership, taken and renewed through the store with a lease.
struct Leadership {
    name: &'static str,
    leading: bool,
}

impl Leadership {
    fn new(name: &'static str) -> Self {
        Leadership {
            name,
            leading: false,
        }
    }

    async fn hold(&mut self, shared: &Shared) -> bool {
        let now = shared.clock.now();
        let until = add(now, shared.options.leader_ttl);
        let l = match shared
            .store
            .try_lead(self.name, &shared.owner, now, until)
            .await
        {
            Ok(l) => {
                shared.trouble.clear();
                l
            }
            Err(e) => {
                shared.trouble.report("leader election failed", &e);
                false
            }
        };
        if l != self.leading {
            tracing::info!(leadership = self.name, owner = %shared.owner, leading = l, "leadership changed");
        }
        self.leading = l;
        l
    }
}

async fn register_periodics(shared: &Shared) -> bool {
    let now = shared.clock.now();
    for p in &shared.periodics {
        let next = p.schedule.next_after(now);
        if let Err(e) = shared
            .store
            .upsert_periodic(&p.name, &p.job.kind, &p.schedule.describe(), next)
            .await
        {
            shared.trouble.report("cannot register periodic jobs", &e);
            return false;
        }
    }
    true
}

async fn enqueue_due_periods(shared: &Shared) {
    if shared.periodics.is_empty() {
        return;
    }
    let rows = match shared.store.list_periodic().await {
        Ok(r) => r,
        Err(e) => {
            shared.trouble.report("cannot read periodic schedules", &e);
            return;
        }
    };
    let now = shared.clock.now();
    for p in &shared.periodics {
        let Some(row) = rows.iter().find(|r| r.name == p.name) else {
            continue;
        };
        let Some(first) = row.next_run_at else {
            continue;
        };
        if first > now {
            continue;
        }
        if row.paused_at.is_some() {
            continue; // paused: nothing is enqueued; a resume moves it to its next period
        }
        let periods = due_periods(
            &p.schedule,
            first,
            now,
            shared.options.periodic_catch_up,
            p.catch_up,
        );
        if periods.is_empty() {
            // Every missed period skipped: the schedule goes on from its next one.
            let next = p.schedule.next_after(now);
            if let Err(e) = shared.store.skip_periods(&p.name, next).await {
                shared.trouble.report("cannot enqueue periodic jobs", &e);
            }
        }
        for period in periods {
            enqueue_period(shared, p, period).await;
        }
    }
}

/// The periods to enqueue when `first` (and maybe more) have come due by `now`, oldest first:
/// each one that came due within the last `window` (so a leader failover skips none), and of the
/// older ones, missed while nothing ran, what `catch_up` says: none, the latest (only when no
/// recent one runs: one run catches up), or each, at most its limit (the latest ones).
pub(crate) fn due_periods(
    schedule: &super::Schedule,
    first: crate::Timestamp,
    now: crate::Timestamp,
    window: std::time::Duration,
    catch_up: super::CatchUp,
) -> Vec<crate::Timestamp> {
    let recent_from = now - chrono::TimeDelta::from_std(window).unwrap_or(chrono::TimeDelta::MAX);
    let keep = match catch_up {
        super::CatchUp::Skip => 0,
        super::CatchUp::Latest => 1,
        super::CatchUp::All { limit } => limit as usize,
    };
    let mut old = std::collections::VecDeque::new();
    let mut recent = Vec::new();
    let mut p = first;
    for _ in 0..1_000_000 {
        if p > now {
            break;
        }
        if p >= recent_from {
            recent.push(p);
        } else {
            old.push_back(p);
            if old.len() > keep {
                old.pop_front();
            }
        }
        p = schedule.next_after(p);
    }
    if catch_up == super::CatchUp::Latest && !recent.is_empty() {
        old.clear();
    }
    old.into_iter().chain(recent).collect()
}

async fn enqueue_period(shared: &Shared, p: &super::Periodic, period: crate::Timestamp) {
    // The next period after the one enqueued (the periods are enqueued oldest first, the last
    // the latest due, so the schedule goes on from the first period after now), never from the
    // time of the enqueue: a late enqueue skips no period.
    let next = p.schedule.next_after(period);
    let job: NewJob = p
        .job
        .clone()
        .unique_key(super::periodic_unique_key(&p.name, period));
    let row = match super::client::prepare_with(shared, job) {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(periodic = %p.name, error = %e, "periodic job is invalid");
            return;
        }
    };
    let queue = row.queue.clone();
    match shared
        .store
        .enqueue_period(&p.name, period, next, row)
        .await
    {
        Ok(Some(id)) => {
            tracing::info!(periodic = %p.name, job = id, period = %period, "enqueued periodic job");
            shared.hub.wake(&queue);
        }
        Ok(None) => {}
        Err(e) => shared.trouble.report("cannot enqueue periodic jobs", &e),
    }
}

/// How long the per-minute history behind the panel's charts is kept.
const HISTORY_KEPT: Duration = Duration::from_secs(2 * 86_400);

async fn fold_counts(shared: &Shared) {
    let keep_since = crate::clock::sub(shared.clock.now(), HISTORY_KEPT);
    if let Err(e) = shared.store.fold_counts(keep_since).await {
        shared.trouble.report("cannot fold job counts", &e);
    }
}

async fn prune(shared: &Shared) {
    let now = shared.clock.now();
    loop {
        match shared
            .store
            .prune(now, shared.options.retention, 10_000)
            .await
        {
            Ok(n) if n >= 10_000 => continue,
            Ok(n) => {
                if n > 0 {
                    tracing::info!(deleted = n, "retention pruned finished jobs");
                }
                return;
            }
            Err(e) => {
                shared.trouble.report("retention failed", &e);
                return;
            }
        }
    }
}

/// Forwards notices from other processes (PostgreSQL's NOTIFY; on SQLite, the writer's watch
/// for other processes' commits) to this process's workers.
pub(crate) async fn notices(shared: Arc<Shared>, stop: CancellationToken) {
    let mut rx = match shared.store.listen().await {
        Ok(Some(rx)) => rx,
        Ok(None) => return,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for notices; relying on polling");
            return;
        }
    };
    loop {
        tokio::select! {
            n = rx.recv() => match n {
                Some(crate::store::Notice::Jobs(queue)) => shared.hub.wake(&queue),
                Some(crate::store::Notice::Cancel(id)) => { shared.hub.cancel_running(id); }
                Some(crate::store::Notice::Reconnected) => shared.hub.wake_all(),
                Some(crate::store::Notice::Written) => shared.hub.wake_idle(),
                None => return,
            },
            _ = stop.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::due_periods;
    use crate::runtime::{CatchUp, Schedule};

    fn t(s: &str) -> crate::Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn recent_periods_are_each_due_and_an_old_backlog_collapses_to_one() {
        let every = Schedule::every(Duration::from_secs(1)).unwrap();
        let win = Duration::from_secs(60);
        // A failover of three seconds: each missed period is enqueued.
        let v = due_periods(
            &every,
            t("2026-01-01T00:00:10Z"),
            t("2026-01-01T00:00:12.5Z"),
            win,
            CatchUp::Latest,
        );
        assert_eq!(
            v,
            vec![
                t("2026-01-01T00:00:10Z"),
                t("2026-01-01T00:00:11Z"),
                t("2026-01-01T00:00:12Z")
            ]
        );
        // Down for a day: only the recent ones, not 86,400.
        let v = due_periods(
            &every,
            t("2026-01-01T00:00:00Z"),
            t("2026-01-02T00:00:00Z"),
            win,
            CatchUp::Latest,
        );
        assert_eq!(v.len(), 61);
        // An hourly schedule down for five hours: the latest missed period once.
        let hourly = Schedule::every(Duration::from_secs(3600)).unwrap();
        let v = due_periods(
            &hourly,
            t("2026-01-01T03:00:00Z"),
            t("2026-01-01T07:30:00Z"),
            win,
            CatchUp::Latest,
        );
        assert_eq!(v, vec![t("2026-01-01T07:00:00Z")]);
        // Not due yet: nothing.
        assert!(due_periods(
            &hourly,
            t("2026-01-01T08:00:00Z"),
            t("2026-01-01T07:30:00Z"),
            win,
            CatchUp::Latest,
        )
        .is_empty());
    }

    #[test]
    fn missed_periods_follow_the_catch_up_policy() {
        let hourly = Schedule::every(Duration::from_secs(3600)).unwrap();
        let win = Duration::from_secs(60);
        let (first, now) = (t("2026-01-01T03:00:00Z"), t("2026-01-01T07:30:00Z"));
        let missed = |c| due_periods(&hourly, first, now, win, c);
        assert!(missed(CatchUp::Skip).is_empty());
        assert_eq!(missed(CatchUp::Latest), vec![t("2026-01-01T07:00:00Z")]);
        assert_eq!(missed(CatchUp::All { limit: 100 }).len(), 5);
        assert_eq!(
            missed(CatchUp::All { limit: 2 }),
            vec![t("2026-01-01T06:00:00Z"), t("2026-01-01T07:00:00Z")]
        );
        // A period due within the failover window runs under every policy, and after it the
        // older ones as the policy says.
        let now = t("2026-01-01T07:00:30Z");
        assert_eq!(
            due_periods(&hourly, first, now, win, CatchUp::Skip),
            vec![t("2026-01-01T07:00:00Z")]
        );
        assert_eq!(
            due_periods(&hourly, first, now, win, CatchUp::Latest),
            vec![t("2026-01-01T07:00:00Z")]
        );
        assert_eq!(
            due_periods(&hourly, first, now, win, CatchUp::All { limit: 2 }),
            vec![
                t("2026-01-01T05:00:00Z"),
                t("2026-01-01T06:00:00Z"),
                t("2026-01-01T07:00:00Z")
            ]
        );
    }
}
