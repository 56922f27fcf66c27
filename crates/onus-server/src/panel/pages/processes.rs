//! The processes page: `/processes`, what runs where (every `onus serve` process and named pull
//! worker seen in the last hour, as `GET /processes` answers).

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use maud::html;

use super::{at, err_page, layout, plural};
use crate::panel::{Authed, Panel};

/// Every process seen in the last hour: its queues and slots, running jobs, last heartbeat.
pub async fn processes(State(panel): State<Panel>, Authed(s): Authed) -> Response {
    let p = match panel.app.client.processes().await {
        Ok(p) => p,
        Err(e) => return err_page(&panel, &s, e.into()),
    };
    let open = panel.badge().await;
    let now = panel.app.client.now();
    let body = html! {
        p class="hint" {
            "Every " code { "onus serve" } " process writes that it is there every 10 s and removes itself when it stops; "
            "one not seen for 30 s is shown as gone, and forgotten after an hour. A pull worker is listed when it names itself ("
            code { "worker" } " in its claims)."
        }
        @if p.processes.is_empty() { p { "No process seen in the last hour." } }
        @else {
            table {
                thead { tr { th { "Process" } th { "Role" } th { "Queues (slots) / kinds" } th { "Running" } th { "Last seen" } th { "Started" } } }
                tbody {
                    @for q in &p.processes {
                        tr class=(if q.live { "" } else { "gone" }) {
                            td {
                                code class="id" { (q.id) }
                                " "
                                @if q.live { span class="state live" { "live" } }
                                @else { span class="state gone" { "gone" } }
                                @if let Some(pid) = q.pid { br; small { (q.host) ", pid " (pid) ", Onus " (q.version) } }
                            }
                            td { @match q.role { onus::ProcessRole::Runtime => "runtime", onus::ProcessRole::Pull => "pull worker" } }
                            td {
                                @if q.queues.is_empty() { (q.kinds.join(", ")) }
                                @else {
                                    @for (i, qs) in q.queues.iter().enumerate() {
                                        @if i > 0 { ", " }
                                        a href=(panel.href(&format!("/jobs?{}", super::pairs(&[("queue", &qs.name)])))) { (qs.name) } " (" (qs.slots) ")"
                                    }
                                }
                            }
                            td {
                                (q.running)
                                @if !q.jobs.is_empty() {
                                    details {
                                        summary { (plural(q.running, "job")) }
                                        ul {
                                            @for j in &q.jobs {
                                                li {
                                                    a href=(panel.href(&format!("/jobs/{}", j.id))) { "#" (j.id) }
                                                    " " (j.kind)
                                                    @if let Some(t) = j.attempted_at { " since " (at(now, t)) }
                                                }
                                            }
                                            @if q.running > q.jobs.len() as u64 { li { "and " (q.running - q.jobs.len() as u64) " more" } }
                                        }
                                    }
                                }
                            }
                            td { (at(now, q.seen_at)) }
                            td { (at(now, q.started_at)) }
                        }
                    }
                }
            }
        }
        @if p.pulled_running > 0 {
            p { (plural(p.pulled_running, "running job")) " leased to pull workers: "
                a href=(panel.href("/jobs?state=running")) { "see them" } "." }
        }
        @if p.orphaned_running > 0 {
            p class="error" { (plural(p.orphaned_running, "running job")) " of processes not seen in the last hour: the rescuer ends them when their leases lapse." }
        }
    };
    layout(&panel, Some(&s), "Processes", open, body).into_response()
}
