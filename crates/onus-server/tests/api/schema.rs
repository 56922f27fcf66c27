//! The tables and columns every migration line `onus serve` applies creates alike on both
//! backends.

use onus_testkit::{Backend, TestDb};

/// Every line the server migrates (the job tables, webhooks, mail, the server's secrets) makes
/// the same tables with the same columns on SQLite and on PostgreSQL, apart from the tables of
/// `onus::sql::ONE_BACKEND_ONLY` (types follow each backend's convention and are not compared).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_line_creates_the_same_tables_and_columns_on_both_backends() {
    let lines = onus::store::with_jobs(&[
        &onus_webhooks::MIGRATIONS,
        &onus_mail::MIGRATIONS,
        &onus_server::secrets::MIGRATIONS,
    ]);
    let (sqlite, postgres) = (
        TestDb::new(Backend::Sqlite).await,
        TestDb::new(Backend::Postgres).await,
    );
    let sqlite_columns = onus::store::schema(&sqlite.url, &lines)
        .await
        .unwrap_or_else(|e| panic!("SQLite: {e}"));
    let postgres_columns = onus::store::schema(&postgres.url, &lines)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL: {e}"));
    assert!(
        sqlite_columns.iter().any(|c| c == "onus_endpoints.url"),
        "the schema is read back: {sqlite_columns:?}"
    );
    assert_eq!(
        onus::sql::schema_differences(&sqlite_columns, &postgres_columns),
        (Vec::new(), Vec::new()),
        "columns only SQLite's migrations create, and only PostgreSQL's"
    );
}
