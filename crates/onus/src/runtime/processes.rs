//! The processes sharing a database, and what runs where: each started runtime writes its
//! presence (host, pid, queues and slots, the kinds it handles) at start and every
//! [`PRESENCE_EVERY`], and removes it when it stops gracefully; a pull worker that names itself
//! is seen by its claims. The running jobs come from the leases already written: a runtime's id is
//! the owner its leases carry. Written once on the shared database layer for both backends.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::clock::{sub, Timestamp};
use crate::job::JobId;
use crate::sql::{FromRow, Json, Row, Sql, Value};
use crate::store::Db;
use crate::StoreResult;

use super::{Client, Error, Shared};

/// How often a runtime writes that it is there.
pub const PRESENCE_EVERY: Duration = Duration::from_secs(10);
/// A process not seen for this long is shown as gone (three presences missed).
pub const LIVE_WITHIN: Duration = Duration::from_secs(30);
/// A process not seen for this long is forgotten.
pub const KEPT_FOR: Duration = Duration::from_secs(3600);
/// The running jobs listed per process (the oldest first); `running` counts them all.
pub const JOBS_SHOWN: usize = 20;

const PROCESSES: &str = "onus_processes";

static SEEN: Sql = Sql::new(
    PROCESSES,
    "INSERT INTO onus_processes (id, role, host, pid, version, detail, started_at, seen_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
     ON CONFLICT (id) DO UPDATE SET detail = excluded.detail, seen_at = excluded.seen_at
     WHERE onus_processes.role = excluded.role",
);

static GONE: Sql = Sql::new(PROCESSES, "DELETE FROM onus_processes WHERE id = $1");

static FORGET: Sql = Sql::new(PROCESSES, "DELETE FROM onus_processes WHERE seen_at < $1");

static LIST: Sql = Sql::new(
    PROCESSES,
    "SELECT id, role, host, pid, version, detail, started_at, seen_at FROM onus_processes
     ORDER BY role DESC, host, started_at, id",
);

/// How many jobs each owner runs now, read through the partial index of running jobs.
static RUNNING_BY_OWNER: Sql = Sql::new(
    "onus_live",
    "SELECT lease_owner, COUNT(*) AS n FROM onus_live WHERE state = 'running' GROUP BY lease_owner",
);

/// The oldest running jobs of one owner, at most `$2`.
static RUNNING_OF: Sql = Sql::new(
    "onus_live",
    "SELECT id, kind, queue, attempted_at FROM onus_live
     WHERE state = 'running' AND lease_owner = $1 ORDER BY attempted_at, id LIMIT $2",
);

/// What a process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum ProcessRole {
    /// A started runtime (`onus serve`, or an application embedding the job layer): it claims
    /// from its queues and runs the kinds it handles.
    Runtime,
    /// A pull worker that names itself (`worker` in its claims), seen by its claims.
    Pull,
}

/// A queue a runtime claims from, and how many of its jobs it runs at once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QueueSlots {
    /// The queue.
    pub name: String,
    /// Its slots in this process.
    pub slots: usize,
}

/// What a process said of itself when last seen.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Detail {
    #[serde(default)]
    queues: Vec<QueueSlots>,
    #[serde(default)]
    kinds: Vec<String>,
}

/// A running job, as the processes view lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunningJob {
    /// The job's id.
    pub id: JobId,
    /// Its kind.
    pub kind: String,
    /// Its queue.
    pub queue: String,
    /// When this attempt started.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime))]
    pub attempted_at: Option<Timestamp>,
}

/// A process that shares the database, and the jobs it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ProcessInfo {
    /// Its id: for a runtime, the owner its leases carry (`host:pid:random`); for a pull
    /// worker, the name it gives.
    pub id: String,
    /// What it is.
    pub role: ProcessRole,
    /// The machine it runs on.
    pub host: String,
    /// Its process id, when known.
    pub pid: Option<i64>,
    /// Its version of Onus.
    pub version: String,
    /// The queues it claims from, with its slots in each (a runtime).
    pub queues: Vec<QueueSlots>,
    /// The kinds it runs: a runtime's handlers, or what a pull worker last asked for.
    pub kinds: Vec<String>,
    /// When it started (a pull worker: when first seen).
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub started_at: Timestamp,
    /// When it last said it was there.
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub seen_at: Timestamp,
    /// Seen within the last 30 s.
    pub live: bool,
    /// Jobs it runs now (a runtime; a pull worker's leases are not attributed to it).
    pub running: u64,
    /// The oldest of them, at most 20.
    pub jobs: Vec<RunningJob>,
}

/// Every process seen within the last hour, and the running jobs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Processes {
    /// Runtimes first, then pull workers; each by host and start.
    pub processes: Vec<ProcessInfo>,
    /// Running jobs leased to pull workers (each lease has an owner of its own).
    pub pulled_running: u64,
    /// Running jobs whose owner is no process seen within the hour (a process that died: the
    /// rescuer ends them when their leases lapse).
    pub orphaned_running: u64,
}

struct Listed {
    id: String,
    role: ProcessRole,
    host: String,
    pid: Option<i64>,
    version: String,
    detail: Detail,
    started_at: Timestamp,
    seen_at: Timestamp,
}

impl FromRow for Listed {
    fn from_row(r: &Row) -> StoreResult<Self> {
        Ok(Listed {
            id: r.get("id")?,
            role: if r.get::<String>("role")? == ROLE_PULL {
                ProcessRole::Pull
            } else {
                ProcessRole::Runtime
            },
            host: r.get("host")?,
            pid: r.get("pid")?,
            version: r.get("version")?,
            detail: r.get::<Json<Detail>>("detail")?.0,
            started_at: r.get("started_at")?,
            seen_at: r.get("seen_at")?,
        })
    }
}

struct Owned {
    owner: Option<String>,
    n: i64,
}

impl FromRow for Owned {
    fn from_row(r: &Row) -> StoreResult<Self> {
        Ok(Owned {
            owner: r.get("lease_owner")?,
            n: r.get("n")?,
        })
    }
}

struct Running {
    id: JobId,
    kind: String,
    queue: String,
    attempted_at: Option<Timestamp>,
}

impl FromRow for Running {
    fn from_row(r: &Row) -> StoreResult<Self> {
        Ok(Running {
            id: r.get("id")?,
            kind: r.get("kind")?,
            queue: r.get("queue")?,
            attempted_at: r.get("attempted_at")?,
        })
    }
}

const ROLE_RUNTIME: &str = "runtime";
const ROLE_PULL: &str = "pull";

/// Whether a process last seen at `seen` counts as live at `now`.
fn live(now: Timestamp, seen: Timestamp) -> bool {
    now.signed_duration_since(seen).to_std().unwrap_or_default() < LIVE_WITHIN
}

/// The host this process runs on: `HOSTNAME`, else the kernel's name for the machine.
pub(crate) fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "onus".into())
}

/// Writes this runtime's presence at start and every [`PRESENCE_EVERY`], forgets processes not
/// seen for [`KEPT_FOR`], and removes its own row when stopped.
pub(crate) async fn presence(shared: Arc<Shared>, stop: CancellationToken) {
    let started = shared.clock.now();
    // A runtime without handlers claims from no queue (it starts no producer).
    let kinds = shared.handled_kinds();
    let detail = Detail {
        queues: if kinds.is_empty() {
            Vec::new()
        } else {
            shared
                .queues
                .iter()
                .map(|(name, slots)| QueueSlots {
                    name: name.clone(),
                    slots: *slots,
                })
                .collect()
        },
        kinds,
    };
    let detail = detail_value(&detail);
    let db = Db::new(shared.store.clone());
    let host = host_name();
    loop {
        let now = shared.clock.now();
        let params = vec![
            shared.owner.clone().into(),
            ROLE_RUNTIME.into(),
            host.clone().into(),
            i64::from(std::process::id()).into(),
            env!("CARGO_PKG_VERSION").into(),
            detail.clone(),
            started.into(),
            now.into(),
        ];
        // The database's outages are logged by the heartbeat and the producers; a presence not
        // written shows as a process not seen lately, which is what it is.
        if let Err(e) = db.execute(&SEEN, params).await {
            tracing::debug!(error = %e, "presence not written");
        }
        let _ = db.execute(&FORGET, vec![sub(now, KEPT_FOR).into()]).await;
        tokio::select! {
            _ = tokio::time::sleep(PRESENCE_EVERY) => {}
            _ = stop.cancelled() => break,
        }
    }
    let _ = tokio::time::timeout(
        Duration::from_secs(1),
        db.execute(&GONE, vec![shared.owner.clone().into()]),
    )
    .await;
}

/// A detail as written: JSON (an object, `{}` should it ever fail to encode).
fn detail_value(d: &Detail) -> Value {
    Value::json(d).unwrap_or_else(|_| Value::Json(serde_json::json!({})))
}

/// When each named pull worker was last written as seen, so that its claims write at most one
/// presence per half [`PRESENCE_EVERY`].
#[derive(Debug, Default)]
pub(crate) struct PullSeen(std::sync::Mutex<HashMap<String, Instant>>);

impl PullSeen {
    /// Whether `name` is due a write now (and marks it written).
    fn due(&self, name: &str) -> bool {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if m.get(name)
            .is_some_and(|at| now.duration_since(*at) < PRESENCE_EVERY / 2)
        {
            return false;
        }
        if m.len() > 10_000 {
            m.retain(|_, at| now.duration_since(*at) < KEPT_FOR);
        }
        m.insert(name.to_string(), now);
        true
    }
}

/// The longest name a pull worker may give.
pub const MAX_WORKER_NAME: usize = 200;

impl Client {
    /// Every process seen within the last hour, with the jobs each runs (see [`Processes`]): the
    /// running jobs counted per owner, and at most [`JOBS_SHOWN`] of each runtime's read.
    pub async fn processes(&self) -> Result<Processes, Error> {
        let db = self.db();
        let listed = self.presences().await?;
        let owned: Vec<Owned> = db.read_rows(&RUNNING_BY_OWNER, Vec::new()).await?;
        let now = self.now();
        let mut by_owner: BTreeMap<String, u64> = BTreeMap::new();
        let (mut pulled, mut orphaned) = (0u64, 0u64);
        for o in owned {
            let n = o.n.max(0) as u64;
            match o.owner {
                Some(w) if w.starts_with(super::pull::OWNER_PREFIX) => pulled += n,
                Some(w) => *by_owner.entry(w).or_default() += n,
                None => orphaned += n,
            }
        }
        let mut processes = Vec::with_capacity(listed.len());
        for l in listed {
            let running = by_owner.remove(&l.id).unwrap_or(0);
            let jobs: Vec<Running> = if running > 0 {
                db.read_rows(
                    &RUNNING_OF,
                    vec![l.id.clone().into(), (JOBS_SHOWN as i64).into()],
                )
                .await?
            } else {
                Vec::new()
            };
            processes.push(ProcessInfo {
                live: live(now, l.seen_at),
                running,
                jobs: jobs
                    .into_iter()
                    .map(|r| RunningJob {
                        id: r.id,
                        kind: r.kind,
                        queue: r.queue,
                        attempted_at: r.attempted_at,
                    })
                    .collect(),
                id: l.id,
                role: l.role,
                host: l.host,
                pid: l.pid,
                version: l.version,
                queues: l.detail.queues,
                kinds: l.detail.kinds,
                started_at: l.started_at,
                seen_at: l.seen_at,
            });
        }
        orphaned += by_owner.values().sum::<u64>();
        Ok(Processes {
            processes,
            pulled_running: pulled,
            orphaned_running: orphaned,
        })
    }

    /// Whether a live runtime runs `kind` from `queue` (read from the presences alone).
    pub async fn runs_somewhere(&self, kind: &str, queue: &str) -> Result<bool, Error> {
        let now = self.now();
        Ok(self.presences().await?.iter().any(|p| {
            p.role == ProcessRole::Runtime
                && live(now, p.seen_at)
                && p.detail.kinds.iter().any(|k| k == kind)
                && p.detail.queues.iter().any(|q| q.name == queue)
        }))
    }

    async fn presences(&self) -> Result<Vec<Listed>, Error> {
        Ok(self.db().read_rows(&LIST, Vec::new()).await?)
    }

    /// Records that the pull worker `name` claimed `kinds` now (at most one write per worker per
    /// 5 s; the first claim of a name writes at once).
    pub async fn pull_worker_seen(&self, name: &str, kinds: &[String]) -> Result<(), Error> {
        if name.is_empty() || name.len() > MAX_WORKER_NAME || name.chars().any(char::is_control) {
            return Err(Error::Invalid(format!(
                "worker: give a name of 1 to {MAX_WORKER_NAME} printable characters (host and process, like \"billing-7f3c:4121\")"
            )));
        }
        if !self.shared.pull_seen.due(name) {
            return Ok(());
        }
        let now = self.now();
        let mut kinds = kinds.to_vec();
        kinds.sort();
        kinds.dedup();
        let detail = Detail {
            queues: Vec::new(),
            kinds,
        };
        let params = vec![
            name.into(),
            ROLE_PULL.into(),
            "-".into(),
            None::<i64>.into(),
            "-".into(),
            detail_value(&detail),
            now.into(),
            now.into(),
        ];
        self.db().execute(&SEEN, params).await?;
        Ok(())
    }
}
