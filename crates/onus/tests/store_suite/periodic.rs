//! Periodic schedules' periods.

use super::*;

pub(crate) async fn a_period_is_enqueued_once(backend: Backend) {
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

/// A schedule's missed periods are skipped without a job, and a paused schedule resumes at the
/// time it is given; a resume of a schedule not paused changes nothing.
pub(crate) async fn a_schedule_skips_pauses_and_resumes(backend: Backend) {
    let w = world(backend).await;
    w.store
        .upsert_periodic("p", "a", "every: 1h", w.now)
        .await
        .unwrap();
    let next = w.now + secs(7200);
    w.store.skip_periods("p", next).await.unwrap();
    let row = |rows: Vec<onus::store::PeriodicRow>| rows.into_iter().next().unwrap();
    let p = row(w.store.list_periodic().await.unwrap());
    assert_eq!((p.next_run_at, p.last_job_id), (Some(next), None));
    assert!(
        !w.store.pause_periodic("p", None, None).await.unwrap(),
        "not paused"
    );
    assert!(w
        .store
        .pause_periodic("p", Some(w.now), None)
        .await
        .unwrap());
    assert_eq!(
        row(w.store.list_periodic().await.unwrap()).paused_at,
        Some(w.now)
    );
    let resumed = w.now + secs(60);
    assert!(w
        .store
        .pause_periodic("p", None, Some(resumed))
        .await
        .unwrap());
    let p = row(w.store.list_periodic().await.unwrap());
    assert_eq!((p.paused_at, p.next_run_at), (None, Some(resumed)));
}
