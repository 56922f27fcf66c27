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

/// Concurrent inserts (an API's single inserts) share commits, yet each caller gets exactly its
/// own rows, claimed under its own claim if it made one, and a row the database refuses fails only
/// its own insert: the others are written, and an insert holding the bad row writes none of its
/// rows. Inserts with unique keys share commits too: of two with the same key, one writes the row
/// and the other gets it as its holder.
pub(crate) async fn concurrent_inserts_each_get_their_own_rows_and_a_refused_row_fails_alone(
    backend: Backend,
) {
    let w = world(backend).await;
    w.db.batch_execute(if backend == Backend::Sqlite {
        "CREATE TRIGGER poisoned_row BEFORE INSERT ON onus_job_rows WHEN NEW.kind = 'poison'
         BEGIN SELECT RAISE(ABORT, 'poisoned row'); END"
    } else {
        "ALTER TABLE onus_job_rows ADD CONSTRAINT poisoned_row CHECK (kind <> 'poison')"
    })
    .await;
    let refused = |i: usize| i == 13 || i == 40 || i == 57;
    let mut calls = Vec::new();
    for i in 0..64 {
        let rows: Vec<InsertRow> = (0..1 + i % 3)
            .map(|k| InsertRow {
                args: serde_json::json!({"i": i, "k": k}),
                kind: if refused(i) && k == i % 3 {
                    "poison".into()
                } else {
                    "a".into()
                },
                // From 48 on, each pair of inserts shares a unique key per row.
                unique_key: (i >= 48).then(|| format!("u-{}-{k}", i / 2)),
                ..w.row("a")
            })
            .take(if i >= 48 { 1 } else { 3 })
            .collect();
        let store = w.store.clone();
        // Every fourth insert claims its first row for an owner of its own.
        let claim = (i % 4 == 1).then(|| onus::store::InsertClaim {
            owner: format!("owner-{i}"),
            now: w.now,
            lease_until: w.now + secs(30 + i as i64),
            take: vec![true],
        });
        calls.push(tokio::spawn(async move {
            match claim {
                Some(claim) => store.insert_claiming(rows, claim).await,
                None => store.insert(rows).await,
            }
        }));
    }
    let mut written = 0;
    let mut holders = std::collections::BTreeMap::new();
    for (i, call) in calls.into_iter().enumerate() {
        let got = call.await.unwrap();
        if refused(i) {
            let e = got.expect_err("the insert holding the refused row fails");
            assert!(e.to_string().contains("poisoned"), "{e}");
            continue;
        }
        let got = got.unwrap();
        if i >= 48 {
            assert_eq!(got.len(), 1, "insert {i} gets its own row");
            let ins = &got[0];
            assert_eq!(ins.job, w.get(&ins.job).await, "insert {i} as stored");
            let pair = holders.entry(i / 2).or_insert_with(Vec::new);
            pair.push((ins.inserted, ins.job.id));
            written += u64::from(ins.inserted);
            continue;
        }
        assert_eq!(got.len(), 1 + i % 3, "insert {i} gets its own rows");
        for (k, ins) in got.iter().enumerate() {
            assert!(ins.inserted);
            let owner = format!("owner-{i}");
            let claimed = (i % 4 == 1 && k == 0).then_some(owner.as_str());
            assert_eq!(
                (ins.job.lease_owner.as_deref(), ins.job.lease_expires_at),
                (claimed, claimed.map(|_| w.now + secs(30 + i as i64))),
                "insert {i} row {k} claimed by its own caller only"
            );
            assert_eq!(
                ins.job.args,
                serde_json::json!({"i": i, "k": k}),
                "insert {i}"
            );
            assert_eq!(ins.job, w.get(&ins.job).await, "insert {i} as stored");
            written += 1;
        }
    }
    for (pair, got) in holders {
        if pair == 28 {
            assert_eq!(got.len(), 1, "the other of the pair was refused");
            assert!(got[0].0, "the key's only insert writes its row");
            continue;
        }
        assert_eq!(got.len(), 2);
        assert_eq!(
            got[0].1, got[1].1,
            "pair {pair}: both get the key's one row"
        );
        assert!(
            got[0].0 != got[1].0,
            "pair {pair}: one of the two writes it"
        );
    }
    let stored = w.store.count(&JobFilter::default()).await.unwrap();
    assert_eq!(stored, written, "nothing of a refused insert was written");
}
