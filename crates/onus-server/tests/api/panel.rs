//! The tasks panel over HTTP (the browser scenarios come with the panel's own tests): login, the
//! session cookie, CSRF, the failed-login limit, and the pages rendering from the API's functions.

use serde_json::json;

use crate::harness::World;

struct Browser {
    http: reqwest::Client,
    base: String,
    cookie: Option<String>,
}

impl Browser {
    fn new(w: &World) -> Browser {
        Browser {
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
            base: w.base.clone(),
            cookie: None,
        }
    }

    async fn get(&self, path: &str) -> (u16, String, reqwest::header::HeaderMap) {
        let mut r = self.http.get(format!("{}{path}", self.base));
        if let Some(c) = &self.cookie {
            r = r.header("cookie", c);
        }
        let res = r.send().await.unwrap();
        let (s, h) = (res.status().as_u16(), res.headers().clone());
        (s, res.text().await.unwrap(), h)
    }

    async fn post(
        &self,
        path: &str,
        form: &[(&str, &str)],
        extra: &[(&str, &str)],
    ) -> (u16, String, reqwest::header::HeaderMap) {
        let body = serde_urlencoded::to_string(form).unwrap();
        let mut r = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body);
        if let Some(c) = &self.cookie {
            r = r.header("cookie", c);
        }
        for (k, v) in extra {
            r = r.header(*k, *v);
        }
        let res = r.send().await.unwrap();
        let (s, h) = (res.status().as_u16(), res.headers().clone());
        (s, res.text().await.unwrap(), h)
    }

    async fn login(&mut self, token: &str) -> String {
        let (s, _, h) = self.post("/login", &[("token", token)], &[]).await;
        assert_eq!(s, 303);
        let set = h["set-cookie"].to_str().unwrap().to_string();
        self.cookie = Some(set.split(';').next().unwrap().to_string());
        set
    }
}

/// The CSRF token a page's forms carry.
fn csrf_of(page: &str) -> String {
    let at = page
        .find("name=\"csrf\" value=\"")
        .expect("a form with the CSRF token")
        + 19;
    page[at..at + page[at..].find('"').unwrap()].to_string()
}

pub async fn login_sets_a_strict_session_and_forms_need_their_token(w: World) {
    let mut b = Browser::new(&w);
    let (s, _, h) = b.get("/").await;
    assert_eq!(
        (s, h["location"].to_str().unwrap()),
        (303, "/login"),
        "no session: the login form"
    );
    let (s, page, h) = b.get("/login").await;
    assert_eq!(s, 200);
    assert!(
        page.contains("<label for=\"token\""),
        "a labelled field: {page}"
    );
    let csp = h["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("default-src 'none'"),
        "{csp}"
    );
    let (s, page, _) = b.post("/login", &[("token", "wrong")], &[]).await;
    assert!(s == 401 && page.contains("not accepted"), "{s} {page}");
    let set = b.login(&w.token).await;
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict") && !set.contains("Secure"),
        "{set}"
    );
    let (_, _, h) = b
        .post(
            "/login",
            &[("token", &w.token)],
            &[("x-forwarded-proto", "https")],
        )
        .await;
    assert!(
        h["set-cookie"].to_str().unwrap().contains("; Secure"),
        "Secure over HTTPS"
    );

    let (s, overview, _) = b.get("/").await;
    assert_eq!(s, 200);
    assert!(
        overview.contains("Jobs by state") && overview.contains("Pause default"),
        "{overview}"
    );
    // A POST without the session's token (or with another) is refused and changes nothing.
    let before = w.fingerprint().await;
    for form in [
        vec![("name", "default"), ("action", "pause")],
        vec![("name", "default"), ("action", "pause"), ("csrf", "forged")],
    ] {
        let (s, _, _) = b.post("/queues/action", &form, &[]).await;
        assert_eq!(s, 403);
    }
    assert_eq!(
        w.fingerprint().await,
        before,
        "a refused form changes nothing"
    );
    let csrf = csrf_of(&overview);
    let (s, _, _) = b
        .post(
            "/queues/action",
            &[("name", "default"), ("action", "pause"), ("csrf", &csrf)],
            &[],
        )
        .await;
    assert_eq!(s, 303);
    let (_, q) = w.get("/api/v1/queues").await;
    assert!(
        q["queues"]
            .as_array()
            .unwrap()
            .iter()
            .any(|q| q["name"] == "default" && q["paused"] == true),
        "{q}"
    );
    // Logging out forgets the cookie.
    let (s, _, h) = b.post("/logout", &[("csrf", &csrf)], &[]).await;
    assert_eq!(s, 303);
    assert!(h["set-cookie"].to_str().unwrap().contains("Max-Age=0"));
}

pub async fn failed_logins_are_limited_and_other_servers_sessions_refused(w: World) {
    let b = Browser::new(&w);
    for _ in 0..5 {
        assert_eq!(b.post("/login", &[("token", "wrong")], &[]).await.0, 401);
    }
    let (s, page, _) = b.post("/login", &[("token", &w.token)], &[]).await;
    assert!(
        s == 429 && page.contains("Too many failed logins"),
        "the sixth try within a minute: {s}"
    );
    // A session made by another server (another database, another key) is refused here.
    let other = crate::harness::api(w.backend).await;
    let mut theirs = Browser::new(&other);
    theirs.login(&other.token).await;
    let mut mine = Browser::new(&w);
    mine.cookie = theirs.cookie.clone();
    let (s, _, h) = mine.get("/").await;
    assert_eq!((s, h["location"].to_str().unwrap()), (303, "/login"));
}

pub async fn every_page_renders_and_a_bulk_action_confirms_its_count(w: World) {
    let batch: Vec<_> = (0..120)
        .map(|i| json!({"kind": "report.build", "args": {"i": i}, "tags": ["panel"]}))
        .collect();
    w.post("/api/v1/jobs/batch", json!({"jobs": batch})).await;
    let (_, j) = w.post("/api/v1/jobs", json!({"kind": "test.fail"})).await;
    let failed = j["id"].as_i64().unwrap();
    w.wait_job(failed, |j| j["state"] == "discarded").await;
    let mut b = Browser::new(&w);
    b.login(&w.token).await;
    for path in [
        "/",
        "/jobs",
        "/jobs?state=discarded",
        "/jobs?q=%22i%22%3A7&kind=report.build",
        &format!("/jobs/{failed}"),
    ] {
        let (s, page, _) = b.get(path).await;
        assert_eq!(s, 200, "{path}: {page}");
        assert!(page.starts_with("<!DOCTYPE html>"), "{path}");
    }
    let (_, page, _) = b.get("/periodic").await;
    assert!(page.contains("nightly-report"), "{page}");
    let (_, page, _) = b.get("/kinds").await;
    assert!(
        page.contains("report.build") && page.contains("pull"),
        "{page}"
    );
    let (_, alerts, _) = b.get("/alerts").await;
    assert!(alerts.contains("the test says no"), "{alerts}");
    let (s, _, _) = b
        .post("/alerts/ack", &[("csrf", &csrf_of(&alerts))], &[])
        .await;
    assert_eq!(s, 303);
    let (_, a) = w.get("/api/v1/alerts").await;
    assert_eq!(a["open"], json!(0), "acknowledge all: {a}");
    let (_, page, _) = b.get(&format!("/jobs/{failed}")).await;
    assert!(
        page.contains("the test says no") && page.contains("Timeline"),
        "{page}"
    );
    let (_, list, _) = b.get("/jobs?tag=panel&limit=50").await;
    assert!(
        list.contains("Next page"),
        "120 jobs make more than one page"
    );
    let csrf = csrf_of(&list);
    let (s, confirm, _) = b
        .post(
            "/jobs/bulk",
            &[
                ("csrf", &csrf),
                ("action", "cancel"),
                ("query", "tag=panel"),
            ],
            &[],
        )
        .await;
    assert!(
        s == 200 && confirm.contains("120 jobs match; 120 can be cancelled"),
        "{confirm}"
    );
    let (_, q) = w
        .get("/api/v1/jobs?tag=panel&state=cancelled&limit=1000")
        .await;
    assert!(
        q["jobs"].as_array().unwrap().is_empty(),
        "the confirmation changes nothing"
    );
    let (s, done, _) = b
        .post(
            "/jobs/bulk",
            &[
                ("csrf", &csrf),
                ("action", "cancel"),
                ("query", "tag=panel"),
                ("confirm", "yes"),
            ],
            &[],
        )
        .await;
    assert!(s == 200 && done.contains("120 of 120"), "{done}");
    let (_, q) = w
        .get("/api/v1/jobs?tag=panel&state=cancelled&limit=1000")
        .await;
    assert_eq!(
        q["jobs"].as_array().unwrap().len(),
        120,
        "every match, not one page"
    );
}

/// Claims `n` report.build jobs as an outside worker would.
async fn claim(client: &onus::Client, queue: &str, n: usize) -> Vec<onus::runtime::Claimed> {
    let mut claimed = Vec::new();
    while claimed.len() < n {
        let got = client
            .claim_for_worker(
                queue,
                &["report.build".into()],
                (n - claimed.len()).min(1000),
                std::time::Duration::ZERO,
            )
            .await
            .unwrap();
        assert!(!got.is_empty(), "{} claimed of {n}", claimed.len());
        claimed.extend(got);
    }
    claimed
}

/// Every page the panel has, for a world whose jobs are `ids` (one per state).
async fn every_page(b: &Browser, ids: &[i64]) -> Vec<(String, String)> {
    let mut paths: Vec<String> = [
        "/",
        "/jobs",
        "/alerts",
        "/periodic",
        "/kinds",
        "/endpoints",
        "/events",
        "/jobs?q=%22n%22&kind=report.build",
        "/jobs?tag=many&created_after=2000-01-01T00:00:00Z",
    ]
    .iter()
    .map(|p| p.to_string())
    .collect();
    paths.extend(
        onus::JobState::ALL
            .iter()
            .map(|s| format!("/jobs?state={}", s.as_str())),
    );
    paths.extend(ids.iter().map(|id| format!("/jobs/{id}")));
    let mut out = Vec::new();
    for path in paths {
        let (s, page, _) = b.get(&path).await;
        assert_eq!(s, 200, "{path}: {page}");
        assert!(
            page.starts_with("<!DOCTYPE html>") && page.contains("</html>"),
            "{path}"
        );
        out.push((path, page));
    }
    out
}

pub async fn every_page_renders_empty_and_with_thousands_in_every_state(w: World) {
    const EACH: usize = 2_000;
    let mut b = Browser::new(&w);
    b.login(&w.token).await;
    let empty = every_page(&b, &[]).await;
    assert!(
        empty[0].1.contains("0 completed"),
        "the charts of an empty database"
    );

    let client = w.parts.onus.client();
    let insert = |kind: &'static str, extra: serde_json::Value| {
        let jobs: Vec<_> = (0..EACH)
            .map(|n| {
                let mut j = json!({"kind": kind, "args": {"n": n}, "tags": ["many"]});
                j.as_object_mut()
                    .unwrap()
                    .extend(extra.as_object().unwrap().clone());
                j
            })
            .collect();
        json!({ "jobs": jobs })
    };
    // Completed and discarded by the in-process kinds; the rest through a pull worker's answers
    // (report.build is claimed by outside workers), a bulk cancel, and a later run_at.
    w.post("/api/v1/jobs/batch", insert("test.echo", json!({})))
        .await;
    w.post("/api/v1/jobs/batch", insert("test.fail", json!({})))
        .await;
    let later = json!({"run_at": "2100-01-01T00:00:00Z"});
    w.post("/api/v1/jobs/batch", insert("report.build", later.clone()))
        .await;
    w.post(
        "/api/v1/jobs/batch",
        insert("report.build", json!({"queue": "cancel-me"})),
    )
    .await;
    let (s, _) = w
        .post("/api/v1/jobs/cancel", json!({"queues": ["cancel-me"]}))
        .await;
    assert_eq!(s, 200);
    // 2 x EACH claimed and answered: failed (retryable) and snoozed. Each claim's jobs are
    // answered before the next claim, so no lease has to outlast thousands of answers.
    w.post("/api/v1/jobs/batch", insert("report.build", json!({})))
        .await;
    w.post("/api/v1/jobs/batch", insert("report.build", json!({})))
        .await;
    let mut answered = 0;
    while answered < 2 * EACH {
        for c in claim(&client, "reports", 100).await {
            // Snoozed first, failed last: a failed job comes due again in 10 s, and a claim
            // takes the jobs waiting since the insert before it (older run_at) however slowly
            // this runs.
            let end = if answered < EACH {
                onus::JobError::snooze_for(std::time::Duration::from_secs(3600), "later")
            } else {
                onus::JobError::retryable("the worker failed")
            };
            client
                .answer(c.job.id, &c.lease_token, Err(end))
                .await
                .unwrap();
            answered += 1;
        }
    }
    // EACH claimed last, from a queue of their own (the retryable ones come due in 10 s), and left
    // running: their kind's lease (an hour in the test configuration) outlasts the test.
    w.post(
        "/api/v1/jobs/batch",
        insert("report.build", json!({"queue": "held"})),
    )
    .await;
    claim(&client, "held", EACH).await;
    // Another EACH waiting now.
    w.post("/api/v1/jobs/batch", insert("report.build", json!({})))
        .await;
    w.wait_get("/api/v1/queues", |q| {
        let default = q["queues"]
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["name"] == "default");
        // At least: an hourly pruning job that falls due meanwhile completes here too.
        default.is_some_and(|d| {
            d["counts"]["completed"].as_u64() >= Some(EACH as u64)
                && d["counts"]["discarded"] == EACH
        })
    })
    .await;
    let mut ids = Vec::new();
    let mut counted = std::collections::BTreeMap::new();
    for state in onus::JobState::ALL {
        let (_, page) = w
            .get(&format!("/api/v1/jobs?state={}&limit=1", state.as_str()))
            .await;
        let n = client
            .count(&onus::JobFilter {
                states: vec![state],
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(n as usize >= EACH, "{}: {n} jobs", state.as_str());
        counted.insert(state, n);
        ids.push(page["jobs"][0]["id"].as_i64().unwrap());
    }
    let pages = every_page(&b, &ids).await;
    let overview = &pages[0].1;
    for state in onus::JobState::ALL {
        let tile = format!(
            "<span class=\"n\">{}</span> {}",
            counted[&state],
            state.as_str()
        );
        assert!(overview.contains(&tile), "{tile} on the overview");
    }
    assert!(
        overview.contains(&format!(
            "{} completed",
            counted[&onus::JobState::Completed]
        )),
        "the last hour's chart counts every completion"
    );
    assert!(
        overview.contains("title=\"open alerts\">99+</span>"),
        "the badge counts no further than 99 of the {EACH} open alerts"
    );
    // A retryable job's page projects its remaining attempts (report.build: 10 s, then 1 m).
    let retryable = ids[onus::JobState::ALL
        .iter()
        .position(|s| *s == onus::JobState::Retryable)
        .unwrap()];
    let (_, job) = w.get(&format!("/api/v1/jobs/{retryable}")).await;
    let run_at: chrono::DateTime<chrono::Utc> = job["run_at"].as_str().unwrap().parse().unwrap();
    let page = &pages
        .iter()
        .find(|(p, _)| *p == format!("/jobs/{retryable}"))
        .unwrap()
        .1;
    for at in [run_at, run_at + chrono::TimeDelta::minutes(1)] {
        let shown = at.format("%Y-%m-%d %H:%M:%S UTC").to_string();
        assert!(
            page.contains(&format!("<span class=\"at\">{shown}</span>")),
            "{shown} in {page}"
        );
    }
    assert!(
        page.contains("value=\"retry\"") && page.contains("value=\"cancel\""),
        "{page}"
    );
    // A completed job offers neither: neither applies to it.
    let completed = ids[onus::JobState::ALL
        .iter()
        .position(|s| *s == onus::JobState::Completed)
        .unwrap()];
    let page = &pages
        .iter()
        .find(|(p, _)| *p == format!("/jobs/{completed}"))
        .unwrap()
        .1;
    assert!(!page.contains("name=\"action\""), "{page}");
    for (path, page) in &pages {
        if path.starts_with("/jobs?state=") {
            assert!(
                page.contains("Next page"),
                "{path}: thousands make several pages"
            );
        }
    }
}

pub async fn the_panel_works_under_a_base_path(w: World) {
    let config = format!(
        "{}\n[panel]\nbase_path = \"/onus\"\n",
        crate::harness::CONFIG
    );
    let w = crate::harness::api_with(w.backend, &config).await;
    let mut b = Browser::new(&w);
    let (s, _, h) = b.get("/onus").await;
    assert_eq!((s, h["location"].to_str().unwrap()), (303, "/onus/login"));
    let (s, _, h) = b.get("/onus/").await;
    assert_eq!((s, h["location"].to_str().unwrap()), (303, "/onus"));
    let (s, _, h) = b.post("/onus/login", &[("token", &w.token)], &[]).await;
    assert_eq!((s, h["location"].to_str().unwrap()), (303, "/onus"));
    b.cookie = Some(
        h["set-cookie"]
            .to_str()
            .unwrap()
            .split(';')
            .next()
            .unwrap()
            .to_string(),
    );
    let (s, overview, _) = b.get("/onus").await;
    assert_eq!(s, 200, "{overview}");
    for link in [
        "href=\"/onus/jobs\"",
        "href=\"/onus/assets/panel.css\"",
        "href=\"/onus\"",
    ] {
        assert!(overview.contains(link), "{link} in {overview}");
    }
    for path in [
        "/onus/jobs",
        "/onus/assets/panel.css",
        "/onus/assets/panel.js",
        "/onus/kinds",
    ] {
        let (s, page, _) = b.get(path).await;
        assert_eq!(s, 200, "{path}: {page}");
    }
    let (s, _, h) = b
        .post(
            "/onus/queues/action",
            &[
                ("csrf", &csrf_of(&overview)),
                ("name", "reports"),
                ("action", "pause"),
            ],
            &[],
        )
        .await;
    assert_eq!((s, h["location"].to_str().unwrap()), (303, "/onus"));
    let (_, q) = w.get("/api/v1/queues").await;
    let reports = q["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["name"] == "reports");
    assert_eq!(reports.unwrap()["paused"], true, "{q}");
    // Outside the base path the API still answers and the panel does not.
    let (s, _, _) = b.get("/jobs").await;
    assert_eq!(s, 404);
}

pub async fn events_come_in_pages_with_their_filters(w: World) {
    // 60 events of a tenant whose name needs encoding, 60 of another.
    for i in 0..120 {
        let tenant = if i % 2 == 0 { "acme & co" } else { "other" };
        let (s, _) = w
            .post(
                "/api/v1/events",
                json!({"type": "t", "payload": {"i": i}, "id": format!("ev-{i}"), "tenant": tenant}),
            )
            .await;
        assert_eq!(s, 202);
    }
    let mut b = Browser::new(&w);
    b.login(&w.token).await;
    let (s, first, _) = b.get("/events?tenant=acme+%26+co&type=t").await;
    assert_eq!(s, 200, "{first}");
    assert!(
        first.contains(">ev-118<") && !first.contains(">ev-119<"),
        "{first}"
    );
    assert!(
        !first.contains(">ev-0<"),
        "50 a page: the oldest is on the next"
    );
    let at = first.find("class=\"next\" href=\"").expect("a next page") + 19;
    let next = first[at..at + first[at..].find('"').unwrap()].replace("&amp;", "&");
    assert!(
        next.contains("tenant=acme+%26+co"),
        "the link keeps the filter: {next}"
    );
    let (s, second, _) = b.get(&next).await;
    assert_eq!(s, 200, "{second}");
    assert!(
        second.contains(">ev-0<") && !second.contains(">ev-118<"),
        "{second}"
    );
    assert!(!second.contains(">ev-1<"), "only the tenant's events");
}

/// Panel sessions outlived the credential they were opened with: a rotated API token, a changed
/// panel password or `onus sessions revoke` end them (in every process: read from the database).
pub async fn regression_sessions_end_with_the_credential(w: World) {
    let mut b = Browser::new(&w);
    b.login(&w.token).await;
    assert_eq!(b.get("/").await.0, 200);
    // The token rotated (as `onus token rotate` does, with its default grace).
    w.parts
        .secrets
        .rotate(
            onus_server::secrets::API_TOKEN,
            onus_server::secrets::generate(onus_server::api::auth::TOKEN_PREFIX),
            chrono::Utc::now(),
            std::time::Duration::from_secs(3600),
        )
        .await
        .unwrap();
    let (s, _, h) = b.get("/").await;
    assert_eq!((s, h["location"].to_str().unwrap()), (303, "/login"));
    // The retired token still serves API clients for its grace, but opens no panel session
    // (one the rotation could not end).
    assert_eq!(w.get("/api/v1/kinds").await.0, 200);
    let (s, page, _) = b.post("/login", &[("token", &w.token)], &[]).await;
    assert!(s == 401 && page.contains("not accepted"), "{s}");
    // A new login works; a revoke ends it too.
    let current = w
        .parts
        .secrets
        .valid(onus_server::secrets::API_TOKEN, chrono::Utc::now())
        .await
        .unwrap()
        .into_iter()
        .find(|v| v.expires_at.is_none())
        .unwrap()
        .value;
    b.login(&current).await;
    assert_eq!(b.get("/").await.0, 200);
    onus_server::panel::Sessions::new(w.parts.secrets.clone())
        .revoke_all()
        .await
        .unwrap();
    let (s, _, h) = b.get("/").await;
    assert_eq!((s, h["location"].to_str().unwrap()), (303, "/login"));
    // A changed panel password ends the sessions opened with the old one.
    let with = |p: &str| format!("{}\n[panel]\npassword = \"{p}\"\n", crate::harness::CONFIG);
    let w = w.restart(&with("first-password-1234")).await.unwrap();
    let mut b = Browser::new(&w);
    b.login("first-password-1234").await;
    assert_eq!(b.get("/").await.0, 200);
    let w = w.restart(&with("second-password-5678")).await.unwrap();
    let mut again = Browser::new(&w);
    again.cookie = b.cookie.clone();
    let (s, _, h) = again.get("/").await;
    assert_eq!((s, h["location"].to_str().unwrap()), (303, "/login"));
}

/// A NUL in a page's query string (`/jobs?kind=%00`) was a 500; it is a 422 page saying so.
pub async fn regression_a_nul_in_a_panel_query_is_a_422_page(w: World) {
    let mut b = Browser::new(&w);
    b.login(&w.token).await;
    for path in [
        "/jobs?kind=%00",
        "/jobs?q=a%00b",
        "/events?tenant=%00",
        "/endpoints?tenant=x%00",
    ] {
        let (s, page, _) = b.get(path).await;
        assert_eq!(s, 422, "{path}: {page}");
        assert!(page.contains("NUL"), "{path}: {page}");
    }
}

/// The cookie a redirect sets for its notice, as the browser would send it back.
fn notice_cookie(h: &reqwest::header::HeaderMap) -> String {
    h.get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("onus_notice="))
        .unwrap_or_else(|| panic!("no notice set: {h:?}"))
        .split(';')
        .next()
        .unwrap()
        .to_string()
}

pub async fn an_action_says_what_it_did_once_and_a_refused_form_keeps_its_input(w: World) {
    let mut b = Browser::new(&w);
    b.login(&w.token).await;
    let session = b.cookie.clone().unwrap();
    let (_, overview, _) = b.get("/").await;
    let csrf = csrf_of(&overview);
    assert!(
        overview.contains("rel=\"icon\"") && overview.contains("/assets/favicon.svg"),
        "{overview}"
    );

    // A queue paused: the overview it leads to says so, once.
    let (s, _, h) = b
        .post(
            "/queues/action",
            &[("csrf", &csrf), ("name", "reports"), ("action", "pause")],
            &[],
        )
        .await;
    assert_eq!(s, 303);
    let set = h
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .find(|v| v.starts_with("onus_notice="))
        .unwrap();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    b.cookie = Some(format!("{session}; {}", notice_cookie(&h)));
    let (s, page, h) = b.get("/").await;
    assert_eq!(s, 200);
    assert!(
        page.contains("<p class=\"notice\" role=\"status\">Paused queue reports: no process claims from it until it is resumed; running jobs finish.</p>"),
        "{page}"
    );
    let cleared = h
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .find(|v| v.starts_with("onus_notice="))
        .unwrap_or_else(|| panic!("the notice is not cleared: {h:?}"));
    assert!(cleared.contains("Max-Age=0"), "{cleared}");
    b.cookie = Some(session.clone());
    let (_, page, _) = b.get("/").await;
    assert!(!page.contains("class=\"notice\""), "shown once: {page}");

    // A key paused: the notice names it and when its pause ends.
    let (_, _, h) = b
        .post(
            "/keys/action",
            &[
                ("csrf", &csrf),
                ("key", "customer:7"),
                ("action", "pause"),
                ("minutes", "30"),
                ("reason", ""),
            ],
            &[],
        )
        .await;
    b.cookie = Some(format!("{session}; {}", notice_cookie(&h)));
    let (_, page, _) = b.get("/").await;
    assert!(
        page.contains("Paused customer:7 until 20") && page.contains("UTC: 0 waiting jobs held."),
        "{page}"
    );
    b.cookie = Some(session.clone());

    // A refused pause: the overview again (422), the form filled as sent, the error under the
    // field it names; nothing paused.
    let (s, page, _) = b
        .post(
            "/keys/action",
            &[
                ("csrf", &csrf),
                ("key", "customer:8"),
                ("action", "pause"),
                ("minutes", "0"),
                ("reason", "their maintenance"),
            ],
            &[],
        )
        .await;
    assert_eq!(s, 422, "{page}");
    assert!(
        page.contains("value=\"customer:8\"") && page.contains("value=\"their maintenance\""),
        "{page}"
    );
    assert!(
        page.contains("aria-invalid=\"true\"")
            && page.contains("<span class=\"field-error\" role=\"alert\" id=\"pause-key-minutes-error\">minutes: &quot;0&quot; is not a pause"),
        "{page}"
    );
    let (_, keys) = w.get("/api/v1/keys").await;
    assert!(!keys.to_string().contains("customer:8"), "{keys}");

    // An endpoint refused: the form keeps what was typed, the error is under the URL.
    let (s, page, _) = b
        .post(
            "/endpoints",
            &[
                ("csrf", &csrf),
                ("url", "ftp://example.com/hook"),
                ("tenant", "acme"),
                ("event_types", "invoice.paid"),
                ("description", "billing"),
                ("payload", "raw"),
            ],
            &[],
        )
        .await;
    assert_eq!(s, 422, "{page}");
    assert!(
        page.contains("value=\"ftp://example.com/hook\"")
            && page.contains("value=\"invoice.paid\"")
            && page.contains("value=\"billing\""),
        "{page}"
    );
    assert!(
        page.contains("id=\"add-endpoint-url-error\">url:"),
        "{page}"
    );
    assert!(page.contains("<option value=\"raw\" selected>"), "{page}");
    let (_, eps) = w.get("/api/v1/endpoints").await;
    assert_eq!(eps["endpoints"].as_array().map(Vec::len), Some(0), "{eps}");

    // The icon, where browsers look for it.
    let (s, svg, h) = b.get("/favicon.ico").await;
    assert_eq!(
        (s, h["content-type"].to_str().unwrap()),
        (200, "image/svg+xml")
    );
    assert!(svg.starts_with("<svg"), "{svg}");
}

pub async fn a_job_page_says_why_it_waits_and_what_ran_when(w: World) {
    let mut b = Browser::new(&w);
    b.login(&w.token).await;
    let session = b.cookie.clone().unwrap();
    let (_, overview, _) = b.get("/").await;
    let csrf = csrf_of(&overview);
    let insert = |body: serde_json::Value| {
        let w = &w;
        async move { w.post("/api/v1/jobs", body).await.1["id"].as_i64().unwrap() }
    };
    let page = |id: i64| {
        let b = &b;
        async move {
            let (s, page, _) = b.get(&format!("/jobs/{id}")).await;
            assert_eq!(s, 200, "{page}");
            page
        }
    };

    // A pull kind's due job: who would take it.
    let due = insert(json!({"kind": "report.build", "args": {}})).await;
    let p = page(due).await;
    assert!(
        p.contains("Why it waits: </strong>Due: waiting for a pull worker to claim it"),
        "{p}"
    );

    // A paused queue holds it: named, with a button that resumes it and comes back here.
    w.post("/api/v1/queues/reports/pause", json!({})).await;
    let p = page(due).await;
    assert!(
        p.contains("Queue reports is paused (since 20")
            && p.contains(">Resume queue reports</button>"),
        "{p}"
    );
    let back = format!("/jobs/{due}");
    let (s, _, h) = b
        .post(
            "/queues/action",
            &[
                ("csrf", &csrf),
                ("name", "reports"),
                ("action", "resume"),
                ("back", &back),
            ],
            &[],
        )
        .await;
    assert_eq!((s, h["location"].to_str().unwrap()), (303, back.as_str()));
    // Only a job's page is a place to come back to.
    let (_, _, h) = b
        .post(
            "/queues/action",
            &[
                ("csrf", &csrf),
                ("name", "reports"),
                ("action", "resume"),
                ("back", "//example.com/"),
            ],
            &[],
        )
        .await;
    assert_eq!(h["location"].to_str().unwrap(), "/");

    // A paused key holds a job of it, until the pause's end.
    let keyed =
        insert(json!({"kind": "report.build", "args": {}, "lease_key": "customer:9"})).await;
    w.post(
        "/api/v1/keys/customer%3A9/pause",
        json!({"seconds": 3600, "reason": "their maintenance"}),
    )
    .await;
    let p = page(keyed).await;
    assert!(
        p.contains("Held by the pause of its lease key customer:9 (their maintenance).")
            && p.contains(">Resume key customer:9</button>")
            && p.contains("(<time datetime=\"20"),
        "{p}"
    );

    // A job inserted for later: scheduled, with how long until it runs.
    let later = (chrono::Utc::now() + chrono::TimeDelta::hours(2)).to_rfc3339();
    let scheduled = insert(json!({"kind": "report.build", "args": {}, "run_at": later})).await;
    let p = page(scheduled).await;
    assert!(
        p.contains("Why it waits: </strong>Scheduled.")
            && (p.contains(">in 1 h 59 min</time>") || p.contains(">in 2 h 0 min</time>")),
        "{p}"
    );

    // An exhausted job links to its alert; its timeline shows when its attempt ran and no
    // attempt ahead.
    let failed = insert(json!({"kind": "test.fail", "args": {}})).await;
    w.wait_job(failed, |j| j["state"] == "discarded").await;
    let p = page(failed).await;
    assert!(
        p.contains("<dt>Alert</dt>") && p.contains("/alerts#alert-") && p.contains(", open"),
        "{p}"
    );
    assert!(!p.contains("Why it waits"), "{p}");
    assert!(
        !p.contains("class=\"ahead\""),
        "a finished job has no attempt ahead: {p}"
    );

    // A pull worker's progress: shown while it runs, labelled once the job ended.
    let (_, claimed) = w
        .post(
            "/api/v1/queues/reports/claim",
            json!({"kinds": ["report.build"], "limit": 10}),
        )
        .await;
    let first = claimed["jobs"][0].clone();
    let id = first["id"].as_i64().unwrap();
    let token = first["lease_token"].clone();
    w.post(
        &format!("/api/v1/jobs/{id}/heartbeat"),
        json!({"lease_token": token, "progress": 0.5, "message": "half"}),
    )
    .await;
    let p = page(id).await;
    assert!(
        p.contains("<dt>Progress</dt>") && p.contains("<dt>Running in</dt>"),
        "{p}"
    );
    w.post(
        &format!("/api/v1/jobs/{id}/complete"),
        json!({"lease_token": token}),
    )
    .await;
    let p = page(id).await;
    assert!(
        p.contains("<dt>Last reported progress</dt>") && !p.contains("<dt>Progress</dt>"),
        "{p}"
    );
    b.cookie = Some(session);
}

pub async fn the_jobs_list_has_state_tabs_and_acts_on_the_chosen_jobs(w: World) {
    let mut b = Browser::new(&w);
    b.login(&w.token).await;
    let ids: Vec<i64> = {
        let batch: Vec<_> = (0..4)
            .map(|i| json!({"kind": "report.build", "args": {"i": i}}))
            .collect();
        let (_, a) = w.post("/api/v1/jobs/batch", json!({"jobs": batch})).await;
        a["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|j| j["id"].as_i64().unwrap())
            .collect()
    };
    let (s, page, _) = b.get("/jobs?kind=report.build").await;
    assert_eq!(s, 200);
    assert!(
        page.contains("aria-current=\"page\">All <span class=\"n\">4</span>")
            && page.contains("available <span class=\"n\">4</span>")
            && page.contains("cancelled <span class=\"n\">0</span>"),
        "{page}"
    );
    assert!(
        page.contains("<datalist id=\"kinds\">")
            && page.contains("<option value=\"report.build\">"),
        "{page}"
    );
    assert!(
        page.contains("name=\"ids\" value=\"")
            && page.contains("form=\"chosen\"")
            && page.contains("name=\"scope\" value=\"chosen\""),
        "{page}"
    );
    assert!(
        page.contains("<time datetime=\"20"),
        "relative run times: {page}"
    );
    let csrf = csrf_of(&page);

    // The chosen jobs' form with none ticked acts on none, never on the whole filter.
    let (s, page, _) = b
        .post(
            "/jobs/bulk",
            &[
                ("csrf", csrf.as_str()),
                ("query", "kind=report.build"),
                ("scope", "chosen"),
                ("action", "delete"),
                ("confirm", "yes"),
            ],
            &[],
        )
        .await;
    assert!(
        s == 422 && page.contains("tick at least one job"),
        "{s} {page}"
    );
    let (_, still) = w.get("/api/v1/jobs?kind=report.build").await;
    assert_eq!(still["jobs"].as_array().unwrap().len(), 4, "{still}");

    // Two chosen: a confirmation with their count, then only they are cancelled.
    let (a, c) = (ids[0].to_string(), ids[2].to_string());
    let form = [
        ("csrf", csrf.as_str()),
        ("query", "kind=report.build"),
        ("action", "cancel"),
        ("scope", "chosen"),
        ("ids", a.as_str()),
        ("ids", c.as_str()),
    ];
    let (s, page, _) = b.post("/jobs/bulk", &form, &[]).await;
    assert_eq!(s, 200, "{page}");
    assert!(page.contains("2 jobs match; 2 can be cancelled."), "{page}");
    let (_, page, _) = b
        .post(
            "/jobs/bulk",
            &[
                ("csrf", csrf.as_str()),
                ("query", "kind=report.build"),
                ("action", "cancel"),
                ("scope", "chosen"),
                ("ids", &format!("{a},{c}")),
                ("confirm", "yes"),
            ],
            &[],
        )
        .await;
    assert!(page.contains("2 of 2 matching jobs cancelled"), "{page}");
    for (i, id) in ids.iter().enumerate() {
        let (_, j) = w.get(&format!("/api/v1/jobs/{id}")).await;
        let want = if i == 0 || i == 2 {
            "cancelled"
        } else {
            "available"
        };
        assert_eq!(j["state"], want, "{j}");
    }
    let (_, page, _) = b.get("/jobs?kind=report.build&state=cancelled").await;
    assert!(
        page.contains(
            "aria-current=\"page\" class=\"state cancelled\">cancelled <span class=\"n\">2</span>"
        ),
        "{page}"
    );

    // The kinds page: a summary row per kind, its jobs by state, the timeline folded.
    let (s, page, _) = b.get("/kinds").await;
    assert_eq!(s, 200);
    let at = page
        .find("<tr id=\"k-report.build\">")
        .unwrap_or_else(|| panic!("{page}"));
    let row = &page[at..at + page[at..].find("</tr>").unwrap()];
    assert!(
        row.contains("<td>pull</td>")
            && row.contains(">reports</a>")
            && row.contains("available 2</a>")
            && row.contains("cancelled 2</a>")
            && row.contains("3 attempts, timeout 1h")
            && row.contains("<details><summary>Timeline</summary>"),
        "{row}"
    );
}

pub async fn the_endpoints_list_shows_each_endpoints_last_answer_and_success_rate(w: World) {
    use onus_testkit::sink::{HttpSink, Reply};
    let sink = HttpSink::start(|r, _| {
        if r.path.starts_with("/bad") {
            Reply::status(400)
        } else {
            Reply::status(200)
        }
    })
    .await;
    let (_, good) = w
        .post(
            "/api/v1/endpoints",
            json!({"url": sink.url("/good"), "description": "Billing service"}),
        )
        .await;
    let (_, bad) = w
        .post("/api/v1/endpoints", json!({"url": sink.url("/bad")}))
        .await;
    w.post(
        "/api/v1/events",
        json!({"type": "invoice.paid", "payload": {}, "id": "list-1"}),
    )
    .await;
    w.wait_get("/api/v1/events/list-1/deliveries", |v| {
        v["deliveries"].as_array().is_some_and(|d| {
            d.len() == 2
                && d.iter()
                    .all(|d| d["state"] == "completed" || d["state"] == "discarded")
        })
    })
    .await;
    let mut b = Browser::new(&w);
    b.login(&w.token).await;
    let (s, page, _) = b.get("/endpoints").await;
    assert_eq!(s, 200);
    let good_id = good["id"].as_str().unwrap();
    let bad_id = bad["id"].as_str().unwrap();
    assert!(
        page.contains(&format!(
            "<a href=\"/endpoints/{good_id}\">Billing service</a>"
        )),
        "a described endpoint is named by its description: {page}"
    );
    let row = |id: &str| {
        let at = page.find(&format!("/endpoints/{id}\"")).unwrap();
        let end = page[at..].find("</tr>").unwrap();
        page[at..at + end].to_string()
    };
    let g = row(good_id);
    assert!(
        g.contains("<span class=\"outcome success\">HTTP 200</span>")
            && g.matches("100% of 1").count() == 2,
        "{g}"
    );
    let b_row = row(bad_id);
    assert!(
        b_row.contains("<span class=\"outcome permanent\">HTTP 400</span>")
            && b_row.matches("0% of 1").count() == 2,
        "{b_row}"
    );
}
