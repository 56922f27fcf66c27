//! Progress reported by a running handler, and the result a completed job keeps.

use std::sync::Arc;
use std::time::Duration;

use onus::{JobContext, JobError, JobState, Kind, NewJob};
use serde_json::json;
use tokio::sync::Notify;

pub async fn progress_and_a_result_are_kept_with_the_job(env: crate::harness::Env) {
    let go = Arc::new(Notify::new());
    let g = go.clone();
    let onus = env
        .builder()
        .kind(Kind::new("export").handler(move |c: JobContext| {
            let g = g.clone();
            async move {
                let fails = c.job().args["fail"].as_bool().unwrap_or(false);
                c.progress(0.5, "half of the rows written").await.unwrap();
                // Refused reports say what to fix and change nothing.
                assert!(c.progress(1.5, "").await.unwrap_err().0.contains("0 to 1"));
                let huge = "x".repeat(onus::job::MAX_RESULT_BYTES);
                assert!(c
                    .set_result(json!({ "blob": huge }))
                    .unwrap_err()
                    .0
                    .contains("at most"));
                c.set_result(json!({"rows": 1200, "file": "s3://exports/1.csv"}))
                    .unwrap();
                if fails {
                    return Err(JobError::discard("the upload was refused"));
                }
                g.notified().await;
                c.progress(1.0, "done").await.unwrap();
                Ok(())
            }
        }))
        .build()
        .unwrap();
    let client = onus.client();
    let id = crate::harness::insert_id(&client, NewJob::new("export", json!({}))).await;
    let failed =
        crate::harness::insert_id(&client, NewJob::new("export", json!({"fail": true}))).await;
    let running = onus.start();
    // While it runs, its progress is on the job; it has no result yet.
    let j = env
        .wait_job(id, "progress reported", |j| j.progress.is_some())
        .await;
    let p = j.progress.clone().unwrap();
    assert_eq!(
        (p.fraction, p.message.as_str()),
        (0.5, "half of the rows written")
    );
    assert_eq!(p.at, env.clock_now());
    assert_eq!((j.state, j.result.clone()), (JobState::Running, None));
    go.notify_one();
    let j = env.wait_state(id, JobState::Completed).await;
    assert_eq!(
        j.result,
        Some(json!({"rows": 1200, "file": "s3://exports/1.csv"}))
    );
    assert_eq!(j.progress.map(|p| p.fraction), Some(1.0));
    // An attempt that does not complete keeps no result.
    let f = env.wait_state(failed, JobState::Discarded).await;
    assert_eq!(f.result, None);
    assert_eq!(f.progress.map(|p| p.fraction), Some(0.5));
    running.shutdown(Duration::from_secs(5)).await;
}
