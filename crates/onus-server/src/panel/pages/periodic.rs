//! The periodic jobs page: `/periodic`, with pause, resume and run now at `/periodic/action`.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::html;

use super::{err_page, layout, when, QueueForm};
use crate::panel::{Authed, Panel, Posted};

/// Periodic jobs: schedule, last run, last failure with its error, next run.
pub async fn periodic(State(panel): State<Panel>, Authed(s): Authed) -> Response {
    let rows = match panel.app.client.store().list_periodic().await {
        Ok(r) => r,
        Err(e) => return err_page(&panel, &s, e.into()),
    };
    let open = panel.badge().await;
    let t = |v: Option<onus::Timestamp>| v.map(when).unwrap_or_else(|| "-".into());
    let body = html! {
        @if rows.is_empty() { p { "No periodic job." } }
        @else {
            table {
                thead { tr { th { "Name" } th { "Kind" } th { "Schedule" } th { "Last run" } th { "Last state" } th { "Last failure" } th { "Next run" } th { span class="sr" { "Actions" } } } }
                tbody {
                    @for r in &rows {
                        tr {
                            td { (r.name) } td { (r.kind) } td { code { (r.schedule) } }
                            td { (t(r.last_run_at)) }
                            td { (r.last_state.clone().unwrap_or_else(|| "-".into())) }
                            td {
                                @if let (Some(at), Some(e)) = (r.last_failure_at, &r.last_error) {
                                    (when(at)) ": " span class="error" { (e) }
                                } @else { "-" }
                            }
                            td {
                                @if let Some(at) = r.paused_at { "paused since " (when(at)) } @else { (t(r.next_run_at)) }
                            }
                            td {
                                div class="actions" {
                                    @for (action, label) in [(if r.paused_at.is_some() { "resume" } else { "pause" }, if r.paused_at.is_some() { "Resume" } else { "Pause" }), ("run", "Run now")] {
                                        form method="post" action=(panel.href("/periodic/action")) {
                                            input type="hidden" name="csrf" value=(s.csrf);
                                            input type="hidden" name="name" value=(r.name);
                                            input type="hidden" name="action" value=(action);
                                            button type="submit" { (label) " " (r.name) }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    layout(&panel, Some(&s), "Periodic jobs", open, body).into_response()
}

/// Pauses, resumes or runs a periodic schedule, then shows the schedules.
pub async fn periodic_action(
    State(panel): State<Panel>,
    Posted(s, f): Posted<QueueForm>,
) -> Response {
    let client = &panel.app.client;
    let name = &f.name;
    let done = match f.action.as_str() {
        "pause" => client
            .pause_periodic(name)
            .await
            .map(|()| format!("Paused {name}: it enqueues nothing until it is resumed.")),
        "resume" => client
            .resume_periodic(name)
            .await
            .map(|()| format!("Resumed {name}: it runs again from its next period.")),
        "run" => client
            .run_periodic(name)
            .await
            .map(|j| format!("Enqueued job {} for {name}.", j.id)),
        other => {
            return (
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("action: {other:?}"),
            )
                .into_response()
        }
    };
    match done {
        Ok(notice) => panel.notify("/periodic", &notice),
        Err(e) => err_page(&panel, &s, e.into()),
    }
}
