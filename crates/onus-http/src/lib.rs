//! # onus-http: the one outbound HTTP client
//!
//! Every outbound call in Onus goes through [`HttpClient`]: one attempt, no retries (the client's
//! own retries are switched off), no redirects followed, no proxy taken from the environment,
//! connect and total timeouts, a `User-Agent` naming Onus, and an SSRF [`guard`] that refuses
//! every address that is not globally routable. A result is classified once, the same way for
//! every caller ([`classify`]); the job layer alone decides when to try again.
//!
//! - For calls a person is waiting on, [`HttpClient::call_once`] makes one attempt with a short
//!   timeout and maps any transient failure to [`CallError::Unavailable`] at once.
//! - Work that must really happen is an `http.request` job ([`request::kind`]), retried by the job
//!   layer under its policy.

pub mod classify;
mod client;
pub mod guard;
pub mod request;

pub use classify::{classify_status, Class};
pub use client::{
    CallError, HttpClient, HttpConfig, Request, Sent, SetupError, EXCERPT_BYTES, USER_AGENT,
};
pub use guard::{Blocked, Guard};

/// The names of the outbound counters (see [`HttpClient::record`]).
pub mod metrics {
    pub use crate::client::{ATTEMPTS, REQUESTS, RETRY_AFTER_SNOOZES};
}
pub use request::HttpRequestArgs;
