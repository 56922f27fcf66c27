//! A queue's pause and resume from the overview: `/queues/action`.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::{err_page, QueueForm};
use crate::panel::{Panel, Posted};

/// Pause or resume a queue, then back to the overview.
pub async fn queue_action(State(panel): State<Panel>, Posted(s, f): Posted<QueueForm>) -> Response {
    let name = f.name.clone();
    let done = match f.action.as_str() {
        "pause" => panel.app.client.pause_queue(&name).await.map(|_| {
            format!("Paused queue {name}: no process claims from it until it is resumed; running jobs finish.")
        }),
        "resume" => panel.app.client.resume_queue(&name).await.map(|was| {
            if was {
                format!("Resumed queue {name}.")
            } else {
                format!("Queue {name} was not paused.")
            }
        }),
        other => {
            return (
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("action: {other:?}"),
            )
                .into_response()
        }
    };
    match done {
        Ok(notice) => panel.notify(super::back_to(f.back.as_deref()).unwrap_or("/"), &notice),
        Err(e) => err_page(&panel, &s, e.into()),
    }
}
