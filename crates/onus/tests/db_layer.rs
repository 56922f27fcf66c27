//! The database layer components build on, on both backends: a component's own migration line,
//! its statements and typed rows in each backend's convention, and its transactions (committed
//! with a job, rolled back on its error or when the caller gives up).

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::sync::Arc;
use std::time::Duration;

use onus::sql::{FromRow, Json, Line, Migration, Row, Sql, Tx, Value};
use onus::store::{Db, JobTx};
use onus::{NewJob, Onus, StoreError, StoreResult, Timestamp};
use onus_testkit::{Backend, TestDb};

static THINGS: Line = Line {
    name: "things",
    sqlite: &[Migration {
        version: 1,
        name: "001_things.sql",
        sql: "CREATE TABLE onus_test_things (id INTEGER PRIMARY KEY, at INTEGER NOT NULL, \
              flag INTEGER NOT NULL, doc TEXT NOT NULL, note TEXT)",
    }],
    postgres: &[Migration {
        version: 1,
        name: "001_things.sql",
        sql: "CREATE TABLE onus_test_things (id bigint PRIMARY KEY, at timestamptz NOT NULL, \
              flag boolean NOT NULL, doc jsonb NOT NULL, note text)",
    }],
};

static INSERT: Sql = Sql::new(
    "onus_test_things",
    "INSERT INTO onus_test_things (id, at, flag, doc, note) VALUES ($1, $2, $3, $4, $5)",
);
static ALL: Sql = Sql::new(
    "onus_test_things",
    "SELECT id, at, flag, doc, note FROM onus_test_things ORDER BY id",
);

#[derive(Debug, PartialEq)]
struct Thing {
    id: i64,
    at: Timestamp,
    flag: bool,
    doc: Vec<String>,
    note: Option<String>,
}

impl FromRow for Thing {
    fn from_row(r: &Row) -> StoreResult<Self> {
        Ok(Thing {
            id: r.get("id")?,
            at: r.get("at")?,
            flag: r.get("flag")?,
            doc: r.get::<Json<Vec<String>>>("doc")?.0,
            note: r.get("note")?,
        })
    }
}

#[derive(Debug, thiserror::Error)]
enum OpError {
    #[error("the operation refused")]
    Refused,
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn at() -> Timestamp {
    "2026-03-01T12:34:56.789012Z".parse().unwrap()
}

async fn insert_thing<T: Tx + ?Sized>(tx: &T, id: i64) -> StoreResult<u64> {
    tx.execute(
        &INSERT,
        &[
            id.into(),
            at().into(),
            true.into(),
            Value::json(&["a", "b"])?,
            Value::Null,
        ],
    )
    .await
}

async fn world(backend: Backend) -> (TestDb, Arc<dyn onus::Store>, Db) {
    let db = TestDb::new(backend).await;
    let store = onus::open(&db.url).await.unwrap();
    let applied = store.migrate(&[&THINGS]).await.unwrap();
    assert_eq!(
        applied
            .iter()
            .map(|a| (a.line.as_str(), a.version))
            .collect::<Vec<_>>(),
        vec![("things", 1)]
    );
    let handle = Db::new(store.clone());
    (db, store, handle)
}

async fn a_components_line_migrates_once_and_reports_its_version(backend: Backend) {
    let (_db, store, _) = world(backend).await;
    assert!(store.migrate(&[&THINGS]).await.unwrap().is_empty());
    let st = store.migrations(&[&THINGS]).await.unwrap();
    let jobs = onus::store::JOBS.latest(match backend {
        Backend::Sqlite => onus::sql::Backend::Sqlite,
        Backend::Postgres => onus::sql::Backend::Postgres,
    });
    assert_eq!(
        st.iter()
            .map(|l| (l.line.as_str(), l.version, l.latest, l.is_current()))
            .collect::<Vec<_>>(),
        vec![("jobs", jobs, jobs, true), ("things", 1, 1, true)]
    );
}

async fn rows_round_trip_in_the_backends_convention(backend: Backend) {
    let (_db, _, db) = world(backend).await;
    db.tx(|tx| Box::pin(insert_thing(tx, 7))).await.unwrap();
    let got: Vec<Thing> = db.read_rows(&ALL, vec![]).await.unwrap();
    assert_eq!(
        got,
        vec![Thing {
            id: 7,
            at: at(),
            flag: true,
            doc: vec!["a".into(), "b".into()],
            note: None,
        }]
    );
}

async fn a_component_write_commits_with_its_job_or_neither(backend: Backend) {
    let (_db, store, db) = world(backend).await;
    let client = Onus::builder(store.clone()).build().unwrap().client();
    let row = client
        .prepare(NewJob::new("thing.made", serde_json::json!({"id": 1})))
        .unwrap();
    let job = db
        .tx(move |tx| {
            Box::pin(async move {
                insert_thing(tx, 1).await?;
                Ok::<_, StoreError>(tx.insert_job(row).await?.job.id)
            })
        })
        .await
        .unwrap();
    assert!(store.get(job).await.unwrap().is_some());
    // An operation that fails after writing leaves nothing, and its own error is returned.
    let row = client
        .prepare(NewJob::new("thing.made", serde_json::json!({"id": 2})))
        .unwrap();
    let err = db
        .tx(move |tx| {
            Box::pin(async move {
                insert_thing(tx, 2).await?;
                tx.insert_job(row).await?;
                Err::<(), _>(OpError::Refused)
            })
        })
        .await
        .unwrap_err();
    assert!(matches!(err, OpError::Refused), "{err:?}");
    let things: Vec<Thing> = db.read_rows(&ALL, vec![]).await.unwrap();
    assert_eq!(things.iter().map(|t| t.id).collect::<Vec<_>>(), vec![1]);
    let jobs = store
        .list(&onus::JobFilter::default(), 10, None)
        .await
        .unwrap();
    assert_eq!(jobs.iter().map(|j| j.id).collect::<Vec<_>>(), vec![job]);
}

async fn an_operation_the_caller_gives_up_on_is_rolled_back(backend: Backend) {
    let (_db, _, db) = world(backend).await;
    let (go, wait) = tokio::sync::oneshot::channel::<()>();
    let mut go = Some(go);
    let op = db.tx(move |tx| {
        Box::pin(async move {
            insert_thing(tx, 3).await?;
            let _ = wait.await; // something other than the database
            Ok::<_, StoreError>(())
        })
    });
    match backend {
        // SQLite answers at once: an operation that waits on anything else is refused.
        Backend::Sqlite => {
            let e = op.await.unwrap_err();
            assert!(e.to_string().contains("awaited something other"), "{e}");
        }
        // PostgreSQL: the caller stops waiting; the operation is stopped too (its wait is
        // dropped) and never commits.
        Backend::Postgres => {
            assert!(tokio::time::timeout(Duration::from_millis(200), op)
                .await
                .is_err());
            let go = go.as_mut().unwrap();
            tokio::time::timeout(Duration::from_secs(20), go.closed())
                .await
                .expect("the operation was stopped when its caller gave up");
        }
    }
    let things: Vec<Thing> = db.read_rows(&ALL, vec![]).await.unwrap();
    assert!(things.is_empty(), "{things:?}");
}

/// Operations sent together share a transaction (on PostgreSQL one commit for the lot), yet each
/// stands alone: one that fails, by its own error or by the database refusing its row, undoes only
/// its own writes and answers its own error, and the others commit.
async fn shared_operations_commit_together_and_fail_alone(backend: Backend) {
    let (_db, _, db) = world(backend).await;
    db.tx(|tx| Box::pin(insert_thing(tx, 1))).await.unwrap();
    static TXID: Sql = Sql::per_backend(
        "onus_test_things",
        "SELECT 0 AS txid",
        "SELECT txid_current() AS txid",
    );
    // Sent at once: ids from..from+32, of which `fails` fail.
    let send = |from: i64, fails: fn(i64) -> bool| {
        let ops = (from..from + 32).map(|id| {
            db.tx_shared(move |tx| {
                Box::pin(async move {
                    // id 113 repeats a stored id: the database refuses its row.
                    insert_thing(tx, if id == 113 { 1 } else { id }).await?;
                    if fails(id) {
                        return Err(OpError::Refused);
                    }
                    let rows = tx.query(&TXID, &[]).await?;
                    Ok::<i64, OpError>(rows[0].get("txid")?)
                })
            })
        });
        futures_util::future::join_all(ops)
    };
    // All of them succeed: on PostgreSQL they share transactions.
    let answers = send(200, |_| false).await;
    let txids: std::collections::BTreeSet<i64> = answers.into_iter().map(|a| a.unwrap()).collect();
    if backend == Backend::Postgres {
        assert!(
            txids.len() < 32,
            "32 operations committed in {} transactions: none shared",
            txids.len()
        );
    }
    // Some fail.
    let answers = send(100, |id| id % 10 == 7).await;
    for (id, answer) in (100..132).zip(&answers) {
        match answer {
            Ok(_) => assert!(id != 113 && id % 10 != 7, "{id} should have failed"),
            Err(OpError::Refused) => assert_eq!(id % 10, 7, "{id}"),
            Err(OpError::Store(e)) => {
                assert_eq!(id, 113, "{id}: {e}");
                assert!(matches!(e, StoreError::Constraint(..)), "{e:?}");
            }
        }
    }
    let things: Vec<Thing> = db.read_rows(&ALL, vec![]).await.unwrap();
    let want: Vec<i64> = std::iter::once(1)
        .chain((100..132).filter(|id| *id != 113 && id % 10 != 7))
        .chain(200..232)
        .collect();
    assert_eq!(things.iter().map(|t| t.id).collect::<Vec<_>>(), want);
}

onus_testkit::both!(
    shared_operations_commit_together_and_fail_alone,
    a_components_line_migrates_once_and_reports_its_version,
    rows_round_trip_in_the_backends_convention,
    a_component_write_commits_with_its_job_or_neither,
    an_operation_the_caller_gives_up_on_is_rolled_back,
);

/// PostgreSQL prints a jsonb number in full (f64::MAX as 309 digits); it must read back as the
/// number that was written, not fail as out of range (a payload the API fuzz found).
#[tokio::test]
async fn json_numbers_at_the_edges_of_f64_read_back() {
    for backend in [
        onus_testkit::Backend::Sqlite,
        onus_testkit::Backend::Postgres,
    ] {
        let db = onus_testkit::TestDb::new(backend).await;
        let store = onus::open(&db.url).await.unwrap();
        static Q: onus::sql::Sql =
            onus::sql::Sql::per_backend("t", "SELECT $1 AS j", "SELECT $1::jsonb AS j");
        let v = serde_json::json!([
            f64::MAX,
            f64::MIN,
            5e-324,
            -3.9782416356110956e-199,
            -476716905612081758208.0
        ]);
        let p = vec![onus::sql::Value::Json(v.clone())];
        let rows: Vec<onus::sql::Row> = onus::store::Db::new(store.clone())
            .read(move |tx| {
                Box::pin(async move {
                    use onus::sql::Tx;
                    tx.query(&Q, &p).await
                })
            })
            .await
            .unwrap();
        assert_eq!(
            rows[0].get::<serde_json::Value>("j").unwrap(),
            v,
            "{backend:?}"
        );
    }
}
