//! The built-in `http.request` job kind: a durable outbound call for work that must happen (a
//! compensating delete, an index upsert). One attempt per job attempt, classified once; the job
//! layer retries it under the `default` policy (or the kind's configured one).

use std::sync::Arc;
use std::time::Duration;

use onus::{JobContext, JobError, JobResult, Kind, NewJob};
use serde::{Deserialize, Serialize};

use crate::client::{HttpClient, Request};

/// The kind's name.
pub const KIND: &str = "http.request";

/// How long a `Retry-After` may snooze an `http.request` job at most.
pub const SNOOZE_CAP: Duration = Duration::from_secs(10 * 3600);

/// The args of an `http.request` job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpRequestArgs {
    /// `GET`, `POST`, `PUT`, `DELETE`, ...
    pub method: String,
    /// The `http://` or `https://` URL to call (checked by the SSRF guard).
    pub url: String,
    /// Request headers, by name.
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    /// A body: a JSON string is sent as text, any other JSON value as `application/json`.
    #[serde(default)]
    pub body: Option<serde_json::Value>,
}

impl HttpRequestArgs {
    /// Checks args as an inserter sends them, before the job exists: they decode, the method is
    /// a method and the URL an `http` or `https` URL. The error names the field. (Whether the
    /// destination may be reached is the guard's, at each attempt.)
    pub fn check(args: &serde_json::Value) -> Result<HttpRequestArgs, String> {
        let a: HttpRequestArgs = serde_path_to_error::deserialize(args).map_err(|e| {
            let path = e.path().to_string();
            let at = if path == "." {
                "args".to_string()
            } else {
                format!("args.{path}")
            };
            format!("{at}: {}", e.into_inner())
        })?;
        if reqwest::Method::from_bytes(a.method.to_ascii_uppercase().as_bytes()).is_err() {
            return Err(format!("args.method: {:?} is not an HTTP method", a.method));
        }
        match url::Url::parse(&a.url) {
            Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some() => {}
            Ok(u) => {
                return Err(format!(
                    "args.url: {:?} has the scheme {:?}; only http and https are called",
                    a.url,
                    u.scheme()
                ))
            }
            Err(e) => return Err(format!("args.url: {:?} is not a URL ({e})", a.url)),
        }
        for k in a.headers.keys() {
            if reqwest::header::HeaderName::from_bytes(k.as_bytes()).is_err() {
                return Err(format!("args.headers: {k:?} is not a header name"));
            }
        }
        Ok(a)
    }

    /// The job that makes this call.
    pub fn job(&self) -> Result<NewJob, serde_json::Error> {
        Ok(NewJob::new(KIND, serde_json::to_value(self)?))
    }

    fn request(&self) -> Request {
        let mut headers: Vec<(String, String)> = self
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let body = match &self.body {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(s)) => Some(s.clone().into_bytes()),
            Some(v) => {
                if !headers
                    .iter()
                    .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
                {
                    headers.push(("content-type".into(), "application/json".into()));
                }
                Some(v.to_string().into_bytes())
            }
        };
        Request {
            method: self.method.clone(),
            url: self.url.clone(),
            headers,
            body,
        }
    }
}

/// The `http.request` kind, handled with `client`, under the `default` policy.
pub fn kind(client: Arc<HttpClient>) -> Kind {
    let client = Arc::new(client.labelled("http", KIND));
    Kind::new(KIND)
        // Checked at insert, not discarded at the first attempt.
        .check_args(|args| HttpRequestArgs::check(args).map(drop))
        .typed(move |ctx: JobContext, args: HttpRequestArgs| {
            let client = client.clone();
            async move { run(&client, &ctx, &args).await }
        })
}

async fn run(client: &HttpClient, ctx: &JobContext, args: &HttpRequestArgs) -> JobResult {
    let sent = client.send(&args.request(), ctx.now(), SNOOZE_CAP).await;
    tracing::debug!(job = ctx.job().id, status = ?sent.status, class = ?sent.class, "http.request");
    let result = sent.job_result(ctx.job());
    client.record(&sent, &result);
    result.map_err(|e| match e {
        JobError::Discard(m) => {
            JobError::Discard(format!("{} {}: {m}", args.method, args.url).into())
        }
        other => other,
    })
}
