//! Jobs: insert (one or a batch), list with filters and a cursor, show, retry, cancel, delete,
//! and the bulk actions over every job matching a filter.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use onus::{Job, JobFilter, JobId, JobState, NewJob, Timestamp};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::{ApiError, App, Body};

/// The most jobs one `POST /jobs/batch` inserts.
pub const MAX_BATCH: usize = 10_000;
/// The most jobs one page of `GET /jobs` holds.
pub const MAX_PAGE: usize = 1000;
/// A page's size when `limit` is not given.
pub const DEFAULT_PAGE: usize = 50;

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

/// An instant given as text: RFC 3339, or a 422 naming the field.
pub fn instant(field: &str, v: &str) -> Result<Timestamp, ApiError> {
    chrono::DateTime::parse_from_rfc3339(v)
        .map(|t| t.with_timezone(&chrono::Utc))
        .map_err(|e| {
            ApiError::invalid(format!(
                "{field}: {v:?} is not an RFC 3339 instant ({e}); write it like \"2026-12-01T12:00:00Z\""
            ))
        })
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
    /// The job to insert; the error names the field (prefixed with `at`, as `jobs[3].`).
    pub fn to_job(&self, app: &App, at: &str) -> Result<NewJob, ApiError> {
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
        // A built-in kind's args are checked now, not discarded at the first attempt.
        if self.kind == onus_http::request::KIND {
            onus_http::request::HttpRequestArgs::check(&job.args)
                .map_err(|e| ApiError::invalid(format!("{at}{e}")))?;
        }
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
        // Validate here, so the error names the field of this job.
        app.client
            .prepare(job.clone())
            .map_err(|e| ApiError::invalid(format!("{at}{e}")))?;
        Ok(job)
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
    let job = body.to_job(&app, "")?;
    let got = app.client.insert(job).await?;
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
    let got = app.client.insert_many(jobs).await?;
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

/// The filter of `GET /jobs`; lists are comma-separated.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListParams {
    /// States, comma-separated (`discarded,cancelled`).
    pub state: Option<String>,
    /// Kinds, comma-separated.
    pub kind: Option<String>,
    /// Queues, comma-separated.
    pub queue: Option<String>,
    /// Tags, comma-separated: jobs carrying any of them.
    pub tag: Option<String>,
    /// Created at or after this instant (RFC 3339).
    pub created_after: Option<String>,
    /// Created before this instant (RFC 3339).
    pub created_before: Option<String>,
    /// Text in the args' JSON (ASCII letters without case, spaces ignored).
    pub q: Option<String>,
    /// Jobs per page, at most 1,000 (default 50).
    pub limit: Option<String>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

fn list_of(v: &Option<String>) -> Vec<String> {
    v.as_deref()
        .map(|s| {
            s.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

/// States named in `field`, or a 422 naming the states there are.
pub fn states(field: &str, names: &[String]) -> Result<Vec<JobState>, ApiError> {
    names
        .iter()
        .map(|s| {
            s.parse::<JobState>().map_err(|_| {
                ApiError::invalid(format!(
                    "{field}: {s:?} is not a state; states are available, scheduled, running, retryable, snoozed, completed, discarded, cancelled"
                ))
            })
        })
        .collect()
}

impl ListParams {
    /// The filter, the page size and the cursor; the error names the bad parameter.
    pub fn parse(&self) -> Result<(JobFilter, usize, Option<JobId>), ApiError> {
        // An empty parameter (a form's blank field) is an absent one.
        let given = |v: &Option<String>| v.clone().filter(|v| !v.trim().is_empty());
        let (limit_v, cursor_v) = (given(&self.limit), given(&self.cursor));
        let (after_v, before_v) = (given(&self.created_after), given(&self.created_before));
        let limit = super::page_size(&limit_v, DEFAULT_PAGE, MAX_PAGE)?;
        let cursor = match &cursor_v {
            None => None,
            Some(c) => Some(
                c.parse::<JobId>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| super::bad_cursor(c))?,
            ),
        };
        let filter = JobFilter {
            states: states("state", &list_of(&self.state))?,
            kinds: list_of(&self.kind),
            queues: list_of(&self.queue),
            tags: list_of(&self.tag),
            created_after: after_v
                .as_deref()
                .map(|v| instant("created_after", v))
                .transpose()?,
            created_before: before_v
                .as_deref()
                .map(|v| instant("created_before", v))
                .transpose()?,
            q: self.q.clone().filter(|q| !q.is_empty()),
            ..JobFilter::default()
        };
        Ok((filter, limit, cursor))
    }
}

/// A page of jobs.
#[derive(Debug, Serialize, ToSchema)]
pub struct JobPage {
    /// Newest first.
    pub jobs: Vec<Job>,
    /// Pass as `cursor` for the next page; null on the last one. A filtered page (other than by
    /// kind alone) reads at most 100,000 jobs, so it may hold fewer than `limit` while this is set.
    pub next_cursor: Option<String>,
}

/// A filtered page reads at most this many jobs (by id, newest first from the cursor), unless
/// it filters by kind alone (an index walk): a rare state, a small queue, a past time range or
/// text in args must not make a page read every job. A page may then hold fewer matches than
/// asked while `next_cursor` goes on below the jobs read.
pub const SEARCH_WINDOW: JobId = 100_000;

/// One page of jobs matching `filter`, newest first: what `GET /jobs` and the panel show.
pub async fn page(
    app: &App,
    filter: &JobFilter,
    limit: usize,
    cursor: Option<JobId>,
) -> Result<JobPage, ApiError> {
    let by_kind_alone = JobFilter {
        kinds: filter.kinds.clone(),
        ..JobFilter::default()
    };
    if *filter == by_kind_alone {
        // One more than asked tells whether another page follows.
        let rows = app.client.list(filter, limit + 1, cursor).await?;
        let (jobs, next_cursor) = super::paged(rows, limit, |j| j.id.to_string());
        return Ok(JobPage { jobs, next_cursor });
    }
    let top = match cursor {
        Some(c) => c,
        None => match app
            .client
            .list(&JobFilter::default(), 1, None)
            .await?
            .first()
        {
            Some(newest) => newest.id + 1,
            None => {
                return Ok(JobPage {
                    jobs: Vec::new(),
                    next_cursor: None,
                })
            }
        },
    };
    let lowest = filter.id_above.unwrap_or(0);
    let floor = (top - SEARCH_WINDOW).max(lowest);
    let window = JobFilter {
        id_above: Some(floor),
        ..filter.clone()
    };
    let rows = app.client.list(&window, limit + 1, Some(top)).await?;
    let (jobs, mut next_cursor) = super::paged(rows, limit, |j| j.id.to_string());
    if next_cursor.is_none() && floor > lowest {
        // Read to the window's floor: older jobs may match too.
        next_cursor = Some((floor + 1).to_string());
    }
    Ok(JobPage { jobs, next_cursor })
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

/// A job id from the path, or a 404.
pub fn job_id(raw: &str) -> Result<JobId, ApiError> {
    raw.parse::<JobId>().ok().filter(|n| *n > 0).ok_or_else(|| {
        ApiError::not_found(format!(
            "no job with id {raw:?}; ids are positive whole numbers"
        ))
    })
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

/// The filter of a bulk action, in list form; at least one condition.
#[derive(Debug, Default, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BulkBody {
    /// Only jobs in these states.
    #[serde(default)]
    pub states: Vec<String>,
    /// Only jobs of these kinds.
    #[serde(default)]
    pub kinds: Vec<String>,
    /// Only jobs in these queues.
    #[serde(default)]
    pub queues: Vec<String>,
    /// Only jobs carrying one of these tags.
    #[serde(default)]
    pub tags: Vec<String>,
    /// Only these jobs.
    #[serde(default)]
    pub ids: Vec<JobId>,
    /// Created at or after this instant (RFC 3339).
    #[serde(default)]
    pub created_after: Option<String>,
    /// Created before this instant (RFC 3339).
    #[serde(default)]
    pub created_before: Option<String>,
    /// Text in the args' JSON.
    #[serde(default)]
    pub q: Option<String>,
    /// Only count: change nothing.
    #[serde(default)]
    pub dry_run: bool,
}

impl BulkBody {
    /// The filter; a 422 when it has no condition at all or a bad one.
    pub fn filter(&self) -> Result<JobFilter, ApiError> {
        let f = JobFilter {
            ids: self.ids.clone(),
            states: states("states", &self.states)?,
            kinds: self.kinds.clone(),
            queues: self.queues.clone(),
            tags: self.tags.clone(),
            created_after: self
                .created_after
                .as_deref()
                .map(|v| instant("created_after", v))
                .transpose()?,
            created_before: self
                .created_before
                .as_deref()
                .map(|v| instant("created_before", v))
                .transpose()?,
            q: self.q.clone().filter(|q| !q.is_empty()),
            ..JobFilter::default()
        };
        if f == JobFilter::default() {
            return Err(ApiError::invalid(
                "give at least one condition (states, kinds, queues, tags, ids, created_after, created_before, q); to act on every job, name every state",
            ));
        }
        Ok(f)
    }
}

/// What a bulk action did (or, with `dry_run`, would do).
#[derive(Debug, Default, Serialize, ToSchema)]
pub struct BulkAnswer {
    /// Jobs matching the filter, in any state.
    pub matched: u64,
    /// Jobs retried (by `POST /jobs/retry`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retried: Option<u64>,
    /// Waiting jobs cancelled (by `POST /jobs/cancel`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cancelled: Option<u64>,
    /// Running jobs asked to stop (by `POST /jobs/cancel`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cancel_requested: Option<u64>,
    /// Jobs deleted (by `POST /jobs/delete`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deleted: Option<u64>,
    /// Matching jobs left as they were: in a state the action does not apply to, or (retry)
    /// another job holds their unique key.
    pub refused: u64,
    /// True when nothing was changed: the action figures are how many matches are in a state
    /// the action applies to.
    pub dry_run: bool,
}

/// Which bulk action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bulk {
    /// Retry.
    Retry,
    /// Cancel.
    Cancel,
    /// Delete.
    Delete,
}

impl Bulk {
    fn applies_to(self) -> &'static [JobState] {
        match self {
            Bulk::Retry => &onus::store::RETRYABLE_STATES,
            Bulk::Cancel => &onus::store::CANCELLABLE_STATES,
            Bulk::Delete => &onus::store::DELETABLE_STATES,
        }
    }
}

/// Runs a bulk action over every job matching `body`: what the API's and the panel's bulk
/// buttons do.
pub async fn bulk(app: &App, action: Bulk, body: &BulkBody) -> Result<BulkAnswer, ApiError> {
    let filter = body.filter()?;
    let matched = app.client.count(&filter).await?;
    let mut a = BulkAnswer {
        matched,
        dry_run: body.dry_run,
        ..BulkAnswer::default()
    };
    let acted = if body.dry_run {
        // How many matches are in a state the action applies to (running ones, for a cancel,
        // are asked to stop rather than cancelled at once).
        let count_in = |states: &[JobState]| {
            let states: Vec<JobState> = if filter.states.is_empty() {
                states.to_vec()
            } else {
                filter
                    .states
                    .iter()
                    .filter(|s| states.contains(s))
                    .copied()
                    .collect()
            };
            let f = JobFilter {
                states,
                ..filter.clone()
            };
            async move {
                if f.states.is_empty() {
                    Ok(0)
                } else {
                    app.client.count(&f).await
                }
            }
        };
        match action {
            Bulk::Retry => {
                let n = count_in(action.applies_to()).await?;
                a.retried = Some(n);
                n
            }
            Bulk::Cancel => {
                let waiting: Vec<JobState> = action
                    .applies_to()
                    .iter()
                    .filter(|s| **s != JobState::Running)
                    .copied()
                    .collect();
                let now = count_in(&waiting).await?;
                let running = count_in(&[JobState::Running]).await?;
                a.cancelled = Some(now);
                a.cancel_requested = Some(running);
                now + running
            }
            Bulk::Delete => {
                let n = count_in(action.applies_to()).await?;
                a.deleted = Some(n);
                n
            }
        }
    } else {
        let done = match action {
            Bulk::Retry => app
                .client
                .retry_where(&filter)
                .await
                .map(|o| (o.retried.len(), 0)),
            Bulk::Cancel => app
                .client
                .cancel_where(&filter)
                .await
                .map(|o| (o.cancelled.len(), o.requested.len())),
            Bulk::Delete => app
                .client
                .delete_where(&filter)
                .await
                .map(|ids| (ids.len(), 0)),
        };
        let (done, requested) = match done {
            Ok(d) => d,
            // A filter of one id is still a bulk action: a job absent or in another state is
            // counted as refused, not an error.
            Err(onus::Error::Store(
                onus::StoreError::NotFound(_) | onus::StoreError::Conflict(_),
            )) if filter.ids.len() == 1 => (0, 0),
            Err(e) => return Err(e.into()),
        };
        let (done, requested) = (done as u64, requested as u64);
        match action {
            Bulk::Retry => a.retried = Some(done),
            Bulk::Cancel => {
                a.cancelled = Some(done);
                a.cancel_requested = Some(requested);
            }
            Bulk::Delete => a.deleted = Some(done),
        }
        done + requested
    };
    a.refused = a.matched.saturating_sub(acted);
    Ok(a)
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
