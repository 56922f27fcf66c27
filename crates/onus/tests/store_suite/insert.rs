//! Inserting jobs: single and batch, unique keys.

use super::*;

/// A batch mixing rows with and without unique keys comes back in its own order, each returned
/// job exactly as the database then holds it, and a unique key already held returns its holder.
pub(crate) async fn a_batch_insert_returns_every_row_in_order_as_stored(backend: Backend) {
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

/// An insert that claims for an idle worker writes `running` only the rows its claim takes that
/// are due now, carry no unique key and wait in a queue not paused by hand; the rest are inserted
/// as usual.
pub(crate) async fn an_insert_claims_only_due_rows_of_unpaused_queues(backend: Backend) {
    let w = world(backend).await;
    w.db.batch_execute(&format!(
        "INSERT INTO onus_queues (name, paused_at, updated_at) VALUES ('held', {t}, {t})",
        t = if backend == Backend::Sqlite {
            "1"
        } else {
            "now()"
        }
    ))
    .await;
    let rows = vec![
        w.row("a"),
        w.row("a"),
        InsertRow {
            unique_key: Some("u".into()),
            ..w.row("a")
        },
        InsertRow {
            state: JobState::Scheduled,
            run_at: w.now + secs(60),
            ..w.row("a")
        },
        InsertRow {
            queue: "held".into(),
            ..w.row("a")
        },
    ];
    let until = w.now + secs(30);
    let claim = onus::store::InsertClaim {
        owner: OWNER.into(),
        now: w.now,
        lease_until: until,
        take: vec![true, false, true, true, true],
    };
    let out = w.store.insert_claiming(rows, claim).await.unwrap();
    let states: Vec<JobState> = out.iter().map(|i| i.job.state).collect();
    use JobState::*;
    assert_eq!(
        states,
        [Running, Available, Available, Scheduled, Available]
    );
    let taken = &out[0].job;
    assert_eq!(
        (
            taken.attempt,
            taken.lease_owner.as_deref(),
            taken.lease_expires_at
        ),
        (1, Some(OWNER), Some(until))
    );
    for i in &out {
        assert_eq!(i.job, w.get(&i.job).await, "returned as stored");
    }
}
