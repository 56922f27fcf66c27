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
mod deliveries;
mod delivery;
mod endpoints;
mod error;
mod events;
mod fanout;
mod health;
pub mod ids;
mod model;
mod secrets;
pub mod signing;
mod sql;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use onus::store::Db;
use onus::{Builder, Component, JobContext, Kind, NewJob, Policy, Store};
use onus_http::{HttpClient, HttpConfig};

pub use deliveries::{Delivery, EndpointHealth, RATES_READ};
pub use delivery::{CONTENT_TYPE, WEBHOOK_ID, WEBHOOK_SIGNATURE, WEBHOOK_TIMESTAMP};
pub use endpoints::TEST_EVENT;
pub use error::Error;
pub use events::NewEvent;
pub use ids::{AttemptId, EndpointId, EventId};
pub use model::{
    AttemptOutcome, DeliverArgs, DeliveryAttempt, Endpoint, EndpointUpdate, Event, FanoutArgs,
    NewEndpoint, PayloadFormat, MAX_PAYLOAD_BYTES,
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

    fn client(&self) -> Result<&onus::Client, Error> {
        self.inner.client.get().ok_or(Error::NotRegistered)
    }
}
