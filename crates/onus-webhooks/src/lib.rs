//! # onus-webhooks: durable, signed webhook delivery
//!
//! Publishing an event stores it and its `webhook.fanout` job in one transaction. The fan-out
//! inserts one `webhook.deliver` job per enabled, subscribed endpoint (unique per event and
//! endpoint, so a retried fan-out duplicates nothing), five minutes out for an endpoint that is
//! failing (cooldown) and at once for a healthy one. A delivery holds its endpoint's lease key (one
//! delivery in flight per endpoint), POSTs the event signed per Standard Webhooks, records the
//! attempt, and only *classifies* the answer: the job layer retries under the `webhook` policy.
//!
//! Endpoint health: any non-success sets `failing_since` (unless set) and `last_failure_at`; a
//! failure more than 24 h after the previous one starts a new `failing_since`; one success clears
//! both. Five days of continuous failure, or a 410, disables the endpoint and its pending
//! deliveries are discarded. Redeliver runs every discarded delivery of the last 14 days again.

mod db;
pub mod signing;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use onus::{
    Builder, JobContext, JobError, JobFilter, JobResult, JobState, Kind, NewJob, Policy, Store,
    Timestamp,
};
use onus_http::{Class, HttpClient, HttpConfig, Request};
use serde::{Deserialize, Serialize};

use db::{stmt, Db, Val};

/// The fan-out kind.
pub const FANOUT: &str = "webhook.fanout";
/// The delivery kind.
pub const DELIVER: &str = "webhook.deliver";
/// The hourly kind that prunes old events and attempts.
pub const PRUNE: &str = "webhook.prune";

/// Webhook settings (`[webhooks]` in `onus.toml`).
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// How far out new deliveries to a failing endpoint are scheduled.
    pub cooldown: Duration,
    /// How long an endpoint may fail continuously before it is disabled.
    pub disable_after: Duration,
    /// A failure this long after the previous one starts a new `failing_since`.
    pub failure_reset: Duration,
    /// Time for one delivery request.
    pub timeout: Duration,
    /// The longest a `Retry-After` may snooze a delivery.
    pub snooze_cap: Duration,
    /// How far back redeliver looks.
    pub redeliver_window: Duration,
    /// The most deliveries one redeliver runs again.
    pub redeliver_max: usize,
    /// Networks deliveries may reach although the SSRF guard refuses them (tests, private nets).
    pub allow_networks: Vec<String>,
    /// How long events and delivery attempts are kept (a delivery of a pruned event is discarded).
    pub retention: Duration,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        WebhookConfig {
            cooldown: Duration::from_secs(5 * 60),
            disable_after: Duration::from_secs(5 * 86_400),
            failure_reset: Duration::from_secs(24 * 3600),
            timeout: Duration::from_secs(30),
            snooze_cap: Duration::from_secs(10 * 3600),
            redeliver_window: Duration::from_secs(14 * 86_400),
            redeliver_max: 10_000,
            allow_networks: Vec::new(),
            retention: Duration::from_secs(30 * 86_400),
        }
    }
}

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed; the message says what to fix.
    #[error("{0}")]
    Invalid(String),
    /// No such endpoint or event.
    #[error("{0}")]
    NotFound(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] onus::StoreError),
    /// The job layer refused.
    #[error(transparent)]
    Jobs(#[from] onus::Error),
}

/// A webhook endpoint. Its `Debug` output hides the secrets.
#[derive(Clone, PartialEq, Serialize)]
pub struct Endpoint {
    /// `ep_...`
    pub id: String,
    /// Where deliveries go.
    pub url: String,
    /// A note.
    pub description: String,
    /// Event types it receives; empty means all.
    pub event_types: Vec<String>,
    /// Active signing secrets, newest first (`whsec_...`). Never shown but on creation.
    #[serde(skip)]
    pub secrets: Vec<String>,
    /// Whether deliveries go out.
    pub enabled: bool,
    /// Why it was disabled.
    pub disabled_reason: Option<String>,
    /// Since when it has been failing continuously.
    pub failing_since: Option<Timestamp>,
    /// Its latest failure.
    pub last_failure_at: Option<Timestamp>,
    /// Until when a delivery holds the endpoint's lease (one in flight at a time).
    pub busy_until: Option<Timestamp>,
    /// Created.
    pub created_at: Timestamp,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("id", &self.id)
            .field("url", &self.url)
            .field("description", &self.description)
            .field("event_types", &self.event_types)
            .field("secrets", &format_args!("[{} hidden]", self.secrets.len()))
            .field("enabled", &self.enabled)
            .field("disabled_reason", &self.disabled_reason)
            .field("failing_since", &self.failing_since)
            .field("last_failure_at", &self.last_failure_at)
            .field("busy_until", &self.busy_until)
            .field("created_at", &self.created_at)
            .finish()
    }
}

/// The largest event payload accepted, as serialized JSON.
pub const MAX_PAYLOAD_BYTES: usize = 256 * 1024;

/// An event.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Event {
    /// `msg_...`, sent as `webhook-id`.
    pub id: String,
    /// Its type, such as `invoice.paid`.
    #[serde(rename = "type")]
    pub event_type: String,
    /// The JSON payload sent as the body.
    pub payload: serde_json::Value,
    /// Published.
    pub created_at: Timestamp,
}

/// One delivery attempt.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeliveryAttempt {
    /// `att_...`
    pub id: String,
    /// The event.
    pub event_id: String,
    /// The endpoint.
    pub endpoint_id: String,
    /// The delivery job.
    pub job_id: i64,
    /// The job's attempt.
    pub attempt: u32,
    /// When it was made.
    pub attempted_at: Timestamp,
    /// The response status, if one came.
    pub status: Option<u16>,
    /// How long it took.
    pub duration_ms: f64,
    /// The start of the response body.
    pub response_excerpt: String,
    /// The transport error, if any.
    pub error: Option<String>,
    /// `success`, `retryable`, `snoozed` or `permanent`.
    pub outcome: String,
}

/// The args of a delivery job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeliverArgs {
    /// The event.
    pub event_id: String,
    /// The endpoint.
    pub endpoint_id: String,
}

/// The args of a fan-out job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FanoutArgs {
    /// The event.
    pub event_id: String,
}

fn us(t: Timestamp) -> i64 {
    t.timestamp_micros()
}

fn ts(v: &Val) -> Option<Timestamp> {
    v.i64().and_then(chrono::DateTime::from_timestamp_micros)
}

fn dur_us(d: Duration) -> i64 {
    d.as_micros().min(i64::MAX as u128) as i64
}

fn random_id(prefix: &str) -> String {
    const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let mut rng = rand::thread_rng();
    let s: String = (0..24)
        .map(|_| ALPHABET[rand::Rng::gen_range(&mut rng, 0..ALPHABET.len())] as char)
        .collect();
    format!("{prefix}{s}")
}

/// An event and its fan-out job, ready to write inside the caller's transaction.
#[derive(Debug, Clone)]
pub struct Publish {
    /// The event's id (`webhook-id`).
    pub event_id: String,
    event: db::Stmt,
    fanout: onus::store::InsertRow,
}

/// Publishing inside the caller's own SQLite transaction.
pub mod sqlite {
    use super::*;

    /// Writes the event and its fan-out on `conn` (the caller's open transaction). Call
    /// `client.notify_inserted("default")` after the commit to wake local workers at once.
    pub fn publish_tx(
        conn: &onus::sqlite::rusqlite::Connection,
        p: Publish,
    ) -> Result<String, Error> {
        let inserted = db::sqlite_rows(conn, &p.event)?;
        if !inserted.is_empty() {
            onus::sqlite::insert_tx(conn, p.fanout)?;
        }
        Ok(p.event_id)
    }
}

/// Publishing inside the caller's own PostgreSQL transaction.
pub mod postgres {
    use super::*;

    /// Writes the event and its fan-out in `tx` (the caller's open transaction); workers are
    /// notified when it commits.
    pub async fn publish_tx(
        tx: &impl tokio_postgres::GenericClient,
        p: Publish,
    ) -> Result<String, Error> {
        let inserted = db::pg_rows(tx, &p.event).await?;
        if !inserted.is_empty() {
            onus::postgres::insert_tx(tx, p.fanout).await?;
        }
        Ok(p.event_id)
    }
}

/// The lease key every delivery to an endpoint holds: one in flight per endpoint.
pub fn lease_key(endpoint_id: &str) -> String {
    format!("webhook-endpoint:{endpoint_id}")
}

const ENDPOINT_COLS: &str = "id, url, description, event_types, secrets, enabled, disabled_reason, failing_since, last_failure_at, created_at";

fn endpoint_from(r: &[Val]) -> Endpoint {
    let list = |v: &Val| -> Vec<String> {
        v.text()
            .and_then(|t| serde_json::from_str(t).ok())
            .unwrap_or_default()
    };
    Endpoint {
        id: r[0].text().unwrap_or_default().to_string(),
        url: r[1].text().unwrap_or_default().to_string(),
        description: r[2].text().unwrap_or_default().to_string(),
        event_types: list(&r[3]),
        secrets: list(&r[4]),
        enabled: r[5].i64() == Some(1),
        disabled_reason: r[6].text().map(str::to_string),
        failing_since: ts(&r[7]),
        last_failure_at: ts(&r[8]),
        busy_until: None,
        created_at: ts(&r[9]).unwrap_or_default(),
    }
}

struct Inner {
    db: Db,
    http: HttpClient,
    cfg: WebhookConfig,
    client: OnceLock<onus::Client>,
}

/// Webhook delivery: endpoints, events, deliveries.
#[derive(Clone)]
pub struct Webhooks {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Webhooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhooks")
            .field("config", &self.inner.cfg)
            .finish()
    }
}

/// A new endpoint. Its `Debug` output hides the secret.
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewEndpoint {
    /// Where deliveries go (`https://...`).
    pub url: String,
    /// Event types it receives; empty or absent means all.
    #[serde(default)]
    pub event_types: Vec<String>,
    /// A secret (`whsec_...`); one is made when absent.
    #[serde(default)]
    pub secret: Option<String>,
    /// A note.
    #[serde(default)]
    pub description: String,
}

impl std::fmt::Debug for NewEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewEndpoint")
            .field("url", &self.url)
            .field("event_types", &self.event_types)
            .field("secret", &self.secret.as_ref().map(|_| "(hidden)"))
            .field("description", &self.description)
            .finish()
    }
}

impl Webhooks {
    /// Sets up the webhook tables in `store`'s database and the delivery client.
    pub async fn open(store: Arc<dyn Store>, cfg: WebhookConfig) -> Result<Self, Error> {
        let db = Db::new(store)?;
        db.migrate().await?;
        let http = HttpClient::new(&HttpConfig {
            timeout: cfg.timeout,
            connect_timeout: cfg.timeout.min(Duration::from_secs(10)),
            allow_networks: cfg.allow_networks.clone(),
        })
        .map_err(Error::Invalid)?;
        Ok(Webhooks {
            inner: Arc::new(Inner {
                db,
                http,
                cfg,
                client: OnceLock::new(),
            }),
        })
    }

    /// Adds the `webhook.fanout` (default policy) and `webhook.deliver` (webhook policy, one in
    /// flight per endpoint) kinds to a runtime being built, and an hourly `webhook.prune`.
    pub fn register(&self, b: Builder) -> Builder {
        let (a, d, p) = (self.clone(), self.clone(), self.clone());
        let hourly = onus::Schedule::every(Duration::from_secs(3600))
            .unwrap_or_else(|_| unreachable!("an hour is a valid interval"));
        let b = b
            .kind(Kind::new(PRUNE).policy(Policy::preset_periodic()).handler(
                move |ctx: JobContext| {
                    let w = p.clone();
                    async move {
                        w.prune(ctx.now())
                            .await
                            .map(|_| ())
                            .map_err(|e| JobError::retryable(e.to_string()))
                    }
                },
            ))
            .periodic(onus::Periodic::new(
                PRUNE,
                hourly,
                NewJob::new(PRUNE, serde_json::json!({})),
            ));
        b.kind(Kind::new(FANOUT).policy(Policy::preset_default()).typed(
            move |ctx: JobContext, args: FanoutArgs| {
                let w = a.clone();
                async move { w.fanout(&ctx, &args).await }
            },
        ))
        .kind(
            Kind::new(DELIVER)
                .policy(Policy::preset_webhook())
                .lease_slots(1)
                .typed(move |ctx: JobContext, args: DeliverArgs| {
                    let w = d.clone();
                    async move { w.deliver(&ctx, &args).await }
                }),
        )
    }

    /// Gives the service the runtime's client (for publishing, enabling and redelivering).
    pub fn attach(&self, client: onus::Client) -> &Self {
        let _ = self.inner.client.set(client);
        self
    }

    fn client(&self) -> Result<&onus::Client, Error> {
        self.inner.client.get().ok_or_else(|| {
            Error::Invalid("attach a client (Webhooks::attach) before publishing".into())
        })
    }

    /// Creates an endpoint; the answer is the only place its secret is shown.
    pub async fn create_endpoint(&self, new: NewEndpoint) -> Result<(Endpoint, String), Error> {
        let url = reqwest_url(&new.url)?;
        let secret = match new.secret {
            Some(s) => {
                signing::check_secret(&s).map_err(|e| Error::Invalid(e.to_string()))?;
                s
            }
            None => signing::new_secret(),
        };
        let now = self.client()?.now();
        let id = random_id("ep_");
        let rows = self
            .inner
            .db
            .run(
                "INSERT INTO onus_endpoints (id, url, description, event_types, secrets, enabled, created_at, updated_at)
                 VALUES ($1, $2, $3, $4, $5, 1, $6, $6)
                 RETURNING id, url, description, event_types, secrets, enabled, disabled_reason, failing_since, last_failure_at, created_at",
                vec![
                    id.into(),
                    url.into(),
                    new.description.into(),
                    serde_json::to_string(&new.event_types).unwrap_or_else(|_| "[]".into()).into(),
                    serde_json::to_string(&[&secret]).unwrap_or_default().into(),
                    us(now).into(),
                ],
            )
            .await?;
        let ep = rows
            .first()
            .map(|r| endpoint_from(r))
            .ok_or_else(|| Error::Invalid("endpoint not created".into()))?;
        Ok((ep, secret))
    }

    /// One endpoint.
    pub async fn endpoint(&self, id: &str) -> Result<Endpoint, Error> {
        self.endpoint_opt(id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("no endpoint with id {id}")))
    }

    async fn endpoint_opt(&self, id: &str) -> Result<Option<Endpoint>, Error> {
        let rows = self
            .inner
            .db
            .read(
                "SELECT id, url, description, event_types, secrets, enabled, disabled_reason, failing_since, last_failure_at, created_at
                 FROM onus_endpoints WHERE id = $1",
                vec![id.into()],
            )
            .await?;
        let Some(mut ep) = rows.first().map(|r| endpoint_from(r)) else {
            return Ok(None);
        };
        ep.busy_until = self
            .inner
            .db
            .store()
            .lease_busy_until(&lease_key(&ep.id))
            .await?;
        Ok(Some(ep))
    }

    /// Adds a new signing secret (made when `secret` is `None`) while keeping the previous one,
    /// so consumers can switch over: deliveries are signed with both until the next rotation.
    /// Returns the new secret.
    pub async fn rotate_secret(&self, id: &str, secret: Option<String>) -> Result<String, Error> {
        let ep = self.endpoint(id).await?;
        let new = match secret {
            Some(s) => {
                signing::check_secret(&s).map_err(|e| Error::Invalid(e.to_string()))?;
                s
            }
            None => signing::new_secret(),
        };
        let mut secrets = vec![new.clone()];
        secrets.extend(ep.secrets.into_iter().take(1));
        let now = self.client()?.now();
        self.inner
            .db
            .run(
                "UPDATE onus_endpoints SET secrets = $1, updated_at = $2 WHERE id = $3",
                vec![
                    serde_json::to_string(&secrets).unwrap_or_default().into(),
                    us(now).into(),
                    id.into(),
                ],
            )
            .await?;
        Ok(new)
    }

    /// Every endpoint.
    pub async fn endpoints(&self) -> Result<Vec<Endpoint>, Error> {
        let _ = ENDPOINT_COLS;
        let rows = self
            .inner
            .db
            .read(
                "SELECT id, url, description, event_types, secrets, enabled, disabled_reason, failing_since, last_failure_at, created_at
                 FROM onus_endpoints ORDER BY created_at, id",
                vec![],
            )
            .await?;
        Ok(rows.iter().map(|r| endpoint_from(r)).collect())
    }

    /// Deletes an endpoint; its pending deliveries are discarded when they come due.
    pub async fn delete_endpoint(&self, id: &str) -> Result<(), Error> {
        let rows = self
            .inner
            .db
            .run(
                "DELETE FROM onus_endpoints WHERE id = $1 RETURNING id",
                vec![id.into()],
            )
            .await?;
        if rows.is_empty() {
            return Err(Error::NotFound(format!("no endpoint with id {id}")));
        }
        self.flush_pending(id).await
    }

    /// Enables an endpoint again (after its owner fixed it): health is reset.
    pub async fn enable(&self, id: &str) -> Result<Endpoint, Error> {
        let now = self.client()?.now();
        let rows = self
            .inner
            .db
            .run(
                "UPDATE onus_endpoints SET enabled = 1, disabled_reason = NULL, failing_since = NULL, last_failure_at = NULL,
                 updated_at = $1 WHERE id = $2
                 RETURNING id, url, description, event_types, secrets, enabled, disabled_reason, failing_since, last_failure_at, created_at",
                vec![us(now).into(), id.into()],
            )
            .await?;
        rows.first()
            .map(|r| endpoint_from(r))
            .ok_or_else(|| Error::NotFound(format!("no endpoint with id {id}")))
    }

    /// Disables an endpoint with a reason; its pending deliveries are discarded.
    pub async fn disable(&self, id: &str, reason: &str) -> Result<(), Error> {
        let now = self.client()?.now();
        let rows = self
            .inner
            .db
            .run(
                "UPDATE onus_endpoints SET enabled = 0, disabled_reason = $1, updated_at = $2 WHERE id = $3 RETURNING id",
                vec![reason.into(), us(now).into(), id.into()],
            )
            .await?;
        if rows.is_empty() {
            return Err(Error::NotFound(format!("no endpoint with id {id}")));
        }
        self.flush_pending(id).await
    }

    /// Makes every pending delivery to an endpoint due now, so each sees the endpoint gone or
    /// disabled and is discarded at once.
    async fn flush_pending(&self, id: &str) -> Result<(), Error> {
        let f = JobFilter {
            kinds: vec![DELIVER.into()],
            states: vec![JobState::Scheduled, JobState::Retryable, JobState::Snoozed],
            lease_keys: vec![lease_key(id)],
            ..JobFilter::default()
        };
        self.client()?.retry_where(&f).await?;
        Ok(())
    }

    /// Runs every discarded delivery to the endpoint from the last 14 days (at most 10,000) again,
    /// one more attempt each. Returns the jobs retried.
    pub async fn redeliver(&self, id: &str) -> Result<Vec<i64>, Error> {
        let ep = self.endpoint(id).await?;
        if !ep.enabled {
            return Err(Error::Invalid(format!(
                "endpoint {id} is disabled; enable it before redelivering"
            )));
        }
        let client = self.client()?;
        let since = client.now()
            - chrono::TimeDelta::from_std(self.inner.cfg.redeliver_window).unwrap_or_default();
        let f = JobFilter {
            kinds: vec![DELIVER.into()],
            states: vec![JobState::Discarded],
            lease_keys: vec![lease_key(id)],
            finalized_after: Some(since),
            limit: Some(self.inner.cfg.redeliver_max),
            ..JobFilter::default()
        };
        Ok(client.retry_where(&f).await?.retried)
    }

    /// Publishes an event: the event and its fan-out job commit together. With an `id` given,
    /// publishing the same id again returns the stored event and delivers nothing twice.
    pub async fn publish(
        &self,
        event_type: &str,
        payload: serde_json::Value,
        id: Option<String>,
    ) -> Result<Event, Error> {
        if let Some(id) = &id {
            if let Ok(existing) = self.event(id).await {
                return Ok(existing); // published before: nothing is delivered twice
            }
        }
        let p = self.prepare_publish(event_type, payload, id)?;
        let id = p.event_id.clone();
        // The fan-out only with a new event: a concurrent publish of the same id delivers once.
        let fanout = p.fanout;
        self.inner
            .db
            .tx_with(vec![p.event], move |rows| {
                if rows[0].is_empty() {
                    vec![]
                } else {
                    vec![fanout]
                }
            })
            .await?;
        self.client()?.notify_inserted(onus::DEFAULT_QUEUE);
        self.event(&id).await
    }

    /// Prepares a publish to run inside the caller's own transaction, with
    /// [`sqlite::publish_tx`] or [`postgres::publish_tx`]: the event and its fan-out commit with
    /// the caller's writes or not at all.
    pub fn prepare_publish(
        &self,
        event_type: &str,
        payload: serde_json::Value,
        id: Option<String>,
    ) -> Result<Publish, Error> {
        if event_type.trim().is_empty() || event_type.len() > 200 {
            return Err(Error::Invalid(
                "an event needs a type of 1 to 200 characters, such as \"invoice.paid\"".into(),
            ));
        }
        let client = self.client()?;
        let id = id.unwrap_or_else(|| random_id("msg_"));
        if id.is_empty()
            || id.len() > 100
            || !id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(Error::Invalid(
                "an event id is 1 to 100 letters, digits, '_' or '-'".into(),
            ));
        }
        let now = client.now();
        let body = serde_json::to_string(&payload).map_err(|e| Error::Invalid(e.to_string()))?;
        if body.len() > MAX_PAYLOAD_BYTES {
            return Err(Error::Invalid(format!(
                "the event payload is {} bytes of JSON; the most is {MAX_PAYLOAD_BYTES} (256 KiB): send a reference to the data instead",
                body.len()
            )));
        }
        if let Some(path) = onus::job::find_nul(&payload, "payload") {
            return Err(Error::Invalid(format!(
                "{path} contains a NUL character (\\u0000), which the database cannot store; remove it"
            )));
        }
        let fanout = client.prepare(
            NewJob::new(FANOUT, serde_json::json!({ "event_id": id })).unique_key(id.clone()),
        )?;
        let event = stmt(
            "INSERT INTO onus_events (id, type, payload, created_at) VALUES ($1, $2, $3, $4)
             ON CONFLICT (id) DO NOTHING RETURNING id",
            vec![
                id.clone().into(),
                event_type.into(),
                body.into(),
                us(now).into(),
            ],
        );
        Ok(Publish {
            event_id: id,
            event,
            fanout,
        })
    }

    /// Deletes events and delivery attempts older than the retention; returns events deleted.
    pub async fn prune(&self, now: Timestamp) -> Result<usize, Error> {
        let before = us(now) - dur_us(self.inner.cfg.retention);
        let (rows, _) = self
            .inner
            .db
            .tx(
                vec![
                    stmt(
                        "DELETE FROM onus_events WHERE created_at < $1 RETURNING id",
                        vec![before.into()],
                    ),
                    stmt(
                        "DELETE FROM onus_delivery_attempts WHERE attempted_at < $1 RETURNING id",
                        vec![before.into()],
                    ),
                    stmt(
                        "DELETE FROM onus_deliveries WHERE created_at < $1 RETURNING event_id",
                        vec![before.into()],
                    ),
                ],
                Vec::new(),
            )
            .await?;
        Ok(rows.first().map(Vec::len).unwrap_or(0))
    }

    /// One event.
    pub async fn event(&self, id: &str) -> Result<Event, Error> {
        let rows = self
            .inner
            .db
            .read(
                "SELECT id, type, payload, created_at FROM onus_events WHERE id = $1",
                vec![id.into()],
            )
            .await?;
        let r = rows
            .first()
            .ok_or_else(|| Error::NotFound(format!("no event with id {id}")))?;
        Ok(Event {
            id: r[0].text().unwrap_or_default().into(),
            event_type: r[1].text().unwrap_or_default().into(),
            payload: r[2]
                .text()
                .and_then(|t| serde_json::from_str(t).ok())
                .unwrap_or_default(),
            created_at: ts(&r[3]).unwrap_or_default(),
        })
    }

    /// Every attempt to deliver an event, oldest first.
    pub async fn attempts(&self, event_id: &str) -> Result<Vec<DeliveryAttempt>, Error> {
        let rows = self
            .inner
            .db
            .read(
                "SELECT id, event_id, endpoint_id, job_id, attempt, attempted_at, status, duration_us, response_excerpt, error, outcome
                 FROM onus_delivery_attempts WHERE event_id = $1 ORDER BY attempted_at, id",
                vec![event_id.into()],
            )
            .await?;
        Ok(rows.iter().map(|r| attempt_from(r)).collect())
    }

    /// The event a job is about: gone means pruned (discard), any other failure is retryable.
    async fn event_for_job(&self, id: &str) -> Result<Event, JobError> {
        match self.event(id).await {
            Ok(e) => Ok(e),
            Err(Error::NotFound(_)) => Err(JobError::discard(format!("event {id} was pruned"))),
            Err(e) => Err(JobError::retryable(e.to_string())),
        }
    }

    async fn fanout(&self, ctx: &JobContext, args: &FanoutArgs) -> JobResult {
        let event = self.event_for_job(&args.event_id).await?;
        let now = ctx.now();
        let cooldown = chrono::TimeDelta::from_std(self.inner.cfg.cooldown).unwrap_or_default();
        let endpoints = self
            .endpoints()
            .await
            .map_err(|e| JobError::retryable(e.to_string()))?;
        let client = ctx.client();
        let mut stmts = Vec::new();
        let mut rows = Vec::new();
        for e in endpoints.into_iter().filter(|e| {
            e.enabled && (e.event_types.is_empty() || e.event_types.contains(&event.event_type))
        }) {
            let j = NewJob::new(
                DELIVER,
                serde_json::json!({ "event_id": event.id, "endpoint_id": e.id }),
            )
            .unique_key(format!("{}:{}", event.id, e.id))
            .lease_key(lease_key(&e.id));
            // A failing endpoint gets new deliveries after a cooldown; a healthy one at once.
            let j = if e.failing_since.is_some() {
                j.run_at(now + cooldown)
            } else {
                j
            };
            rows.push(
                client
                    .prepare(j)
                    .map_err(|e| JobError::discard(e.to_string()))?,
            );
            stmts.push(stmt(
                "INSERT INTO onus_deliveries (event_id, endpoint_id, created_at) VALUES ($1, $2, $3)
                 ON CONFLICT (event_id, endpoint_id) DO NOTHING RETURNING endpoint_id",
                vec![event.id.clone().into(), e.id.clone().into(), us(now).into()],
            ));
        }
        if stmts.is_empty() {
            return Ok(());
        }
        // Only pairs never fanned out before get a delivery, so a fan-out that runs again (its
        // worker lost after the commit, say) delivers nothing twice.
        self.inner
            .db
            .tx_with(stmts, move |results| {
                rows.into_iter()
                    .zip(results)
                    .filter(|(_, r)| !r.is_empty())
                    .map(|(row, _)| row)
                    .collect()
            })
            .await
            .map_err(|e| JobError::retryable(e.to_string()))?;
        client.notify_inserted(onus::DEFAULT_QUEUE);
        Ok(())
    }

    async fn deliver(&self, ctx: &JobContext, args: &DeliverArgs) -> JobResult {
        let Some(ep) = self
            .endpoint_opt(&args.endpoint_id)
            .await
            .map_err(|e| JobError::retryable(e.to_string()))?
        else {
            return Err(JobError::discard(format!(
                "endpoint {} is gone",
                args.endpoint_id
            )));
        };
        if !ep.enabled {
            return Err(JobError::discard(format!(
                "endpoint {} is disabled: {}",
                ep.id,
                ep.disabled_reason.as_deref().unwrap_or("by request")
            )));
        }
        let event = self.event_for_job(&args.event_id).await?;
        let now = ctx.now();
        let body =
            serde_json::to_vec(&event.payload).map_err(|e| JobError::discard(e.to_string()))?;
        let stamp = now.timestamp(); // the time of this attempt
        let signature = signing::signature_header(&ep.secrets, &event.id, stamp, &body)
            .map_err(|e| JobError::discard(e.to_string()))?;
        let req = Request {
            method: "POST".into(),
            url: ep.url.clone(),
            headers: vec![
                ("content-type".into(), "application/json".into()),
                ("webhook-id".into(), event.id.clone()),
                ("webhook-timestamp".into(), stamp.to_string()),
                ("webhook-signature".into(), signature),
            ],
            body: Some(body),
        };
        let sent = self
            .inner
            .http
            .send(&req, now, self.inner.cfg.snooze_cap)
            .await;
        let outcome = match &sent.class {
            Class::Success => "success",
            Class::Snooze { .. } => "snoozed",
            Class::Retryable(_) => "retryable",
            Class::Permanent(_) => "permanent",
        };
        {
            let excerpt: String = sent.excerpt.chars().take(512).collect();
            self.inner
                .db
                .run(
                    "INSERT INTO onus_delivery_attempts (id, event_id, endpoint_id, job_id, attempt, attempted_at, status, duration_us,
                        response_excerpt, error, outcome)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                    vec![
                        random_id("att_").into(),
                        event.id.clone().into(),
                        ep.id.clone().into(),
                        ctx.job().id.into(),
                        i64::from(ctx.attempt()).into(),
                        us(now).into(),
                        sent.status.map(i64::from).into(),
                        (sent.duration.as_micros() as i64).into(),
                        excerpt.into(),
                        sent.error.clone().into(),
                        outcome.into(),
                    ],
                )
                .await
                .map_err(|e| JobError::retryable(e.to_string()))?;
        }
        if sent.class.is_success() {
            self.inner
                .db
                .run(
                    "UPDATE onus_endpoints SET failing_since = NULL, last_failure_at = NULL WHERE id = $1 AND failing_since IS NOT NULL",
                    vec![ep.id.clone().into()],
                )
                .await
                .map_err(|e| JobError::retryable(e.to_string()))?;
            return Ok(());
        }
        // Any non-success marks the endpoint failing; a failure long after the previous one
        // starts a new run of failures, so one stale failure cannot disable an endpoint.
        let reset_before = us(now) - dur_us(self.inner.cfg.failure_reset);
        let rows = self
            .inner
            .db
            .run(
                "UPDATE onus_endpoints SET
                    failing_since = CASE WHEN failing_since IS NULL OR last_failure_at IS NULL OR last_failure_at < $1
                                    THEN $2 ELSE failing_since END,
                    last_failure_at = $2, updated_at = $2
                 WHERE id = $3 RETURNING failing_since",
                vec![reset_before.into(), us(now).into(), ep.id.clone().into()],
            )
            .await
            .map_err(|e| JobError::retryable(e.to_string()))?;
        let failing_since = rows.first().and_then(|r| r[0].i64()).unwrap_or(us(now));
        let gone = sent.status == Some(410);
        let too_long = us(now) - failing_since >= dur_us(self.inner.cfg.disable_after);
        if gone || too_long {
            let reason = if gone {
                "gone: the endpoint answered 410".to_string()
            } else {
                format!(
                    "failing continuously for {}",
                    onus::policy::human(self.inner.cfg.disable_after)
                )
            };
            tracing::warn!(endpoint = %ep.id, reason = %reason, "disabling webhook endpoint");
            self.disable(&ep.id, &reason)
                .await
                .map_err(|e| JobError::retryable(e.to_string()))?;
            return Err(JobError::discard(format!(
                "endpoint {} disabled: {reason}",
                ep.id
            )));
        }
        sent.class.into_job_result(ctx.job())
    }
}

fn attempt_from(r: &[Val]) -> DeliveryAttempt {
    DeliveryAttempt {
        id: r[0].text().unwrap_or_default().into(),
        event_id: r[1].text().unwrap_or_default().into(),
        endpoint_id: r[2].text().unwrap_or_default().into(),
        job_id: r[3].i64().unwrap_or_default(),
        attempt: r[4].i64().unwrap_or_default() as u32,
        attempted_at: ts(&r[5]).unwrap_or_default(),
        status: r[6].i64().map(|s| s as u16),
        duration_ms: r[7].i64().unwrap_or_default() as f64 / 1000.0,
        response_excerpt: r[8].text().unwrap_or_default().into(),
        error: r[9].text().map(str::to_string),
        outcome: r[10].text().unwrap_or_default().into(),
    }
}

fn reqwest_url(url: &str) -> Result<String, Error> {
    let ok = url.starts_with("http://") || url.starts_with("https://");
    if !ok || url.len() > 2048 || url.contains(char::is_whitespace) {
        return Err(Error::Invalid(format!(
            "{url:?} is not an endpoint URL; write it like https://example.com/webhooks (http or https, at most 2048 characters)"
        )));
    }
    Ok(url.to_string())
}
