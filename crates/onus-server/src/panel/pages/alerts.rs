//! The alerts page: `/alerts`, with acknowledging at `/alerts/ack`.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use maud::html;
use serde::Deserialize;

use super::{err_page, layout, when};
use crate::panel::{Authed, Panel, Posted};

/// Alerts: open first, then acknowledged; acknowledge one or all.
pub async fn alerts(State(panel): State<Panel>, Authed(s): Authed) -> Response {
    let list = match crate::views::alerts::alert_list(&panel.app, crate::views::alerts::MAX_ALERTS)
        .await
    {
        Ok(l) => l,
        Err(e) => return err_page(&panel, &s, e),
    };
    let body = html! {
        @if list.open > 0 {
            form method="post" action=(panel.href("/alerts/ack")) {
                input type="hidden" name="csrf" value=(s.csrf);
                button type="submit" { "Acknowledge all " (list.open) " open alerts" }
            }
        } @else if !list.alerts.is_empty() {
            p { "No open alert: every one below is acknowledged." }
        }
        @if list.alerts.is_empty() { p { "No alert: no job was exhausted." } }
        @else {
            table {
                thead { tr { th { "Raised" } th { "Job" } th { "Kind" } th { "Last error" } th { "Acknowledged" } } }
                tbody {
                    @for a in &list.alerts {
                        tr id=(format!("alert-{}", a.id)) {
                            td { (when(a.created_at)) }
                            td { a href=(panel.href(&format!("/jobs/{}", a.job_id))) { (a.job_id) } }
                            td { (a.kind) }
                            td { (a.message) }
                            td {
                                @if let Some(t) = a.acked_at { (when(t)) }
                                @else {
                                    form method="post" action=(panel.href("/alerts/ack")) {
                                        input type="hidden" name="csrf" value=(s.csrf);
                                        input type="hidden" name="id" value=(a.id);
                                        button type="submit" { "Acknowledge" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    layout(&panel, Some(&s), "Alerts", list.open, body).into_response()
}

#[derive(Debug, Deserialize)]
pub struct AckForm {
    id: Option<i64>,
}

/// Acknowledges one alert, or every open one.
pub async fn alerts_ack(State(panel): State<Panel>, Posted(s, f): Posted<AckForm>) -> Response {
    let done = async {
        let notice = match f.id {
            Some(id) => {
                panel.app.client.ack_alert(id).await?;
                format!("Acknowledged alert {id}.")
            }
            None => {
                let n = panel.app.client.ack_all_alerts().await?;
                format!("Acknowledged {}.", super::plural(n, "alert"))
            }
        };
        Ok::<_, onus::Error>(notice)
    }
    .await;
    match done {
        Ok(notice) => panel.notify("/alerts", &notice),
        Err(e) => err_page(&panel, &s, e.into()),
    }
}
