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

/// The counters follow inserts, claims and finishes, the history counts the finishes by minute,
/// and folding the counters changes neither.
pub(crate) async fn counters_and_history_follow_every_change_folded_or_not(backend: Backend) {
    let w = world(backend).await;
    for _ in 0..3 {
        w.insert(w.row("a")).await;
    }
    let job = w.claim(&["a"], 1, w.now).await.remove(0);
    let done = w.now + secs(1);
    let f = w.finish(&job, Transition::Complete, done);
    assert_eq!(w.store.finish(&[f]).await.unwrap(), vec![true]);
    let counts = |rows: Vec<onus::store::CountRow>| {
        let mut v: Vec<(JobState, u64)> = rows
            .into_iter()
            .filter(|r| r.count > 0 && r.kind == "a")
            .map(|r| (r.state, r.count))
            .collect();
        v.sort_by_key(|(s, _)| s.as_str());
        v
    };
    let want = vec![(JobState::Available, 2), (JobState::Completed, 1)];
    assert_eq!(counts(w.store.counts().await.unwrap()), want);
    let history = w.store.history(w.now - secs(60)).await.unwrap();
    let finished: Vec<(&str, JobState, u64)> = history
        .iter()
        .map(|h| (h.kind.as_str(), h.state, h.count))
        .collect();
    assert_eq!(finished, [("a", JobState::Completed, 1)]);
    w.store.fold_counts(w.now - secs(3600)).await.unwrap();
    assert_eq!(
        counts(w.store.counts().await.unwrap()),
        want,
        "folded alike"
    );
    assert_eq!(w.store.history(w.now - secs(60)).await.unwrap(), history);
}
