//! Mail through the HTTP API: `mail.send` jobs with a `[mail]` section, checked at insert.

use onus_testkit::smtp::SmtpSink;
use serde_json::json;

use crate::harness::{self, World, CONFIG};

/// A mail inserted through `POST /api/v1/jobs` reaches the relay with its Message-ID, and its
/// `after_send` job is inserted with the mark; bad args are a 422 naming the field.
pub async fn a_mail_job_is_sent_and_marked_through_the_api(w: World) {
    // Without a [mail] section a mail job is refused with the reason.
    let (s, e) = w
        .post(
            "/api/v1/jobs",
            json!({"kind": "mail.send", "args": {"to": "bob@example.com", "subject": "s", "text": "t"}}),
        )
        .await;
    assert_eq!(s, 422, "{e}");
    assert!(e.to_string().contains("[mail]"), "{e}");
    let (s, e) = w.get("/api/v1/jobs/1/mail").await;
    assert_eq!(s, 404, "{e}");
    assert!(e.to_string().contains("[mail]"), "{e}");

    let sink = SmtpSink::start().await;
    let toml = format!(
        "{CONFIG}\n[mail]\nurl = \"{}\"\nfrom = \"Example <noreply@example.com>\"\nmessage_id_domain = \"example.com\"\n",
        sink.url()
    );
    let m = harness::api_with(w.backend, &toml).await;
    let (s, e) = m
        .post(
            "/api/v1/jobs",
            json!({"kind": "mail.send", "args": {"to": ["bob@example.com", "not-an-address"], "subject": "s", "text": "t"}}),
        )
        .await;
    assert_eq!(s, 422, "{e}");
    assert!(e.to_string().contains("to[1]"), "{e}");
    let (s, e) = m
        .post(
            "/api/v1/jobs",
            json!({"kind": "mail.send", "args": {"to": "bob@example.com", "subject": "s", "text": "t",
                "after_send": {"kind": "nobody.runs.this"}}}),
        )
        .await;
    assert_eq!(s, 422, "{e}");
    assert!(
        e.to_string().contains("args.after_send.kind: unknown kind"),
        "{e}"
    );
    let (s, job) = m
        .post(
            "/api/v1/jobs",
            json!({"kind": "mail.send", "args": {
                "to": "Bob <bob@example.com>", "subject": "Your report", "text": "It is ready.",
                "event_id": "evt_7",
                "after_send": {"kind": "report.build", "args": {"notified": 7}}
            }}),
        )
        .await;
    assert_eq!(s, 201, "{job}");
    let id = job["id"].as_i64().unwrap();
    m.wait_job(id, |j| j["state"] == "completed").await;
    let got = sink.received();
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].header("Message-ID").as_deref(),
        Some("<evt_7@example.com>")
    );
    assert_eq!(got[0].header("Subject").as_deref(), Some("Your report"));
    let (s, sent) = m.get(&format!("/api/v1/jobs/{id}/mail")).await;
    assert_eq!(s, 200, "{sent}");
    assert_eq!(sent["message_id"], "<evt_7@example.com>");
    assert_eq!(sent["accepted"], json!(["bob@example.com"]));
    assert_eq!(sent["refused"], json!([]));
    assert_eq!(sent["attempt"], 1);
    // The job's page in the panel shows the same record.
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let login = http
        .post(format!("{}/login", m.base))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(serde_urlencoded::to_string([("token", m.token.as_str())]).unwrap())
        .send()
        .await
        .unwrap();
    let cookie = login.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let page = http
        .get(format!("{}/jobs/{id}", m.base))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("<h2>Mail</h2>")
            && page.contains("<code>&lt;evt_7@example.com&gt;</code>")
            && page.contains("<dt>Recipients taken</dt><dd>bob@example.com</dd>"),
        "{page}"
    );
    let (s, list) = m.get("/api/v1/jobs?kind=report.build").await;
    assert_eq!(s, 200, "{list}");
    let marks: Vec<_> = list["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|j| j["args"] == json!({"notified": 7}))
        .collect();
    assert_eq!(marks.len(), 1, "{list}");
    // The sixth notification about one owner within the hour is dropped, and counted.
    let mut last = 0;
    for i in 0..6 {
        let (s, job) = m
            .post(
                "/api/v1/jobs",
                json!({"kind": "mail.send", "args": {"to": format!("u{i}@example.com"), "subject": "s", "text": "t", "owner": "acct-1"}}),
            )
            .await;
        assert_eq!(s, 201, "{job}");
        last = job["id"].as_i64().unwrap();
        m.wait_job(last, |j| {
            j["state"] == "completed" || j["state"] == "discarded"
        })
        .await;
    }
    let (_, dropped) = m.get(&format!("/api/v1/jobs/{last}")).await;
    assert_eq!(dropped["discard_reason"], "dropped", "{dropped}");
    let (s, text) = m.raw("GET", "/metrics", Some(&m.token), None).await;
    assert_eq!(s, 200);
    let text = text.as_str().unwrap_or_default();
    assert!(text.contains("onus_mail_dropped_total"), "{text}");
    let mark = marks[0]["id"].as_i64().unwrap();
    let (s, e) = m.get(&format!("/api/v1/jobs/{mark}/mail")).await;
    assert_eq!(s, 404, "{e}");
    assert!(e.to_string().contains("has sent no mail"), "{e}");
}
