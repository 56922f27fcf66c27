//! The JSON body extractor: over the limit is 413, not JSON is 400, JSON of the wrong shape is
//! 422 naming the field; all in the API's error shape.

use axum::extract::{FromRequest, Request};
use futures_util::StreamExt as _;
use serde::de::DeserializeOwned;

use super::{ApiError, App};

/// A JSON request body of type `T`.
#[derive(Debug)]
pub struct Body<T>(pub T);

/// The limit a body extractor reports in its 413 (the layer enforces it).
fn limit_of(req: &Request, app: &App) -> usize {
    if req.uri().path().ends_with("/jobs/batch") {
        super::BATCH_BODY_LIMIT
    } else {
        app.limits.body
    }
}

/// Decodes `bytes` as JSON of type `T`: 400 when it is not JSON, 422 naming the field when it is
/// JSON of another shape.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::malformed(
            "the request needs a JSON body (Content-Type: application/json)",
        ));
    }
    if let Err(e) = std::str::from_utf8(bytes) {
        return Err(ApiError::malformed(format!(
            "the body is not valid JSON: it is not UTF-8 (an invalid byte at offset {}); send JSON encoded as UTF-8",
            e.valid_up_to()
        )));
    }
    let v: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::malformed(format!("the body is not valid JSON: {e}")))?;
    // Neither database stores a NUL in text alike: refused at the door, naming where it is.
    if let Some(at) = onus::job::find_nul(&v, "body") {
        return Err(ApiError::invalid(format!(
            "{at} contains a NUL character (\\u0000), which cannot be stored; remove it or encode the value (base64, say)"
        )));
    }
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        if path == "." {
            ApiError::invalid(inner)
        } else {
            ApiError::invalid(format!("{path}: {inner}"))
        }
    })
}

/// How much of a body over the limit is still read (and dropped) before the 413, so a client
/// that sends it whole reads the answer instead of a broken connection.
const DRAIN_CAP: usize = 64 << 20;

/// The body's bytes, within the limit; over it, a 413.
async fn read(req: Request, state: &App) -> Result<Vec<u8>, ApiError> {
    let limit = limit_of(&req, state);
    let mut stream = req.into_body().into_data_stream();
    let mut buf = Vec::new();
    let mut seen = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            let e = e.into_inner();
            if e.is::<tower_http::timeout::TimeoutError>() {
                ApiError::body_timeout(state.limits.body_timeout)
            } else {
                ApiError::malformed(format!("cannot read the request body: {e}"))
            }
        })?;
        seen = seen.saturating_add(chunk.len());
        if seen > limit {
            buf = Vec::new();
            if seen > DRAIN_CAP {
                break;
            }
            continue;
        }
        buf.extend_from_slice(&chunk);
    }
    if seen > limit {
        return Err(ApiError::too_large(limit));
    }
    Ok(buf)
}

impl<T: DeserializeOwned> FromRequest<App> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &App) -> Result<Self, ApiError> {
        decode(&read(req, state).await?).map(Body)
    }
}

/// A JSON body that may be left out: an empty body is `T::default()`.
#[derive(Debug)]
pub struct OptionalBody<T>(pub T);

impl<T: DeserializeOwned + Default> FromRequest<App> for OptionalBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &App) -> Result<Self, ApiError> {
        let bytes = read(req, state).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalBody(T::default()));
        }
        decode(&bytes).map(OptionalBody)
    }
}
