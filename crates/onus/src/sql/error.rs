//! The errors of the database: what went wrong and what to do about it, for every layer that
//! reaches the database (the job store and the components above it alike).

use serde::Serialize;

/// The database driver's own error (rusqlite's, tokio-postgres's), kept as the source of the
/// [`StoreError`] made from it.
pub type DriverError = std::sync::Arc<dyn std::error::Error + Send + Sync>;

/// `e` as the source of a [`StoreError`].
pub(crate) fn driver(e: impl std::error::Error + Send + Sync + 'static) -> DriverError {
    std::sync::Arc::new(e)
}

/// A storage failure, with what to do about it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The database could not be opened or set up.
    #[error("{0}")]
    Open(String),
    /// The database URL is not one Onus understands.
    #[error("{0}")]
    BadUrl(String),
    /// A query failed: the database refused it (the driver's error, when it came from one, is
    /// its source).
    #[error("database error: {0}")]
    Query(String, #[source] Option<DriverError>),
    /// The database cannot be reached or cannot take the write now (connection lost, timed out,
    /// locked by another process, shutting down): the same call may work later.
    #[error("database unavailable: {0}")]
    Unavailable(String, #[source] Option<DriverError>),
    /// The store's background writer is gone (the process is shutting down).
    #[error("the store is closed")]
    Closed,
    /// No job with that id.
    #[error("no job with id {0}")]
    NotFound(i64),
    /// The action does not apply to the job in its current state.
    #[error("{0}")]
    Conflict(String),
    /// The write broke a rule of the schema (a unique key, a check, a foreign key).
    #[error("the database refused the write: {0}")]
    Constraint(String, #[source] Option<DriverError>),
    /// A stored value could not be read as its type: the schema and the code disagree, or the
    /// row was changed by hand.
    #[error("cannot read column {column} of {table}: {problem}")]
    Decode {
        /// The table.
        table: &'static str,
        /// The column.
        column: String,
        /// What was wrong with it.
        problem: String,
    },
    /// A component's operation failed and its transaction was rolled back (its own error is
    /// returned to its caller).
    #[error("the operation failed and its transaction was rolled back")]
    Aborted,
}

impl StoreError {
    /// True when the write broke a unique index (another row holds the key), as the driver said.
    pub fn is_unique_violation(&self) -> bool {
        let StoreError::Constraint(_, Some(source)) = self else {
            return false;
        };
        if let Some(e) = source.downcast_ref::<tokio_postgres::Error>() {
            return e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION);
        }
        if let Some(rusqlite::Error::SqliteFailure(e, _)) = source.downcast_ref::<rusqlite::Error>()
        {
            return e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
                || e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY;
        }
        false
    }

    /// True when the same call may work later without any change (see [`StoreError::Unavailable`]).
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Unavailable(..))
    }

    /// Whose fault it is: a missing job, a conflicting state or a bad URL is the caller's; the
    /// rest is the service's (a broken constraint too: the job layer checks what callers send, so
    /// a write the schema refuses is a bug or a race on the service's side).
    pub fn fault(&self) -> Fault {
        match self {
            StoreError::NotFound(_) | StoreError::Conflict(_) | StoreError::BadUrl(_) => {
                Fault::Caller
            }
            StoreError::Constraint(..)
            | StoreError::Open(_)
            | StoreError::Query(..)
            | StoreError::Unavailable(..)
            | StoreError::Closed
            | StoreError::Decode { .. }
            | StoreError::Aborted => Fault::Service,
        }
    }
}

/// Whose fault an error is, so a front door maps every component's errors to a status in one
/// place: the caller's (bad input, not found, conflict: 4xx) or the service's (5xx).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Fault {
    /// The caller sent something wrong or asked for something absent.
    Caller,
    /// The service could not do what was asked.
    Service,
}

/// Result alias for stores.
pub type StoreResult<T> = Result<T, StoreError>;
