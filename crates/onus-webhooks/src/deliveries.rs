//! Deliveries: an event's deliveries and attempts, and redelivering discarded ones.

use onus::{JobFilter, JobState, Timestamp};

use crate::{lease_key, sql, DeliveryAttempt, EndpointId, Error, Webhooks, DELIVER};

/// How an endpoint's deliveries went lately (see [`Webhooks::endpoint_health`]).
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointHealth {
    /// Its last delivery attempt.
    pub last: Option<DeliveryAttempt>,
    /// Successful and all attempts over the last hour.
    pub hour: (u64, u64),
    /// Successful and all attempts over the last day.
    pub day: (u64, u64),
    /// More attempts than [`RATES_READ`] in the day: the figures are of the latest ones.
    pub capped: bool,
}

/// The most of an endpoint's latest attempts [`Webhooks::endpoint_health`] reads.
pub const RATES_READ: u64 = 10_000;

#[derive(Debug, Default)]
struct Rates {
    day_total: u64,
    day_ok: u64,
    hour_total: u64,
    hour_ok: u64,
}

impl onus::sql::FromRow for Rates {
    fn from_row(r: &onus::sql::Row) -> onus::StoreResult<Self> {
        let n = |c: &str| -> onus::StoreResult<u64> { Ok(r.get::<i64>(c)?.max(0) as u64) };
        Ok(Rates {
            day_total: n("day_total")?,
            day_ok: n("day_ok")?,
            hour_total: n("hour_total")?,
            hour_ok: n("hour_ok")?,
        })
    }
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

impl Webhooks {
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

    /// How an endpoint's deliveries went lately: its last attempt, and how many of its attempts
    /// succeeded over the hour and the day before `now` (of its latest [`RATES_READ`] at most).
    pub async fn endpoint_health(&self, id: &str, now: Timestamp) -> Result<EndpointHealth, Error> {
        let last = self.endpoint_attempts(id, 1, None).await?.pop();
        let params = vec![
            (now - chrono::TimeDelta::hours(1)).into(),
            id.into(),
            (now - chrono::TimeDelta::days(1)).into(),
            (RATES_READ as i64).into(),
        ];
        let rates: Vec<Rates> = self
            .inner
            .db
            .read_rows(&sql::ENDPOINT_RATES, params)
            .await?;
        let r = rates.into_iter().next().unwrap_or_default();
        Ok(EndpointHealth {
            last,
            hour: (r.hour_ok, r.hour_total),
            day: (r.day_ok, r.day_total),
            capped: r.day_total >= RATES_READ,
        })
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
        let client = self.client()?;
        // The jobs' states before the attempts: an attempt is written with its job's end or
        // before it, so a job read as finished has its attempts in the later read.
        let ids: Vec<i64> = rows.iter().filter_map(|r| r.job_id).collect();
        let mut states = std::collections::HashMap::new();
        for ids in ids.chunks(10_000) {
            let f = JobFilter {
                ids: ids.to_vec(),
                ..JobFilter::default()
            };
            for job in client.list(&f, ids.len(), None).await? {
                states.insert(job.id, job.state);
            }
        }
        let attempts = self.attempts(event_id).await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let mine: Vec<DeliveryAttempt> = attempts
                .iter()
                .filter(|a| a.endpoint_id == r.endpoint_id)
                .cloned()
                .collect();
            // Deliveries recorded before their job was: the job of their attempts.
            let job_id = r.job_id.or_else(|| mine.first().map(|a| a.job_id));
            let state = match (job_id, r.job_id) {
                (Some(j), Some(_)) => states.get(&j).copied(),
                (Some(j), None) => match client.get(j).await {
                    Ok(job) => Some(job.state),
                    Err(onus::Error::Store(onus::StoreError::NotFound(_))) => None,
                    Err(e) => return Err(e.into()),
                },
                (None, _) => None,
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

    /// Every attempt to deliver an event, oldest first.
    pub async fn attempts(&self, event_id: &str) -> Result<Vec<DeliveryAttempt>, Error> {
        Ok(self
            .inner
            .db
            .read_rows(&sql::ATTEMPTS_OF_EVENT, vec![event_id.into()])
            .await?)
    }
}
