//! Alerts as the API and the panel's badge both show them.

use onus::store::Alert;
use serde::Serialize;
use utoipa::ToSchema;

use crate::api::{ApiError, App};

/// The most alerts one listing returns.
pub const MAX_ALERTS: usize = 1000;

/// The answer of `GET /alerts`.
#[derive(Debug, Serialize, ToSchema)]
pub struct AlertList {
    /// Open alerts first (newest first), then acknowledged ones (newest first).
    pub alerts: Vec<Alert>,
    /// How many alerts are open in all.
    pub open: u64,
}

/// Alerts, open first: what `GET /alerts` and the panel's badge show.
pub async fn alert_list(app: &App, limit: usize) -> Result<AlertList, ApiError> {
    let alerts = app.client.alerts(limit).await?;
    let open = app.client.open_alerts().await?;
    Ok(AlertList { alerts, open })
}
