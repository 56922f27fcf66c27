//! Push kinds: workers in any language that the server calls. Each attempt of a job of the kind
//! is one POST of `{id, kind, args, attempt}` to the kind's URL, signed per Standard Webhooks
//! (`webhook-id` is `job_<id>` on every attempt, so a receiver can deduplicate), through the one
//! outbound client (SSRF guard, `[http] allow_networks`), and the answer is classified with the
//! one table: 2xx completed; 429/503 with Retry-After snoozed; 408, 429, 5xx and timeouts
//! retryable; other 4xx discarded. The kind's policy alone decides when to try again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use onus::{JobContext, JobError, JobResult, Kind};
use onus_http::HttpClient;
use tokio::sync::OnceCell;

use crate::secrets::{self, Secrets};

/// The longest a `Retry-After` may snooze a push attempt.
pub const SNOOZE_CAP: Duration = Duration::from_secs(10 * 3600);
/// A push request's time limit unless the kind sets `timeout`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a push kind's signing secret comes from.
#[derive(Clone)]
pub struct PushSecret {
    kind: String,
    configured: Option<String>,
    secrets: Secrets,
    kept: Arc<OnceCell<String>>,
}

impl std::fmt::Debug for PushSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PushSecret")
            .field("kind", &self.kind)
            .field("configured", &self.configured.is_some())
            .finish_non_exhaustive()
    }
}

impl PushSecret {
    /// The configured secret of `kind`, else the one kept in the database (made on first use;
    /// every process sharing the database signs with the same one).
    pub fn new(kind: &str, configured: Option<String>, secrets: Secrets) -> Self {
        PushSecret {
            kind: kind.to_string(),
            configured,
            secrets,
            kept: Arc::new(OnceCell::new()),
        }
    }

    /// The secret.
    pub async fn get(&self) -> Result<String, onus::StoreError> {
        if let Some(s) = &self.configured {
            return Ok(s.clone());
        }
        self.kept
            .get_or_try_init(|| async {
                let (v, _) = self
                    .secrets
                    .ensure(
                        &secrets::kind_secret_name(&self.kind),
                        onus_webhooks::signing::new_secret(),
                        chrono::Utc::now(),
                    )
                    .await?;
                Ok(v.value)
            })
            .await
            .cloned()
    }
}

/// A push kind's settings.
#[derive(Debug, Clone)]
pub struct Push {
    /// The kind.
    pub kind: String,
    /// Where its jobs are POSTed.
    pub url: String,
    /// Headers sent with every request.
    pub headers: BTreeMap<String, String>,
    /// Time for one request.
    pub timeout: Duration,
    /// Its signing secret.
    pub secret: PushSecret,
}

impl Push {
    /// The kind, handled by POSTing each job with `http`.
    pub fn into_kind(self, http: Arc<HttpClient>) -> Kind {
        let http = Arc::new(http.labelled("push", &self.kind));
        let push = Arc::new(self);
        Kind::new(push.kind.clone()).handler(move |ctx: JobContext| {
            let push = push.clone();
            let http = http.clone();
            async move { push.run(&http, &ctx).await }
        })
    }

    /// The signed request for this attempt.
    async fn request(&self, ctx: &JobContext) -> Result<onus_http::Request, JobError> {
        let job = ctx.job();
        // The database is unreachable: nothing was sent, try again later.
        let secret = self.secret.get().await?;
        let body = serde_json::to_vec(&serde_json::json!({
            "id": job.id, "kind": job.kind, "args": job.args, "attempt": job.attempt,
        }))
        .map_err(JobError::discard_err)?;
        let id = format!("job_{}", job.id);
        let headers = onus_webhooks::signing::signed_headers(
            &self.headers,
            &[secret],
            &id,
            ctx.now().timestamp(),
            &body,
        )
        .map_err(JobError::discard_err)?;
        Ok(onus_http::Request {
            method: "POST".into(),
            url: self.url.clone(),
            headers,
            body: Some(body),
        })
    }

    async fn run(&self, http: &HttpClient, ctx: &JobContext) -> JobResult {
        let job = ctx.job();
        let req = match self.request(ctx).await {
            Ok(r) => r,
            Err(e) => {
                // An attempt that sends nothing counts as such.
                http.record_unsent();
                return Err(e);
            }
        };
        let sent = http
            .send_with(&req, ctx.now(), SNOOZE_CAP, self.timeout)
            .await;
        tracing::debug!(job = job.id, kind = %job.kind, status = ?sent.status, class = ?sent.class, "push");
        let result = sent.job_result(job);
        http.record(&sent, &result);
        result
    }
}
