//! The tasks panel in a real headless browser: Debian's Chromium driven over WebDriver
//! (chromedriver, started here on loopback). `scripts/test` installs both when missing. Every
//! page is saved as a screenshot at desktop and phone width under `target/panel-screenshots/`.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

#[path = "api/harness.rs"]
#[allow(dead_code)]
mod harness;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use onus::{JobContext, JobError, Kind, Periodic, Policy, Schedule};
use onus_testkit::Backend;
use serde_json::json;

/// chromedriver on a free loopback port, killed when dropped.
struct Driver {
    child: Child,
    url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn driver() -> Driver {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .arg("--allowed-ips=127.0.0.1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver is installed (scripts/test installs Debian's chromium-driver)");
    let url = format!("http://127.0.0.1:{port}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "chromedriver did not start"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Driver { child, url }
}

async fn browser(d: &Driver) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({"args": [
            "--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,900",
            // Nothing leaves the machine: no background requests of the browser's own.
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-default-apps", "--disable-extensions", "--no-first-run",
            "--disable-client-side-phishing-detection", "--disable-domain-reliability",
            "--metrics-recording-only", "--no-pings",
        ]}),
    );
    ClientBuilder::rustls()
        .unwrap()
        .capabilities(caps)
        .connect(&d.url)
        .await
        .expect("a browser session")
}

fn shots() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("../panel-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// What does not fit the viewport: the page wider than the window, or a visible button, link
/// in the navigation or form field (an action) outside it, left or right. Empty when all fit.
const MISFITS: &str = r#"
const w = document.documentElement.clientWidth;
const out = [];
if (document.documentElement.scrollWidth > w) {
  out.push(`the page is ${document.documentElement.scrollWidth}px wide in a ${w}px window`);
}
for (const e of document.querySelectorAll('button, nav a, input:not([type=hidden]), select, summary')) {
  const r = e.getBoundingClientRect();
  if (r.width === 0 && r.height === 0) continue; // not shown (a closed <details>, hidden)
  if (r.left < 0 || r.right > w + 0.5) {
    out.push(`${e.tagName.toLowerCase()} "${(e.innerText || e.value || e.name || '').trim().slice(0, 40)}" spans ${Math.round(r.left)}..${Math.round(r.right)}px`);
  }
}
return out;
"#;

/// Saves the page at desktop and phone width; at phone width the page must fit the screen and
/// every action stay on it.
async fn shoot(c: &Client, name: &str) {
    for (label, w, h) in [("desktop", 1280, 900), ("phone", 390, 844)] {
        c.set_window_size(w, h).await.unwrap();
        let png = c.screenshot().await.unwrap();
        std::fs::write(shots().join(format!("{name}-{label}.png")), png).unwrap();
        if label == "phone" {
            let misfits = c.execute(MISFITS, vec![]).await.unwrap();
            assert_eq!(
                misfits,
                json!([]),
                "{name} does not fit a {w}px phone (see {name}-phone.png)"
            );
        }
    }
    c.set_window_size(1280, 900).await.unwrap();
}

async fn wait_text(c: &Client, css: &str, text: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(e) = c.find(Locator::Css(css)).await {
            if e.text().await.unwrap_or_default().contains(text) {
                return;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{css} never showed {text:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Clicks the element `at` finds; one replaced by a page still loading (a stale reference, or
/// none yet) is found again, until a deadline.
async fn click(c: &Client, at: Locator<'_>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let tried = match c.find(at).await {
            Ok(e) => e.click().await,
            Err(e) => Err(e),
        };
        match tried {
            Ok(()) => return,
            Err(e) => assert!(
                tokio::time::Instant::now() < deadline,
                "cannot click {at:?}: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Types `text` into the element `at` finds.
async fn type_into(c: &Client, at: Locator<'_>, text: &str) {
    c.find(at).await.unwrap().send_keys(text).await.unwrap();
}

/// Reloads `url` until its page shows `text` (the panel's own refresh does the same).
async fn wait_page(c: &Client, url: &str, text: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        c.goto(url).await.unwrap();
        let body = c
            .find(Locator::Css("main"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap_or_default();
        if body.contains(text) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{url} never showed {text:?}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A periodic job that fails every second (without an alert), for the periodic page.
const SYNC: &str = "test.sync";

async fn scenario(backend: Backend, d: &Driver) {
    let db = onus_testkit::TestDb::new(backend).await;
    let url = db.url.clone();
    let w = harness::api_plus(db, &url, backend, harness::CONFIG, |b| {
        b.kind(
            Kind::new(SYNC)
                .policy(Policy {
                    max_attempts: 1,
                    ..Policy::preset_default()
                })
                .handler(|_ctx: JobContext| async {
                    Err(JobError::retryable("upstream refused the sync"))
                }),
        )
        .periodic(Periodic::new(
            "flaky-sync",
            Schedule::every(Duration::from_secs(1)).unwrap(),
            onus::NewJob::new(SYNC, json!({})),
        ))
    })
    .await
    .unwrap();
    // Fails its only attempt (raising an alert); a manual retry is its second and completes.
    let (_, j) = w
        .post(
            "/api/v1/jobs",
            json!({"kind": "test.fail", "args": {"ok_from_attempt": 2}}),
        )
        .await;
    let failed = j["id"].as_i64().unwrap();
    w.wait_job(failed, |j| j["state"] == "discarded").await;
    let c = browser(d).await;
    let tag = format!("{backend:?}").to_lowercase();
    // Log in: a wrong token is refused, the right one lets in.
    c.goto(&format!("{}/", w.base)).await.unwrap();
    assert!(c.current_url().await.unwrap().path().ends_with("/login"));
    shoot(&c, &format!("{tag}-login")).await;
    type_into(&c, Locator::Id("token"), "wrong").await;
    click(&c, Locator::Css("form.login button")).await;
    wait_text(&c, "p.error", "not accepted").await;
    type_into(&c, Locator::Id("token"), &w.token).await;
    click(&c, Locator::Css("form.login button")).await;
    wait_text(&c, "h1", "Overview").await;
    shoot(&c, &format!("{tag}-overview")).await;
    // Find the discarded job through the filters, open it, retry it.
    c.goto(&format!("{}/jobs", w.base)).await.unwrap();
    type_into(&c, Locator::Css("input[name=kind]"), "test.fail").await;
    click(&c, Locator::Css("form.filters button")).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !c
        .current_url()
        .await
        .unwrap()
        .as_str()
        .contains("kind=test.fail")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the filter never applied"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    click(&c, Locator::Css("nav.tabs a.discarded")).await;
    wait_text(&c, "nav.tabs a[aria-current=page]", "discarded 1").await;
    wait_text(&c, "table.jobs", "test.fail").await;
    shoot(&c, &format!("{tag}-jobs")).await;
    click(&c, Locator::LinkText(&failed.to_string())).await;
    wait_text(&c, "h1", &format!("Job {failed}")).await;
    shoot(&c, &format!("{tag}-job")).await;
    // Retry it with one click: it runs again and completes.
    click(&c, Locator::Css("div.actions button")).await;
    wait_page(&c, &format!("{}/jobs/{failed}", w.base), "completed").await;
    shoot(&c, &format!("{tag}-job-completed")).await;
    // Its exhaustion raised an alert: acknowledge it.
    c.goto(&format!("{}/alerts", w.base)).await.unwrap();
    wait_text(&c, "main form button", "Acknowledge all 1 open alerts").await;
    shoot(&c, &format!("{tag}-alerts-open")).await;
    click(&c, Locator::XPath("//td/form/button[. = 'Acknowledge']")).await;
    wait_text(&c, "main", "No open alert").await;
    let (_, alerts) = w.get("/api/v1/alerts").await;
    assert_eq!(alerts["open"], 0, "{alerts}");
    assert!(alerts["alerts"][0]["acked_at"].is_string(), "{alerts}");
    // The periodic job's last failure, with its error.
    wait_page(
        &c,
        &format!("{}/periodic", w.base),
        "upstream refused the sync",
    )
    .await;
    shoot(&c, &format!("{tag}-periodic")).await;
    // Pause the schedule, run it once by hand, resume it.
    click(&c, Locator::XPath("//button[. = 'Pause flaky-sync']")).await;
    wait_text(&c, "main table", "paused since").await;
    let (_, p) = w.get("/api/v1/periodic").await;
    let row = p["periodic"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "flaky-sync")
        .unwrap()
        .clone();
    assert!(row["paused_at"].is_string(), "{row}");
    shoot(&c, &format!("{tag}-periodic-paused")).await;
    let (_, before) = w.get("/api/v1/jobs?kind=test.sync&limit=1000").await;
    let before = before["jobs"].as_array().unwrap().len();
    click(&c, Locator::XPath("//button[. = 'Run now flaky-sync']")).await;
    w.wait_get("/api/v1/jobs?kind=test.sync&limit=1000", |v| {
        v["jobs"].as_array().is_some_and(|a| a.len() > before)
    })
    .await;
    click(&c, Locator::XPath("//button[. = 'Resume flaky-sync']")).await;
    wait_text(&c, "main table", "Pause flaky-sync").await;
    // The refresh toggle brings a new job into the list without reloading the page.
    c.goto(&format!("{}/jobs?kind=report.build", w.base))
        .await
        .unwrap();
    click(&c, Locator::Id("auto-refresh")).await;
    c.execute("window.onusKept = 'yes'", vec![]).await.unwrap();
    let (_, fresh) = w
        .post(
            "/api/v1/jobs",
            json!({"kind": "report.build", "args": {"fresh": true}}),
        )
        .await;
    let fresh = fresh["id"].as_i64().unwrap();
    wait_text(&c, "table.jobs", &fresh.to_string()).await;
    let kept = c.execute("return window.onusKept", vec![]).await.unwrap();
    assert_eq!(kept, json!("yes"), "the list changed without a reload");
    click(&c, Locator::Id("auto-refresh")).await;
    // Bulk-cancel a filter that matches 250 jobs across several pages: all 250.
    let batch: Vec<_> = (0..250)
        .map(|i| json!({"kind": "report.build", "args": {"i": i}, "tags": ["bulk"]}))
        .collect();
    w.post("/api/v1/jobs/batch", json!({"jobs": batch})).await;
    c.goto(&format!("{}/jobs?tag=bulk&limit=50", w.base))
        .await
        .unwrap();
    wait_text(&c, "a.next", "Next page").await;
    click(&c, Locator::Css("form.bulk button[value=cancel]")).await;
    wait_text(&c, "main p", "250 jobs match; 250 can be cancelled").await;
    shoot(&c, &format!("{tag}-bulk-confirm")).await;
    click(&c, Locator::Css("button.danger")).await;
    wait_text(&c, "main p", "250 of 250").await;
    let (_, q) = w
        .get("/api/v1/jobs?tag=bulk&state=cancelled&limit=1000")
        .await;
    assert_eq!(q["jobs"].as_array().unwrap().len(), 250);
    // An endpoint whose deliveries fail into discarded, fixed, redelivered.
    let fixed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let f = fixed.clone();
    let sink = onus_testkit::sink::HttpSink::start(move |_, _| {
        if f.load(std::sync::atomic::Ordering::SeqCst) {
            onus_testkit::sink::Reply::status(200)
        } else {
            onus_testkit::sink::Reply::status(400)
        }
    })
    .await;
    c.goto(&format!("{}/endpoints", w.base)).await.unwrap();
    type_into(&c, Locator::Css("input[name=url]"), &sink.url("/hook")).await;
    click(&c, Locator::Css("form#add-endpoint button")).await;
    wait_text(&c, "pre.secret", "whsec_").await;
    shoot(&c, &format!("{tag}-secret")).await;
    w.post(
        "/api/v1/events",
        json!({"type": "t", "payload": {}, "id": "browser-1"}),
    )
    .await;
    w.wait_get("/api/v1/events/browser-1/deliveries", |v| {
        v["deliveries"][0]["state"] == "discarded"
    })
    .await;
    fixed.store(true, std::sync::atomic::Ordering::SeqCst);
    click(&c, Locator::Css("main a")).await;
    wait_text(&c, "div.actions", "Redeliver 1 discarded").await;
    shoot(&c, &format!("{tag}-endpoint")).await;
    click(&c, Locator::XPath("//button[starts-with(., 'Redeliver')]")).await;
    wait_text(&c, "p.notice", "Redelivered 1 delivery.").await;
    w.wait_get("/api/v1/events/browser-1/deliveries", |v| {
        v["deliveries"][0]["state"] == "completed"
    })
    .await;
    wait_page(&c, &format!("{}/events/browser-1", w.base), "completed").await;
    shoot(&c, &format!("{tag}-event")).await;
    // A pull worker's progress while it runs, then the result it kept, on the job's page.
    let (_, report) = w
        .post(
            "/api/v1/jobs",
            json!({"kind": "report.build", "args": {"month": "2026-11"}}),
        )
        .await;
    let rid = report["id"].as_i64().unwrap();
    let (_, claimed) = w
        .post(
            "/api/v1/queues/reports/claim",
            json!({"kinds": ["report.build"], "limit": 1000, "wait": 0}),
        )
        .await;
    let token = claimed["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["id"] == rid)
        .unwrap()["lease_token"]
        .clone();
    w.post(
        &format!("/api/v1/jobs/{rid}/heartbeat"),
        json!({"lease_token": token, "progress": 0.4, "message": "page 4 of 10"}),
    )
    .await;
    wait_page(&c, &format!("{}/jobs/{rid}", w.base), "40%, page 4 of 10").await;
    shoot(&c, &format!("{tag}-job-progress")).await;
    w.post(
        &format!("/api/v1/jobs/{rid}/complete"),
        json!({"lease_token": token, "result": {"pages": 10, "url": "https://reports.example/2026-11"}}),
    )
    .await;
    wait_page(
        &c,
        &format!("{}/jobs/{rid}", w.base),
        "https://reports.example/2026-11",
    )
    .await;
    wait_text(&c, "main", "Result").await;
    shoot(&c, &format!("{tag}-job-result")).await;
    // Pause a key from the overview: its waiting job is held and counted; resume it.
    let (_, keyed) = w
        .post(
            "/api/v1/jobs",
            json!({"kind": "report.build", "args": {}, "lease_key": "customer:browser"}),
        )
        .await;
    c.goto(&format!("{}/", w.base)).await.unwrap();
    type_into(&c, Locator::Css("input[name=key]"), "customer:browser").await;
    type_into(&c, Locator::Css("input[name=reason]"), "their maintenance").await;
    click(&c, Locator::XPath("//button[. = 'Pause key']")).await;
    wait_text(&c, "p.notice", "Paused customer:browser until").await;
    wait_text(
        &c,
        "section[aria-labelledby=keys] table",
        "their maintenance",
    )
    .await;
    let held = c
        .find(Locator::XPath(
            "//section[@aria-labelledby='keys']//tbody/tr/td[3]",
        ))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(held, "1", "the key's waiting job is held");
    let (_, j) = w.get(&format!("/api/v1/jobs/{}", keyed["id"])).await;
    assert_eq!(j["state"], "scheduled", "{j}");
    shoot(&c, &format!("{tag}-paused-key")).await;
    click(
        &c,
        Locator::XPath("//button[. = 'Resume customer:browser']"),
    )
    .await;
    wait_text(&c, "section[aria-labelledby=keys]", "No key is paused").await;
    let (_, keys) = w.get("/api/v1/keys").await;
    assert_eq!(keys["keys"], json!([]));
    // The overview once the scenarios above have filled it.
    c.goto(&format!("{}/", w.base)).await.unwrap();
    wait_text(&c, "h1", "Overview").await;
    shoot(&c, &format!("{tag}-overview-end")).await;
    for page in [
        "kinds",
        "events",
        "alerts",
        "endpoints",
        "processes",
        "jobs",
    ] {
        c.goto(&format!("{}/{page}", w.base)).await.unwrap();
        c.find(Locator::Css("h1")).await.unwrap();
        shoot(&c, &format!("{tag}-{page}")).await;
    }
    // What runs where: this server, live, with its queues and slots.
    c.goto(&format!("{}/processes", w.base)).await.unwrap();
    wait_text(&c, "main table", "live").await;
    wait_text(&c, "main table", "runtime").await;
    wait_text(&c, "main table", "default (").await;
    // Log out: pages are refused again.
    c.goto(&format!("{}/", w.base)).await.unwrap();
    click(&c, Locator::Css("form.logout button")).await;
    wait_text(&c, "h1", "Log in").await;
    c.goto(&format!("{}/jobs", w.base)).await.unwrap();
    assert!(
        c.current_url().await.unwrap().path().ends_with("/login"),
        "logged out: refused"
    );
    c.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_panel_in_a_real_browser() {
    let d = driver().await;
    scenario(Backend::Sqlite, &d).await;
    scenario(Backend::Postgres, &d).await;
}
