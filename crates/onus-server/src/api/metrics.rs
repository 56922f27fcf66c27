//! `/metrics` in the Prometheus text format: the counters and histograms the components record
//! (attempts by kind and outcome, attempt durations, pick-up delay, snoozes, outbound requests,
//! attempts and Retry-After snoozes by client and kind, webhook answers by status class), and
//! gauges read from the database at each scrape (jobs by state and queue, the oldest waiting job
//! per queue, paused queues, open alerts, failing and disabled endpoints).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::OnceLock;

use axum::extract::{Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use super::{auth, ApiError, App};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// The process's recorder, installed on first use (one per process: every server in it shares
/// the counters).
pub fn handle() -> &'static PrometheusHandle {
    HANDLE.get_or_init(|| {
        let builder = PrometheusBuilder::new()
            .set_buckets(&[
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                60.0, 300.0,
            ])
            .unwrap_or_else(|_| PrometheusBuilder::new());
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        if metrics::set_global_recorder(recorder).is_err() {
            tracing::warn!("another metrics recorder is installed; /metrics shows only the gauges");
        }
        handle
    })
}

fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The gauges read from the database now.
pub async fn gauges(app: &App) -> Result<String, ApiError> {
    let mut out = String::new();
    let mut by: BTreeMap<(String, String), u64> = BTreeMap::new();
    for r in app.client.store().counts().await? {
        *by.entry((r.state.as_str().to_string(), r.queue))
            .or_default() += r.count;
    }
    out.push_str("# HELP onus_jobs Jobs by state and queue.\n# TYPE onus_jobs gauge\n");
    for ((state, queue), n) in &by {
        let _ = writeln!(
            out,
            "onus_jobs{{state=\"{}\",queue=\"{}\"}} {n}",
            label(state),
            label(queue)
        );
    }
    let queues = super::queues::queue_list(app).await?.queues;
    out.push_str("# HELP onus_queue_oldest_waiting_seconds How long the oldest due job of a queue has waited.\n# TYPE onus_queue_oldest_waiting_seconds gauge\n");
    for q in &queues {
        let _ = writeln!(
            out,
            "onus_queue_oldest_waiting_seconds{{queue=\"{}\"}} {}",
            label(&q.name),
            q.oldest_waiting_seconds
        );
    }
    out.push_str(
        "# HELP onus_queue_paused 1 when a queue is paused.\n# TYPE onus_queue_paused gauge\n",
    );
    for q in &queues {
        let _ = writeln!(
            out,
            "onus_queue_paused{{queue=\"{}\"}} {}",
            label(&q.name),
            u8::from(q.paused)
        );
    }
    let alerts = app.client.open_alerts().await?;
    let _ = writeln!(out, "# HELP onus_alerts_open Alerts not acknowledged.\n# TYPE onus_alerts_open gauge\nonus_alerts_open {alerts}");
    let endpoints = app.webhooks.endpoints().await?;
    let failing = endpoints
        .iter()
        .filter(|e| e.enabled && e.failing_since.is_some())
        .count();
    let disabled = endpoints.iter().filter(|e| !e.enabled).count();
    let _ = writeln!(
        out,
        "# HELP onus_webhook_endpoints Webhook endpoints by health.\n# TYPE onus_webhook_endpoints gauge\n\
         onus_webhook_endpoints{{health=\"failing\"}} {failing}\nonus_webhook_endpoints{{health=\"disabled\"}} {disabled}\n\
         onus_webhook_endpoints{{health=\"healthy\"}} {}",
        endpoints.len() - failing - disabled
    );
    Ok(out)
}

/// `GET /metrics`: the token is required unless `metrics_public = true`.
pub async fn metrics(State(app): State<App>, req: Request) -> Result<Response, ApiError> {
    if !app.limits.metrics_public {
        auth::authorize(&app, auth::bearer(&req).map(str::to_owned)).await?;
    }
    let mut text = handle().render();
    text.push_str(&gauges(&app).await?);
    Ok((
        [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        text,
    )
        .into_response())
}
