//! Events: publishing them (on their own or inside the caller's transaction), reading and
//! pruning them.

use onus::sql::Tx;
use onus::store::JobTx;
use onus::{JobError, NewJob, Timestamp};

use crate::endpoints::check_tenant;
use crate::{
    sql, EndpointId, Error, Event, EventId, FanoutArgs, Webhooks, FANOUT, MAX_PAYLOAD_BYTES,
};

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

/// An event and its fan-out job, checked and ready to write.
#[derive(Debug, Clone)]
struct Publish {
    event: sql::EventRow,
    fanout: onus::store::InsertRow,
}

impl Webhooks {
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
        // Publishes arriving together share a commit (`Db::tx_shared`).
        let fresh = self
            .inner
            .db
            .tx_shared({
                let hooks = self.clone();
                move |tx| {
                    let (hooks, p) = (hooks.clone(), p.clone());
                    Box::pin(async move { hooks.write_publish(tx, p).await })
                }
            })
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
        self.write_publish(tx, p).await?;
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

    /// The event a job is about: gone means pruned (discard); any other failure is retryable.
    pub(crate) async fn event_for_job(&self, id: &EventId) -> Result<Event, JobError> {
        match self.event_opt(id).await? {
            Some(e) => Ok(e),
            None => Err(JobError::discard(format!("event {id} was pruned"))),
        }
    }
}

impl Webhooks {
    /// Writes the event and, when it is new, its fan-out: the deliveries themselves when the
    /// event's tenant has few endpoints, its fan-out job when it has many. The id when the event
    /// is new, `None` when one with its id was there already.
    async fn write_publish<T: Tx + ?Sized>(
        &self,
        tx: &T,
        p: Publish,
    ) -> Result<Option<EventId>, Error> {
        if !sql::insert_event(tx, &p.event).await? {
            return Ok(None);
        }
        let e = &p.event;
        let candidates =
            sql::endpoints_upto(tx, e.tenant.as_deref(), crate::fanout::INLINE_FANOUT + 1).await?;
        if candidates.len() > crate::fanout::INLINE_FANOUT {
            tx.insert_job(p.fanout).await?;
        } else {
            let target = crate::fanout::Target {
                id: &e.id,
                event_type: &e.event_type,
                tenant: e.tenant.as_deref(),
                only_endpoint: e.only_endpoint.as_ref(),
            };
            let deliveries = self.deliveries_of(self.client()?, &target, candidates, e.now)?;
            if !deliveries.is_empty() {
                sql::insert_deliveries(tx, &e.id, deliveries, e.now).await?;
            }
        }
        Ok(Some(p.event.id))
    }
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
