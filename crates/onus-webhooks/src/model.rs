//! The records: endpoints, events, delivery attempts, and the args of the webhook kinds.

use std::collections::BTreeMap;

use onus::sql::{FromRow, FromValue, Json, Row, Value};
use onus::{StoreResult, Timestamp};
use serde::{Deserialize, Serialize};

use crate::ids::{AttemptId, EndpointId, EventId};

/// A webhook endpoint. Its `Debug` output hides the secrets.
#[derive(Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Endpoint {
    /// Its id (`ep_...`).
    pub id: EndpointId,
    /// The URL deliveries are POSTed to.
    pub url: String,
    /// The tenant (a customer of the team) it belongs to: it receives only that tenant's events;
    /// an endpoint without one receives only events without one.
    pub tenant: Option<String>,
    /// A note from whoever created it.
    pub description: String,
    /// Headers sent with every delivery.
    pub headers: BTreeMap<String, String>,
    /// The event types it receives; empty means every type.
    pub event_types: Vec<String>,
    /// What a delivery's body is: the envelope `{"type", "timestamp", "data"}` or the bare
    /// payload.
    pub payload: PayloadFormat,
    /// The active signing secrets, newest first (`whsec_...`). Shown only on creation and rotation.
    #[serde(skip)]
    pub secrets: Vec<String>,
    /// Whether deliveries go out to it.
    pub enabled: bool,
    /// Why it was disabled (by hand, a 410, or failing too long).
    pub disabled_reason: Option<String>,
    /// When it was disabled.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime))]
    pub disabled_at: Option<Timestamp>,
    /// Since when it has been failing without a success in between.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime))]
    pub failing_since: Option<Timestamp>,
    /// Its latest failure.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime))]
    pub last_failure_at: Option<Timestamp>,
    /// Until when a delivery holds the endpoint's lease (one delivery in flight at a time).
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime))]
    pub busy_until: Option<Timestamp>,
    /// When it was created.
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub created_at: Timestamp,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("id", &self.id)
            .field("url", &self.url)
            .field("tenant", &self.tenant)
            .field("description", &self.description)
            .field("headers", &format_args!("[{} hidden]", self.headers.len()))
            .field("event_types", &self.event_types)
            .field("payload", &self.payload)
            .field("secrets", &format_args!("[{} hidden]", self.secrets.len()))
            .field("enabled", &self.enabled)
            .field("disabled_reason", &self.disabled_reason)
            .field("disabled_at", &self.disabled_at)
            .field("failing_since", &self.failing_since)
            .field("last_failure_at", &self.last_failure_at)
            .field("busy_until", &self.busy_until)
            .field("created_at", &self.created_at)
            .finish()
    }
}

impl FromRow for Endpoint {
    fn from_row(r: &Row) -> StoreResult<Self> {
        Ok(Endpoint {
            id: r.get("id")?,
            url: r.get("url")?,
            tenant: r.get("tenant")?,
            description: r.get("description")?,
            headers: r.get::<Json<BTreeMap<String, String>>>("headers")?.0,
            event_types: r.get::<Json<Vec<String>>>("event_types")?.0,
            payload: PayloadFormat::from_column(&r.get::<String>("payload")?)?,
            secrets: r.get::<Json<Vec<String>>>("secrets")?.0,
            enabled: r.get("enabled")?,
            disabled_reason: r.get("disabled_reason")?,
            disabled_at: r.get("disabled_at")?,
            failing_since: r.get("failing_since")?,
            last_failure_at: r.get("last_failure_at")?,
            busy_until: None,
            created_at: r.get("created_at")?,
        })
    }
}

/// A new endpoint. Its `Debug` output hides the secret.
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NewEndpoint {
    /// The URL deliveries are POSTed to (`https://...`).
    pub url: String,
    /// The event types it receives; empty or absent means every type.
    #[serde(default)]
    pub event_types: Vec<String>,
    /// Its signing secret (`whsec_...`); one is made when absent.
    #[serde(default)]
    pub secret: Option<String>,
    /// A note.
    #[serde(default)]
    pub description: String,
    /// The tenant it belongs to (see [`Endpoint::tenant`]).
    #[serde(default)]
    pub tenant: Option<String>,
    /// Headers sent with every delivery.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// What a delivery's body is (default: the envelope).
    #[serde(default)]
    pub payload: PayloadFormat,
}

/// What a delivery's body is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum PayloadFormat {
    /// The Standard Webhooks envelope, `{"type": "invoice.paid", "timestamp": "2026-...Z",
    /// "data": <the payload>}`: a consumer can tell what it received and dispatch on `type`.
    #[default]
    Envelope,
    /// The event's payload alone, for consumers that want the bare JSON.
    Raw,
}

impl PayloadFormat {
    /// Its name as stored and written in requests.
    pub fn as_str(self) -> &'static str {
        match self {
            PayloadFormat::Envelope => "envelope",
            PayloadFormat::Raw => "raw",
        }
    }

    fn from_column(s: &str) -> StoreResult<Self> {
        match s {
            "envelope" => Ok(PayloadFormat::Envelope),
            "raw" => Ok(PayloadFormat::Raw),
            other => Err(onus::StoreError::Decode {
                table: "onus_endpoints",
                column: "payload".into(),
                problem: format!("{other:?} is not a payload format (envelope or raw)"),
            }),
        }
    }

    /// The body of a delivery of `event` in this format.
    pub fn body(self, event: &Event) -> serde_json::Value {
        match self {
            PayloadFormat::Envelope => serde_json::json!({
                "type": event.event_type,
                "timestamp": event.created_at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
                "data": event.payload,
            }),
            PayloadFormat::Raw => event.payload.clone(),
        }
    }
}

/// Changes to an endpoint; absent fields stay as they are. Its `Debug` output hides headers.
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EndpointUpdate {
    /// A new URL.
    #[serde(default)]
    pub url: Option<String>,
    /// New event types (empty: every type).
    #[serde(default)]
    pub event_types: Option<Vec<String>>,
    /// A new note.
    #[serde(default)]
    pub description: Option<String>,
    /// New headers (replacing all of them).
    #[serde(default)]
    pub headers: Option<BTreeMap<String, String>>,
    /// A new body format.
    #[serde(default)]
    pub payload: Option<PayloadFormat>,
}

impl std::fmt::Debug for EndpointUpdate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointUpdate")
            .field("url", &self.url)
            .field("event_types", &self.event_types)
            .field("description", &self.description)
            .field("headers", &self.headers.as_ref().map(|h| h.len()))
            .field("payload", &self.payload)
            .finish()
    }
}

impl std::fmt::Debug for NewEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewEndpoint")
            .field("url", &self.url)
            .field("event_types", &self.event_types)
            .field("secret", &self.secret.as_ref().map(|_| "(hidden)"))
            .field("description", &self.description)
            .field("tenant", &self.tenant)
            .field("headers", &format_args!("[{} hidden]", self.headers.len()))
            .field("payload", &self.payload)
            .finish()
    }
}

/// The largest event payload accepted, as serialized JSON.
pub const MAX_PAYLOAD_BYTES: usize = 256 * 1024;

/// An event.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Event {
    /// Its id (`msg_...` unless the publisher chose one), sent as `webhook-id`.
    pub id: EventId,
    /// Its type, such as `invoice.paid`.
    #[serde(rename = "type")]
    pub event_type: String,
    /// The JSON payload sent as the body.
    pub payload: serde_json::Value,
    /// The tenant whose endpoints receive it (none: endpoints without a tenant).
    pub tenant: Option<String>,
    /// Set for a test event: the one endpoint it goes to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub only_endpoint: Option<EndpointId>,
    /// When it was published.
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub created_at: Timestamp,
}

impl FromRow for Event {
    fn from_row(r: &Row) -> StoreResult<Self> {
        Ok(Event {
            id: r.get("id")?,
            event_type: r.get("type")?,
            payload: r.get("payload")?,
            tenant: r.get("tenant")?,
            only_endpoint: r.get("only_endpoint")?,
            created_at: r.get("created_at")?,
        })
    }
}

/// How one delivery attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum AttemptOutcome {
    /// The endpoint answered 2xx.
    Success,
    /// It failed in a way another attempt may fix (5xx, 408, a timeout, a reset).
    Retryable,
    /// The endpoint asked for time (429 or 503 with `Retry-After`).
    Snoozed,
    /// Another attempt cannot help (another 4xx, a refused destination).
    Permanent,
}

impl AttemptOutcome {
    /// Its name as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptOutcome::Success => "success",
            AttemptOutcome::Retryable => "retryable",
            AttemptOutcome::Snoozed => "snoozed",
            AttemptOutcome::Permanent => "permanent",
        }
    }

    /// The outcome of a classified answer.
    pub fn of(class: &onus_http::Class) -> Self {
        match class {
            onus_http::Class::Success => AttemptOutcome::Success,
            onus_http::Class::Snooze { .. } => AttemptOutcome::Snoozed,
            onus_http::Class::Retryable(_) => AttemptOutcome::Retryable,
            onus_http::Class::Permanent(_) => AttemptOutcome::Permanent,
        }
    }
}

impl std::fmt::Display for AttemptOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<AttemptOutcome> for Value {
    fn from(o: AttemptOutcome) -> Value {
        Value::Text(o.as_str().into())
    }
}

impl FromValue for AttemptOutcome {
    fn from_value(v: &Value, backend: onus::sql::Backend) -> Result<Self, String> {
        let s = String::from_value(v, backend)?;
        [
            AttemptOutcome::Success,
            AttemptOutcome::Retryable,
            AttemptOutcome::Snoozed,
            AttemptOutcome::Permanent,
        ]
        .into_iter()
        .find(|o| o.as_str() == s)
        .ok_or_else(|| {
            format!("{s:?} is not an outcome (success, retryable, snoozed or permanent)")
        })
    }
}

/// One delivery attempt.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeliveryAttempt {
    /// Its id (`att_...`).
    pub id: AttemptId,
    /// The event delivered.
    pub event_id: EventId,
    /// The endpoint it went to.
    pub endpoint_id: EndpointId,
    /// The delivery job.
    pub job_id: i64,
    /// The job's attempt number.
    pub attempt: u32,
    /// When it was made.
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub attempted_at: Timestamp,
    /// The response status, if a response came.
    pub status: Option<u16>,
    /// How long it took, in milliseconds.
    pub duration_ms: f64,
    /// The start of the response body.
    pub response_excerpt: String,
    /// The transport error, if no response came.
    pub error: Option<String>,
    /// How it ended.
    pub outcome: AttemptOutcome,
}

impl FromRow for DeliveryAttempt {
    fn from_row(r: &Row) -> StoreResult<Self> {
        Ok(DeliveryAttempt {
            id: r.get("id")?,
            event_id: r.get("event_id")?,
            endpoint_id: r.get("endpoint_id")?,
            job_id: r.get("job_id")?,
            attempt: r.get("attempt")?,
            attempted_at: r.get("attempted_at")?,
            status: r.get("status")?,
            duration_ms: r.get::<i64>("duration_us")? as f64 / 1000.0,
            response_excerpt: r.get("response_excerpt")?,
            error: r.get("error")?,
            outcome: r.get("outcome")?,
        })
    }
}

/// The args of a delivery job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeliverArgs {
    /// The event to deliver.
    pub event_id: EventId,
    /// The endpoint to deliver it to.
    pub endpoint_id: EndpointId,
}

/// The args of a fan-out job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FanoutArgs {
    /// The event to fan out.
    pub event_id: EventId,
}
