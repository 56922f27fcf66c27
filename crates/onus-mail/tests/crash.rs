//! Send, then mark, under a crash: a process killed (SIGKILL) after the relay accepted a message
//! and before the transaction that marks it committed. After a restart the message is sent once
//! more, with the same Message-ID, and marked: two copies that fold, never zero. On both backends.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::time::Duration;

use onus::{EntryClass, JobFilter, JobState, ManualClock, Onus, Options};
use onus_mail::{AfterSend, Mail, MailConfig, Relay, SendArgs};
use onus_testkit::smtp::SmtpSink;
use onus_testkit::{Backend, TestDb};
use serde_json::json;

/// How long the child's leases last.
const CHILD_LEASE_SECS: i64 = 60;

fn mail(relay: &str) -> Mail {
    let mut cfg = MailConfig::new(Relay::parse(relay).unwrap(), "example.com");
    cfg.from = Some("noreply@example.com".parse().unwrap());
    Mail::new(cfg)
}

fn options() -> Options {
    Options {
        poll_interval: Duration::from_millis(100),
        rescue_interval: Duration::from_millis(100),
        heartbeat_interval: Duration::from_millis(200),
        lease_ttl: Duration::from_secs(CHILD_LEASE_SECS as u64),
        ..Options::default()
    }
}

async fn a_crash_between_acceptance_and_mark_sends_again_and_marks(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = onus::open(&db.url).await.unwrap();
    let sink = SmtpSink::start().await;
    let m = mail(&sink.url());
    let setup = Onus::builder(store.clone()).component(&m).build().unwrap();
    setup.migrate().await.unwrap();
    let args = SendArgs {
        to: "bob@example.com".into(),
        subject: "Your report".into(),
        text: "It is ready.".into(),
        event_id: Some("evt_9".into()),
        after_send: Some(AfterSend {
            kind: "notification.mark".into(),
            args: json!({"notification": 9}),
        }),
        ..Default::default()
    };
    let id = setup
        .client()
        .insert(m.job(&args).unwrap())
        .await
        .unwrap()
        .job
        .id;

    // The child claims the job and sends; the relay keeps the message and holds its reply.
    sink.hold();
    let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "child_mail_process",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("ONUS_CHILD_URL", &db.url)
        .env("ONUS_CHILD_RELAY", sink.url())
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let got = sink.wait_for(1, 60).await;
    // Nothing can commit now: the relay accepts (250) and the mark cannot be written.
    let lock = db.lock_writes().await;
    sink.release();
    // The child says QUIT once it has the 250: accepted, and the mark cannot commit.
    sink.wait_for_quits(1, 60).await;
    child.start_kill().unwrap(); // SIGKILL
    assert!(!child.wait().await.unwrap().success());
    lock.release().await;
    assert_eq!(got[0].reply, 250, "the relay accepted the first copy");
    let j = store.get(id).await.unwrap().unwrap();
    assert_eq!(
        (j.state, j.attempt),
        (JobState::Running, 1),
        "accepted, not marked"
    );
    assert_eq!(m.sent(id).await.unwrap(), None);

    // A new process: once the dead one's lease expires, the mail is sent again and marked.
    sink.unhold();
    let clock =
        ManualClock::at(chrono::Utc::now() + chrono::TimeDelta::seconds(CHILD_LEASE_SECS + 1));
    let m2 = mail(&sink.url());
    let onus = Onus::builder(store.clone())
        .component(&m2)
        .clock(clock.clone())
        .options(options())
        .build()
        .unwrap();
    let running = onus.start();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let j = loop {
        let j = store.get(id).await.unwrap().unwrap();
        if j.state == JobState::Completed {
            break j;
        }
        if j.state == JobState::Retryable {
            clock.advance_to(j.run_at);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never completed: {j:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(j.attempt, 2);
    assert_eq!(j.errors[0].class, EntryClass::WorkerLost);
    let got = sink.received();
    assert_eq!(got.len(), 2, "a second copy, never zero");
    for g in &got {
        assert_eq!(
            g.header("Message-ID").as_deref(),
            Some("<evt_9@example.com>")
        );
    }
    let sent = m2.sent(id).await.unwrap().unwrap();
    assert_eq!(
        sent.attempt, 2,
        "marked by the attempt that sent the second copy"
    );
    let f = JobFilter {
        kinds: vec!["notification.mark".into()],
        ..Default::default()
    };
    let marks = store.list(&f, 10, None).await.unwrap();
    assert_eq!(marks.len(), 1, "the mark's job once");
    running.shutdown(Duration::from_secs(5)).await;
}

onus_testkit::both!(a_crash_between_acceptance_and_mark_sends_again_and_marks);

/// Not a test of its own: the child process the test above kills (the test binary runs itself
/// with `ONUS_CHILD_URL` set). Without that variable it returns at once.
#[test]
fn child_mail_process() {
    let (Ok(url), Ok(relay)) = (
        std::env::var("ONUS_CHILD_URL"),
        std::env::var("ONUS_CHILD_RELAY"),
    ) else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let store = onus::open(&url).await.unwrap();
        let m = mail(&relay);
        let onus = Onus::builder(store)
            .component(&m)
            .options(options())
            .build()
            .unwrap();
        let _running = onus.start();
        std::future::pending::<()>().await;
    });
}
