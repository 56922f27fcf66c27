//! Fan-out: one delivery job per enabled, subscribed endpoint of the event's tenant, one per event and endpoint, five
//! minutes out for an endpoint that is failing (cooldown) and at once for a healthy one.

use onus::{JobContext, JobResult, NewJob};

use crate::model::{DeliverArgs, FanoutArgs};
use crate::{lease_key, sql, Error, Webhooks, DELIVER};

impl Webhooks {
    pub(crate) async fn fanout(&self, ctx: &JobContext, args: &FanoutArgs) -> JobResult {
        let event = self.event_for_job(&args.event_id).await?;
        let now = ctx.now();
        let client = ctx.client();
        let mut deliveries = Vec::new();
        let candidates = match &event.tenant {
            Some(t) => self.endpoints_of(Some(t)).await?,
            None => self.endpoints().await?,
        };
        for e in candidates {
            // An event of tenant T reaches only T's endpoints; one without a tenant only
            // endpoints without one. A test event goes to its one endpoint.
            if e.tenant != event.tenant {
                continue;
            }
            let subscribed = match &event.only_endpoint {
                Some(only) => *only == e.id,
                None => e.event_types.is_empty() || e.event_types.contains(&event.event_type),
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
            let job =
                NewJob::new(DELIVER, serde_json::to_value(&args)?).lease_key(lease_key(&e.id));
            // A failing endpoint gets new deliveries after a cooldown; a healthy one at once.
            let job = if e.failing_since.is_some() {
                job.run_at(onus::clock::add(now, self.inner.cfg.cooldown))
            } else {
                job
            };
            let row = client.prepare(job).map_err(onus::JobError::discard_err)?;
            deliveries.push((e.id, row));
        }
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
}
