//! Fan-out: one delivery job per enabled, subscribed endpoint of the event's tenant, one per event
//! and endpoint, five minutes out for an endpoint that is failing (cooldown) and at once for a
//! healthy one. An event for a few endpoints fans out in its publish's own transaction; one for
//! more ([`INLINE_FANOUT`]) in a job of its own, so a publish stays short.

use onus::store::InsertRow;
use onus::{Client, JobContext, JobResult, NewJob, Timestamp};

use crate::model::{DeliverArgs, Endpoint, FanoutArgs};
use crate::{lease_key, sql, EndpointId, Error, EventId, Webhooks, DELIVER};

/// The most endpoints whose deliveries a publish writes itself.
pub(crate) const INLINE_FANOUT: usize = 64;

/// What a fan-out needs to know of its event.
pub(crate) struct Target<'a> {
    pub id: &'a EventId,
    pub event_type: &'a str,
    pub tenant: Option<&'a str>,
    pub only_endpoint: Option<&'a EndpointId>,
}

impl Webhooks {
    pub(crate) async fn fanout(&self, ctx: &JobContext, args: &FanoutArgs) -> JobResult {
        let event = self.event_for_job(&args.event_id).await?;
        let now = ctx.now();
        let client = ctx.client();
        let candidates = match &event.tenant {
            Some(t) => self.endpoints_of(Some(t)).await?,
            None => self.endpoints().await?,
        };
        let target = Target {
            id: &event.id,
            event_type: &event.event_type,
            tenant: event.tenant.as_deref(),
            only_endpoint: event.only_endpoint.as_ref(),
        };
        let deliveries = self
            .deliveries_of(client, &target, candidates, now)
            .map_err(onus::JobError::discard_err)?;
        if deliveries.is_empty() {
            return Ok(());
        }
        let event_id = event.id.clone();
        self.inner
            .db
            .tx(move |tx| {
                Box::pin(async move {
                    sql::insert_deliveries(tx, &event_id, deliveries, now).await?;
                    Ok::<_, Error>(())
                })
            })
            .await?;
        client.notify_inserted(onus::DEFAULT_QUEUE);
        Ok(())
    }

    /// The delivery jobs of an event to `candidates`: those of its tenant (an event of tenant T
    /// reaches only T's endpoints, one without a tenant only endpoints without one), enabled and
    /// subscribed (a test event goes to its one endpoint).
    pub(crate) fn deliveries_of(
        &self,
        client: &Client,
        event: &Target<'_>,
        candidates: Vec<Endpoint>,
        now: Timestamp,
    ) -> Result<Vec<(EndpointId, InsertRow)>, Error> {
        let mut deliveries = Vec::new();
        for e in candidates {
            if e.tenant.as_deref() != event.tenant {
                continue;
            }
            let subscribed = match event.only_endpoint {
                Some(only) => *only == e.id,
                None => {
                    e.event_types.is_empty() || e.event_types.iter().any(|t| t == event.event_type)
                }
            };
            if !e.enabled || !subscribed {
                continue;
            }
            let args = DeliverArgs {
                event_id: event.id.clone(),
                endpoint_id: e.id.clone(),
            };
            // One job per delivery row (event and endpoint): the row, inserted with the job, is
            // what makes a second fan-out of the event add nothing.
            let args = serde_json::to_value(&args).map_err(|e| Error::Invalid(e.to_string()))?;
            let job = NewJob::new(DELIVER, args).lease_key(lease_key(&e.id));
            // A failing endpoint gets new deliveries after a cooldown; a healthy one at once.
            let job = if e.failing_since.is_some() {
                job.run_at(onus::clock::add(now, self.inner.cfg.cooldown))
            } else {
                job
            };
            deliveries.push((e.id, client.prepare(job)?));
        }
        Ok(deliveries)
    }
}
