//! A lease key's pause and resume from the overview: `/keys/action`.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::err_page;
use crate::api::ApiError;
use crate::panel::{Panel, Posted, Session};

/// A key to pause (for `minutes`) or resume.
#[derive(Debug, Deserialize)]
pub struct KeyForm {
    key: String,
    action: String,
    #[serde(default)]
    minutes: Option<String>,
    #[serde(default)]
    reason: Option<String>,
    /// The page to go back to (a job's), else the overview.
    #[serde(default)]
    back: Option<String>,
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
                return refused(&panel, &s, &f, e).await;
            };
            let until = onus::clock::add(
                client.now(),
                std::time::Duration::from_secs(u64::from(m) * 60),
            );
            client
                .pause_key(f.key.trim(), until, f.reason.as_deref().unwrap_or(""))
                .await
                .map(|p| {
                    format!(
                        "Paused {} until {}: {} held.",
                        p.key,
                        super::when(p.until),
                        super::plural(p.held, "waiting job")
                    )
                })
        }
        "resume" => client.resume_key(&f.key).await.map(|out| match out {
            Some(n) => format!("Resumed {}: {} due now.", f.key, super::plural(n, "job")),
            None => format!("{} was not paused.", f.key),
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
        Err(e) if f.action == "pause" && e.fault() == onus::Fault::Caller => {
            refused(&panel, &s, &f, e.into()).await
        }
        Err(e) => err_page(&panel, &s, e.into()),
    }
}

/// The overview again, the pause form filled as sent and its error under the field it names.
async fn refused(panel: &Panel, s: &Session, f: &KeyForm, e: ApiError) -> Response {
    let values = vec![
        ("key", f.key.clone()),
        ("minutes", f.minutes.clone().unwrap_or_default()),
        ("reason", f.reason.clone().unwrap_or_default()),
    ];
    let refill = super::Refill::new(super::overview::KEY_FORM, values, &e);
    super::overview_page(panel, s, Some(&refill)).await
}
