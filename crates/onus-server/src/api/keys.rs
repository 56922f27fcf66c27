//! Paused keys: hold every waiting job of a lease key until a time, without a claim, an attempt
//! or a snooze per job, and resume them early.

use axum::extract::{Path, State};
use axum::Json;
use onus::PausedKey;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{ApiError, App, Body};

/// The answer of `GET /keys`.
#[derive(Debug, Serialize, ToSchema)]
pub struct KeyList {
    /// Every key paused now, by key, with how many jobs each holds.
    pub keys: Vec<PausedKey>,
}

/// Every key paused now, with when its pause ends, why, and how many jobs it holds.
#[utoipa::path(get, path = "/keys", tag = "keys", responses((status = 200, body = KeyList)))]
pub async fn list(State(app): State<App>) -> Result<Json<KeyList>, ApiError> {
    Ok(Json(KeyList {
        keys: app.client.paused_keys().await?,
    }))
}

/// How long to pause a key.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PauseBody {
    /// Pause for this many seconds from now.
    #[serde(default)]
    pub seconds: Option<f64>,
    /// Or until this instant (RFC 3339).
    #[serde(default)]
    pub until: Option<String>,
    /// Why (shown with the pause).
    #[serde(default)]
    pub reason: Option<String>,
}

/// Pauses a lease key (percent-encoded in the path) until a time, replacing a pause in force:
/// every waiting job holding the key is held until then, not claimed, spending no attempt and
/// writing nothing to its history. Running jobs of the key finish.
#[utoipa::path(post, path = "/keys/{key}/pause", tag = "keys", request_body = PauseBody,
    params(("key" = String, Path, description = "the lease key, percent-encoded")),
    responses((status = 200, body = PausedKey), (status = 422, body = super::error::ErrorBody)))]
pub async fn pause(
    State(app): State<App>,
    Path(key): Path<String>,
    Body(body): Body<PauseBody>,
) -> Result<Json<PausedKey>, ApiError> {
    let now = app.client.now();
    let min = onus::runtime::MIN_PAUSE;
    let until = match super::jobs::later(body.seconds, body.until.as_deref())? {
        onus::SnoozeUntil::After(d) if d < min => {
            return Err(ApiError::invalid(format!(
            "seconds: a pause lasts at least {} s; give 1 or more (to end a pause, resume the key)",
            min.as_secs()
        )))
        }
        onus::SnoozeUntil::After(d) => onus::clock::add(now, d),
        onus::SnoozeUntil::At(t) if t < onus::clock::add(now, min) => {
            return Err(ApiError::invalid(format!(
                "until: a pause lasts at least {} s; give a time at least that far after now ({})",
                min.as_secs(),
                now.format("%Y-%m-%dT%H:%M:%SZ")
            )))
        }
        onus::SnoozeUntil::At(t) => t,
    };
    // The answer is the pause as written, not a second read (which a pause that has already
    // ended would miss).
    let paused = app
        .client
        .pause_key(&key, until, body.reason.as_deref().unwrap_or(""))
        .await?;
    Ok(Json(paused))
}

/// What a resume did.
#[derive(Debug, Serialize, ToSchema)]
pub struct Resumed {
    /// The key.
    pub key: String,
    /// Whether it was paused.
    pub was_paused: bool,
    /// The jobs it held, now due.
    pub released: u64,
}

/// Ends a key's pause now: the jobs it held are due at once (resuming a key that is not paused
/// changes nothing).
#[utoipa::path(post, path = "/keys/{key}/resume", tag = "keys",
    params(("key" = String, Path, description = "the lease key, percent-encoded")),
    responses((status = 200, body = Resumed)))]
pub async fn resume(
    State(app): State<App>,
    Path(key): Path<String>,
) -> Result<Json<Resumed>, ApiError> {
    let out = app.client.resume_key(&key).await?;
    Ok(Json(Resumed {
        key,
        was_paused: out.is_some(),
        released: out.unwrap_or(0),
    }))
}
