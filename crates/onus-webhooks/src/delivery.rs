//! One delivery attempt, in three stages: prepare the signed request, make the one call, record
//! the outcome and the endpoint's health. The handler only classifies; the job layer retries.

use onus::{JobContext, JobError, JobResult, Timestamp};
use onus_http::{Request, Sent};

use crate::health::disable_reason;
use crate::ids::AttemptId;
use crate::model::{AttemptOutcome, DeliverArgs, DeliveryAttempt, Endpoint, Event};
use crate::{sql, Error, Webhooks};

pub use crate::signing::{WEBHOOK_ID, WEBHOOK_SIGNATURE, WEBHOOK_TIMESTAMP};

/// The body's content type.
pub const CONTENT_TYPE: &str = "content-type";

/// The most characters of a response body kept with an attempt.
const EXCERPT_CHARS: usize = 512;

/// A request ready to send, and what it is for.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub endpoint: Endpoint,
    pub event: Event,
    pub request: Request,
}

/// Webhook answers by status class (`2xx`, `4xx`, `5xx`, ...; `none` when no answer came).
pub const RESPONSES: &str = "onus_webhook_responses_total";

impl Webhooks {
    /// Stage 1: the endpoint and event, checked, and the signed request. A gone or disabled
    /// endpoint, or a pruned event, discards the delivery.
    pub(crate) async fn prepare(
        &self,
        args: &DeliverArgs,
        now: Timestamp,
    ) -> Result<Prepared, JobError> {
        let Some(endpoint) = self.endpoint_row(&args.endpoint_id).await? else {
            return Err(JobError::discard(format!(
                "endpoint {} is gone",
                args.endpoint_id
            )));
        };
        if !endpoint.enabled {
            return Err(JobError::discard(format!(
                "endpoint {} is disabled: {}",
                endpoint.id,
                endpoint.disabled_reason.as_deref().unwrap_or("by request")
            )));
        }
        let event = self.event_for_job(&args.event_id).await?;
        // The envelope (type, timestamp, data) unless the endpoint asked for the bare payload;
        // the signature covers the body as sent.
        let body =
            serde_json::to_vec(&endpoint.payload.body(&event)).map_err(JobError::discard_err)?;
        // The time of this attempt.
        let stamp = now.timestamp();
        // A key problem is the operator's to fix, not the event's: retry, do not discard.
        let secrets = self
            .plain_secrets(&endpoint)
            .map_err(|e| JobError::retryable(format!("endpoint {}: {e}", endpoint.id)))?;
        let headers =
            crate::signing::signed_headers(&endpoint.headers, &secrets, &event.id, stamp, &body)
                .map_err(JobError::discard_err)?;
        let request = Request {
            method: "POST".into(),
            url: endpoint.url.clone(),
            headers,
            body: Some(body),
        };
        Ok(Prepared {
            endpoint,
            event,
            request,
        })
    }

    /// Stage 2: the one call.
    pub(crate) async fn call(&self, p: &Prepared, now: Timestamp) -> Sent {
        self.inner
            .http
            .send(&p.request, now, self.inner.cfg.snooze_cap)
            .await
    }

    /// Stage 3: the attempt's record, the endpoint's health, and the classification for the job
    /// layer.
    pub(crate) async fn record(&self, ctx: &JobContext, p: Prepared, sent: Sent) -> JobResult {
        let now = ctx.now();
        let attempt = DeliveryAttempt {
            id: AttemptId::random(),
            event_id: p.event.id.clone(),
            endpoint_id: p.endpoint.id.clone(),
            job_id: ctx.job().id,
            attempt: ctx.attempt(),
            attempted_at: now,
            status: sent.status,
            duration_ms: sent.duration.as_micros() as f64 / 1000.0,
            response_excerpt: sent.excerpt.chars().take(EXCERPT_CHARS).collect(),
            error: sent.error.clone(),
            outcome: AttemptOutcome::of(&sent.class),
        };
        let ep = p.endpoint.id.clone();
        let reset_before = onus::clock::sub(now, self.inner.cfg.failure_reset);
        let success = sent.class.is_success();
        // A destination the guard refused was never reached: the endpoint did not fail (its
        // other deliveries get no cooldown), the delivery is discarded as unsendable.
        let refused = sent.blocked.is_some();
        if success {
            // The attempt's record, the endpoint's health and the job's completion (its lease
            // key let go of, the key's next delivery woken) in one commit. An endpoint that was
            // not failing when this delivery read it is left as it is: only its own deliveries
            // mark it failing, one at a time under its lease key.
            let (a, e) = (attempt.clone(), ep.clone());
            let failing = p.endpoint.failing_since.is_some();
            let done = ctx
                .complete_with(move |tx| {
                    Box::pin(async move {
                        sql::insert_attempt(tx, &a).await?;
                        if failing {
                            sql::mark_healthy(tx, &e).await?;
                        }
                        Ok::<_, Error>(())
                    })
                })
                .await;
            match done {
                Ok(()) => return Ok(()),
                // The lease was lost meanwhile: the attempt is still recorded on its own below,
                // and the job layer decides what becomes of the job.
                Err(Error::Store(onus::StoreError::Conflict(_))) => {}
                // The commit may have happened unseen (a connection lost at the commit): if the
                // job is completed at this attempt, its record is written already.
                Err(_) => {
                    let job = ctx.client().get(ctx.job().id).await;
                    if job.is_ok_and(|j| {
                        j.state == onus::JobState::Completed && j.attempt == ctx.attempt()
                    }) {
                        return Ok(());
                    }
                }
            }
        }
        let failing_since = self
            .inner
            .db
            .tx(move |tx| {
                Box::pin(async move {
                    sql::insert_attempt(tx, &attempt).await?;
                    if success {
                        sql::mark_healthy(tx, &ep).await?;
                        return Ok::<_, Error>(None);
                    }
                    if refused {
                        return Ok(None);
                    }
                    Ok(sql::mark_failing(tx, &ep, now, reset_before).await?)
                })
            })
            .await?;
        if success {
            return Ok(());
        }
        if refused {
            return sent.job_result(ctx.job());
        }
        let failing_since = failing_since.unwrap_or(now);
        if let Some(reason) = disable_reason(
            sent.status,
            failing_since,
            now,
            self.inner.cfg.disable_after,
        ) {
            tracing::warn!(endpoint = %p.endpoint.id, reason = %reason, "disabling webhook endpoint");
            self.disable(&p.endpoint.id, &reason).await?;
            return Err(JobError::discard(format!(
                "endpoint {} disabled: {reason}",
                p.endpoint.id
            )));
        }
        sent.job_result(ctx.job())
    }

    /// A delivery job: prepare, call, record.
    pub(crate) async fn deliver(&self, ctx: &JobContext, args: &DeliverArgs) -> JobResult {
        let p = match self.prepare(args, ctx.now()).await {
            Ok(p) => p,
            Err(e) => {
                // An attempt that sends nothing (a gone or disabled endpoint) counts as such.
                self.inner.http.record_unsent();
                return Err(e);
            }
        };
        let sent = self.call(&p, ctx.now()).await;
        let class = match sent.status {
            Some(s @ 100..=599) => ["1xx", "2xx", "3xx", "4xx", "5xx"][usize::from(s / 100 - 1)],
            _ => "none",
        };
        metrics::counter!(RESPONSES, "class" => class).increment(1);
        let result = self.record(ctx, p, sent.clone()).await;
        self.inner.http.record(&sent, &result);
        result
    }
}
