//! Mail against a real SMTP relay on loopback (the testkit's scripted sink), on both storage
//! backends. The manual clock drives hours of retry schedule in milliseconds.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::sync::Arc;
use std::time::Duration;

use onus::{
    Clock, DiscardReason, EntryClass, Job, JobFilter, JobState, ManualClock, NewJob, Onus, Options,
    Running,
};
use onus_mail::{Mail, MailConfig, Relay, SendArgs, SEND};
use onus_testkit::smtp::SmtpSink;
use onus_testkit::{Backend, TestDb};
use serde_json::json;

struct World {
    store: Arc<dyn onus::Store>,
    client: onus::Client,
    clock: ManualClock,
    mail: Mail,
    running: Option<Running>,
    _db: TestDb,
}

fn config(sink: &SmtpSink, url: &str) -> MailConfig {
    let mut relay = Relay::parse(url).unwrap();
    if let Some(ca) = sink.ca_cert() {
        relay.roots.push(std::fs::read(ca).unwrap());
    }
    let mut cfg = MailConfig::new(relay, "example.com");
    cfg.from = Some("Example <noreply@example.com>".parse().unwrap());
    cfg.timeout = Duration::from_secs(20);
    cfg
}

async fn world(backend: Backend, cfg: MailConfig) -> World {
    world_with(backend, Mail::new(cfg), "").await
}

/// A world whose database first runs `setup` (the application's own tables).
async fn world_with(backend: Backend, mail: Mail, setup: &str) -> World {
    let db = TestDb::new(backend).await;
    if !setup.is_empty() {
        db.batch_execute(setup).await;
    }
    let store = onus::open(&db.url).await.unwrap();
    let clock = ManualClock::at("2026-03-01T00:10:00Z".parse().unwrap());
    let onus = Onus::builder(store.clone())
        .component(&mail)
        .clock(clock.clone())
        .queue("default", 8)
        .options(Options {
            poll_interval: Duration::from_millis(100),
            rescue_interval: Duration::from_millis(100),
            heartbeat_interval: Duration::from_millis(100),
            ..Options::default()
        })
        .build()
        .unwrap();
    onus.migrate().await.unwrap();
    let running = Some(onus.start());
    World {
        store,
        client: onus.client(),
        clock,
        mail,
        running,
        _db: db,
    }
}

fn args(to: &str) -> SendArgs {
    SendArgs {
        to: to.into(),
        subject: "Your report is ready".into(),
        text: "Hello,\r\nthe report is ready.\r\n".into(),
        event_id: Some("evt_42".into()),
        ..Default::default()
    }
}

impl World {
    async fn send(&self, a: &SendArgs) -> i64 {
        let job = self.mail.job(a).unwrap();
        self.client.insert(job).await.unwrap().job.id
    }

    async fn job(&self, id: i64) -> Job {
        self.store.get(id).await.unwrap().unwrap()
    }

    /// Waits until job `id` satisfies `f`, advancing the manual clock to each retry's time.
    async fn drive(&self, id: i64, what: &str, f: impl Fn(&Job) -> bool) -> Job {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let j = self.job(id).await;
            if f(&j) {
                return j;
            }
            if matches!(j.state, JobState::Retryable) && j.run_at > self.clock.now() {
                self.clock.advance_to(j.run_at);
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "job {id} never became {what}: {j:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn stop(mut self) {
        if let Some(r) = self.running.take() {
            r.shutdown(Duration::from_secs(5)).await;
        }
    }
}

async fn a_relay_that_answers_451_twice_delivers_on_attempt_3(backend: Backend) {
    let sink = SmtpSink::start_tls().await;
    sink.reply_to_data(&[(451, "4.3.0 try later"), (451, "4.3.0 try later")]);
    let url = format!("smtp://ada:s%3Acret@{}?tls=required", sink.addr);
    let w = world(backend, config(&sink, &url)).await;
    let id = w.send(&args("bob@example.com")).await;
    let j = w
        .drive(id, "completed", |j| j.state == JobState::Completed)
        .await;
    assert_eq!(j.attempt, 3);
    let got = sink.received();
    assert_eq!(got.len(), 3, "one message per attempt");
    for m in &got {
        assert_eq!(
            m.header("Message-ID").as_deref(),
            Some("<evt_42@example.com>")
        );
        assert!(m.tls, "STARTTLS before the message");
        assert_eq!(m.auth, Some(("ada".into(), "s:cret".into())));
        assert_eq!(m.from, "noreply@example.com");
        assert_eq!(m.rcpts, vec!["bob@example.com".to_string()]);
    }
    assert_eq!(
        sink.sessions(),
        3,
        "one session per attempt, nothing retried inside one"
    );
    let sent = w.mail.sent(id).await.unwrap().unwrap();
    assert_eq!(
        (sent.attempt, sent.message_id.as_str()),
        (3, "<evt_42@example.com>")
    );
    // Kept for the retention (30 days), then pruned.
    assert_eq!(w.mail.prune(w.clock.now()).await.unwrap(), 0);
    assert!(w.mail.sent(id).await.unwrap().is_some());
    let later = w.clock.now() + chrono::TimeDelta::days(31);
    assert_eq!(w.mail.prune(later).await.unwrap(), 1);
    assert_eq!(w.mail.sent(id).await.unwrap(), None);
    assert!(
        j.errors.iter().all(|e| e.message.contains("451")),
        "{:?}",
        j.errors
    );
    w.stop().await;
}

async fn implicit_tls_sends_encrypted_from_the_first_byte(backend: Backend) {
    let sink = SmtpSink::start_implicit_tls().await;
    let url = format!("smtps://ada:pw@{}", sink.addr);
    let w = world(backend, config(&sink, &url)).await;
    let id = w.send(&args("bob@example.com")).await;
    w.drive(id, "completed", |j| j.state == JobState::Completed)
        .await;
    let m = &sink.received()[0];
    assert!(m.tls);
    assert_eq!(m.auth, Some(("ada".into(), "pw".into())));
    w.stop().await;
    // A relay whose certificate no trusted root signed: a TLS failure, retryable.
    let mut cfg = config(&sink, &url);
    cfg.relay.roots.clear();
    let w = world(backend, cfg).await;
    let id = w.send(&args("bob@example.com")).await;
    let j = w
        .drive(id, "retryable", |j| j.state == JobState::Retryable)
        .await;
    assert!(
        j.errors[0].message.contains("connect to 127.0.0.1"),
        "{:?}",
        j.errors
    );
    assert_eq!(
        sink.received().len(),
        1,
        "nothing sent over an untrusted connection"
    );
    w.stop().await;
}

/// The library's after-send step: a closure over the transaction that marks the mail, here
/// setting the application's own `notified_at`. Its failure rolls the mark back, and the mail is
/// sent again (same Message-ID) and then marked.
async fn the_on_sent_step_commits_with_the_mark_or_not_at_all(backend: Backend) {
    static NOTIFIED: onus::sql::Sql = onus::sql::Sql::new(
        "notifications",
        "UPDATE notifications SET notified_at = $1 WHERE event_id = $2",
    );
    static READ: onus::sql::Sql =
        onus::sql::Sql::new("notifications", "SELECT notified_at FROM notifications");
    let sink = SmtpSink::start().await;
    let fail = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let f = fail.clone();
    let mail = Mail::new(config(&sink, &sink.url())).on_sent(
        move |tx: &onus::sql::AnyTx<'_>, args: &SendArgs, sent: &onus_mail::Sent| {
            let fail = f.swap(false, std::sync::atomic::Ordering::SeqCst);
            let params = vec![sent.sent_at.into(), args.event_id.clone().into()];
            Box::pin(async move {
                use onus::sql::Tx;
                if fail {
                    return Err(onus::StoreError::Conflict("the step failed".into()));
                }
                tx.execute(&NOTIFIED, &params).await?;
                Ok(())
            })
        },
    );
    let time = if backend == Backend::Sqlite {
        "INTEGER"
    } else {
        "TIMESTAMPTZ"
    };
    let setup = format!(
        "CREATE TABLE notifications (event_id TEXT PRIMARY KEY, notified_at {time});
         INSERT INTO notifications (event_id) VALUES ('evt_42');"
    );
    let w = world_with(backend, mail, &setup).await;
    let id = w.send(&args("bob@example.com")).await;
    let j = w
        .drive(id, "completed", |j| j.state == JobState::Completed)
        .await;
    assert_eq!(j.attempt, 2, "the failed step rolled the mark back");
    assert!(
        j.errors[0].message.contains("the step failed"),
        "{:?}",
        j.errors
    );
    let got = sink.received();
    assert_eq!(got.len(), 2, "sent again, never marked without it");
    assert_eq!(got[0].header("Message-ID"), got[1].header("Message-ID"));
    let rows: Vec<onus::sql::Row> = onus::store::Db::new(w.store.clone())
        .read(|tx| {
            Box::pin(async move {
                use onus::sql::Tx;
                tx.query(&READ, &[]).await
            })
        })
        .await
        .unwrap();
    let at: Option<onus::Timestamp> = rows[0].get("notified_at").unwrap();
    assert_eq!(at, Some(w.mail.sent(id).await.unwrap().unwrap().sent_at));
    w.stop().await;
}

/// A relay that takes the connection and never answers: the session's timeout, retryable.
async fn a_relay_that_never_answers_times_out_retryable(backend: Backend) {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let sink = SmtpSink::start().await;
    let mut cfg = config(&sink, &format!("smtp://{}", silent.local_addr().unwrap()));
    cfg.timeout = Duration::from_secs(1);
    let w = world(backend, cfg).await;
    let id = w.send(&args("bob@example.com")).await;
    let j = w
        .drive(id, "retryable", |j| j.state == JobState::Retryable)
        .await;
    assert!(
        j.errors[0].message.contains("took longer than 1s"),
        "{:?}",
        j.errors
    );
    w.stop().await;
    drop(silent);
}

async fn a_relay_that_always_answers_451_sees_exactly_8_attempts(backend: Backend) {
    let sink = SmtpSink::start().await;
    sink.always_reply_to_data(451, "4.3.0 try later");
    let w = world(backend, config(&sink, &sink.url())).await;
    let started = w.clock.now();
    let id = w.send(&args("bob@example.com")).await;
    let j = w
        .drive(id, "discarded", |j| j.state == JobState::Discarded)
        .await;
    assert_eq!(j.discard_reason, Some(DiscardReason::Exhausted));
    assert_eq!(j.attempt, 8);
    let got = sink.received();
    assert_eq!(got.len(), 8, "exactly one message per attempt");
    assert!(got
        .iter()
        .all(|m| m.header("Message-ID").as_deref() == Some("<evt_42@example.com>")));
    let span = (j.finalized_at.unwrap() - started).num_seconds() as f64 / 3600.0;
    // 20 s x3 each time: 20 + 60 + ... + 14,580 s = 21,860 s (6.07 h), jitter +-10%.
    assert!(
        (5.4..=6.7).contains(&span),
        "the 8 attempts spanned {span:.2} h"
    );
    let alerts = w.store.alerts(false, 10).await.unwrap();
    assert_eq!(alerts.len(), 1, "an exhausted mail raises an alert");
    assert_eq!(alerts[0].job_id, id);
    // Never a mail about a mail: besides the exhausted one, only the hourly prune ran.
    let all = w
        .store
        .list(&JobFilter::default(), 100, None)
        .await
        .unwrap();
    assert!(
        all.iter().all(|j| j.id == id || j.kind == onus_mail::PRUNE),
        "{all:?}"
    );
    w.stop().await;
}

async fn a_relay_that_answers_550_sees_exactly_one(backend: Backend) {
    let sink = SmtpSink::start().await;
    sink.always_reply_to_data(550, "5.7.1 message refused");
    let w = world(backend, config(&sink, &sink.url())).await;
    let id = w.send(&args("bob@example.com")).await;
    let j = w
        .drive(id, "discarded", |j| j.state == JobState::Discarded)
        .await;
    assert_eq!(
        (j.discard_reason, j.attempt),
        (Some(DiscardReason::Permanent), 1)
    );
    assert!(
        j.errors[0].message.contains("5.7.1 message refused"),
        "{:?}",
        j.errors
    );
    assert_eq!(sink.received().len(), 1);
    w.stop().await;
}

async fn some_recipients_refused_completes_and_records_them(backend: Backend) {
    let sink = SmtpSink::start().await;
    sink.reply_to_rcpt("gone@example.com", 550, "5.1.1 no such user");
    let w = world(backend, config(&sink, &sink.url())).await;
    let mut a = args("bob@example.com");
    a.cc = "gone@example.com".into();
    a.bcc = "carol@example.com".into();
    let id = w.send(&a).await;
    let j = w
        .drive(id, "completed", |j| j.state == JobState::Completed)
        .await;
    assert_eq!(j.attempt, 1);
    let sent = w.mail.sent(id).await.unwrap().unwrap();
    assert_eq!(sent.accepted, vec!["bob@example.com", "carol@example.com"]);
    assert_eq!(sent.refused.len(), 1);
    assert_eq!(sent.refused[0].address, "gone@example.com");
    assert!(sent.refused[0].reply.contains("5.1.1 no such user"));
    let m = &sink.received()[0];
    assert_eq!(
        m.header("Bcc"),
        None,
        "blind copies stay out of the headers"
    );
    assert_eq!(m.header("Cc").as_deref(), Some("gone@example.com"));
    // Every recipient refused: permanent, nothing sent.
    sink.reply_to_rcpt("bob@example.com", 550, "5.1.1 no such user");
    let id = w.send(&args("bob@example.com")).await;
    let j = w
        .drive(id, "discarded", |j| j.state == JobState::Discarded)
        .await;
    assert_eq!(j.discard_reason, Some(DiscardReason::Permanent));
    assert!(j.errors[0].message.contains("refused every recipient"));
    assert_eq!(sink.received().len(), 1);
    w.stop().await;
}

async fn the_31st_mail_to_one_recipient_waits_for_the_next_window(backend: Backend) {
    let sink = SmtpSink::start().await;
    let w = world(backend, config(&sink, &sink.url())).await;
    let mut ids = Vec::new();
    for i in 0..31 {
        let mut a = args("Bob@Example.com");
        a.event_id = Some(format!("evt_{i}"));
        ids.push(w.send(&a).await);
        // One by one, so the 31st is the last.
        w.drive(ids[i], "run", |j| {
            j.state != JobState::Available && j.state != JobState::Running
        })
        .await;
    }
    for id in &ids[..30] {
        assert_eq!(w.job(*id).await.state, JobState::Completed);
    }
    let last = w.job(ids[30]).await;
    assert_eq!((last.state, last.attempt), (JobState::Snoozed, 0));
    assert_eq!(
        last.run_at.to_rfc3339(),
        "2026-03-01T01:00:00+00:00",
        "the next window"
    );
    assert!(last.errors[0].message.contains("bob@example.com"));
    assert_eq!(sink.received().len(), 30);
    w.clock.advance_to(last.run_at);
    let j = w
        .drive(ids[30], "completed", |j| j.state == JobState::Completed)
        .await;
    assert_eq!(j.attempt, 1, "the snooze spent no attempt");
    assert_eq!(sink.received().len(), 31);
    w.stop().await;
}

async fn the_6th_notification_about_one_owner_is_dropped(backend: Backend) {
    let sink = SmtpSink::start().await;
    let w = world(backend, config(&sink, &sink.url())).await;
    let mut ids = Vec::new();
    for i in 0..6 {
        let mut a = args(&format!("user{i}@example.com"));
        a.owner = Some("account-7".into());
        a.event_id = Some(format!("evt_{i}"));
        ids.push(w.send(&a).await);
        w.drive(ids[i], "finished", |j| {
            matches!(j.state, JobState::Completed | JobState::Discarded)
        })
        .await;
    }
    let dropped = w.job(ids[5]).await;
    assert_eq!(dropped.state, JobState::Discarded);
    assert_eq!(dropped.discard_reason, Some(DiscardReason::Dropped));
    assert_eq!(dropped.errors[0].class, EntryClass::Dropped);
    assert!(dropped.errors[0].message.contains("account-7"));
    assert_eq!(sink.received().len(), 5);
    assert!(
        w.store.alerts(true, 10).await.unwrap().is_empty(),
        "a drop raises no alert"
    );
    w.stop().await;
}

async fn bad_mail_is_refused_at_insert_naming_the_field(backend: Backend) {
    let sink = SmtpSink::start().await;
    let w = world(backend, config(&sink, &sink.url())).await;
    for (args, says) in [
        (
            json!({"to": "not an address", "subject": "s", "text": "t"}),
            "to[0]",
        ),
        (
            json!({"to": ["a@example.com", "b@"], "subject": "s", "text": "t"}),
            "to[1]",
        ),
        (
            json!({"to": "a@example.com", "cc": 3, "subject": "s", "text": "t"}),
            "cc",
        ),
        (json!({"to": "a@example.com", "subject": "s"}), "text"),
        (
            json!({"to": [], "subject": "s", "text": "t"}),
            "to: give at least one",
        ),
        (
            json!({"to": "a@example.com", "reply_to": "x", "subject": "s", "text": "t"}),
            "reply_to",
        ),
        (
            json!({"to": "a@example.com", "subject": "s", "text": "t", "headers": {"Subject": "x"}}),
            "headers.Subject",
        ),
        (
            json!({"to": "a@example.com", "subject": "s", "text": "t", "event_id": "a b"}),
            "event_id",
        ),
        (
            json!({"to": "a@example.com", "subject": "s", "text": "t", "colour": "red"}),
            "colour",
        ),
    ] {
        let e = w
            .client
            .insert(NewJob::new(SEND, args.clone()))
            .await
            .unwrap_err();
        assert!(matches!(e, onus::Error::Invalid(_)), "{args}: {e}");
        assert!(e.to_string().contains(says), "{args}: {e}");
    }
    let all = w.store.list(&JobFilter::default(), 10, None).await.unwrap();
    assert!(all.is_empty(), "nothing was written");
    w.stop().await;
}

async fn the_after_send_job_commits_with_the_mark(backend: Backend) {
    let sink = SmtpSink::start().await;
    let w = world(backend, config(&sink, &sink.url())).await;
    let mut a = args("bob@example.com");
    a.after_send = Some(onus_mail::AfterSend {
        kind: "notification.mark".into(),
        args: json!({"notification": 7}),
    });
    a.html = Some("<p>the report is ready</p>".into());
    let id = w.send(&a).await;
    w.drive(id, "completed", |j| j.state == JobState::Completed)
        .await;
    let f = JobFilter {
        kinds: vec!["notification.mark".into()],
        ..Default::default()
    };
    let marks = w.store.list(&f, 10, None).await.unwrap();
    assert_eq!(marks.len(), 1);
    assert_eq!(marks[0].args, json!({"notification": 7}));
    let m = &sink.received()[0];
    assert!(m
        .header("Content-Type")
        .unwrap()
        .starts_with("multipart/alternative"));
    assert!(m.data.contains("<p>the report is ready</p>"));
    w.stop().await;
}

async fn a_recipient_refused_for_now_or_a_closed_port_is_retried_with_nothing_sent(
    backend: Backend,
) {
    let sink = SmtpSink::start().await;
    sink.reply_to_rcpt("bob@example.com", 452, "4.2.2 mailbox full");
    let w = world(backend, config(&sink, &sink.url())).await;
    let mut a = args("carol@example.com");
    a.cc = "bob@example.com".into();
    let id = w.send(&a).await;
    let j = w
        .drive(id, "retryable", |j| j.state == JobState::Retryable)
        .await;
    assert_eq!(j.attempt, 1);
    assert!(
        j.errors[0].message.contains("4.2.2 mailbox full"),
        "{:?}",
        j.errors
    );
    assert!(
        sink.received().is_empty(),
        "no recipient got a copy the other missed"
    );
    w.stop().await;

    // Nobody listening: a connection failure, retryable.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let w = world(
        backend,
        config(&sink, &format!("smtp://127.0.0.1:{closed}")),
    )
    .await;
    let id = w.send(&args("bob@example.com")).await;
    let j = w
        .drive(id, "retryable", |j| j.state == JobState::Retryable)
        .await;
    assert!(
        j.errors[0].message.contains("connect to 127.0.0.1"),
        "{:?}",
        j.errors
    );
    w.stop().await;
}

async fn a_dkim_key_signs_every_message(backend: Backend) {
    let sink = SmtpSink::start().await;
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("dkim.pem");
    let ok = std::process::Command::new("openssl")
        .args(["genrsa", "-traditional", "-out"])
        .arg(&key)
        .arg("2048")
        .output()
        .unwrap()
        .status
        .success();
    assert!(ok, "openssl genrsa failed");
    let mut cfg = config(&sink, &sink.url());
    cfg.dkim = Some(
        onus_mail::Dkim::new("example.com", "s1", &std::fs::read_to_string(&key).unwrap()).unwrap(),
    );
    let w = world(backend, cfg).await;
    let id = w.send(&args("bob@example.com")).await;
    w.drive(id, "completed", |j| j.state == JobState::Completed)
        .await;
    let sig = sink.received()[0].header("DKIM-Signature").expect("signed");
    assert!(
        sig.contains("d=example.com") && sig.contains("s=s1"),
        "{sig}"
    );
    let e = onus_mail::Dkim::new("example.com", "s1", "not a key").unwrap_err();
    assert!(e.to_string().contains("dkim.key_file"), "{e}");
    w.stop().await;
}

onus_testkit::both!(
    the_on_sent_step_commits_with_the_mark_or_not_at_all,
    a_relay_that_never_answers_times_out_retryable,
    implicit_tls_sends_encrypted_from_the_first_byte,
    a_recipient_refused_for_now_or_a_closed_port_is_retried_with_nothing_sent,
    a_dkim_key_signs_every_message,
    a_relay_that_answers_451_twice_delivers_on_attempt_3,
    a_relay_that_always_answers_451_sees_exactly_8_attempts,
    a_relay_that_answers_550_sees_exactly_one,
    some_recipients_refused_completes_and_records_them,
    the_31st_mail_to_one_recipient_waits_for_the_next_window,
    the_6th_notification_about_one_owner_is_dropped,
    bad_mail_is_refused_at_insert_naming_the_field,
    the_after_send_job_commits_with_the_mark,
);
