//! What runs where: every `onus serve` process (and application runtime) sharing the database,
//! and every named pull worker, seen within the last hour.

use axum::extract::State;
use axum::Json;

use super::{ApiError, App};

/// Every process seen within the last hour: runtimes with their queues, slots, kinds and running
/// jobs, and named pull workers with the kinds they claim. A process is `live` when seen within
/// 30 s (runtimes write their presence every 10 s and remove it when they stop).
#[utoipa::path(get, path = "/processes", tag = "processes",
    responses((status = 200, body = onus::Processes)))]
pub async fn list(State(app): State<App>) -> Result<Json<onus::Processes>, ApiError> {
    Ok(Json(app.client.processes().await?))
}
