//! Push kinds: the server POSTs each job to the kind's URL, signed, and classifies the answer.

use std::time::Duration;

use onus_testkit::sink::{HttpSink, Reply};
use serde_json::{json, Value};

use crate::harness::{api_with, verifies, World, CONFIG};

/// A world whose `push.*` kinds post to `sink`.
async fn pushing(w: World, sink: &HttpSink) -> World {
    let backend = w.backend;
    drop(w);
    let toml = format!(
        r#"{CONFIG}
[kinds."push.ok"]
url = "{ok}"
headers = {{ "x-team" = "reports" }}
[kinds."push.ok".policy]
max_attempts = 3
backoff = {{ schedule = ["200ms"] }}
jitter = 0.0

[kinds."push.fixed"]
url = "{flaky}"
secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
[kinds."push.fixed".policy]
max_attempts = 3
backoff = {{ schedule = ["200ms"] }}
jitter = 0.0
"#,
        ok = sink.url("/ok"),
        flaky = sink.url("/flaky"),
    );
    api_with(backend, &toml).await
}

fn by_path(sink: &HttpSink, path: &str) -> Vec<onus_testkit::sink::Received> {
    sink.received()
        .into_iter()
        .filter(|r| r.path.starts_with(path))
        .collect()
}

pub async fn a_push_kind_posts_each_job_signed_and_the_answer_is_classified(w: World) {
    // /ok answers by the job's args: 200, 500 then 200, or 404.
    let sink = HttpSink::start(|r: &onus_testkit::sink::Received, _| {
        let body: Value = serde_json::from_slice(&r.body).unwrap_or_default();
        let attempt = body["attempt"].as_u64().unwrap_or(0);
        match (body["args"]["script"].as_str().unwrap_or(""), attempt) {
            ("fail-once", 1) => {
                Reply::status(500).body("{\"error\": \"database   down\",\n \"retry\": true}")
            }
            ("missing", _) => Reply::status(404).body("no such invoice"),
            _ => Reply::status(200),
        }
    })
    .await;
    let w = pushing(w, &sink).await;
    let (_, kinds) = w.get("/api/v1/kinds").await;
    let ok = kinds["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["name"] == "push.ok")
        .unwrap()
        .clone();
    assert_eq!(
        (&ok["handled_by"], &ok["url"]),
        (&json!("push"), &json!(sink.url("/ok"))),
        "{ok}"
    );
    let secret = ok["secret"]
        .as_str()
        .expect("GET /kinds shows a push kind's secret")
        .to_string();
    assert!(secret.starts_with("whsec_"));

    let insert = |script: &str| {
        let w = &w;
        let body = json!({"kind": "push.ok", "args": {"script": script}});
        async move { w.post("/api/v1/jobs", body).await.1["id"].as_i64().unwrap() }
    };
    let plain = insert("plain").await;
    let once = insert("fail-once").await;
    let missing = insert("missing").await;
    let j = w.wait_job(plain, |j| j["state"] == "completed").await;
    assert_eq!(j["attempt"], json!(1));
    let j = w.wait_job(once, |j| j["state"] == "completed").await;
    assert_eq!(
        (&j["attempt"], &j["errors"][0]["class"]),
        (&json!(2), &json!("error")),
        "500 then 200: {j}"
    );
    // A failure's history says what the other side answered, on one line.
    assert_eq!(
        j["errors"][0]["message"],
        json!("HTTP 500; response: {\"error\": \"database down\", \"retry\": true}"),
        "{j}"
    );
    let j = w.wait_job(missing, |j| j["state"] == "discarded").await;
    assert_eq!(j["discard_reason"], json!("permanent"), "{j}");
    assert!(
        j["errors"][0]["message"]
            .as_str()
            .unwrap()
            .ends_with("HTTP 404; response: no such invoice"),
        "{j}"
    );

    // Every request: signed with the kind's secret, job_<id> as webhook-id, the kind's headers.
    let sent = by_path(&sink, "/ok");
    assert_eq!(sent.len(), 4, "one request per attempt");
    for r in &sent {
        let body: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(
            r.header("webhook-id"),
            Some(format!("job_{}", body["id"]).as_str())
        );
        assert_eq!(r.header("x-team"), Some("reports"));
        assert_eq!(body["kind"], json!("push.ok"));
        assert!(verifies(&secret, r), "the service verifies the signature");
    }
}

pub async fn a_retry_after_snoozes_a_push_without_spending_an_attempt(w: World) {
    let sink = HttpSink::start(|_, n| {
        if n == 1 {
            Reply::status(429).header("retry-after", "1")
        } else {
            Reply::status(200)
        }
    })
    .await;
    let w = pushing(w, &sink).await;
    let (_, j) = w
        .post("/api/v1/jobs", json!({"kind": "push.fixed", "args": {}}))
        .await;
    let id = j["id"].as_i64().unwrap();
    let done = tokio::time::timeout(
        Duration::from_secs(20),
        w.wait_job(id, |j| j["state"] == "completed"),
    )
    .await
    .unwrap();
    assert_eq!(
        (&done["attempt"], &done["snoozes"]),
        (&json!(1), &json!(1)),
        "{done}"
    );
    assert_eq!(done["errors"][0]["class"], json!("snooze"), "{done}");
    // A configured secret signs.
    let r = by_path(&sink, "/flaky").pop().unwrap();
    assert!(
        verifies("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", &r),
        "signed with the configured secret"
    );
}

/// A push kind whose URL names an address off `[http] allow_networks` (here loopback addresses
/// other than 127.0.0.1, in several spellings) is discarded at its first attempt, saying why,
/// and no connection ever reaches that address.
pub async fn regression_a_push_url_to_a_refused_address_is_refused_at_start(w: World) {
    let backend = w.backend;
    drop(w);
    let counter = onus_testkit::sink::ConnCounter::start("127.0.0.2:0")
        .await
        .unwrap();
    let port = counter.addr().port();
    // A literal address the guard always refuses: the server does not start, naming the setting.
    for host in ["127.0.0.2", "2130706434", "0x7f000002"] {
        let toml =
            format!("{CONFIG}\n[kinds.\"push.refused\"]\nurl = \"http://{host}:{port}/hook\"\n");
        let file = onus_server::config::parse(&toml).unwrap();
        let db = onus_testkit::TestDb::new(backend).await;
        let e = match onus_server::serve::prepare(&file, &db.url, true).await {
            Ok(_) => panic!("{host}: a push kind to a refused address was accepted"),
            Err(e) => e.to_string(),
        };
        assert!(
            e.contains("[kinds.\"push.refused\"] url") && e.contains("[http] allow_networks"),
            "{host}: {e}"
        );
    }
    // A name is checked when resolved: each job is refused at its first attempt, unsent.
    let toml =
        format!("{CONFIG}\n[kinds.\"push.refused\"]\nurl = \"http://localhost:{port}/hook\"\n");
    let w = api_with(backend, &toml).await;
    let (s, j) = w
        .post("/api/v1/jobs", json!({"kind": "push.refused", "args": {}}))
        .await;
    assert_eq!(s, 201, "{j}");
    let id = j["id"].as_i64().unwrap();
    let done = w.wait_job(id, |j| j["state"] == "discarded").await;
    assert_eq!(done["attempt"], 1, "{done}");
    let msg = done["errors"][0]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("refused to connect"), "{done}");
    assert_eq!(
        counter.settled_count().await,
        0,
        "no connection reached 127.0.0.2"
    );
}

/// `lease_key` and `slots` under `[kinds."<kind>"]`: the key is built from each job's args, and
/// one slot per key means one job per customer in flight, two customers side by side; args that
/// lack the key's field are refused at insert, naming it.
pub async fn a_lease_key_from_configuration_runs_one_job_per_key_at_once(w: World) {
    let sink = HttpSink::start(|_, _| Reply::status(200).delay(Duration::from_millis(100))).await;
    let backend = w.backend;
    drop(w);
    let toml = format!(
        r#"{CONFIG}
[kinds."push.leased"]
url = "{url}"
lease_key = "customer:{{customer}}"
slots = 1
"#,
        url = sink.url("/leased"),
    );
    let w = api_with(backend, &toml).await;
    let mut ids = Vec::new();
    for i in 0..8 {
        let customer = if i % 2 == 0 { "a" } else { "b" };
        let (s, j) = w
            .post(
                "/api/v1/jobs",
                json!({"kind": "push.leased", "args": {"customer": customer, "i": i}}),
            )
            .await;
        assert_eq!(s, 201, "{j}");
        ids.push(j["id"].as_i64().unwrap());
    }
    for id in &ids {
        w.wait_job(*id, |j| j["state"] == "completed").await;
    }
    // Four slots in the queue, one per customer: never more than two requests at once.
    assert!(sink.max_in_flight() <= 2, "{}", sink.max_in_flight());
    assert_eq!(sink.count(), 8);
    let (s, e) = w
        .post(
            "/api/v1/jobs",
            json!({"kind": "push.leased", "args": {"i": 9}}),
        )
        .await;
    assert_eq!(s, 422, "{e}");
    assert!(e.to_string().contains("no customer"), "{e}");
}

/// A retry budget from configuration on a push kind whose service always fails: of the retries
/// the policy asks for, the sink sees only those the budget allows; the others wait, deferred,
/// and the gauge says the budget is spent.
pub async fn a_retry_budget_from_configuration_caps_the_retries_sent(w: World) {
    let sink = HttpSink::start(|_, _| Reply::status(500)).await;
    let backend = w.backend;
    drop(w);
    let toml = format!(
        r#"{CONFIG}
[kinds."push.down"]
url = "{url}"
retry_budget = {{ ratio = 0.0, window = "1h", min_per_window = 2 }}
[kinds."push.down".policy]
max_attempts = 3
backoff = {{ schedule = ["100ms"] }}
jitter = 0.0
"#,
        url = sink.url("/down"),
    );
    let w = api_with(backend, &toml).await;
    let mut ids = Vec::new();
    for i in 0..6 {
        let (s, j) = w
            .post(
                "/api/v1/jobs",
                json!({"kind": "push.down", "args": {"i": i}}),
            )
            .await;
        assert_eq!(s, 201, "{j}");
        ids.push(j["id"].as_i64().unwrap());
    }
    // Each ends waiting on the budget: its latest history entry a deferral.
    for id in &ids {
        let j = w
            .wait_job(*id, |j| {
                j["state"] == "scheduled"
                    && j["errors"]
                        .as_array()
                        .and_then(|e| e.last())
                        .map(|e| &e["class"])
                        == Some(&json!("deferred"))
            })
            .await;
        let last = j["errors"].as_array().unwrap().last().unwrap().clone();
        assert!(
            last["message"].as_str().unwrap().contains("retry budget"),
            "{last}"
        );
    }
    assert_eq!(
        sink.count(),
        6 + 2,
        "six first attempts and the two retries the budget allows"
    );
    let (s, text) = w.raw("GET", "/metrics", Some(&w.token), None).await;
    assert_eq!(s, 200);
    let text = text.as_str().unwrap_or_default().to_string();
    let pressure = text
        .lines()
        .find(|l| l.starts_with("onus_retry_budget_pressure") && l.contains("push.down"))
        .unwrap_or_else(|| panic!("no budget gauge in {text}"));
    let v: f64 = pressure.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(v >= 1.0, "{pressure}");
}
