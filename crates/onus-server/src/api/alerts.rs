//! Alerts raised by exhausted jobs: listed open first, acknowledged by hand.

use axum::extract::{Path, Query, State};
use axum::Json;
use onus::store::Alert;
use serde::Deserialize;
use utoipa::IntoParams;

use super::{ApiError, App};
pub use crate::views::alerts::{alert_list, AlertList, MAX_ALERTS};

/// The parameters of `GET /alerts`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AlertParams {
    /// Most alerts to answer, at most 1,000 (default 100).
    pub limit: Option<String>,
}

/// Alerts raised by exhausted jobs, open first.
#[utoipa::path(get, path = "/alerts", tag = "alerts", params(AlertParams),
    responses((status = 200, body = AlertList), (status = 422, body = super::error::ErrorBody)))]
pub async fn list(
    State(app): State<App>,
    params: Result<Query<AlertParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<AlertList>, ApiError> {
    let Query(p) = params.map_err(|e| ApiError::invalid(e.body_text()))?;
    let limit = super::page_size(&p.limit, 100, MAX_ALERTS)?;
    Ok(Json(alert_list(&app, limit).await?))
}

/// Acknowledges an alert (acknowledging it again keeps the first time).
#[utoipa::path(post, path = "/alerts/{id}/ack", tag = "alerts",
    params(("id" = i64, Path, description = "the alert's id")),
    responses((status = 200, body = Alert), (status = 404, body = super::error::ErrorBody)))]
pub async fn ack(State(app): State<App>, Path(id): Path<String>) -> Result<Json<Alert>, ApiError> {
    let missing = || ApiError::not_found(format!("no alert with id {id:?}"));
    let n: i64 = id.parse().ok().filter(|n| *n > 0).ok_or_else(missing)?;
    app.client.ack_alert(n).await?.map(Json).ok_or_else(missing)
}
