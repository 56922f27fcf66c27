//! The one client for every outbound call: one attempt, no retries, no redirects, no proxy from
//! the environment, connect and total timeouts, a `User-Agent` naming Onus, and the SSRF guard.

use std::sync::Arc;
use std::time::{Duration, Instant};

use onus::Timestamp;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};

use crate::classify::{classify_status, Class};
use crate::guard::{Blocked, Guard, GuardedResolver};

/// The `User-Agent` of every call.
pub const USER_AGENT: &str = concat!("onus/", env!("CARGO_PKG_VERSION"));

/// Most bytes of a response body kept for the record.
pub const EXCERPT_BYTES: usize = 1024;

/// How the client is set up.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// Time to connect.
    pub connect_timeout: Duration,
    /// Time for the whole call.
    pub timeout: Duration,
    /// Networks reachable even though the guard would refuse them (tests, private deployments).
    pub allow_networks: Vec<String>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            connect_timeout: Duration::from_secs(10),
            timeout: Duration::from_secs(30),
            allow_networks: Vec::new(),
        }
    }
}

/// A call to make.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Request {
    /// `GET`, `POST`, ...
    pub method: String,
    /// `http://` or `https://` URL.
    pub url: String,
    /// Headers, in order.
    #[serde(default)]
    pub headers: Vec<(String, String)>,
    /// The body.
    #[serde(default)]
    pub body: Option<Vec<u8>>,
}

/// What one attempt did, for the caller's records.
#[derive(Debug, Clone)]
pub struct Sent {
    /// The classification.
    pub class: Class,
    /// The status, when a response came.
    pub status: Option<u16>,
    /// The first bytes of the response body, as text that any database can store (no NUL
    /// characters; invalid UTF-8 replaced).
    pub excerpt: String,
    /// How long the attempt took.
    pub duration: Duration,
    /// The transport error or refusal, when no response came.
    pub error: Option<String>,
    /// Whether anything was sent at all (false when the guard refused or the request was invalid).
    pub attempted: bool,
    /// The guard's refusal, when the destination was refused.
    pub blocked: Option<Blocked>,
    /// A request went out and its attempt is not counted yet (see [`HttpClient::record`]).
    unrecorded: Option<Arc<Unrecorded>>,
}

impl Sent {
    /// The handler's answer for `job` (see [`Class::into_job_result`]), a failure's reason
    /// followed by the response's first characters ([`Class::with_excerpt`]).
    pub fn job_result(&self, job: &onus::Job) -> onus::JobResult {
        self.class
            .clone()
            .with_excerpt(&self.excerpt)
            .into_job_result(job)
    }
}

/// An attempt whose request went out, counted when [`HttpClient::record`] sees it, or else when
/// the last copy of its [`Sent`] is dropped: the job layer aborted the attempt (its lease was
/// lost) between the request and the record, and the request still belongs to an attempt.
#[derive(Debug)]
struct Unrecorded {
    labels: Arc<Labels>,
    recorded: std::sync::atomic::AtomicBool,
}

impl Drop for Unrecorded {
    fn drop(&mut self) {
        if !*self.recorded.get_mut() {
            count_attempt(&self.labels, true);
        }
    }
}

/// The client cannot be set up from its configuration.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// An allowed network is not a network.
    #[error("{0:?} is not a network; write it like \"127.0.0.1/32\" or \"fd00::/8\"")]
    BadNetwork(String),
    /// The underlying client refused its settings.
    #[error("cannot build the HTTP client: {0}")]
    Client(#[source] reqwest::Error),
}

/// A failed synchronous call.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// Transient: the other side is unavailable right now. Do not retry inline; if the work must
    /// happen, insert an `http.request` job.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The other side refused the request (a 4xx other than 408 and 429).
    #[error("rejected: {0}")]
    Rejected(String),
    /// The destination is not allowed; nothing was sent.
    #[error(transparent)]
    Blocked(#[from] Blocked),
    /// The request itself is malformed.
    #[error("invalid request: {0}")]
    Invalid(String),
}

impl CallError {
    /// Whose fault it is: a refused request or destination is the caller's; an unavailable
    /// other side is the service's.
    pub fn fault(&self) -> onus::Fault {
        match self {
            CallError::Unavailable(_) => onus::Fault::Service,
            CallError::Rejected(_) | CallError::Blocked(_) | CallError::Invalid(_) => {
                onus::Fault::Caller
            }
        }
    }
}

/// The outbound HTTP client.
#[derive(Debug, Clone)]
pub struct HttpClient {
    inner: reqwest::Client,
    guard: Arc<Guard>,
    timeout: Duration,
    labels: Arc<Labels>,
}

fn count_attempt(l: &Labels, sent: bool) {
    metrics::counter!(ATTEMPTS, "client" => l.client.clone(), "kind" => l.kind.clone(), "sent" => if sent { "true" } else { "false" })
        .increment(1);
}

/// Who sends through a client, for the metrics: the client (`webhooks`, `http`, `push`) and
/// the job kind.
#[derive(Debug)]
struct Labels {
    client: String,
    kind: String,
}

/// Requests put on the wire (a connection was made), by client and kind.
pub const REQUESTS: &str = "onus_outbound_requests_total";
/// Job attempts that used a client, by client, kind and whether they sent a request.
pub const ATTEMPTS: &str = "onus_outbound_attempts_total";
/// Answers that snoozed a job by `Retry-After` (no attempt spent), by client and kind.
pub const RETRY_AFTER_SNOOZES: &str = "onus_outbound_retry_after_snoozes_total";

impl HttpClient {
    /// Builds the client; the error says which setting is wrong.
    pub fn new(cfg: &HttpConfig) -> Result<Self, SetupError> {
        let guard = Arc::new(Guard::parse(&cfg.allow_networks)?);
        let inner = reqwest::Client::builder()
            .retry(reqwest::retry::never()) // retry has one owner: the job layer
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .connect_timeout(cfg.connect_timeout)
            .timeout(cfg.timeout)
            .user_agent(USER_AGENT)
            .dns_resolver(Arc::new(GuardedResolver {
                guard: guard.clone(),
            }))
            .build()
            .map_err(SetupError::Client)?;
        Ok(HttpClient {
            inner,
            guard,
            timeout: cfg.timeout,
            labels: Arc::new(Labels {
                client: "http".into(),
                kind: "none".into(),
            }),
        })
    }

    /// The same client, its requests counted under `client` and `kind` in the metrics.
    pub fn labelled(&self, client: &str, kind: &str) -> Self {
        HttpClient {
            labels: Arc::new(Labels {
                client: client.into(),
                kind: kind.into(),
            }),
            ..self.clone()
        }
    }

    /// Counts one job attempt's use of this client, once per attempt, from what it sent and
    /// what the attempt became: a `Retry-After` snooze (no attempt spent), or an attempt that
    /// sent a request or none. With the requests the client counts itself, this holds the
    /// amplification invariant: requests = attempts that sent one + `Retry-After` snoozes.
    pub fn record(&self, sent: &Sent, result: &onus::JobResult) {
        if let Some(u) = &sent.unrecorded {
            if u.recorded.swap(true, std::sync::atomic::Ordering::SeqCst) {
                return; // counted once already
            }
        }
        let l = &self.labels;
        let snoozed = matches!(result, Err(onus::JobError::Snooze { reason, .. }) if crate::classify::is_retry_after(reason));
        if sent.attempted && snoozed {
            metrics::counter!(RETRY_AFTER_SNOOZES, "client" => l.client.clone(), "kind" => l.kind.clone())
                .increment(1);
        } else {
            self.count_attempt(sent.attempted);
        }
    }

    /// Counts a job attempt that sent nothing before reaching the client (a disabled endpoint).
    pub fn record_unsent(&self) {
        self.count_attempt(false);
    }

    fn count_attempt(&self, sent: bool) {
        count_attempt(&self.labels, sent);
    }

    /// The guard this client applies.
    pub fn guard(&self) -> &Guard {
        &self.guard
    }

    /// Makes one attempt and classifies it; a `Retry-After` snooze is capped at `snooze_cap`.
    pub async fn send(&self, req: &Request, now: Timestamp, snooze_cap: Duration) -> Sent {
        self.send_with(req, now, snooze_cap, self.timeout).await
    }

    /// [`HttpClient::send`] with a time limit of its own for this call (a push kind's timeout).
    pub async fn send_with(
        &self,
        req: &Request,
        now: Timestamp,
        snooze_cap: Duration,
        timeout: Duration,
    ) -> Sent {
        let mut sent = self.send_inner(req, now, snooze_cap, timeout).await;
        if sent.attempted {
            let l = &self.labels;
            metrics::counter!(REQUESTS, "client" => l.client.clone(), "kind" => l.kind.clone())
                .increment(1);
            sent.unrecorded = Some(Arc::new(Unrecorded {
                labels: self.labels.clone(),
                recorded: false.into(),
            }));
        }
        sent
    }

    async fn send_inner(
        &self,
        req: &Request,
        now: Timestamp,
        snooze_cap: Duration,
        timeout: Duration,
    ) -> Sent {
        let started = Instant::now();
        let refused = |class: Class, error: String| Sent {
            class,
            status: None,
            excerpt: String::new(),
            duration: started.elapsed(),
            error: Some(error),
            attempted: false,
            blocked: None,
            unrecorded: None,
        };
        let url = match reqwest::Url::parse(&req.url) {
            Ok(u) if u.scheme() == "http" || u.scheme() == "https" => u,
            Ok(u) => {
                let e = format!("URL scheme {:?} is not http or https", u.scheme());
                return refused(Class::Permanent(e.clone()), e);
            }
            Err(e) => {
                let e = format!("{:?} is not a URL: {e}", req.url);
                return refused(Class::Permanent(e.clone()), e);
            }
        };
        if let Err(b) = self.guard.check_url(&url) {
            let mut sent = refused(Class::Permanent(b.to_string()), b.to_string());
            sent.blocked = Some(b);
            return sent;
        }
        let method = match reqwest::Method::from_bytes(req.method.to_ascii_uppercase().as_bytes()) {
            Ok(m) => m,
            Err(_) => {
                let e = format!("{:?} is not an HTTP method", req.method);
                return refused(Class::Permanent(e.clone()), e);
            }
        };
        let mut headers = HeaderMap::new();
        for (k, v) in &req.headers {
            match (
                HeaderName::from_bytes(k.as_bytes()),
                HeaderValue::from_str(v),
            ) {
                (Ok(k), Ok(v)) => {
                    headers.append(k, v);
                }
                _ => {
                    let e = format!("header {k:?} is not a valid HTTP header");
                    return refused(Class::Permanent(e.clone()), e);
                }
            }
        }
        let mut builder = self
            .inner
            .request(method, url)
            .headers(headers)
            .timeout(timeout);
        if let Some(body) = &req.body {
            builder = builder.body(body.clone());
        }
        match builder.send().await {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let ra = resp
                    .headers()
                    .get(RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                let class = classify_status(status, ra.as_deref(), now, snooze_cap);
                let excerpt = excerpt(resp).await;
                Sent {
                    class,
                    status: Some(status),
                    excerpt,
                    duration: started.elapsed(),
                    error: None,
                    attempted: true,
                    blocked: None,
                    unrecorded: None,
                }
            }
            Err(e) => {
                let msg = error_chain(&e);
                let blocked = find_blocked(&e);
                let class = match &blocked {
                    Some(b) => Class::Permanent(b.to_string()),
                    None => Class::Retryable(msg.clone()),
                };
                Sent {
                    class,
                    status: None,
                    excerpt: String::new(),
                    duration: started.elapsed(),
                    error: Some(onus::job::clean_message(&msg)),
                    attempted: blocked.is_none() && !e.is_connect(),
                    blocked,
                    unrecorded: None,
                }
            }
        }
    }

    /// One synchronous attempt for a caller who is waiting: a short `timeout`, and any transient
    /// failure (timeout, connection, 5xx, 429, ...) becomes [`CallError::Unavailable`] at once.
    /// Returns the status and the body's first bytes on success.
    pub async fn call_once(
        &self,
        req: &Request,
        timeout: Duration,
    ) -> Result<(u16, String), CallError> {
        let mut sent = self
            .send_with(req, chrono::Utc::now(), Duration::ZERO, timeout)
            .await;
        if let Some(u) = sent.unrecorded.take() {
            // A call, not a job's attempt.
            u.recorded.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        match sent.class {
            Class::Success => Ok((sent.status.unwrap_or(200), sent.excerpt)),
            Class::Snooze { reason, .. } => Err(CallError::Unavailable(reason)),
            Class::Retryable(m) => Err(CallError::Unavailable(m)),
            Class::Permanent(m) => match sent.blocked {
                Some(b) => Err(CallError::Blocked(b)),
                None if sent.status.is_none() => Err(CallError::Invalid(m)),
                None => Err(CallError::Rejected(m)),
            },
        }
    }
}

/// The guard's refusal somewhere in an error's sources (a name that resolved to a refused address).
fn find_blocked(e: &reqwest::Error) -> Option<Blocked> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if let Some(b) = c.downcast_ref::<Blocked>() {
            return Some(b.clone());
        }
        cur = c.source();
    }
    None
}

fn error_chain(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    let mut cur = std::error::Error::source(e);
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}

async fn excerpt(resp: reqwest::Response) -> String {
    let mut resp = resp;
    let mut buf = Vec::new();
    while buf.len() < EXCERPT_BYTES {
        match resp.chunk().await {
            Ok(Some(c)) => buf.extend_from_slice(&c),
            _ => break,
        }
    }
    buf.truncate(EXCERPT_BYTES);
    onus::job::clean_message(&String::from_utf8_lossy(&buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `Sent` as a request that went out leaves it, before the attempt is recorded.
    fn went_out(client: &HttpClient) -> Sent {
        Sent {
            class: Class::Success,
            status: Some(200),
            excerpt: String::new(),
            duration: Duration::ZERO,
            error: None,
            attempted: true,
            blocked: None,
            unrecorded: Some(Arc::new(Unrecorded {
                labels: client.labels.clone(),
                recorded: false.into(),
            })),
        }
    }

    #[test]
    fn an_attempt_is_counted_once_recorded_twice_or_aborted_before_its_record() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let client = HttpClient::new(&HttpConfig::default()).expect("a client");
        let twice = client.labelled("webhooks", "twice");
        let aborted = client.labelled("webhooks", "aborted");
        metrics::with_local_recorder(&recorder, || {
            // Recorded through two copies (the delivery keeps one for its record): once.
            let sent = went_out(&twice);
            let copy = sent.clone();
            twice.record(&sent, &Ok(()));
            twice.record(&copy, &Ok(()));
            drop((sent, copy));
            // Its attempt aborted (the lease was lost) after the request: counted at the drop.
            drop(went_out(&aborted));
        });
        let text = handle.render();
        for kind in ["twice", "aborted"] {
            let line = format!(
                r#"onus_outbound_attempts_total{{client="webhooks",kind="{kind}",sent="true"}} 1"#
            );
            assert!(text.contains(&line), "{line}\n{text}");
        }
    }
}
