//! Leadership, migrations and the schema both backends create.

use super::*;

pub(crate) async fn leadership_is_held_by_one_until_it_expires(backend: Backend) {
    let w = world(backend).await;
    let until = w.now + secs(30);
    assert!(w.store.try_lead("l", "one", w.now, until).await.unwrap());
    assert!(!w.store.try_lead("l", "two", w.now, until).await.unwrap());
    assert!(
        w.store.try_lead("l", "one", w.now, until).await.unwrap(),
        "renewed"
    );
    assert!(w
        .store
        .try_lead("l", "two", until + secs(1), until + secs(31))
        .await
        .unwrap());
    w.store.resign("l", "two").await.unwrap();
    assert!(w
        .store
        .try_lead("l", "one", until + secs(2), until + secs(32))
        .await
        .unwrap());
}

pub(crate) async fn migrations_are_recorded_per_line(backend: Backend) {
    let w = world(backend).await;
    let st = w.store.migrations(&[]).await.unwrap();
    assert_eq!(st.len(), 1);
    let latest = onus::store::JOBS.latest(match backend {
        Backend::Sqlite => onus::sql::Backend::Sqlite,
        Backend::Postgres => onus::sql::Backend::Postgres,
    });
    assert_eq!(
        (st[0].line.as_str(), st[0].version, st[0].latest),
        ("jobs", latest, latest)
    );
    assert!(st[0].is_current() && st[0].applied_at.is_some());
    assert!(w.store.migrate(&[]).await.unwrap().is_empty());
}

/// The two backends' migration lines create the same tables with the same columns (types follow
/// each backend's convention and are not compared), apart from [`onus::sql::ONE_BACKEND_ONLY`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_backends_create_the_same_tables_and_columns() {
    let lines = [&onus::store::JOBS];
    let (sqlite, postgres) = (
        TestDb::new(Backend::Sqlite).await,
        TestDb::new(Backend::Postgres).await,
    );
    let (only_sqlite, only_postgres) = onus::sql::schema_differences(
        &onus::store::schema(&sqlite.url, &lines).await.unwrap(),
        &onus::store::schema(&postgres.url, &lines).await.unwrap(),
    );
    assert_eq!(
        (only_sqlite, only_postgres),
        (Vec::<String>::new(), Vec::<String>::new()),
        "columns only SQLite's migrations create, and only PostgreSQL's"
    );
}
