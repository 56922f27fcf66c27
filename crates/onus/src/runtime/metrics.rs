//! The job layer's metrics, through the `metrics` facade (an application installs a recorder,
//! such as the Prometheus exporter `onus serve` serves at `/metrics`; without one they cost
//! next to nothing).

use std::time::Duration;

use crate::outcome::Transition;

/// Attempts decided, by kind and outcome (`completed`, `retryable`, `snoozed`, `discarded`,
/// `cancelled`, `returned`).
pub const ATTEMPTS: &str = "onus_attempts_total";
/// Snoozes, by kind (also counted as attempts with outcome `snoozed`; they spend none).
pub const SNOOZES: &str = "onus_snoozes_total";
/// How long attempts ran, by kind.
pub const ATTEMPT_SECONDS: &str = "onus_attempt_duration_seconds";
/// From when a job was due to when a worker claimed it, by queue.
pub const PICKUP_SECONDS: &str = "onus_pickup_delay_seconds";

/// The outcome label of a transition.
pub fn outcome_of(t: &Transition) -> &'static str {
    match t {
        Transition::Complete => "completed",
        Transition::Retry { .. } => "retryable",
        Transition::Snooze { .. } => "snoozed",
        Transition::Discard { .. } => "discarded",
        Transition::Cancel { .. } => "cancelled",
        Transition::Return => "returned",
        Transition::Hold { .. } => "held",
        Transition::Defer { .. } => "deferred",
    }
}

/// Counts one decided attempt of `kind`, and how long it ran when known.
pub(crate) fn attempt(kind: &std::sync::Arc<str>, t: &Transition, took: Option<Duration>) {
    // The kind's label is shared (an `Arc`), not a string made for each counter.
    metrics::counter!(ATTEMPTS, "kind" => kind.clone(), "outcome" => outcome_of(t)).increment(1);
    if matches!(t, Transition::Snooze { .. }) {
        metrics::counter!(SNOOZES, "kind" => kind.clone()).increment(1);
    }
    if let Some(d) = took {
        metrics::histogram!(ATTEMPT_SECONDS, "kind" => kind.clone()).record(d.as_secs_f64());
    }
}

/// Records how long each job of one claim of `queue` waited past its due time (the label made
/// once for the claim, not once per job).
pub(crate) fn picked_up(queue: &str, delays: impl IntoIterator<Item = chrono::TimeDelta>) {
    let h = metrics::histogram!(PICKUP_SECONDS, "queue" => queue.to_string());
    for delay in delays {
        h.record(delay.num_microseconds().unwrap_or(0).max(0) as f64 / 1e6);
    }
}
