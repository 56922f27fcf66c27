//! The world a soak builds: the chaos sink, the deployments, the server processes, the stores.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use onus::{Job, JobFilter, JobState, Store};
use onus_testkit::chaos::{Behaviour, Chaos, Mix};
use onus_testkit::sink::HttpSink;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use super::{Locked, PULL, PULL_LEASE, PUSH, TOKEN};

/// The chaos sink's script: endpoints never answer 410 except the `/gone/` ones (a 410 disables
/// an endpoint, and the run needs endpoints), everything else draws from the whole mix.
pub(super) fn chaos(seed: u64) -> Chaos {
    let hooks = |gone: u32| {
        Mix::new(&[
            (Behaviour::Ok, 60),
            (Behaviour::ServerError, 10),
            (Behaviour::RequestTimeout, 3),
            (Behaviour::TooMany, 3),
            (Behaviour::TooManyAfter(1), 5),
            (Behaviour::UnavailableAfter(1), 3),
            (Behaviour::Gone, gone),
            (Behaviour::Hang(Duration::from_secs(3600)), 3),
            (Behaviour::Reset, 5),
            (Behaviour::Slow(Duration::from_millis(300)), 8),
        ])
    };
    Chaos::new(seed)
        .rule("/hook/", hooks(0))
        .rule("/gone/", hooks(2))
        .otherwise(Mix::default())
}

/// One database and the endpoints on it.
pub(super) struct Deployment {
    pub(super) name: &'static str,
    url: String,
    pub(super) tenants: Vec<&'static str>,
    per_tenant: usize,
    /// Path to (tenant, secret).
    endpoints: Mutex<BTreeMap<String, (String, String)>>,
    /// Endpoint id to path.
    pub(super) ids: Mutex<HashMap<String, String>>,
}

impl Deployment {
    pub(super) fn new(
        name: &'static str,
        url: &str,
        tenants: &[&'static str],
        per_tenant: usize,
    ) -> Self {
        Deployment {
            name,
            url: url.to_string(),
            tenants: tenants.to_vec(),
            per_tenant,
            endpoints: Mutex::default(),
            ids: Mutex::default(),
        }
    }

    pub(super) fn endpoints(&self) -> BTreeMap<String, (String, String)> {
        self.endpoints.locked().clone()
    }
}

pub(super) fn config(d: &Deployment, sink: &HttpSink, skewed: bool) -> String {
    let policy = |timeout: &str| {
        format!("max_attempts = 4\nbackoff = {{ schedule = [\"1s\"] }}\njitter = 0.1\ntimeout = \"{timeout}\"\nalert_on_exhaustion = false\n")
    };
    let mut c = format!(
        "database_url = \"{url}\"\napi_token = \"{TOKEN}\"\nlease_ttl = \"3s\"\n",
        url = d.url
    );
    if skewed {
        c.push_str("clock_offset = \"30s\"\n");
    }
    c.push_str(&format!(
        "[queues]\ndefault = 8\n\
         [webhooks]\ntimeout = \"1s\"\ncooldown = \"1s\"\nallow_networks = [\"127.0.0.1/32\"]\n\
         [http]\ntimeout = \"1s\"\nallow_networks = [\"127.0.0.1/32\"]\n\
         [kinds.\"webhook.fanout\".policy]\n{deliver}\
         [kinds.\"webhook.deliver\".policy]\n{deliver}\
         [kinds.\"http.request\".policy]\n{http}\
         [kinds.\"{PUSH}\"]\nurl = \"{push}\"\ntimeout = \"1s\"\n\
         [kinds.\"{PUSH}\".policy]\n{push_policy}\
         [kinds.\"{PULL}\"]\n\
         [kinds.\"{PULL}\".policy]\n{pull}",
        deliver = policy("5s"),
        http = policy("5s"),
        push = sink.url(&format!("/push/{}", d.name)),
        push_policy = policy("5s"),
        pull = policy(&format!("{}s", PULL_LEASE.as_secs())),
    ));
    c
}

/// One server process (its current incarnation).
pub(super) struct Proc {
    pub(super) dep: usize,
    pub(super) name: String,
    pub(super) config: PathBuf,
    pub(super) log: PathBuf,
    pub(super) skewed: bool,
    port: u16,
    base: Option<String>,
    child: Option<tokio::process::Child>,
}

impl Proc {
    pub(super) fn new(dir: &Path, dep: usize, name: &str, skewed: bool) -> Proc {
        Proc {
            dep,
            name: name.to_string(),
            config: dir.join(format!("{name}.toml")),
            log: dir.join(format!("{name}.log")),
            skewed,
            port: 0,
            base: None,
            child: None,
        }
    }
}

/// Counts of what happened, by name (a tally sheet: one line per name, each mark adds one).
#[derive(Default)]
pub(super) struct Tally(Mutex<BTreeMap<String, u64>>);

impl Tally {
    pub(super) fn add(&self, k: &str, n: u64) {
        *self.0.locked().entry(k.to_string()).or_default() += n;
    }
    pub(super) fn get(&self, k: &str) -> u64 {
        self.0.locked().get(k).copied().unwrap_or(0)
    }
}

/// The driver's own record of the pull jobs it holds.
#[derive(Default)]
pub(super) struct PullBook {
    /// Job (deployment, id) to when it was claimed and whether it was answered since.
    pub(super) held: HashMap<(usize, i64), (Instant, bool)>,
    /// Jobs handed out while an earlier claim of them was still leased and unanswered.
    pub(super) twice: Vec<String>,
    pub(super) claims: u64,
}

/// What the soak runs and records: its deployments and processes, the stop signals, the counts
/// and the driver's own books.
pub(super) struct World {
    pub(super) http: reqwest::Client,
    pub(super) onus: PathBuf,
    pub(super) deps: Vec<Deployment>,
    pub(super) procs: Vec<Mutex<Proc>>,
    pub(super) stop_load: AtomicBool,
    pub(super) stop_all: AtomicBool,
    pub(super) tally: Tally,
    pub(super) pull: Mutex<PullBook>,
    /// Jobs whose insert was answered with their id: (deployment, id).
    pub(super) acked_jobs: Mutex<Vec<(usize, i64)>>,
    /// Events whose publication was answered: (deployment, id).
    pub(super) acked_events: Mutex<Vec<(usize, String)>>,
    /// Every event id published, answered or not.
    pub(super) sent_events: Mutex<HashSet<String>>,
    pub(super) seq: AtomicU64,
}

impl World {
    pub(super) fn base(&self, i: usize) -> Option<String> {
        self.procs[i].locked().base.clone()
    }

    /// A process of deployment `d` that is up, at random (`skewed` too or not).
    pub(super) fn pick(&self, d: usize, rng: &mut StdRng) -> Option<String> {
        let up: Vec<String> = self
            .procs
            .iter()
            .filter_map(|p| {
                let p = p.locked();
                (p.dep == d).then(|| p.base.clone()).flatten()
            })
            .collect();
        (!up.is_empty()).then(|| up[rng.gen_range(0..up.len())].clone())
    }

    /// Starts process `i` and waits until it answers `/healthz`. A process that exits at start
    /// (its database is restarting, or its port was taken meanwhile) is started again, for up to
    /// a minute in all.
    pub(super) async fn start(&self, i: usize) -> Result<(), String> {
        let until = Instant::now() + Duration::from_secs(60);
        while Instant::now() < until {
            let (config, log, name, mut port) = {
                let p = self.procs[i].locked();
                (p.config.clone(), p.log.clone(), p.name.clone(), p.port)
            };
            if port == 0 {
                port = free_port()?;
            }
            let log_file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .map_err(|e| e.to_string())?;
            let mut child = tokio::process::Command::new(&self.onus)
                .arg("serve")
                .env("ONUS_CONFIG", &config)
                .env("ONUS_LISTEN", format!("127.0.0.1:{port}"))
                .env("ONUS_LOG", "warn")
                .env_remove("ONUS_DATABASE_URL")
                .env_remove("ONUS_API_TOKEN")
                .env_remove("ONUS_ENCRYPTION_KEY")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log_file)
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| format!("cannot start {}: {e}", self.onus.display()))?;
            let logged = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
            let base = format!("http://127.0.0.1:{port}");
            let mut exited = false;
            while Instant::now() < until {
                if let Ok(Some(_)) = child.try_wait() {
                    exited = true;
                    break;
                }
                let ok = self
                    .http
                    .get(format!("{base}/healthz"))
                    .timeout(Duration::from_secs(2))
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success());
                if ok {
                    let mut p = self.procs[i].locked();
                    p.port = port;
                    p.base = Some(base);
                    p.child = Some(child);
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let _ = child.start_kill();
            let _ = child.wait().await;
            if !exited {
                return Err(format!(
                    "{name} did not become healthy within 60 s; see {}",
                    log.display()
                ));
            }
            let said = std::fs::read(&log)
                .map(|b| String::from_utf8_lossy(&b[(logged as usize).min(b.len())..]).into_owned())
                .unwrap_or_default();
            if said.contains("cannot listen") {
                self.procs[i].locked().port = 0; // taken meanwhile: another one
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let log = self.procs[i].locked().log.clone();
        Err(format!(
            "process {i} did not stay up within 60 s; see {}",
            log.display()
        ))
    }

    /// SIGKILLs process `i` (if up).
    pub(super) async fn kill(&self, i: usize) {
        let child = {
            let mut p = self.procs[i].locked();
            p.base = None;
            p.child.take()
        };
        if let Some(mut c) = child {
            let _ = c.start_kill();
            let _ = c.wait().await;
        }
    }

    pub(super) async fn post(
        &self,
        base: &str,
        path: &str,
        body: &Value,
    ) -> Result<(u16, Value), String> {
        crate::post_api(&self.http, base, TOKEN, path, body).await
    }

    pub(super) async fn make_endpoints(&self, d: usize, sink: &HttpSink) -> Result<(), String> {
        let dep = &self.deps[d];
        let base = self
            .pick(d, &mut StdRng::seed_from_u64(0))
            .ok_or("no process up")?;
        for t in &dep.tenants {
            for n in 0..dep.per_tenant {
                let root = if n == 0 && *t == dep.tenants[0] {
                    "gone"
                } else {
                    "hook"
                };
                let path = format!("/{root}/{}/{t}/{n}", dep.name);
                let (status, v) = self
                    .post(
                        &base,
                        "/endpoints",
                        &json!({"url": sink.url(&path), "tenant": t}),
                    )
                    .await?;
                if status != 201 {
                    return Err(format!("POST /endpoints: {status} {v}"));
                }
                let secret = v["secret"].as_str().unwrap_or_default().to_string();
                let id = v["id"].as_str().unwrap_or_default().to_string();
                dep.ids.locked().insert(id, path.clone());
                dep.endpoints.locked().insert(path, (t.to_string(), secret));
            }
        }
        Ok(())
    }
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| e.to_string())
}

/// Every state a job has not ended in.
const OPEN: [JobState; 5] = [
    JobState::Available,
    JobState::Scheduled,
    JobState::Retryable,
    JobState::Snoozed,
    JobState::Running,
];

/// How many jobs have not ended (0 when the database cannot be read counts as not known: 1).
pub(super) async fn unfinished(store: &dyn Store) -> Result<usize, String> {
    let f = JobFilter {
        states: OPEN.to_vec(),
        ..Default::default()
    };
    Ok(match store.count(&f).await {
        Ok(n) => usize::try_from(n).unwrap_or(usize::MAX),
        Err(_) => 1,
    })
}

pub(super) async fn all_jobs(store: &dyn Store) -> Result<Vec<Job>, String> {
    let mut out = Vec::new();
    let mut before = None;
    loop {
        let page = store
            .list(&JobFilter::default(), 1000, before)
            .await
            .map_err(|e| e.to_string())?;
        let Some(last) = page.last() else { break };
        before = Some(last.id);
        out.extend(page);
    }
    Ok(out)
}
