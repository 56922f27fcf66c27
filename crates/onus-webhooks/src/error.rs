//! The component's one error type, which knows whose fault it is.

use onus::{Fault, StoreError};

/// What went wrong in a webhook call.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed; the message says what to fix.
    #[error("{0}")]
    Invalid(String),
    /// No such endpoint or event.
    #[error("{0}")]
    NotFound(String),
    /// The action does not apply in the current state (say, redelivering to a disabled
    /// endpoint); the message says what to do first.
    #[error("{0}")]
    Conflict(String),
    /// A signing secret is malformed or too weak.
    #[error(transparent)]
    Secret(#[from] crate::signing::SignError),
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The job layer refused.
    #[error(transparent)]
    Jobs(#[from] onus::Error),
    /// The delivery client could not be set up from the configuration.
    #[error("the webhook delivery client cannot be set up: {0}")]
    Setup(#[from] onus_http::SetupError),
    /// The component is not registered with a runtime yet.
    #[error("register the webhooks with Builder::component before using them")]
    NotRegistered,
}

impl Error {
    /// Whose fault it is.
    pub fn fault(&self) -> Fault {
        match self {
            Error::Invalid(_) | Error::NotFound(_) | Error::Conflict(_) | Error::Secret(_) => {
                Fault::Caller
            }
            Error::Store(e) => e.fault(),
            Error::Jobs(e) => e.fault(),
            Error::Setup(_) | Error::NotRegistered => Fault::Service,
        }
    }
}
