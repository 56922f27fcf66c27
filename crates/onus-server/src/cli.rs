//! Command-line parsing and the `jobs` and `policy` commands.

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use onus::{Job, JobFilter, JobId, JobState, Policy};

use axum::extract::{Path, State};

use crate::api::{App, Body};
use crate::config::{self, FileConfig};
use crate::Error;

/// Onus: a durable job layer where retry has exactly one owner.
#[derive(Debug, Parser)]
#[command(
    name = "onus",
    version,
    about = "Onus: a durable job layer where retry has exactly one owner.",
    long_about = None,
    propagate_version = true
)]
pub struct Cli {
    /// Configuration file (default: onus.toml in the working directory, if present).
    #[arg(
        long,
        env = "ONUS_CONFIG",
        hide_env_values = true,
        global = true,
        value_name = "PATH"
    )]
    pub config: Option<PathBuf>,
    /// Database URL: sqlite://path/to/onus.db (default sqlite://onus.db) or postgres://...
    #[arg(
        long,
        env = "ONUS_DATABASE_URL",
        hide_env_values = true,
        global = true,
        value_name = "URL"
    )]
    pub database_url: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the workers and the HTTP server (the API under /api/v1, /healthz, /metrics) until
    /// SIGINT or SIGTERM.
    Serve {
        /// Address to listen on (default 127.0.0.1:8080).
        #[arg(long, env = "ONUS_LISTEN", value_name = "ADDR")]
        listen: Option<String>,
        /// Apply no migration at start; refuse to start if one is pending (run `onus migrate`
        /// first).
        #[arg(long)]
        no_migrate: bool,
    },
    /// Apply pending database migrations (every line: jobs, server, webhooks), or list where each
    /// stands.
    Migrate {
        /// List each line's version and pending migrations instead of applying them.
        #[arg(long)]
        status: bool,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// List, show, insert, retry, cancel and delete jobs.
    #[command(subcommand)]
    Jobs(JobsCommand),
    /// List queues with their figures; pause and resume them in every process.
    #[command(subcommand)]
    Queues(QueuesCommand),
    /// Show retry policies and the schedule each implies.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Periodic jobs: list them; pause, resume or run a schedule.
    #[command(subcommand)]
    Periodic(PeriodicCommand),
    /// Paused lease keys: list them; pause or resume a key (every waiting job holding it is held).
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Print or rotate the API token kept in the database.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Every `onus serve` process and named pull worker seen in the last hour: its queues and
    /// slots, running jobs and last heartbeat.
    Processes {
        /// Print JSON (the answer of `GET /api/v1/processes`).
        #[arg(long)]
        json: bool,
    },
    /// Make encryption keys and re-encrypt webhook secrets under a new one.
    #[command(subcommand)]
    Encryption(EncryptionCommand),
    /// End the tasks panel's sessions.
    #[command(subcommand)]
    Sessions(SessionsCommand),
}

#[derive(Debug, Subcommand)]
pub enum SessionsCommand {
    /// End every panel session in every server sharing this database: each browser must log in
    /// again (rotating the API token or changing the panel password does this too).
    Revoke,
}

#[derive(Debug, Subcommand)]
pub enum EncryptionCommand {
    /// Print a new random encryption key (32 bytes, base64) for ONUS_ENCRYPTION_KEY or
    /// encryption_key_file.
    Generate,
    /// Re-encrypt every webhook secret under a new key (from the configured key, or from
    /// plaintext when none is configured yet); then configure the new key.
    Rotate {
        /// A file holding the new key (else ONUS_NEW_ENCRYPTION_KEY).
        #[arg(long, value_name = "PATH")]
        new_key_file: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// List the paused lease keys: until when, why, and how many waiting jobs each holds.
    List {
        /// Print JSON, one key per line.
        #[arg(long)]
        json: bool,
    },
    /// Pause a lease key until a time: its waiting jobs are held (no attempt spent, nothing
    /// written to their history); running ones finish. Replaces a pause in force.
    #[command(group(clap::ArgGroup::new("when").required(true).args(["for_", "until"])))]
    Pause {
        /// The lease key.
        key: String,
        /// For how long ("10m", "2h"; at least 1s).
        #[arg(long = "for", value_name = "DURATION", value_parser = pause_arg)]
        for_: Option<std::time::Duration>,
        /// Until this instant (RFC 3339, like 2026-12-01T12:00:00Z).
        #[arg(long, value_name = "TIME", value_parser = instant_arg)]
        until: Option<onus::Timestamp>,
        /// Why (shown with the pause).
        #[arg(long)]
        reason: Option<String>,
    },
    /// End a key's pause now: the jobs it held are due at once.
    Resume {
        /// The lease key.
        key: String,
    },
    /// Moved to `onus encryption generate`.
    #[command(hide = true)]
    Generate,
    /// Moved to `onus encryption rotate`.
    #[command(hide = true)]
    RotateEncryption {
        /// Moved with the command.
        #[arg(long, value_name = "PATH")]
        new_key_file: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
pub enum QueuesCommand {
    /// List every queue: jobs by state, how many wait, how long the oldest has, paused or not.
    List {
        /// Print JSON, one queue per line.
        #[arg(long)]
        json: bool,
    },
    /// Pause a queue in every process: nothing more is claimed from it; running jobs finish.
    Pause {
        /// The queue.
        name: String,
    },
    /// Resume a paused queue.
    Resume {
        /// The queue.
        name: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Print the API token every server sharing this database accepts.
    Show,
    /// Replace the API token; the previous one stays valid for the grace period.
    Rotate {
        /// How long the previous token stays valid ("1h", "10m"; "0s" refuses it at once).
        #[arg(long, default_value = "1h", value_name = "DURATION")]
        grace: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum PeriodicCommand {
    /// List every periodic job the database knows.
    List {
        /// Print JSON, one schedule per line.
        #[arg(long)]
        json: bool,
    },
    /// Pause a schedule in every process: it enqueues nothing until resumed.
    Pause {
        /// The schedule's name.
        name: String,
    },
    /// Resume a paused schedule from its next period (missed periods are not run).
    Resume {
        /// The schedule's name.
        name: String,
    },
    /// Enqueue a schedule's job now, once (paused or not).
    Run {
        /// The schedule's name.
        name: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// List jobs, newest first.
    List {
        #[command(flatten)]
        filter: FilterArgs,
        /// Most jobs to show (1 to 1000).
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u16).range(1..=1000))]
        limit: u16,
        /// Show jobs with ids below this one (the next page).
        #[arg(long)]
        before: Option<JobId>,
        /// Print JSON, one job per line.
        #[arg(long)]
        json: bool,
    },
    /// Show one job with its whole history.
    Show {
        /// The job's id.
        id: JobId,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Insert a job, checked as `POST /api/v1/jobs` checks one.
    Insert(InsertArgs),
    /// Run discarded, cancelled or retryable jobs again now (one more attempt each): by id, or
    /// every job matching a filter.
    Retry(ActionArgs),
    /// Cancel jobs: waiting ones at once, running ones by a signal to their handler.
    Cancel(ActionArgs),
    /// Delete finished jobs (completed, discarded, cancelled): by id, or every finished job
    /// matching a filter.
    Delete(ActionArgs),
}

#[derive(Debug, Args)]
pub struct InsertArgs {
    /// The kind (`GET /api/v1/kinds` lists them).
    pub kind: String,
    /// The handler's input, JSON (default {}).
    #[arg(long, value_name = "JSON", value_parser = json_arg)]
    pub args: Option<serde_json::Value>,
    /// The queue (default: the kind's).
    #[arg(long)]
    pub queue: Option<String>,
    /// Lower runs first among jobs due at once.
    #[arg(long, allow_negative_numbers = true)]
    pub priority: Option<i16>,
    /// When to run (RFC 3339, like 2026-12-01T12:00:00Z; default now).
    #[arg(long, value_name = "TIME", value_parser = instant_arg)]
    pub run_at: Option<onus::Timestamp>,
    /// While an unfinished job of the kind holds this key, inserting answers that job instead.
    #[arg(long)]
    pub unique_key: Option<String>,
    /// Labels to find the job by (repeat or separate with commas).
    #[arg(long, value_delimiter = ',')]
    pub tag: Vec<String>,
    /// The lease key (default: the kind's lease_key template, if it has one).
    #[arg(long)]
    pub lease_key: Option<String>,
    /// Print the job as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct FilterArgs {
    /// Only jobs in these states (repeat or separate with commas).
    #[arg(long, value_delimiter = ',')]
    pub state: Vec<JobState>,
    /// Only jobs of these kinds.
    #[arg(long, value_delimiter = ',')]
    pub kind: Vec<String>,
    /// Only jobs in these queues.
    #[arg(long, value_delimiter = ',')]
    pub queue: Vec<String>,
    /// Only jobs carrying one of these tags.
    #[arg(long, value_delimiter = ',')]
    pub tag: Vec<String>,
    /// Only jobs whose args hold this text (ASCII letters without case, spaces ignored).
    #[arg(long, value_name = "TEXT")]
    pub q: Option<String>,
    /// Only jobs created at or after this instant (RFC 3339).
    #[arg(long, value_name = "TIME", value_parser = instant_arg)]
    pub created_after: Option<onus::Timestamp>,
    /// Only jobs created before this instant (RFC 3339).
    #[arg(long, value_name = "TIME", value_parser = instant_arg)]
    pub created_before: Option<onus::Timestamp>,
}

#[derive(Debug, Args)]
pub struct ActionArgs {
    /// Job ids.
    pub ids: Vec<JobId>,
    #[command(flatten)]
    pub filter: FilterArgs,
    /// Act on every job (no filter at all).
    #[arg(long)]
    pub all: bool,
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Print a kind's (or a preset's) policy and the timeline it implies.
    Show {
        /// A kind named in the configuration, or a preset: default, mail, webhook, periodic.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

impl FilterArgs {
    fn to_filter(&self, ids: Vec<JobId>) -> JobFilter {
        JobFilter {
            ids,
            states: self.state.clone(),
            kinds: self.kind.clone(),
            queues: self.queue.clone(),
            tags: self.tag.clone(),
            q: self.q.clone().filter(|q| !q.is_empty()),
            created_after: self.created_after,
            created_before: self.created_before,
            ..JobFilter::default()
        }
    }

    fn is_empty(&self) -> bool {
        self.to_filter(Vec::new()) == JobFilter::default()
    }
}

/// An RFC 3339 instant given as a flag.
fn instant_arg(v: &str) -> Result<onus::Timestamp, String> {
    chrono::DateTime::parse_from_rfc3339(v)
        .map(|t| t.with_timezone(&chrono::Utc))
        .map_err(|e| format!("{e}; write an RFC 3339 instant like 2026-12-01T12:00:00Z"))
}

/// A duration given as a flag ("10m", "2h").
fn duration_arg(v: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(v).map_err(|e| format!("{e}; write it like 10m, 2h or 1d"))
}

/// A pause's length given as a flag: at least [`onus::runtime::MIN_PAUSE`].
fn pause_arg(v: &str) -> Result<std::time::Duration, String> {
    let d = duration_arg(v)?;
    if d < onus::runtime::MIN_PAUSE {
        return Err(format!(
            "a pause lasts at least {}s (to end a pause, run `onus keys resume`)",
            onus::runtime::MIN_PAUSE.as_secs()
        ));
    }
    Ok(d)
}

/// JSON given as a flag.
fn json_arg(v: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(v).map_err(|e| {
        format!("not JSON ({e}); quote it for the shell, like '{{\"to\": \"a@example.com\"}}'")
    })
}

/// Refuses a SQLite URL whose file does not exist, naming the file and how to point elsewhere.
fn database_exists(url: &str) -> Result<(), Error> {
    if !url.starts_with("sqlite:") {
        return Ok(());
    }
    let path = onus::sqlite::SqliteOptions::from_url(url)?.path;
    // A missing directory is for the store to name; a missing file in one that exists is ours.
    let dir_missing = path
        .parent()
        .is_some_and(|d| !d.as_os_str().is_empty() && !d.exists());
    if path.exists() || dir_missing {
        return Ok(());
    }
    let shown = std::fs::canonicalize(".")
        .map(|d| d.join(&path))
        .unwrap_or_else(|_| path.clone());
    Err(Error::Invalid(format!(
        "no database at {} (from {url}); run this where `onus serve` keeps its database, or point to it with --database-url (ONUS_DATABASE_URL), e.g. --database-url sqlite:///path/to/onus.db; `onus serve` or `onus migrate` makes a new one",
        shown.display()
    )))
}

/// Runs a parsed command line.
pub async fn run(cli: Cli) -> Result<(), Error> {
    let (file, path) = config::load(cli.config.as_deref())?;
    let url = cli
        .database_url
        .clone()
        .or_else(|| file.database_url.clone())
        .unwrap_or_else(|| config::DEFAULT_DATABASE_URL.to_string());
    // Only `serve` and `migrate` make a database; every other command that reads or changes
    // one refuses a SQLite file that is not there rather than create an empty one.
    let needs_database = !matches!(
        cli.command,
        Command::Serve { .. }
            | Command::Migrate { status: false, .. }
            | Command::Policy(_)
            | Command::Encryption(EncryptionCommand::Generate)
            | Command::Keys(KeysCommand::Generate | KeysCommand::RotateEncryption { .. })
    );
    if needs_database {
        database_exists(&url)?;
    }
    match cli.command {
        Command::Serve { listen, no_migrate } => {
            let listen = listen
                .or_else(|| file.listen.clone())
                .unwrap_or_else(|| config::DEFAULT_LISTEN.into());
            crate::serve::serve(file, path, url, listen, !no_migrate).await
        }
        Command::Migrate { status, json } => migrate(&file, &url, status, json).await,
        Command::Policy(PolicyCommand::Show { name, json }) => {
            let (policy, origin) = policy_named(&file, &name)?;
            if json {
                let v = serde_json::json!({
                    "name": name, "origin": origin, "policy": policy, "timeline": policy.timeline(),
                    "span_seconds": policy.timeline().span().as_secs_f64(),
                });
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print!("{}", describe_policy(&name, &origin, &policy));
            }
            Ok(())
        }
        Command::Periodic(cmd) => periodic(&app(&file, &url).await?, cmd).await,
        Command::Queues(cmd) => queues(&app(&file, &url).await?, cmd).await,
        Command::Keys(KeysCommand::Generate) => {
            Err("encryption keys moved: run `onus encryption generate`".into())
        }
        Command::Keys(KeysCommand::RotateEncryption { .. }) => {
            Err("encryption keys moved: run `onus encryption rotate --new-key-file PATH`".into())
        }
        Command::Keys(cmd) => keys(&app(&file, &url).await?, cmd).await,
        Command::Token(cmd) => token(&file, &url, cmd).await,
        Command::Sessions(SessionsCommand::Revoke) => {
            let parts = migrated_runtime(&file, &url).await?;
            crate::panel::Sessions::new(parts.secrets.clone())
                .revoke_all()
                .await?;
            eprintln!("every panel session has ended; log in again");
            Ok(())
        }
        Command::Encryption(EncryptionCommand::Generate) => {
            println!("{}", onus_webhooks::crypto::Key::generate());
            Ok(())
        }
        Command::Encryption(EncryptionCommand::Rotate { new_key_file }) => {
            rotate_encryption(&file, &url, new_key_file).await
        }
        Command::Jobs(cmd) => jobs(&app(&file, &url).await?, cmd).await,
        Command::Processes { json } => {
            let app = app(&file, &url).await?;
            let p = crate::api::processes::list(State(app)).await?.0;
            if json {
                println!("{}", serde_json::to_string_pretty(&p)?);
            } else {
                print!("{}", process_table(&p));
            }
            Ok(())
        }
    }
}

/// The API's handlers' state for a command: what the server would check and answer, run here
/// (the same kinds, queues and checks), on a database whose migrations are all applied.
async fn app(file: &FileConfig, url: &str) -> Result<App, Error> {
    let parts = migrated_runtime(file, url).await?;
    let auth = crate::api::auth::Auth::new(None, parts.secrets.clone());
    Ok(crate::serve::state(&parts, file, auth))
}

/// The runtime the configuration describes, on a database whose migrations are all applied (a
/// command that writes refuses a database that needs `onus migrate` first).
async fn migrated_runtime(file: &FileConfig, url: &str) -> Result<crate::serve::Parts, Error> {
    let store = onus::open_with(url, false).await?;
    let parts = crate::serve::runtime(store, file)?;
    parts.onus.check_migrations().await?;
    Ok(parts)
}

/// `onus encryption rotate`.
async fn rotate_encryption(
    file: &FileConfig,
    url: &str,
    new_key_file: Option<PathBuf>,
) -> Result<(), Error> {
    let text = match &new_key_file {
        Some(p) => std::fs::read_to_string(p)
            .map_err(|e| format!("--new-key-file {}: cannot read it ({e})", p.display()))?,
        None => std::env::var("ONUS_NEW_ENCRYPTION_KEY").map_err(|_| {
            "give the new key: --new-key-file PATH or ONUS_NEW_ENCRYPTION_KEY (`onus encryption generate` makes one)".to_string()
        })?,
    };
    let new = onus_webhooks::crypto::Key::from_base64(&text)
        .map_err(|e| Error::during("the new key", e))?;
    let parts = migrated_runtime(file, url).await?;
    let (n, m) = parts.reencrypt(&new).await?;
    println!(
        "re-encrypted the secrets of {n} endpoint(s) and {m} server secret(s) under the new key; configure it now (ONUS_ENCRYPTION_KEY or encryption_key_file) and restart every server"
    );
    Ok(())
}

/// `onus token show|rotate`.
async fn token(file: &FileConfig, url: &str, cmd: TokenCommand) -> Result<(), Error> {
    if let Some(t) = crate::serve::configured_token(file) {
        return match cmd {
            TokenCommand::Show => {
                eprintln!("(the token is configured by ONUS_API_TOKEN or api_token in onus.toml)");
                println!("{t}");
                Ok(())
            }
            TokenCommand::Rotate { .. } => Err(
                "the API token is configured (ONUS_API_TOKEN or api_token in onus.toml); change it there, or remove it to have the database keep one".into(),
            ),
        };
    }
    let parts = migrated_runtime(file, url).await?;
    let now = chrono::Utc::now();
    match cmd {
        TokenCommand::Show => {
            let valid = parts.secrets.valid(crate::secrets::API_TOKEN, now).await?;
            let Some(current) = valid.iter().find(|v| v.expires_at.is_none()) else {
                return Err("no API token yet: `onus serve` generates one on its first start (or run `onus token rotate`)".into());
            };
            for old in valid.iter().filter(|v| v.expires_at.is_some()) {
                if let Some(t) = old.expires_at {
                    eprintln!(
                        "(the previous token, version {}, is accepted until {})",
                        old.version,
                        t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                    );
                }
            }
            println!("{}", current.value);
            Ok(())
        }
        TokenCommand::Rotate { grace } => {
            let grace = humantime::parse_duration(&grace).map_err(|e| {
                format!(
                    "--grace {grace:?} is not a duration ({e}); write it like \"1h\" or \"10m\""
                )
            })?;
            let v = parts
                .secrets
                .rotate(
                    crate::secrets::API_TOKEN,
                    crate::secrets::generate(crate::api::auth::TOKEN_PREFIX),
                    now,
                    grace,
                )
                .await?;
            eprintln!(
                "rotated: the previous token is accepted for {} more; every server sharing this database accepts the new one",
                onus::policy::human(grace)
            );
            println!("{}", v.value);
            Ok(())
        }
    }
}

/// `onus migrate [--status]`.
async fn migrate(file: &FileConfig, url: &str, status: bool, json: bool) -> Result<(), Error> {
    let store = onus::open_with(url, false).await?;
    // The lines of the job layer and of every component the server runs.
    let onus = crate::serve::runtime(store.clone(), file)?.onus;
    let lines = onus.migrations();
    if status {
        let st = store.migrations(&lines).await?;
        if json {
            for l in &st {
                println!("{}", serde_json::to_string(l)?);
            }
        } else {
            print!("{}", migration_table(&st));
        }
        return Ok(());
    }
    let applied = onus.migrate().await?;
    if json {
        for a in &applied {
            println!("{}", serde_json::to_string(a)?);
        }
    } else if applied.is_empty() {
        println!("nothing to apply: every line is current");
    } else {
        for a in &applied {
            println!("applied {} {} ({})", a.line, a.version, a.name);
        }
    }
    Ok(())
}

fn migration_table(st: &[onus::sql::LineStatus]) -> String {
    let mut s = format!(
        "{:<10} {:>7} {:>6}  {:<25} {}\n",
        "LINE", "VERSION", "LATEST", "APPLIED AT", "PENDING"
    );
    for l in st {
        let at = l
            .applied_at
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            .unwrap_or_else(|| "-".into());
        let pending = if l.pending.is_empty() {
            "-".to_string()
        } else {
            l.pending.join(", ")
        };
        let _ = writeln!(
            s,
            "{:<10} {:>7} {:>6}  {:<25} {pending}",
            l.line, l.version, l.latest, at
        );
    }
    s
}

/// The policy a kind runs under: its built-in base, with configuration overrides on top.
pub fn policy_named(file: &FileConfig, name: &str) -> Result<(Policy, String), Error> {
    if let Some(k) = file.kinds.get(name) {
        let (base, origin) =
            builtin(name).unwrap_or((Policy::preset_default(), "the default preset"));
        let p = match &k.policy {
            Some(o) => base
                .with_overrides(o)
                .map_err(|e| format!("[kinds.\"{name}\".policy]: {e}"))?,
            None => base,
        };
        return Ok((
            p,
            format!("kind {name}: {origin}, with configuration overrides"),
        ));
    }
    if let Some((p, origin)) = builtin(name) {
        return Ok((p, format!("kind {name}: {origin}")));
    }
    if let Some(p) = Policy::preset(name) {
        return Ok((p, format!("preset {name}")));
    }
    let mut known: Vec<String> = onus::policy::PRESETS
        .iter()
        .map(|s| s.to_string())
        .collect();
    known.extend(file.kinds.keys().cloned());
    Err(Error::Invalid(format!(
        "no kind or preset named {name:?}; known: {}",
        known.join(", ")
    )))
}

fn builtin(kind: &str) -> Option<(Policy, &'static str)> {
    match kind {
        "webhook.deliver" => Some((Policy::preset_webhook(), "the webhook preset")),
        "mail.send" => Some((Policy::preset_mail(), "the mail preset")),
        "webhook.fanout" | "http.request" => Some((Policy::preset_default(), "the default preset")),
        _ => None,
    }
}

fn describe_policy(name: &str, origin: &str, p: &Policy) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "policy {name} ({origin})");
    let _ = writeln!(s, "  max attempts:     {}", p.max_attempts);
    let _ = writeln!(s, "  backoff:          {}", p.backoff);
    let _ = writeln!(
        s,
        "  jitter:           +/-{:.0}% on every wait",
        p.jitter * 100.0
    );
    let _ = writeln!(
        s,
        "  timeout:          {} per attempt",
        onus::policy::human(p.timeout)
    );
    let after = if p.alert_on_exhaustion {
        "discarded (exhausted) + alert"
    } else {
        "discarded (exhausted)"
    };
    let _ = writeln!(s, "  after exhaustion: {after}");
    let _ = writeln!(s);
    let _ = writeln!(s, "{}", p.timeline());
    s
}

async fn jobs(app: &App, cmd: JobsCommand) -> Result<(), Error> {
    let client = &app.client;
    match cmd {
        JobsCommand::List {
            filter,
            limit,
            before,
            json,
        } => {
            let filter = filter.to_filter(Vec::new());
            let page = crate::views::jobs::page(app, &filter, limit.into(), before).await?;
            if json {
                for j in &page.jobs {
                    println!("{}", serde_json::to_string(j)?);
                }
            } else {
                if page.jobs.is_empty() {
                    println!("(no jobs)");
                } else {
                    print!("{}", table(&page.jobs));
                }
                if let Some(next) = &page.next_cursor {
                    eprintln!("(more: --before {next})");
                }
            }
            Ok(())
        }
        JobsCommand::Show { id, json } => {
            let job = client.get(id).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&job)?);
            } else {
                print!("{}", show(&job));
            }
            Ok(())
        }
        JobsCommand::Insert(a) => {
            let json = a.json;
            let body = crate::api::jobs::NewJobBody {
                kind: a.kind,
                args: a.args,
                queue: a.queue,
                priority: a.priority,
                run_at: a.run_at.map(|t| t.to_rfc3339()),
                unique_key: a.unique_key,
                tags: (!a.tag.is_empty()).then_some(a.tag),
                lease_key: a.lease_key,
            };
            let row = body.to_job(app, "")?;
            let got = client
                .insert_prepared(vec![row])
                .await?
                .pop()
                .ok_or("nothing was inserted")?;
            let j = &got.job;
            if json {
                println!("{}", serde_json::to_string_pretty(j)?);
            } else if got.inserted {
                println!(
                    "enqueued job {} ({} in queue {}, {} at {})",
                    j.id,
                    j.kind,
                    j.queue,
                    j.state,
                    time_or_dash(Some(j.run_at))
                );
            } else {
                println!(
                    "not inserted: job {} ({}) holds the unique key {:?}",
                    j.id,
                    j.state,
                    j.unique_key.as_deref().unwrap_or("")
                );
            }
            Ok(())
        }
        JobsCommand::Retry(a) => {
            let f = action_filter(a)?;
            let out = client.retry_where(&f).await?;
            println!(
                "retried {} job(s){}",
                out.retried.len(),
                id_list(&out.retried)
            );
            for r in &out.refused {
                println!("left job {} as it is: {}", r.id, r.reason);
            }
            Ok(())
        }
        JobsCommand::Cancel(a) => {
            let f = action_filter(a)?;
            let out = client.cancel_where(&f).await?;
            println!(
                "cancelled {} waiting job(s){}",
                out.cancelled.len(),
                id_list(&out.cancelled)
            );
            if !out.requested.is_empty() {
                println!(
                    "asked {} running job(s) to stop; they end cancelled when their handler returns{}",
                    out.requested.len(),
                    id_list(&out.requested)
                );
            }
            Ok(())
        }
        JobsCommand::Delete(a) => {
            let f = action_filter(a)?;
            let matched = client.count(&f).await?;
            let gone = client.delete_where(&f).await?;
            println!("deleted {} finished job(s){}", gone.len(), id_list(&gone));
            let left = matched.saturating_sub(gone.len() as u64);
            if left > 0 {
                println!("left {left} unfinished job(s) as they are (cancel them first)");
            }
            Ok(())
        }
    }
}

/// `onus queues ...`: what `GET /queues` and `POST /queues/{name}/pause|resume` answer.
async fn queues(app: &App, cmd: QueuesCommand) -> Result<(), Error> {
    use crate::api::queues as q;
    let show = |stats: &onus::runtime::QueueStats| {
        if stats.paused {
            println!(
                "queue {} is paused (since {}): nothing is claimed from it until `onus queues resume {}`",
                stats.name,
                time_or_dash(stats.paused_at),
                stats.name
            );
        } else {
            println!(
                "queue {} runs: {} job(s) waiting",
                stats.name, stats.waiting
            );
        }
    };
    match cmd {
        QueuesCommand::List { json } => {
            let list = q::queue_list(app).await?;
            if json {
                for s in &list.queues {
                    println!("{}", serde_json::to_string(s)?);
                }
            } else {
                print!("{}", queue_table(&list.queues));
            }
        }
        QueuesCommand::Pause { name } => {
            show(&q::pause(State(app.clone()), Path(name)).await?.0);
        }
        QueuesCommand::Resume { name } => {
            show(&q::resume(State(app.clone()), Path(name)).await?.0);
        }
    }
    Ok(())
}

/// `onus periodic ...`: what `GET /periodic` and `POST /periodic/{name}/...` answer.
async fn periodic(app: &App, cmd: PeriodicCommand) -> Result<(), Error> {
    use crate::api::queues as q;
    let show = |r: &onus::store::PeriodicRow| {
        if r.paused_at.is_some() {
            println!(
                "schedule {} is paused: it enqueues nothing until `onus periodic resume {}`",
                r.name, r.name
            );
        } else {
            println!(
                "schedule {} runs ({}); next run {}",
                r.name,
                r.schedule,
                time_or_dash(r.next_run_at)
            );
        }
    };
    match cmd {
        PeriodicCommand::List { json } => {
            let rows = q::list_periodic(State(app.clone())).await?.0.periodic;
            if json {
                for r in &rows {
                    println!("{}", serde_json::to_string(r)?);
                }
            } else if rows.is_empty() {
                println!("(no periodic jobs)");
            } else {
                print!("{}", periodic_table(&rows));
            }
        }
        PeriodicCommand::Pause { name } => {
            show(&q::pause_periodic(State(app.clone()), Path(name)).await?.0)
        }
        PeriodicCommand::Resume { name } => {
            show(&q::resume_periodic(State(app.clone()), Path(name)).await?.0)
        }
        PeriodicCommand::Run { name } => {
            let (_, job) = q::run_periodic(State(app.clone()), Path(name.clone())).await?;
            println!(
                "enqueued job {} for schedule {name} ({} in queue {})",
                job.id, job.kind, job.queue
            );
        }
    }
    Ok(())
}

/// `onus keys ...`: what `GET /keys` and `POST /keys/{key}/pause|resume` answer.
async fn keys(app: &App, cmd: KeysCommand) -> Result<(), Error> {
    use crate::api::keys as k;
    match cmd {
        KeysCommand::List { json } => {
            let keys = k::list(State(app.clone())).await?.0.keys;
            if json {
                for p in &keys {
                    println!("{}", serde_json::to_string(p)?);
                }
            } else if keys.is_empty() {
                println!("(no paused keys)");
            } else {
                print!("{}", key_table(&keys));
            }
        }
        KeysCommand::Pause {
            key,
            for_,
            until,
            reason,
        } => {
            let body = k::PauseBody {
                seconds: for_.map(|d| d.as_secs_f64()),
                until: until.map(|t| t.to_rfc3339()),
                reason,
            };
            let p = k::pause(State(app.clone()), Path(key), Body(body)).await?.0;
            println!(
                "paused {} until {}: {} waiting job(s) held",
                p.key,
                time_or_dash(Some(p.until)),
                p.held
            );
        }
        KeysCommand::Resume { key } => {
            let r = k::resume(State(app.clone()), Path(key)).await?.0;
            if r.was_paused {
                println!("resumed {}: {} job(s) due now", r.key, r.released);
            } else {
                println!("{} was not paused: nothing changed", r.key);
            }
        }
        KeysCommand::Generate | KeysCommand::RotateEncryption { .. } => {
            unreachable!("answered before a database is opened")
        }
    }
    Ok(())
}

fn action_filter(a: ActionArgs) -> Result<JobFilter, Error> {
    if a.ids.is_empty() && a.filter.is_empty() && !a.all {
        return Err(
            "name job ids, or a filter (--state, --kind, --queue), or --all for every job".into(),
        );
    }
    Ok(a.filter.to_filter(a.ids))
}

fn id_list(ids: &[JobId]) -> String {
    if ids.is_empty() || ids.len() > 20 {
        return String::new();
    }
    let v: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    format!(": {}", v.join(" "))
}

/// A time as shown in a table (to the second, with its zone), or `-` when there is none.
fn time_or_dash(t: Option<onus::Timestamp>) -> String {
    t.map(crate::views::when).unwrap_or_else(|| "-".into())
}

/// A time as shown on one job's page: to the millisecond, with its zone.
fn precise(t: Option<onus::Timestamp>) -> String {
    t.map(|t| t.format("%Y-%m-%d %H:%M:%S%.3f UTC").to_string())
        .unwrap_or_else(|| "-".into())
}

fn queue_table(queues: &[onus::runtime::QueueStats]) -> String {
    let mut s = format!(
        "{:<20}  {:<7}  {:>8}  {:>12}  {}\n",
        "QUEUE", "STATE", "WAITING", "OLDEST WAIT", "JOBS BY STATE"
    );
    for q in queues {
        let counts: Vec<String> = q.counts.iter().map(|(st, n)| format!("{st} {n}")).collect();
        let _ = writeln!(
            s,
            "{:<20}  {:<7}  {:>8}  {:>12}  {}",
            q.name,
            if q.paused { "paused" } else { "running" },
            q.waiting,
            onus::policy::human(std::time::Duration::from_secs(
                q.oldest_waiting_seconds as u64
            )),
            if counts.is_empty() {
                "-".to_string()
            } else {
                counts.join(", ")
            }
        );
    }
    s
}

fn process_table(p: &onus::Processes) -> String {
    let mut s = String::new();
    if p.processes.is_empty() {
        s.push_str("(no processes seen in the last hour)\n");
    } else {
        let _ = writeln!(
            s,
            "{:<32}  {:<7}  {:<5}  {:>7}  {:<23}  {:<23}  QUEUES (SLOTS) / KINDS",
            "PROCESS", "ROLE", "LIVE", "RUNNING", "LAST SEEN", "STARTED"
        );
        for q in &p.processes {
            let what = if q.queues.is_empty() {
                q.kinds.join(", ")
            } else {
                q.queues
                    .iter()
                    .map(|q| format!("{} ({})", q.name, q.slots))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let role = match q.role {
                onus::ProcessRole::Runtime => "runtime",
                onus::ProcessRole::Pull => "pull",
            };
            let _ = writeln!(
                s,
                "{:<32}  {:<7}  {:<5}  {:>7}  {:<23}  {:<23}  {}",
                q.id,
                role,
                if q.live { "yes" } else { "no" },
                q.running,
                time_or_dash(Some(q.seen_at)),
                time_or_dash(Some(q.started_at)),
                if what.is_empty() { "-".into() } else { what }
            );
        }
    }
    if p.pulled_running > 0 {
        let _ = writeln!(
            s,
            "{} running job(s) leased to pull workers",
            p.pulled_running
        );
    }
    if p.orphaned_running > 0 {
        let _ = writeln!(
            s,
            "{} running job(s) of processes not seen in the last hour (rescued when their leases lapse)",
            p.orphaned_running
        );
    }
    s
}

fn key_table(keys: &[onus::PausedKey]) -> String {
    let mut s = format!(
        "{:<30}  {:<23}  {:>5}  {}\n",
        "KEY", "UNTIL", "HELD", "REASON"
    );
    for k in keys {
        let _ = writeln!(
            s,
            "{:<30}  {:<23}  {:>5}  {}",
            k.key,
            time_or_dash(Some(k.until)),
            k.held,
            if k.reason.is_empty() { "-" } else { &k.reason }
        );
    }
    s
}

fn table(jobs: &[Job]) -> String {
    let mut s = format!(
        "{:>8}  {:<10}  {:<24}  {:<10}  {:>7}  {:<23}  {}\n",
        "ID", "STATE", "KIND", "QUEUE", "ATTEMPT", "RUN AT", "LAST ERROR"
    );
    for j in jobs {
        let last = j
            .errors
            .last()
            .map(|e| onus::job::shorten(&e.message, 60))
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "{:>8}  {:<10}  {:<24}  {:<10}  {:>7}  {:<23}  {}",
            j.id,
            j.state.as_str(),
            j.kind,
            j.queue,
            format!("{}/{}", j.attempt, j.max_attempts),
            time_or_dash(Some(j.run_at)),
            last
        );
    }
    s
}

fn show(j: &Job) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "job {}", j.id);
    let _ = writeln!(s, "  kind:           {}", j.kind);
    let _ = writeln!(s, "  queue:          {}", j.queue);
    let _ = writeln!(s, "  state:          {}", j.state);
    if let Some(r) = j.discard_reason {
        let _ = writeln!(s, "  discard reason: {}", r.as_str());
    }
    let _ = writeln!(s, "  attempt:        {}/{}", j.attempt, j.max_attempts);
    let _ = writeln!(s, "  snoozes:        {}", j.snoozes);
    let _ = writeln!(s, "  priority:       {}", j.priority);
    let _ = writeln!(s, "  run at:         {}", precise(Some(j.run_at)));
    let _ = writeln!(s, "  created at:     {}", precise(Some(j.created_at)));
    let _ = writeln!(s, "  attempted at:   {}", precise(j.attempted_at));
    let _ = writeln!(s, "  finalized at:   {}", precise(j.finalized_at));
    if let Some(k) = &j.unique_key {
        let _ = writeln!(s, "  unique key:     {k}");
    }
    if let Some(k) = &j.lease_key {
        let _ = writeln!(s, "  lease key:      {k}");
    }
    if let Some(o) = &j.lease_owner {
        let _ = writeln!(
            s,
            "  leased to:      {o} until {}",
            precise(j.lease_expires_at)
        );
    }
    let _ = writeln!(s, "  args:           {}", j.args);
    if let Some(p) = &j.progress {
        let _ = writeln!(
            s,
            "  progress:       {:.0}%{}  (at {})",
            p.fraction * 100.0,
            if p.message.is_empty() {
                String::new()
            } else {
                format!("  {}", p.message)
            },
            precise(Some(p.at))
        );
    }
    if let Some(r) = &j.result {
        let _ = writeln!(s, "  result:         {r}");
    }
    let _ = writeln!(
        s,
        "  history:        {}",
        if j.errors.is_empty() { "(none)" } else { "" }
    );
    for e in &j.errors {
        let class = serde_json::to_value(e.class)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "    {}  attempt {}  {:<11}  {}",
            precise(Some(e.at)),
            e.attempt,
            class,
            e.message
        );
    }
    s
}

fn periodic_table(rows: &[onus::store::PeriodicRow]) -> String {
    let mut s = format!(
        "{:<20}  {:<18}  {:<20}  {:<23}  {:<10}  {:<23}  {}\n",
        "NAME", "KIND", "SCHEDULE", "LAST RUN", "LAST STATE", "NEXT RUN", "LAST FAILURE"
    );
    for r in rows {
        let failure = match (&r.last_failure_at, &r.last_error) {
            (Some(at), Some(e)) => {
                format!("{}: {}", time_or_dash(Some(*at)), onus::job::shorten(e, 60))
            }
            _ => "-".into(),
        };
        let _ = writeln!(
            s,
            "{:<20}  {:<18}  {:<20}  {:<23}  {:<10}  {:<23}  {}",
            r.name,
            r.kind,
            r.schedule,
            time_or_dash(r.last_run_at),
            r.last_state.as_deref().unwrap_or("-"),
            if r.paused_at.is_some() {
                "paused".to_string()
            } else {
                time_or_dash(r.next_run_at)
            },
            failure
        );
    }
    s
}
