//! The kinds page: `/kinds`.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use maud::html;

use super::{err_page, layout, pairs, plural};
use crate::panel::{Authed, Panel};

/// Kinds, one row each: how it is handled, its queue, its limits (lease key and slots, running
/// cap, rate window, retry budget), a push kind's URL, its jobs by state, its policy; the
/// timeline the policy implies folded under it.
pub async fn kinds(State(panel): State<Panel>, Authed(s): Authed) -> Response {
    let counts = match panel.app.client.store().counts().await {
        Ok(c) => c,
        Err(e) => return err_page(&panel, &s, e.into()),
    };
    let mut by_kind: std::collections::BTreeMap<
        &str,
        std::collections::BTreeMap<onus::JobState, u64>,
    > = Default::default();
    for c in &counts {
        *by_kind
            .entry(c.kind.as_str())
            .or_default()
            .entry(c.state)
            .or_default() += c.count;
    }
    let open = panel.badge().await;
    let body = html! {
        table class="kinds" {
            thead { tr { th { "Kind" } th { "Handled by" } th { "Queue" } th { "Limits" } th { "Jobs by state" } th { "Policy" } } }
            tbody {
                @for k in panel.app.kinds.values() {
                    @let handled = serde_json::to_value(k.handled_by).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default();
                    @let kind = panel.app.client.kind(&k.name);
                    @let by_state = by_kind.get(k.name.as_str()).cloned().unwrap_or_default();
                    tr id=(format!("k-{}", k.name)) {
                        td { strong { (k.name) } }
                        td {
                            (handled)
                            @if let Some(u) = &k.url { br; code { (u) } }
                        }
                        td { a href=(panel.href(&format!("/jobs?{}", pairs(&[("queue", &k.queue)])))) { (k.queue) } }
                        td {
                            @match kind {
                                Some(kind) => {
                                    @if let Some(t) = kind.lease_key_template() {
                                        "lease key " code { (t) } ", " (plural(u64::from(kind.slots()), "slot")) " each" br;
                                    }
                                    @if let Some(n) = kind.running_cap() { "at most " (n) " running" br; }
                                    @if let Some((w, key)) = kind.rate_window() {
                                        (w.max) " per " (onus::policy::human(w.window)) " by " code { (key) }
                                        ", then " (match w.when_spent { onus::limits::WhenSpent::Snooze => "snooze", onus::limits::WhenSpent::Drop => "drop" }) br;
                                    }
                                    @if let Some(b) = kind.own_retry_budget() { "retry budget " (format!("{:.0}%", b.ratio * 100.0)) " of attempts per " (onus::policy::human(b.window)) br; }
                                    @if kind.lease_key_template().is_none() && kind.running_cap().is_none() && kind.rate_window().is_none() && kind.own_retry_budget().is_none() { "-" }
                                }
                                None => { "-" }
                            }
                        }
                        td {
                            @if by_state.is_empty() { "none" }
                            @for (i, (st, n)) in by_state.iter().enumerate() {
                                @if i > 0 { ", " }
                                a href=(panel.href(&format!("/jobs?{}", pairs(&[("kind", &k.name), ("state", st.as_str())])))) { (st.as_str()) " " (n) }
                            }
                        }
                        td {
                            (plural(u64::from(k.policy.max_attempts), "attempt")) ", timeout " (onus::policy::human(k.policy.timeout))
                            details {
                                summary { "Timeline" }
                                pre { (k.policy.timeline()) }
                            }
                        }
                    }
                }
            }
        }
    };
    layout(&panel, Some(&s), "Kinds", open, body).into_response()
}
