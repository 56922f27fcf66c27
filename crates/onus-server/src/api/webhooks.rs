//! Webhooks: endpoints (scoped by tenant, with their health, secrets, tests and redelivery) and
//! events (published, listed, shown with their deliveries).

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use onus_webhooks::{
    Delivery, DeliveryAttempt, Endpoint, EndpointUpdate, Event, NewEndpoint, NewEvent,
};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::body::OptionalBody;
use super::jobs::instant;
use super::{ApiError, App, Body};
pub use crate::views::events::{event_page, EventPage, EventParams};

/// The most records one page of events or attempts holds.
pub const MAX_PAGE: usize = 1000;

/// A new endpoint and its secret, shown this once.
#[derive(Debug, Serialize, ToSchema)]
pub struct EndpointCreated {
    /// The endpoint.
    #[serde(flatten)]
    pub endpoint: Endpoint,
    /// Its signing secret (`whsec_...`): shown only here and on rotation.
    pub secret: String,
}

/// Registers an endpoint; its `whsec_` secret is in this answer only.
#[utoipa::path(post, path = "/endpoints", tag = "webhooks", request_body = NewEndpoint,
    responses((status = 201, body = EndpointCreated), (status = 422, body = super::error::ErrorBody)))]
pub async fn create(
    State(app): State<App>,
    Body(body): Body<NewEndpoint>,
) -> Result<(StatusCode, Json<EndpointCreated>), ApiError> {
    let (endpoint, secret) = app.webhooks.create_endpoint(body).await?;
    Ok((
        StatusCode::CREATED,
        Json(EndpointCreated { endpoint, secret }),
    ))
}

/// The filter of `GET /endpoints`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EndpointParams {
    /// Only this tenant's endpoints.
    pub tenant: Option<String>,
}

/// The answer of `GET /endpoints`.
#[derive(Debug, Serialize, ToSchema)]
pub struct EndpointList {
    /// Oldest first.
    pub endpoints: Vec<Endpoint>,
}

/// Endpoints, of one tenant when given, with their health.
#[utoipa::path(get, path = "/endpoints", tag = "webhooks", params(EndpointParams),
    responses((status = 200, body = EndpointList), (status = 422, body = super::error::ErrorBody)))]
pub async fn list(
    State(app): State<App>,
    params: Result<Query<EndpointParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<EndpointList>, ApiError> {
    let Query(p) = params.map_err(|e| ApiError::invalid(e.body_text()))?;
    Ok(Json(EndpointList {
        endpoints: app.webhooks.endpoints_of(p.tenant.as_deref()).await?,
    }))
}

/// An endpoint with its health: `failing_since`, `last_failure_at`, `enabled`, `disabled_reason`.
#[utoipa::path(get, path = "/endpoints/{id}", tag = "webhooks",
    params(("id" = String, Path, description = "the endpoint's id")),
    responses((status = 200, body = Endpoint), (status = 404, body = super::error::ErrorBody)))]
pub async fn show(
    State(app): State<App>,
    Path(id): Path<String>,
) -> Result<Json<Endpoint>, ApiError> {
    Ok(Json(app.webhooks.endpoint(&id).await?))
}

/// Changes an endpoint's URL, event types, description or headers.
#[utoipa::path(patch, path = "/endpoints/{id}", tag = "webhooks", request_body = EndpointUpdate,
    params(("id" = String, Path, description = "the endpoint's id")),
    responses((status = 200, body = Endpoint), (status = 404, body = super::error::ErrorBody), (status = 422, body = super::error::ErrorBody)))]
pub async fn update(
    State(app): State<App>,
    Path(id): Path<String>,
    Body(body): Body<EndpointUpdate>,
) -> Result<Json<Endpoint>, ApiError> {
    Ok(Json(app.webhooks.update_endpoint(&id, body).await?))
}

/// Deletes an endpoint; its pending deliveries are discarded.
#[utoipa::path(delete, path = "/endpoints/{id}", tag = "webhooks",
    params(("id" = String, Path, description = "the endpoint's id")),
    responses((status = 204, description = "deleted"), (status = 404, body = super::error::ErrorBody)))]
pub async fn delete(
    State(app): State<App>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    app.webhooks.delete_endpoint(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Enables an endpoint again (its health is reset).
#[utoipa::path(post, path = "/endpoints/{id}/enable", tag = "webhooks",
    params(("id" = String, Path, description = "the endpoint's id")),
    responses((status = 200, body = Endpoint), (status = 404, body = super::error::ErrorBody)))]
pub async fn enable(
    State(app): State<App>,
    Path(id): Path<String>,
) -> Result<Json<Endpoint>, ApiError> {
    Ok(Json(app.webhooks.enable(&id).await?))
}

/// Why an endpoint is disabled.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DisableBody {
    /// Shown with the endpoint ("disabled by request" when absent).
    #[serde(default)]
    pub reason: Option<String>,
}

/// Disables an endpoint; its pending deliveries are discarded.
#[utoipa::path(post, path = "/endpoints/{id}/disable", tag = "webhooks", request_body(content = DisableBody, description = "optional"),
    params(("id" = String, Path, description = "the endpoint's id")),
    responses((status = 200, body = Endpoint), (status = 404, body = super::error::ErrorBody)))]
pub async fn disable(
    State(app): State<App>,
    Path(id): Path<String>,
    OptionalBody(body): OptionalBody<DisableBody>,
) -> Result<Json<Endpoint>, ApiError> {
    let reason = body.reason.unwrap_or_else(|| "disabled by request".into());
    app.webhooks.disable(&id, &reason).await?;
    Ok(Json(app.webhooks.endpoint(&id).await?))
}

/// A secret to rotate to.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RotateBody {
    /// The new `whsec_` secret; one is made when absent.
    #[serde(default)]
    pub secret: Option<String>,
}

/// The new secret.
#[derive(Debug, Serialize, ToSchema)]
pub struct Rotated {
    /// The new signing secret; deliveries are signed with it and the previous one until the
    /// next rotation.
    pub secret: String,
}

/// Adds a new signing secret, keeping the previous one so consumers can switch.
#[utoipa::path(post, path = "/endpoints/{id}/rotate-secret", tag = "webhooks", request_body(content = RotateBody, description = "optional"),
    params(("id" = String, Path, description = "the endpoint's id")),
    responses((status = 200, body = Rotated), (status = 404, body = super::error::ErrorBody), (status = 422, body = super::error::ErrorBody)))]
pub async fn rotate_secret(
    State(app): State<App>,
    Path(id): Path<String>,
    OptionalBody(body): OptionalBody<RotateBody>,
) -> Result<Json<Rotated>, ApiError> {
    Ok(Json(Rotated {
        secret: app.webhooks.rotate_secret(&id, body.secret).await?,
    }))
}

/// Sends a `webhook.test` event to this endpoint alone.
#[utoipa::path(post, path = "/endpoints/{id}/test", tag = "webhooks",
    params(("id" = String, Path, description = "the endpoint's id")),
    responses((status = 202, body = Event), (status = 404, body = super::error::ErrorBody), (status = 409, body = super::error::ErrorBody)))]
pub async fn test(
    State(app): State<App>,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<Event>), ApiError> {
    Ok((
        StatusCode::ACCEPTED,
        Json(app.webhooks.send_test(&id).await?),
    ))
}

/// From when to redeliver.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RedeliverBody {
    /// Deliveries discarded at or after this instant (RFC 3339); the last 14 days when absent.
    #[serde(default)]
    pub since: Option<String>,
}

/// What a redelivery did.
#[derive(Debug, Serialize, ToSchema)]
pub struct Redelivered {
    /// How many discarded deliveries run again.
    pub retried: usize,
    /// Their jobs.
    pub job_ids: Vec<i64>,
}

/// Runs the endpoint's discarded deliveries again, one more attempt each.
#[utoipa::path(post, path = "/endpoints/{id}/redeliver", tag = "webhooks", request_body(content = RedeliverBody, description = "optional"),
    params(("id" = String, Path, description = "the endpoint's id")),
    responses((status = 200, body = Redelivered), (status = 404, body = super::error::ErrorBody), (status = 409, body = super::error::ErrorBody), (status = 422, body = super::error::ErrorBody)))]
pub async fn redeliver(
    State(app): State<App>,
    Path(id): Path<String>,
    OptionalBody(body): OptionalBody<RedeliverBody>,
) -> Result<Json<Redelivered>, ApiError> {
    let since = body
        .since
        .as_deref()
        .map(|v| instant("since", v))
        .transpose()?;
    let job_ids = app.webhooks.redeliver_since(&id, since).await?;
    Ok(Json(Redelivered {
        retried: job_ids.len(),
        job_ids,
    }))
}

/// The parameters of a page.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// Records per page, at most 1,000 (default 50).
    pub limit: Option<String>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// A page of delivery attempts.
#[derive(Debug, Serialize, ToSchema)]
pub struct AttemptPage {
    /// Newest first.
    pub attempts: Vec<DeliveryAttempt>,
    /// Pass as `cursor` for the next page; null on the last one.
    pub next_cursor: Option<String>,
}

/// The endpoint's delivery attempts, newest first: status, duration, response excerpt, error.
#[utoipa::path(get, path = "/endpoints/{id}/attempts", tag = "webhooks", params(("id" = String, Path, description = "the endpoint's id"), PageParams),
    responses((status = 200, body = AttemptPage), (status = 404, body = super::error::ErrorBody), (status = 422, body = super::error::ErrorBody)))]
pub async fn attempts(
    State(app): State<App>,
    Path(id): Path<String>,
    params: Result<Query<PageParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<AttemptPage>, ApiError> {
    let Query(p) = params.map_err(|e| ApiError::invalid(e.body_text()))?;
    let limit = super::page_size(&p.limit, 50, MAX_PAGE)?;
    let cursor = match &p.cursor {
        None => None,
        Some(c) => Some(
            app.webhooks
                .attempt(c)
                .await?
                .ok_or_else(|| super::bad_cursor(c))?,
        ),
    };
    let rows = app
        .webhooks
        .endpoint_attempts(&id, limit + 1, cursor.as_ref())
        .await?;
    let (attempts, next_cursor) = super::paged(rows, limit, |a| a.id.to_string());
    Ok(Json(AttemptPage {
        attempts,
        next_cursor,
    }))
}

/// An event to publish.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewEventBody {
    /// Its type, such as `invoice.paid`.
    #[serde(rename = "type")]
    pub event_type: String,
    /// The JSON body sent to each endpoint (at most 256 KiB).
    #[schema(value_type = Object)]
    pub payload: serde_json::Value,
    /// The tenant whose endpoints receive it; endpoints without a tenant when absent.
    #[serde(default)]
    pub tenant: Option<String>,
    /// Your id for it (1 to 100 letters, digits, `_`, `-`): the same id again delivers nothing
    /// twice. Sent as `webhook-id`.
    #[serde(default)]
    pub id: Option<String>,
}

/// Publishes an event: 202 when new, 200 with the stored event when its id was published before.
#[utoipa::path(post, path = "/events", tag = "webhooks", request_body = NewEventBody,
    responses((status = 202, body = Event), (status = 200, description = "published before: the stored event", body = Event),
              (status = 409, body = super::error::ErrorBody), (status = 422, body = super::error::ErrorBody)))]
pub async fn publish(
    State(app): State<App>,
    Body(body): Body<NewEventBody>,
) -> Result<(StatusCode, Json<Event>), ApiError> {
    let (event, fresh) = app
        .webhooks
        .publish_event(NewEvent {
            event_type: body.event_type,
            payload: body.payload,
            id: body.id,
            tenant: body.tenant,
            only_endpoint: None,
        })
        .await?;
    let status = if fresh {
        StatusCode::ACCEPTED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(event)))
}

/// Events, newest first, of one tenant and one type when given.
#[utoipa::path(get, path = "/events", tag = "webhooks", params(EventParams),
    responses((status = 200, body = EventPage), (status = 422, body = super::error::ErrorBody)))]
pub async fn events(
    State(app): State<App>,
    params: Result<Query<EventParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<EventPage>, ApiError> {
    let Query(p) = params.map_err(|e| ApiError::invalid(e.body_text()))?;
    Ok(Json(event_page(&app, &p).await?))
}

/// One event.
#[utoipa::path(get, path = "/events/{id}", tag = "webhooks",
    params(("id" = String, Path, description = "the event's id")),
    responses((status = 200, body = Event), (status = 404, body = super::error::ErrorBody)))]
pub async fn event(
    State(app): State<App>,
    Path(id): Path<String>,
) -> Result<Json<Event>, ApiError> {
    Ok(Json(app.webhooks.event(&id).await?))
}

/// The deliveries of an event.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeliveryList {
    /// One per endpoint it fanned out to, each with its job, state and attempts.
    pub deliveries: Vec<Delivery>,
}

/// An event's deliveries: per endpoint, the job, its state and its attempts.
#[utoipa::path(get, path = "/events/{id}/deliveries", tag = "webhooks",
    params(("id" = String, Path, description = "the event's id")),
    responses((status = 200, body = DeliveryList), (status = 404, body = super::error::ErrorBody)))]
pub async fn deliveries(
    State(app): State<App>,
    Path(id): Path<String>,
) -> Result<Json<DeliveryList>, ApiError> {
    Ok(Json(DeliveryList {
        deliveries: app.webhooks.deliveries(&id).await?,
    }))
}
