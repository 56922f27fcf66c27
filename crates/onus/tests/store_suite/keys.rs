//! Lease keys and rate windows.

use super::*;

pub(crate) async fn a_lease_key_takes_its_slots_and_a_release_wakes_the_waiter(backend: Backend) {
    let w = world(backend).await;
    let keyed = || InsertRow {
        lease_key: Some("k".into()),
        ..w.row("a")
    };
    let first = w.insert(keyed()).await;
    let second = w.insert(keyed()).await;
    // One claim of both: the first takes the key's one slot, the second waits asleep in the same
    // transaction and is not handed out.
    let jobs = w.claim(&["a"], 2, w.now).await;
    let until = w.now + secs(30);
    assert_eq!(
        jobs.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![first.id]
    );
    let a = &jobs[0];
    assert_eq!(w.store.lease_busy_until("k").await.unwrap(), Some(until));
    let waiting = w.get(&second).await;
    assert_eq!(
        (
            waiting.state,
            waiting.attempt,
            waiting.run_at,
            waiting.snoozes
        ),
        (JobState::Snoozed, 0, until, 0),
        "asleep until the slot's lease ends, no attempt spent, not counted as a snooze"
    );
    assert!(waiting.errors.is_empty(), "{:?}", waiting.errors);
    assert_eq!(waiting.lease_owner, None);
    // Asked again for the job that holds it, the key answers with the same slot.
    assert_eq!(
        w.store
            .acquire_lease("k", 1, a, OWNER, w.now, until)
            .await
            .unwrap(),
        LeaseDecision::Acquired
    );
    // The holder finishes and releases its slot: the waiter is due at once, and due since it
    // was created, so a claim takes it before jobs inserted after it.
    let done = w.now + secs(5);
    assert_eq!(
        w.store
            .finish(&[w.finish(a, Transition::Complete, done)])
            .await
            .unwrap(),
        vec![true]
    );
    assert_eq!(w.get(&second).await.run_at, second.created_at);
    assert!(second.created_at <= done);
    assert_eq!(w.store.lease_busy_until("k").await.unwrap(), None);
    let next = w.claim(&["a"], 2, done).await;
    assert_eq!(
        next.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![second.id]
    );
    assert_eq!(next[0].attempt, 1);
    assert_eq!(
        w.store.lease_busy_until("k").await.unwrap(),
        Some(done + secs(30))
    );
}

/// A claim reads its keys as they are: a paused key holds its claimed jobs until the pause ends
/// (scheduled, attempt given back), and a key with two slots lets two of its jobs run.
pub(crate) async fn a_claim_holds_the_jobs_of_a_paused_key_and_fills_every_slot(backend: Backend) {
    let w = world(backend).await;
    let on = |key: &str| InsertRow {
        lease_key: Some(key.into()),
        ..w.row("a")
    };
    let end = w.now + secs(600);
    w.store
        .pause_key(
            "paused",
            end,
            w.now,
            "maintenance",
            onus::store::PauseMode::Replace,
        )
        .await
        .unwrap();
    // Inserted once the key is paused: the pause held nothing, the claim holds it.
    let held = w.insert(on("paused")).await;
    let wide: Vec<Job> = vec![
        w.insert(on("wide")).await,
        w.insert(on("wide")).await,
        w.insert(on("wide")).await,
    ];
    let jobs = w
        .store
        .claim(ClaimRequest {
            queue: "default".into(),
            kinds: vec!["a".into()],
            limit: 10,
            owner: OWNER.into(),
            now: w.now,
            lease_until: w.now + secs(30),
            caps: Vec::new(),
            lease_slots: vec![("a".into(), 2)],
        })
        .await
        .unwrap();
    assert_eq!(
        jobs.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![wide[0].id, wide[1].id],
        "two slots: two run"
    );
    let h = w.get(&held).await;
    assert_eq!(
        (h.state, h.attempt, h.run_at),
        (JobState::Scheduled, 0, end)
    );
    let third = w.get(&wide[2]).await;
    assert_eq!((third.state, third.attempt), (JobState::Snoozed, 0));
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
    let freed = w.claim(&["a"], 10, later).await;
    assert_eq!(
        freed.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![a.id],
        "both are due again; the key's one slot runs the first, the other waits for it"
    );
}
