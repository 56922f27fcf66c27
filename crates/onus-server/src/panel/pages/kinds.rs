//! The kinds page: `/kinds`.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use maud::html;

use super::layout;
use crate::panel::{Authed, Panel};

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
