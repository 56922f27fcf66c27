//! The one place typed errors become HTTP statuses: `{"error": {"code", "message"}}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// A stable code clients branch on.
    pub code: &'static str,
    /// What went wrong and what to do, for a person.
    pub message: String,
}

/// The body of every error answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// An error's code and message.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// `malformed`, `unauthorized`, `not_found`, `conflict`, `too_large`, `invalid`,
    /// `unavailable` or `internal`.
    pub code: String,
    /// What went wrong and what to do.
    pub message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    /// 400: the body is not JSON (or not the JSON a call takes at all).
    pub fn malformed(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "malformed", message)
    }

    /// 401: no token, or a wrong one.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "send the API token as `Authorization: Bearer <token>` (`onus token show` prints it)",
        )
    }

    /// 404.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// 409: the action does not apply in the current state.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", message)
    }

    /// 408: the body stopped arriving for `after`.
    pub fn body_timeout(after: std::time::Duration) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "timeout",
            format!(
                "the request body stopped arriving for {} ms (body_timeout); send it whole without pausing",
                after.as_millis()
            ),
        )
    }

    /// 413.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!(
                "the request body is over the limit of {} bytes; send less, or raise `body_limit` in onus.toml",
                limit
            ),
        )
    }

    /// 422: well-formed but invalid; the message names the field.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", message)
    }

    /// 503: the database cannot be reached now; the same call may work later.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
    }

    /// 500: a fault of the service.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::error!(status = self.status.as_u16(), code = self.code, error = %self.message, "request failed");
        }
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.to_string(),
                message: self.message,
            },
        };
        (self.status, Json(body)).into_response()
    }
}

impl From<onus::StoreError> for ApiError {
    fn from(e: onus::StoreError) -> Self {
        use onus::StoreError as E;
        match e {
            E::NotFound(id) => ApiError::not_found(format!("no job with id {id}")),
            E::Conflict(m) => ApiError::conflict(m),
            E::BadUrl(m) => ApiError::invalid(m),
            E::Unavailable(..) | E::Closed => ApiError::unavailable(e.to_string()),
            E::Open(_) | E::Query(..) | E::Constraint(..) | E::Decode { .. } | E::Aborted => {
                ApiError::internal(e.to_string())
            }
        }
    }
}

impl From<onus::Error> for ApiError {
    fn from(e: onus::Error) -> Self {
        match e {
            onus::Error::Invalid(m) => ApiError::invalid(m),
            onus::Error::Store(e) => e.into(),
            onus::Error::Timeout(m) => ApiError::unavailable(m),
            onus::Error::NotFound(m) => ApiError::not_found(m),
        }
    }
}

impl From<onus_webhooks::Error> for ApiError {
    fn from(e: onus_webhooks::Error) -> Self {
        use onus_webhooks::Error as E;
        match e {
            E::Invalid(m) => ApiError::invalid(m),
            E::NotFound(m) => ApiError::not_found(m),
            E::Conflict(m) => ApiError::conflict(m),
            E::Secret(e) => ApiError::invalid(format!("secret: {e}")),
            E::Store(e) => e.into(),
            E::Jobs(e) => e.into(),
            E::Setup(_) | E::NotRegistered => ApiError::internal(e.to_string()),
        }
    }
}
