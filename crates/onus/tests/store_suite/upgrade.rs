//! A database made before migration 10 (the job's row and its narrow live row) upgrades in place:
//! a frozen fixture of the job tables at migration 9, with jobs in every state, a lease slot, a
//! key pause, counts and history, is opened by this code, and every job reads as it was and goes
//! on from where it stood.

use super::*;

const SQLITE: &str = include_str!("../fixtures/jobs_v9.sqlite.sql");
const POSTGRES: &str = include_str!("../fixtures/jobs_v9.postgres.sql");

fn t(s: &str) -> Timestamp {
    s.parse().unwrap()
}

pub(crate) async fn a_database_at_migration_9_upgrades_in_place(backend: Backend) {
    let db = TestDb::new(backend).await;
    db.batch_execute(match backend {
        Backend::Sqlite => SQLITE,
        Backend::Postgres => POSTGRES,
    })
    .await;
    let store = onus::open(&db.url).await.unwrap();
    let status = store.migrations(&[]).await.unwrap();
    assert!(status.iter().all(|l| l.is_current()), "{status:?}");
    let now = t("2026-03-01T01:00:00Z");
    let job = |id: i64| {
        let store = store.clone();
        async move { store.get(id).await.unwrap().unwrap() }
    };

    // Every job reads as it stood.
    let mut seen = Vec::new();
    for id in 1..=11 {
        let j = job(id).await;
        seen.push((j.id, j.state, j.attempt));
    }
    use JobState::*;
    assert_eq!(
        seen,
        vec![
            (1, Available, 0),
            (2, Scheduled, 0),
            (3, Running, 1),
            (4, Retryable, 1),
            (5, Snoozed, 0),
            (6, Scheduled, 0),
            (7, Completed, 1),
            (8, Discarded, 3),
            (9, Cancelled, 0),
            (10, Running, 1),
            (11, Available, 0),
        ]
    );
    let running = job(3).await;
    assert_eq!(
        (
            running.lease_owner.as_deref(),
            running.lease_expires_at,
            running.attempted_at,
            running.lease_key.as_deref(),
            running.progress.as_ref().map(|p| p.message.clone()),
        ),
        (
            Some("old-process"),
            Some(t("2026-03-02T00:00:00Z")),
            Some(t("2026-03-01T00:00:10Z")),
            Some("k1"),
            Some("half".to_string()),
        )
    );
    let (completed, discarded) = (job(7).await, job(8).await);
    assert_eq!(
        (
            completed.result,
            completed.finalized_at,
            completed.unique_key
        ),
        (
            Some(serde_json::json!({"ok": true})),
            Some(t("2026-03-01T00:01:00Z")),
            Some("u-7".to_string())
        )
    );
    assert_eq!(
        (discarded.errors.len(), discarded.discard_reason),
        (3, Some(DiscardReason::Exhausted))
    );
    assert_eq!(
        (job(1).await.tags, job(11).await.queue, job(2).await.run_at),
        (
            vec!["t1".to_string()],
            "other".to_string(),
            t("2026-03-02T00:00:00Z")
        )
    );

    // The counts and the history came through.
    let mut counts: Vec<(JobState, u64)> = Vec::new();
    for c in store.counts().await.unwrap() {
        match counts.iter_mut().find(|(s, _)| *s == c.state) {
            Some((_, n)) => *n += c.count,
            None => counts.push((c.state, c.count)),
        }
    }
    counts.sort_by_key(|(s, _)| s.as_str());
    assert_eq!(
        counts,
        vec![
            (Available, 2),
            (Cancelled, 1),
            (Completed, 1),
            (Discarded, 1),
            (Retryable, 1),
            (Running, 2),
            (Scheduled, 2),
            (Snoozed, 1)
        ]
    );
    let history = store.history(t("2026-03-01T00:00:00Z")).await.unwrap();
    assert_eq!(history.iter().map(|h| h.count).sum::<u64>(), 2);

    // Unique keys hold while their job is unfinished, and only then.
    let mut row = InsertRow {
        kind: "fx.a".into(),
        queue: "default".into(),
        args: serde_json::json!({}),
        priority: 0,
        state: JobState::Available,
        max_attempts: 5,
        run_at: now,
        created_at: now,
        unique_key: Some("u-2".into()),
        lease_key: None,
        rate_key: None,
        tags: Vec::new(),
    };
    let held = store.insert(vec![row.clone()]).await.unwrap().remove(0);
    assert_eq!((held.inserted, held.job.id), (false, 2));
    row.unique_key = Some("u-7".into());
    let fresh = store.insert(vec![row]).await.unwrap().remove(0);
    assert!(fresh.inserted && fresh.job.id > 11, "{fresh:?}");

    // The running job's owner still holds it: it renews and completes it, and the slot it gives
    // back wakes the job asleep behind its key.
    let held = [HeldJob { id: 3, attempt: 1 }];
    let renewal = store
        .heartbeat("old-process", &held, now + secs(60))
        .await
        .unwrap();
    assert!(renewal.lost.is_empty(), "{renewal:?}");
    let done = Finish {
        id: 3,
        owner: "old-process".into(),
        attempt: 1,
        transition: Transition::Complete,
        now,
        release_lease: Some("k1".into()),
        periodic: None,
        expired_before: None,
        result: None,
    };
    assert_eq!(store.finish(&[done]).await.unwrap(), vec![true]);
    assert_eq!(job(3).await.state, Completed);
    assert!(job(5).await.run_at <= now, "the waiter woke");

    // The lapsed lease is found; the due jobs are claimed; the paused key resumes; a discarded
    // job retries.
    let lapsed = store.expired(&["fx.b".to_string()], now, 10).await.unwrap();
    assert_eq!(lapsed.iter().map(|j| j.id).collect::<Vec<_>>(), vec![10]);
    let claimed = store
        .claim(ClaimRequest {
            queue: "default".into(),
            kinds: vec!["fx.a".into()],
            limit: 10,
            owner: OWNER.into(),
            now,
            lease_until: now + secs(30),
            caps: Vec::new(),
            lease_slots: Vec::new(),
        })
        .await
        .unwrap();
    let mut got: Vec<(i64, u32)> = claimed.iter().map(|j| (j.id, j.attempt)).collect();
    got.sort_unstable();
    assert_eq!(got, vec![(1, 1), (4, 2), (5, 1), (fresh.job.id, 1)]);
    assert_eq!(store.resume_key("k2", now).await.unwrap(), Some(1));
    assert!(job(6).await.run_at <= now);
    let retried = store.retry(&JobFilter::id(8), now).await.unwrap().retried;
    assert_eq!(retried, vec![8]);
    assert_eq!((job(8).await.state, job(8).await.attempt), (Available, 3));
}
