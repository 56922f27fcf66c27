//! Leadership: elected through the store, then (as leader) periodic enqueues, the counters
//! folded, and retention.

use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use super::periodic::{enqueue_due_periods, register_periodics};
use super::retention::{fold_counts, prune};
use super::{LEADER, PERIODIC_LEADER};
use crate::clock::add;
use crate::runtime::skew::jumped;
use crate::runtime::Shared;

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
                shared.outage.clear();
                l
            }
            Err(e) => {
                shared.outage.report("leader election failed", &e);
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
