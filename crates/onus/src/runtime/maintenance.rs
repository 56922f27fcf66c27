//! Maintenance loops: heartbeats (lease renewal and cancel requests), the rescuer, and the
//! leader's work (periodic jobs and retention).
//!
//! The rescuer runs in every process but only for kinds that process knows, so a job is never
//! rescued under a policy its rescuer has not seen; its writes are guarded by the lost lease, so
//! two rescuers never both act on one job. Periodic enqueues and pruning run on the leader only.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::worker::{finish_of, jumped};
use super::Shared;
use crate::clock::add;
use crate::job::NewJob;
use crate::outcome::{decide, AttemptEnd};
use crate::store::Finish;

/// The leadership that retention needs (any process may hold it).
pub(crate) const LEADER: &str = "onus";
/// The leadership that enqueues periodic jobs, contended only by processes that define some:
/// every process that defines periodic jobs should define the same set.
pub(crate) const PERIODIC_LEADER: &str = "onus.periodic";

/// Renews the leases of this process's running jobs and delivers cancel requests made elsewhere.
pub(crate) async fn heartbeat(shared: Arc<Shared>, stop: CancellationToken) {
    let mut failing = false;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(shared.options.heartbeat_interval) => {}
            _ = stop.cancelled() => return,
        }
        if shared.hub.running_ids() == 0 {
            continue;
        }
        let until = add(shared.clock.now(), shared.options.lease_ttl);
        match shared.store.heartbeat(&shared.owner, until).await {
            Ok(cancel) => {
                failing = false;
                for id in cancel {
                    shared.hub.cancel_running(id);
                }
            }
            Err(e) => {
                if !failing {
                    tracing::error!(error = %e, "cannot renew job leases");
                    failing = true;
                }
            }
        }
    }
}

/// Turns expired leases of known kinds into failed attempts ("worker lost") under their policy.
pub(crate) async fn rescuer(
    shared: Arc<Shared>,
    stop: CancellationToken,
    finish: mpsc::UnboundedSender<Finish>,
) {
    let kinds = shared.handled_kinds();
    if kinds.is_empty() {
        return;
    }
    let mut jumps = shared.clock.jumps();
    loop {
        let now = shared.clock.now();
        match shared.store.expired(&kinds, now, &shared.owner, 500).await {
            Ok(jobs) => {
                for job in jobs {
                    let Some(kind) = shared.kinds.get(&job.kind) else {
                        continue;
                    };
                    tracing::warn!(job = job.id, kind = %job.kind, owner = ?job.lease_owner, "rescuing a job whose worker was lost");
                    let t = decide(
                        &job,
                        AttemptEnd::WorkerLost,
                        &kind.policy,
                        now,
                        &mut rand::thread_rng(),
                    );
                    let release = job.lease_key.clone();
                    let mut f = finish_of(&shared, &job, t, release);
                    f.expired_before = Some(now); // unless a heartbeat renewed it meanwhile
                    let _ = finish.send(f);
                }
            }
            Err(e) => tracing::error!(error = %e, "rescuer cannot read expired leases"),
        }
        tokio::select! {
            _ = tokio::time::sleep(shared.options.rescue_interval) => {}
            _ = jumped(&mut jumps) => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// Leader election, then (as leader) periodic enqueues and retention.
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
            Ok(l) => l,
            Err(e) => {
                tracing::error!(leadership = self.name, error = %e, "leader election failed");
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
            tracing::error!(periodic = %p.name, error = %e, "cannot register periodic job");
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
            tracing::error!(error = %e, "cannot read periodic schedules");
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
        for period in due_periods(&p.schedule, first, now, shared.options.periodic_catch_up) {
            enqueue_period(shared, p, period, now).await;
        }
    }
}

/// The periods to enqueue when `first` (and maybe more) have come due by `now`: each one that
/// came due within the last `window` (so a leader failover skips none), or else, after a longer
/// outage, only the latest missed one (caught up once, not once per missed period).
pub(crate) fn due_periods(
    schedule: &super::Schedule,
    first: crate::Timestamp,
    now: crate::Timestamp,
    window: std::time::Duration,
) -> Vec<crate::Timestamp> {
    let recent_from = now - chrono::TimeDelta::from_std(window).unwrap_or(chrono::TimeDelta::MAX);
    let mut latest_old = None;
    let mut recent = Vec::new();
    let mut p = first;
    for _ in 0..1_000_000 {
        if p > now {
            break;
        }
        if p >= recent_from {
            recent.push(p);
        } else {
            latest_old = Some(p);
        }
        p = schedule.next_after(p);
    }
    if recent.is_empty() {
        recent.extend(latest_old);
    }
    recent
}

async fn enqueue_period(
    shared: &Shared,
    p: &super::Periodic,
    period: crate::Timestamp,
    now: crate::Timestamp,
) {
    let next = p.schedule.next_after(now);
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
        Err(e) => tracing::error!(periodic = %p.name, error = %e, "cannot enqueue periodic job"),
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
                tracing::error!(error = %e, "retention failed");
                return;
            }
        }
    }
}

/// Forwards notices from other processes (PostgreSQL's NOTIFY) to this process's workers.
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
                None => return,
            },
            _ = stop.cancelled() => return,
        }
    }
}
