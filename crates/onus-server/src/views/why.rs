//! Why a job waits, and what would let it run: a paused queue, a paused lease key, a busy key,
//! a snooze, a retry's backoff or its budget, an endpoint's cooldown, no process for its queue.
//! Read from what is already written (the job, the pauses, the processes' presence, the
//! endpoint), so it costs a few reads and changes nothing.

use onus::{EntryClass, Job, JobState, Timestamp};

use crate::api::{App, HandledBy};

/// What a person can do about the wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Remedy {
    /// Resume the paused queue.
    ResumeQueue(String),
    /// Resume the paused lease key.
    ResumeKey(String),
    /// Open the webhook endpoint (to enable it, or see why it fails).
    Endpoint(String),
}

/// Why a job waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Why {
    /// What holds it, for a person.
    pub reason: String,
    /// Until when, when that is known.
    pub until: Option<Timestamp>,
    /// What would let it run.
    pub remedy: Option<Remedy>,
}

fn why(reason: impl Into<String>, until: Option<Timestamp>, remedy: Option<Remedy>) -> Why {
    Why {
        reason: reason.into(),
        until,
        remedy,
    }
}

/// The webhook delivery job's endpoint and event, from its args.
pub fn delivery_of(j: &Job) -> Option<(String, String)> {
    if j.kind != onus_webhooks::DELIVER {
        return None;
    }
    let ep = j.args.get("endpoint_id")?.as_str()?.to_string();
    let ev = j.args.get("event_id")?.as_str()?.to_string();
    Some((ep, ev))
}

/// Why `j` waits now, or `None` when it does not (it runs or is finished). The first cause that
/// holds wins, in the order a claim meets them: the queue, the key's pause, the endpoint, then
/// the job's own schedule.
pub async fn why_waits(app: &App, j: &Job, now: Timestamp) -> Result<Option<Why>, onus::Error> {
    use JobState as S;
    if !matches!(
        j.state,
        S::Available | S::Scheduled | S::Retryable | S::Snoozed
    ) {
        return Ok(None);
    }
    if let Some(q) = app
        .client
        .paused_queues()
        .await?
        .into_iter()
        .find(|q| q.name == j.queue)
    {
        return Ok(Some(why(
            format!(
                "Queue {} is paused (since {}): no process claims from it until it is resumed.",
                q.name,
                super::when(q.paused_at)
            ),
            None,
            Some(Remedy::ResumeQueue(q.name)),
        )));
    }
    if let Some(key) = &j.lease_key {
        if let Some(p) = app
            .client
            .paused_keys()
            .await?
            .into_iter()
            .find(|p| &p.key == key)
        {
            let reason = if p.reason.is_empty() {
                String::new()
            } else {
                format!(" ({})", p.reason)
            };
            return Ok(Some(why(
                format!("Held by the pause of its lease key {key}{reason}."),
                Some(p.until),
                Some(Remedy::ResumeKey(key.clone())),
            )));
        }
    }
    if let Some((ep, _)) = delivery_of(j) {
        if let Ok(e) = app.webhooks.endpoint(&ep).await {
            if !e.enabled {
                let why_off = e.disabled_reason.clone().unwrap_or_default();
                return Ok(Some(why(
                    format!("Endpoint {ep} is disabled ({why_off}): its deliveries wait until it is enabled."),
                    None,
                    Some(Remedy::Endpoint(ep)),
                )));
            }
            if let Some(since) = e.failing_since {
                if j.run_at > now && j.errors.is_empty() {
                    return Ok(Some(why(
                        format!(
                            "Endpoint {ep} is failing (since {}): a new delivery to it waits a cooldown first.",
                            super::when(since)
                        ),
                        Some(j.run_at),
                        Some(Remedy::Endpoint(ep)),
                    )));
                }
            }
        }
    }
    let last = j.errors.last();
    let own = match j.state {
        S::Retryable => {
            let error = last.map(|e| e.message.as_str()).unwrap_or_default();
            why(
                format!(
                    "Attempt {} of {} failed: {}. Attempt {} runs then (the kind's backoff).",
                    j.attempt,
                    j.max_attempts,
                    onus::job::shorten(error, 200),
                    j.attempt + 1
                ),
                Some(j.run_at),
                None,
            )
        }
        S::Snoozed => match last {
            // Asleep for a busy key: its attempt given back and nothing written to its history.
            Some(e) if e.class == EntryClass::Snooze && e.attempt > j.attempt => why(
                format!("Snoozed: {}.", onus::job::shorten(&e.message, 200)),
                Some(j.run_at),
                None,
            ),
            _ => match &j.lease_key {
                Some(k) => why(
                    format!("Waiting for a free slot of its lease key {k}: every slot is held by a running job; it wakes when one ends."),
                    None,
                    None,
                ),
                None => why("Snoozed.", Some(j.run_at), None),
            },
        },
        S::Scheduled if last.is_some_and(|e| e.class == EntryClass::Deferred) => why(
            format!(
                "The retry waits for the kind's retry budget: {}.",
                onus::job::shorten(&last.map(|e| e.message.clone()).unwrap_or_default(), 200)
            ),
            Some(j.run_at),
            None,
        ),
        S::Scheduled if j.run_at > now => why("Scheduled.", Some(j.run_at), None),
        _ => return no_taker(app, j).await,
    };
    Ok(Some(own))
}

/// A due job: who would take it, and whether anyone is there to.
async fn no_taker(app: &App, j: &Job) -> Result<Option<Why>, onus::Error> {
    let Some(kind) = app.kinds.get(&j.kind) else {
        return Ok(Some(why(
            format!(
                "Due, but no process here knows kind {}: it waits for one that does.",
                j.kind
            ),
            None,
            None,
        )));
    };
    if kind.handled_by == HandledBy::Pull {
        return Ok(Some(why(
            format!(
                "Due: waiting for a pull worker to claim it (POST /api/v1/queues/{}/claim with kind {}).",
                j.queue, j.kind
            ),
            None,
            None,
        )));
    }
    if !app.client.runs_somewhere(&j.kind, &j.queue).await? {
        return Ok(Some(why(
            format!(
                "Due, but no live process runs kind {} from queue {}: start onus serve with that queue.",
                j.kind, j.queue
            ),
            None,
            None,
        )));
    }
    Ok(Some(why(
        format!("Due: waiting for a free slot in queue {}.", j.queue),
        None,
        None,
    )))
}
