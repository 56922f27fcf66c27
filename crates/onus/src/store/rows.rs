//! The rows the job store takes and returns: what an insert, a claim, a finished attempt and a
//! renewal carry, filters and bulk answers, lease and rate decisions, schedules, alerts, counts
//! and retention.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::job::{Job, JobId, JobState};
use crate::outcome::Transition;

/// A notice from another process sharing the database (PostgreSQL's LISTEN/NOTIFY).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// Jobs became due in this queue.
    Jobs(String),
    /// A cancel was asked for this running job.
    Cancel(JobId),
    /// The notice connection was lost and is back: notices may have been missed.
    Reconnected,
    /// Another process wrote to the database (SQLite, which names no queue): any queue may have
    /// due jobs.
    Written,
}

/// A job ready to write: every default resolved by the client.
#[derive(Debug, Clone, PartialEq)]
pub struct InsertRow {
    /// The job kind, which names its handler and policy.
    pub kind: String,
    /// The queue it waits in.
    pub queue: String,
    /// The handler's input, as JSON.
    pub args: serde_json::Value,
    /// Lower runs first among jobs due at once.
    pub priority: i16,
    /// `available` (due now) or `scheduled` (due at `run_at`).
    pub state: JobState,
    /// How many attempts its policy allows.
    pub max_attempts: u32,
    /// When it is due.
    pub run_at: Timestamp,
    /// When it was inserted.
    pub created_at: Timestamp,
    /// While an unfinished job of the same kind holds this key, inserting another returns it.
    pub unique_key: Option<String>,
    /// The lease key it holds while it runs (at most the kind's slots run per key).
    pub lease_key: Option<String>,
    /// The key of its kind's configured rate window, kept so that a pause of the key finds it.
    pub rate_key: Option<String>,
    /// Labels to find it by.
    pub tags: Vec<String>,
}

/// A claim an insert makes itself, for a worker of the inserting process that is idle: the rows
/// marked in `take` that are due now (`available`) and carry no unique key are written `running`
/// (attempt 1, leased to `owner` until `lease_until`) in the insert's own transaction, so the job
/// is durable and claimed with one commit. Rows of a queue paused by hand are inserted as usual.
#[derive(Debug, Clone)]
pub struct InsertClaim {
    /// The claiming process.
    pub owner: String,
    /// The claim time.
    pub now: Timestamp,
    /// When the lease expires unless renewed.
    pub lease_until: Timestamp,
    /// Which rows (by position) to claim.
    pub take: Vec<bool>,
}

/// Which of `rows[range]` the insert claims: those `claim` asks for that are due now, without a
/// unique key or a lease key (a job with a lease key takes its slot in a claim).
pub(crate) fn taken(
    rows: &[InsertRow],
    range: std::ops::Range<usize>,
    claim: Option<&InsertClaim>,
) -> Vec<bool> {
    range
        .map(|k| {
            rows[k].state == JobState::Available
                && rows[k].unique_key.is_none()
                && rows[k].lease_key.is_none()
                && claim.is_some_and(|c| c.take.get(k).copied().unwrap_or(false))
        })
        .collect()
}

/// The answer to one insert.
#[derive(Debug, Clone, PartialEq)]
pub struct Inserted {
    /// The new job, or the unfinished job that already held the unique key.
    pub job: Job,
    /// False when the unique key returned an existing job.
    pub inserted: bool,
}

/// What a worker asks for when it claims.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    /// The queue to claim from.
    pub queue: String,
    /// Only these kinds (the ones the process knows).
    pub kinds: Vec<String>,
    /// At most this many jobs.
    pub limit: usize,
    /// The claiming process.
    pub owner: String,
    /// The claim time.
    pub now: Timestamp,
    /// When the lease on the claimed jobs expires unless renewed.
    pub lease_until: Timestamp,
    /// Kinds among `kinds` with a total cap on running jobs across every process: a claim takes
    /// at most the cap less the kind's jobs running now.
    pub caps: Vec<(String, u32)>,
    /// Kinds among `kinds` whose lease keys have more than one slot (a key of any other kind has
    /// one). A claimed job with a lease key takes a slot of it in the claim's transaction; one
    /// whose key is busy or paused waits instead and is not returned.
    pub lease_slots: Vec<(String, u32)>,
}

impl ClaimRequest {
    /// How many slots a lease key of `kind`'s jobs has.
    pub fn slots_of(&self, kind: &str) -> u32 {
        self.lease_slots
            .iter()
            .find(|(k, _)| k == kind)
            .map_or(1, |(_, n)| (*n).max(1))
    }
}

/// One finished attempt to record.
#[derive(Debug, Clone)]
pub struct Finish {
    /// The job.
    pub id: JobId,
    /// The process that ran it (guards the write).
    pub owner: String,
    /// The attempt it ran (guards the write).
    pub attempt: u32,
    /// The state change.
    pub transition: Transition,
    /// When the attempt ended.
    pub now: Timestamp,
    /// The lease key the job held, to release.
    pub release_lease: Option<String>,
    /// The periodic schedule this job belongs to, to record its result.
    pub periodic: Option<String>,
    /// For a rescue: apply only if the lease (as renewed by heartbeats) expired before this time.
    pub expired_before: Option<Timestamp>,
    /// For a completion: the small JSON result to keep with the job (checked by
    /// [`crate::job::check_result`]).
    pub result: Option<serde_json::Value>,
}

impl Finish {
    /// The columns to write, given the job as stored and still leased to this attempt: whether a
    /// cancel was asked and when its lease expires (`lease_wait`: the snooze waits for a busy
    /// lease key). `None` for a rescue whose lease was renewed since the rescuer looked: the job
    /// is alive and nothing is written.
    pub(crate) fn write_for(
        &self,
        cancel_requested: bool,
        lease_expires_at: Option<Timestamp>,
        lease_wait: bool,
    ) -> Option<crate::outcome::RowWrite> {
        if let Some(before) = self.expired_before {
            if lease_expires_at.is_none_or(|e| e >= before) {
                return None;
            }
        }
        Some(crate::outcome::row_write(
            &self.transition,
            cancel_requested,
            lease_wait,
            self.now,
            self.attempt,
        ))
    }
}

/// A job this process holds (claimed, running or with its outcome not yet written), to renew.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldJob {
    /// The job.
    pub id: JobId,
    /// The attempt this process runs.
    pub attempt: u32,
}

/// What one lease renewal found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Renewal {
    /// Held jobs whose leases were extended.
    pub renewed: Vec<JobId>,
    /// Held jobs this process no longer leases (rescued, and maybe claimed elsewhere): their
    /// attempts must stop at once.
    pub lost: Vec<JobId>,
    /// Renewed jobs asked to cancel.
    pub cancel: Vec<JobId>,
}

impl Renewal {
    /// Sorts renewal rows `(id, attempt, cancel_requested)` against what was `held`.
    pub(crate) fn of(held: &[HeldJob], rows: &[(JobId, u32, bool)]) -> Renewal {
        let found: std::collections::HashMap<JobId, (u32, bool)> =
            rows.iter().map(|(id, a, c)| (*id, (*a, *c))).collect();
        let mut r = Renewal::default();
        for h in held {
            match found.get(&h.id) {
                Some((a, cancel)) if *a == h.attempt => {
                    r.renewed.push(h.id);
                    if *cancel {
                        r.cancel.push(h.id);
                    }
                }
                _ => r.lost.push(h.id),
            }
        }
        r
    }
}

/// One reading of the database's clock.
#[derive(Debug, Clone, Copy)]
pub struct DatabaseTime {
    /// What the database's clock said.
    pub at: Timestamp,
    /// The round trip of the query that read it (not counting a wait for a connection).
    pub round_trip: Duration,
    /// When its answer arrived.
    pub answered: std::time::Instant,
}

/// Which jobs an action or a listing applies to. Empty lists match everything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobFilter {
    /// Only these jobs.
    #[serde(default)]
    pub ids: Vec<JobId>,
    /// Only jobs with an id greater than this (the floor of a bounded search window).
    #[serde(default)]
    pub id_above: Option<JobId>,
    /// Only jobs in one of these states.
    #[serde(default)]
    pub states: Vec<JobState>,
    /// Only jobs of one of these kinds.
    #[serde(default)]
    pub kinds: Vec<String>,
    /// Only jobs in one of these queues.
    #[serde(default)]
    pub queues: Vec<String>,
    /// Only jobs holding one of these lease keys.
    #[serde(default)]
    pub lease_keys: Vec<String>,
    /// Only jobs carrying one of these tags.
    #[serde(default)]
    pub tags: Vec<String>,
    /// Finished at or after this time.
    #[serde(default)]
    pub finalized_after: Option<Timestamp>,
    /// Created at or after this time.
    #[serde(default)]
    pub created_after: Option<Timestamp>,
    /// Created before this time.
    #[serde(default)]
    pub created_before: Option<Timestamp>,
    /// Only jobs whose args, as JSON text, contain this text: ASCII letters compared without
    /// case and spaces ignored on both sides, so both backends match alike (a scan: combine it
    /// with other conditions on large tables).
    #[serde(default)]
    pub q: Option<String>,
    /// For bulk actions: at most this many matching jobs, newest first.
    #[serde(default)]
    pub limit: Option<usize>,
}

impl JobFilter {
    /// The text [`JobFilter::q`] is looked for as, in args' JSON text folded the same way.
    pub fn q_folded(&self) -> Option<String> {
        self.q
            .as_ref()
            .map(|q| q.to_ascii_lowercase().replace(' ', ""))
            .filter(|q| !q.is_empty())
    }

    /// Just this job.
    pub fn id(id: JobId) -> Self {
        JobFilter {
            ids: vec![id],
            ..Default::default()
        }
    }
}

/// What a retry did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RetryOutcome {
    /// Jobs now due.
    pub retried: Vec<JobId>,
    /// Matching jobs left as they were, with why.
    pub refused: Vec<Refused>,
}

/// A job a bulk action left alone, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Refused {
    /// The job.
    pub id: JobId,
    /// Why it was left alone.
    pub reason: String,
}

/// The states a manual retry applies to.
pub const RETRYABLE_STATES: [JobState; 5] = [
    JobState::Discarded,
    JobState::Cancelled,
    JobState::Retryable,
    JobState::Scheduled,
    JobState::Snoozed,
];

/// The states a manual cancel applies to.
pub const CANCELLABLE_STATES: [JobState; 5] = [
    JobState::Available,
    JobState::Scheduled,
    JobState::Retryable,
    JobState::Snoozed,
    JobState::Running,
];

/// The states a job can be deleted in: finished ones.
pub const DELETABLE_STATES: [JobState; 3] = [
    JobState::Completed,
    JobState::Discarded,
    JobState::Cancelled,
];

/// What a cancel did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CancelOutcome {
    /// Waiting jobs now cancelled.
    pub cancelled: Vec<JobId>,
    /// Running jobs whose process was asked to stop them.
    pub requested: Vec<JobId>,
}

/// The answer to a lease-key acquisition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseDecision {
    /// The job holds a slot until the given time.
    Acquired,
    /// Every slot is held (or being taken or given back elsewhere): the job was set asleep
    /// (`snoozed`, its attempt given back, nothing in its history) until this time at the latest;
    /// a release wakes it sooner.
    Busy(Timestamp),
    /// The key is paused: the job was held (attempt given back, nothing in its history) until
    /// the pause ends at this time.
    Paused(Timestamp),
}

/// How a pause meets one already in force on the same key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseMode {
    /// Replace it (an operator's pause: shorter or longer).
    Replace,
    /// Only ever lengthen it (a pause asked by a job's answer: a `Retry-After` of 5 s does not
    /// cut short an operator's hour).
    Extend,
}

/// A key paused until a time, and how many jobs it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PausedKey {
    /// The lease key.
    pub key: String,
    /// When the pause ends.
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub until: Timestamp,
    /// When it was paused (or last extended).
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub paused_at: Timestamp,
    /// Why: the answer that paused it, or the operator's reason.
    pub reason: String,
    /// Waiting jobs of the key it holds.
    pub held: u64,
}

/// One use of a rate window to take (see [`Store::take_rates`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateAsk {
    /// The stored key (`name:key`).
    pub key: String,
    /// Uses allowed per window.
    pub max: u32,
    /// The window's length.
    pub window: Duration,
}

impl RateAsk {
    /// The window `now` falls in, as (start, end) in Unix microseconds.
    pub(crate) fn window_at(&self, now: Timestamp) -> (i64, i64) {
        let w = (self.window.as_micros() as i64).max(1);
        let start = now.timestamp_micros().div_euclid(w) * w;
        (start, start + w)
    }
}

/// The answer to taking one use of a rate window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateDecision {
    /// Taken; this many uses are left in the window.
    Taken {
        /// Uses left.
        left: u32,
    },
    /// Spent until the next window opens at this time.
    Spent(Timestamp),
}

/// A periodic schedule's stored state.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PeriodicRow {
    /// Its name.
    pub name: String,
    /// The kind it enqueues.
    pub kind: String,
    /// Its schedule, as written (`cron: ...` or `every: ...`).
    pub schedule: String,
    /// The latest period enqueued.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime))]
    pub last_period_at: Option<Timestamp>,
    /// The job enqueued for it.
    pub last_job_id: Option<JobId>,
    /// When its latest job finished.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime))]
    pub last_run_at: Option<Timestamp>,
    /// How its latest job ended (`completed`, `discarded`, ...).
    pub last_state: Option<String>,
    /// When a job of it last failed.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime))]
    pub last_failure_at: Option<Timestamp>,
    /// That failure's message.
    pub last_error: Option<String>,
    /// When it is next due.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime))]
    pub next_run_at: Option<Timestamp>,
    /// When it was paused by hand (it enqueues nothing until resumed).
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime))]
    pub paused_at: Option<Timestamp>,
}

/// An alert raised by an exhausted job.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Alert {
    /// The alert's own id (to acknowledge it by).
    pub id: i64,
    /// The job that was exhausted.
    pub job_id: JobId,
    /// That job's kind.
    pub kind: String,
    /// The job's last error.
    pub message: String,
    /// When it was raised.
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub created_at: Timestamp,
    /// When someone acknowledged it.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime))]
    pub acked_at: Option<Timestamp>,
}

/// How many jobs stand in each (state, kind, queue).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CountRow {
    /// The state counted.
    pub state: JobState,
    /// The kind counted.
    pub kind: String,
    /// The queue counted.
    pub queue: String,
    /// How many jobs are in that state, kind and queue.
    pub count: u64,
}

/// How many jobs of a kind reached completed, retryable or discarded in one minute (the panel's
/// charts of throughput and failures).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HistoryRow {
    /// The minute's start.
    pub minute: Timestamp,
    /// The kind counted.
    pub kind: String,
    /// `completed`, `retryable` or `discarded`.
    pub state: JobState,
    /// How many jobs got there in that minute.
    pub count: u64,
}

/// What retention removes: finished jobs older than these ages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Completed jobs are kept this long (default 1 day).
    pub completed: Duration,
    /// Discarded and cancelled jobs are kept this long (default 7 days).
    pub discarded: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            completed: Duration::from_secs(86_400),
            discarded: Duration::from_secs(7 * 86_400),
        }
    }
}
