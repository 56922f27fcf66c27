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
    /// The worker's name (its host and process, like `billing-7f3c:4121`): a named worker is
    /// listed by `GET /processes` and the panel's processes page, with the kinds it claims and
    /// when it last claimed.
    #[serde(default)]
    pub worker: Option<String>,
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
    if let Some(name) = &body.worker {
        app.client.pull_worker_seen(name, &body.kinds).await?;
    }
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
    let e = failure(body.message, body.discard);
    Ok(Json(
        app.client.answer(id, &body.lease_token, Err(e)).await?,
    ))
}

/// A failure a worker reports: retryable under the kind's policy, or discarded now.
fn failure(message: String, discard: bool) -> JobError {
    if discard {
        JobError::discard(message)
    } else {
        JobError::retryable(message)
    }
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
    let e = snoozing(
        body.seconds,
        body.until.as_deref(),
        body.reason,
        body.pause_key,
    )?;
    Ok(Json(
        app.client.answer(id, &body.lease_token, Err(e)).await?,
    ))
}

/// A snooze a worker asks for (the job layer refuses `pause_key` for a job without a lease key).
fn snoozing(
    seconds: Option<f64>,
    until: Option<&str>,
    reason: Option<String>,
    pause_key: bool,
) -> Result<JobError, ApiError> {
    let reason = reason.unwrap_or_else(|| "snoozed by the worker".into());
    let e = match super::jobs::later(seconds, until)? {
        onus::SnoozeUntil::After(d) => JobError::snooze_for(d, reason),
        onus::SnoozeUntil::At(t) => JobError::snooze_until(t, reason),
    };
    Ok(if pause_key { e.pausing_key() } else { e })
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

/// A progress report: a fraction, with an optional message.
fn progress_of(
    progress: Option<f64>,
    message: Option<&str>,
) -> Result<Option<(f64, &str)>, ApiError> {
    match (progress, message) {
        (Some(f), m) => Ok(Some((f, m.unwrap_or("")))),
        (None, Some(_)) => Err(ApiError::invalid(
            "message: give it with progress (a fraction from 0 to 1)",
        )),
        (None, None) => Ok(None),
    }
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
    let progress = progress_of(body.progress, body.message.as_deref())?;
    let b = app
        .client
        .heartbeat_lease(id, &body.lease_token, progress)
        .await?;
    Ok(Json(BeatAnswer {
        lease_expires_at: b.lease_expires_at,
        cancel_requested: b.cancel_requested,
    }))
}

/// How an attempt ended, in an answer of many.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Done (`result` may be kept with it).
    Complete,
    /// Failed (`message`; `discard` when another attempt cannot help).
    Fail,
    /// Run again later without spending an attempt (`seconds` or `until`; `reason`,
    /// `pause_key`).
    Snooze,
}

/// One answer of many: the fields of `/complete`, `/fail` or `/snooze` as `outcome` says.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AnswerItem {
    /// The job's id.
    pub id: i64,
    /// The `lease_token` the claim answered.
    pub lease_token: String,
    /// How the attempt ended.
    pub outcome: Outcome,
    /// complete: kept with the job (at most 64 KiB of JSON).
    #[serde(default)]
    #[schema(value_type = Option<Value>)]
    pub result: Option<serde_json::Value>,
    /// fail: what went wrong (kept in the job's history).
    #[serde(default)]
    pub message: Option<String>,
    /// fail: another attempt cannot help; discard the job now.
    #[serde(default)]
    pub discard: bool,
    /// snooze: run again this many seconds from now.
    #[serde(default)]
    pub seconds: Option<f64>,
    /// snooze: or at this instant (RFC 3339).
    #[serde(default)]
    pub until: Option<String>,
    /// snooze: why (kept in the job's history).
    #[serde(default)]
    pub reason: Option<String>,
    /// snooze: pause the job's lease key until then too.
    #[serde(default)]
    pub pause_key: bool,
}

impl AnswerItem {
    /// The answer the job layer is asked for.
    fn to_answer(&self) -> Result<onus::runtime::Answer, ApiError> {
        let (result, kept) = self.to_result()?;
        Ok(onus::runtime::Answer {
            id: self.id,
            lease_token: self.lease_token.clone(),
            result,
            kept,
        })
    }

    /// The attempt's end and the result to keep; the error names the field that does not fit.
    fn to_result(&self) -> Result<(onus::JobResult, Option<serde_json::Value>), ApiError> {
        let misplaced = |field: &str, of: &str| {
            Err(ApiError::invalid(format!(
                "{field}: only an answer with outcome {of:?} takes it"
            )))
        };
        let snooze_field = self.seconds.is_some()
            || self.until.is_some()
            || self.reason.is_some()
            || self.pause_key;
        match self.outcome {
            Outcome::Complete => {
                if self.message.is_some() || self.discard {
                    return misplaced("message, discard", "fail");
                }
                if snooze_field {
                    return misplaced("seconds, until, reason, pause_key", "snooze");
                }
                Ok((Ok(()), self.result.clone()))
            }
            Outcome::Fail => {
                if self.result.is_some() {
                    return misplaced("result", "complete");
                }
                if snooze_field {
                    return misplaced("seconds, until, reason, pause_key", "snooze");
                }
                let Some(message) = self.message.clone() else {
                    return Err(ApiError::invalid(
                        "message: say what went wrong (kept in the job's history)",
                    ));
                };
                Ok((Err(failure(message, self.discard)), None))
            }
            Outcome::Snooze => {
                if self.result.is_some() {
                    return misplaced("result", "complete");
                }
                if self.message.is_some() || self.discard {
                    return misplaced("message, discard", "fail");
                }
                let e = snoozing(
                    self.seconds,
                    self.until.as_deref(),
                    self.reason.clone(),
                    self.pause_key,
                )?;
                Ok((Err(e), None))
            }
        }
    }
}

/// Many answers in one call.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AnswersBody {
    /// Up to 1,000 answers, each for a different job.
    pub answers: Vec<AnswerItem>,
}

/// A call of many items (`list`: the body's field), each taken on its own: `check` makes an
/// item what the job layer is asked, or says why it is refused (naming the item); `run` asks for
/// every checked one at once. One result per item, in order; the outer error is the call's.
async fn each_alone<I, A, R, Fut>(
    list: &str,
    items: &[I],
    check: impl Fn(&I) -> Result<A, ApiError>,
    run: impl FnOnce(Vec<A>) -> Fut,
) -> Result<Vec<Result<R, ApiError>>, ApiError>
where
    Fut: std::future::Future<Output = Result<Vec<Result<R, onus::Error>>, onus::Error>>,
{
    onus::runtime::at_most(list, items.len())?;
    let mut refused = Vec::with_capacity(items.len());
    let mut asked = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        match check(item) {
            Ok(a) => {
                refused.push(None);
                asked.push(a);
            }
            Err(mut e) => {
                e.message = format!("{list}[{i}].{}", e.message);
                refused.push(Some(e));
            }
        }
    }
    let mut done = run(asked).await?.into_iter();
    Ok(refused
        .into_iter()
        .map(|refused| match refused {
            Some(e) => Err(e),
            None => done
                .next()
                .expect("one result for each item asked")
                .map_err(ApiError::from),
        })
        .collect())
}

/// Why one item of many was refused: the code, status and message its own call would answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct ItemError {
    /// `conflict` (the lease is no longer current), `invalid`, `not_found`, `unavailable`...
    pub code: String,
    /// The HTTP status the item's own call would have answered.
    pub status: u16,
    /// What went wrong and what to do.
    pub message: String,
}

impl From<ApiError> for ItemError {
    fn from(e: ApiError) -> Self {
        ItemError {
            code: e.code.to_string(),
            status: e.status.as_u16(),
            message: e.message,
        }
    }
}

/// What became of one answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct AnsweredItem {
    /// The job's id.
    pub id: i64,
    /// The state the answer left the job in (absent when refused).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub state: Option<onus::JobState>,
    /// Why the answer was refused (absent when applied); the others apply regardless.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ItemError>,
}

/// What became of each answer, in the order sent.
#[derive(Debug, Serialize, ToSchema)]
pub struct AnswersAnswer {
    /// One per answer sent.
    pub answers: Vec<AnsweredItem>,
}

/// Answers many claimed jobs in one call: each answer is applied or refused on its own, and the
/// applied ones share one write.
#[utoipa::path(post, path = "/jobs/answers", tag = "workers", request_body = AnswersBody,
    responses((status = 200, body = AnswersAnswer), (status = 422, body = super::error::ErrorBody)))]
pub async fn answers(
    State(app): State<App>,
    Body(body): Body<AnswersBody>,
) -> Result<Json<AnswersAnswer>, ApiError> {
    let done = each_alone("answers", &body.answers, AnswerItem::to_answer, |asked| {
        app.client.answer_all(asked)
    })
    .await?;
    let answers = body
        .answers
        .iter()
        .zip(done)
        .map(|(a, r)| AnsweredItem {
            id: a.id,
            state: r.as_ref().ok().copied(),
            error: r.err().map(ItemError::from),
        })
        .collect();
    Ok(Json(AnswersAnswer { answers }))
}

/// One heartbeat of many: the fields of `/jobs/{id}/heartbeat`, with the job's id.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BeatItem {
    /// The job's id.
    pub id: i64,
    /// The `lease_token` the claim answered.
    pub lease_token: String,
    /// How much is done, from 0 to 1.
    #[serde(default)]
    pub progress: Option<f64>,
    /// What it is doing (with `progress`; at most 500 bytes).
    #[serde(default)]
    pub message: Option<String>,
}

/// Many heartbeats in one call.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BeatsBody {
    /// Up to 1,000 heartbeats, each for a different job.
    pub heartbeats: Vec<BeatItem>,
}

/// What became of one heartbeat.
#[derive(Debug, Serialize, ToSchema)]
pub struct BeatenItem {
    /// The job's id.
    pub id: i64,
    /// The lease's new end (absent when refused).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub lease_expires_at: Option<onus::Timestamp>,
    /// Someone asked to cancel the job: stop, and answer `fail` (absent when refused).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cancel_requested: Option<bool>,
    /// Why the heartbeat was refused (absent when renewed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ItemError>,
}

/// What became of each heartbeat, in the order sent.
#[derive(Debug, Serialize, ToSchema)]
pub struct BeatsAnswer {
    /// One per heartbeat sent.
    pub heartbeats: Vec<BeatenItem>,
}

/// Renews the leases of many jobs in one call: each is renewed or refused on its own.
#[utoipa::path(post, path = "/jobs/heartbeats", tag = "workers", request_body = BeatsBody,
    responses((status = 200, body = BeatsAnswer), (status = 422, body = super::error::ErrorBody)))]
pub async fn heartbeats(
    State(app): State<App>,
    Body(body): Body<BeatsBody>,
) -> Result<Json<BeatsAnswer>, ApiError> {
    let check = |b: &BeatItem| {
        let progress = progress_of(b.progress, b.message.as_deref())?;
        Ok(onus::runtime::BeatAsk {
            id: b.id,
            lease_token: b.lease_token.clone(),
            progress: progress.map(|(f, m)| (f, m.to_string())),
        })
    };
    let done = each_alone("heartbeats", &body.heartbeats, check, |asked| {
        app.client.heartbeat_all(asked)
    })
    .await?;
    let heartbeats = body
        .heartbeats
        .iter()
        .zip(done)
        .map(|(b, r)| BeatenItem {
            id: b.id,
            lease_expires_at: r.as_ref().ok().map(|beat| beat.lease_expires_at),
            cancel_requested: r.as_ref().ok().map(|beat| beat.cancel_requested),
            error: r.err().map(ItemError::from),
        })
        .collect();
    Ok(Json(BeatsAnswer { heartbeats }))
}
