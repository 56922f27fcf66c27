//! The jobs page: `/jobs`, with its bulk actions at `/jobs/bulk`.

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use maud::{html, Markup};
use serde::Deserialize;

use super::{at, err_page, layout};
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

fn filter_form(panel: &Panel, p: &ListParams, kinds: &[String], queues: &[String]) -> Markup {
    let v = |o: &Option<String>| o.clone().unwrap_or_default();
    html! {
        form method="get" action=(panel.href("/jobs")) class="filters" {
            input type="hidden" name="state" value=(v(&p.state));
            label { "Kind " input name="kind" value=(v(&p.kind)) list="kinds" placeholder="any"; }
            datalist id="kinds" { @for k in kinds { option value=(k) {} } }
            label { "Queue " input name="queue" value=(v(&p.queue)) list="queues" placeholder="any"; }
            datalist id="queues" { @for q in queues { option value=(q) {} } }
            label { "Tag " input name="tag" value=(v(&p.tag)); }
            label { "Created after " input name="created_after" value=(v(&p.created_after)) placeholder="2026-12-01T00:00:00Z"; }
            label { "Created before " input name="created_before" value=(v(&p.created_before)); }
            label { "Text in args " input name="q" value=(v(&p.q)); }
            button type="submit" { "Filter" }
        }
    }
}

/// The states, in the order the tabs show them.
const STATES: [onus::JobState; 8] = [
    onus::JobState::Available,
    onus::JobState::Scheduled,
    onus::JobState::Running,
    onus::JobState::Retryable,
    onus::JobState::Snoozed,
    onus::JobState::Completed,
    onus::JobState::Discarded,
    onus::JobState::Cancelled,
];

/// Tabs by state, each with how many jobs of the chosen kinds and queues are in it (from the
/// maintained counters: the same cost at a million jobs as at ten).
fn state_tabs(
    panel: &Panel,
    p: &ListParams,
    counts: &[onus::store::CountRow],
    filter: &onus::JobFilter,
) -> Markup {
    let of = |state: Option<onus::JobState>| -> u64 {
        counts
            .iter()
            .filter(|c| filter.kinds.is_empty() || filter.kinds.contains(&c.kind))
            .filter(|c| filter.queues.is_empty() || filter.queues.contains(&c.queue))
            .filter(|c| state.is_none_or(|s| c.state == s))
            .map(|c| c.count)
            .sum()
    };
    let current = p.state.clone().unwrap_or_default();
    let link = |state: &str| {
        let q = ListParams {
            state: Some(state.to_string()),
            cursor: None,
            ..p.clone()
        };
        panel.href(&format!("/jobs?{}", query_of(&q)))
    };
    let narrowed =
        p.tag.is_some() || p.q.is_some() || p.created_after.is_some() || p.created_before.is_some();
    html! {
        nav class="tabs" aria-label="States" {
            a href=(link("")) aria-current=[current.is_empty().then_some("page")] { "All " span class="n" { (of(None)) } }
            @for st in STATES {
                a href=(link(st.as_str())) aria-current=[(current == st.as_str()).then_some("page")] class=(format!("state {}", st.as_str())) {
                    (st.as_str()) " " span class="n" { (of(Some(st))) }
                }
            }
        }
        @if narrowed { p class="hint" { "Counts are of the chosen kinds and queues; the other filters narrow the list below." } }
    }
}

/// Jobs: state tabs with counts, the API's filters, pages, and bulk actions over the chosen jobs
/// or every match.
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
    let counts = match panel.app.client.store().counts().await {
        Ok(c) => c,
        Err(e) => return err_page(&panel, &s, e.into()),
    };
    let mut kinds: Vec<String> = panel.app.kinds.keys().cloned().collect();
    kinds.extend(counts.iter().map(|c| c.kind.clone()));
    kinds.sort();
    kinds.dedup();
    let mut queues: Vec<String> = panel.app.queues.clone();
    queues.extend(panel.app.kinds.values().map(|k| k.queue.clone()));
    queues.extend(counts.iter().map(|c| c.queue.clone()));
    queues.sort();
    queues.dedup();
    let open = panel.badge().await;
    let now = panel.app.client.now();
    let here = query_of(&p);
    let body = html! {
        (state_tabs(&panel, &p, &counts, &filter))
        (filter_form(&panel, &p, &kinds, &queues))
        form method="post" action=(panel.href("/jobs/bulk")) class="bulk" {
            input type="hidden" name="csrf" value=(s.csrf);
            input type="hidden" name="query" value=(here);
            span { "Every job matching the filter: " }
            button name="action" value="retry" { "Retry all" }
            button name="action" value="cancel" { "Cancel all" }
            button name="action" value="delete" { "Delete all" }
        }
        @if !page.jobs.is_empty() {
            form method="post" action=(panel.href("/jobs/bulk")) class="bulk" id="chosen" {
                input type="hidden" name="csrf" value=(s.csrf);
                input type="hidden" name="query" value=(here);
                input type="hidden" name="scope" value="chosen";
                span { "The jobs ticked below: " }
                button name="action" value="retry" { "Retry chosen" }
                button name="action" value="cancel" { "Cancel chosen" }
                button name="action" value="delete" { "Delete chosen" }
            }
        }
        table class="jobs" {
            thead { tr { th { span class="sr" { "Choose" } } th { "ID" } th { "Kind" } th { "Queue" } th { "State" } th { "Attempt" } th { "Run at" } th { "Last error" } } }
            tbody {
                @for j in &page.jobs {
                    tr {
                        td { input type="checkbox" name="ids" value=(j.id) form="chosen" aria-label=(format!("choose job {}", j.id)); }
                        td { a href=(panel.href(&format!("/jobs/{}", j.id))) { (j.id) } }
                        td { (j.kind) }
                        td { (j.queue) }
                        td { span class=(format!("state {}", j.state.as_str())) { (j.state.as_str()) } }
                        td { (j.attempt) "/" (j.max_attempts) }
                        td { (at(now, j.run_at)) }
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
    /// Chosen jobs (comma-separated): the action applies to them only, not to the filter.
    #[serde(default)]
    ids: Option<String>,
    /// `chosen` when the form is the one of the ticked jobs: with none ticked it acts on none
    /// (a browser sends no `ids` then), never on the whole filter.
    #[serde(default)]
    scope: Option<String>,
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
    let chosen: Vec<onus::JobId> = f
        .ids
        .as_deref()
        .unwrap_or_default()
        .split(',')
        .filter_map(|v| v.trim().parse().ok())
        .collect();
    if (f.ids.is_some() || f.scope.as_deref() == Some("chosen")) && chosen.is_empty() {
        return err_page(
            &panel,
            &s,
            ApiError::invalid(
                "ids: tick at least one job, or use the buttons for every job matching the filter",
            ),
        );
    }
    let mut body = if chosen.is_empty() {
        match bulk_body(&f.query) {
            Ok(b) => b,
            Err(e) => return err_page(&panel, &s, e),
        }
    } else {
        BulkBody {
            ids: chosen.clone(),
            ..BulkBody::default()
        }
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
                @if !chosen.is_empty() {
                    input type="hidden" name="scope" value="chosen";
                    input type="hidden" name="ids" value=(chosen.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(","));
                }
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
