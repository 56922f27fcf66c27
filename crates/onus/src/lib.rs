//! # Onus: a durable job layer where retry has exactly one owner
//!
//! Handlers only *classify* a failure: `Ok(())`, any error (retryable, the default with `?`),
//! [`JobError::Snooze`] (run again at a named time, no attempt spent) or [`JobError::Discard`]
//! (permanent). The job layer alone decides when to try again, from a [`Policy`] declared as data
//! on the job kind, with jitter. Nothing else in a service built on Onus may retry.
//!
//! - [`job`]: jobs, states, what callers insert.
//! - [`outcome`]: the handler's answer and the state change it causes.
//! - [`policy`]: policies, backoff, presets, jitter, timelines.
//! - [`clock`]: the one source of time (a manual clock in tests).
//! - [`limits`]: lease keys and rate windows.
//! - [`sql`]: the SQL engine layer: statements, typed rows, transactions, migrations, errors.
//! - [`store`]: the job store on it (the SQLite store and the PostgreSQL store), and [`store::Db`],
//!   the handle components reach the database through.
//! - [`runtime`]: client, workers, rescuer, periodic jobs, leader election, retention.

pub mod budget;
pub mod clock;
pub mod job;
pub mod limits;
pub mod outcome;
pub mod policy;
pub mod runtime;
pub mod sql;
pub mod store;

pub use budget::RetryBudget;
pub use clock::{Clock, ManualClock, OffsetClock, SystemClock, Timestamp};
pub use job::{
    DiscardReason, EntryClass, HistoryEntry, Job, JobArgs, JobId, JobState, NewJob, Progress,
    ReportError, RunAt,
};
pub use limits::{KeyTemplate, RateWindow, TemplateError, WhenSpent};
pub use outcome::{JobError, JobResult, SnoozeUntil};
pub use policy::{Backoff, Policy, PolicyOverride, Timeline};
pub use runtime::{
    BuildError, Builder, CatchUp, Client, Component, Error, Handler, JobContext, Kind, Onus,
    Options, Periodic, ProcessInfo, ProcessRole, Processes, Running, Schedule, KEPT_FOR,
    LIVE_WITHIN, MAX_WORKER_NAME,
};
pub use store::{
    open, open_with, redact_url, Fault, JobFilter, PausedKey, Refused, RetryOutcome, Store,
    StoreError, StoreResult,
};

/// The PostgreSQL store, and the client crates it is built on (for the caller's own transactions).
pub mod postgres {
    #[doc(hidden)]
    pub use crate::store::postgres::CLAIM_PLAN;
    pub use crate::store::postgres::{deadpool_postgres, tokio_postgres, PostgresStore};
}

/// The SQLite store, and the `rusqlite` it is built on (for the caller's own transactions).
pub mod sqlite {
    pub use crate::store::sqlite::{rusqlite, Durability, SqliteOptions, SqliteStore};
}

/// The queue a job runs in when neither its insert nor its kind names one.
pub const DEFAULT_QUEUE: &str = "default";

/// The README's examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
