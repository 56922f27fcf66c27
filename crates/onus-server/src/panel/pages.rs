//! The panel's pages, each built from the API's service functions.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{html, Markup, DOCTYPE};
use serde::Deserialize;

use super::{Authed, Panel, Posted, Session};
use crate::api::jobs::{self, Bulk, BulkBody, ListParams};
use crate::api::{queues, ApiError};

/// An instant as the panel shows it: to the second, in UTC.
pub(crate) fn when(t: onus::Timestamp) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// A query string of `pairs`, each value encoded (a name may hold `&`, `#` or `+`).
pub(crate) fn pairs(pairs: &[(&str, &str)]) -> String {
    let mut s = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        s.append_pair(k, v);
    }
    s.finish()
}

/// "1 attempt", "3 attempts".
pub(crate) fn plural(n: u64, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
    }
}

/// The policy's timeline, each attempt still ahead with the time it would run if every attempt
/// before it fails: the next at the job's `run_at` when it waits, or from `now` while one runs;
/// none for a finished job.
fn projected(
    j: &onus::Job,
    p: &onus::Policy,
    now: onus::Timestamp,
) -> Vec<(onus::policy::TimelineStep, Option<onus::Timestamp>)> {
    use onus::JobState as S;
    let steps = p.timeline().steps;
    let offset = |attempt: u32| {
        steps
            .iter()
            .find(|s| s.attempt == attempt)
            .map(|s| s.offset)
    };
    // The anchor: an attempt number and when it runs.
    let anchor = match j.state {
        S::Available | S::Scheduled | S::Retryable | S::Snoozed => Some((j.attempt + 1, j.run_at)),
        S::Running => Some((j.attempt, now)),
        S::Completed | S::Discarded | S::Cancelled => None,
    };
    steps
        .iter()
        .map(|s| {
            let at = anchor
                .filter(|(a, _)| s.attempt > j.attempt && s.attempt >= *a)
                .and_then(|(a, t)| {
                    let from = offset(a)?;
                    let d = chrono::TimeDelta::from_std(s.offset.saturating_sub(from)).ok()?;
                    t.checked_add_signed(d)
                });
            (*s, at)
        })
        .collect()
}

/// The frame of every page: navigation, the open-alert badge, the content.
pub(crate) fn layout(
    panel: &Panel,
    s: Option<&Session>,
    title: &str,
    open_alerts: u64,
    body: Markup,
) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · Onus" }
                link rel="stylesheet" href=(panel.href("/assets/panel.css"));
                script src=(panel.href("/assets/panel.js")) defer {}
            }
            body {
                @if let Some(s) = s {
                    header {
                        nav aria-label="Main" {
                            a href=(panel.href("/")) { "Overview" }
                            a href=(panel.href("/jobs")) { "Jobs" }
                            a href=(panel.href("/alerts")) {
                                "Alerts "
                                @if open_alerts >= super::BADGE_CAP {
                                    span class="badge" title="open alerts" { (super::BADGE_CAP - 1) "+" }
                                } @else if open_alerts > 0 {
                                    span class="badge" title="open alerts" { (open_alerts) }
                                }
                            }
                            a href=(panel.href("/endpoints")) { "Endpoints" }
                            a href=(panel.href("/events")) { "Events" }
                            a href=(panel.href("/periodic")) { "Periodic" }
                            a href=(panel.href("/kinds")) { "Kinds" }
                        }
                        form method="post" action=(panel.href("/logout")) class="logout" {
                            input type="hidden" name="csrf" value=(s.csrf);
                            button type="submit" { "Log out" }
                        }
                        // Hidden until the script shows it: without JavaScript it would do nothing.
                        label class="refresh" hidden { input type="checkbox" id="auto-refresh"; " Refresh every 5 s" }
                    }
                }
                main { h1 { (title) } (body) }
            }
        }
    }
}

pub(crate) fn err_page(panel: &Panel, s: &Session, e: ApiError) -> Response {
    let status = e.status;
    let body = html! { p class="error" role="alert" { (e.message) } };
    (
        status,
        layout(panel, Some(s), "Something went wrong", 0, body),
    )
        .into_response()
}

/// A request refused before it reached a page (no session read): the error and its status.
pub(crate) fn refusal_page(panel: &Panel, e: ApiError) -> Response {
    let body = html! { p class="error" role="alert" { (e.message) } };
    (e.status, layout(panel, None, "Request refused", 0, body)).into_response()
}

/// The login form, with an error to show.
pub fn login(panel: &Panel, error: Option<&str>) -> Markup {
    let body = html! {
        form method="post" action=(panel.href("/login")) class="login" {
            @if let Some(e) = error { p class="error" role="alert" { (e) } }
            label for="token" { "API token or panel password" }
            input id="token" name="token" type="password" autocomplete="current-password" required autofocus;
            p class="hint" { "Print the API token with " code { "onus token show" } "." }
            button type="submit" { "Log in" }
        }
    };
    layout(panel, None, "Log in", 0, body)
}

/// Overview: counts per state, queue and kind, throughput and failures over the last hour and
/// day, queues with pause and resume. Every figure comes from the maintained counters and the
/// partial indexes of waiting jobs, so a refresh costs the same at a million jobs as at ten.
pub async fn overview(State(panel): State<Panel>, Authed(s): Authed) -> Response {
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
        Err(e) => return err_page(&panel, &s, e),
    };
    let mut by_state: std::collections::BTreeMap<&str, u64> = Default::default();
    let mut by_kind: std::collections::BTreeMap<&str, u64> = Default::default();
    for r in &counts {
        *by_state.entry(r.state.as_str()).or_default() += r.count;
        *by_kind.entry(r.kind.as_str()).or_default() += r.count;
    }
    let minute = chrono::TimeDelta::minutes(1);
    let half_hour = chrono::TimeDelta::minutes(30);
    let hour = super::chart::buckets(&history, now, minute, 60);
    let day = super::chart::buckets(&history, now, half_hour, 48);
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
            (super::chart::bars("Last hour, by minute", &hour, at(minute, 60), ("1 h ago", "now")))
            (super::chart::bars("Last day, by half hour", &day, at(half_hour, 48), ("24 h ago", "now")))
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
                                td { (k.until.format("%Y-%m-%d %H:%M:%S UTC")) }
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
            form method="post" action=(panel.href("/keys/action")) class="inline" {
                input type="hidden" name="csrf" value=(s.csrf);
                input type="hidden" name="action" value="pause";
                label { "Key " input type="text" name="key" required placeholder="customer:42"; }
                label { " for minutes " input type="number" name="minutes" min="1" value="15" required; }
                label { " why " input type="text" name="reason" placeholder="their maintenance"; }
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
    layout(&panel, Some(&s), "Overview", open, body).into_response()
}

fn query_of(p: &ListParams) -> String {
    let pairs = [
        ("state", &p.state),
        ("kind", &p.kind),
        ("queue", &p.queue),
        ("tag", &p.tag),
        ("created_after", &p.created_after),
        ("created_before", &p.created_before),
        ("q", &p.q),
        ("limit", &p.limit),
    ];
    let mut s = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        if let Some(v) = v.as_ref().filter(|v| !v.is_empty()) {
            s.append_pair(k, v);
        }
    }
    s.finish()
}

fn filter_form(panel: &Panel, p: &ListParams) -> Markup {
    let v = |o: &Option<String>| o.clone().unwrap_or_default();
    html! {
        form method="get" action=(panel.href("/jobs")) class="filters" {
            label { "State " input name="state" value=(v(&p.state)) placeholder="discarded,retryable"; }
            label { "Kind " input name="kind" value=(v(&p.kind)); }
            label { "Queue " input name="queue" value=(v(&p.queue)); }
            label { "Tag " input name="tag" value=(v(&p.tag)); }
            label { "Created after " input name="created_after" value=(v(&p.created_after)) placeholder="2026-12-01T00:00:00Z"; }
            label { "Created before " input name="created_before" value=(v(&p.created_before)); }
            label { "Text in args " input name="q" value=(v(&p.q)); }
            button type="submit" { "Filter" }
        }
    }
}

/// Jobs: the API's filters, pages, and bulk actions over every match.
pub async fn jobs(
    State(panel): State<Panel>,
    Authed(s): Authed,
    Query(p): Query<ListParams>,
) -> Response {
    let (filter, limit, cursor) = match p.parse() {
        Ok(v) => v,
        Err(e) => return err_page(&panel, &s, e),
    };
    let page = match jobs::page(&panel.app, &filter, limit, cursor).await {
        Ok(p) => p,
        Err(e) => return err_page(&panel, &s, e),
    };
    let open = panel.badge().await;
    let here = query_of(&p);
    let body = html! {
        (filter_form(&panel, &p))
        form method="post" action=(panel.href("/jobs/bulk")) class="bulk" {
            input type="hidden" name="csrf" value=(s.csrf);
            input type="hidden" name="query" value=(here);
            span { "Every job matching the filter: " }
            button name="action" value="retry" { "Retry all" }
            button name="action" value="cancel" { "Cancel all" }
            button name="action" value="delete" { "Delete all" }
        }
        table class="jobs" {
            thead { tr { th { "ID" } th { "Kind" } th { "Queue" } th { "State" } th { "Attempt" } th { "Run at" } th { "Last error" } } }
            tbody {
                @for j in &page.jobs {
                    tr {
                        td { a href=(panel.href(&format!("/jobs/{}", j.id))) { (j.id) } }
                        td { (j.kind) }
                        td { (j.queue) }
                        td { span class=(format!("state {}", j.state.as_str())) { (j.state.as_str()) } }
                        td { (j.attempt) "/" (j.max_attempts) }
                        td { (when(j.run_at)) }
                        td { (j.errors.last().map(|e| e.message.chars().take(80).collect::<String>()).unwrap_or_default()) }
                    }
                }
            }
        }
        @let windowed = page.jobs.len() < limit && page.next_cursor.is_some();
        @if page.jobs.is_empty() && !windowed { p { "No job matches." } }
        @if windowed {
            p class="hint" {
                (page.jobs.len()) " matches on this page: a filtered list reads "
                (jobs::SEARCH_WINDOW) " jobs at a time, newest first, so older jobs may match too."
            }
        }
        @if let Some(c) = &page.next_cursor {
            a class="next" href=(panel.href(&format!("/jobs?{}{}cursor={c}", here, if here.is_empty() { "" } else { "&" }))) {
                @if windowed { "Search older jobs" } @else { "Next page" }
            }
        }
    };
    layout(&panel, Some(&s), "Jobs", open, body).into_response()
}

#[derive(Debug, Deserialize)]
pub struct BulkForm {
    action: String,
    query: String,
    confirm: Option<String>,
}

fn bulk_body(query: &str) -> Result<BulkBody, ApiError> {
    let p: ListParams =
        serde_urlencoded::from_str(query).map_err(|e| ApiError::invalid(format!("filter: {e}")))?;
    let (f, _, _) = p.parse()?;
    Ok(BulkBody {
        states: f.states.iter().map(|s| s.as_str().to_string()).collect(),
        kinds: f.kinds,
        queues: f.queues,
        tags: f.tags,
        created_after: p.created_after,
        created_before: p.created_before,
        q: f.q,
        ..BulkBody::default()
    })
}

/// A bulk action: first a confirmation showing the count (a dry run), then the action.
pub async fn jobs_bulk(State(panel): State<Panel>, Posted(s, f): Posted<BulkForm>) -> Response {
    let action = match f.action.as_str() {
        "retry" => Bulk::Retry,
        "cancel" => Bulk::Cancel,
        "delete" => Bulk::Delete,
        other => return err_page(&panel, &s, ApiError::invalid(format!("action: {other:?}"))),
    };
    let mut body = match bulk_body(&f.query) {
        Ok(b) => b,
        Err(e) => return err_page(&panel, &s, e),
    };
    body.dry_run = f.confirm.as_deref() != Some("yes");
    let answer = match jobs::bulk(&panel.app, action, &body).await {
        Ok(a) => a,
        Err(e) => return err_page(&panel, &s, e),
    };
    let n = answer
        .retried
        .or(answer.cancelled)
        .or(answer.deleted)
        .unwrap_or(0)
        + answer.cancel_requested.unwrap_or(0);
    let done_word = match action {
        Bulk::Retry => "retried",
        Bulk::Cancel => "cancelled",
        Bulk::Delete => "deleted",
    };
    let back = panel.href(&format!("/jobs?{}", f.query));
    let page = html! {
        @if body.dry_run {
            p { (answer.matched) " jobs match; " (n) " can be " (done_word) "." }
            form method="post" action=(panel.href("/jobs/bulk")) {
                input type="hidden" name="csrf" value=(s.csrf);
                input type="hidden" name="query" value=(f.query);
                input type="hidden" name="action" value=(f.action);
                input type="hidden" name="confirm" value="yes";
                button type="submit" class="danger" { "Yes, " (f.action) " " (n) " jobs" }
                " " a href=(back) { "No, go back" }
            }
        } @else {
            p role="status" { (n) " of " (answer.matched) " matching jobs " (done_word) "; " (answer.refused) " left as they were." }
            a href=(back) { "Back to the jobs" }
        }
    };
    let open = panel.badge().await;
    layout(&panel, Some(&s), "Every matching job", open, page).into_response()
}

/// A job: args, every attempt and snooze, its policy and the projected remaining attempts.
pub async fn job(
    State(panel): State<Panel>,
    Authed(s): Authed,
    Path(id): Path<String>,
) -> Response {
    let found = async {
        let id = jobs::job_id(&id)?;
        Ok::<_, ApiError>(panel.app.client.get(id).await?)
    }
    .await;
    let j = match found {
        Ok(j) => j,
        Err(e) => return err_page(&panel, &s, e),
    };
    let policy = panel.app.kinds.get(&j.kind).map(|k| k.policy.clone());
    let open = panel.badge().await;
    let args = serde_json::to_string_pretty(&j.args).unwrap_or_default();
    let now = panel.app.client.now();
    let body = html! {
        dl class="facts" {
            dt { "Kind" } dd { (j.kind) }
            dt { "Queue" } dd { (j.queue) }
            dt { "State" } dd { span class=(format!("state {}", j.state.as_str())) { (j.state.as_str()) }
                @if let Some(r) = j.discard_reason { " (" (r.as_str()) ")" } }
            dt { "Attempt" } dd { (j.attempt) " of " (j.max_attempts) ", " (plural(j.snoozes.into(), "snooze")) }
            dt { "Run at" } dd { (when(j.run_at)) }
            dt { "Created" } dd { (when(j.created_at)) }
            @if let Some(t) = j.finalized_at { dt { "Finished" } dd { (when(t)) } }
            @if !j.tags.is_empty() { dt { "Tags" } dd { (j.tags.join(", ")) } }
            @if let Some(k) = &j.lease_key { dt { "Lease key" } dd { code { (k) } } }
            @if let Some(p) = &j.progress {
                dt { "Progress" }
                dd class="progress" {
                    progress max="1" value=(p.fraction) { (format!("{:.0}%", p.fraction * 100.0)) }
                    " " (format!("{:.0}%", p.fraction * 100.0))
                    @if !p.message.is_empty() { ", " (p.message) }
                    " (" (when(p.at)) ")"
                }
            }
        }
        @let retry = onus::store::RETRYABLE_STATES.contains(&j.state);
        @let cancel = onus::store::CANCELLABLE_STATES.contains(&j.state);
        @if retry || cancel {
            div class="actions" {
                @for (action, label, shown) in [("retry", "Retry", retry), ("cancel", "Cancel", cancel)] {
                    @if shown {
                        form method="post" action=(panel.href(&format!("/jobs/{}/action", j.id))) {
                            input type="hidden" name="csrf" value=(s.csrf);
                            input type="hidden" name="action" value=(action);
                            button type="submit" { (label) }
                        }
                    }
                }
            }
        }
        h2 { "Args" }
        pre class="args" { (args) }
        @if let Some(r) = &j.result {
            h2 { "Result" }
            pre class="result" { (serde_json::to_string_pretty(r).unwrap_or_default()) }
        }
        h2 { "History" }
        @if j.errors.is_empty() { p { "No failed attempt or snooze." } }
        @else {
            table {
                thead { tr { th { "When" } th { "Attempt" } th { "Class" } th { "Message" } } }
                tbody { @for e in &j.errors { tr {
                    td { (when(e.at)) } td { (e.attempt) }
                    td { (serde_json::to_value(e.class).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default()) }
                    td { (e.message) }
                } } }
            }
        }
        @if let Some(p) = policy {
            h2 { "Policy" }
            pre { (format!("{}, backoff {}, jitter +/-{:.0}%, timeout {}", plural(p.max_attempts.into(), "attempt"), p.backoff, p.jitter * 100.0, onus::policy::human(p.timeout))) }
            h3 { "Timeline" }
            p class="hint" { "Each attempt's nominal time after the first; for the attempts still ahead, the time they would run if every one before them fails (jitter moves each by up to " (format!("{:.0}", p.jitter * 100.0)) "%)." }
            ol class="timeline" {
                @for (step, at) in projected(&j, &p, now) {
                    li class=(if step.attempt <= j.attempt { "done" } else { "ahead" }) {
                        span class="dot" aria-hidden="true" {}
                        span { "attempt " (step.attempt) } " "
                        span class="hint" { "+" (onus::policy::human(step.offset)) }
                        @if let Some(at) = at { br; span class="at" { (when(at)) } }
                    }
                }
            }
        }
    };
    layout(&panel, Some(&s), &format!("Job {}", j.id), open, body).into_response()
}

/// A queue's pause or resume: the name travels in the form, so any name works.
#[derive(Debug, Deserialize)]
pub struct QueueForm {
    name: String,
    action: String,
}

#[derive(Debug, Deserialize)]
pub struct ActionForm {
    action: String,
}

/// Retry or cancel one job, then back to its page.
pub async fn job_action(
    State(panel): State<Panel>,
    Path(id): Path<String>,
    Posted(s, f): Posted<ActionForm>,
) -> Response {
    let done = async {
        let id = jobs::job_id(&id)?;
        match f.action.as_str() {
            "retry" => {
                panel.app.client.retry(id).await?;
            }
            "cancel" => {
                panel.app.client.cancel(id).await?;
            }
            other => return Err(ApiError::invalid(format!("action: {other:?}"))),
        }
        Ok(id)
    }
    .await;
    match done {
        Ok(id) => panel.redirect(&format!("/jobs/{id}")),
        Err(e) => err_page(&panel, &s, e),
    }
}

/// Pause or resume a queue, then back to the overview.
pub async fn queue_action(State(panel): State<Panel>, Posted(s, f): Posted<QueueForm>) -> Response {
    let name = f.name;
    let done = match f.action.as_str() {
        "pause" => panel.app.client.pause_queue(&name).await.map(|_| ()),
        "resume" => panel.app.client.resume_queue(&name).await.map(|_| ()),
        other => {
            return (
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("action: {other:?}"),
            )
                .into_response()
        }
    };
    match done {
        Ok(()) => panel.redirect("/"),
        Err(e) => err_page(&panel, &s, e.into()),
    }
}

/// A key to pause (for `minutes`) or resume.
#[derive(Debug, Deserialize)]
pub struct KeyForm {
    key: String,
    action: String,
    #[serde(default)]
    minutes: Option<String>,
    #[serde(default)]
    reason: Option<String>,
}

/// Pauses or resumes a key, then shows the overview.
pub async fn key_action(State(panel): State<Panel>, Posted(s, f): Posted<KeyForm>) -> Response {
    let client = &panel.app.client;
    let done = match f.action.as_str() {
        "pause" => {
            let minutes = f.minutes.as_deref().unwrap_or("").trim();
            let Some(m) = minutes
                .parse::<u32>()
                .ok()
                .filter(|m| (1..=525_600).contains(m))
            else {
                let e = ApiError::invalid(format!(
                    "minutes: {minutes:?} is not a pause; give 1 to 525600 minutes"
                ));
                return err_page(&panel, &s, e);
            };
            let until = onus::clock::add(
                client.now(),
                std::time::Duration::from_secs(u64::from(m) * 60),
            );
            client
                .pause_key(f.key.trim(), until, f.reason.as_deref().unwrap_or(""))
                .await
                .map(|_| ())
        }
        "resume" => client.resume_key(&f.key).await.map(|_| ()),
        other => {
            return (
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("action: {other:?}"),
            )
                .into_response()
        }
    };
    match done {
        Ok(()) => panel.redirect("/"),
        Err(e) => err_page(&panel, &s, e.into()),
    }
}

/// Alerts: open first, then acknowledged; acknowledge one or all.
pub async fn alerts(State(panel): State<Panel>, Authed(s): Authed) -> Response {
    let list =
        match crate::api::alerts::alert_list(&panel.app, crate::api::alerts::MAX_ALERTS).await {
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
                        tr {
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
        match f.id {
            Some(id) => {
                panel.app.client.ack_alert(id).await?;
            }
            None => {
                panel.app.client.ack_all_alerts().await?;
            }
        }
        Ok::<_, onus::Error>(())
    }
    .await;
    match done {
        Ok(()) => panel.redirect("/alerts"),
        Err(e) => err_page(&panel, &s, e.into()),
    }
}

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
    let done = match f.action.as_str() {
        "pause" => client.pause_periodic(&f.name).await,
        "resume" => client.resume_periodic(&f.name).await,
        "run" => client.run_periodic(&f.name).await.map(|_| ()),
        other => {
            return (
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("action: {other:?}"),
            )
                .into_response()
        }
    };
    match done {
        Ok(()) => panel.redirect("/periodic"),
        Err(e) => err_page(&panel, &s, e.into()),
    }
}

/// Kinds: how each is handled, its queue, policy and the timeline it implies.
pub async fn kinds(State(panel): State<Panel>, Authed(s): Authed) -> Response {
    let open = panel.badge().await;
    let body = html! {
        @for k in panel.app.kinds.values() {
            section aria-labelledby=(format!("k-{}", k.name)) {
                h2 id=(format!("k-{}", k.name)) { (k.name) }
                p {
                    (serde_json::to_value(k.handled_by).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default())
                    " · queue " (k.queue)
                    @if let Some(u) = &k.url { " · " code { (u) } }
                }
                pre { (k.policy.timeline()) }
            }
        }
    };
    layout(&panel, Some(&s), "Kinds", open, body).into_response()
}
