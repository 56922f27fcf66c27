//! `onus serve`: the workers plus an HTTP server (for now `GET /healthz`; the API and the panel
//! come later) until SIGINT or SIGTERM, then a graceful shutdown.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use onus::{Onus, Store};

use crate::config::FileConfig;

/// How long running jobs get to finish at shutdown before they are handed back.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Builds the runtime the configuration describes: the built-in kinds (`http.request`,
/// `webhook.fanout`, `webhook.deliver`), policy overrides, queues and retention. Touches no
/// database: migrate with [`Onus::migrate`] (or check with [`Onus::check_migrations`]).
pub fn runtime(
    store: Arc<dyn Store>,
    file: &FileConfig,
) -> Result<(Onus, onus_webhooks::Webhooks), String> {
    let webhooks_cfg = file.webhooks.resolve().map_err(|e| e.to_string())?;
    let http_cfg = file.http.resolve().map_err(|e| e.to_string())?;
    let hooks =
        onus_webhooks::Webhooks::new(store.clone(), webhooks_cfg).map_err(|e| e.to_string())?;
    let http = Arc::new(onus_http::HttpClient::new(&http_cfg).map_err(|e| e.to_string())?);
    let mut b = Onus::builder(store)
        .component(&hooks)
        .kind(onus_http::request::kind(http));
    for (q, n) in &file.queues {
        b = b.queue(q.clone(), *n);
    }
    const BUILT_IN: [&str; 3] = [
        onus_http::request::KIND,
        onus_webhooks::FANOUT,
        onus_webhooks::DELIVER,
    ];
    for (name, k) in &file.kinds {
        if !BUILT_IN.contains(&name.as_str()) {
            // A kind this process does not handle: its policy and queue still apply to inserts.
            let mut kind = onus::Kind::new(name.clone());
            if let Some(q) = &k.queue {
                kind = kind.queue(q.clone());
            }
            b = b.kind(kind);
        } else if k.queue.is_some() {
            return Err(format!(
                "[kinds.\"{name}\"] queue: the queue of a built-in kind cannot be changed"
            ));
        }
        if let Some(o) = &k.policy {
            b = b.policy_override(name.clone(), o.clone());
        }
    }
    let retention = file.retention.durations().map_err(|e| e.to_string())?;
    b = b.options(onus::Options {
        retention,
        ..onus::Options::default()
    });
    let onus = b.build().map_err(|e| format!("configuration: {e}"))?;
    Ok((onus, hooks))
}

async fn healthz(State(store): State<Arc<dyn Store>>) -> (StatusCode, Json<serde_json::Value>) {
    match store.get(0).await {
        Ok(_) => (
            StatusCode::OK,
            Json(
                serde_json::json!({"status": "ok", "database": store.backend(), "version": env!("CARGO_PKG_VERSION")}),
            ),
        ),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(
                serde_json::json!({"status": "unavailable", "database": store.backend(), "error": e.to_string()}),
            ),
        ),
    }
}

pub async fn serve(
    file: FileConfig,
    path: Option<PathBuf>,
    url: String,
    listen: String,
    migrate: bool,
) -> Result<(), String> {
    if let Some((name, _)) = file.kinds.iter().find(|(_, k)| k.url.is_some()) {
        return Err(format!(
            "[kinds.\"{name}\"] url: HTTP-handled kinds are not supported by this version yet; remove the url"
        ));
    }
    for (section, present) in [
        ("[mail]", file.mail.is_some()),
        ("api_token", file.api_token.is_some()),
    ] {
        if present {
            tracing::warn!("{section} is accepted but not used by this version yet");
        }
    }
    // Every line, the job layer's included, is migrated (and logged) by `Onus::migrate` below.
    let store = onus::open_with(&url, false)
        .await
        .map_err(|e| e.to_string())?;
    let (onus, _webhooks) = runtime(store.clone(), &file)?;
    if migrate {
        for a in onus.migrate().await.map_err(|e| e.to_string())? {
            tracing::info!(line = %a.line, version = a.version, file = %a.name, "migration applied");
        }
    } else {
        onus.check_migrations().await.map_err(|e| e.to_string())?;
    }
    let listener = tokio::net::TcpListener::bind(&listen).await.map_err(|e| {
        format!(
            "cannot listen on {listen}: {e}; choose another address with ONUS_LISTEN or --listen"
        )
    })?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let running = onus.start();
    tracing::info!(
        database = %onus::redact_url(&url),
        config = %path.map(|p| p.display().to_string()).unwrap_or_else(|| "(none)".into()),
        owner = onus.owner(),
        "onus {} listening on http://{addr}",
        env!("CARGO_PKG_VERSION")
    );
    let app = Router::new()
        .route("/healthz", get(healthz))
        .with_state(store);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stop_rx.await;
            })
            .await
    });
    running.run_until_signal(SHUTDOWN_GRACE).await;
    let _ = stop_tx.send(());
    match server.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(format!("HTTP server failed: {e}")),
        Err(e) => return Err(format!("HTTP server failed: {e}")),
    }
    tracing::info!("stopped");
    Ok(())
}
