//! The overview page: `/` (the panel's base path).

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use maud::html;

use super::{err_page, layout, pairs, Refill};
use crate::api::{queues, ApiError};
use crate::panel::{Authed, Panel, Session};

/// Overview: counts per state, queue and kind, throughput and failures over the last hour and
/// day, queues with pause and resume. Every figure comes from the maintained counters and the
/// partial indexes of waiting jobs, so a refresh costs the same at a million jobs as at ten.
pub async fn overview(State(panel): State<Panel>, Authed(s): Authed) -> Response {
    overview_page(&panel, &s, None).await
}

/// The overview, with the key-pause form filled again and its error shown when `refill` holds
/// a refused one (answered 422).
pub(crate) async fn overview_page(panel: &Panel, s: &Session, refill: Option<&Refill>) -> Response {
    let app = &panel.app;
    let now = app.client.now();
    let result = async {
        let counts = app.client.store().counts().await?;
        let qs = queues::queue_list(app).await?;
        let open = panel.badge().await;
        let history = app
            .client
            .store()
            .history(now - chrono::TimeDelta::days(1))
            .await?;
        let keys = app.client.paused_keys().await?;
        Ok::<_, ApiError>((counts, qs, open, history, keys))
    }
    .await;
    let (counts, qs, open, history, keys) = match result {
        Ok(v) => v,
        Err(e) => return err_page(panel, s, e),
    };
    let mut by_state: std::collections::BTreeMap<&str, u64> = Default::default();
    let mut by_kind: std::collections::BTreeMap<&str, u64> = Default::default();
    for r in &counts {
        *by_state.entry(r.state.as_str()).or_default() += r.count;
        *by_kind.entry(r.kind.as_str()).or_default() += r.count;
    }
    let minute = chrono::TimeDelta::minutes(1);
    let half_hour = chrono::TimeDelta::minutes(30);
    let hour = crate::panel::chart::buckets(&history, now, minute, 60);
    let day = crate::panel::chart::buckets(&history, now, half_hour, 48);
    let at = |span: chrono::TimeDelta, n: usize| {
        move |i: usize| {
            let start = now.timestamp().div_euclid(span.num_seconds()) - (n - 1 - i) as i64;
            chrono::DateTime::from_timestamp(start * span.num_seconds(), 0)
                .map(|t| t.format("%H:%M UTC").to_string())
                .unwrap_or_default()
        }
    };
    let body = html! {
        section aria-labelledby="activity" class="charts" {
            h2 id="activity" { "Throughput and failures" }
            (crate::panel::chart::bars("Last hour, by minute", &hour, at(minute, 60), ("1 h ago", "now")))
            (crate::panel::chart::bars("Last day, by half hour", &day, at(half_hour, 48), ("24 h ago", "now")))
        }
        section aria-labelledby="states" {
            h2 id="states" { "Jobs by state" }
            ul class="tiles" {
                @for (state, n) in &by_state {
                    li { a href=(panel.href(&format!("/jobs?{}", pairs(&[("state", state)])))) { span class="n" { (n) } " " (state) } }
                }
            }
        }
        section aria-labelledby="queues" {
            h2 id="queues" { "Queues" }
            table {
                thead { tr { th { "Queue" } th { "Jobs" } th { "Waiting" } th { "Running" } th { "Failing" } th { "Oldest waiting" } th { "State" } th { span class="sr" { "Action" } } } }
                tbody {
                    @for q in &qs.queues {
                        tr {
                            td { a href=(panel.href(&format!("/jobs?{}", pairs(&[("queue", &q.name)])))) { (q.name) } }
                            td { (q.counts.values().sum::<u64>()) }
                            td { (q.waiting) }
                            td { (q.counts.get(&onus::JobState::Running).copied().unwrap_or(0)) }
                            td {
                                a href=(panel.href(&format!("/jobs?{}", pairs(&[("queue", &q.name), ("state", "retryable,discarded")])))) {
                                    (q.counts.get(&onus::JobState::Retryable).copied().unwrap_or(0)
                                        + q.counts.get(&onus::JobState::Discarded).copied().unwrap_or(0))
                                }
                            }
                            td { (format!("{:.1} s", q.oldest_waiting_seconds)) }
                            td { @if q.paused { "paused" } @else { "running" } }
                            td {
                                form method="post" action=(panel.href("/queues/action")) {
                                    input type="hidden" name="csrf" value=(s.csrf);
                                    input type="hidden" name="name" value=(q.name);
                                    @if q.paused {
                                        input type="hidden" name="action" value="resume";
                                        button type="submit" { "Resume " (q.name) }
                                    } @else {
                                        input type="hidden" name="action" value="pause";
                                        button type="submit" { "Pause " (q.name) }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        section aria-labelledby="keys" {
            h2 id="keys" { "Paused keys" }
            @if keys.is_empty() {
                p { "No key is paused. A 429 or 503 with Retry-After pauses the job's lease key until then; so can you, below." }
            } @else {
                table {
                    thead { tr { th { "Key" } th { "Until" } th { "Jobs held" } th { "Why" } th { span class="sr" { "Action" } } } }
                    tbody {
                        @for k in &keys {
                            tr {
                                td { code { (k.key) } }
                                td { (super::when(k.until)) }
                                td { (k.held) }
                                td { (k.reason) }
                                td {
                                    form method="post" action=(panel.href("/keys/action")) {
                                        input type="hidden" name="csrf" value=(s.csrf);
                                        input type="hidden" name="key" value=(k.key);
                                        input type="hidden" name="action" value="resume";
                                        button type="submit" { "Resume " (k.key) }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            (Refill::above(refill, KEY_FORM))
            form method="post" action=(panel.href("/keys/action")) class="inline" id=(KEY_FORM) {
                input type="hidden" name="csrf" value=(s.csrf);
                input type="hidden" name="action" value="pause";
                label { "Key " input type="text" name="key" required placeholder="customer:42"
                    value=(Refill::value(refill, KEY_FORM, "key", "")) aria-invalid=[Refill::invalid(refill, KEY_FORM, "key").then_some("true")];
                    (Refill::under(refill, KEY_FORM, "key")) }
                label { " for minutes " input type="number" name="minutes" min="1" required
                    value=(Refill::value(refill, KEY_FORM, "minutes", "15")) aria-invalid=[Refill::invalid(refill, KEY_FORM, "minutes").then_some("true")];
                    (Refill::under(refill, KEY_FORM, "minutes")) }
                label { " why " input type="text" name="reason" placeholder="their maintenance"
                    value=(Refill::value(refill, KEY_FORM, "reason", "")); }
                " "
                button type="submit" { "Pause key" }
            }
        }
        section aria-labelledby="kinds" {
            h2 id="kinds" { "Jobs by kind" }
            table {
                thead { tr { th { "Kind" } th { "Jobs" } } }
                tbody {
                    @for (kind, n) in &by_kind {
                        tr { td { a href=(panel.href(&format!("/jobs?{}", pairs(&[("kind", kind)])))) { (kind) } } td { (n) } }
                    }
                }
            }
        }
    };
    let page = layout(panel, Some(s), "Overview", open, body);
    if refill.is_some() {
        (axum::http::StatusCode::UNPROCESSABLE_ENTITY, page).into_response()
    } else {
        page.into_response()
    }
}

/// The id of the overview's key-pause form.
pub const KEY_FORM: &str = "pause-key";
