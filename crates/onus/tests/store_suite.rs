//! The store-level suite: the `Store` trait driven directly, with no runtime, on every backend.
//! A third backend is checked by adding it to the matrix: every operation the job layer relies on
//! is here (insert, claim, finish, heartbeat, lease keys, rate windows, periodic periods, rescue,
//! manual retry and cancel, leadership, retention, migrations).

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::sync::Arc;
use std::time::Duration;

use chrono::TimeDelta;
use onus::job::{EntryClass, HistoryEntry};
use onus::outcome::Transition;
use onus::store::{
    ClaimRequest, Finish, HeldJob, InsertRow, LeaseDecision, RateAsk, RateDecision, Retention,
};
use onus::{DiscardReason, Job, JobFilter, JobState, Store, Timestamp};
use onus_testkit::{Backend, TestDb};

const OWNER: &str = "suite-owner";

struct World {
    store: Arc<dyn Store>,
    now: Timestamp,
    db: TestDb,
}

async fn world(backend: Backend) -> World {
    let db = TestDb::new(backend).await;
    let store = onus::open(&db.url).await.unwrap();
    World {
        store,
        now: "2026-03-01T00:00:00Z".parse().unwrap(),
        db,
    }
}

fn secs(n: i64) -> TimeDelta {
    TimeDelta::seconds(n)
}

impl World {
    fn row(&self, kind: &str) -> InsertRow {
        InsertRow {
            kind: kind.into(),
            queue: "default".into(),
            args: serde_json::json!({"k": kind}),
            priority: 0,
            state: JobState::Available,
            max_attempts: 3,
            run_at: self.now,
            created_at: self.now,
            unique_key: None,
            lease_key: None,
            rate_key: None,
            tags: Vec::new(),
        }
    }

    async fn insert(&self, row: InsertRow) -> Job {
        self.store.insert(vec![row]).await.unwrap().remove(0).job
    }

    async fn claim(&self, kinds: &[&str], limit: usize, at: Timestamp) -> Vec<Job> {
        self.store
            .claim(ClaimRequest {
                queue: "default".into(),
                kinds: kinds.iter().map(|k| k.to_string()).collect(),
                limit,
                owner: OWNER.into(),
                now: at,
                lease_until: at + secs(30),
                caps: Vec::new(),
            })
            .await
            .unwrap()
    }

    fn finish(&self, job: &Job, transition: Transition, at: Timestamp) -> Finish {
        Finish {
            id: job.id,
            owner: OWNER.into(),
            attempt: job.attempt,
            transition,
            now: at,
            release_lease: job.lease_key.clone(),
            periodic: None,
            expired_before: None,
            result: None,
        }
    }

    async fn get(&self, job: &Job) -> Job {
        self.store.get(job.id).await.unwrap().unwrap()
    }
}

fn entry(at: Timestamp, attempt: u32, message: &str) -> HistoryEntry {
    HistoryEntry {
        at,
        attempt,
        class: EntryClass::Error,
        message: message.into(),
    }
}

async fn claim_takes_due_jobs_of_known_kinds_once(backend: Backend) {
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

async fn finish_applies_only_for_the_lease_holder(backend: Backend) {
    let w = world(backend).await;
    w.insert(w.row("a")).await;
    let j = w.claim(&["a"], 1, w.now).await.remove(0);
    let stranger = Finish {
        owner: "someone-else".into(),
        ..w.finish(&j, Transition::Complete, w.now)
    };
    let stale = Finish {
        attempt: j.attempt + 1,
        ..w.finish(&j, Transition::Complete, w.now)
    };
    assert_eq!(
        w.store.finish(vec![stranger, stale]).await.unwrap(),
        vec![false, false]
    );
    assert_eq!(w.get(&j).await.state, JobState::Running);
    let retry = Transition::Retry {
        run_at: w.now + secs(10),
        entry: entry(w.now, 1, "boom"),
    };
    assert_eq!(
        w.store
            .finish(vec![w.finish(&j, retry, w.now)])
            .await
            .unwrap(),
        vec![true]
    );
    let after = w.get(&j).await;
    assert_eq!(
        (after.state, after.run_at, after.lease_owner),
        (JobState::Retryable, w.now + secs(10), None)
    );
    assert_eq!(after.errors, vec![entry(w.now, 1, "boom")]);
    // The second attempt discards it with an alert.
    let j = w.claim(&["a"], 1, w.now + secs(10)).await.remove(0);
    assert_eq!(j.attempt, 2);
    let discard = Transition::Discard {
        reason: DiscardReason::Permanent,
        entry: entry(w.now + secs(10), 2, "no"),
        alert: true,
    };
    assert_eq!(
        w.store
            .finish(vec![w.finish(&j, discard, w.now + secs(10))])
            .await
            .unwrap(),
        vec![true]
    );
    let after = w.get(&j).await;
    assert_eq!(
        (after.state, after.discard_reason, after.finalized_at),
        (
            JobState::Discarded,
            Some(DiscardReason::Permanent),
            Some(w.now + secs(10))
        )
    );
    let alerts = w.store.alerts(false, 10).await.unwrap();
    assert_eq!(
        alerts.iter().map(|a| a.job_id).collect::<Vec<_>>(),
        vec![j.id]
    );
}

async fn heartbeat_renews_held_jobs_and_reports_lost_and_cancelled(backend: Backend) {
    let w = world(backend).await;
    w.insert(w.row("a")).await;
    w.insert(w.row("a")).await;
    let jobs = w.claim(&["a"], 2, w.now).await;
    let (a, b) = (&jobs[0], &jobs[1]);
    w.store.cancel(&JobFilter::id(b.id), w.now).await.unwrap();
    let held = [
        HeldJob {
            id: a.id,
            attempt: a.attempt,
        },
        HeldJob {
            id: b.id,
            attempt: b.attempt,
        },
        HeldJob {
            id: 9_999,
            attempt: 1,
        },
    ];
    let r = w
        .store
        .heartbeat(OWNER, &held, w.now + secs(90))
        .await
        .unwrap();
    assert_eq!(r.renewed, vec![a.id, b.id]);
    assert_eq!(r.cancel, vec![b.id]);
    assert_eq!(r.lost, vec![9_999]);
    assert_eq!(w.get(a).await.lease_expires_at, Some(w.now + secs(90)));
    // Another owner renews nothing.
    let r = w
        .store
        .heartbeat("someone-else", &held[..1], w.now + secs(120))
        .await
        .unwrap();
    assert_eq!((r.renewed.len(), r.lost), (0, vec![a.id]));
    assert_eq!(w.get(a).await.lease_expires_at, Some(w.now + secs(90)));
}

async fn a_lease_key_takes_its_slots_and_a_release_wakes_the_waiter(backend: Backend) {
    let w = world(backend).await;
    let keyed = || InsertRow {
        lease_key: Some("k".into()),
        ..w.row("a")
    };
    w.insert(keyed()).await;
    w.insert(keyed()).await;
    let jobs = w.claim(&["a"], 2, w.now).await;
    let (a, b) = (&jobs[0], &jobs[1]);
    let until = w.now + secs(30);
    assert_eq!(
        w.store
            .acquire_lease("k", 1, a, OWNER, w.now, until)
            .await
            .unwrap(),
        LeaseDecision::Acquired
    );
    assert_eq!(w.store.lease_busy_until("k").await.unwrap(), Some(until));
    let busy = w
        .store
        .acquire_lease("k", 1, b, OWNER, w.now, until)
        .await
        .unwrap();
    assert_eq!(busy, LeaseDecision::Busy(until));
    let waiting = w.get(b).await;
    assert_eq!(
        (waiting.state, waiting.attempt, waiting.run_at),
        (JobState::Snoozed, 0, until),
        "snoozed without spending an attempt"
    );
    // The holder finishes and releases its slot: the waiter is due at once, and due since it
    // was created, so a claim takes it before jobs inserted after it.
    let done = w.now + secs(5);
    assert_eq!(
        w.store
            .finish(vec![w.finish(a, Transition::Complete, done)])
            .await
            .unwrap(),
        vec![true]
    );
    assert_eq!(w.get(b).await.run_at, b.created_at);
    assert!(b.created_at <= done);
    assert_eq!(w.store.lease_busy_until("k").await.unwrap(), None);
}

async fn take(w: &World, key: &str, max: u32, at: Timestamp) -> RateDecision {
    let ask = RateAsk {
        key: key.into(),
        max,
        window: Duration::from_secs(3600),
    };
    let mut v = w.store.take_rates(&[ask], at).await.unwrap();
    assert_eq!(v.len(), 1);
    v.remove(0)
}

async fn a_rate_window_counts_uses_and_names_the_next_window(backend: Backend) {
    let w = world(backend).await;
    let at = w.now + secs(10);
    assert_eq!(take(&w, "r", 2, at).await, RateDecision::Taken { left: 1 });
    assert_eq!(take(&w, "r", 2, at).await, RateDecision::Taken { left: 0 });
    assert_eq!(
        take(&w, "r", 2, at).await,
        RateDecision::Spent(w.now + secs(3600))
    );
    assert_eq!(
        take(&w, "r", 2, w.now + secs(3600)).await,
        RateDecision::Taken { left: 1 },
        "a new window"
    );
    assert_eq!(
        take(&w, "other", 2, at).await,
        RateDecision::Taken { left: 1 },
        "keys are apart"
    );
}

async fn rate_windows_are_taken_all_or_none(backend: Backend) {
    let w = world(backend).await;
    let at = w.now + secs(10);
    let hour = Duration::from_secs(3600);
    let ask = |key: &str, max: u32| RateAsk {
        key: key.into(),
        max,
        window: hour,
    };
    assert_eq!(
        take(&w, "full", 1, at).await,
        RateDecision::Taken { left: 0 }
    );
    // One spent window: nothing is taken from the others.
    let answers = w
        .store
        .take_rates(&[ask("a", 2), ask("full", 1), ask("b", 2)], at)
        .await
        .unwrap();
    assert_eq!(
        answers,
        vec![
            RateDecision::Taken { left: 1 },
            RateDecision::Spent(w.now + secs(3600)),
            RateDecision::Taken { left: 1 },
        ]
    );
    assert_eq!(
        take(&w, "a", 2, at).await,
        RateDecision::Taken { left: 1 },
        "a was not taken"
    );
    // The same key twice takes two uses; past its max it is spent, and nothing is taken.
    assert_eq!(
        w.store
            .take_rates(&[ask("c", 1), ask("c", 1)], at)
            .await
            .unwrap()[1],
        RateDecision::Spent(w.now + secs(3600))
    );
    assert_eq!(
        w.store
            .take_rates(&[ask("d", 2), ask("d", 2)], at)
            .await
            .unwrap(),
        vec![
            RateDecision::Taken { left: 1 },
            RateDecision::Taken { left: 0 }
        ]
    );
    assert_eq!(take(&w, "c", 1, at).await, RateDecision::Taken { left: 0 });
    assert_eq!(
        take(&w, "d", 2, at).await,
        RateDecision::Spent(w.now + secs(3600))
    );
}

async fn a_period_is_enqueued_once(backend: Backend) {
    let w = world(backend).await;
    let row = w
        .store
        .upsert_periodic("p", "a", "every: 1h", w.now)
        .await
        .unwrap();
    assert_eq!((row.next_run_at, row.last_period_at), (Some(w.now), None));
    let first = w
        .store
        .enqueue_period("p", w.now, w.now + secs(3600), w.row("a"))
        .await
        .unwrap();
    assert!(first.is_some());
    assert_eq!(
        w.store
            .enqueue_period("p", w.now, w.now + secs(3600), w.row("a"))
            .await
            .unwrap(),
        None,
        "the same period again"
    );
    let next = w
        .store
        .enqueue_period("p", w.now + secs(3600), w.now + secs(7200), w.row("a"))
        .await
        .unwrap();
    assert!(next.is_some() && next != first);
    let rows = w.store.list_periodic().await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (
            rows[0].last_period_at,
            rows[0].last_job_id,
            rows[0].next_run_at
        ),
        (Some(w.now + secs(3600)), next, Some(w.now + secs(7200)))
    );
    // An unchanged schedule keeps its next run time.
    let again = w
        .store
        .upsert_periodic("p", "a", "every: 1h", w.now)
        .await
        .unwrap();
    assert_eq!(again.next_run_at, Some(w.now + secs(7200)));
}

async fn a_rescue_applies_only_to_a_lease_that_really_expired(backend: Backend) {
    let w = world(backend).await;
    w.insert(w.row("a")).await;
    w.insert(w.row("a")).await;
    let jobs = w.claim(&["a"], 2, w.now).await;
    let (dead, alive) = (&jobs[0], &jobs[1]);
    let later = w.now + secs(60);
    assert!(w
        .store
        .expired(&["a".into()], w.now, 10)
        .await
        .unwrap()
        .is_empty());
    let expired = w.store.expired(&["a".into()], later, 10).await.unwrap();
    assert_eq!(expired.len(), 2);
    assert!(w
        .store
        .expired(&["b".into()], later, 10)
        .await
        .unwrap()
        .is_empty());
    // One of them is renewed after the rescuer looked: its rescue must not apply.
    w.store
        .heartbeat(
            OWNER,
            &[HeldJob {
                id: alive.id,
                attempt: alive.attempt,
            }],
            later + secs(30),
        )
        .await
        .unwrap();
    let rescue = |j: &Job| Finish {
        transition: Transition::Retry {
            run_at: later,
            entry: HistoryEntry {
                at: later,
                attempt: j.attempt,
                class: EntryClass::WorkerLost,
                message: "lease expired".into(),
            },
        },
        expired_before: Some(later),
        ..w.finish(j, Transition::Complete, later)
    };
    assert_eq!(
        w.store
            .finish(vec![rescue(dead), rescue(alive)])
            .await
            .unwrap(),
        vec![true, false]
    );
    assert_eq!(w.get(dead).await.state, JobState::Retryable);
    assert_eq!(w.get(alive).await.state, JobState::Running);
}

async fn retry_cancel_and_retention(backend: Backend) {
    let w = world(backend).await;
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
    assert_eq!(w.store.finish(done).await.unwrap(), vec![true, true]);
    let keep = Retention {
        completed: Duration::from_secs(3600),
        discarded: Duration::from_secs(3600),
    };
    assert_eq!(w.store.prune(w.now + secs(60), keep, 100).await.unwrap(), 0);
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
async fn regression_retry_clears_lease_wait_alike(backend: Backend) {
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

async fn leadership_is_held_by_one_until_it_expires(backend: Backend) {
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

async fn migrations_are_recorded_per_line(backend: Backend) {
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

async fn a_corrupted_job_row_is_an_error_naming_its_column(backend: Backend) {
    let w = world(backend).await;
    let j = w.insert(w.row("a")).await;
    let sql = format!(
        "UPDATE onus_jobs SET errors = '{{\"not\": \"a list\"}}' WHERE id = {}",
        j.id
    );
    w.db.batch_execute(&sql).await;
    match w.store.get(j.id).await {
        Err(onus::StoreError::Decode { column, .. }) => assert_eq!(column, "errors"),
        other => panic!("expected a decode error naming the column, got {other:?}"),
    }
}

async fn filters_by_tag_time_and_text_alike_and_delete_takes_finished_jobs(backend: Backend) {
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

async fn a_paused_queue_claims_nothing_until_resumed(backend: Backend) {
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

/// Claims through a backlog take every job once, in order; a job that sorts before what was
/// already taken (handed back, or more urgent and inserted later) is still claimed, at the latest
/// by the claim that reaches the backlog's end (on PostgreSQL claims resume after a cursor).
async fn claims_through_a_backlog_miss_nothing_sorting_before_what_they_took(backend: Backend) {
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
        .finish(vec![w.finish(back, Transition::Return, w.now)])
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

/// A batch mixing rows with and without unique keys comes back in its own order, each returned
/// job exactly as the database then holds it, and a unique key already held returns its holder.
async fn a_batch_insert_returns_every_row_in_order_as_stored(backend: Backend) {
    let w = world(backend).await;
    let held = w
        .insert(InsertRow {
            unique_key: Some("u-held".into()),
            ..w.row("a")
        })
        .await;
    let at = w.now + TimeDelta::nanoseconds(1_234_567); // finer than the stores keep
    let mut rows = Vec::new();
    for i in 0..150 {
        let mut r = InsertRow {
            args: serde_json::json!({"i": i, "nested": {"big": u64::MAX, "f": 1.5}}),
            priority: (i % 3) as i16,
            run_at: at,
            created_at: at,
            lease_key: (i % 2 == 0).then(|| format!("lk-{i}")),
            tags: vec![format!("t{i}")],
            ..w.row("a")
        };
        if i == 70 {
            r.unique_key = Some("u-held".into());
        }
        if i == 71 {
            r.unique_key = Some("u-new".into());
        }
        if i >= 140 {
            r.state = JobState::Scheduled;
            r.run_at = at + secs(60);
        }
        rows.push(r);
    }
    let out = w.store.insert(rows).await.unwrap();
    assert_eq!(out.len(), 150);
    let mut last = held.id;
    for (i, ins) in out.iter().enumerate() {
        if i == 70 {
            assert!(!ins.inserted);
            assert_eq!(ins.job.id, held.id, "the key's holder comes back");
            continue;
        }
        assert!(ins.inserted, "row {i}");
        assert_eq!(ins.job.args["i"], i, "row {i} in its place");
        assert!(ins.job.id > last, "ids ascend in the batch's order");
        last = ins.job.id;
        assert_eq!(ins.job, w.get(&ins.job).await, "row {i} as stored");
    }
    assert_eq!(out[71].job.unique_key.as_deref(), Some("u-new"));
    assert_eq!(out[149].job.state, JobState::Scheduled);
}

onus_testkit::both!(
    regression_retry_clears_lease_wait_alike,
    a_batch_insert_returns_every_row_in_order_as_stored,
    claims_through_a_backlog_miss_nothing_sorting_before_what_they_took,
    filters_by_tag_time_and_text_alike_and_delete_takes_finished_jobs,
    a_paused_queue_claims_nothing_until_resumed,
    a_corrupted_job_row_is_an_error_naming_its_column,
    claim_takes_due_jobs_of_known_kinds_once,
    finish_applies_only_for_the_lease_holder,
    heartbeat_renews_held_jobs_and_reports_lost_and_cancelled,
    a_lease_key_takes_its_slots_and_a_release_wakes_the_waiter,
    a_rate_window_counts_uses_and_names_the_next_window,
    rate_windows_are_taken_all_or_none,
    a_period_is_enqueued_once,
    a_rescue_applies_only_to_a_lease_that_really_expired,
    retry_cancel_and_retention,
    leadership_is_held_by_one_until_it_expires,
    migrations_are_recorded_per_line,
);
