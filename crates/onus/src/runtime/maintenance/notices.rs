//! Notices from other processes forwarded to this process's idle workers.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::runtime::Shared;

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
                Some(crate::store::Notice::Written) => shared.intakes.wake_idle(&shared.hub),
                None => return,
            },
            _ = stop.cancelled() => return,
        }
    }
}
