//! Every statement on the webhook tables, and the operations made of them, each written once as
//! a function generic over [`Tx`] so it runs in the component's own transactions and in the
//! caller's alike. Times, flags and JSON are bound as [`Value`]s in each backend's convention.

use onus::sql::{Line, Row, Sql, Tx, Value};
use onus::store::{InsertRow, JobTx};
use onus::{StoreResult, Timestamp};

use crate::ids::{EndpointId, EventId};
use crate::model::{DeliveryAttempt, Endpoint};

/// The webhook tables' migration line.
pub static MIGRATIONS: Line = Line {
    name: "webhooks",
    sqlite: onus::migrations!(
        "../migrations/sqlite",
        "001_tables.sql",
        "002_tenants_and_headers.sql",
        "003_payload_format.sql"
    ),
    postgres: onus::migrations!(
        "../migrations/postgres",
        "001_tables.sql",
        "002_native_types.sql",
        "003_tenants_and_headers.sql",
        "004_payload_format.sql"
    ),
};

const ENDPOINTS: &str = "onus_endpoints";
const EVENTS: &str = "onus_events";
const DELIVERIES: &str = "onus_deliveries";
const ATTEMPTS: &str = "onus_delivery_attempts";

static INSERT_ENDPOINT: Sql = Sql::new(
    ENDPOINTS,
    "INSERT INTO onus_endpoints (id, url, description, event_types, secrets, enabled, created_at, updated_at, tenant, headers, payload)
     VALUES ($1, $2, $3, $4, $5, TRUE, $6, $6, $7, $8, $9)
     RETURNING id, url, description, event_types, secrets, enabled, disabled_reason, disabled_at, failing_since, last_failure_at, created_at, tenant, headers, payload",
);

pub(crate) static ENDPOINT: Sql = Sql::new(
    ENDPOINTS,
    "SELECT id, url, description, event_types, secrets, enabled, disabled_reason, disabled_at, failing_since, last_failure_at, created_at, tenant, headers, payload
     FROM onus_endpoints WHERE id = $1",
);

pub(crate) static ALL_ENDPOINTS: Sql = Sql::new(
    ENDPOINTS,
    "SELECT id, url, description, event_types, secrets, enabled, disabled_reason, disabled_at, failing_since, last_failure_at, created_at, tenant, headers, payload
     FROM onus_endpoints ORDER BY created_at, id",
);

pub(crate) static TENANT_ENDPOINTS: Sql = Sql::new(
    ENDPOINTS,
    "SELECT id, url, description, event_types, secrets, enabled, disabled_reason, disabled_at, failing_since, last_failure_at, created_at, tenant, headers, payload
     FROM onus_endpoints WHERE tenant = $1 ORDER BY created_at, id",
);

// The first endpoints of a tenant ($1), at most $2: a publish reads them to fan out itself.
static TENANT_ENDPOINTS_UPTO: Sql = Sql::new(
    ENDPOINTS,
    "SELECT id, url, description, event_types, secrets, enabled, disabled_reason, disabled_at, failing_since, last_failure_at, created_at, tenant, headers, payload
     FROM onus_endpoints WHERE tenant = $1 ORDER BY created_at, id LIMIT $2",
);

// The first endpoints without a tenant, at most $1.
static UNTENANTED_ENDPOINTS_UPTO: Sql = Sql::new(
    ENDPOINTS,
    "SELECT id, url, description, event_types, secrets, enabled, disabled_reason, disabled_at, failing_since, last_failure_at, created_at, tenant, headers, payload
     FROM onus_endpoints WHERE tenant IS NULL ORDER BY created_at, id LIMIT $1",
);

pub(crate) static UPDATE_ENDPOINT: Sql = Sql::new(
    ENDPOINTS,
    "UPDATE onus_endpoints SET url = $1, description = $2, event_types = $3, headers = $4, updated_at = $5, payload = $6 WHERE id = $7
     RETURNING id, url, description, event_types, secrets, enabled, disabled_reason, disabled_at, failing_since, last_failure_at, created_at, tenant, headers, payload",
);

pub(crate) static SET_SECRETS: Sql = Sql::new(
    ENDPOINTS,
    "UPDATE onus_endpoints SET secrets = $1, updated_at = $2 WHERE id = $3",
);

pub(crate) static DELETE_ENDPOINT: Sql = Sql::new(
    ENDPOINTS,
    "DELETE FROM onus_endpoints WHERE id = $1 RETURNING id",
);

pub(crate) static ENABLE: Sql = Sql::new(
    ENDPOINTS,
    "UPDATE onus_endpoints SET enabled = TRUE, disabled_reason = NULL, disabled_at = NULL, failing_since = NULL, last_failure_at = NULL,
        updated_at = $1 WHERE id = $2
     RETURNING id, url, description, event_types, secrets, enabled, disabled_reason, disabled_at, failing_since, last_failure_at, created_at, tenant, headers, payload",
);

pub(crate) static DISABLE: Sql = Sql::new(
    ENDPOINTS,
    "UPDATE onus_endpoints SET enabled = FALSE, disabled_reason = $1, disabled_at = COALESCE(disabled_at, $2), updated_at = $2
     WHERE id = $3 RETURNING id",
);

static MARK_HEALTHY: Sql = Sql::new(
    ENDPOINTS,
    "UPDATE onus_endpoints SET failing_since = NULL, last_failure_at = NULL WHERE id = $1 AND failing_since IS NOT NULL",
);

static MARK_FAILING: Sql = Sql::new(
    ENDPOINTS,
    "UPDATE onus_endpoints SET
        failing_since = CASE WHEN failing_since IS NULL OR last_failure_at IS NULL OR last_failure_at < $1
                        THEN $2 ELSE failing_since END,
        last_failure_at = $2, updated_at = $2
     WHERE id = $3 RETURNING failing_since",
);

static INSERT_EVENT: Sql = Sql::new(
    EVENTS,
    "INSERT INTO onus_events (id, type, payload, created_at, tenant, only_endpoint) VALUES ($1, $2, $3, $4, $5, $6)
     ON CONFLICT (id) DO NOTHING RETURNING id",
);

pub(crate) static EVENT: Sql = Sql::new(
    EVENTS,
    "SELECT id, type, payload, created_at, tenant, only_endpoint FROM onus_events WHERE id = $1",
);

/// A page of events, newest first, optionally of one tenant and one type, after a cursor.
pub(crate) static EVENTS_PAGE: Sql = Sql::per_backend(
    EVENTS,
    "SELECT id, type, payload, created_at, tenant, only_endpoint FROM onus_events
     WHERE ($1 IS NULL OR tenant = $1) AND ($2 IS NULL OR type = $2)
       AND ($3 IS NULL OR created_at < $3 OR (created_at = $3 AND id < $4))
     ORDER BY created_at DESC, id DESC LIMIT $5",
    // PostgreSQL types a parameter from its first use: a bare `$n IS NULL` names none.
    "SELECT id, type, payload, created_at, tenant, only_endpoint FROM onus_events
     WHERE ($1::text IS NULL OR tenant = $1) AND ($2::text IS NULL OR type = $2)
       AND ($3::timestamptz IS NULL OR created_at < $3 OR (created_at = $3 AND id < $4::text))
     ORDER BY created_at DESC, id DESC LIMIT $5",
);

/// A page of an endpoint's attempts, newest first, after a cursor.
pub(crate) static ATTEMPTS_OF_ENDPOINT: Sql = Sql::per_backend(
    ATTEMPTS,
    "SELECT id, event_id, endpoint_id, job_id, attempt, attempted_at, status, duration_us, response_excerpt, error, outcome
     FROM onus_delivery_attempts
     WHERE endpoint_id = $1 AND ($2 IS NULL OR attempted_at < $2 OR (attempted_at = $2 AND id < $3))
     ORDER BY attempted_at DESC, id DESC LIMIT $4",
    "SELECT id, event_id, endpoint_id, job_id, attempt, attempted_at, status, duration_us, response_excerpt, error, outcome
     FROM onus_delivery_attempts
     WHERE endpoint_id = $1 AND ($2::timestamptz IS NULL OR attempted_at < $2 OR (attempted_at = $2 AND id < $3::text))
     ORDER BY attempted_at DESC, id DESC LIMIT $4",
);

/// An endpoint's (`$2`) latest attempts since `$3` (a day ago), at most `$4`, and of those the
/// ones since `$1` (an hour ago): all and successful. Read newest first through the index by
/// endpoint and time, so a busy endpoint costs at most `$4` rows.
pub(crate) static ENDPOINT_RATES: Sql = Sql::new(
    ATTEMPTS,
    "SELECT COALESCE(SUM(CASE WHEN attempted_at >= $1 THEN 1 ELSE 0 END), 0) AS hour_total,
            COALESCE(SUM(CASE WHEN attempted_at >= $1 AND outcome = 'success' THEN 1 ELSE 0 END), 0) AS hour_ok,
            COUNT(*) AS day_total,
            COALESCE(SUM(CASE WHEN outcome = 'success' THEN 1 ELSE 0 END), 0) AS day_ok
     FROM (SELECT attempted_at, outcome FROM onus_delivery_attempts
           WHERE endpoint_id = $2 AND attempted_at >= $3
           ORDER BY attempted_at DESC LIMIT $4) recent",
);

pub(crate) static ATTEMPT: Sql = Sql::new(
    ATTEMPTS,
    "SELECT id, event_id, endpoint_id, job_id, attempt, attempted_at, status, duration_us, response_excerpt, error, outcome
     FROM onus_delivery_attempts WHERE id = $1",
);

/// One row of `onus_deliveries`.
pub(crate) struct DeliveryRow {
    pub endpoint_id: EndpointId,
    pub job_id: Option<i64>,
    pub created_at: Timestamp,
}

impl onus::sql::FromRow for DeliveryRow {
    fn from_row(r: &Row) -> StoreResult<Self> {
        Ok(DeliveryRow {
            endpoint_id: r.get("endpoint_id")?,
            job_id: r.get("job_id")?,
            created_at: r.get("created_at")?,
        })
    }
}

pub(crate) static DELIVERIES_OF_EVENT: Sql = Sql::new(
    DELIVERIES,
    "SELECT event_id, endpoint_id, job_id, created_at FROM onus_deliveries WHERE event_id = $1
     ORDER BY created_at, endpoint_id",
);

// A fan-out's deliveries, one statement for all its endpoints ($3); the endpoints answered are
// those without a delivery of the event yet.
static INSERT_DELIVERIES: Sql = Sql::per_backend(
    DELIVERIES,
    "INSERT INTO onus_deliveries (event_id, endpoint_id, created_at)
     SELECT $1, value, $2 FROM json_each($3) WHERE true
     ON CONFLICT (event_id, endpoint_id) DO NOTHING RETURNING endpoint_id",
    "INSERT INTO onus_deliveries (event_id, endpoint_id, created_at)
     SELECT $1, e, $2 FROM unnest($3::text[]) AS e
     ON CONFLICT (event_id, endpoint_id) DO NOTHING RETURNING endpoint_id",
);

// Each new delivery's job: endpoints ($1) and their jobs ($2), in the same order.
static SET_DELIVERY_JOBS: Sql = Sql::per_backend(
    DELIVERIES,
    "UPDATE onus_deliveries SET job_id = (
        SELECT j.value FROM json_each($1) e JOIN json_each($2) j ON j.key = e.key
        WHERE e.value = onus_deliveries.endpoint_id)
     WHERE event_id = $3 AND endpoint_id IN (SELECT value FROM json_each($1))",
    "UPDATE onus_deliveries d SET job_id = u.job
     FROM unnest($1::text[], $2::bigint[]) AS u(endpoint, job)
     WHERE d.event_id = $3 AND d.endpoint_id = u.endpoint",
);

static INSERT_ATTEMPT: Sql = Sql::new(
    ATTEMPTS,
    "INSERT INTO onus_delivery_attempts (id, event_id, endpoint_id, job_id, attempt, attempted_at, status, duration_us,
        response_excerpt, error, outcome)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
);

pub(crate) static ATTEMPTS_OF_EVENT: Sql = Sql::new(
    ATTEMPTS,
    "SELECT id, event_id, endpoint_id, job_id, attempt, attempted_at, status, duration_us, response_excerpt, error, outcome
     FROM onus_delivery_attempts WHERE event_id = $1 ORDER BY attempted_at, id",
);

static PRUNE_EVENTS: Sql = Sql::new(EVENTS, "DELETE FROM onus_events WHERE created_at < $1");
static PRUNE_ATTEMPTS: Sql = Sql::new(
    ATTEMPTS,
    "DELETE FROM onus_delivery_attempts WHERE attempted_at < $1",
);
static PRUNE_DELIVERIES: Sql = Sql::new(
    DELIVERIES,
    "DELETE FROM onus_deliveries WHERE created_at < $1",
);

/// A new endpoint's row.
pub(crate) struct NewEndpointRow {
    pub id: EndpointId,
    pub url: String,
    pub description: String,
    pub event_types: Vec<String>,
    pub secret: String,
    pub now: Timestamp,
    pub tenant: Option<String>,
    pub headers: std::collections::BTreeMap<String, String>,
    pub payload: crate::model::PayloadFormat,
}

pub(crate) async fn insert_endpoint<T: Tx + ?Sized>(
    tx: &T,
    e: NewEndpointRow,
) -> StoreResult<Option<Endpoint>> {
    tx.fetch_opt(
        &INSERT_ENDPOINT,
        &[
            e.id.into(),
            e.url.into(),
            e.description.into(),
            Value::json(&e.event_types)?,
            Value::json(&[e.secret])?,
            e.now.into(),
            e.tenant.into(),
            Value::json(&e.headers)?,
            e.payload.as_str().into(),
        ],
    )
    .await
}

pub(crate) async fn set_secrets<T: Tx + ?Sized>(
    tx: &T,
    id: &EndpointId,
    secrets: &[String],
    now: Timestamp,
) -> StoreResult<u64> {
    tx.execute(
        &SET_SECRETS,
        &[Value::json(secrets)?, now.into(), id.into()],
    )
    .await
}

pub(crate) fn disable_params(id: &EndpointId, reason: &str, now: Timestamp) -> Vec<Value> {
    vec![reason.into(), now.into(), id.into()]
}

pub(crate) fn enable_params(id: &EndpointId, now: Timestamp) -> Vec<Value> {
    vec![now.into(), id.into()]
}

/// An event ready to write, with its fan-out job.
#[derive(Debug, Clone)]
pub(crate) struct EventRow {
    pub id: EventId,
    pub event_type: String,
    pub payload: serde_json::Value,
    pub now: Timestamp,
    pub tenant: Option<String>,
    pub only_endpoint: Option<EndpointId>,
}

/// Writes an event; true when it was new (a concurrent publish of the same id delivers once).
pub(crate) async fn insert_event<T: Tx + ?Sized>(tx: &T, e: &EventRow) -> StoreResult<bool> {
    let new = tx
        .query(
            &INSERT_EVENT,
            &[
                (&e.id).into(),
                e.event_type.as_str().into(),
                Value::Json(e.payload.clone()),
                e.now.into(),
                e.tenant.clone().into(),
                e.only_endpoint.as_ref().map(|id| id.to_string()).into(),
            ],
        )
        .await?;
    Ok(!new.is_empty())
}

/// The endpoints an event of `tenant` may reach, the first `upto` of them.
pub(crate) async fn endpoints_upto<T: Tx + ?Sized>(
    tx: &T,
    tenant: Option<&str>,
    upto: usize,
) -> StoreResult<Vec<Endpoint>> {
    let upto = Value::Int(upto as i64);
    match tenant {
        Some(t) => tx.fetch(&TENANT_ENDPOINTS_UPTO, &[t.into(), upto]).await,
        None => tx.fetch(&UNTENANTED_ENDPOINTS_UPTO, &[upto]).await,
    }
}

/// Inserts the deliveries of `event` to `rows`' endpoints that it does not have yet, each with
/// its job (prepared, without a unique key: the delivery's row is the one per event and
/// endpoint), in three statements whatever the number of endpoints: a fan-out that runs again
/// delivers nothing twice. Returns how many were new.
pub(crate) async fn insert_deliveries<T: Tx + ?Sized>(
    tx: &T,
    event: &EventId,
    rows: Vec<(EndpointId, InsertRow)>,
    now: Timestamp,
) -> StoreResult<usize> {
    let endpoints = Value::list(rows.iter().map(|(e, _)| e.as_str()));
    let new: std::collections::HashSet<String> = tx
        .query(&INSERT_DELIVERIES, &[event.into(), now.into(), endpoints])
        .await?
        .iter()
        .map(|r| r.get("endpoint_id"))
        .collect::<StoreResult<_>>()?;
    let (endpoints, jobs): (Vec<EndpointId>, Vec<InsertRow>) = rows
        .into_iter()
        .filter(|(e, _)| new.contains(e.as_str()))
        .unzip();
    if jobs.is_empty() {
        return Ok(0);
    }
    let ids: Vec<i64> = tx
        .insert_jobs(jobs)
        .await?
        .iter()
        .map(|i| i.job.id)
        .collect();
    tx.execute(
        &SET_DELIVERY_JOBS,
        &[
            Value::list(endpoints.iter().map(|e| e.as_str())),
            Value::list(ids.iter().copied()),
            event.into(),
        ],
    )
    .await?;
    Ok(ids.len())
}

/// Records one delivery attempt.
pub(crate) async fn insert_attempt<T: Tx + ?Sized>(tx: &T, a: &DeliveryAttempt) -> StoreResult<()> {
    tx.execute(
        &INSERT_ATTEMPT,
        &[
            (&a.id).into(),
            (&a.event_id).into(),
            (&a.endpoint_id).into(),
            a.job_id.into(),
            a.attempt.into(),
            a.attempted_at.into(),
            a.status.into(),
            ((a.duration_ms * 1000.0).round() as i64).into(),
            a.response_excerpt.as_str().into(),
            a.error.clone().into(),
            a.outcome.into(),
        ],
    )
    .await?;
    Ok(())
}

/// A success clears the endpoint's failure run.
pub(crate) async fn mark_healthy<T: Tx + ?Sized>(tx: &T, id: &EndpointId) -> StoreResult<()> {
    tx.execute(&MARK_HEALTHY, &[id.into()]).await?;
    Ok(())
}

/// A failure extends the endpoint's failure run, or starts a new one when the previous failure
/// is older than `reset_before`; returns when the run started (None: the endpoint is gone).
pub(crate) async fn mark_failing<T: Tx + ?Sized>(
    tx: &T,
    id: &EndpointId,
    now: Timestamp,
    reset_before: Timestamp,
) -> StoreResult<Option<Timestamp>> {
    let rows = tx
        .query(&MARK_FAILING, &[reset_before.into(), now.into(), id.into()])
        .await?;
    rows.first()
        .map(|r: &Row| r.get::<Timestamp>("failing_since"))
        .transpose()
}

/// Deletes events, attempts and fan-out records older than `before`; returns events deleted.
pub(crate) async fn prune<T: Tx + ?Sized>(tx: &T, before: Timestamp) -> StoreResult<u64> {
    let events = tx.execute(&PRUNE_EVENTS, &[before.into()]).await?;
    tx.execute(&PRUNE_ATTEMPTS, &[before.into()]).await?;
    tx.execute(&PRUNE_DELIVERIES, &[before.into()]).await?;
    Ok(events)
}
