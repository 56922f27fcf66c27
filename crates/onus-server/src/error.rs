//! Why a command of the `onus` binary, or `onus serve`, stopped: typed, with its cause kept.

/// Why `onus` stopped: bad input (the message says what to fix), or a failure of a layer below,
/// kept as it was so its cause chain reaches the log.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad configuration, arguments or input: the message says what to fix.
    #[error("{0}")]
    Invalid(String),
    /// The configuration file.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The database.
    #[error(transparent)]
    Store(#[from] onus::StoreError),
    /// The job layer.
    #[error(transparent)]
    Onus(#[from] onus::Error),
    /// The webhook service.
    #[error(transparent)]
    Webhooks(#[from] onus_webhooks::Error),
    /// Building the job layer from the configuration.
    #[error(transparent)]
    Build(#[from] onus::BuildError),
    /// Writing JSON for the terminal.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// Refused as the API refuses it (the same checks, run by a command).
    #[error("{}", .0.message)]
    Api(crate::api::ApiError),
    /// What `what` was doing when `source` happened.
    #[error("{what}: {source}")]
    In {
        /// What was being done.
        what: String,
        /// What went wrong.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl Error {
    /// `source`, which happened while doing `what`.
    pub fn during(
        what: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::In {
            what: what.into(),
            source: Box::new(source),
        }
    }
}

impl From<crate::api::ApiError> for Error {
    fn from(e: crate::api::ApiError) -> Self {
        Error::Api(e)
    }
}

impl From<String> for Error {
    fn from(message: String) -> Self {
        Error::Invalid(message)
    }
}

impl From<&str> for Error {
    fn from(message: &str) -> Self {
        Error::Invalid(message.to_string())
    }
}
