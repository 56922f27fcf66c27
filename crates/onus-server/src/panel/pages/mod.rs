//! The panel's pages, each built from the API's service functions: what they share (the frame,
//! error pages, formatting helpers, common forms) here, one file per page beside it.

use axum::response::{IntoResponse, Response};
use maud::{html, Markup, DOCTYPE};
use serde::Deserialize;

use super::{Panel, Session};
use crate::api::ApiError;

mod alerts;
mod job;
mod jobs;
mod keys;
mod kinds;
mod login;
mod overview;
mod periodic;
mod processes;
mod queues;

pub use alerts::{alerts, alerts_ack, AckForm};
pub use job::{job, job_action, ActionForm};
pub use jobs::{jobs, jobs_bulk, BulkForm};
pub use keys::{key_action, KeyForm};
pub use kinds::kinds;
pub use login::login;
pub use overview::overview;
pub(crate) use overview::overview_page;
pub use periodic::{periodic, periodic_action};
pub use processes::processes;
pub use queues::queue_action;

pub(crate) use crate::views::when;

/// How far `t` is from `now`, as a person says it: "in 4 min", "2 h ago", "now".
pub(crate) fn relative(now: onus::Timestamp, t: onus::Timestamp) -> String {
    let secs = (t - now).num_seconds();
    let a = secs.unsigned_abs();
    let span = match a {
        0..=4 => return "now".into(),
        5..=59 => format!("{a} s"),
        60..=3599 => format!("{} min", a / 60),
        3600..=86_399 => format!("{} h {} min", a / 3600, a % 3600 / 60),
        _ => format!("{} d {} h", a / 86_400, a % 86_400 / 3600),
    };
    if secs > 0 {
        format!("in {span}")
    } else {
        format!("{span} ago")
    }
}

/// A time shown relative to now ("in 4 min"), the absolute time on hover and to machines.
pub(crate) fn at(now: onus::Timestamp, t: onus::Timestamp) -> Markup {
    html! { time datetime=(t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)) title=(when(t)) { (relative(now, t)) } }
}

/// A page to go back to after an action: a job's page only (never another origin).
pub(crate) fn back_to(back: Option<&str>) -> Option<&str> {
    back.filter(|b| {
        b.strip_prefix("/jobs/")
            .is_some_and(|id| !id.is_empty() && id.bytes().all(|c| c.is_ascii_digit()))
    })
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
                link rel="icon" type="image/svg+xml" href=(panel.href("/assets/favicon.svg"));
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
                            a href=(panel.href("/processes")) { "Processes" }
                        }
                        form method="post" action=(panel.href("/logout")) class="logout" {
                            input type="hidden" name="csrf" value=(s.csrf);
                            button type="submit" { "Log out" }
                        }
                        // Hidden until the script shows it: without JavaScript it would do nothing.
                        label class="refresh" hidden { input type="checkbox" id="auto-refresh"; " Refresh every 5 s" }
                    }
                }
                main {
                    h1 { (title) }
                    @if let Some(n) = s.and_then(|s| s.notice.as_deref()) {
                        p class="notice" role="status" { (n) }
                    }
                    (body)
                }
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

/// A form sent back refused: what was typed, to fill it again, and why, shown under the field the
/// error names (`url: ...`) or above the form when it names none of its fields.
#[derive(Debug)]
pub struct Refill {
    /// The form's id.
    form: &'static str,
    values: Vec<(&'static str, String)>,
    field: Option<&'static str>,
    message: String,
}

impl Refill {
    /// `form` (its id) with `values` as sent, refused with `e`.
    pub(crate) fn new(
        form: &'static str,
        values: Vec<(&'static str, String)>,
        e: &ApiError,
    ) -> Self {
        let named = e.message.split_once(':').map(|(f, _)| f.trim());
        let field = values.iter().map(|(n, _)| *n).find(|n| Some(*n) == named);
        Refill {
            form,
            values,
            field,
            message: e.message.clone(),
        }
    }

    /// The value to show in `form`'s field `name`: what was sent, else `default`.
    pub(crate) fn value(this: Option<&Refill>, form: &str, name: &str, default: &str) -> String {
        this.filter(|r| r.form == form)
            .and_then(|r| r.values.iter().find(|(n, _)| *n == name))
            .map_or_else(|| default.to_string(), |(_, v)| v.clone())
    }

    /// The error under `form`'s field `name`, when it is that field's.
    pub(crate) fn under(this: Option<&Refill>, form: &str, name: &str) -> Markup {
        match this.filter(|r| r.form == form && r.field == Some(name)) {
            Some(r) => {
                html! { span class="field-error" role="alert" id=(format!("{form}-{name}-error")) { (r.message) } }
            }
            None => html! {},
        }
    }

    /// The error above `form`, when it names none of its fields.
    pub(crate) fn above(this: Option<&Refill>, form: &str) -> Markup {
        match this.filter(|r| r.form == form && r.field.is_none()) {
            Some(r) => html! { p class="error" role="alert" { (r.message) } },
            None => html! {},
        }
    }

    /// Whether `form`'s field `name` holds the error (for `aria-invalid`).
    pub(crate) fn invalid(this: Option<&Refill>, form: &str, name: &str) -> bool {
        this.is_some_and(|r| r.form == form && r.field == Some(name))
    }
}

/// A queue's pause or resume: the name travels in the form, so any name works.
#[derive(Debug, Deserialize)]
pub struct QueueForm {
    name: String,
    action: String,
    /// The page to go back to (a job's), else the overview.
    #[serde(default)]
    back: Option<String>,
}
