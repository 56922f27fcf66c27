//! The HTTP API under `/api/v1`, its OpenAPI document, and the root routes (`/healthz`,
//! `/metrics`). Handlers are thin: each parses its input, calls one function of a service module
//! (jobs, queues, webhooks, alerts, workers) and answers what it returns; the tasks panel calls
//! the same functions.

pub mod alerts;
pub mod auth;
pub mod body;
pub mod error;
pub mod jobs;
pub mod keys;
pub mod metrics;
pub mod processes;
pub mod queues;
pub mod webhooks;
pub mod workers;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;

pub use auth::Auth;
pub use body::Body;
pub use error::ApiError;

/// The default body limit (1 MiB); `body_limit` in onus.toml changes it.
pub const DEFAULT_BODY_LIMIT: usize = 1 << 20;
/// The body limit of `POST /jobs/batch` (32 MiB).
pub const BATCH_BODY_LIMIT: usize = 32 << 20;

/// How a kind's jobs are handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum HandledBy {
    /// By a handler inside the server (the built-in kinds).
    Process,
    /// POSTed to the kind's URL (a worker in any language that the server calls).
    Push,
    /// Claimed by workers in any language through `POST /queues/{name}/claim`.
    Pull,
}

/// What the server knows of one kind.
#[derive(Debug, Clone)]
pub struct KindInfo {
    /// Its name.
    pub name: String,
    /// How its jobs are handled.
    pub handled_by: HandledBy,
    /// Its default queue.
    pub queue: String,
    /// Its policy, overrides applied.
    pub policy: onus::Policy,
    /// A push kind's URL.
    pub url: Option<String>,
    /// A push kind's signing secret.
    pub secret: Option<crate::push::PushSecret>,
}

/// Settings of the front door.
#[derive(Debug, Clone)]
pub struct Limits {
    /// The most bytes of a request body (the batch insert has its own, larger limit).
    pub body: usize,
    /// Whether `/metrics` answers without a token.
    pub metrics_public: bool,
    /// How long a client may take to send a request's headers (and an idle connection may wait
    /// for its next request) before the connection is closed.
    pub header_timeout: std::time::Duration,
    /// How long a request body may go without a byte arriving before the request fails (408).
    pub body_timeout: std::time::Duration,
    /// The most connections served at once; more wait in the listen queue.
    pub max_connections: usize,
}

/// The default of `header_timeout`.
pub const DEFAULT_HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// The default of `body_timeout`.
pub const DEFAULT_BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// The default of `max_connections`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            body: DEFAULT_BODY_LIMIT,
            metrics_public: false,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// Everything a handler needs.
#[derive(Debug)]
pub struct Inner {
    /// The job layer's client.
    pub client: onus::Client,
    /// The webhook service.
    pub webhooks: onus_webhooks::Webhooks,
    /// The token check.
    pub auth: Auth,
    /// Every kind the server knows, by name.
    pub kinds: BTreeMap<String, KindInfo>,
    /// The queues named in the configuration.
    pub queues: Vec<String>,
    /// Body limits and the like.
    pub limits: Limits,
}

/// The shared state of every handler. Cheap to clone.
#[derive(Debug, Clone)]
pub struct App(pub Arc<Inner>);

impl std::ops::Deref for App {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl App {
    /// The kind named `name`, or a 422 naming the known kinds.
    /// A kind a caller may insert jobs of: known, and not one the server runs for itself
    /// (a webhook delivery inserted by hand could send one tenant's event to another's endpoint).
    pub fn insertable_kind(&self, field: &str, name: &str) -> Result<&KindInfo, ApiError> {
        let info = self.known_kind(field, name)?;
        if let Some(instead) = internal_kind(name) {
            return Err(ApiError::invalid(format!(
                "{field}: {name:?} is a kind the server runs itself and takes no jobs from callers; {instead}"
            )));
        }
        Ok(info)
    }

    pub fn known_kind(&self, field: &str, name: &str) -> Result<&KindInfo, ApiError> {
        self.kinds.get(name).ok_or_else(|| {
            let known: Vec<&str> = self.kinds.keys().map(String::as_str).collect();
            ApiError::invalid(format!(
                "{field}: unknown kind {name:?}; known kinds: {} (add one under [kinds.\"{name}\"] in onus.toml)",
                known.join(", ")
            ))
        })
    }
}

/// What to do instead of inserting a job of `kind`, when it is one the server runs itself.
pub fn internal_kind(kind: &str) -> Option<&'static str> {
    match kind {
        onus_webhooks::FANOUT | onus_webhooks::DELIVER => Some(
            "publish an event instead (POST /api/v1/events with its type and payload): the server delivers it to the endpoints subscribed to it",
        ),
        onus_webhooks::PRUNE | onus_mail::PRUNE => {
            Some("it is the server's own housekeeping, run on its schedule")
        }
        _ => None,
    }
}

/// A page size given as `limit`: a whole number from 1 to `max`, `default` when absent.
pub fn page_size(v: &Option<String>, default: usize, max: usize) -> Result<usize, ApiError> {
    match v {
        None => Ok(default),
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=max).contains(n))
            .ok_or_else(|| {
                ApiError::invalid(format!(
                    "limit: {v:?} is not a page size; give a whole number from 1 to {max}"
                ))
            }),
    }
}

/// A cursor that names nothing (or names it wrongly): a 422 saying what to pass.
pub fn bad_cursor(c: &str) -> ApiError {
    ApiError::invalid(format!(
        "cursor: {c:?} is not a cursor; pass the next_cursor of the previous page"
    ))
}

/// Cuts `rows`, read with one more than `limit`, to the page and the next page's cursor (the
/// last row's `key`), none on the last page.
pub fn paged<T>(
    mut rows: Vec<T>,
    limit: usize,
    key: impl Fn(&T) -> String,
) -> (Vec<T>, Option<String>) {
    let more = rows.len() > limit;
    rows.truncate(limit);
    let next = more.then(|| rows.last().map(&key)).flatten();
    (rows, next)
}

struct Security;

impl Modify for Security {
    fn modify(&self, api: &mut utoipa::openapi::OpenApi) {
        let c = api.components.get_or_insert_with(Default::default);
        c.add_security_scheme(
            "token",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// Every operation's id is its tag and its handler (`jobs_show`, `webhooks_show`): handlers of
/// different resources share names (`list`, `show`, `pause`), and client generators refuse a
/// document whose ids repeat, or make clashing methods of it.
fn unique_operation_id(op: &mut utoipa::openapi::path::Operation) {
    let tag = op.tags.as_ref().and_then(|t| t.first()).cloned();
    if let (Some(tag), Some(id)) = (tag, op.operation_id.as_mut()) {
        if !id.starts_with(&format!("{tag}_")) {
            *id = format!("{tag}_{id}");
        }
    }
}

/// Gives every operation its unique id and the answers every call can give: 401 without the
/// token, 400 and 413 for a body, 422 for invalid input, 503 when the database cannot be reached.
fn common_errors(doc: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
    let answer = |what: &str| {
        ResponseBuilder::new()
            .description(what)
            .content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("ErrorBody")))
                    .build(),
            )
            .build()
    };
    for item in doc.paths.paths.values_mut() {
        let ops = [
            &mut item.get,
            &mut item.post,
            &mut item.put,
            &mut item.patch,
            &mut item.delete,
        ];
        for op in ops.into_iter().flatten() {
            unique_operation_id(op);
            let has_body = op.request_body.is_some();
            let r = &mut op.responses.responses;
            let mut add = |code: &str, what: &str| {
                r.entry(code.to_string())
                    .or_insert_with(|| answer(what).into());
            };
            add("401", "no token, or a wrong one");
            add("422", "invalid input; the message names the field");
            add("503", "the database cannot be reached now");
            if has_body {
                add("400", "the body is not JSON");
                add("413", "the body is over the limit");
            }
        }
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "Onus", description = "The Onus HTTP API: jobs, queues, kinds, paused keys, processes, webhooks, alerts and pull workers. Every call takes `Authorization: Bearer <token>`."),
    modifiers(&Security),
    security(("token" = [])),
)]
struct ApiDoc;

/// The `/api/v1` routes and their OpenAPI document (paths relative to `/api/v1`).
pub fn routes() -> (Router<App>, utoipa::openapi::OpenApi) {
    let (router, doc) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(utoipa_axum::routes!(jobs::insert_batch))
        .routes(utoipa_axum::routes!(jobs::insert, jobs::list))
        .routes(utoipa_axum::routes!(jobs::show, jobs::delete))
        .routes(utoipa_axum::routes!(jobs::mail_sent))
        .routes(utoipa_axum::routes!(jobs::retry_one))
        .routes(utoipa_axum::routes!(jobs::cancel_one))
        .routes(utoipa_axum::routes!(jobs::retry_many))
        .routes(utoipa_axum::routes!(jobs::cancel_many))
        .routes(utoipa_axum::routes!(jobs::delete_many))
        .routes(utoipa_axum::routes!(queues::list_kinds))
        .routes(utoipa_axum::routes!(queues::list_queues))
        .routes(utoipa_axum::routes!(queues::pause))
        .routes(utoipa_axum::routes!(queues::resume))
        .routes(utoipa_axum::routes!(queues::list_periodic))
        .routes(utoipa_axum::routes!(queues::pause_periodic))
        .routes(utoipa_axum::routes!(queues::resume_periodic))
        .routes(utoipa_axum::routes!(queues::run_periodic))
        .routes(utoipa_axum::routes!(keys::list))
        .routes(utoipa_axum::routes!(processes::list))
        .routes(utoipa_axum::routes!(keys::pause))
        .routes(utoipa_axum::routes!(keys::resume))
        .routes(utoipa_axum::routes!(webhooks::create, webhooks::list))
        .routes(utoipa_axum::routes!(
            webhooks::show,
            webhooks::update,
            webhooks::delete
        ))
        .routes(utoipa_axum::routes!(webhooks::enable))
        .routes(utoipa_axum::routes!(webhooks::disable))
        .routes(utoipa_axum::routes!(webhooks::rotate_secret))
        .routes(utoipa_axum::routes!(webhooks::test))
        .routes(utoipa_axum::routes!(webhooks::redeliver))
        .routes(utoipa_axum::routes!(webhooks::attempts))
        .routes(utoipa_axum::routes!(webhooks::publish, webhooks::events))
        .routes(utoipa_axum::routes!(webhooks::event))
        .routes(utoipa_axum::routes!(webhooks::deliveries))
        .routes(utoipa_axum::routes!(workers::claim))
        .routes(utoipa_axum::routes!(workers::complete))
        .routes(utoipa_axum::routes!(workers::fail))
        .routes(utoipa_axum::routes!(workers::snooze))
        .routes(utoipa_axum::routes!(workers::heartbeat))
        .routes(utoipa_axum::routes!(workers::answers))
        .routes(utoipa_axum::routes!(workers::heartbeats))
        .routes(utoipa_axum::routes!(alerts::list))
        .routes(utoipa_axum::routes!(alerts::ack))
        .split_for_parts();
    let mut doc = doc;
    common_errors(&mut doc);
    (router, doc)
}

/// The OpenAPI document as served at `/api/v1/openapi.json` (paths with their `/api/v1` prefix).
pub fn openapi() -> utoipa::openapi::OpenApi {
    let (_, doc) = routes();
    prefixed(doc)
}

fn prefixed(mut doc: utoipa::openapi::OpenApi) -> utoipa::openapi::OpenApi {
    let paths = std::mem::take(&mut doc.paths.paths);
    doc.paths.paths = paths
        .into_iter()
        .map(|(p, item)| (format!("/api/v1{p}"), item))
        .collect();
    doc
}

/// Answers of `/healthz`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// `ok` or `unavailable`.
    pub status: &'static str,
    /// The backend (`sqlite`, `postgres`).
    pub database: &'static str,
    /// The server's version.
    pub version: &'static str,
    /// Why the database is unavailable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

async fn healthz(State(app): State<App>) -> (StatusCode, Json<Health>) {
    let store = app.client.store();
    let ok = tokio::time::timeout(Duration::from_secs(5), store.health()).await;
    // The detail goes to the log: this answer needs no token.
    let (status, error) = match ok {
        Ok(Ok(_)) => (StatusCode::OK, None),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "health check: the database is unavailable");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Some("the database cannot be reached".to_string()),
            )
        }
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Some("the database did not answer within 5 s".into()),
        ),
    };
    (
        status,
        Json(Health {
            status: if error.is_none() { "ok" } else { "unavailable" },
            database: store.backend(),
            version: env!("CARGO_PKG_VERSION"),
            error,
        }),
    )
}

async fn openapi_json(State(doc): State<Arc<serde_json::Value>>) -> Json<serde_json::Value> {
    Json((*doc).clone())
}

/// The whole application: `/healthz`, `/api/v1/...` behind the token, `/api/v1/openapi.json`.
pub fn app(state: App) -> Router {
    app_with(state, Router::new())
}

/// [`app`], with `pages` (the tasks panel) served beside the API.
pub fn app_with(state: App, pages: Router) -> Router {
    let (api, doc) = routes();
    let doc = Arc::new(serde_json::to_value(prefixed(doc)).unwrap_or_default());
    // Bodies are read by the API's own extractors, each within its call's limit.
    let protected = api
        .layer(DefaultBodyLimit::disable())
        .layer(axum::middleware::from_fn(auth::refuse_nul))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_token,
        ))
        .with_state(state.clone());
    let open_doc = Router::new()
        .route("/openapi.json", get(openapi_json))
        .with_state(doc);
    metrics::handle();
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics::metrics))
        .with_state(state)
        .nest("/api/v1", open_doc.merge(protected))
        .merge(pages)
        .fallback(|| async {
            ApiError::not_found(
                "no such route; the API is under /api/v1 (see /api/v1/openapi.json)",
            )
        })
}
