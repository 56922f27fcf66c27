//! One failing call costs exactly one outbound request per attempt: a sink that always answers
//! 503 sees exactly `max_attempts` requests for one `http.request` job over its whole schedule
//! (driven by the manual clock), on both storage backends. The seed's 3 x 3 x 3 = 27 is impossible.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::sync::Arc;
use std::time::Duration;

use onus::{Clock, DiscardReason, JobState, ManualClock, Onus, Options};
use onus_http::request::{self, HttpRequestArgs};
use onus_http::{HttpClient, HttpConfig};
use onus_testkit::sink::{HttpSink, Reply};

async fn urls(dir: &std::path::Path) -> Vec<String> {
    vec![
        format!("sqlite://{}", dir.join("onus.db").display()),
        onus_testkit::PgCluster::shared()
            .fresh_database()
            .await
            .unwrap(),
    ]
}

async fn wait(store: &Arc<dyn onus::Store>, id: i64, f: impl Fn(&onus::Job) -> bool) -> onus::Job {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let j = store.get(id).await.unwrap().unwrap();
        if f(&j) {
            return j;
        }
        assert!(tokio::time::Instant::now() < deadline, "stuck: {j:?}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_always_failing_call_costs_one_request_per_attempt() {
    let dir = tempfile::tempdir().unwrap();
    for url in urls(dir.path()).await {
        let sink = HttpSink::start(|_, _| Reply::status(503)).await;
        let http = Arc::new(
            HttpClient::new(&HttpConfig {
                allow_networks: vec!["127.0.0.1/32".into()],
                ..HttpConfig::default()
            })
            .unwrap(),
        );
        let store = onus::open(&url).await.unwrap();
        let clock = ManualClock::at("2026-03-01T00:00:00Z".parse().unwrap());
        let onus = Onus::builder(store.clone())
            .clock(clock.clone())
            .options(Options {
                poll_interval: Duration::from_millis(100),
                ..Options::default()
            })
            .kind(request::kind(http))
            .build()
            .unwrap();
        let max = onus.kind(request::KIND).unwrap().policy_ref().max_attempts;
        assert_eq!(max, 10, "the default policy");
        let args = HttpRequestArgs {
            method: "DELETE".into(),
            url: sink.url("/calendar/events/42"),
            headers: Default::default(),
            body: None,
        };
        let id = onus
            .client()
            .insert(args.job().unwrap())
            .await
            .unwrap()
            .job
            .id;
        let running = onus.start();
        for attempt in 1..=max {
            let j = wait(&store, id, |j| {
                j.attempt == attempt && matches!(j.state, JobState::Retryable | JobState::Discarded)
            })
            .await;
            assert_eq!(
                sink.count(),
                attempt as usize,
                "{url}: one request per attempt"
            );
            if j.state == JobState::Retryable {
                clock.advance_to(j.run_at);
            }
        }
        let j = store.get(id).await.unwrap().unwrap();
        assert_eq!(
            (j.state, j.discard_reason),
            (JobState::Discarded, Some(DiscardReason::Exhausted))
        );
        assert!(j.errors.iter().all(|e| e.message.contains("503")));
        // Nothing more, ever: move the clock a week on and ask the workers to look.
        clock.advance(Duration::from_secs(7 * 86_400));
        let probe = onus
            .client()
            .insert(
                HttpRequestArgs {
                    url: sink.url("/probe"),
                    ..args.clone()
                }
                .job()
                .unwrap(),
            )
            .await
            .unwrap();
        wait(&store, probe.job.id, |j| {
            j.attempt >= 1 && j.state != JobState::Running
        })
        .await;
        assert_eq!(
            sink.received()
                .iter()
                .filter(|r| r.path == "/calendar/events/42")
                .count(),
            max as usize
        );
        assert!(sink.received().iter().all(|r| r.method == "DELETE"));
        running.shutdown(Duration::from_secs(5)).await;
        let _ = clock.now();
    }
}
