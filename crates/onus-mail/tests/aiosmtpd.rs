//! One end-to-end run through an SMTP server nobody here wrote: Python's aiosmtpd (from PyPI,
//! installed once into a virtual environment under the target directory) stores the message in a
//! Maildir, and Python's own `email` package parses it: the headers and bodies that were sent.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use onus::{JobState, Onus, Options};
use onus_mail::{Mail, MailConfig, Relay, SendArgs};
use onus_testkit::{Backend, TestDb};

const AIOSMTPD: &str = "aiosmtpd==1.4.6";

/// The virtual environment's python, aiosmtpd installed on first use.
fn python() -> PathBuf {
    onus_testkit::python::venv(Path::new(env!("CARGO_TARGET_TMPDIR")), AIOSMTPD).join("python")
}

/// What Python's `email` package reads from a stored message.
const PARSE: &str = r#"
import email, email.policy, json, sys
m = email.message_from_bytes(open(sys.argv[1], 'rb').read(), policy=email.policy.default)
names = ['From', 'To', 'Cc', 'Bcc', 'Reply-To', 'Subject', 'Message-ID', 'X-Campaign']
print(json.dumps({
    'headers': {n: (str(m[n]) if m[n] is not None else None) for n in names},
    'type': m.get_content_type(),
    'text': m.get_body(preferencelist=('plain',)).get_content(),
    'html': m.get_body(preferencelist=('html',)).get_content(),
}))
"#;

fn parse(python: &Path, file: &Path) -> serde_json::Value {
    let out = Command::new(python)
        .args(["-c", PARSE])
        .arg(file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the stored message does not parse: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mail_through_aiosmtpd_parses_with_what_was_sent() {
    let python = tokio::task::spawn_blocking(python).await.unwrap();
    let db = TestDb::new(Backend::Sqlite).await;
    let maildir = db.dir().join("maildir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut server = tokio::process::Command::new(&python)
        .args(["-m", "aiosmtpd", "-n", "-l"])
        .arg(format!("127.0.0.1:{port}"))
        .args(["-c", "aiosmtpd.handlers.Mailbox"])
        .arg(&maildir)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "aiosmtpd did not start listening"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let store = onus::open(&db.url).await.unwrap();
    let mut cfg = MailConfig::new(
        Relay::parse(&format!("smtp://127.0.0.1:{port}")).unwrap(),
        "example.com",
    );
    cfg.from = Some("Example <noreply@example.com>".parse().unwrap());
    let mail = Mail::new(cfg);
    let onus = Onus::builder(store.clone())
        .component(&mail)
        .options(Options {
            poll_interval: Duration::from_millis(100),
            ..Options::default()
        })
        .build()
        .unwrap();
    onus.migrate().await.unwrap();
    let running = onus.start();
    let args = SendArgs {
        to: onus_mail::Recipients(vec!["Ada Lovelace <ada@example.com>".into()]),
        cc: "carol@example.com".into(),
        bcc: "audit@example.com".into(),
        reply_to: Some("support@example.com".into()),
        subject: "Grüße: your report is ready".into(),
        text: "Hello Ada,\nyour report is ready. Grüße!\n".into(),
        html: Some("<p>Hello Ada, your report is <b>ready</b>. Grüße!</p>\n".into()),
        headers: [("X-Campaign".to_string(), "spring".to_string())].into(),
        event_id: Some("evt_1234".into()),
        ..Default::default()
    };
    let id = onus
        .client()
        .insert(mail.job(&args).unwrap())
        .await
        .unwrap()
        .job
        .id;
    let job = onus
        .client()
        .wait_for(id, |j| j.state.is_finished(), Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(job.state, JobState::Completed, "{job:?}");
    let new = maildir.join("new");
    let files: Vec<PathBuf> = std::fs::read_dir(&new)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "one message stored: {files:?}");
    let m = parse(&python, &files[0]);
    let h = &m["headers"];
    assert_eq!(h["From"], "Example <noreply@example.com>");
    assert_eq!(h["To"], "Ada Lovelace <ada@example.com>");
    assert_eq!(h["Cc"], "carol@example.com");
    assert_eq!(
        h["Bcc"],
        serde_json::Value::Null,
        "blind copies stay out of the message"
    );
    assert_eq!(h["Reply-To"], "support@example.com");
    assert_eq!(h["Subject"], "Grüße: your report is ready");
    assert_eq!(h["Message-ID"], "<evt_1234@example.com>");
    assert_eq!(h["X-Campaign"], "spring");
    assert_eq!(m["type"], "multipart/alternative");
    assert_eq!(m["text"], "Hello Ada,\nyour report is ready. Grüße!\n");
    assert_eq!(
        m["html"],
        "<p>Hello Ada, your report is <b>ready</b>. Grüße!</p>\n"
    );
    let sent = mail.sent(id).await.unwrap().unwrap();
    assert_eq!(
        sent.accepted,
        vec!["ada@example.com", "carol@example.com", "audit@example.com"]
    );
    running.shutdown(Duration::from_secs(5)).await;
    server.start_kill().unwrap();
    let _ = server.wait().await;
}
