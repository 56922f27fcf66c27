//! Managing jobs: retry, cancel, delete, filters, decoding.

use super::*;

pub(crate) async fn retry_cancel_and_retention(backend: Backend) {
    let w = world(backend).await;
    // A job created by a process whose clock is a year ahead, before the others: it holds back
    // no one's retention.
    let mut ahead = w.row("a");
    ahead.created_at = w.now + TimeDelta::days(365);
    ahead.run_at = ahead.created_at;
    w.insert(ahead).await;
    let a = w.insert(w.row("a")).await;
    let b = w.insert(w.row("a")).await;
    let c = w.store.cancel(&JobFilter::id(a.id), w.now).await.unwrap();
    assert_eq!(c.cancelled, vec![a.id]);
    assert_eq!(w.get(&a).await.state, JobState::Cancelled);
    let r = w.store.retry(&JobFilter::id(a.id), w.now).await.unwrap();
    assert_eq!(r.retried, vec![a.id]);
    assert_eq!(w.get(&a).await.state, JobState::Available);
    // Finished jobs past retention are pruned; others stay.
    let j = w.claim(&["a"], 2, w.now).await;
    let done: Vec<Finish> = j
        .iter()
        .map(|j| w.finish(j, Transition::Complete, w.now))
        .collect();
    assert_eq!(w.store.finish(&done).await.unwrap(), vec![true, true]);
    let keep = Retention {
        completed: Duration::from_secs(3600),
        discarded: Duration::from_secs(3600),
    };
    assert_eq!(w.store.prune(w.now + secs(60), keep, 100).await.unwrap(), 0);
    // Jobs created after the cutoff bound the search, and are kept.
    let mut later = w.row("a");
    later.created_at = w.now + secs(5000);
    later.run_at = later.created_at;
    w.insert(later).await;
    assert_eq!(
        w.store.prune(w.now + secs(7200), keep, 100).await.unwrap(),
        2
    );
    assert!(w.store.get(b.id).await.unwrap().is_none());
}

/// `lease_wait` of a job, read with the shared SQL layer.
async fn lease_wait(w: &World, job: &Job) -> bool {
    struct Flag(bool);
    impl onus::sql::FromRow for Flag {
        fn from_row(row: &onus::sql::Row) -> onus::StoreResult<Self> {
            Ok(Flag(row.get("lease_wait")?))
        }
    }
    static SQL: onus::sql::Sql = onus::sql::Sql::new(
        "onus_jobs",
        "SELECT lease_wait FROM onus_jobs WHERE id = $1",
    );
    let rows: Vec<Flag> = onus::store::Db::new(w.store.clone())
        .read_rows(&SQL, vec![onus::sql::Value::Int(job.id)])
        .await
        .unwrap();
    rows[0].0
}

/// A retry clears `lease_wait` on both stores (SQLite's left it set where PostgreSQL's cleared
/// it, so a retried job that had been held by a paused key still counted as held there).
pub(crate) async fn regression_retry_clears_lease_wait_alike(backend: Backend) {
    let w = world(backend).await;
    let mut row = w.row("a");
    row.lease_key = Some("k".into());
    let a = w.insert(row).await;
    let held = w
        .store
        .pause_key(
            "k",
            w.now + secs(600),
            w.now,
            "upstream said so",
            onus::store::PauseMode::Replace,
        )
        .await
        .unwrap();
    assert_eq!(held, 1);
    assert_eq!(w.get(&a).await.state, JobState::Scheduled);
    assert!(lease_wait(&w, &a).await, "held by the pause");
    let r = w.store.retry(&JobFilter::id(a.id), w.now).await.unwrap();
    assert_eq!(r.retried, vec![a.id]);
    assert_eq!(w.get(&a).await.state, JobState::Available);
    assert!(!lease_wait(&w, &a).await, "a retried job is no longer held");
}

pub(crate) async fn filters_by_tag_time_and_text_alike_and_delete_takes_finished_jobs(
    backend: Backend,
) {
    let w = world(backend).await;
    let tagged = w
        .insert(InsertRow {
            tags: vec!["billing".into(), "eu".into()],
            args: serde_json::json!({"email": "Ada@Example.com", "note": "two words"}),
            ..w.row("a")
        })
        .await;
    let later = w
        .insert(InsertRow {
            created_at: w.now + secs(10),
            ..w.row("b")
        })
        .await;
    assert_eq!(w.get(&tagged).await.tags, vec!["billing", "eu"]);
    let ids = |f: JobFilter| {
        let store = w.store.clone();
        async move {
            let jobs = store.list(&f, 100, None).await.unwrap();
            let n = store.count(&f).await.unwrap();
            assert_eq!(n as usize, jobs.len(), "count agrees with the listing");
            jobs.iter().map(|j| j.id).collect::<Vec<_>>()
        }
    };
    let tags = |t: &[&str]| JobFilter {
        tags: t.iter().map(|s| s.to_string()).collect(),
        ..JobFilter::default()
    };
    assert_eq!(ids(tags(&["eu", "x"])).await, vec![tagged.id]);
    assert!(ids(tags(&["x"])).await.is_empty());
    let t = w.now + secs(5);
    let after = JobFilter {
        created_after: Some(t),
        ..JobFilter::default()
    };
    assert_eq!(ids(after).await, vec![later.id]);
    let before = JobFilter {
        created_before: Some(t),
        ..JobFilter::default()
    };
    assert_eq!(ids(before).await, vec![tagged.id]);
    let text = |q: &str| JobFilter {
        q: Some(q.into()),
        ..JobFilter::default()
    };
    // Text in args: ASCII case folded, spaces ignored, a key and its value together, on both.
    for q in [
        "ada@example",
        "\"email\":\"ada",
        "\"email\": \"ADA",
        "twowords",
    ] {
        assert_eq!(ids(text(q)).await, vec![tagged.id], "q = {q:?}");
    }
    assert!(ids(text("nobody")).await.is_empty());
    // Delete: finished jobs only; one named unfinished job is a conflict, an absent one not found.
    match w.store.delete(&JobFilter::id(tagged.id)).await {
        Err(onus::StoreError::Conflict(m)) => assert!(m.contains("cancel it first"), "{m}"),
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert!(matches!(
        w.store.delete(&JobFilter::id(999_999)).await,
        Err(onus::StoreError::NotFound(999_999))
    ));
    w.store
        .cancel(&JobFilter::id(tagged.id), w.now)
        .await
        .unwrap();
    assert_eq!(
        w.store.delete(&JobFilter::default()).await.unwrap(),
        vec![tagged.id]
    );
    assert!(w.store.get(tagged.id).await.unwrap().is_none());
    assert_eq!(w.get(&later).await.state, JobState::Available);
}

pub(crate) async fn a_corrupted_job_row_is_an_error_naming_its_column(backend: Backend) {
    let w = world(backend).await;
    let j = w.insert(w.row("a")).await;
    let sql = format!(
        "UPDATE onus_job_rows SET errors = '{{\"not\": \"a list\"}}' WHERE id = {}",
        j.id
    );
    w.db.batch_execute(&sql).await;
    match w.store.get(j.id).await {
        Err(onus::StoreError::Decode { column, .. }) => assert_eq!(column, "errors"),
        other => panic!("expected a decode error naming the column, got {other:?}"),
    }
}

/// A cancel that meets a claim of its job in flight (on PostgreSQL: another process's claim
/// statement, not yet committed) waits for it, then finds the job running and asks it to stop;
/// it never marks as cancelled a job that a worker then runs. SQLite's single writer serializes
/// the two, so there the race cannot happen and the test has nothing to hold.
pub(crate) async fn a_cancel_meeting_a_claim_in_flight_asks_the_running_job_to_stop(
    backend: Backend,
) {
    if backend == Backend::Sqlite {
        return;
    }
    let w = world(backend).await;
    let a = w.insert(w.row("a")).await;
    // What a claim does to the job's narrow row (migration 10; store/postgres/claim.sql).
    let claim =
        w.db.open_transaction(&format!(
            "WITH moved AS (DELETE FROM onus_live WHERE id = {id} RETURNING *)
             INSERT INTO onus_live (id, queue, kind, priority, state, run_at, created_at, attempt,
                                    attempted_at, lease_owner, lease_expires_at)
             SELECT id, queue, kind, priority, 'running', run_at, created_at, attempt + 1,
                    now(), 'elsewhere', now() + interval '1 hour'
             FROM moved",
            id = a.id
        ))
        .await;
    let store = w.store.clone();
    let now = w.now;
    let cancel = tokio::spawn(async move { store.cancel(&JobFilter::id(a.id), now).await });
    onus_testkit::wait_until(
        "the cancel waits for the claim",
        Duration::from_secs(10),
        || {
            let db = &w.db;
            async move { db.lock_waiters().await > 0 }
        },
    )
    .await;
    claim.commit().await;
    let c = cancel.await.unwrap().unwrap();
    assert_eq!(c.cancelled, Vec::<onus::job::JobId>::new(), "{c:?}");
    assert_eq!(c.requested, vec![a.id]);
    let job = w.get(&a).await;
    assert_eq!(job.state, JobState::Running);
    assert!(job.cancel_requested);
}

/// A completed job reads as one job wherever its end is kept (on PostgreSQL a completion batch
/// appends it to `onus_job_ends` instead of writing the job's row, jobs migration 11), is counted
/// once, and goes whole, end and all, by a delete or by retention.
pub(crate) async fn a_completed_job_reads_counts_and_goes_as_one(backend: Backend) {
    let w = world(backend).await;
    let (a, b) = (w.insert(w.row("a")).await, w.insert(w.row("a")).await);
    let claimed = w.claim(&["a"], 2, w.now).await;
    let done = w.now + secs(2);
    let ends: Vec<Finish> = claimed
        .iter()
        .map(|j| w.finish(j, Transition::Complete, done))
        .collect();
    assert_eq!(w.store.finish(&ends).await.unwrap(), vec![true, true]);
    for job in [&a, &b] {
        let j = w.get(job).await;
        assert_eq!(
            (j.state, j.attempt, j.attempted_at, j.finalized_at, j.run_at),
            (JobState::Completed, 1, Some(w.now), Some(done), w.now)
        );
        assert_eq!(
            (j.lease_owner, j.lease_expires_at, j.cancel_requested),
            (None, None, false)
        );
    }
    let completed = |rows: Vec<onus::store::CountRow>| -> u64 {
        rows.iter()
            .filter(|r| r.kind == "a" && r.state == JobState::Completed)
            .map(|r| r.count)
            .sum()
    };
    assert_eq!(completed(w.store.counts().await.unwrap()), 2);
    let listed = w
        .store
        .list(
            &JobFilter {
                states: vec![JobState::Completed],
                ..JobFilter::default()
            },
            10,
            None,
        )
        .await
        .unwrap();
    assert_eq!(listed.len(), 2, "found by its state");
    assert_eq!(
        w.store.delete(&JobFilter::id(a.id)).await.unwrap(),
        vec![a.id]
    );
    assert!(w.store.get(a.id).await.unwrap().is_none());
    assert_eq!(completed(w.store.counts().await.unwrap()), 1);
    let keep = Retention {
        completed: Duration::from_secs(3600),
        discarded: Duration::from_secs(3600),
    };
    assert_eq!(w.store.prune(done + secs(60), keep, 100).await.unwrap(), 0);
    assert_eq!(
        w.store.prune(done + secs(7200), keep, 100).await.unwrap(),
        1
    );
    assert!(w.store.get(b.id).await.unwrap().is_none());
    assert_eq!(completed(w.store.counts().await.unwrap()), 0);
    if backend == Backend::Postgres {
        // No end outlives its job.
        w.db.batch_execute(
            "DO $$ BEGIN IF EXISTS (SELECT 1 FROM onus_job_ends) THEN
                 RAISE EXCEPTION 'an end outlived its job'; END IF; END $$",
        )
        .await;
    }
}
