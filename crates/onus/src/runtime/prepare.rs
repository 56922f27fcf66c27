//! Preparing a job for insertion, once: names checked, the kind's defaults applied (queue,
//! attempts, lease and rate keys built from the args), its args checked by the kind, and its
//! state and due time set.

use crate::clock;
use crate::job::{JobState, NewJob, RunAt};
use crate::store::InsertRow;

use super::{Error, Shared};

const MAX_NAME: usize = 200;
/// The most tags one job carries.
pub const MAX_TAGS: usize = 20;

/// Refuses an empty name, or one too long or with control characters, naming `what` it is.
pub(crate) fn check_name(what: &str, v: &str) -> Result<(), Error> {
    if v.trim().is_empty() {
        return Err(Error::Invalid(format!("{what} must not be empty")));
    }
    if v.len() > MAX_NAME || v.chars().any(|c| c.is_control()) {
        return Err(Error::Invalid(format!(
            "{what} {v:?} must be at most {MAX_NAME} bytes with no control characters"
        )));
    }
    Ok(())
}

/// `job` as the row to insert, refused with what to fix when it is not valid.
pub(crate) fn prepare_with(shared: &Shared, mut job: NewJob) -> Result<InsertRow, Error> {
    check_name("kind", &job.kind)?;
    let kind = shared.kinds.get(&job.kind);
    let queue = job
        .queue
        .take()
        .or_else(|| kind.map(|k| k.queue.clone()))
        .unwrap_or_else(|| crate::DEFAULT_QUEUE.to_string());
    check_name("queue", &queue)?;
    if let Some(k) = &job.unique_key {
        check_name("unique_key", k)?;
    }
    if job.lease_key.is_none() {
        // A kind may build its jobs' lease key from their args (configuration, say).
        if let Some(t) = kind.and_then(|k| k.lease_key.as_ref()) {
            job.lease_key = Some(t.render(&job.args).map_err(Error::Invalid)?);
        }
    }
    // The kind's rate key, built from these args (refused now if it cannot be), is kept with
    // the job so that a pause of the key finds it.
    let rate_key = match kind.and_then(|k| k.rate.as_ref()) {
        Some((_, t)) => Some(t.render(&job.args).map_err(Error::Invalid)?),
        None => None,
    };
    if let Some(k) = &job.lease_key {
        check_name("lease_key", k)?;
    }
    if job.tags.len() > MAX_TAGS {
        return Err(Error::Invalid(format!(
            "tags: {} tags given; a job carries at most {MAX_TAGS}",
            job.tags.len()
        )));
    }
    for t in &job.tags {
        check_name("tags: tag", t)?;
    }
    if let Some(path) = crate::job::find_nul(&job.args, "args") {
        return Err(Error::Invalid(format!(
            "{path} contains a NUL character (\\u0000), which the database cannot store; remove it or encode the value (base64, say)"
        )));
    }
    if let Some(check) = kind.and_then(|k| k.check.as_ref()) {
        check(&job.args).map_err(Error::Invalid)?;
    }
    let max_attempts = match job.max_attempts {
        Some(0) => return Err(Error::Invalid("max_attempts must be at least 1".into())),
        Some(n) => n,
        None => kind
            .map(|k| k.policy.max_attempts)
            .unwrap_or(crate::Policy::preset_default().max_attempts),
    };
    let now = shared.clock.now();
    let run_at = match job.run_at {
        RunAt::Now => now,
        RunAt::At(t) => clock::trunc(t),
        RunAt::After(d) => clock::trunc(clock::add(now, d)),
    };
    let state = if run_at > now {
        JobState::Scheduled
    } else {
        JobState::Available
    };
    Ok(InsertRow {
        kind: job.kind,
        queue,
        args: job.args,
        priority: job.priority,
        state,
        max_attempts,
        run_at,
        created_at: now,
        unique_key: job.unique_key,
        lease_key: job.lease_key,
        rate_key,
        tags: job.tags,
    })
}
