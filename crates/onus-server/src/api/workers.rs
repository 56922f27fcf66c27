//! Workers in any language, pulling: claim due jobs of a queue under a lease, then answer each
//! once (complete, fail, snooze) with its lease token, renewing the lease with heartbeats on a
//! long job. The job layer decides what a failure means, as for handlers in the process.

use std::time::Duration;

use axum::extract::{Path, State};
use axum::Json;
use onus::{Job, JobError};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::jobs::job_id;
use super::{ApiError, App, Body, HandledBy};

/// What a worker claims.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimBody {
    /// The pull kinds it runs.
    pub kinds: Vec<String>,
    /// The most jobs to take (1 to 1,000; default 1).
    #[serde(default)]
    pub limit: Option<usize>,
    /// Seconds to wait for a job when none is due (a long poll; at most 30; default 0).
    #[serde(default)]
    pub wait: Option<f64>,
}

/// A claimed job.
#[derive(Debug, Serialize, ToSchema)]
pub struct ClaimedJob {
    /// The job's id.
    pub id: i64,
    /// Its kind.
    pub kind: String,
    /// Its args.
    #[schema(value_type = Object)]
    pub args: serde_json::Value,
    /// This attempt's number (from 1).
    pub attempt: u32,
    /// The attempts its policy allows.
    pub max_attempts: u32,
    /// Send it with the answer.
    pub lease_token: String,
    /// The lease lapses then unless renewed by a heartbeat; the job is then rescued as "worker
    /// lost" and the answer refused.
    #[schema(value_type = String, format = DateTime)]
    pub lease_expires_at: onus::Timestamp,
}

/// The answer of a claim.
#[derive(Debug, Serialize, ToSchema)]
pub struct ClaimAnswer {
    /// The jobs claimed (none when nothing was due within the wait).
    pub jobs: Vec<ClaimedJob>,
}

/// Claims due jobs of pull kinds in a queue, leased to the caller.
#[utoipa::path(post, path = "/queues/{name}/claim", tag = "workers", request_body = ClaimBody,
    params(("name" = String, Path, description = "the queue")),
    responses((status = 200, body = ClaimAnswer), (status = 422, body = super::error::ErrorBody)))]
pub async fn claim(
    State(app): State<App>,
    Path(queue): Path<String>,
    Body(body): Body<ClaimBody>,
) -> Result<Json<ClaimAnswer>, ApiError> {
    for k in &body.kinds {
        let info = app.known_kind("kinds", k)?;
        if info.handled_by != HandledBy::Pull {
            return Err(ApiError::invalid(format!(
                "kinds: {k} is run by the server itself; only pull kinds (configured without a url) are claimed"
            )));
        }
        // A kind's jobs wait in its configured queue unless inserted elsewhere by name: a
        // claim from another queue where none of them wait would come back empty for ever.
        if info.queue != queue && !waiting_in(&app, k, &queue).await? {
            return Err(ApiError::invalid(format!(
                "kinds: {k} is configured in queue {:?}, and none of its jobs wait in {queue:?}; claim from /queues/{}/claim (or set queue = {queue:?} under [kinds.\"{k}\"])",
                info.queue, info.queue
            )));
        }
    }
    let wait = match body.wait {
        None => Duration::ZERO,
        Some(w) if (0.0..=onus::runtime::MAX_CLAIM_WAIT.as_secs_f64()).contains(&w) => {
            Duration::from_secs_f64(w)
        }
        Some(w) => {
            return Err(ApiError::invalid(format!(
                "wait: {w} is not a wait; give 0 to 30 seconds"
            )))
        }
    };
    let claimed = app
        .client
        .claim_for_worker(&queue, &body.kinds, body.limit.unwrap_or(1), wait)
        .await?;
    Ok(Json(ClaimAnswer {
        jobs: claimed
            .into_iter()
            .map(|c| ClaimedJob {
                id: c.job.id,
                kind: c.job.kind,
                args: c.job.args,
                attempt: c.job.attempt,
                max_attempts: c.job.max_attempts,
                lease_token: c.lease_token,
                lease_expires_at: c.lease_expires_at,
            })
            .collect(),
    }))
}

/// Whether jobs of `kind` wait in `queue`.
async fn waiting_in(app: &App, kind: &str, queue: &str) -> Result<bool, ApiError> {
    let filter = onus::JobFilter {
        kinds: vec![kind.to_string()],
        queues: vec![queue.to_string()],
        states: vec![
            onus::JobState::Available,
            onus::JobState::Scheduled,
            onus::JobState::Retryable,
            onus::JobState::Snoozed,
        ],
        limit: Some(1),
        ..Default::default()
    };
    Ok(!app.client.list(&filter, 1, None).await?.is_empty())
}

/// A completion, with the small JSON result to keep with the job if any.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteBody {
    /// The `lease_token` the claim answered.
    pub lease_token: String,
    /// Kept with the job (`GET /jobs/{id}`): at most 64 KiB of JSON.
    #[serde(default)]
    #[schema(value_type = Option<Value>)]
    pub result: Option<serde_json::Value>,
}

/// Completes a claimed job.
#[utoipa::path(post, path = "/jobs/{id}/complete", tag = "workers", request_body = CompleteBody,
    params(("id" = i64, Path, description = "the job's id")),
    responses((status = 200, body = Job), (status = 404, body = super::error::ErrorBody), (status = 409, description = "the lease is no longer current", body = super::error::ErrorBody)))]
pub async fn complete(
    State(app): State<App>,
    Path(id): Path<String>,
    Body(body): Body<CompleteBody>,
) -> Result<Json<Job>, ApiError> {
    let id = job_id(&id)?;
    Ok(Json(
        app.client
            .answer_keeping(id, &body.lease_token, Ok(()), body.result)
            .await?,
    ))
}

/// A failed attempt.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FailBody {
    /// The `lease_token` the claim answered.
    pub lease_token: String,
    /// What went wrong (kept in the job's history).
    pub message: String,
    /// Another attempt cannot help: discard the job now.
    #[serde(default)]
    pub discard: bool,
}

/// Reports a failed attempt; the kind's policy decides whether and when to try again.
#[utoipa::path(post, path = "/jobs/{id}/fail", tag = "workers", request_body = FailBody,
    params(("id" = i64, Path, description = "the job's id")),
    responses((status = 200, body = Job), (status = 404, body = super::error::ErrorBody), (status = 409, body = super::error::ErrorBody)))]
pub async fn fail(
    State(app): State<App>,
    Path(id): Path<String>,
    Body(body): Body<FailBody>,
) -> Result<Json<Job>, ApiError> {
    let id = job_id(&id)?;
    let e = if body.discard {
        JobError::discard(body.message)
    } else {
        JobError::retryable(body.message)
    };
    Ok(Json(
        app.client.answer(id, &body.lease_token, Err(e)).await?,
    ))
}

/// A snooze: run again later without spending an attempt.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SnoozeBody {
    /// The `lease_token` the claim answered.
    pub lease_token: String,
    /// Run again this many seconds from now.
    #[serde(default)]
    pub seconds: Option<f64>,
    /// Or at this instant (RFC 3339).
    #[serde(default)]
    pub until: Option<String>,
    /// Why (kept in the job's history).
    #[serde(default)]
    pub reason: Option<String>,
    /// Pause the job's lease key until then too: the key's other waiting jobs are held, not
    /// handed out, without a snooze of their own (for an upstream that limits the whole key).
    #[serde(default)]
    pub pause_key: bool,
}

/// Snoozes a claimed job: it runs again later and spends no attempt.
#[utoipa::path(post, path = "/jobs/{id}/snooze", tag = "workers", request_body = SnoozeBody,
    params(("id" = i64, Path, description = "the job's id")),
    responses((status = 200, body = Job), (status = 404, body = super::error::ErrorBody), (status = 409, body = super::error::ErrorBody), (status = 422, body = super::error::ErrorBody)))]
pub async fn snooze(
    State(app): State<App>,
    Path(id): Path<String>,
    Body(body): Body<SnoozeBody>,
) -> Result<Json<Job>, ApiError> {
    let id = job_id(&id)?;
    let reason = body
        .reason
        .unwrap_or_else(|| "snoozed by the worker".into());
    let e = match super::jobs::later(body.seconds, body.until.as_deref())? {
        onus::SnoozeUntil::After(d) => JobError::snooze_for(d, reason),
        onus::SnoozeUntil::At(t) => JobError::snooze_until(t, reason),
    };
    let e = if body.pause_key {
        let job = app.client.get(id).await?;
        if job.lease_key.is_none() {
            return Err(ApiError::invalid(format!(
                "pause_key: job {id} holds no lease key to pause; snooze it without pause_key, or give its kind a lease_key"
            )));
        }
        e.pausing_key()
    } else {
        e
    };
    Ok(Json(
        app.client.answer(id, &body.lease_token, Err(e)).await?,
    ))
}

/// A renewed lease.
#[derive(Debug, Serialize, ToSchema)]
pub struct BeatAnswer {
    /// The lease's new end.
    #[schema(value_type = String, format = DateTime)]
    pub lease_expires_at: onus::Timestamp,
    /// Someone asked to cancel the job: stop, and answer `fail` (it ends cancelled).
    pub cancel_requested: bool,
}

/// A heartbeat, with the worker's progress if it reports one.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BeatBody {
    /// The `lease_token` the claim answered.
    pub lease_token: String,
    /// How much is done, from 0 to 1 (shown with the job until the next report).
    #[serde(default)]
    pub progress: Option<f64>,
    /// What it is doing (with `progress`; at most 500 bytes).
    #[serde(default)]
    pub message: Option<String>,
}

/// Renews the lease on a long job, records its progress, and says whether a cancel was asked for.
#[utoipa::path(post, path = "/jobs/{id}/heartbeat", tag = "workers", request_body = BeatBody,
    params(("id" = i64, Path, description = "the job's id")),
    responses((status = 200, body = BeatAnswer), (status = 404, body = super::error::ErrorBody), (status = 409, body = super::error::ErrorBody)))]
pub async fn heartbeat(
    State(app): State<App>,
    Path(id): Path<String>,
    Body(body): Body<BeatBody>,
) -> Result<Json<BeatAnswer>, ApiError> {
    let id = job_id(&id)?;
    let progress = match (body.progress, &body.message) {
        (Some(f), m) => Some((f, m.as_deref().unwrap_or(""))),
        (None, Some(_)) => {
            return Err(ApiError::invalid(
                "message: give it with progress (a fraction from 0 to 1)",
            ))
        }
        (None, None) => None,
    };
    let b = app
        .client
        .heartbeat_lease(id, &body.lease_token, progress)
        .await?;
    Ok(Json(BeatAnswer {
        lease_expires_at: b.lease_expires_at,
        cancel_requested: b.cancel_requested,
    }))
}
