//! The rescuer: turns lapsed leases into "worker lost" attempts under their kind's policy.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::outcome::AttemptEnd;
use crate::runtime::attempt::{self, QueuedOutcome};
use crate::runtime::skew::jumped;
use crate::runtime::skew::Skew;
use crate::runtime::Shared;

/// Turns expired leases of known kinds into failed attempts ("worker lost") under their policy:
/// the kinds this process runs and those it only knows (run by outside workers, which hold
/// their leases through the API).
pub(crate) async fn rescuer(
    shared: Arc<Shared>,
    stop: CancellationToken,
    finish: mpsc::UnboundedSender<QueuedOutcome>,
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
                    let mut f = attempt::ended(&shared, &job, Some(end), &kind.policy);
                    f.expired_before = Some(now); // unless a heartbeat renewed it meanwhile
                    let mut o = QueuedOutcome::unheld(f);
                    o.counted = Some((kind.meters.clone(), None));
                    let _ = finish.send(o);
                }
            }
            Err(e) => shared
                .outage
                .report("the rescuer cannot read expired leases", &e),
        }
        tokio::select! {
            _ = tokio::time::sleep(shared.options.rescue_interval) => {}
            _ = jumped(&mut jumps) => {}
            _ = stop.cancelled() => return,
        }
    }
}
