//! Jobs: insert (one or a batch), list with filters and a cursor, show, retry, cancel, delete,
//! and the bulk actions over every job matching a filter.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use onus::{Job, NewJob};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{ApiError, App, Body};
pub use crate::views::jobs::{
    bulk, instant, job_id, page, states, Bulk, BulkAnswer, BulkBody, JobPage, ListParams,
    DEFAULT_PAGE, MAX_PAGE, SEARCH_WINDOW,
};

/// The most jobs one `POST /jobs/batch` inserts.
pub const MAX_BATCH: usize = 10_000;

/// A job to insert.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewJobBody {
    /// The kind (one `GET /kinds` lists).
    pub kind: String,
    /// The handler's input, any JSON (`{}` when absent).
    #[serde(default)]
    #[schema(value_type = Object)]
    pub args: Option<serde_json::Value>,
    /// The queue; the kind's queue when absent.
    #[serde(default)]
    pub queue: Option<String>,
    /// Lower runs first among jobs due at once (0 when absent).
    #[serde(default)]
    pub priority: Option<i16>,
    /// When to run, RFC 3339 (`2026-12-01T12:00:00Z`); now when absent.
    #[serde(default)]
    pub run_at: Option<String>,
    /// While an unfinished job of the kind holds this key, inserting answers that job instead.
    #[serde(default)]
    pub unique_key: Option<String>,
    /// Labels to find the job by.
    #[serde(default)]
    pub tags: Option<Vec<String>>,
    /// The lease key: jobs sharing one run at most the kind's `slots` at once, across every
    /// process, and a key can be paused (`/keys/{key}/pause`). When absent, the kind's
    /// configured `lease_key` template builds it from the args, if it has one.
    #[serde(default)]
    pub lease_key: Option<String>,
}

/// A time ahead given as `seconds` from now or as an RFC 3339 instant `until`, exactly one of them.
pub fn later(seconds: Option<f64>, until: Option<&str>) -> Result<onus::SnoozeUntil, ApiError> {
    match (seconds, until) {
        (Some(s), None)
            if s.is_finite() && (0.0..=onus::policy::MAX_DURATION.as_secs_f64()).contains(&s) =>
        {
            Ok(onus::SnoozeUntil::After(
                std::time::Duration::from_secs_f64(s),
            ))
        }
        (Some(s), None) => Err(ApiError::invalid(format!(
            "seconds: {s} is not a wait; give 0 to {} seconds",
            onus::policy::MAX_DURATION.as_secs()
        ))),
        (None, Some(t)) => Ok(onus::SnoozeUntil::At(instant("until", t)?)),
        _ => Err(ApiError::invalid(
            "give either seconds or until (RFC 3339), not both and not neither",
        )),
    }
}

impl NewJobBody {
    /// The job to insert, prepared; the error names the field (prefixed with `at`, as `jobs[3].`).
    pub fn to_job(&self, app: &App, at: &str) -> Result<onus::store::InsertRow, ApiError> {
        app.insertable_kind(&format!("{at}kind"), &self.kind)?;
        let mut job = NewJob::new(
            self.kind.clone(),
            self.args.clone().unwrap_or_else(|| serde_json::json!({})),
        );
        job.queue = self.queue.clone();
        job.priority = self.priority.unwrap_or(0);
        if let Some(t) = &self.run_at {
            job = job.run_at(instant(&format!("{at}run_at"), t)?);
        }
        job.unique_key = self.unique_key.clone();
        job.tags = self.tags.clone().unwrap_or_default();
        job.lease_key = self.lease_key.clone();
        // A mail's after-send job is inserted later, in the mark's transaction: its kind must be
        // one that runs somewhere, like any job inserted here.
        if self.kind == onus_mail::SEND {
            if let Some(k) = job
                .args
                .pointer("/after_send/kind")
                .and_then(|k| k.as_str())
            {
                app.insertable_kind(&format!("{at}args.after_send.kind"), k)?;
            }
        }
        // Prepared (and so checked) here, once, so the error names the field of this job.
        app.client
            .prepare(job)
            .map_err(|e| ApiError::invalid(format!("{at}{e}")))
    }
}

/// Inserts a job.
#[utoipa::path(post, path = "/jobs", tag = "jobs", request_body = NewJobBody,
    responses(
        (status = 201, description = "inserted", body = Job),
        (status = 200, description = "an unfinished job of the kind holds the unique key: that job", body = Job),
        (status = 422, description = "invalid (unknown kind, bad instant, ...)", body = super::error::ErrorBody),
    ))]
pub async fn insert(
    State(app): State<App>,
    Body(body): Body<NewJobBody>,
) -> Result<(StatusCode, Json<Job>), ApiError> {
    let row = body.to_job(&app, "")?;
    let got = app
        .client
        .insert_prepared(vec![row])
        .await?
        .pop()
        .ok_or_else(|| ApiError::invalid("nothing was inserted"))?;
    let status = if got.inserted {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(got.job)))
}

/// A batch to insert.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchBody {
    /// Up to 10,000 jobs, inserted in one transaction: all or none.
    pub jobs: Vec<NewJobBody>,
}

/// One job of a batch's answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct BatchItem {
    /// The job.
    #[serde(flatten)]
    pub job: Job,
    /// True when an unfinished job already held its unique key (this is that job).
    pub duplicate: bool,
}

/// The answer to a batch.
#[derive(Debug, Serialize, ToSchema)]
pub struct BatchAnswer {
    /// The jobs, in the order given.
    pub jobs: Vec<BatchItem>,
}

/// Inserts up to 10,000 jobs in one transaction (body limit 32 MiB).
#[utoipa::path(post, path = "/jobs/batch", tag = "jobs", request_body = BatchBody,
    responses(
        (status = 201, description = "inserted, in the order given", body = BatchAnswer),
        (status = 422, description = "invalid; nothing was inserted", body = super::error::ErrorBody),
    ))]
pub async fn insert_batch(
    State(app): State<App>,
    Body(body): Body<BatchBody>,
) -> Result<(StatusCode, Json<BatchAnswer>), ApiError> {
    if body.jobs.is_empty() {
        return Err(ApiError::invalid("jobs: give at least one job"));
    }
    if body.jobs.len() > MAX_BATCH {
        return Err(ApiError::invalid(format!(
            "jobs: {} jobs given; one batch inserts at most {MAX_BATCH}",
            body.jobs.len()
        )));
    }
    let jobs = body
        .jobs
        .iter()
        .enumerate()
        .map(|(i, j)| j.to_job(&app, &format!("jobs[{i}].")))
        .collect::<Result<Vec<_>, _>>()?;
    let got = app.client.insert_prepared(jobs).await?;
    Ok((
        StatusCode::CREATED,
        Json(BatchAnswer {
            jobs: got
                .into_iter()
                .map(|i| BatchItem {
                    duplicate: !i.inserted,
                    job: i.job,
                })
                .collect(),
        }),
    ))
}

/// Lists jobs, newest first, a page at a time (stable while jobs are inserted).
#[utoipa::path(get, path = "/jobs", tag = "jobs", params(ListParams),
    responses(
        (status = 200, description = "one page", body = JobPage),
        (status = 422, description = "a bad parameter", body = super::error::ErrorBody),
    ))]
pub async fn list(
    State(app): State<App>,
    params: Result<Query<ListParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<JobPage>, ApiError> {
    let Query(params) = params.map_err(|e| ApiError::invalid(e.body_text()))?;
    let (filter, limit, cursor) = params.parse()?;
    Ok(Json(page(&app, &filter, limit, cursor).await?))
}

/// Shows a job with its whole history of attempts and snoozes (`errors`).
#[utoipa::path(get, path = "/jobs/{id}", tag = "jobs", params(("id" = i64, Path, description = "the job's id")),
    responses((status = 200, body = Job), (status = 404, body = super::error::ErrorBody)))]
pub async fn show(State(app): State<App>, Path(id): Path<String>) -> Result<Json<Job>, ApiError> {
    Ok(Json(app.client.get(job_id(&id)?).await?))
}

/// What the relay did with a `mail.send` job's message: when it accepted it, on which attempt,
/// with which Message-ID, and each recipient it took or refused (with its reply).
#[utoipa::path(get, path = "/jobs/{id}/mail", tag = "jobs", params(("id" = i64, Path, description = "the job's id")),
    responses((status = 200, body = onus_mail::Sent), (status = 404, body = super::error::ErrorBody)))]
pub async fn mail_sent(
    State(app): State<App>,
    Path(id): Path<String>,
) -> Result<Json<onus_mail::Sent>, ApiError> {
    let id = job_id(&id)?;
    let configured = app
        .kinds
        .get(onus_mail::SEND)
        .is_some_and(|k| k.handled_by == super::HandledBy::Process);
    if !configured {
        return Err(ApiError::not_found(
            "mail is not configured here; add a [mail] section to onus.toml",
        ));
    }
    let db = onus::store::Db::new(app.client.store().clone());
    match onus_mail::sent_record(&db, id).await {
        Ok(Some(sent)) => Ok(Json(sent)),
        Ok(None) => Err(ApiError::not_found(format!(
            "job {id} has sent no mail: not a mail.send job, or the relay has not accepted it yet"
        ))),
        Err(onus_mail::Error::Store(e)) => Err(e.into()),
        Err(e) => Err(ApiError::internal(e.to_string())),
    }
}

/// Retries a discarded, cancelled, retryable, scheduled or snoozed job now (one more attempt).
#[utoipa::path(post, path = "/jobs/{id}/retry", tag = "jobs", params(("id" = i64, Path, description = "the job's id")),
    responses((status = 200, body = Job), (status = 404, body = super::error::ErrorBody), (status = 409, body = super::error::ErrorBody)))]
pub async fn retry_one(
    State(app): State<App>,
    Path(id): Path<String>,
) -> Result<Json<Job>, ApiError> {
    Ok(Json(app.client.retry(job_id(&id)?).await?))
}

/// Cancels a job: a waiting one at once; a running one is asked to stop (`cancel_requested`).
#[utoipa::path(post, path = "/jobs/{id}/cancel", tag = "jobs", params(("id" = i64, Path, description = "the job's id")),
    responses((status = 200, body = Job), (status = 404, body = super::error::ErrorBody), (status = 409, body = super::error::ErrorBody)))]
pub async fn cancel_one(
    State(app): State<App>,
    Path(id): Path<String>,
) -> Result<Json<Job>, ApiError> {
    let id = job_id(&id)?;
    app.client.cancel(id).await?;
    Ok(Json(app.client.get(id).await?))
}

/// Deletes a finished job (completed, discarded, cancelled).
#[utoipa::path(delete, path = "/jobs/{id}", tag = "jobs", params(("id" = i64, Path, description = "the job's id")),
    responses((status = 204, description = "deleted"), (status = 404, body = super::error::ErrorBody), (status = 409, body = super::error::ErrorBody)))]
pub async fn delete(
    State(app): State<App>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    app.client.delete(job_id(&id)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Retries every job matching the filter (not just a page).
#[utoipa::path(post, path = "/jobs/retry", tag = "jobs", request_body = BulkBody,
    responses((status = 200, body = BulkAnswer), (status = 422, body = super::error::ErrorBody)))]
pub async fn retry_many(
    State(app): State<App>,
    Body(body): Body<BulkBody>,
) -> Result<Json<BulkAnswer>, ApiError> {
    Ok(Json(bulk(&app, Bulk::Retry, &body).await?))
}

/// Cancels every job matching the filter.
#[utoipa::path(post, path = "/jobs/cancel", tag = "jobs", request_body = BulkBody,
    responses((status = 200, body = BulkAnswer), (status = 422, body = super::error::ErrorBody)))]
pub async fn cancel_many(
    State(app): State<App>,
    Body(body): Body<BulkBody>,
) -> Result<Json<BulkAnswer>, ApiError> {
    Ok(Json(bulk(&app, Bulk::Cancel, &body).await?))
}

/// Deletes every finished job matching the filter.
#[utoipa::path(post, path = "/jobs/delete", tag = "jobs", request_body = BulkBody,
    responses((status = 200, body = BulkAnswer), (status = 422, body = super::error::ErrorBody)))]
pub async fn delete_many(
    State(app): State<App>,
    Body(body): Body<BulkBody>,
) -> Result<Json<BulkAnswer>, ApiError> {
    Ok(Json(bulk(&app, Bulk::Delete, &body).await?))
}
