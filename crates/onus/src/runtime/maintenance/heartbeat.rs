//! The heartbeat: renews the leases of the jobs this process holds, delivers cancel requests
//! made elsewhere, and fences attempts whose renewal is overdue.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::clock::add;
use crate::job::JobId;
use crate::runtime::skew::fence_after;
use crate::runtime::Shared;
use crate::store::HeldJob;

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
