//! A lease key's pause and resume from the overview: `/keys/action`.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::err_page;
use crate::api::ApiError;
use crate::panel::{Panel, Posted};

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
