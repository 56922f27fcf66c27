//! # onus-mail: durable SMTP mail on the Onus job layer
//!
//! A `mail.send` job sends one message through the configured relay, one SMTP session per job
//! attempt, and only *classifies* the result: 4xx replies and connection, TLS and timeout
//! failures are retryable, 5xx replies permanent. The job layer retries under the `mail` policy
//! (8 attempts, 20 s x3) and raises an alert when they are spent; nothing here tries twice.
//!
//! - **A stable Message-ID**: `<event_id@domain>` (or `<onus-job-ID@domain>`) on every attempt,
//!   so copies fold in the recipient's mailbox.
//! - **Send, then mark**: once the relay accepted the message, the job is completed in one
//!   transaction with the mark (a row in `onus_mail_sent`, the `after_send` job, the
//!   [`Mail::on_sent`] step). A crash between the two sends a second copy with the same
//!   Message-ID, never zero copies.
//! - **Per-recipient rate window** (30 per hour): when spent the job snoozes to the next window,
//!   no attempt spent. **Per-owner burst cap** (5 per hour): beyond it the mail is dropped on
//!   purpose (`discarded`, reason `dropped`), counted, and no alert is raised. A mail takes its
//!   uses once, on the attempt that first gets past them; its retries take none.
//! - A relay that accepts some recipients and refuses others completes the job and records each
//!   refused recipient with its reply.

mod args;
mod smtp;

use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use lettre::message::dkim::{DkimConfig, DkimSigningAlgorithm, DkimSigningKey};
use lettre::message::Mailbox;
use onus::sql::{AnyTx, Line, LocalFuture, Sql, Tx, Value};
use onus::store::{Db, JobTx};
use onus::{
    Builder, Component, JobContext, JobError, JobResult, Kind, NewJob, Policy, RateWindow,
    StoreError, WhenSpent,
};

pub use args::{normalise, AfterSend, Recipients, SendArgs};
pub use smtp::{Accepted, Refused, Relay, Security, SendError};

/// The kind that sends one mail.
pub const SEND: &str = "mail.send";
/// The hourly kind that prunes old sent records.
pub const PRUNE: &str = "mail.prune";

/// The mail tables' migration line.
pub static MIGRATIONS: Line = Line {
    name: "mail",
    sqlite: onus::migrations!("../migrations/sqlite", "001_mail.sql"),
    postgres: onus::migrations!("../migrations/postgres", "001_mail.sql"),
};

static INSERT_SENT: Sql = Sql::new(
    "onus_mail_sent",
    "INSERT INTO onus_mail_sent (job_id, message_id, sent_at, attempt, accepted, refused)
     VALUES ($1, $2, $3, $4, $5, $6)",
);

static TAKEN: Sql = Sql::new(
    "onus_mail_limits_taken",
    "SELECT job_id FROM onus_mail_limits_taken WHERE job_id = $1",
);

static MARK_TAKEN: Sql = Sql::new(
    "onus_mail_limits_taken",
    "INSERT INTO onus_mail_limits_taken (job_id, taken_at) VALUES ($1, $2) ON CONFLICT (job_id) DO NOTHING",
);

static FORGET_TAKEN: Sql = Sql::new(
    "onus_mail_limits_taken",
    "DELETE FROM onus_mail_limits_taken WHERE job_id = $1",
);

static PRUNE_SENT: Sql = Sql::new(
    "onus_mail_sent",
    "DELETE FROM onus_mail_sent WHERE sent_at < $1",
);

static PRUNE_TAKEN: Sql = Sql::new(
    "onus_mail_limits_taken",
    "DELETE FROM onus_mail_limits_taken WHERE taken_at < $1",
);

static SENT: Sql = Sql::new(
    "onus_mail_sent",
    "SELECT job_id, message_id, sent_at, attempt, accepted, refused FROM onus_mail_sent WHERE job_id = $1",
);

/// A mail failure outside a send: configuration or storage.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration cannot work; the message names the key and what to write.
    #[error("mail configuration: {0}")]
    Config(String),
    /// The args of a mail are wrong; the message names the field.
    #[error("{0}")]
    Invalid(String),
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// DKIM signing (`dkim = { domain, selector, key_file }`).
#[derive(Clone)]
pub struct Dkim {
    config: Arc<DkimConfig>,
}

impl std::fmt::Debug for Dkim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Dkim(..)")
    }
}

impl Dkim {
    /// Signs as `selector._domainkey.domain` with the RSA private key in PEM `key_pem`
    /// (PKCS#1, `-----BEGIN RSA PRIVATE KEY-----`: `openssl genrsa -traditional 2048`).
    pub fn new(domain: &str, selector: &str, key_pem: &str) -> Result<Dkim, Error> {
        let key = DkimSigningKey::new(key_pem, DkimSigningAlgorithm::Rsa).map_err(|e| {
            Error::Config(format!(
                "dkim.key_file: not an RSA private key in PKCS#1 PEM ({e}); make one with `openssl genrsa -traditional 2048`"
            ))
        })?;
        Ok(Dkim {
            config: Arc::new(DkimConfig::default_config(
                selector.to_string(),
                domain.to_string(),
                key,
            )),
        })
    }
}

/// Mail settings (`[mail]` in `onus.toml`).
#[derive(Debug, Clone)]
pub struct MailConfig {
    /// The relay.
    pub relay: Relay,
    /// The sender when a mail names none.
    pub from: Option<Mailbox>,
    /// The right part of every Message-ID, and the name given in `EHLO`.
    pub message_id_domain: String,
    /// Time for one whole session (connect to QUIT).
    pub timeout: Duration,
    /// Time to connect.
    pub connect_timeout: Duration,
    /// Per recipient: at most this many mails per window; when spent, the mail snoozes.
    pub recipient_limit: (u32, Duration),
    /// Per owner: at most this many mails per window; beyond, the mail is dropped.
    pub owner_limit: (u32, Duration),
    /// DKIM signing, when set.
    pub dkim: Option<Dkim>,
    /// How long sent records (and the marks of mails that took their limits but were never
    /// sent) are kept.
    pub retention: Duration,
}

impl MailConfig {
    /// Settings for `relay` with the defaults: 30 s per session, 10 s to connect, 30 mails per
    /// recipient per hour, 5 per owner per hour.
    pub fn new(relay: Relay, message_id_domain: impl Into<String>) -> Self {
        MailConfig {
            relay,
            from: None,
            message_id_domain: message_id_domain.into(),
            timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            recipient_limit: (30, Duration::from_secs(3600)),
            owner_limit: (5, Duration::from_secs(3600)),
            dkim: None,
            retention: Duration::from_secs(30 * 86_400),
        }
    }
}

/// A mail the relay accepted, as recorded with its mark.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Sent {
    /// The job.
    pub job_id: i64,
    /// Its Message-ID.
    pub message_id: String,
    /// When the relay accepted it.
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub sent_at: onus::Timestamp,
    /// The attempt that sent it.
    pub attempt: u32,
    /// The recipients the relay took.
    pub accepted: Vec<String>,
    /// The recipients it refused, with its replies.
    pub refused: Vec<Refused>,
}

impl onus::sql::FromRow for Sent {
    fn from_row(r: &onus::sql::Row) -> onus::StoreResult<Self> {
        let accepted: onus::sql::Json<Vec<String>> = r.get("accepted")?;
        let refused: onus::sql::Json<Vec<Refused>> = r.get("refused")?;
        Ok(Sent {
            job_id: r.get("job_id")?,
            message_id: r.get("message_id")?,
            sent_at: r.get("sent_at")?,
            attempt: r.get::<i64>("attempt")? as u32,
            accepted: accepted.0,
            refused: refused.0,
        })
    }
}

/// A step run in the transaction that marks a mail sent (see [`Mail::on_sent`]).
pub type OnSent = Arc<
    dyn for<'t> Fn(&'t AnyTx<'t>, &'t SendArgs, &'t Sent) -> LocalFuture<'t, onus::StoreResult<()>>
        + Send
        + Sync,
>;

struct Inner {
    cfg: MailConfig,
    db: OnceLock<Db>,
    on_sent: Option<OnSent>,
}

/// Durable mail: the `mail.send` kind. Register it with
/// [`Builder::component`](onus::Builder::component).
#[derive(Clone)]
pub struct Mail {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Mail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mail")
            .field("relay", &self.inner.cfg.relay)
            .finish()
    }
}

/// The metric counting mails dropped by the per-owner cap.
pub const DROPPED_METRIC: &str = "onus_mail_dropped_total";

impl Mail {
    /// Mail through `cfg`'s relay.
    pub fn new(cfg: MailConfig) -> Self {
        Mail {
            inner: Arc::new(Inner {
                cfg,
                db: OnceLock::new(),
                on_sent: None,
            }),
        }
    }

    /// Runs `step` in the transaction that completes every sent mail (set a `notified_at`,
    /// delete a pending row): it commits with the mark or not at all. Its error rolls the mark
    /// back, and the mail is tried again (a second copy, with the same Message-ID).
    pub fn on_sent(
        self,
        step: impl for<'t> Fn(
                &'t AnyTx<'t>,
                &'t SendArgs,
                &'t Sent,
            ) -> LocalFuture<'t, onus::StoreResult<()>>
            + Send
            + Sync
            + 'static,
    ) -> Self {
        let inner = Inner {
            cfg: self.inner.cfg.clone(),
            db: OnceLock::new(),
            on_sent: Some(Arc::new(step)),
        };
        Mail {
            inner: Arc::new(inner),
        }
    }

    /// The settings.
    pub fn config(&self) -> &MailConfig {
        &self.inner.cfg
    }

    /// A mail job of `args` (checked now: the error names the field).
    pub fn job(&self, args: &SendArgs) -> Result<NewJob, Error> {
        args.check(self.inner.cfg.from.as_ref())
            .map_err(Error::Invalid)?;
        let v = serde_json::to_value(args).map_err(|e| Error::Invalid(e.to_string()))?;
        Ok(NewJob::new(SEND, v))
    }

    /// The record of a sent mail job, if the relay accepted it.
    pub async fn sent(&self, job_id: i64) -> Result<Option<Sent>, Error> {
        sent_record(self.db()?, job_id).await
    }

    /// Deletes sent records older than the retention (and the limit marks of mails never sent);
    /// returns how many rows went. Runs hourly as `mail.prune`.
    pub async fn prune(&self, now: onus::Timestamp) -> Result<u64, Error> {
        let before = onus::clock::sub(now, self.inner.cfg.retention);
        Ok(self
            .db()?
            .tx(move |tx| {
                Box::pin(async move {
                    let a = tx.execute(&PRUNE_SENT, &[before.into()]).await?;
                    let b = tx.execute(&PRUNE_TAKEN, &[before.into()]).await?;
                    Ok::<u64, StoreError>(a + b)
                })
            })
            .await?)
    }

    fn db(&self) -> Result<&Db, Error> {
        self.inner.db.get().ok_or_else(|| {
            Error::Config("the mail component is not installed (Builder::component)".into())
        })
    }

    fn limits(&self) -> (RateWindow, RateWindow) {
        let c = &self.inner.cfg;
        (
            RateWindow::new(
                "mail.recipient",
                c.recipient_limit.0,
                c.recipient_limit.1,
                WhenSpent::Snooze,
            ),
            RateWindow::new(
                "mail.owner",
                c.owner_limit.0,
                c.owner_limit.1,
                WhenSpent::Drop,
            ),
        )
    }

    /// One attempt of a `mail.send` job.
    async fn send(&self, ctx: JobContext) -> JobResult {
        let args = SendArgs::decode(&ctx.job().args).map_err(JobError::discard)?;
        let cfg = &self.inner.cfg;
        let checked = args.check(cfg.from.as_ref()).map_err(JobError::discard)?;
        let rcpts = checked.recipients();
        // Everything that could refuse the mark is checked before anything is sent.
        let after = match &args.after_send {
            Some(a) => Some(
                ctx.client()
                    .prepare(NewJob::new(a.kind.clone(), a.args.clone()))
                    .map_err(|e| JobError::discard(format!("after_send: {e}")))?,
            ),
            None => None,
        };
        // The limits are taken once per mail: an attempt after one that took them (and failed,
        // died or was handed back) takes none.
        let db = self.db().map_err(JobError::discard_err)?;
        let job_id = ctx.job().id;
        let taken = !db
            .read_rows::<JobIdRow>(&TAKEN, vec![job_id.into()])
            .await?
            .is_empty();
        if !taken {
            let (per_recipient, per_owner) = self.limits();
            let keys: Vec<String> = rcpts.iter().map(normalise).collect();
            let mut asks: Vec<(&RateWindow, &str)> =
                keys.iter().map(|k| (&per_recipient, k.as_str())).collect();
            if let Some(owner) = &args.owner {
                asks.push((&per_owner, owner.as_str()));
            }
            if let Err(e) = ctx.take_all(&asks).await {
                if matches!(e, JobError::Drop(_)) {
                    metrics::counter!(DROPPED_METRIC).increment(1);
                }
                return Err(e);
            }
            db.execute(&MARK_TAKEN, vec![job_id.into(), ctx.now().into()])
                .await?;
        }
        let message_id = args.message_id(ctx.job().id, &cfg.message_id_domain);
        let date = SystemTime::from(ctx.now());
        let mut message = args
            .message(&checked, message_id.clone(), date)
            .map_err(JobError::discard)?;
        if let Some(d) = &cfg.dkim {
            message.sign(&d.config);
        }
        let bytes = message.formatted();
        let from = checked.from.email.clone();
        let accepted = smtp::send(
            &cfg.relay,
            &cfg.message_id_domain,
            cfg.connect_timeout,
            cfg.timeout,
            &from,
            &rcpts,
            &bytes,
        )
        .await
        .map_err(|e| match e {
            SendError::Transient(m) => JobError::retryable(m),
            SendError::Permanent(m) => JobError::discard(m),
        })?;
        for r in &accepted.refused {
            tracing::info!(job = ctx.job().id, recipient = %r.address, reply = %r.reply, "the relay refused a recipient");
        }
        let sent = Sent {
            job_id: ctx.job().id,
            message_id,
            sent_at: ctx.now(),
            attempt: ctx.attempt(),
            accepted: accepted.accepted,
            refused: accepted.refused,
        };
        let on_sent = self.inner.on_sent.clone();
        ctx.complete_with(move |tx| {
            Box::pin(async move {
                mark(tx, &sent).await?;
                tx.execute(&FORGET_TAKEN, &[sent.job_id.into()]).await?;
                if let Some(row) = after {
                    tx.insert_job(row).await?;
                }
                if let Some(step) = &on_sent {
                    step(tx, &args, &sent).await?;
                }
                Ok::<(), StoreError>(())
            })
        })
        .await?;
        Ok(())
    }
}

/// The record of sent mail job `job_id` in `db` (whose mail line is migrated), if the relay
/// accepted it: what a front door shows without holding the component.
pub async fn sent_record(db: &Db, job_id: i64) -> Result<Option<Sent>, Error> {
    Ok(db
        .read_rows::<Sent>(&SENT, vec![job_id.into()])
        .await?
        .into_iter()
        .next())
}

/// A row holding one job id.
struct JobIdRow;

impl onus::sql::FromRow for JobIdRow {
    fn from_row(r: &onus::sql::Row) -> onus::StoreResult<Self> {
        r.get::<i64>("job_id").map(|_| JobIdRow)
    }
}

async fn mark<T: Tx + ?Sized>(tx: &T, s: &Sent) -> onus::StoreResult<()> {
    tx.execute(
        &INSERT_SENT,
        &[
            s.job_id.into(),
            s.message_id.as_str().into(),
            s.sent_at.into(),
            s.attempt.into(),
            Value::json(&s.accepted)?,
            Value::json(&s.refused)?,
        ],
    )
    .await?;
    Ok(())
}

impl Component for Mail {
    fn migrations(&self) -> Option<&'static Line> {
        Some(&MIGRATIONS)
    }

    /// The `mail.send` kind, under the `mail` policy, its args checked at insert, and the
    /// hourly `mail.prune`.
    fn install(&self, b: Builder) -> Builder {
        let p = self.clone();
        let hourly = onus::Schedule::every(Duration::from_secs(3600))
            .unwrap_or_else(|_| unreachable!("an hour is a valid interval"));
        let b = b
            .kind(Kind::new(PRUNE).policy(Policy::preset_periodic()).handler(
                move |ctx: JobContext| {
                    let m = p.clone();
                    async move {
                        m.prune(ctx.now()).await?;
                        Ok(())
                    }
                },
            ))
            .periodic(onus::Periodic::new(
                PRUNE,
                hourly,
                NewJob::new(PRUNE, serde_json::json!({})),
            ));
        let m = self.clone();
        let default_from = self.inner.cfg.from.clone();
        // The attempt outlives its session (connect, talk, QUIT), whatever the session's timeout.
        let mut policy = Policy::preset_mail();
        let session =
            self.inner.cfg.timeout + self.inner.cfg.connect_timeout + Duration::from_secs(10);
        policy.timeout = policy.timeout.max(session);
        b.kind(
            Kind::new(SEND)
                .policy(policy)
                .check_args(move |v| {
                    SendArgs::decode(v)?
                        .check(default_from.as_ref())
                        .map(|_| ())
                })
                .handler(move |ctx: JobContext| {
                    let m = m.clone();
                    async move { m.send(ctx).await }
                }),
        )
    }

    fn bind(&self, client: onus::Client) {
        let _ = self.inner.db.set(Db::new(client.store().clone()));
    }
}
