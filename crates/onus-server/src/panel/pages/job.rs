//! The job page: `/jobs/{id}`, with its retry and cancel at `/jobs/{id}/action`.

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use maud::html;
use serde::Deserialize;

use super::{at, err_page, layout, plural, when};
use crate::api::ApiError;
use crate::panel::{Authed, Panel, Posted};
use crate::views::jobs;
use crate::views::why::{self, Remedy};

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

/// When each attempt that ran, ran: a failed one when it ended (its history entry), the last one
/// when it started.
fn ran_at(j: &onus::Job) -> std::collections::BTreeMap<u32, onus::Timestamp> {
    use onus::EntryClass as C;
    let mut ran: std::collections::BTreeMap<u32, onus::Timestamp> = j
        .errors
        .iter()
        .filter(|e| {
            matches!(
                e.class,
                C::Error | C::Panic | C::Timeout | C::WorkerLost | C::Discard | C::Cancelled
            )
        })
        .map(|e| (e.attempt, e.at))
        .collect();
    if let (Some(t), true) = (j.attempted_at, j.attempt > 0) {
        ran.entry(j.attempt).or_insert(t);
    }
    ran
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
    // Why it waits, the alerts it raised, what its mail did: each read apart, a failure of one
    // leaving the rest of the page.
    let waits = why::why_waits(&panel.app, &j, now).await.ok().flatten();
    let alerts = panel
        .app
        .client
        .alerts_of_job(j.id)
        .await
        .unwrap_or_default();
    let mail = if j.kind == onus_mail::SEND {
        let db = onus::store::Db::new(panel.app.client.store().clone());
        onus_mail::sent_record(&db, j.id).await.ok().flatten()
    } else {
        None
    };
    let delivery = why::delivery_of(&j);
    let running = j.state == onus::JobState::Running;
    let retry = onus::store::RETRYABLE_STATES.contains(&j.state);
    let cancel = onus::store::CANCELLABLE_STATES.contains(&j.state);
    let back = format!("/jobs/{}", j.id);
    let body = html! {
        @if let Some(w) = &waits {
            div class="why" role="status" {
                strong { "Why it waits: " } (w.reason)
                @if let Some(t) = w.until { " Until " (when(t)) " (" (at(now, t)) ")." }
                @match &w.remedy {
                    Some(Remedy::ResumeQueue(q)) => {
                        form method="post" action=(panel.href("/queues/action")) {
                            input type="hidden" name="csrf" value=(s.csrf);
                            input type="hidden" name="name" value=(q);
                            input type="hidden" name="action" value="resume";
                            input type="hidden" name="back" value=(back);
                            button type="submit" { "Resume queue " (q) }
                        }
                    }
                    Some(Remedy::ResumeKey(k)) => {
                        form method="post" action=(panel.href("/keys/action")) {
                            input type="hidden" name="csrf" value=(s.csrf);
                            input type="hidden" name="key" value=(k);
                            input type="hidden" name="action" value="resume";
                            input type="hidden" name="back" value=(back);
                            button type="submit" { "Resume key " (k) }
                        }
                    }
                    Some(Remedy::Endpoint(ep)) => {
                        p { a href=(panel.href(&format!("/endpoints/{ep}"))) { "Open endpoint " (ep) } }
                    }
                    None => {}
                }
            }
        }
        dl class="facts" {
            dt { "Kind" } dd { (j.kind) }
            dt { "Queue" } dd { (j.queue) }
            dt { "State" } dd { span class=(format!("state {}", j.state.as_str())) { (j.state.as_str()) }
                @if let Some(r) = j.discard_reason { " (" (r.as_str()) ")" } }
            dt { "Attempt" } dd { (j.attempt) " of " (j.max_attempts) ", " (plural(j.snoozes.into(), "snooze")) }
            @if j.finalized_at.is_none() { dt { "Run at" } dd { (when(j.run_at)) " (" (at(now, j.run_at)) ")" } }
            dt { "Created" } dd { (when(j.created_at)) }
            @if let Some(t) = j.attempted_at { dt { "Last attempt started" } dd { (when(t)) " (" (at(now, t)) ")" } }
            @if let Some(t) = j.finalized_at { dt { "Finished" } dd { (when(t)) " (" (at(now, t)) ")" } }
            @if running {
                @if let (Some(o), Some(t)) = (&j.lease_owner, j.lease_expires_at) {
                    dt { "Running in" } dd { a href=(panel.href("/processes")) { code { (o) } } ", lease until " (when(t)) }
                }
            }
            @if !j.tags.is_empty() { dt { "Tags" } dd { (j.tags.join(", ")) } }
            @if let Some(k) = &j.lease_key { dt { "Lease key" } dd { code { (k) } } }
            @if let Some((ep, ev)) = &delivery {
                dt { "Endpoint" } dd { a href=(panel.href(&format!("/endpoints/{ep}"))) { (ep) } }
                dt { "Event" } dd { a href=(panel.href(&format!("/events/{ev}"))) { (ev) } }
            }
            @for a in &alerts {
                dt { "Alert" } dd {
                    a href=(panel.href(&format!("/alerts#alert-{}", a.id))) { "alert " (a.id) } " raised " (when(a.created_at))
                    @if let Some(t) = a.acked_at { ", acknowledged " (when(t)) } @else { ", open" }
                }
            }
            @if let Some(p) = &j.progress {
                @if running {
                    dt { "Progress" }
                    dd class="progress" {
                        progress max="1" value=(p.fraction) { (format!("{:.0}%", p.fraction * 100.0)) }
                        " " (format!("{:.0}%", p.fraction * 100.0))
                        @if !p.message.is_empty() { ", " (p.message) }
                        " (" (when(p.at)) ")"
                    }
                } @else {
                    dt { "Last reported progress" }
                    dd { (format!("{:.0}%", p.fraction * 100.0))
                        @if !p.message.is_empty() { ", " (p.message) }
                        " at " (when(p.at)) ", while an attempt ran" }
                }
            }
        }
        @if retry || cancel {
            div class="actions" {
                @for (action, label, shown) in [("retry", if j.finalized_at.is_none() { "Run now" } else { "Retry" }, retry), ("cancel", "Cancel", cancel)] {
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
        @if let Some(m) = &mail {
            h2 { "Mail" }
            dl class="facts" {
                dt { "Message-ID" } dd { code { (m.message_id) } }
                dt { "Accepted by the relay" } dd { (when(m.sent_at)) ", attempt " (m.attempt) }
                dt { "Recipients taken" } dd { @if m.accepted.is_empty() { "none" } @else { (m.accepted.join(", ")) } }
                @for r in &m.refused {
                    dt { "Refused" } dd { (r.address) ": " (r.reply) }
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
            @let finished = j.finalized_at.is_some();
            @let ran = ran_at(&j);
            p class="hint" {
                "Each attempt that ran, with when it ran (a failed one: when it failed)"
                @if !finished { "; each still ahead, with the time it would run if every one before it fails (jitter moves each by up to " (format!("{:.0}", p.jitter * 100.0)) "%)" }
                "."
            }
            ol class="timeline" {
                @for (step, ahead_at) in projected(&j, &p, now) {
                    @if step.attempt <= j.attempt {
                        li class="done" {
                            span class="dot" aria-hidden="true" {}
                            span { "attempt " (step.attempt) } " "
                            @if let Some(t) = ran.get(&step.attempt) { br; span class="at" { (when(*t)) } }
                            @else { span class="hint" { "+" (onus::policy::human(step.offset)) } }
                        }
                    } @else if !finished {
                        li class="ahead" {
                            span class="dot" aria-hidden="true" {}
                            span { "attempt " (step.attempt) } " "
                            span class="hint" { "+" (onus::policy::human(step.offset)) }
                            @if let Some(t) = ahead_at { br; span class="at" { (when(t)) } }
                        }
                    }
                }
            }
            @if finished && j.max_attempts > j.attempt {
                p class="hint" { (plural(u64::from(j.max_attempts - j.attempt), "more attempt")) " allowed by the policy; none will run unless the job is retried." }
            }
        }
    };
    layout(&panel, Some(&s), &format!("Job {}", j.id), open, body).into_response()
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
        let notice = match f.action.as_str() {
            "retry" => {
                let j = panel.app.client.retry(id).await?;
                format!("Retried job {id}: attempt {} is due now.", j.attempt + 1)
            }
            "cancel" => {
                let out = panel.app.client.cancel(id).await?;
                if out.requested.contains(&id) {
                    format!("Asked job {id} to stop: it ends cancelled when its handler returns.")
                } else {
                    format!("Cancelled job {id}.")
                }
            }
            other => return Err(ApiError::invalid(format!("action: {other:?}"))),
        };
        Ok((id, notice))
    }
    .await;
    match done {
        Ok((id, notice)) => panel.notify(&format!("/jobs/{id}"), &notice),
        Err(e) => err_page(&panel, &s, e),
    }
}
