//! The `onus` server: configuration, the HTTP API (and its OpenAPI document), the command line,
//! and the wiring of the job layer and its components into one process. Retry timing lives in
//! the `onus` crate alone.

pub mod api;
pub mod cli;
pub mod config;
mod error;
mod front;
pub mod panel;
pub mod push;
pub mod secrets;
pub mod serve;
pub mod views;

pub use error::Error;
