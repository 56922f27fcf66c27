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

/// Tables one backend's migrations create that the other has no counterpart of, with why.
const ONE_BACKEND_ONLY: &[(&str, &str)] = &[
    (
        "onus_job_deltas",
        "PostgreSQL appends counter changes so writers never wait on one counter row; \
         SQLite's one writer updates the counters in place",
    ),
    (
        "onus_schema",
        "PostgreSQL keeps the job tables' version where an earlier Onus looks for it; \
         SQLite keeps it in PRAGMA user_version",
    ),
];

/// The two backends' migration lines create the same tables with the same columns (types follow
/// each backend's convention and are not compared).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_backends_create_the_same_tables_and_columns() {
    let lines = [&onus::store::JOBS];
    let sqlite = schema(Backend::Sqlite, &lines).await;
    let postgres = schema(Backend::Postgres, &lines).await;
    let apart = |col: &String| {
        !ONE_BACKEND_ONLY
            .iter()
            .any(|(table, _)| col.starts_with(&format!("{table}.")))
    };
    let only = |a: &[String], b: &[String]| -> Vec<String> {
        a.iter()
            .filter(|c| apart(c) && !b.contains(c))
            .cloned()
            .collect()
    };
    assert_eq!(
        (only(&sqlite, &postgres), only(&postgres, &sqlite)),
        (Vec::new(), Vec::new()),
        "columns only SQLite's migrations create, and only PostgreSQL's"
    );
}

/// The tables and columns `lines` create on a fresh database of `backend`, as `table.column`
/// (sorted), read back from the database itself: both backends' migration lines must agree.
async fn schema(backend: Backend, lines: &[&'static onus::sql::Line]) -> Vec<String> {
    use onus::sql::{Sql, Tx};
    static COLUMNS: Sql = Sql::per_backend(
        "the schema",
        "SELECT m.name || '.' || p.name AS col FROM sqlite_master m, pragma_table_info(m.name) p
         WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%' ORDER BY 1",
        "SELECT table_name || '.' || column_name AS col FROM information_schema.columns
         WHERE table_schema = current_schema() ORDER BY 1",
    );
    let db = TestDb::new(backend).await;
    let store = onus::store::open_with(&db.url, false)
        .await
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", db.url));
    store
        .migrate(lines)
        .await
        .unwrap_or_else(|e| panic!("cannot migrate: {e}"));
    let rows = onus::store::Db::new(store)
        .read(|tx| Box::pin(async move { tx.query(&COLUMNS, &[]).await }))
        .await
        .unwrap_or_else(|e| panic!("cannot read the schema: {e}"));
    rows.iter()
        .map(|r| r.get::<String>("col").unwrap_or_else(|e| panic!("{e}")))
        .collect()
}
