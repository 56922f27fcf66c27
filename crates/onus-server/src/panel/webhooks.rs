//! The panel's webhook pages: endpoints by tenant with their health and recent attempts, their
//! actions (add, edit, delete, rotate the secret, enable, disable, test, redeliver), events, and
//! an event's deliveries.

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use maud::{html, Markup};
use serde::Deserialize;

use super::pages::{at, err_page, layout, Refill};
use super::{Authed, Panel, Posted, Session};
use crate::api::ApiError;
use axum::http::StatusCode;

/// A time as shown in a table, or `-` when there is none.
fn time_or_dash(t: Option<onus::Timestamp>) -> String {
    t.map(super::pages::when).unwrap_or_else(|| "-".into())
}

fn health(e: &onus_webhooks::Endpoint) -> Markup {
    html! {
        @if !e.enabled {
            span class="state discarded" { "disabled" }
            @if let Some(r) = &e.disabled_reason { ": " (r) }
            @if let Some(t) = e.disabled_at { " (" (time_or_dash(Some(t))) ")" }
        } @else if let Some(t) = e.failing_since {
            span class="state retryable" { "failing since " (time_or_dash(Some(t))) }
        } @else {
            span class="state completed" { "healthy" }
        }
    }
}

/// The filter of the endpoints page.
#[derive(Debug, Default, Deserialize)]
pub struct TenantParams {
    tenant: Option<String>,
}

/// Endpoints, of one tenant when given, with their health; a form to add one.
pub async fn endpoints(
    State(panel): State<Panel>,
    Authed(s): Authed,
    Query(p): Query<TenantParams>,
) -> Response {
    let tenant = p.tenant.filter(|t| !t.is_empty());
    endpoints_page(&panel, &s, tenant, None).await
}

/// A success rate: "98% of 120" ("of the last 10000" when more were made than are read), or
/// "-" with no attempt.
fn rate(r: Option<(u64, u64)>) -> String {
    match r {
        Some((ok, total)) if total >= onus_webhooks::RATES_READ => {
            format!("{}% of the last {total}", ok * 100 / total)
        }
        Some((ok, total)) if total > 0 => {
            format!("{}% of {total}", ok * 100 / total)
        }
        _ => "-".into(),
    }
}

/// The id of the add-an-endpoint form.
const ADD_FORM: &str = "add-endpoint";
/// The id of an endpoint's edit form.
const EDIT_FORM: &str = "edit-endpoint";

/// The endpoints, with the add form filled again and its error shown when `refill` holds a
/// refused one (answered 422).
async fn endpoints_page(
    panel: &Panel,
    s: &Session,
    tenant: Option<String>,
    refill: Option<&Refill>,
) -> Response {
    let list = match panel.app.webhooks.endpoints_of(tenant.as_deref()).await {
        Ok(l) => l,
        Err(e) => return err_page(panel, s, e.into()),
    };
    let now = panel.app.client.now();
    // Each endpoint's last attempt and success rates, read through its index: a failure shows as
    // no figure, not as an error page.
    let mut healths = Vec::with_capacity(list.len());
    for e in &list {
        healths.push(panel.app.webhooks.endpoint_health(&e.id, now).await.ok());
    }
    let v = |name: &str, default: &str| Refill::value(refill, ADD_FORM, name, default);
    let bad = |name: &str| Refill::invalid(refill, ADD_FORM, name).then_some("true");
    let open = panel.badge().await;
    let body = html! {
        form method="get" action=(panel.href("/endpoints")) class="filters" {
            label { "Tenant " input name="tenant" value=(tenant.clone().unwrap_or_default()); }
            button type="submit" { "Show" }
        }
        table {
            thead { tr { th { "Endpoint" } th { "Tenant" } th { "URL" } th { "Health" } th { "Last attempt" } th { "Succeeded, last hour" } th { "Succeeded, last day" } } }
            tbody {
                @for (e, h) in list.iter().zip(&healths) {
                    tr {
                        td {
                            a href=(panel.href(&format!("/endpoints/{}", e.id))) {
                                @if e.description.is_empty() { (e.id) } @else { (e.description) }
                            }
                            @if !e.description.is_empty() { br; small { code class="id" { (e.id) } } }
                        }
                        td { (e.tenant.clone().unwrap_or_else(|| "-".into())) }
                        td { code { (e.url) } }
                        td { (health(e)) }
                        td {
                            @match h.as_ref().and_then(|h| h.last.as_ref()) {
                                Some(a) => {
                                    span class=(format!("outcome {}", a.outcome.as_str())) {
                                        (a.status.map(|s| format!("HTTP {s}")).unwrap_or_else(|| a.outcome.as_str().to_string()))
                                    }
                                    " " (at(now, a.attempted_at))
                                }
                                None => { "-" }
                            }
                        }
                        td { (rate(h.as_ref().map(|h| h.hour))) }
                        td { (rate(h.as_ref().map(|h| h.day))) }
                    }
                }
            }
        }
        @if list.is_empty() { p { "No endpoint." } }
        h2 { "Add an endpoint" }
        (Refill::above(refill, ADD_FORM))
        form method="post" action=(panel.href("/endpoints")) class="filters" id=(ADD_FORM) {
            input type="hidden" name="csrf" value=(s.csrf);
            label { "URL " input name="url" required placeholder="https://example.com/webhooks" value=(v("url", "")) aria-invalid=[bad("url")];
                (Refill::under(refill, ADD_FORM, "url")) }
            label { "Tenant " input name="tenant" value=(v("tenant", tenant.as_deref().unwrap_or_default())) aria-invalid=[bad("tenant")];
                (Refill::under(refill, ADD_FORM, "tenant")) }
            label { "Event types " input name="event_types" placeholder="invoice.paid,invoice.void" value=(v("event_types", "")) aria-invalid=[bad("event_types")];
                (Refill::under(refill, ADD_FORM, "event_types")) }
            label { "Description " input name="description" value=(v("description", "")) aria-invalid=[bad("description")];
                (Refill::under(refill, ADD_FORM, "description")) }
            label { "Body " select name="payload" {
                option value="envelope" selected[v("payload", "envelope") != "raw"] { "envelope {type, timestamp, data}" }
                option value="raw" selected[v("payload", "envelope") == "raw"] { "raw payload" }
            } }
            button type="submit" { "Add" }
        }
    };
    let page = layout(panel, Some(s), "Webhook endpoints", open, body);
    if refill.is_some() {
        (StatusCode::UNPROCESSABLE_ENTITY, page).into_response()
    } else {
        page.into_response()
    }
}

/// The add-an-endpoint form.
#[derive(Debug, Deserialize)]
pub struct NewEndpointForm {
    url: String,
    tenant: Option<String>,
    event_types: Option<String>,
    description: Option<String>,
    payload: Option<onus_webhooks::PayloadFormat>,
}

fn list(v: &Option<String>) -> Vec<String> {
    v.as_deref()
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// Adds an endpoint and shows its secret, once.
pub async fn create(State(panel): State<Panel>, Posted(s, f): Posted<NewEndpointForm>) -> Response {
    let new = onus_webhooks::NewEndpoint {
        url: f.url.trim().to_string(),
        tenant: f.tenant.clone().filter(|t| !t.trim().is_empty()),
        event_types: list(&f.event_types),
        description: f.description.clone().unwrap_or_default(),
        payload: f.payload.unwrap_or_default(),
        ..Default::default()
    };
    match panel.app.webhooks.create_endpoint(new).await {
        Ok((e, secret)) => secret_page(&panel, &s, &e.id, &secret).await,
        Err(e) if matches!(e, onus_webhooks::Error::Invalid(_)) => {
            let values = vec![
                ("url", f.url.clone()),
                ("tenant", f.tenant.clone().unwrap_or_default()),
                ("event_types", f.event_types.clone().unwrap_or_default()),
                ("description", f.description.clone().unwrap_or_default()),
                (
                    "payload",
                    f.payload.unwrap_or_default().as_str().to_string(),
                ),
            ];
            let refill = Refill::new(ADD_FORM, values, &e.into());
            endpoints_page(
                &panel,
                &s,
                f.tenant.clone().filter(|t| !t.trim().is_empty()),
                Some(&refill),
            )
            .await
        }
        Err(e) => err_page(&panel, &s, e.into()),
    }
}

async fn secret_page(panel: &Panel, s: &super::Session, id: &str, secret: &str) -> Response {
    let open = panel.badge().await;
    let body = html! {
        p { "The signing secret of " a href=(panel.href(&format!("/endpoints/{id}"))) { (id) } ", shown this once:" }
        pre class="secret" { (secret) }
        p class="hint" { "Give it to the endpoint's owner to verify deliveries (Standard Webhooks)." }
    };
    layout(panel, Some(s), "Signing secret", open, body).into_response()
}

/// An endpoint: health, recent attempts, its actions.
pub async fn endpoint(
    State(panel): State<Panel>,
    Authed(s): Authed,
    Path(id): Path<String>,
) -> Response {
    endpoint_page(&panel, &s, &id, None).await
}

/// An endpoint, with the edit form filled again and its error shown when `refill` holds a
/// refused one (answered 422).
async fn endpoint_page(panel: &Panel, s: &Session, id: &str, refill: Option<&Refill>) -> Response {
    let found = async {
        let e = panel.app.webhooks.endpoint(id).await?;
        let attempts = panel.app.webhooks.endpoint_attempts(id, 50, None).await?;
        Ok::<_, onus_webhooks::Error>((e, attempts))
    }
    .await;
    let (e, attempts) = match found {
        Ok(v) => v,
        Err(err) => return err_page(panel, s, err.into()),
    };
    let discarded = panel.app.webhooks.redeliver_count(&e.id).await.unwrap_or(0);
    let open = panel.badge().await;
    let ev = |name: &str, default: &str| Refill::value(refill, EDIT_FORM, name, default);
    let ebad = |name: &str| Refill::invalid(refill, EDIT_FORM, name).then_some("true");
    let action = |name: &str, label: String| {
        html! {
            form method="post" action=(panel.href(&format!("/endpoints/{}/action", e.id))) {
                input type="hidden" name="csrf" value=(s.csrf);
                input type="hidden" name="action" value=(name);
                @if name == "delete" {
                    button type="submit" class="danger" data-confirm="Delete this endpoint? Its pending deliveries are discarded." { (label) }
                } @else {
                    button type="submit" { (label) }
                }
            }
        }
    };
    let body = html! {
        dl class="facts" {
            dt { "URL" } dd { code { (e.url) } }
            dt { "Tenant" } dd { (e.tenant.clone().unwrap_or_else(|| "-".into())) }
            dt { "Event types" } dd { @if e.event_types.is_empty() { "every type" } @else { (e.event_types.join(", ")) } }
            dt { "Body" } dd { @if e.payload == onus_webhooks::PayloadFormat::Envelope { "envelope: {\"type\", \"timestamp\", \"data\"}" } @else { "raw: the event's payload alone" } }
            dt { "Health" } dd { (health(&e)) }
            dt { "Last failure" } dd { (time_or_dash(e.last_failure_at)) }
        }
        div class="actions" {
            @if e.enabled { (action("disable", "Disable".into())) (action("test", "Send a test event".into())) }
            @else { (action("enable", "Enable".into())) }
            (action("redeliver", format!("Redeliver {discarded} discarded")))
            (action("rotate", "Rotate the secret".into()))
            (action("delete", "Delete".into()))
        }
        h2 { "Edit" }
        (Refill::above(refill, EDIT_FORM))
        form method="post" action=(panel.href(&format!("/endpoints/{}/edit", e.id))) class="filters" id=(EDIT_FORM) {
            input type="hidden" name="csrf" value=(s.csrf);
            label { "URL " input name="url" value=(ev("url", &e.url)) required aria-invalid=[ebad("url")];
                (Refill::under(refill, EDIT_FORM, "url")) }
            label { "Event types " input name="event_types" value=(ev("event_types", &e.event_types.join(","))) aria-invalid=[ebad("event_types")];
                (Refill::under(refill, EDIT_FORM, "event_types")) }
            label { "Description " input name="description" value=(ev("description", &e.description)) aria-invalid=[ebad("description")];
                (Refill::under(refill, EDIT_FORM, "description")) }
            label { "Body " select name="payload" {
                @for p in [onus_webhooks::PayloadFormat::Envelope, onus_webhooks::PayloadFormat::Raw] {
                    option value=(p.as_str()) selected[ev("payload", e.payload.as_str()) == p.as_str()] { (p.as_str()) }
                }
            } }
            button type="submit" { "Save" }
        }
        h2 { "Recent attempts" }
        @if attempts.is_empty() { p { "No attempt yet." } }
        @else {
            table {
                thead { tr { th { "When" } th { "Event" } th { "Status" } th { "Duration" } th { "Outcome" } th { "Error or answer" } } }
                tbody { @for a in &attempts { tr {
                    td { (time_or_dash(Some(a.attempted_at))) }
                    td { a href=(panel.href(&format!("/events/{}", a.event_id))) { (a.event_id) } }
                    td { (a.status.map(|s| s.to_string()).unwrap_or_else(|| "-".into())) }
                    td { (format!("{:.1} ms", a.duration_ms)) }
                    td { (a.outcome.as_str()) }
                    td { (a.error.clone().unwrap_or_else(|| onus::job::shorten(&a.response_excerpt, 80))) }
                } } }
            }
        }
    };
    let page = layout(panel, Some(s), &format!("Endpoint {}", e.id), open, body);
    if refill.is_some() {
        (StatusCode::UNPROCESSABLE_ENTITY, page).into_response()
    } else {
        page.into_response()
    }
}

/// An endpoint action.
#[derive(Debug, Deserialize)]
pub struct EndpointAction {
    action: String,
}

/// Enable, disable, test, redeliver, rotate the secret, or delete.
pub async fn endpoint_action(
    State(panel): State<Panel>,
    Path(id): Path<String>,
    Posted(s, f): Posted<EndpointAction>,
) -> Response {
    let h = &panel.app.webhooks;
    let back = format!("/endpoints/{id}");
    let done = match f.action.as_str() {
        "enable" => h
            .enable(&id)
            .await
            .map(|_| "Enabled: deliveries to it resume.".to_string()),
        "disable" => h
            .disable(&id, "disabled by request")
            .await
            .map(|()| "Disabled: nothing is delivered to it until it is enabled.".to_string()),
        "test" => h
            .send_test(&id)
            .await
            .map(|e| format!("Sent a test event ({}).", e.id)),
        "redeliver" => h.redeliver(&id).await.map(|ids| {
            if ids.len() == 1 {
                "Redelivered 1 delivery.".to_string()
            } else {
                format!("Redelivered {} deliveries.", ids.len())
            }
        }),
        "rotate" => {
            return match h.rotate_secret(&id, None).await {
                Ok(secret) => secret_page(&panel, &s, &id, &secret).await,
                Err(e) => err_page(&panel, &s, e.into()),
            }
        }
        "delete" => {
            return match h.delete_endpoint(&id).await {
                Ok(()) => panel.notify("/endpoints", &format!("Deleted endpoint {id}.")),
                Err(e) => err_page(&panel, &s, e.into()),
            }
        }
        other => return err_page(&panel, &s, ApiError::invalid(format!("action: {other:?}"))),
    };
    match done {
        Ok(notice) => panel.notify(&back, &notice),
        Err(e) => err_page(&panel, &s, e.into()),
    }
}

/// The edit form.
#[derive(Debug, Deserialize)]
pub struct EditForm {
    url: String,
    event_types: Option<String>,
    description: Option<String>,
    payload: Option<onus_webhooks::PayloadFormat>,
}

/// Saves an endpoint's URL, event types, description and body format.
pub async fn endpoint_edit(
    State(panel): State<Panel>,
    Path(id): Path<String>,
    Posted(s, f): Posted<EditForm>,
) -> Response {
    let values = vec![
        ("url", f.url.clone()),
        ("event_types", f.event_types.clone().unwrap_or_default()),
        ("description", f.description.clone().unwrap_or_default()),
        (
            "payload",
            f.payload.unwrap_or_default().as_str().to_string(),
        ),
    ];
    let up = onus_webhooks::EndpointUpdate {
        url: Some(f.url.trim().to_string()),
        event_types: Some(list(&f.event_types)),
        description: f.description,
        headers: None,
        payload: f.payload,
    };
    match panel.app.webhooks.update_endpoint(&id, up).await {
        Ok(_) => panel.notify(&format!("/endpoints/{id}"), "Saved."),
        Err(e) if matches!(e, onus_webhooks::Error::Invalid(_)) => {
            let refill = Refill::new(EDIT_FORM, values, &e.into());
            endpoint_page(&panel, &s, &id, Some(&refill)).await
        }
        Err(e) => err_page(&panel, &s, e.into()),
    }
}

/// Events, newest first, with filters and pages.
pub async fn events(
    State(panel): State<Panel>,
    Authed(s): Authed,
    Query(mut p): Query<crate::views::events::EventParams>,
) -> Response {
    for v in [
        &mut p.tenant,
        &mut p.event_type,
        &mut p.limit,
        &mut p.cursor,
    ] {
        if v.as_deref() == Some("") {
            *v = None;
        }
    }
    let page = match crate::views::events::event_page(&panel.app, &p).await {
        Ok(l) => l,
        Err(e) => return err_page(&panel, &s, e),
    };
    let open = panel.badge().await;
    let (tenant, ty) = (
        p.tenant.clone().unwrap_or_default(),
        p.event_type.clone().unwrap_or_default(),
    );
    let body = html! {
        form method="get" action=(panel.href("/events")) class="filters" {
            label { "Tenant " input name="tenant" value=(tenant); }
            label { "Type " input name="type" value=(ty); }
            button type="submit" { "Filter" }
        }
        table {
            thead { tr { th { "Event" } th { "Type" } th { "Tenant" } th { "Published" } } }
            tbody { @for e in &page.events { tr {
                td { a href=(panel.href(&format!("/events/{}", e.id))) { (e.id) } }
                td { (e.event_type) } td { (e.tenant.clone().unwrap_or_else(|| "-".into())) }
                td { (time_or_dash(Some(e.created_at))) }
            } } }
        }
        @if page.events.is_empty() { p { "No event." } }
        @if let Some(c) = &page.next_cursor {
            a class="next" href=(panel.href(&format!("/events?{}", super::pages::pairs(&[("tenant", &tenant), ("type", &ty), ("cursor", c)])))) { "Next page" }
        }
    };
    layout(&panel, Some(&s), "Events", open, body).into_response()
}

/// An event: its payload and its deliveries with their attempts.
pub async fn event(
    State(panel): State<Panel>,
    Authed(s): Authed,
    Path(id): Path<String>,
) -> Response {
    let found = async {
        let e = panel.app.webhooks.event(&id).await?;
        let d = panel.app.webhooks.deliveries(&id).await?;
        Ok::<_, onus_webhooks::Error>((e, d))
    }
    .await;
    let (e, deliveries) = match found {
        Ok(v) => v,
        Err(err) => return err_page(&panel, &s, err.into()),
    };
    let open = panel.badge().await;
    let body = html! {
        dl class="facts" {
            dt { "Type" } dd { (e.event_type) }
            dt { "Tenant" } dd { (e.tenant.clone().unwrap_or_else(|| "-".into())) }
            dt { "Published" } dd { (time_or_dash(Some(e.created_at))) }
        }
        h2 { "Payload" }
        pre class="args" { (serde_json::to_string_pretty(&e.payload).unwrap_or_default()) }
        h2 { "Deliveries" }
        @if deliveries.is_empty() { p { "No delivery (yet)." } }
        @for d in &deliveries {
            section {
                h3 {
                    a href=(panel.href(&format!("/endpoints/{}", d.endpoint_id))) { (d.endpoint_id) }
                    " · "
                    @if let Some(j) = d.job_id { a href=(panel.href(&format!("/jobs/{j}"))) { "job " (j) } " · " }
                    (d.state.map(|s| s.as_str()).unwrap_or("-"))
                }
                table {
                    thead { tr { th { "When" } th { "Attempt" } th { "Status" } th { "Duration" } th { "Outcome" } th { "Error or answer" } } }
                    tbody { @for a in &d.attempts { tr {
                        td { (time_or_dash(Some(a.attempted_at))) } td { (a.attempt) }
                        td { (a.status.map(|s| s.to_string()).unwrap_or_else(|| "-".into())) }
                        td { (format!("{:.1} ms", a.duration_ms)) } td { (a.outcome.as_str()) }
                        td { (a.error.clone().unwrap_or_else(|| onus::job::shorten(&a.response_excerpt, 80))) }
                    } } }
                }
            }
        }
    };
    layout(&panel, Some(&s), &format!("Event {}", e.id), open, body).into_response()
}
