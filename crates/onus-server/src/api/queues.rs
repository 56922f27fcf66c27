//! Kinds, queues (figures, pause, resume) and periodic jobs.

use axum::extract::{Path, State};
use axum::Json;
use onus::runtime::QueueStats;
use onus::store::PeriodicRow;
use serde::Serialize;
use utoipa::ToSchema;

use super::{ApiError, App, HandledBy, KindInfo};

/// One kind as `GET /kinds` shows it.
#[derive(Debug, Serialize, ToSchema)]
pub struct KindView {
    /// Its name.
    pub name: String,
    /// How its jobs are handled: in this server, pushed to a URL, or pulled by workers.
    pub handled_by: HandledBy,
    /// The queue its jobs go to unless an insert names another.
    pub queue: String,
    /// Its policy, configuration overrides applied.
    #[schema(value_type = Object)]
    pub policy: serde_json::Value,
    /// The attempts the policy implies: the nominal wait before each and its offset from the first.
    #[schema(value_type = Object)]
    pub timeline: serde_json::Value,
    /// The nominal time from the first attempt to the last, in seconds.
    pub span_seconds: f64,
    /// A push kind's URL.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// A push kind's signing secret (`whsec_...`), to verify its requests with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

/// The answer of `GET /kinds`.
#[derive(Debug, Serialize, ToSchema)]
pub struct KindList {
    /// Every kind, by name.
    pub kinds: Vec<KindView>,
}

/// One kind's view (a push kind's secret made now if it has none yet).
pub async fn kind_view(k: &KindInfo) -> Result<KindView, ApiError> {
    let timeline = k.policy.timeline();
    let secret = match &k.secret {
        Some(s) => Some(s.get().await?),
        None => None,
    };
    Ok(KindView {
        name: k.name.clone(),
        handled_by: k.handled_by,
        queue: k.queue.clone(),
        policy: serde_json::to_value(&k.policy).unwrap_or_default(),
        span_seconds: timeline.span().as_secs_f64(),
        timeline: serde_json::to_value(&timeline).unwrap_or_default(),
        url: k.url.clone(),
        secret,
    })
}

/// Every kind the server knows: how it is handled, its queue, policy and timeline.
#[utoipa::path(get, path = "/kinds", tag = "kinds", responses((status = 200, body = KindList), (status = 503, body = super::error::ErrorBody)))]
pub async fn list_kinds(State(app): State<App>) -> Result<Json<KindList>, ApiError> {
    let mut kinds = Vec::with_capacity(app.kinds.len());
    for k in app.kinds.values() {
        kinds.push(kind_view(k).await?);
    }
    Ok(Json(KindList { kinds }))
}

/// The answer of `GET /queues`.
#[derive(Debug, Serialize, ToSchema)]
pub struct QueueList {
    /// Every queue with jobs, configured, or paused, by name.
    pub queues: Vec<QueueStats>,
}

/// Every queue: jobs per state, the oldest waiting job's age, whether it is paused.
pub async fn queue_list(app: &App) -> Result<QueueList, ApiError> {
    let mut also = app.queues.clone();
    also.extend(app.kinds.values().map(|k| k.queue.clone()));
    also.sort();
    also.dedup();
    Ok(QueueList {
        queues: app.client.queue_stats(&also).await?,
    })
}

/// Every queue: jobs per state, the oldest waiting job's age, whether it is paused.
#[utoipa::path(get, path = "/queues", tag = "queues", responses((status = 200, body = QueueList)))]
pub async fn list_queues(State(app): State<App>) -> Result<Json<QueueList>, ApiError> {
    Ok(Json(queue_list(&app).await?))
}

async fn one_queue(app: &App, name: &str) -> Result<QueueStats, ApiError> {
    app.client
        .queue_stats(&[name.to_string()])
        .await?
        .into_iter()
        .find(|q| q.name == name)
        .ok_or_else(|| ApiError::internal(format!("queue {name} vanished from its own figures")))
}

/// Pauses a queue in every process: nothing more is claimed from it until resumed; running
/// jobs finish.
#[utoipa::path(post, path = "/queues/{name}/pause", tag = "queues",
    params(("name" = String, Path, description = "the queue")),
    responses((status = 200, body = QueueStats), (status = 422, body = super::error::ErrorBody)))]
pub async fn pause(
    State(app): State<App>,
    Path(name): Path<String>,
) -> Result<Json<QueueStats>, ApiError> {
    app.client.pause_queue(&name).await?;
    Ok(Json(one_queue(&app, &name).await?))
}

/// Resumes a paused queue (resuming one that is not paused changes nothing).
#[utoipa::path(post, path = "/queues/{name}/resume", tag = "queues",
    params(("name" = String, Path, description = "the queue")),
    responses((status = 200, body = QueueStats), (status = 422, body = super::error::ErrorBody)))]
pub async fn resume(
    State(app): State<App>,
    Path(name): Path<String>,
) -> Result<Json<QueueStats>, ApiError> {
    app.client.resume_queue(&name).await?;
    Ok(Json(one_queue(&app, &name).await?))
}

/// The answer of `GET /periodic`.
#[derive(Debug, Serialize, ToSchema)]
pub struct PeriodicList {
    /// Every periodic job the database knows.
    pub periodic: Vec<PeriodicRow>,
}

/// Periodic jobs: schedule, last run, last failure, next run.
#[utoipa::path(get, path = "/periodic", tag = "queues", responses((status = 200, body = PeriodicList)))]
pub async fn list_periodic(State(app): State<App>) -> Result<Json<PeriodicList>, ApiError> {
    Ok(Json(PeriodicList {
        periodic: app.client.store().list_periodic().await?,
    }))
}

/// The schedule `name` as listed, after an action on it.
async fn one_periodic(app: &App, name: &str) -> Result<PeriodicRow, ApiError> {
    app.client
        .store()
        .list_periodic()
        .await?
        .into_iter()
        .find(|r| r.name == name)
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "periodic schedule {name:?} is defined but not registered yet; try again in a moment"
            ))
        })
}

/// Pauses a periodic schedule in every process: it enqueues nothing until resumed (jobs already
/// enqueued run).
#[utoipa::path(post, path = "/periodic/{name}/pause", tag = "queues",
    params(("name" = String, Path, description = "the schedule")),
    responses((status = 200, body = PeriodicRow), (status = 404, body = super::error::ErrorBody)))]
pub async fn pause_periodic(
    State(app): State<App>,
    Path(name): Path<String>,
) -> Result<Json<PeriodicRow>, ApiError> {
    app.client.pause_periodic(&name).await?;
    Ok(Json(one_periodic(&app, &name).await?))
}

/// Resumes a paused schedule: it goes on from its next period (those missed while paused are not
/// run).
#[utoipa::path(post, path = "/periodic/{name}/resume", tag = "queues",
    params(("name" = String, Path, description = "the schedule")),
    responses((status = 200, body = PeriodicRow), (status = 404, body = super::error::ErrorBody)))]
pub async fn resume_periodic(
    State(app): State<App>,
    Path(name): Path<String>,
) -> Result<Json<PeriodicRow>, ApiError> {
    app.client.resume_periodic(&name).await?;
    Ok(Json(one_periodic(&app, &name).await?))
}

/// Enqueues a schedule's job now, once (paused or not); its outcome shows on the schedule.
#[utoipa::path(post, path = "/periodic/{name}/run", tag = "queues",
    params(("name" = String, Path, description = "the schedule")),
    responses((status = 201, body = onus::Job), (status = 404, body = super::error::ErrorBody)))]
pub async fn run_periodic(
    State(app): State<App>,
    Path(name): Path<String>,
) -> Result<(axum::http::StatusCode, Json<onus::Job>), ApiError> {
    let job = app.client.run_periodic(&name).await?;
    Ok((axum::http::StatusCode::CREATED, Json(job)))
}
