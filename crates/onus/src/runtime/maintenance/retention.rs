//! Retention: old finished jobs, rate windows and counter history pruned, counters folded.

use std::time::Duration;

use crate::runtime::Shared;

/// How long the per-minute history behind the panel's charts is kept.
const HISTORY_KEPT: Duration = Duration::from_secs(2 * 86_400);

pub(super) async fn fold_counts(shared: &Shared) {
    let keep_since = crate::clock::sub(shared.clock.now(), HISTORY_KEPT);
    if let Err(e) = shared.store.fold_counts(keep_since).await {
        shared.outage.report("cannot fold job counts", &e);
    }
}

pub(super) async fn prune(shared: &Shared) {
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
                shared.outage.report("retention failed", &e);
                return;
            }
        }
    }
}
