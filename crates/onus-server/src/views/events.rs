//! Webhook events as the API and the panel both list them.

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::api::{ApiError, App};
use crate::views::jobs::MAX_PAGE;
use onus_webhooks::Event;

/// The filter of `GET /events`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventParams {
    /// Only this tenant's events.
    pub tenant: Option<String>,
    /// Only events of this type.
    #[serde(rename = "type")]
    #[param(rename = "type")]
    pub event_type: Option<String>,
    /// Events per page, at most 1,000 (default 50).
    pub limit: Option<String>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// A page of events.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventPage {
    /// Newest first.
    pub events: Vec<Event>,
    /// Pass as `cursor` for the next page; null on the last one.
    pub next_cursor: Option<String>,
}

/// One page of events: what `GET /events` and the panel show.
pub async fn event_page(app: &App, p: &EventParams) -> Result<EventPage, ApiError> {
    let limit = crate::api::page_size(&p.limit, 50, MAX_PAGE)?;
    let cursor = match &p.cursor {
        None => None,
        Some(c) => Some(app.webhooks.event(c).await.map_err(|e| match e {
            // Only an event that is not there makes a bad cursor; a database that
            // cannot answer stays a 503.
            onus_webhooks::Error::NotFound(_) => crate::api::bad_cursor(c),
            e => e.into(),
        })?),
    };
    let rows = app
        .webhooks
        .events(
            p.tenant.as_deref(),
            p.event_type.as_deref(),
            limit + 1,
            cursor.as_ref(),
        )
        .await?;
    let (events, next_cursor) = crate::api::paged(rows, limit, |e| e.id.to_string());
    Ok(EventPage {
        events,
        next_cursor,
    })
}
