//! `onus serve`: the workers plus the HTTP server (`/healthz`, `/metrics`, the API under
//! `/api/v1`) until SIGINT or SIGTERM, then a graceful shutdown: API requests in flight finish,
//! running jobs get a grace period.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use onus::{Onus, Store};
use tokio::task::JoinHandle;

use crate::api::{self, App, Auth, HandledBy, KindInfo, Limits};
use crate::config::FileConfig;
use crate::secrets::{self, Secrets};
use crate::Error;

/// How long running jobs get to finish at shutdown before they are handed back.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// How long API requests in flight get to finish at shutdown.
const REQUESTS_GRACE: Duration = Duration::from_secs(35);

/// The kinds every server runs in process.
const BUILT_IN: [&str; 4] = [
    onus_http::request::KIND,
    onus_webhooks::FANOUT,
    onus_webhooks::DELIVER,
    onus_mail::SEND,
];

/// `kind` with the cap on running jobs and the rate window its configuration gives.
fn limited(
    kind: onus::Kind,
    k: &crate::config::KindConfig,
    name: &str,
) -> Result<onus::Kind, Error> {
    let (cap, rate) = k.limits(name)?;
    let kind = match cap {
        Some(n) => kind.max_running(n),
        None => kind,
    };
    Ok(match rate {
        Some((limit, key)) => kind.rate_from(limit, key),
        None => kind,
    })
}

/// The runtime and components the configuration describes, not started.
#[derive(Debug)]
pub struct Parts {
    /// The job layer.
    pub onus: Onus,
    /// The webhook service.
    pub webhooks: onus_webhooks::Webhooks,
    /// The server's secrets table.
    pub secrets: Secrets,
    /// Every kind the server knows.
    pub kinds: BTreeMap<String, KindInfo>,
    /// The panel's settings.
    pub panel_cfg: crate::config::PanelConfig,
}

/// Builds the runtime the configuration describes: the built-in kinds (`http.request`,
/// `webhook.fanout`, `webhook.deliver`), configured kinds, policy overrides, queues and
/// retention. Touches no database: migrate with [`Onus::migrate`] (or check with
/// [`Onus::check_migrations`]).
pub fn runtime(store: Arc<dyn Store>, file: &FileConfig) -> Result<Parts, Error> {
    runtime_with(store, file, |b| b)
}

/// [`runtime`], with `customize` applied to the builder last (tests set a manual clock or add
/// kinds of their own with it).
pub fn runtime_with(
    store: Arc<dyn Store>,
    file: &FileConfig,
    customize: impl FnOnce(onus::Builder) -> onus::Builder,
) -> Result<Parts, Error> {
    let mut webhooks_cfg = file.webhooks.resolve()?;
    webhooks_cfg.encryption_key = crate::config::encryption_key(file)?;
    let http_cfg = file.http.resolve()?;
    let secrets = Secrets::new(store.clone(), webhooks_cfg.encryption_key.clone());
    let hooks = onus_webhooks::Webhooks::new(store.clone(), webhooks_cfg)?;
    let http = Arc::new(
        onus_http::HttpClient::new(&http_cfg)
            .map_err(|e| Error::during("the outbound HTTP client", e))?,
    );
    let mut b = Onus::builder(store);
    if let Some(off) = file.clock_offset()? {
        tracing::warn!(
            offset_ms = off.num_milliseconds(),
            "clock_offset is set: this process's clock is shifted on purpose (fault drills only)"
        );
        b = b.clock(onus::OffsetClock::new(off));
    }
    let mut b = b
        .component(&secrets)
        .component(&hooks)
        .kind(onus_http::request::kind(http.clone()));
    b = match &file.mail {
        Some(section) => {
            let mail = onus_mail::Mail::new(section.resolve()?);
            b.component(&mail)
        }
        // Known, so an insert is refused with the reason instead of waiting forever.
        None => b.kind(onus::Kind::new(onus_mail::SEND).policy(onus::Policy::preset_mail()).check_args(|_| {
            Err("mail.send: mail is not configured here; add a [mail] section with the relay's url to onus.toml".into())
        })),
    };
    for (q, n) in &file.queues {
        b = b.queue(q.clone(), *n);
    }
    let mut push_secrets = BTreeMap::new();
    for (name, k) in &file.kinds {
        if let (Some(url), false) = (&k.url, BUILT_IN.contains(&name.as_str())) {
            // A push kind: each job POSTed to its URL.
            http.guard().check_literal(url).map_err(|b| {
                format!(
                    "[kinds.\"{name}\"] url = {url:?}: {b}; every job would be refused unsent: point to a reachable address, or add its network to [http] allow_networks"
                )
            })?;
            let secret = crate::push::PushSecret::new(name, k.secret.clone(), secrets.clone());
            push_secrets.insert(name.clone(), secret.clone());
            let timeout = match &k.timeout {
                Some(t) => humantime::parse_duration(t).map_err(|e| {
                    format!("[kinds.\"{name}\"] timeout = {t:?} is not a duration ({e})")
                })?,
                None => crate::push::DEFAULT_TIMEOUT,
            };
            let mut kind = crate::push::Push {
                kind: name.clone(),
                url: url.clone(),
                headers: k.headers.clone(),
                timeout,
                secret,
            }
            .into_kind(http.clone());
            if let Some(q) = &k.queue {
                kind = kind.queue(q.clone());
            }
            if let Some((t, slots)) = k.lease(name)? {
                kind = kind.lease_key_from(t).lease_slots(slots);
            }
            b = b.kind(limited(kind, k, name)?);
        } else if !BUILT_IN.contains(&name.as_str()) {
            // A kind this process does not run itself: pulled by workers through the API.
            let mut kind = onus::Kind::new(name.clone());
            if let Some(q) = &k.queue {
                kind = kind.queue(q.clone());
            }
            if let Some((t, slots)) = k.lease(name)? {
                kind = kind.lease_key_from(t).lease_slots(slots);
            }
            b = b.kind(limited(kind, k, name)?);
        } else if k.queue.is_some()
            || k.url.is_some()
            || k.lease_key.is_some()
            || k.slots.is_some()
            || k.max_running.is_some()
            || k.rate.is_some()
        {
            return Err(Error::Invalid(format!(
                "[kinds.\"{name}\"]: {name} is built in; only its policy and retry_budget can be changed"
            )));
        }
        if let Some(o) = &k.policy {
            b = b.policy_override(name.clone(), o.clone());
        }
        if let Some(budget) = k.retry_budget {
            b = b.retry_budget(name.clone(), budget);
        }
    }
    for (name, p) in &file.periodic {
        if !file.kinds.contains_key(&p.kind) && !BUILT_IN.contains(&p.kind.as_str()) {
            return Err(Error::Invalid(format!(
                "[periodic.\"{name}\"] kind = {:?} is not a kind this server knows; add [kinds.\"{}\"] (pulled by workers, or pushed with url = \"...\")",
                p.kind, p.kind
            )));
        }
        b = b.periodic(p.periodic(name)?);
    }
    let retention = file.retention.durations()?;
    let options = file.leases(onus::Options::default())?;
    b = b.options(onus::Options {
        retention,
        retry_budget: file.retry_budget,
        ..options
    });
    let onus = customize(b)
        .build()
        .map_err(|e| Error::during("configuration", e))?;
    let mut kinds = BTreeMap::new();
    for kind in onus.kinds() {
        let name = kind.name().to_string();
        let url = file.kinds.get(&name).and_then(|k| k.url.clone());
        let handled_by = if url.is_some() {
            HandledBy::Push
        } else if kind.is_handled() {
            HandledBy::Process
        } else {
            HandledBy::Pull
        };
        kinds.insert(
            name.clone(),
            KindInfo {
                name,
                handled_by,
                queue: kind.queue_name().to_string(),
                policy: kind.policy_ref().clone(),
                url,
                secret: push_secrets.get(kind.name()).cloned(),
            },
        );
    }
    Ok(Parts {
        onus,
        webhooks: hooks,
        secrets,
        kinds,
        panel_cfg: file.panel.clone(),
    })
}

impl Parts {
    /// Re-encrypts every secret kept at rest (the webhook endpoints', the server's own) under
    /// `new`; returns how many of each. Then configure `new` and restart every server.
    pub async fn reencrypt(
        &self,
        new: &onus_webhooks::crypto::Key,
    ) -> Result<(usize, usize), Error> {
        let endpoints = self.webhooks.reencrypt(new).await?;
        let server = self.secrets.reencrypt(new).await?;
        Ok((endpoints, server))
    }

    /// The tasks panel's state, on the API's.
    pub fn panel(&self, app: App) -> crate::panel::Panel {
        crate::panel::Panel(Arc::new(crate::panel::PanelInner {
            app,
            sessions: crate::panel::Sessions::new(self.secrets.clone()),
            base: self.panel_cfg.base().unwrap_or_default(),
            password: self.panel_cfg.password.clone(),
            secure_cookies: self.panel_cfg.secure_cookies.unwrap_or(false),
        }))
    }
}

/// The configured API token: `ONUS_API_TOKEN` over `api_token` in the file.
pub fn configured_token(file: &FileConfig) -> Option<String> {
    std::env::var("ONUS_API_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty())
        .or_else(|| file.api_token.clone())
}

/// The token check: the configured token, or the one kept in the database (generated now if
/// there is none yet, and logged as generated, never its value).
pub async fn auth(parts: &Parts, configured: Option<String>) -> Result<Auth, Error> {
    if configured.is_none() {
        let (_, created) = parts
            .secrets
            .ensure(
                secrets::API_TOKEN,
                secrets::generate(api::auth::TOKEN_PREFIX),
                chrono::Utc::now(),
            )
            .await
            .map_err(|e| Error::during("cannot keep the API token in the database", e))?;
        if created {
            tracing::info!(
                "generated an API token and kept it in the database; `onus token show` prints it"
            );
        }
    }
    let auth = Auth::new(configured, parts.secrets.clone());
    if !auth.is_configured() {
        auth.refresh().await?;
    }
    Ok(auth)
}

/// The handlers' state for `parts` under `file`'s settings.
pub fn state(parts: &Parts, file: &FileConfig, auth: Auth) -> App {
    App(Arc::new(api::Inner {
        client: parts.onus.client(),
        webhooks: parts.webhooks.clone(),
        auth,
        kinds: parts.kinds.clone(),
        queues: file.queues.keys().cloned().collect(),
        limits: {
            // Checked when the file was parsed; a value built in code falls back to defaults.
            let door = file.front_door().unwrap_or_default();
            Limits {
                body: file.body_limit.map_or(api::DEFAULT_BODY_LIMIT, |b| b.0),
                metrics_public: file.metrics_public,
                header_timeout: door.header_timeout,
                body_timeout: door.body_timeout,
                max_connections: door.max_connections,
            }
        },
    }))
}

/// A running server: its address and how to stop it.
#[derive(Debug)]
pub struct Server {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its handlers' state (the same the API uses).
    pub app: App,
    running: onus::Running,
    stop: tokio::sync::oneshot::Sender<()>,
    http: JoinHandle<std::io::Result<()>>,
}

impl Server {
    /// Starts `parts` (already migrated) with the API on `listener`.
    pub fn start(
        parts: &Parts,
        app: App,
        listener: tokio::net::TcpListener,
    ) -> Result<Self, Error> {
        let addr = listener
            .local_addr()
            .map_err(|e| Error::during("the listening socket", e))?;
        // The counters before the first attempt: one that ran while the routes were built would
        // count its request nowhere (the amplification invariant would then miss a request).
        api::metrics::handle();
        let running = parts.onus.start();
        let panel = crate::panel::router(parts.panel(app.clone()));
        let router = api::app_with(app.clone(), panel).layer(
            tower_http::trace::TraceLayer::new_for_http()
                .make_span_with(|req: &axum::http::Request<_>| {
                    // The path only: a query can carry search text, and no header is logged.
                    tracing::info_span!("request", method = %req.method(), path = %req.uri().path())
                })
                .on_request(())
                .on_response(
                    |res: &axum::http::Response<_>, took: Duration, _span: &tracing::Span| {
                        tracing::info!(
                            status = res.status().as_u16(),
                            // Rounded to a tenth of a millisecond: 1.1, not 1.1099350000000001.
                            ms = (took.as_secs_f64() * 10_000.0).round() / 10.0,
                            "answered"
                        );
                    },
                )
                .on_failure(()),
        );
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let limits = app.0.limits.clone();
        let router = router.layer(tower_http::timeout::RequestBodyTimeoutLayer::new(
            limits.body_timeout,
        ));
        let http = tokio::spawn(crate::front::serve(listener, router, limits, async {
            let _ = stop_rx.await;
        }));
        Ok(Server {
            addr,
            app,
            running,
            stop,
            http,
        })
    }

    /// Stops taking requests, lets those in flight finish, then stops the workers (running jobs
    /// get `grace`).
    pub async fn shutdown(self, grace: Duration) -> Result<(), Error> {
        let _ = self.stop.send(());
        // Requests in flight finish, within a bound (a long poll waits at most 30 s).
        let mut http = self.http;
        let served = match tokio::time::timeout(REQUESTS_GRACE, &mut http).await {
            Ok(r) => r,
            Err(_) => {
                tracing::warn!(
                    "requests still open after {} s; closing them",
                    REQUESTS_GRACE.as_secs()
                );
                http.abort();
                Ok(Ok(()))
            }
        };
        self.running.shutdown(grace).await;
        match served {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(Error::during("HTTP server failed", e)),
            Err(e) => Err(Error::during("HTTP server failed", e)),
        }
    }
}

/// Opens the database, migrates (or checks), and returns the parts and the handlers' state.
pub async fn prepare(file: &FileConfig, url: &str, migrate: bool) -> Result<(Parts, App), Error> {
    prepare_with(file, url, migrate, |b| b).await
}

/// [`prepare`], with `customize` applied to the runtime's builder (see [`runtime_with`]).
pub async fn prepare_with(
    file: &FileConfig,
    url: &str,
    migrate: bool,
    customize: impl FnOnce(onus::Builder) -> onus::Builder,
) -> Result<(Parts, App), Error> {
    // Every line, the job layer's included, is migrated (and logged) by `Onus::migrate` below.
    let store = onus::open_with(url, false).await?;
    let parts = runtime_with(store, file, customize)?;
    if migrate {
        for a in parts.onus.migrate().await? {
            tracing::info!(line = %a.line, version = a.version, file = %a.name, "migration applied");
        }
    } else {
        parts.onus.check_migrations().await?;
    }
    // Every stored secret opens with the configured key; plaintext ones are encrypted now.
    let sealed = parts
        .webhooks
        .seal_stored_secrets()
        .await
        .map_err(|e| Error::during("webhook secrets", e))?;
    if sealed > 0 {
        tracing::info!(
            endpoints = sealed,
            "encrypted the stored webhook secrets under the configured key"
        );
    }
    let sealed = parts
        .secrets
        .seal_stored()
        .await
        .map_err(|e| Error::during("the server's secrets", e))?;
    if sealed > 0 {
        tracing::info!(
            secrets = sealed,
            "encrypted the server's stored secrets under the configured key"
        );
    }
    let auth = auth(&parts, configured_token(file)).await?;
    let app = state(&parts, file, auth);
    Ok((parts, app))
}

/// `onus serve`.
pub async fn serve(
    file: FileConfig,
    path: Option<PathBuf>,
    url: String,
    listen: String,
    migrate: bool,
) -> Result<(), Error> {
    // Listening for the signals before anything else: one that arrives while the server starts
    // stops it gracefully too.
    let signal = stop_signal()?;
    // The address is taken before the database is opened: a bad --listen, or one in use, stops
    // the start without making or migrating a database. Connections wait in the listen queue
    // until the server answers.
    let listener = tokio::net::TcpListener::bind(&listen).await.map_err(|e| {
        format!(
            "cannot listen on {listen}: {e}; choose another address with ONUS_LISTEN or --listen (like 127.0.0.1:8080)"
        )
    })?;
    let (parts, app) = prepare(&file, &url, migrate).await?;
    let server = Server::start(&parts, app, listener)?;
    tracing::info!(
        database = %onus::redact_url(&url),
        config = %path.map(|p| p.display().to_string()).unwrap_or_else(|| "(none)".into()),
        owner = parts.onus.owner(),
        "onus {} listening on http://{}",
        env!("CARGO_PKG_VERSION"),
        server.addr
    );
    let login = if parts.panel_cfg.password.is_some() {
        "log in with the panel password of onus.toml"
    } else {
        "log in with the API token: `onus token show` prints it"
    };
    tracing::info!(
        "the tasks panel is at http://{}{}/ ({login}); the API is under /api/v1",
        server.addr,
        parts.panel_cfg.base().unwrap_or_default()
    );
    signal.await;
    tracing::info!("stopping: finishing requests in flight and running jobs");
    server.shutdown(SHUTDOWN_GRACE).await?;
    tracing::info!("stopped");
    Ok(())
}

/// A future that resolves at SIGINT or SIGTERM; the handlers are installed when it is made.
fn stop_signal() -> Result<impl std::future::Future<Output = ()>, Error> {
    #[cfg(unix)]
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| Error::during("cannot listen for SIGTERM", e))?;
    let ctrl_c = tokio::spawn(tokio::signal::ctrl_c());
    Ok(async move {
        #[cfg(unix)]
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = ctrl_c.await;
    })
}
