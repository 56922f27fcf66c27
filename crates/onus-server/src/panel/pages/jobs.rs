//! The jobs page: `/jobs`, with its bulk actions at `/jobs/bulk`.

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use maud::{html, Markup};
use serde::Deserialize;

use super::{err_page, layout, when};
use crate::api::ApiError;
use crate::panel::{Authed, Panel, Posted};
use crate::views::jobs::{self, Bulk, BulkBody, ListParams};

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
                        td { (j.errors.last().map(|e| onus::job::shorten(&e.message, 80)).unwrap_or_default()) }
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
