//! What the HTTP API and the tasks panel both show, computed once: a page of jobs, a bulk
//! action, a page of events, the alert list. Each API route and panel page calls these and
//! renders the answer its own way (JSON, HTML).

pub mod alerts;
pub mod events;
pub mod jobs;
pub mod why;

/// An instant as a person reads it: to the second, in UTC.
pub fn when(t: onus::Timestamp) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}
