//! The tasks panel: server-rendered HTML (maud) on the API's own service functions, behind a
//! login form and a session cookie, every form carrying the session's CSRF token. Every asset is
//! served from the binary; pages work without JavaScript.

pub mod chart;
pub mod pages;
pub mod session;
pub mod webhooks;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, FromRequestParts, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, COOKIE, LOCATION, SET_COOKIE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use serde::Deserialize;
use subtle::ConstantTimeEq as _;

use crate::api::App;
pub use session::{Session, Sessions};

/// The panel's shared state.
#[derive(Debug, Clone)]
pub struct Panel(pub Arc<PanelInner>);

/// What the panel's handlers need.
#[derive(Debug)]
pub struct PanelInner {
    /// The API's state: the same service functions the API calls.
    pub app: App,
    /// Sessions and the login counter.
    pub sessions: Sessions,
    /// The path the panel is served under (empty: the root).
    pub base: String,
    /// The login password, when it is not the API token.
    pub password: Option<String>,
    /// Always mark the cookie `Secure`.
    pub secure_cookies: bool,
}

impl std::ops::Deref for Panel {
    type Target = PanelInner;
    fn deref(&self) -> &PanelInner {
        &self.0
    }
}

/// The open-alert badge counts this far at most (then shows "99+"): it is on every page and
/// refresh, and must not cost more when nobody acknowledges alerts.
pub(crate) const BADGE_CAP: u64 = 100;

impl Panel {
    /// The open alerts the badge shows, up to [`BADGE_CAP`] (none when the database does not
    /// answer: the page itself then says what failed).
    pub(crate) async fn badge(&self) -> u64 {
        self.app
            .client
            .open_alerts_upto(BADGE_CAP)
            .await
            .unwrap_or(0)
    }

    /// A path inside the panel. Under a base path the overview is the base itself (`/onus`):
    /// a router nested there answers `/onus`, and `/onus/` only redirects to it.
    pub fn href(&self, path: &str) -> String {
        if path == "/" && !self.base.is_empty() {
            return self.base.clone();
        }
        format!("{}{path}", self.base)
    }

    pub(crate) fn redirect(&self, path: &str) -> Response {
        let mut r = StatusCode::SEE_OTHER.into_response();
        if let Ok(v) = HeaderValue::from_str(&self.href(path)) {
            r.headers_mut().insert(LOCATION, v);
        }
        r
    }

    /// Redirects to `path`, whose page then shows `notice` once (what the action did): kept in
    /// a short-lived cookie of its own, read with the session and cleared by the page shown.
    pub(crate) fn notify(&self, path: &str, notice: &str) -> Response {
        let mut r = self.redirect(path);
        let value: String = url::form_urlencoded::byte_serialize(notice.as_bytes()).collect();
        let cookie = format!(
            "{NOTICE}={value}; Path={}; HttpOnly; SameSite=Strict; Max-Age=60",
            self.cookie_path()
        );
        if let Ok(v) = HeaderValue::from_str(&cookie) {
            r.headers_mut().append(SET_COOKIE, v);
        }
        r
    }

    /// The path the panel's cookies are scoped to.
    fn cookie_path(&self) -> &str {
        if self.base.is_empty() {
            "/"
        } else {
            self.base.as_str()
        }
    }

    /// What sessions are bound to: the panel password, or the current API token.
    async fn credential(&self) -> Result<String, onus::StoreError> {
        match &self.password {
            Some(p) => Ok(crate::api::auth::fingerprint(&format!("password:{p}"))),
            None => self.app.auth.fingerprint().await,
        }
    }

    async fn password_ok(&self, given: &str) -> Result<bool, crate::api::ApiError> {
        match &self.password {
            Some(p) => {
                Ok(p.len() == given.len() && bool::from(p.as_bytes().ct_eq(given.as_bytes())))
            }
            // The current token only: one in a rotation's grace serves API clients switching
            // over, not a new panel session that the rotation would not end.
            None => Ok(self.app.auth.is_current(given).await?),
        }
    }
}

/// Only Onus's own scripts and styles; the refresh fetches only from here; no framing; forms
/// post only here.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; \
                   form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// A URL with a NUL in it (`?kind=%00`) gets a 422 page saying so, as the API answers it,
/// before any page reads it.
async fn refuse_nul(
    State(panel): State<Panel>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match crate::api::auth::nul_in(req.uri()) {
        Some(e) => pages::refusal_page(&panel, e),
        None => next.run(req).await,
    }
}

/// Adds the panel's security headers to every answer.
async fn headers(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let mut r = next.run(req).await;
    let h = r.headers_mut();
    h.insert("content-security-policy", HeaderValue::from_static(CSP));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    h.entry(CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    r
}

/// A page's caller, logged in; a page without a valid session redirects to the login form.
#[derive(Debug)]
pub struct Authed(pub Session);

/// Sent instead of a page when the session is missing or expired.
#[derive(Debug)]
pub struct ToLogin(Response);

impl IntoResponse for ToLogin {
    fn into_response(self) -> Response {
        self.0
    }
}

/// The cookie that carries an action's notice to the page it redirects to.
const NOTICE: &str = "onus_notice";

fn cookie_of(headers: &HeaderMap) -> Option<String> {
    cookie_named(headers, session::COOKIE)
}

fn cookie_named(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
}

/// The notice a request carries, decoded; at most 500 characters are shown.
fn notice_of(headers: &HeaderMap) -> Option<String> {
    let raw = cookie_named(headers, NOTICE)?;
    let text: String = url::form_urlencoded::parse(format!("n={raw}").as_bytes())
        .next()
        .map(|(_, v)| v.chars().take(500).collect())?;
    (!text.trim().is_empty()).then_some(text)
}

/// Clears the notice cookie once a page (not another redirect) answered the request carrying it.
async fn clear_notice(
    State(panel): State<Panel>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let had = cookie_named(req.headers(), NOTICE).is_some();
    let mut r = next.run(req).await;
    if had && !r.status().is_redirection() {
        let gone = format!(
            "{NOTICE}=; Path={}; HttpOnly; SameSite=Strict; Max-Age=0",
            panel.cookie_path()
        );
        if let Ok(v) = HeaderValue::from_str(&gone) {
            r.headers_mut().append(SET_COOKIE, v);
        }
    }
    r
}

impl FromRequestParts<Panel> for Authed {
    type Rejection = ToLogin;

    async fn from_request_parts(parts: &mut Parts, panel: &Panel) -> Result<Self, ToLogin> {
        let cookie = cookie_of(&parts.headers);
        let found = match cookie {
            Some(c) => {
                let refused =
                    |e: onus::StoreError| ToLogin(crate::api::ApiError::from(e).into_response());
                let credential = panel.credential().await.map_err(refused)?;
                panel
                    .sessions
                    .check(&c, chrono::Utc::now(), &credential)
                    .await
                    .map_err(refused)?
            }
            None => None,
        };
        match found {
            Some(mut s) => {
                s.notice = notice_of(&parts.headers);
                Ok(Authed(s))
            }
            None => Err(ToLogin(panel.redirect("/login"))),
        }
    }
}

/// A POST refused for its missing or stale CSRF token.
#[derive(Debug)]
pub struct CsrfRefused;

impl IntoResponse for CsrfRefused {
    fn into_response(self) -> Response {
        (
            StatusCode::FORBIDDEN,
            "the form's security token is missing or stale; reload the page and try again",
        )
            .into_response()
    }
}

/// A form's CSRF field, checked against the session; a POST without it changes nothing.
fn check_csrf(session: &Session, given: Option<&str>) -> Result<(), CsrfRefused> {
    match given {
        Some(g) if Sessions::csrf_ok(session, g) => Ok(()),
        _ => Err(CsrfRefused),
    }
}

/// A state-changing form: the caller's session (as [`Authed`]) and the form's fields, given to
/// the handler only when the form carries the session's CSRF token. Otherwise the answer is 403
/// before the handler runs, so no POST route can forget the check.
#[derive(Debug)]
pub struct Posted<F>(pub Session, pub F);

impl<F: serde::de::DeserializeOwned> axum::extract::FromRequest<Panel> for Posted<F> {
    type Rejection = Response;

    async fn from_request(req: axum::extract::Request, panel: &Panel) -> Result<Self, Response> {
        let (mut parts, body) = req.into_parts();
        let Authed(s) = Authed::from_request_parts(&mut parts, panel)
            .await
            .map_err(IntoResponse::into_response)?;
        let req = axum::extract::Request::from_parts(parts, body);
        let bytes = axum::body::Bytes::from_request(req, panel)
            .await
            .map_err(IntoResponse::into_response)?;
        let given = url::form_urlencoded::parse(&bytes)
            .find(|(k, _)| k == "csrf")
            .map(|(_, v)| v.into_owned());
        check_csrf(&s, given.as_deref()).map_err(IntoResponse::into_response)?;
        // A field sent more than once (checkboxes of one name) arrives as one comma-separated
        // value, as the API's lists are written.
        let mut merged: Vec<(String, String)> = Vec::new();
        for (k, v) in url::form_urlencoded::parse(&bytes) {
            match merged.iter_mut().find(|(n, _)| *n == k) {
                Some((_, all)) => {
                    all.push(',');
                    all.push_str(&v);
                }
                None => merged.push((k.into_owned(), v.into_owned())),
            }
        }
        let joined = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(&merged)
            .finish();
        let fields = serde_urlencoded::from_str(&joined).map_err(|e| {
            (StatusCode::UNPROCESSABLE_ENTITY, format!("form: {e}")).into_response()
        })?;
        Ok(Posted(s, fields))
    }
}

#[derive(Debug, Deserialize)]
struct LoginForm {
    token: String,
}

fn secure(panel: &Panel, headers: &HeaderMap) -> bool {
    panel.secure_cookies
        || headers
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("https"))
}

async fn login_page(State(panel): State<Panel>) -> Response {
    pages::login(&panel, None).into_response()
}

async fn login(
    State(panel): State<Panel>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    let ip = peer.ip();
    if !panel.sessions.may_try(ip) {
        let page = pages::login(
            &panel,
            Some("Too many failed logins from this address; wait a minute and try again."),
        );
        return (StatusCode::TOO_MANY_REQUESTS, page).into_response();
    }
    match panel.password_ok(form.token.trim()).await {
        Ok(true) => {}
        Ok(false) => {
            panel.sessions.failed(ip);
            let page = pages::login(&panel, Some("That token is not accepted."));
            return (StatusCode::UNAUTHORIZED, page).into_response();
        }
        Err(e) => return e.into_response(),
    }
    let credential = match panel.credential().await {
        Ok(c) => c,
        Err(e) => return crate::api::ApiError::from(e).into_response(),
    };
    let value = match panel.sessions.create(chrono::Utc::now(), &credential).await {
        Ok(v) => v,
        Err(e) => return crate::api::ApiError::from(e).into_response(),
    };
    let path = panel.cookie_path();
    let cookie = format!(
        "{}={value}; Path={path}; HttpOnly; SameSite=Strict; Max-Age={}{}",
        session::COOKIE,
        session::SESSION_FOR.as_secs(),
        if secure(&panel, &headers) {
            "; Secure"
        } else {
            ""
        }
    );
    let mut r = panel.redirect("/");
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        r.headers_mut().insert(SET_COOKIE, v);
    }
    r
}

/// A form with nothing but its CSRF token.
#[derive(Debug, Deserialize)]
struct NoFields {}

async fn logout(State(panel): State<Panel>, _: Posted<NoFields>) -> Response {
    let path = panel.cookie_path();
    let mut r = panel.redirect("/login");
    let gone = format!(
        "{}=; Path={path}; HttpOnly; SameSite=Strict; Max-Age=0",
        session::COOKIE
    );
    if let Ok(v) = HeaderValue::from_str(&gone) {
        r.headers_mut().insert(SET_COOKIE, v);
    }
    r
}

async fn css() -> impl IntoResponse {
    (
        [
            (CONTENT_TYPE, "text/css; charset=utf-8"),
            (CACHE_CONTROL, "max-age=3600"),
        ],
        include_str!("../../assets/panel.css"),
    )
}

async fn js() -> impl IntoResponse {
    (
        [
            (CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (CACHE_CONTROL, "max-age=3600"),
        ],
        include_str!("../../assets/panel.js"),
    )
}

/// The panel's icon (also answered at `/favicon.ico`, which browsers ask for by themselves).
async fn favicon() -> impl IntoResponse {
    (
        [
            (CONTENT_TYPE, "image/svg+xml"),
            (CACHE_CONTROL, "max-age=86400"),
        ],
        include_str!("../../assets/favicon.svg"),
    )
}

/// The panel's routes, under its base path.
pub fn router(panel: Panel) -> Router {
    let routes = Router::new()
        .route("/", get(pages::overview))
        .route("/login", get(login_page).post(login))
        .route("/logout", post(logout))
        .route("/jobs", get(pages::jobs))
        .route("/jobs/bulk", post(pages::jobs_bulk))
        .route("/jobs/{id}", get(pages::job))
        .route("/jobs/{id}/action", post(pages::job_action))
        .route("/queues/action", post(pages::queue_action))
        .route("/keys/action", post(pages::key_action))
        .route("/alerts", get(pages::alerts))
        .route("/alerts/ack", post(pages::alerts_ack))
        .route("/periodic", get(pages::periodic))
        .route("/periodic/action", post(pages::periodic_action))
        .route("/kinds", get(pages::kinds))
        .route("/processes", get(pages::processes))
        .route(
            "/endpoints",
            get(webhooks::endpoints).post(webhooks::create),
        )
        .route("/endpoints/{id}", get(webhooks::endpoint))
        .route("/endpoints/{id}/action", post(webhooks::endpoint_action))
        .route("/endpoints/{id}/edit", post(webhooks::endpoint_edit))
        .route("/events", get(webhooks::events))
        .route("/events/{id}", get(webhooks::event))
        .route("/assets/panel.css", get(css))
        .route("/assets/panel.js", get(js))
        .route("/assets/favicon.svg", get(favicon))
        .route("/favicon.ico", get(favicon))
        .layer(axum::middleware::from_fn_with_state(
            panel.clone(),
            refuse_nul,
        ))
        .layer(axum::middleware::from_fn_with_state(
            panel.clone(),
            clear_notice,
        ))
        .layer(axum::middleware::from_fn(headers))
        .with_state(panel.clone());
    if panel.base.is_empty() {
        routes
    } else {
        let home = panel.clone();
        Router::new()
            .route(
                &format!("{}/", panel.base),
                get(move || async move { home.redirect("/") }),
            )
            .nest(&panel.base, routes)
    }
}
