//! Lease keys and rate windows.

use super::*;

pub(crate) async fn a_lease_key_takes_its_slots_and_a_release_wakes_the_waiter(backend: Backend) {
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

pub(crate) async fn a_rate_window_counts_uses_and_names_the_next_window(backend: Backend) {
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

pub(crate) async fn rate_windows_are_taken_all_or_none(backend: Backend) {
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

/// A key paused holds its waiting jobs, says until when and how many, and a resume makes them
/// due at once; an `Extend` pause never shortens one in force.
pub(crate) async fn a_key_pause_holds_its_jobs_until_resumed(backend: Backend) {
    use onus::store::PauseMode;
    let w = world(backend).await;
    let keyed = InsertRow {
        lease_key: Some("k".into()),
        ..w.row("a")
    };
    let a = w.insert(keyed.clone()).await;
    w.insert(keyed).await;
    w.insert(w.row("a")).await;
    let until = w.now + secs(600);
    let held = w
        .store
        .pause_key("k", until, w.now, "ops", PauseMode::Replace);
    assert_eq!(held.await.unwrap(), 2);
    let shorter = w.now + secs(5);
    w.store
        .pause_key("k", shorter, w.now, "answer", PauseMode::Extend)
        .await
        .unwrap();
    assert_eq!(w.store.paused_until("k", w.now).await.unwrap(), Some(until));
    let keys = w.store.paused_keys(w.now).await.unwrap();
    assert_eq!(
        keys.iter()
            .map(|k| (k.key.as_str(), k.until, k.held))
            .collect::<Vec<_>>(),
        [("k", until, 2)]
    );
    assert_eq!(
        w.claim(&["a"], 10, w.now + secs(1)).await.len(),
        1,
        "only the unkeyed job"
    );
    let later = w.now + secs(2);
    assert_eq!(w.store.resume_key("k", later).await.unwrap(), Some(2));
    assert_eq!(
        w.store.resume_key("k", later).await.unwrap(),
        None,
        "not paused"
    );
    assert_eq!(w.store.paused_until("k", later).await.unwrap(), None);
    assert!(w.store.paused_keys(later).await.unwrap().is_empty());
    assert!(w.get(&a).await.run_at <= later);
    assert_eq!(w.claim(&["a"], 10, later).await.len(), 2);
}
