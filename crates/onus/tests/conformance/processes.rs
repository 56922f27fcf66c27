//! The processes sharing a database, and what runs where: a started runtime is listed with its
//! queues, slots, kinds and running jobs, and no more once it stops; a named pull worker is
//! listed by its claims.

use std::sync::Arc;
use std::time::Duration;

use onus::{JobContext, JobState, Kind, NewJob, ProcessRole};
use serde_json::json;
use tokio::sync::Semaphore;

use crate::harness::{insert_id, wait_until, Env};

pub async fn a_running_process_is_listed_with_its_queues_and_jobs_until_it_stops(env: Env) {
    let gate = Arc::new(Semaphore::new(0));
    let g = gate.clone();
    let onus = env
        .builder()
        .queue("default", 3)
        .queue("reports", 1)
        .kind(Kind::new("hold").handler(move |_c: JobContext| {
            let g = g.clone();
            async move {
                let _ = g.acquire().await;
                Ok(())
            }
        }))
        .build()
        .unwrap();
    let client = onus.client();
    let a = insert_id(&client, NewJob::new("hold", json!({}))).await;
    let b = insert_id(&client, NewJob::new("hold", json!({}))).await;
    let running = onus.start();
    wait_until("both jobs run and the process is listed", || async {
        let p = client.processes().await.unwrap();
        p.processes.iter().any(|p| p.running == 2)
    })
    .await;
    let p = client.processes().await.unwrap();
    assert_eq!(p.processes.len(), 1, "{p:?}");
    let me = &p.processes[0];
    assert_eq!(me.id, onus.owner());
    assert_eq!(me.role, ProcessRole::Runtime);
    assert!(me.live);
    assert_eq!(me.pid, Some(i64::from(std::process::id())));
    assert_eq!(me.version, env!("CARGO_PKG_VERSION"));
    let queues: Vec<(&str, usize)> = me
        .queues
        .iter()
        .map(|q| (q.name.as_str(), q.slots))
        .collect();
    assert_eq!(queues, vec![("default", 3), ("reports", 1)]);
    assert_eq!(me.kinds, vec!["hold".to_string()]);
    let mut ids: Vec<i64> = me.jobs.iter().map(|j| j.id).collect();
    ids.sort();
    assert_eq!(ids, vec![a, b]);
    assert!(me
        .jobs
        .iter()
        .all(|j| j.kind == "hold" && j.queue == "default" && j.attempted_at.is_some()));
    assert_eq!((p.pulled_running, p.orphaned_running), (0, 0));

    gate.add_permits(2);
    env.wait_state(a, JobState::Completed).await;
    env.wait_state(b, JobState::Completed).await;
    running.shutdown(Duration::from_secs(5)).await;
    let p = client.processes().await.unwrap();
    assert!(
        p.processes.is_empty(),
        "a stopped process is listed no more: {p:?}"
    );
}

pub async fn a_named_pull_worker_is_listed_and_goes_stale(env: Env) {
    let client = env.client();
    client
        .pull_worker_seen(
            "billing-7f3c:4121",
            &["invoice.render".into(), "invoice.mail".into()],
        )
        .await
        .unwrap();
    let p = client.processes().await.unwrap();
    assert_eq!(p.processes.len(), 1, "{p:?}");
    let w = &p.processes[0];
    assert_eq!(
        (w.id.as_str(), w.role, w.live),
        ("billing-7f3c:4121", ProcessRole::Pull, true)
    );
    assert_eq!(
        w.kinds,
        vec!["invoice.mail".to_string(), "invoice.render".to_string()]
    );
    assert_eq!(w.seen_at, env.clock_now());

    // Three presences missed: shown as gone.
    env.clock
        .advance(onus::LIVE_WITHIN + Duration::from_secs(1));
    let p = client.processes().await.unwrap();
    assert!(!p.processes[0].live, "{p:?}");

    for bad in ["", "a\nb"] {
        let e = client.pull_worker_seen(bad, &[]).await.unwrap_err();
        assert!(e.to_string().contains("worker: give a name"), "{e}");
    }
    let long = "w".repeat(onus::MAX_WORKER_NAME + 1);
    assert!(client.pull_worker_seen(&long, &[]).await.is_err());

    // Forgotten after an hour, by the next runtime's presence.
    env.clock.advance(onus::KEPT_FOR);
    let onus = env.builder().build().unwrap();
    let running = onus.start();
    wait_until("the stale worker is forgotten", || async {
        let p = client.processes().await.unwrap();
        p.processes.len() == 1 && p.processes[0].role == ProcessRole::Runtime
    })
    .await;
    running.shutdown(Duration::from_secs(5)).await;
}
