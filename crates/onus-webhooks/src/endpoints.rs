//! Endpoints: creating, reading, changing, enabling, disabling and deleting them, and the
//! checks on what they are given.

use onus::sql::Value;
use onus::{JobFilter, JobState};

use crate::events::NewEvent;
use crate::{
    lease_key, signing, sql, Endpoint, EndpointId, EndpointUpdate, Error, Event, NewEndpoint,
    Webhooks, DELIVER,
};

/// The type of the event `POST /endpoints/{id}/test` sends.
pub const TEST_EVENT: &str = "webhook.test";

impl Webhooks {
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

    pub(crate) async fn endpoint_opt(&self, id: &EndpointId) -> Result<Option<Endpoint>, Error> {
        let Some(mut ep) = self.endpoint_row(id).await? else {
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

    /// One endpoint as stored, without when its lease key is held (a delivery, which holds it).
    pub(crate) async fn endpoint_row(&self, id: &EndpointId) -> Result<Option<Endpoint>, Error> {
        let mut rows: Vec<Endpoint> = self
            .inner
            .db
            .read_rows(&sql::ENDPOINT, vec![id.into()])
            .await?;
        Ok(rows.pop())
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

pub(crate) fn check_tenant(t: &str) -> Result<(), Error> {
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
