//! Ending attempts: the lease guard, renewals, rescues.

use super::*;

pub(crate) async fn finish_applies_only_for_the_lease_holder(backend: Backend) {
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
        w.store.finish(&[stranger, stale]).await.unwrap(),
        vec![false, false]
    );
    assert_eq!(w.get(&j).await.state, JobState::Running);
    let retry = Transition::Retry {
        run_at: w.now + secs(10),
        entry: entry(w.now, 1, "boom"),
    };
    assert_eq!(
        w.store.finish(&[w.finish(&j, retry, w.now)]).await.unwrap(),
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
            .finish(&[w.finish(&j, discard, w.now + secs(10))])
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

pub(crate) async fn heartbeat_renews_held_jobs_and_reports_lost_and_cancelled(backend: Backend) {
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

pub(crate) async fn a_rescue_applies_only_to_a_lease_that_really_expired(backend: Backend) {
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
            .finish(&[rescue(dead), rescue(alive)])
            .await
            .unwrap(),
        vec![true, false]
    );
    assert_eq!(w.get(dead).await.state, JobState::Retryable);
    assert_eq!(w.get(alive).await.state, JobState::Running);
}

/// Two callers ending one attempt at once (a worker's answer sent twice, answers sharing a
/// commit): exactly one applies, whichever it is, and the job ends once.
pub(crate) async fn one_attempt_ended_twice_at_once_applies_once(backend: Backend) {
    let w = world(backend).await;
    let rows: Vec<InsertRow> = (0..8).map(|_| w.row("a")).collect();
    w.store.insert(rows).await.unwrap();
    let jobs = w.claim(&["a"], 8, w.now).await;
    assert_eq!(jobs.len(), 8);
    let mut calls = Vec::new();
    for j in &jobs {
        for transition in [Transition::Complete, Transition::Complete] {
            let (store, f) = (w.store.clone(), w.finish(j, transition, w.now));
            calls.push(tokio::spawn(async move { store.finish(&[f]).await }));
        }
    }
    let mut applied = Vec::new();
    for c in calls {
        applied.push(c.await.unwrap().unwrap()[0]);
    }
    for (j, pair) in jobs.iter().zip(applied.chunks(2)) {
        assert_eq!(
            pair.iter().filter(|a| **a).count(),
            1,
            "job {}: {pair:?}",
            j.id
        );
        assert_eq!(w.get(j).await.state, JobState::Completed);
    }
    // Twice in one caller's batch, beside a stranger's answer for it: one of the two applies.
    w.insert(w.row("a")).await;
    let j = w.claim(&["a"], 1, w.now).await.remove(0);
    let stranger = Finish {
        owner: "someone-else".into(),
        ..w.finish(&j, Transition::Complete, w.now)
    };
    let thrice = vec![
        stranger,
        w.finish(&j, Transition::Complete, w.now),
        w.finish(&j, Transition::Complete, w.now),
    ];
    let applied = w.store.finish(&thrice).await.unwrap();
    assert!(
        applied == vec![false, true, false] || applied == vec![false, false, true],
        "{applied:?}"
    );
}
