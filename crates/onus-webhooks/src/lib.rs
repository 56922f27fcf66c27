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

pub mod crypto;
mod delivery;
mod error;
mod fanout;
mod health;
pub mod ids;
mod model;
pub mod signing;
mod sql;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use onus::sql::{Tx, Value};
use onus::store::Db;
use onus::{
    Builder, Component, JobContext, JobError, JobFilter, JobState, Kind, NewJob, Policy, Store,
    Timestamp,
};
use onus_http::{HttpClient, HttpConfig};

pub use delivery::{CONTENT_TYPE, WEBHOOK_ID, WEBHOOK_SIGNATURE, WEBHOOK_TIMESTAMP};
pub use error::Error;
pub use ids::{AttemptId, EndpointId, EventId};
pub use model::{
    DeliverArgs, DeliveryAttempt, Endpoint, EndpointUpdate, Event, FanoutArgs, NewEndpoint,
    Outcome, PayloadFormat, MAX_PAYLOAD_BYTES,
};
pub use sql::MIGRATIONS;

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
    /// The key endpoint secrets are encrypted under at rest (none: stored as they are).
    pub encryption_key: Option<crypto::Key>,
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
            encryption_key: None,
        }
    }
}

/// An event and its fan-out job, checked and ready to write.
#[derive(Debug, Clone)]
struct Publish {
    event: sql::EventRow,
    fanout: onus::store::InsertRow,
}

/// The lease key every delivery to an endpoint holds: one in flight per endpoint.
pub fn lease_key(endpoint_id: &str) -> String {
    format!("webhook-endpoint:{endpoint_id}")
}

struct Inner {
    db: Db,
    http: HttpClient,
    cfg: WebhookConfig,
    client: OnceLock<onus::Client>,
}

/// Webhook delivery: endpoints, events, deliveries. Register it with
/// [`Builder::component`](onus::Builder::component) before use.
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

impl Component for Webhooks {
    fn migrations(&self) -> Option<&'static onus::sql::Line> {
        Some(&MIGRATIONS)
    }

    /// The `webhook.fanout` (default policy) and `webhook.deliver` (webhook policy, one in flight
    /// per endpoint) kinds, and the hourly `webhook.prune`.
    fn install(&self, b: Builder) -> Builder {
        let (a, d, p) = (self.clone(), self.clone(), self.clone());
        let hourly = onus::Schedule::every(Duration::from_secs(3600))
            .unwrap_or_else(|_| unreachable!("an hour is a valid interval"));
        b.kind(Kind::new(PRUNE).policy(Policy::preset_periodic()).handler(
            move |ctx: JobContext| {
                let w = p.clone();
                async move {
                    w.prune(ctx.now()).await?;
                    Ok(())
                }
            },
        ))
        .periodic(onus::Periodic::new(
            PRUNE,
            hourly,
            NewJob::new(PRUNE, serde_json::json!({})),
        ))
        .kind(Kind::new(FANOUT).policy(Policy::preset_default()).typed(
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

    fn bind(&self, client: onus::Client) {
        let _ = self.inner.client.set(client);
    }
}

impl Webhooks {
    /// The webhook service on `store`'s database, with its tables migrated (the shared runner,
    /// line `webhooks`).
    pub async fn open(store: Arc<dyn Store>, cfg: WebhookConfig) -> Result<Self, Error> {
        store.migrate(&[&MIGRATIONS]).await?;
        Self::new(store, cfg)
    }

    /// The webhook service on `store`'s database, migrating nothing (for processes that run
    /// `onus migrate` before they start).
    pub fn new(store: Arc<dyn Store>, cfg: WebhookConfig) -> Result<Self, Error> {
        let http = HttpClient::new(&HttpConfig {
            timeout: cfg.timeout,
            connect_timeout: cfg.timeout.min(Duration::from_secs(10)),
            allow_networks: cfg.allow_networks.clone(),
        })?
        .labelled("webhooks", DELIVER);
        Ok(Webhooks {
            inner: Arc::new(Inner {
                db: Db::new(store),
                http,
                cfg,
                client: OnceLock::new(),
            }),
        })
    }

    fn seal(&self, secret: &str) -> String {
        crypto::seal_all(
            self.inner.cfg.encryption_key.as_ref(),
            &[secret.to_string()],
        )
        .remove(0)
    }

    /// An endpoint's signing secrets in plaintext, newest first.
    pub(crate) fn plain_secrets(&self, ep: &Endpoint) -> Result<Vec<String>, crypto::CryptoError> {
        crypto::open_all(self.inner.cfg.encryption_key.as_ref(), &ep.secrets)
    }

    /// Checks that every stored secret opens with the configured key (or that none is encrypted
    /// when no key is configured), and encrypts the plaintext ones when a key is configured.
    /// Returns how many endpoints were encrypted now. Run at every start.
    pub async fn seal_stored_secrets(&self) -> Result<usize, Error> {
        let key = self.inner.cfg.encryption_key.clone();
        let mut changed = 0;
        for ep in self.endpoints().await? {
            crypto::open_all(key.as_ref(), &ep.secrets)
                .map_err(|e| Error::Invalid(format!("endpoint {}: {e}", ep.id)))?;
            let Some(k) = &key else { continue };
            if ep.secrets.iter().all(|s| crypto::is_sealed(s)) {
                continue;
            }
            let sealed: Vec<String> = ep
                .secrets
                .iter()
                .map(|s| {
                    if crypto::is_sealed(s) {
                        s.clone()
                    } else {
                        k.seal(s)
                    }
                })
                .collect();
            let now = chrono::Utc::now();
            let id = ep.id.clone();
            self.inner
                .db
                .tx(move |tx| {
                    Box::pin(async move { sql::set_secrets(tx, &id, &sealed, now).await })
                })
                .await?;
            changed += 1;
        }
        Ok(changed)
    }

    /// Re-encrypts every endpoint's secrets under `new` (from the configured key, or from
    /// plaintext), in one transaction; returns how many endpoints. Configure `new` afterwards.
    pub async fn reencrypt(&self, new: &crypto::Key) -> Result<usize, Error> {
        let old = self.inner.cfg.encryption_key.clone();
        let mut rows = Vec::new();
        for ep in self.endpoints().await? {
            let plain = crypto::open_all(old.as_ref(), &ep.secrets)
                .map_err(|e| Error::Invalid(format!("endpoint {}: {e}", ep.id)))?;
            rows.push((ep.id, plain.iter().map(|s| new.seal(s)).collect::<Vec<_>>()));
        }
        let n = rows.len();
        let now = chrono::Utc::now();
        self.inner
            .db
            .tx(move |tx| {
                Box::pin(async move {
                    for (id, sealed) in rows {
                        sql::set_secrets(tx, &id, &sealed, now).await?;
                    }
                    Ok::<_, Error>(())
                })
            })
            .await?;
        Ok(n)
    }

    fn client(&self) -> Result<&onus::Client, Error> {
        self.inner.client.get().ok_or(Error::NotRegistered)
    }

    /// Creates an endpoint; the answer is the only place its secret is shown.
    pub async fn create_endpoint(&self, new: NewEndpoint) -> Result<(Endpoint, String), Error> {
        let url = self.reachable_url(&new.url)?;
        if let Some(t) = &new.tenant {
            check_tenant(t)?;
        }
        check_headers(&new.headers)?;
        check_event_types(&new.event_types)?;
        let secret = match new.secret {
            Some(s) => {
                signing::check_secret(&s)?;
                s
            }
            None => signing::new_secret(),
        };
        let row = sql::NewEndpointRow {
            id: EndpointId::random(),
            url,
            description: new.description,
            event_types: new.event_types,
            secret: self.seal(&secret),
            now: self.client()?.now(),
            tenant: new.tenant,
            headers: new.headers,
            payload: new.payload,
        };
        let ep = self
            .inner
            .db
            .tx(move |tx| Box::pin(sql::insert_endpoint(tx, row)))
            .await?
            .ok_or_else(|| Error::Conflict("the endpoint was not created; try again".into()))?;
        Ok((ep, secret))
    }

    /// An endpoint URL, checked, and refused when it names an address the SSRF guard will
    /// always refuse (every delivery to it would be discarded unsent).
    fn reachable_url(&self, raw: &str) -> Result<String, Error> {
        let url = endpoint_url(raw)?;
        self.inner.http.guard().check_literal(&url).map_err(|b| {
            Error::Invalid(format!(
                "url: {b}; every delivery to it would be refused: point to a public address, or add its network to [webhooks] allow_networks"
            ))
        })?;
        Ok(url)
    }

    /// One endpoint.
    pub async fn endpoint(&self, id: &str) -> Result<Endpoint, Error> {
        self.endpoint_opt(&EndpointId::from_text(id))
            .await?
            .ok_or_else(|| Error::NotFound(format!("no endpoint with id {id}")))
    }

    async fn endpoint_opt(&self, id: &EndpointId) -> Result<Option<Endpoint>, Error> {
        let mut rows: Vec<Endpoint> = self
            .inner
            .db
            .read_rows(&sql::ENDPOINT, vec![id.into()])
            .await?;
        let Some(mut ep) = rows.pop() else {
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
                signing::check_secret(&s)?;
                s
            }
            None => signing::new_secret(),
        };
        // Stored as they are: the previous one is kept in whatever form it was stored.
        let mut secrets = vec![self.seal(&new)];
        secrets.extend(ep.secrets.into_iter().take(1));
        let now = self.client()?.now();
        let id = ep.id;
        self.inner
            .db
            .tx(move |tx| Box::pin(async move { sql::set_secrets(tx, &id, &secrets, now).await }))
            .await?;
        Ok(new)
    }

    /// Every endpoint.
    pub async fn endpoints(&self) -> Result<Vec<Endpoint>, Error> {
        Ok(self.inner.db.read_rows(&sql::ALL_ENDPOINTS, vec![]).await?)
    }

    /// The endpoints of one tenant (`None`: every endpoint).
    pub async fn endpoints_of(&self, tenant: Option<&str>) -> Result<Vec<Endpoint>, Error> {
        match tenant {
            None => self.endpoints().await,
            Some(t) => Ok(self
                .inner
                .db
                .read_rows(&sql::TENANT_ENDPOINTS, vec![t.into()])
                .await?),
        }
    }

    /// Changes an endpoint's URL, event types, note, headers or body format (its tenant and
    /// secrets stay).
    pub async fn update_endpoint(&self, id: &str, up: EndpointUpdate) -> Result<Endpoint, Error> {
        let ep = self.endpoint(id).await?;
        let url = match &up.url {
            Some(u) => self.reachable_url(u)?,
            None => ep.url,
        };
        if let Some(h) = &up.headers {
            check_headers(h)?;
        }
        if let Some(t) = &up.event_types {
            check_event_types(t)?;
        }
        let params = vec![
            url.into(),
            up.description.unwrap_or(ep.description).into(),
            Value::json(&up.event_types.unwrap_or(ep.event_types))?,
            Value::json(&up.headers.unwrap_or(ep.headers))?,
            self.client()?.now().into(),
            up.payload.unwrap_or(ep.payload).as_str().into(),
            (&ep.id).into(),
        ];
        let mut rows: Vec<Endpoint> = self.inner.db.fetch(&sql::UPDATE_ENDPOINT, params).await?;
        let mut updated = rows
            .pop()
            .ok_or_else(|| Error::NotFound(format!("no endpoint with id {id}")))?;
        updated.busy_until = ep.busy_until;
        Ok(updated)
    }

    /// Sends a `webhook.test` event to this endpoint alone (whatever its event types), as a new
    /// event of its tenant; returns the event.
    pub async fn send_test(&self, id: &str) -> Result<Event, Error> {
        let ep = self.endpoint(id).await?;
        if !ep.enabled {
            return Err(Error::Conflict(format!(
                "endpoint {id} is disabled; enable it before sending a test"
            )));
        }
        let now = self.client()?.now();
        let (event, _) = self
            .publish_event(NewEvent {
                event_type: TEST_EVENT.into(),
                payload: serde_json::json!({"type": TEST_EVENT, "endpoint_id": ep.id, "sent_at": now}),
                id: None,
                tenant: ep.tenant.clone(),
                only_endpoint: Some(ep.id.clone()),
            })
            .await?;
        Ok(event)
    }

    /// Deletes an endpoint; its pending deliveries are discarded when they come due.
    pub async fn delete_endpoint(&self, id: &str) -> Result<(), Error> {
        let n = self
            .inner
            .db
            .execute(&sql::DELETE_ENDPOINT, vec![id.into()])
            .await?;
        if n == 0 {
            return Err(Error::NotFound(format!("no endpoint with id {id}")));
        }
        self.flush_pending(id).await
    }

    /// Enables an endpoint again (after its owner fixed it): health is reset.
    pub async fn enable(&self, id: &str) -> Result<Endpoint, Error> {
        let now = self.client()?.now();
        let params = sql::enable_params(&EndpointId::from_text(id), now);
        let mut rows: Vec<Endpoint> = self.inner.db.fetch(&sql::ENABLE, params).await?;
        rows.pop()
            .ok_or_else(|| Error::NotFound(format!("no endpoint with id {id}")))
    }

    /// Disables an endpoint with a reason; its pending deliveries are discarded.
    pub async fn disable(&self, id: &str, reason: &str) -> Result<(), Error> {
        let now = self.client()?.now();
        let params = sql::disable_params(&EndpointId::from_text(id), reason, now);
        if self.inner.db.execute(&sql::DISABLE, params).await? == 0 {
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
        self.redeliver_since(id, None).await
    }

    /// [`Webhooks::redeliver`], from `since` instead of the window's start when given.
    pub async fn redeliver_since(
        &self,
        id: &str,
        since: Option<Timestamp>,
    ) -> Result<Vec<i64>, Error> {
        let ep = self.endpoint(id).await?;
        if !ep.enabled {
            return Err(Error::Conflict(format!(
                "endpoint {id} is disabled; enable it before redelivering"
            )));
        }
        let f = self.redeliverable(id, since)?;
        Ok(self.client()?.retry_where(&f).await?.retried)
    }

    /// How many deliveries [`Webhooks::redeliver`] would run again now (what a panel shows on
    /// its button).
    pub async fn redeliver_count(&self, id: &str) -> Result<u64, Error> {
        let f = self.redeliverable(id, None)?;
        Ok(self.client()?.count(&f).await?)
    }

    /// The discarded deliveries to `id` a redelivery takes: finished from `since` (the window's
    /// start by default), at most the configured number.
    fn redeliverable(&self, id: &str, since: Option<Timestamp>) -> Result<JobFilter, Error> {
        let client = self.client()?;
        let since = since
            .unwrap_or_else(|| onus::clock::sub(client.now(), self.inner.cfg.redeliver_window));
        Ok(JobFilter {
            kinds: vec![DELIVER.into()],
            states: vec![JobState::Discarded],
            lease_keys: vec![lease_key(id)],
            finalized_after: Some(since),
            limit: Some(self.inner.cfg.redeliver_max),
            ..JobFilter::default()
        })
    }

    /// Publishes an event: the event and its fan-out job commit together. With an `id` given,
    /// publishing the same id again returns the stored event and delivers nothing twice.
    pub async fn publish(
        &self,
        event_type: &str,
        payload: serde_json::Value,
        id: Option<String>,
    ) -> Result<Event, Error> {
        let new = NewEvent {
            event_type: event_type.to_string(),
            payload,
            id,
            tenant: None,
            only_endpoint: None,
        };
        Ok(self.publish_event(new).await?.0)
    }

    /// Publishes an event of a tenant (or of none); true when it is new. The same id again with
    /// the same type, payload and tenant answers the stored event and delivers nothing twice;
    /// with anything else it is a [`Error::Conflict`].
    pub async fn publish_event(&self, new: NewEvent) -> Result<(Event, bool), Error> {
        if let Some(id) = &new.id {
            if let Some(existing) = self.event_opt(&EventId::parse(id)?).await? {
                same_event(&existing, &new)?;
                return Ok((existing, false)); // published before: nothing is delivered twice
            }
        }
        let p = self.prepare_publish(new.clone())?;
        let id = p.event.id.clone();
        let fresh = self
            .inner
            .db
            .tx(move |tx| Box::pin(write_publish(tx, p)))
            .await?;
        self.client()?.notify_inserted(onus::DEFAULT_QUEUE);
        let stored = self.event(&id).await?;
        if fresh.is_none() {
            // A concurrent publish of the same id won.
            same_event(&stored, &new)?;
        }
        Ok((stored, fresh.is_some()))
    }

    /// Events, newest first: of one tenant and one type when given, after `cursor` (the last
    /// event of the previous page), at most `limit`.
    pub async fn events(
        &self,
        tenant: Option<&str>,
        event_type: Option<&str>,
        limit: usize,
        cursor: Option<&Event>,
    ) -> Result<Vec<Event>, Error> {
        let params = vec![
            tenant.into(),
            event_type.into(),
            cursor.map(|e| e.created_at).into(),
            cursor.map(|e| e.id.to_string()).into(),
            (limit.min(10_000) as i64).into(),
        ];
        Ok(self.inner.db.read_rows(&sql::EVENTS_PAGE, params).await?)
    }

    /// An endpoint's delivery attempts, newest first, after `cursor` (the last attempt of the
    /// previous page), at most `limit`.
    pub async fn endpoint_attempts(
        &self,
        id: &str,
        limit: usize,
        cursor: Option<&DeliveryAttempt>,
    ) -> Result<Vec<DeliveryAttempt>, Error> {
        let ep = self.endpoint(id).await?;
        let params = vec![
            (&ep.id).into(),
            cursor.map(|a| a.attempted_at).into(),
            cursor.map(|a| a.id.to_string()).into(),
            (limit.min(10_000) as i64).into(),
        ];
        Ok(self
            .inner
            .db
            .read_rows(&sql::ATTEMPTS_OF_ENDPOINT, params)
            .await?)
    }

    /// One attempt by id, among an endpoint's or an event's (a cursor names it).
    pub async fn attempt(&self, id: &str) -> Result<Option<DeliveryAttempt>, Error> {
        let mut rows: Vec<DeliveryAttempt> = self
            .inner
            .db
            .read_rows(&sql::ATTEMPT, vec![id.into()])
            .await?;
        Ok(rows.pop())
    }

    /// The deliveries of an event: one per endpoint it fanned out to, each with its job's state
    /// and its attempts, oldest first.
    pub async fn deliveries(&self, event_id: &str) -> Result<Vec<Delivery>, Error> {
        let event = self.event(event_id).await?;
        let rows: Vec<sql::DeliveryRow> = self
            .inner
            .db
            .read_rows(&sql::DELIVERIES_OF_EVENT, vec![(&event.id).into()])
            .await?;
        let attempts = self.attempts(event_id).await?;
        let client = self.client()?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let mine: Vec<DeliveryAttempt> = attempts
                .iter()
                .filter(|a| a.endpoint_id == r.endpoint_id)
                .cloned()
                .collect();
            // Deliveries recorded before their job was: the job of their attempts.
            let job_id = r.job_id.or_else(|| mine.first().map(|a| a.job_id));
            let state = match job_id {
                Some(j) => match client.get(j).await {
                    Ok(job) => Some(job.state),
                    Err(onus::Error::Store(onus::StoreError::NotFound(_))) => None,
                    Err(e) => return Err(e.into()),
                },
                None => None,
            };
            out.push(Delivery {
                endpoint_id: r.endpoint_id,
                job_id,
                state,
                created_at: r.created_at,
                attempts: mine,
            });
        }
        Ok(out)
    }

    /// Publishes an event inside `tx`, the caller's own open transaction (an
    /// [`onus::sql::SqliteTx`] or [`onus::sql::PgTx`]; the same call on both backends): the event
    /// and its fan-out commit with the caller's writes or not at all. Returns the event's id. On
    /// SQLite the call completes at once (synchronous code wraps it in [`onus::sql::ready`]); call
    /// `client.notify_inserted("default")` after the commit to wake local workers at once. On
    /// PostgreSQL workers are notified by the commit.
    pub async fn publish_in<T: Tx + ?Sized>(
        &self,
        tx: &T,
        event_type: &str,
        payload: serde_json::Value,
        id: Option<String>,
    ) -> Result<EventId, Error> {
        let new = NewEvent {
            event_type: event_type.to_string(),
            payload,
            id,
            tenant: None,
            only_endpoint: None,
        };
        self.publish_event_in(tx, new).await
    }

    /// [`Webhooks::publish_in`] for an event of a tenant. The same id again publishes nothing.
    pub async fn publish_event_in<T: Tx + ?Sized>(
        &self,
        tx: &T,
        new: NewEvent,
    ) -> Result<EventId, Error> {
        let p = self.prepare_publish(new)?;
        let id = p.event.id.clone();
        write_publish(tx, p).await?;
        Ok(id)
    }

    /// Checks an event and prepares its rows.
    fn prepare_publish(&self, new: NewEvent) -> Result<Publish, Error> {
        let NewEvent {
            event_type,
            payload,
            id,
            tenant,
            only_endpoint,
        } = new;
        let event_type = event_type.as_str();
        if event_type.trim().is_empty()
            || event_type.len() > 200
            || event_type.chars().any(char::is_control)
        {
            return Err(Error::Invalid(
                "type: an event needs a type of 1 to 200 characters, such as \"invoice.paid\""
                    .into(),
            ));
        }
        if let Some(t) = &tenant {
            check_tenant(t)?;
        }
        let client = self.client()?;
        let id = match id {
            Some(id) => EventId::parse(&id)?,
            None => EventId::random(),
        };
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
        let args = FanoutArgs {
            event_id: id.clone(),
        };
        let fanout = client.prepare(
            NewJob::new(
                FANOUT,
                serde_json::to_value(&args).map_err(|e| Error::Invalid(e.to_string()))?,
            )
            .unique_key(id.to_string()),
        )?;
        Ok(Publish {
            event: sql::EventRow {
                id,
                event_type: event_type.to_string(),
                payload,
                now: client.now(),
                tenant,
                only_endpoint,
            },
            fanout,
        })
    }

    /// Deletes events and delivery attempts older than the retention; returns events deleted.
    pub async fn prune(&self, now: Timestamp) -> Result<u64, Error> {
        let before = onus::clock::sub(now, self.inner.cfg.retention);
        Ok(self
            .inner
            .db
            .tx(move |tx| Box::pin(sql::prune(tx, before)))
            .await?)
    }

    /// One event.
    pub async fn event(&self, id: &str) -> Result<Event, Error> {
        self.event_opt(&EventId::from_text(id))
            .await?
            .ok_or_else(|| Error::NotFound(format!("no event with id {id}")))
    }

    async fn event_opt(&self, id: &EventId) -> Result<Option<Event>, Error> {
        let mut rows: Vec<Event> = self
            .inner
            .db
            .read_rows(&sql::EVENT, vec![id.into()])
            .await?;
        Ok(rows.pop())
    }

    /// Every attempt to deliver an event, oldest first.
    pub async fn attempts(&self, event_id: &str) -> Result<Vec<DeliveryAttempt>, Error> {
        Ok(self
            .inner
            .db
            .read_rows(&sql::ATTEMPTS_OF_EVENT, vec![event_id.into()])
            .await?)
    }

    /// The event a job is about: gone means pruned (discard); any other failure is retryable.
    async fn event_for_job(&self, id: &EventId) -> Result<Event, JobError> {
        match self.event_opt(id).await? {
            Some(e) => Ok(e),
            None => Err(JobError::discard(format!("event {id} was pruned"))),
        }
    }
}

/// Writes a checked event and, when it is new, its fan-out job.
/// Writes the event and its fan-out; the id when the event is new, `None` when one with its id
/// was there already.
async fn write_publish<T: Tx + ?Sized>(tx: &T, p: Publish) -> Result<Option<EventId>, Error> {
    let fresh = sql::insert_event(tx, &p.event, p.fanout).await?;
    Ok(fresh.then_some(p.event.id))
}

/// The type of the event `POST /endpoints/{id}/test` sends.
pub const TEST_EVENT: &str = "webhook.test";

/// An event to publish.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    /// Its type, such as `invoice.paid`.
    pub event_type: String,
    /// The JSON body.
    pub payload: serde_json::Value,
    /// The publisher's id for it (1 to 100 letters, digits, `_`, `-`); made when absent.
    pub id: Option<String>,
    /// The tenant whose endpoints receive it; none: endpoints without a tenant.
    pub tenant: Option<String>,
    /// Only this endpoint receives it (test events).
    pub only_endpoint: Option<EndpointId>,
}

/// One delivery of an event: the endpoint it went to, its job and its attempts.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Delivery {
    /// The endpoint.
    pub endpoint_id: EndpointId,
    /// The delivery job (none once retention removed it).
    pub job_id: Option<i64>,
    /// Where the job stands (none once retention removed it).
    pub state: Option<JobState>,
    /// When the fan-out made it.
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub created_at: Timestamp,
    /// Every attempt, oldest first.
    pub attempts: Vec<DeliveryAttempt>,
}

fn same_event(stored: &Event, new: &NewEvent) -> Result<(), Error> {
    let differs = if stored.event_type != new.event_type {
        Some("type")
    } else if stored.payload != new.payload {
        Some("payload")
    } else if stored.tenant != new.tenant {
        Some("tenant")
    } else {
        None
    };
    match differs {
        None => Ok(()),
        Some(what) => Err(Error::Conflict(format!(
            "event {} was published before with another {what}; an id names one event: publish the new one under a new id",
            stored.id
        ))),
    }
}

fn endpoint_url(raw: &str) -> Result<String, Error> {
    let bad = |why: &str| {
        Error::Invalid(format!(
            "url: {raw:?} {why}; write it like https://example.com/webhooks"
        ))
    };
    if raw.len() > 2048 || raw.contains(char::is_whitespace) {
        return Err(bad(
            "is not an endpoint URL (at most 2048 characters, no spaces)",
        ));
    }
    let u = url::Url::parse(raw).map_err(|e| bad(&format!("is not a URL ({e})")))?;
    if !matches!(u.scheme(), "http" | "https") {
        return Err(bad("has another scheme than http or https"));
    }
    if u.host_str().is_none_or(str::is_empty) {
        return Err(bad("names no host"));
    }
    Ok(raw.to_string())
}

fn check_tenant(t: &str) -> Result<(), Error> {
    if t.is_empty() || t.len() > 200 || t.chars().any(char::is_control) {
        return Err(Error::Invalid(format!(
            "tenant: {t:?} is not a tenant; give 1 to 200 characters without control characters"
        )));
    }
    Ok(())
}

fn check_event_types(types: &[String]) -> Result<(), Error> {
    for t in types {
        if t.trim().is_empty() || t.len() > 200 || t.chars().any(char::is_control) {
            return Err(Error::Invalid(format!(
                "event_types: {t:?} is not an event type; give 1 to 200 characters, such as \"invoice.paid\""
            )));
        }
    }
    Ok(())
}

fn check_headers(h: &std::collections::BTreeMap<String, String>) -> Result<(), Error> {
    signing::check_headers(h).map_err(Error::Invalid)
}
