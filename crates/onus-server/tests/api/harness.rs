//! One server per test, in this process, on a real listener on loopback, over a real database
//! of either backend; calls go through a real HTTP client.

use std::time::Duration;

use onus::{JobContext, JobError, JobFilter, Kind, Periodic, Policy, Schedule};
use onus_server::serve::{self, Parts, Server};
use onus_testkit::{Backend, TestDb};
use serde_json::{json, Value};

/// Whether a request the sink received carries a Standard Webhooks signature under `secret`,
/// checked by the reference implementation as a receiving service would.
pub fn verifies(secret: &str, r: &onus_testkit::sink::Received) -> bool {
    let hook = standardwebhooks::Webhook::new(secret).unwrap();
    let mut h = axum::http::HeaderMap::new();
    for (k, v) in &r.headers {
        h.insert(
            axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    hook.verify(&r.body, &h).is_ok()
}

/// The configuration every API test runs under: a pull kind with a policy override, a queue.
pub const CONFIG: &str = r#"
[queues]
default = 4
reports = 2

[webhooks]
allow_networks = ["127.0.0.1/32"]

[http]
allow_networks = ["127.0.0.1/32"]

[kinds."report.build"]
queue = "reports"
[kinds."report.build".policy]
max_attempts = 3
backoff = { schedule = ["10s", "1m"] }
# A claim's lease outlasts any test, however slow the machine: a job left running stays running.
timeout = "1h"

[kinds."quick.pull".policy]
max_attempts = 2
backoff = { schedule = ["1s"] }
timeout = "1s"
jitter = 0.0
"#;

/// An in-process kind that completes at once.
pub const ECHO: &str = "test.echo";
/// An in-process kind that fails once, exhausted, with an alert; from attempt
/// `args.ok_from_attempt` on (when given) it completes.
pub const FAIL: &str = "test.fail";

pub struct World {
    /// Kept for the test's length: the database and the server live as long as the world.
    _db: TestDb,
    _server: Server,
    pub parts: Parts,
    pub base: String,
    pub token: String,
    pub http: reqwest::Client,
    pub backend: Backend,
}

pub async fn api(backend: Backend) -> World {
    api_with(backend, CONFIG).await
}

pub async fn api_with(backend: Backend, toml: &str) -> World {
    let db = TestDb::new(backend).await;
    api_in(db, backend, toml).await.unwrap()
}

/// A server on `db` (kept), or why it would not start.
pub async fn api_in(db: TestDb, backend: Backend, toml: &str) -> Result<World, (TestDb, String)> {
    let url = db.url.clone();
    api_at(db, &url, backend, toml).await
}

/// A server on `db` reached through `url` (a proxy in front of it, say).
pub async fn api_at(
    db: TestDb,
    url: &str,
    backend: Backend,
    toml: &str,
) -> Result<World, (TestDb, String)> {
    api_plus(db, url, backend, toml, |b| b).await
}

/// As [`api_at`], with more set on the runtime's builder (kinds, periodic jobs).
pub async fn api_plus(
    db: TestDb,
    url: &str,
    backend: Backend,
    toml: &str,
    more: impl FnOnce(onus::Builder) -> onus::Builder,
) -> Result<World, (TestDb, String)> {
    let file = onus_server::config::parse(toml).unwrap();
    let prepared = serve::prepare_with(&file, url, true, |b| {
        let b = more(b);
        // Lapsed leases of outside workers are found within a fraction of a second.
        b.options(onus::Options {
            rescue_interval: Duration::from_millis(100),
            ..onus::Options::default()
        })
        .kind(Kind::new(ECHO).handler(|_ctx: JobContext| async { Ok(()) }))
        .kind(
            Kind::new(FAIL)
                .policy(Policy {
                    max_attempts: 1,
                    alert_on_exhaustion: true,
                    ..Policy::preset_default()
                })
                .handler(|ctx: JobContext| async move {
                    match ctx.job().args["ok_from_attempt"].as_u64() {
                        Some(n) if u64::from(ctx.attempt()) >= n => Ok(()),
                        _ => Err(JobError::retryable("the test says no")),
                    }
                }),
        )
        .periodic(Periodic::new(
            "nightly-report",
            Schedule::cron("0 3 * * *").unwrap(),
            onus::NewJob::new("report.build", json!({"period": "night"})),
        ))
    })
    .await;
    let (parts, app) = match prepared {
        Ok(p) => p,
        Err(e) => return Err((db, e.to_string())),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = Server::start(&parts, app, listener).unwrap();
    let token = parts
        .secrets
        .valid(onus_server::secrets::API_TOKEN, chrono::Utc::now())
        .await
        .unwrap()
        .remove(0)
        .value;
    Ok(World {
        base: format!("http://{}", server.addr),
        _db: db,
        parts,
        _server: server,
        token,
        http: reqwest::Client::new(),
        backend,
    })
}

impl World {
    /// Stops this server and starts another on the same database under `toml`.
    pub async fn restart(self, toml: &str) -> Result<World, String> {
        let World {
            _db,
            _server,
            backend,
            ..
        } = self;
        _server.shutdown(Duration::from_secs(5)).await.unwrap();
        api_in(_db, backend, toml).await.map_err(|(_, e)| e)
    }

    /// A call with the right token; the answer's status and JSON (`null` for an empty body).
    pub async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let bytes = body.map(|b| serde_json::to_vec(&b).unwrap());
        self.raw(method, path, Some(&self.token.clone()), bytes)
            .await
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.call("GET", path, None).await
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.call("POST", path, Some(body)).await
    }

    /// Any call: `token` as the bearer (none when `None`), `body` as sent.
    pub async fn raw(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<Vec<u8>>,
    ) -> (u16, Value) {
        let mut req = self.http.request(
            reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
            format!("{}{path}", self.base),
        );
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.header("content-type", "application/json").body(b);
        }
        let res = req.send().await.unwrap();
        let status = res.status().as_u16();
        let text = res.text().await.unwrap();
        let v = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        (status, v)
    }

    /// Everything the API could change, to compare before and after a refused call; first waits
    /// until no job is running or due, so the workers change nothing meanwhile.
    pub async fn fingerprint(&self) -> Value {
        let c = self.parts.onus.client();
        let busy = JobFilter {
            states: vec![onus::JobState::Available, onus::JobState::Running],
            kinds: self
                .parts
                .onus
                .kinds()
                .filter(|k| k.is_handled())
                .map(|k| k.name().to_string())
                .collect(),
            ..JobFilter::default()
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while c.count(&busy).await.unwrap() > 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the workers never settled"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let jobs = c.list(&JobFilter::default(), 100_000, None).await.unwrap();
        let alerts = c.alerts(100_000).await.unwrap();
        let paused = c.paused_queues().await.unwrap();
        let endpoints = self.parts.webhooks.endpoints().await.unwrap();
        // Secrets are left out of an endpoint's JSON: compared as stored.
        let secrets: Vec<Vec<String>> = endpoints.iter().map(|e| e.secrets.clone()).collect();
        let events = self
            .parts
            .webhooks
            .events(None, None, 10_000, None)
            .await
            .unwrap();
        let tokens = self
            .parts
            .secrets
            .valid(onus_server::secrets::API_TOKEN, chrono::Utc::now())
            .await
            .unwrap()
            .into_iter()
            .map(|v| v.value)
            .collect::<Vec<_>>();
        json!({"jobs": jobs, "alerts": alerts, "paused": paused, "endpoints": endpoints,
               "secrets": secrets, "events": events, "tokens": tokens})
    }

    /// Waits until `GET path` (no token) answers 200, at most 30 s.
    pub async fn wait_get_raw_ok(&self, path: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while self.raw("GET", path, None, None).await.0 != 200 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "GET {path} never answered 200"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until `done` holds for the answer of `GET path`, at most 20 s.
    pub async fn wait_get(&self, path: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let (s, v) = self.get(path).await;
            assert_eq!(s, 200, "{v}");
            if done(&v) {
                return v;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "GET {path} never got there: {v}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Waits until the job reaches a finished state (or `done` holds), at most 20 s.
    pub async fn wait_job(&self, id: i64, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let (s, j) = self.get(&format!("/api/v1/jobs/{id}")).await;
            assert_eq!(s, 200, "{j}");
            if done(&j) {
                return j;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "job {id} did not get there: {j}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}
