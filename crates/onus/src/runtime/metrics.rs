//! The job layer's metrics, through the `metrics` facade (an application installs a recorder,
//! such as the Prometheus exporter `onus serve` serves at `/metrics`; without one they cost
//! next to nothing).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use metrics::{Counter, Histogram};

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
    OUTCOMES[outcome_index(t)]
}

/// Every outcome label, in the order of [`outcome_index`].
const OUTCOMES: [&str; 8] = [
    "completed",
    "retryable",
    "snoozed",
    "discarded",
    "cancelled",
    "returned",
    "held",
    "deferred",
];

fn outcome_index(t: &Transition) -> usize {
    match t {
        Transition::Complete => 0,
        Transition::Retry { .. } => 1,
        Transition::Snooze { .. } => 2,
        Transition::Discard { .. } => 3,
        Transition::Cancel { .. } => 4,
        Transition::Return => 5,
        Transition::Hold { .. } => 6,
        Transition::Defer { .. } => 7,
    }
}

/// A kind's metrics: its handles registered with the recorder once, at the kind's first counted
/// attempt (`onus serve` installs its recorder before any attempt runs), and kept, so that an
/// attempt builds no key (its labels, a vector) to count itself.
#[derive(Debug)]
pub(crate) struct KindMeters {
    kind: Arc<str>,
    handles: OnceLock<Handles>,
}

#[derive(Debug)]
struct Handles {
    attempts: [Counter; 8],
    snoozes: Counter,
    seconds: Histogram,
}

impl KindMeters {
    pub(crate) fn new(kind: &str) -> Self {
        KindMeters {
            kind: Arc::from(kind),
            handles: OnceLock::new(),
        }
    }

    fn handles(&self) -> &Handles {
        self.handles.get_or_init(|| {
            let kind = &self.kind;
            Handles {
                attempts: OUTCOMES.map(|outcome| {
                    metrics::counter!(ATTEMPTS, "kind" => kind.clone(), "outcome" => outcome)
                }),
                snoozes: metrics::counter!(SNOOZES, "kind" => kind.clone()),
                seconds: metrics::histogram!(ATTEMPT_SECONDS, "kind" => kind.clone()),
            }
        })
    }

    /// Counts one decided attempt, and how long it ran when known.
    pub(crate) fn attempt(&self, t: &Transition, took: Option<Duration>) {
        let h = self.handles();
        h.attempts[outcome_index(t)].increment(1);
        if matches!(t, Transition::Snooze { .. }) {
            h.snoozes.increment(1);
        }
        if let Some(d) = took {
            h.seconds.record(d.as_secs_f64());
        }
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
