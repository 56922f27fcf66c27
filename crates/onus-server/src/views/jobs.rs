//! Jobs as the API and the panel both show them: a page of jobs by filter, a job's id from a
//! path, a bulk action over a filter.

use onus::{Job, JobFilter, JobId, JobState, Timestamp};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::api::{ApiError, App};

/// The most jobs one page of `GET /jobs` holds.
pub const MAX_PAGE: usize = 1000;

/// A page's size when `limit` is not given.
pub const DEFAULT_PAGE: usize = 50;

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

/// The filter of `GET /jobs`; lists are comma-separated.
#[derive(Debug, Default, Clone, Deserialize, IntoParams)]
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
        let limit = crate::api::page_size(&limit_v, DEFAULT_PAGE, MAX_PAGE)?;
        let cursor = match &cursor_v {
            None => None,
            Some(c) => Some(
                c.parse::<JobId>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| crate::api::bad_cursor(c))?,
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
        let (jobs, next_cursor) = crate::api::paged(rows, limit, |j| j.id.to_string());
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
    let (jobs, mut next_cursor) = crate::api::paged(rows, limit, |j| j.id.to_string());
    if next_cursor.is_none() && floor > lowest {
        // Read to the window's floor: older jobs may match too.
        next_cursor = Some((floor + 1).to_string());
    }
    Ok(JobPage { jobs, next_cursor })
}

/// A job id from the path, or a 404.
pub fn job_id(raw: &str) -> Result<JobId, ApiError> {
    raw.parse::<JobId>().ok().filter(|n| *n > 0).ok_or_else(|| {
        ApiError::not_found(format!(
            "no job with id {raw:?}; ids are positive whole numbers"
        ))
    })
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
