//! A stored value that cannot be read as its type is an error naming the table and the column,
//! never a silent default, on both backends.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use onus::{Onus, StoreError};
use onus_testkit::{Backend, TestDb};
use onus_webhooks::{Error, NewEndpoint, WebhookConfig, Webhooks};

/// A fresh database with the webhook service registered on a runtime.
async fn webhooks(backend: Backend) -> (TestDb, Webhooks, Onus) {
    let db = TestDb::new(backend).await;
    let store = onus::open(&db.url).await.unwrap();
    let hooks = Webhooks::open(store.clone(), WebhookConfig::default())
        .await
        .unwrap();
    let onus = Onus::builder(store).component(&hooks).build().unwrap();
    (db, hooks, onus)
}

async fn a_corrupted_value_is_an_error_naming_its_column(backend: Backend) {
    let (db, hooks, _onus) = webhooks(backend).await;
    let (ep, _) = hooks
        .create_endpoint(NewEndpoint {
            url: "https://example.com/hook".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(hooks.endpoint(&ep.id).await.is_ok());

    // A JSON list of event types replaced by an object.
    db.batch_execute(&format!(
        "UPDATE onus_endpoints SET event_types = '{{\"a\": 1}}' WHERE id = '{}'",
        ep.id
    ))
    .await;
    let err = hooks.endpoint(&ep.id).await.unwrap_err();
    match &err {
        Error::Store(StoreError::Decode { table, column, .. }) => {
            assert_eq!((*table, column.as_str()), ("onus_endpoints", "event_types"));
        }
        e => panic!("expected a decode error, got {e:?}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("event_types") && text.contains("onus_endpoints"),
        "{text}"
    );
    assert_eq!(err.fault(), onus::Fault::Service);
}

async fn a_missing_or_mistyped_required_value_names_its_column(backend: Backend) {
    let (db, hooks, _onus) = webhooks(backend).await;
    let ev = hooks
        .publish("x", serde_json::json!({"a": 1}), None)
        .await
        .unwrap();
    // SQLite keeps the NOT NULL, so there the type becomes bytes (a value of another type); on
    // PostgreSQL the constraint is dropped first and the type made NULL.
    let sql = match backend {
        Backend::Sqlite => format!("UPDATE onus_events SET type = X'00ff' WHERE id = '{}'", ev.id),
        Backend::Postgres => format!(
            "ALTER TABLE onus_events ALTER COLUMN type DROP NOT NULL; UPDATE onus_events SET type = NULL WHERE id = '{}'",
            ev.id
        ),
    };
    db.batch_execute(&sql).await;
    let err = hooks.event(&ev.id).await.unwrap_err().to_string();
    assert!(
        err.contains("cannot read column type of onus_events"),
        "{err}"
    );
}

onus_testkit::both!(
    a_corrupted_value_is_an_error_naming_its_column,
    a_missing_or_mistyped_required_value_names_its_column
);
