//! Claiming due jobs: kinds, order, a backlog, paused queues.

use super::*;

pub(crate) async fn claim_takes_due_jobs_of_known_kinds_once(backend: Backend) {
    let w = world(backend).await;
    let a = w.insert(w.row("a")).await;
    let _unknown = w.insert(w.row("unknown")).await;
    let later = w
        .insert(InsertRow {
            state: JobState::Scheduled,
            run_at: w.now + secs(60),
            ..w.row("a")
        })
        .await;
    let got = w.claim(&["a"], 10, w.now).await;
    assert_eq!(got.iter().map(|j| j.id).collect::<Vec<_>>(), vec![a.id]);
    let j = &got[0];
    assert_eq!(
        (j.state, j.attempt, j.lease_owner.as_deref()),
        (JobState::Running, 1, Some(OWNER))
    );
    assert_eq!(j.lease_expires_at, Some(w.now + secs(30)));
    assert!(w.claim(&["a"], 10, w.now).await.is_empty(), "claimed once");
    // The scheduled job becomes due at its time.
    let got = w.claim(&["a"], 10, w.now + secs(60)).await;
    assert_eq!(got.iter().map(|j| j.id).collect::<Vec<_>>(), vec![later.id]);
}

/// Claims through a backlog take every job once, in order; a job that sorts before what was
/// already taken (handed back, or more urgent and inserted later) is still claimed, at the latest
/// by the claim that reaches the backlog's end (on PostgreSQL claims resume after a cursor).
pub(crate) async fn claims_through_a_backlog_miss_nothing_sorting_before_what_they_took(
    backend: Backend,
) {
    let w = world(backend).await;
    let rows: Vec<InsertRow> = (0..30).map(|_| w.row("a")).collect();
    let jobs: Vec<Job> = w
        .store
        .insert(rows)
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.job)
        .collect();
    let first = w.claim(&["a"], 10, w.now).await;
    assert_eq!(
        first.iter().map(|j| j.id).collect::<Vec<_>>(),
        jobs[..10].iter().map(|j| j.id).collect::<Vec<_>>()
    );
    // One of them handed back unstarted: available again, its key before the cursor.
    let back = &first[2];
    let applied = w
        .store
        .finish(&[w.finish(back, Transition::Return, w.now)])
        .await
        .unwrap();
    assert_eq!(applied, vec![true]);
    assert_eq!(w.get(back).await.state, JobState::Available);
    // A more urgent job inserted behind the backlog.
    let urgent = w
        .insert(InsertRow {
            priority: -1,
            ..w.row("a")
        })
        .await;
    let mut seen: Vec<i64> = first.iter().map(|j| j.id).collect();
    for _ in 0..5 {
        seen.extend(w.claim(&["a"], 10, w.now).await.iter().map(|j| j.id));
    }
    let mut want: Vec<i64> = jobs.iter().map(|j| j.id).collect();
    want.push(back.id);
    want.push(urgent.id);
    seen.sort_unstable();
    want.sort_unstable();
    assert_eq!(
        seen, want,
        "every job claimed once, the handed-back one twice"
    );
    assert!(w.claim(&["a"], 10, w.now).await.is_empty());
}

pub(crate) async fn a_paused_queue_claims_nothing_until_resumed(backend: Backend) {
    let w = world(backend).await;
    let j = w.insert(w.row("a")).await;
    w.db.batch_execute(&format!(
        "INSERT INTO onus_queues (name, paused_at, updated_at) VALUES ('default', {t}, {t})",
        t = if backend == Backend::Sqlite {
            "1".to_string()
        } else {
            "now()".to_string()
        }
    ))
    .await;
    assert!(w.claim(&["a"], 10, w.now + secs(1)).await.is_empty());
    w.db.batch_execute("UPDATE onus_queues SET paused_at = NULL")
        .await;
    assert_eq!(
        w.claim(&["a"], 10, w.now + secs(1))
            .await
            .iter()
            .map(|j| j.id)
            .collect::<Vec<_>>(),
        vec![j.id]
    );
}

/// A kind capped across every process takes at most its cap less its jobs running now, keeping
/// its place in the priority order beside an uncapped kind.
pub(crate) async fn a_capped_kind_takes_no_more_than_its_room(backend: Backend) {
    let w = world(backend).await;
    for _ in 0..4 {
        w.insert(w.row("capped")).await;
    }
    for _ in 0..3 {
        w.insert(InsertRow {
            priority: 1,
            ..w.row("free")
        })
        .await;
    }
    let claim = |limit: usize| ClaimRequest {
        queue: "default".into(),
        kinds: vec!["capped".into(), "free".into()],
        limit,
        owner: OWNER.into(),
        now: w.now,
        lease_until: w.now + secs(30),
        caps: vec![("capped".into(), 2)],
        lease_slots: Vec::new(),
    };
    let first = w.store.claim(claim(3)).await.unwrap();
    let kinds: Vec<&str> = first.iter().map(|j| j.kind.as_str()).collect();
    assert_eq!(
        kinds,
        ["capped", "capped", "free"],
        "the cap, then the others in order"
    );
    // Two of the capped kind run: it has no room left, whatever the limit.
    let second = w.store.claim(claim(10)).await.unwrap();
    assert!(second.iter().all(|j| j.kind == "free"));
    assert_eq!(second.len(), 2);
}

/// A claimed job is the job as the store then keeps it, field for field (a claim returns no
/// progress: none was reported here): the claim reads back only what the store kept and sets
/// what it wrote itself (state, attempt time, lease), so the two must agree, for a first attempt,
/// a retry found among the delayed jobs, and a capped claim.
pub(crate) async fn a_claimed_job_is_the_job_as_stored(backend: Backend) {
    let w = world(backend).await;
    let j = w
        .insert(InsertRow {
            priority: 3,
            unique_key: Some("u-1".into()),
            lease_key: Some("customer:7".into()),
            tags: vec!["t1".into(), "t2".into()],
            args: serde_json::json!({"nested": {"list": [1, 2, 3]}, "s": "é"}),
            ..w.row("a")
        })
        .await;
    let first = w.claim(&["a"], 10, w.now).await.remove(0);
    assert_eq!(first, w.get(&j).await);
    assert_eq!(
        (first.attempt, first.lease_key.as_deref()),
        (1, Some("customer:7"))
    );
    let retry = Transition::Retry {
        run_at: w.now + secs(10),
        entry: entry(w.now, 1, "boom"),
    };
    let applied = w
        .store
        .finish(&[w.finish(&first, retry, w.now)])
        .await
        .unwrap();
    assert_eq!(applied, vec![true]);
    // A claim's time finer than the stores keep (a system clock's nanoseconds) reads as stored.
    let later = w.now + secs(10);
    let second = w
        .claim(&["a"], 10, later + TimeDelta::nanoseconds(789))
        .await
        .remove(0);
    assert_eq!(second, w.get(&j).await);
    assert_eq!(
        (second.attempt, second.errors.len(), second.attempted_at),
        (2, 1, Some(later))
    );
    // A capped kind's claim takes the same path's columns.
    let k = w.insert(w.row("b")).await;
    let req = ClaimRequest {
        caps: vec![("b".into(), 5)],
        ..w.claim_request(&["b"], 10, later)
    };
    let capped = w.store.claim(req).await.unwrap();
    assert_eq!(capped.len(), 1);
    assert_eq!(capped[0], w.get(&k).await);
}
