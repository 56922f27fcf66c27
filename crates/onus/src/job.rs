//! Jobs: what is stored ([`Job`]), what callers insert ([`NewJob`]), and the states a job moves through.
//!
//! See `docs/state-machine.md` for the transitions and who causes each one.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::policy::Policy;

/// A job's id: unique, never reused, increasing with insertion order.
pub type JobId = i64;

/// Where a job stands. See `docs/state-machine.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum JobState {
    /// Due now, waiting for a worker.
    Available,
    /// Inserted to run later.
    Scheduled,
    /// Held by a worker that is running it.
    Running,
    /// Failed, waiting out its backoff.
    Retryable,
    /// Waiting for a named time; no attempt was spent.
    Snoozed,
    /// Finished successfully.
    Completed,
    /// Will not run again (see [`DiscardReason`]) unless retried by hand.
    Discarded,
    /// Cancelled by hand.
    Cancelled,
}

impl JobState {
    /// Every state, in lifecycle order.
    pub const ALL: [JobState; 8] = [
        JobState::Available,
        JobState::Scheduled,
        JobState::Running,
        JobState::Retryable,
        JobState::Snoozed,
        JobState::Completed,
        JobState::Discarded,
        JobState::Cancelled,
    ];

    /// The state's name as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Available => "available",
            JobState::Scheduled => "scheduled",
            JobState::Running => "running",
            JobState::Retryable => "retryable",
            JobState::Snoozed => "snoozed",
            JobState::Completed => "completed",
            JobState::Discarded => "discarded",
            JobState::Cancelled => "cancelled",
        }
    }

    /// Completed, discarded or cancelled: only a manual retry moves the job again.
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            JobState::Completed | JobState::Discarded | JobState::Cancelled
        )
    }

    /// Waiting to run (claimable once its `run_at` has passed).
    pub fn is_waiting(self) -> bool {
        matches!(
            self,
            JobState::Available | JobState::Scheduled | JobState::Retryable | JobState::Snoozed
        )
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for JobState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        JobState::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = JobState::ALL.iter().map(|s| s.as_str()).collect();
                format!(
                    "unknown job state {s:?}; the states are {}",
                    names.join(", ")
                )
            })
    }
}

/// Why a job was discarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum DiscardReason {
    /// The handler said trying again cannot help (or the args could not be decoded).
    Permanent,
    /// Every attempt the policy allows was spent.
    Exhausted,
    /// Dropped on purpose by a rate window whose policy is to drop.
    Dropped,
}

impl DiscardReason {
    /// The reason's name as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            DiscardReason::Permanent => "permanent",
            DiscardReason::Exhausted => "exhausted",
            DiscardReason::Dropped => "dropped",
        }
    }
}

impl FromStr for DiscardReason {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "permanent" => Ok(DiscardReason::Permanent),
            "exhausted" => Ok(DiscardReason::Exhausted),
            "dropped" => Ok(DiscardReason::Dropped),
            _ => Err(format!("unknown discard reason {s:?}")),
        }
    }
}

/// What an entry in a job's history records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum EntryClass {
    /// The handler returned a retryable error.
    Error,
    /// The handler panicked.
    Panic,
    /// The attempt ran past the kind's timeout.
    Timeout,
    /// The process running the job died; its lease expired.
    WorkerLost,
    /// The handler (or a busy lease key, or a spent rate window) snoozed the job.
    Snooze,
    /// The handler discarded the job as permanently failed.
    Discard,
    /// A rate window dropped the job on purpose.
    Dropped,
    /// The job was cancelled by hand.
    Cancelled,
    /// A retry waited for the kind's retry budget (no attempt spent).
    Deferred,
}

/// One failed attempt or snooze in a job's history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HistoryEntry {
    /// When it happened.
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub at: Timestamp,
    /// The attempt it belongs to.
    pub attempt: u32,
    /// What happened.
    pub class: EntryClass,
    /// The error or reason.
    pub message: String,
}

/// The longest message kept in a job's history (and in its alert and periodic schedule), in bytes;
/// a longer one is cut, saying how much was cut.
pub const MAX_MESSAGE: usize = 2048;

/// What separates a failure's reason from the quoted start of the answer that caused it
/// (`HTTP 500; response: {"error": "database down"}`): what is quoted is the other side's, so
/// logs stop before it.
pub const RESPONSE_QUOTE: &str = "; response: ";

/// `text` on one line (runs of whitespace as one space) and at most `max` characters: a longer
/// one is cut at the last space before the limit (mid-word only when a word is longer than a
/// third of the limit) and ends with `…`.
pub fn shorten(text: &str, max: usize) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() <= max {
        return line;
    }
    let cut: String = line.chars().take(max.saturating_sub(1)).collect();
    let kept = match cut.rfind(' ') {
        Some(i) if cut[..i].chars().count() >= max * 2 / 3 => &cut[..i],
        _ => cut.as_str(),
    };
    format!("{}…", kept.trim_end_matches([',', ';', ':', ' ']))
}

/// A message as stored: NUL characters (which PostgreSQL cannot store in text or JSON) removed,
/// and at most [`MAX_MESSAGE`] bytes.
pub fn clean_message(message: &str) -> String {
    let s: std::borrow::Cow<'_, str> = if message.contains('\0') {
        message.replace('\0', "").into()
    } else {
        message.into()
    };
    if s.len() <= MAX_MESSAGE {
        return s.into_owned();
    }
    let mut end = MAX_MESSAGE - 40;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} more bytes cut)", &s[..end], s.len() - end)
}

/// The path (from `root`) of the first string or key in `v` holding a NUL character, which
/// PostgreSQL cannot store in JSON: such values are refused at insert on every backend.
pub fn find_nul(v: &serde_json::Value, root: &str) -> Option<String> {
    match v {
        serde_json::Value::String(s) if s.contains('\0') => Some(root.to_string()),
        serde_json::Value::Array(a) => a
            .iter()
            .enumerate()
            .find_map(|(i, v)| find_nul(v, &format!("{root}[{i}]"))),
        serde_json::Value::Object(o) => o.iter().find_map(|(k, v)| {
            if k.contains('\0') {
                Some(format!("{root} (a key)"))
            } else {
                find_nul(v, &format!("{root}.{k}"))
            }
        }),
        _ => None,
    }
}

impl HistoryEntry {
    /// The entry with its message as stored (see [`clean_message`]).
    pub fn cleaned(&self) -> HistoryEntry {
        HistoryEntry {
            message: clean_message(&self.message),
            ..self.clone()
        }
    }
}

/// A job as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Job {
    /// Unique id.
    pub id: JobId,
    /// The kind, which names its handler and policy.
    pub kind: String,
    /// The named queue it runs in.
    pub queue: String,
    /// The arguments, as JSON.
    pub args: serde_json::Value,
    /// Lower runs first among jobs that are due.
    pub priority: i16,
    /// Where it stands.
    pub state: JobState,
    /// Attempts spent (a snooze spends none).
    pub attempt: u32,
    /// Attempts allowed.
    pub max_attempts: u32,
    /// When it runs next (or ran last).
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub run_at: Timestamp,
    /// When it was inserted.
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub created_at: Timestamp,
    /// When its latest attempt started.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime))]
    pub attempted_at: Option<Timestamp>,
    /// When it reached a finished state.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime))]
    pub finalized_at: Option<Timestamp>,
    /// Every failed attempt and snooze, oldest first.
    pub errors: Vec<HistoryEntry>,
    /// How many times it was snoozed.
    pub snoozes: u32,
    /// Why it was discarded.
    pub discard_reason: Option<DiscardReason>,
    /// While unfinished, no other job of the kind holds this key.
    pub unique_key: Option<String>,
    /// At most N jobs holding this key run at once (N is set on the kind).
    pub lease_key: Option<String>,
    /// The process running it.
    pub lease_owner: Option<String>,
    /// When the running process's hold on it expires.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime))]
    pub lease_expires_at: Option<Timestamp>,
    /// A cancel was asked for while it ran.
    pub cancel_requested: bool,
    /// Labels to find it by (`GET /jobs?tag=`); they change nothing about how it runs.
    #[serde(default)]
    pub tags: Vec<String>,
    /// How far its latest attempt got, as its handler or worker last reported it.
    #[serde(default)]
    pub progress: Option<Progress>,
    /// The small JSON result its completing attempt kept ([`MAX_RESULT_BYTES`] at most).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Value>))]
    pub result: Option<serde_json::Value>,
}

/// A running attempt's progress.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Progress {
    /// How much is done, from 0 to 1.
    pub fraction: f64,
    /// What it is doing (at most [`MAX_PROGRESS_MESSAGE`] bytes).
    #[serde(default)]
    pub message: String,
    /// When it was reported.
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub at: Timestamp,
}

/// A progress report or a result the job layer refuses to keep; the message says what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ReportError(pub String);

/// The longest progress message kept, in bytes.
pub const MAX_PROGRESS_MESSAGE: usize = 500;
/// The largest result a job keeps, as JSON text.
pub const MAX_RESULT_BYTES: usize = 64 * 1024;

impl Progress {
    /// A report of `fraction` (0 to 1) done, saying `message`, at `at`; the error says what to fix.
    pub fn new(fraction: f64, message: &str, at: Timestamp) -> Result<Progress, ReportError> {
        if !(fraction.is_finite() && (0.0..=1.0).contains(&fraction)) {
            return Err(ReportError(format!(
                "progress: {fraction} is not a fraction; give 0 to 1 (0.25 is a quarter done)"
            )));
        }
        if message.len() > MAX_PROGRESS_MESSAGE {
            return Err(ReportError(format!(
                "progress message: {} bytes; keep it to {MAX_PROGRESS_MESSAGE}",
                message.len()
            )));
        }
        Ok(Progress {
            fraction,
            message: clean_message(message),
            at,
        })
    }
}

/// Checks a result to keep: at most [`MAX_RESULT_BYTES`] of JSON and no NUL character (which
/// PostgreSQL cannot store); the error says what to fix.
pub fn check_result(v: &serde_json::Value) -> Result<(), ReportError> {
    let text = v.to_string();
    if text.len() > MAX_RESULT_BYTES {
        return Err(ReportError(format!(
            "result: {} bytes of JSON; a job keeps at most {MAX_RESULT_BYTES} (store larger output elsewhere and keep its address)",
            text.len()
        )));
    }
    if let Some(at) = find_nul(v, "result") {
        return Err(ReportError(format!(
            "{at} contains a NUL character, which cannot be stored"
        )));
    }
    Ok(())
}

impl Job {
    /// Decodes the args into `T`; the error names the field that failed.
    pub fn args_as<T: DeserializeOwned>(&self) -> Result<T, ArgsError> {
        decode_args(&self.args)
    }
}

/// Args that do not decode into the kind's type, naming the field.
#[derive(Debug, thiserror::Error)]
#[error("args do not decode{}: {source}", at_field(.path))]
pub struct ArgsError {
    /// The field that failed (`.` for the whole value).
    pub path: String,
    /// What was wrong with it.
    pub source: serde_json::Error,
}

fn at_field(path: &str) -> String {
    if path == "." {
        String::new()
    } else {
        format!(" at field `{path}`")
    }
}

pub(crate) fn decode_args<T: DeserializeOwned>(v: &serde_json::Value) -> Result<T, ArgsError> {
    serde_path_to_error::deserialize(v).map_err(|e| ArgsError {
        path: e.path().to_string(),
        source: e.into_inner(),
    })
}

/// When a new job should run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RunAt {
    /// As soon as a worker is free.
    #[default]
    Now,
    /// At this instant.
    At(Timestamp),
    /// This long after insertion (by the inserting client's clock).
    After(Duration),
}

/// A job to insert.
///
/// ```
/// use onus::NewJob;
/// let job = NewJob::new("search.index", serde_json::json!({"doc": 42}))
///     .queue("indexing")
///     .priority(1)
///     .unique_key("doc-42");
/// assert_eq!(job.kind, "search.index");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct NewJob {
    /// The kind.
    pub kind: String,
    /// Arguments as JSON.
    pub args: serde_json::Value,
    /// Queue; when unset, the kind's queue (or `default`).
    pub queue: Option<String>,
    /// Lower runs first; 0 when unset.
    pub priority: i16,
    /// When to run.
    pub run_at: RunAt,
    /// While an unfinished job of the same kind has this key, inserting returns that job instead.
    pub unique_key: Option<String>,
    /// A lease key: at most N jobs with this key run at once.
    pub lease_key: Option<String>,
    /// Attempts allowed; when unset, the kind's policy decides.
    pub max_attempts: Option<u32>,
    /// Labels to find it by; they change nothing about how it runs.
    pub tags: Vec<String>,
}

impl NewJob {
    /// A job of `kind` with JSON `args`, to run now.
    pub fn new(kind: impl Into<String>, args: serde_json::Value) -> Self {
        NewJob {
            kind: kind.into(),
            args,
            queue: None,
            priority: 0,
            run_at: RunAt::Now,
            unique_key: None,
            lease_key: None,
            max_attempts: None,
            tags: Vec::new(),
        }
    }

    /// A job from typed args; the kind comes from [`JobArgs::KIND`].
    pub fn of<A: JobArgs>(args: &A) -> Result<Self, serde_json::Error> {
        Ok(Self::new(A::KIND, serde_json::to_value(args)?))
    }

    /// Runs in this queue.
    pub fn queue(mut self, q: impl Into<String>) -> Self {
        self.queue = Some(q.into());
        self
    }

    /// Lower runs first.
    pub fn priority(mut self, p: i16) -> Self {
        self.priority = p;
        self
    }

    /// Runs at this instant.
    pub fn run_at(mut self, t: Timestamp) -> Self {
        self.run_at = RunAt::At(t);
        self
    }

    /// Runs this long after insertion.
    pub fn run_after(mut self, d: Duration) -> Self {
        self.run_at = RunAt::After(d);
        self
    }

    /// Unique while unfinished.
    pub fn unique_key(mut self, k: impl Into<String>) -> Self {
        self.unique_key = Some(k.into());
        self
    }

    /// Holds this lease key while running.
    pub fn lease_key(mut self, k: impl Into<String>) -> Self {
        self.lease_key = Some(k.into());
        self
    }

    /// Adds a label to find it by.
    pub fn tag(mut self, t: impl Into<String>) -> Self {
        self.tags.push(t.into());
        self
    }

    /// Overrides the policy's attempt count for this job.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = Some(n);
        self
    }
}

/// Typed job arguments: the kind's name and, as data, its policy and queue.
///
/// ```
/// use onus::{JobArgs, Policy};
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct SendReceipt { order: u64, to: String }
/// impl JobArgs for SendReceipt {
///     const KIND: &'static str = "receipt.send";
///     fn policy() -> Policy { Policy::preset_mail() }
/// }
/// ```
pub trait JobArgs: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The kind's name.
    const KIND: &'static str;

    /// The kind's retry policy (the `default` preset unless overridden).
    fn policy() -> Policy {
        Policy::preset_default()
    }

    /// The queue jobs of this kind go to when the insert names none.
    fn queue() -> &'static str {
        crate::DEFAULT_QUEUE
    }
}

#[cfg(test)]
mod shorten_tests {
    use super::shorten;

    #[test]
    fn shorten_cuts_at_a_word_and_keeps_short_text_whole() {
        assert_eq!(
            shorten("  upstream\n refused   the sync ", 80),
            "upstream refused the sync"
        );
        assert_eq!(
            shorten("connection refused while sending the request body", 30),
            "connection refused while…"
        );
        let long = shorten(&"x".repeat(100), 10);
        assert_eq!((long.chars().count(), long.ends_with('…')), (10, true));
        for n in 1..60 {
            assert!(
                shorten("an error, with words: and more words after them", n)
                    .chars()
                    .count()
                    <= n.max(1)
            );
        }
    }
}
