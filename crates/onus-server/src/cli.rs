//! Command-line parsing and the `jobs` and `policy` commands.

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use onus::{Job, JobFilter, JobId, JobState, Policy};

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
    #[arg(long, env = "ONUS_CONFIG", global = true, value_name = "PATH")]
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
    /// List, show, retry and cancel jobs.
    #[command(subcommand)]
    Jobs(JobsCommand),
    /// Show retry policies and the schedule each implies.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Show periodic jobs: schedule, last run, last failure, next run.
    #[command(subcommand)]
    Periodic(PeriodicCommand),
    /// Print or rotate the API token kept in the database.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Make encryption keys and re-encrypt webhook secrets under a new one.
    #[command(subcommand)]
    Keys(KeysCommand),
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
pub enum KeysCommand {
    /// Print a new random encryption key (32 bytes, base64) for ONUS_ENCRYPTION_KEY or
    /// encryption_key_file.
    Generate,
    /// Re-encrypt every webhook secret under a new key (from the configured key, or from
    /// plaintext when none is configured yet); then configure the new key.
    RotateEncryption {
        /// A file holding the new key (else ONUS_NEW_ENCRYPTION_KEY).
        #[arg(long, value_name = "PATH")]
        new_key_file: Option<PathBuf>,
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
}

#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// List jobs, newest first.
    List {
        #[command(flatten)]
        filter: FilterArgs,
        /// Most jobs to show.
        #[arg(long, default_value_t = 50)]
        limit: usize,
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
    /// Run discarded, cancelled or retryable jobs again now (one more attempt each): by id, or
    /// every job matching a filter.
    Retry(ActionArgs),
    /// Cancel jobs: waiting ones at once, running ones by a signal to their handler.
    Cancel(ActionArgs),
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
            ..JobFilter::default()
        }
    }

    fn is_empty(&self) -> bool {
        self.state.is_empty() && self.kind.is_empty() && self.queue.is_empty()
    }
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
            | Command::Keys(KeysCommand::Generate)
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
        Command::Periodic(PeriodicCommand::List { json }) => {
            let store = onus::open(&url).await?;
            let rows = store.list_periodic().await?;
            if json {
                for r in &rows {
                    println!("{}", serde_json::to_string(r)?);
                }
            } else {
                print!("{}", periodic_table(&rows));
            }
            Ok(())
        }
        Command::Token(cmd) => token(&file, &url, cmd).await,
        Command::Sessions(SessionsCommand::Revoke) => {
            let parts = migrated_runtime(&file, &url).await?;
            crate::panel::Sessions::new(parts.secrets.clone())
                .revoke_all()
                .await?;
            eprintln!("every panel session has ended; log in again");
            Ok(())
        }
        Command::Keys(KeysCommand::Generate) => {
            println!("{}", onus_webhooks::crypto::Key::generate());
            Ok(())
        }
        Command::Keys(KeysCommand::RotateEncryption { new_key_file }) => {
            rotate_encryption(&file, &url, new_key_file).await
        }
        Command::Jobs(cmd) => {
            let store = onus::open(&url).await?;
            let client = onus::Onus::builder(store).build()?.client();
            jobs(client, cmd).await
        }
    }
}

/// The runtime the configuration describes, on a database whose migrations are all applied (a
/// command that writes refuses a database that needs `onus migrate` first).
async fn migrated_runtime(file: &FileConfig, url: &str) -> Result<crate::serve::Parts, Error> {
    let store = onus::open_with(url, false).await?;
    let parts = crate::serve::runtime(store, file)?;
    parts.onus.check_migrations().await?;
    Ok(parts)
}

/// `onus keys rotate-encryption`.
async fn rotate_encryption(
    file: &FileConfig,
    url: &str,
    new_key_file: Option<PathBuf>,
) -> Result<(), Error> {
    let text = match &new_key_file {
        Some(p) => std::fs::read_to_string(p)
            .map_err(|e| format!("--new-key-file {}: cannot read it ({e})", p.display()))?,
        None => std::env::var("ONUS_NEW_ENCRYPTION_KEY").map_err(|_| {
            "give the new key: --new-key-file PATH or ONUS_NEW_ENCRYPTION_KEY (`onus keys generate` makes one)".to_string()
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

async fn jobs(client: onus::Client, cmd: JobsCommand) -> Result<(), Error> {
    match cmd {
        JobsCommand::List {
            filter,
            limit,
            before,
            json,
        } => {
            let jobs = client
                .list(&filter.to_filter(Vec::new()), limit, before)
                .await?;
            if json {
                for j in &jobs {
                    println!("{}", serde_json::to_string(j)?);
                }
            } else {
                print!("{}", table(&jobs));
                if jobs.len() == limit {
                    if let Some(last) = jobs.last() {
                        eprintln!("(more: --before {})", last.id);
                    }
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
    }
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

/// A time as shown in a table, or `-` when there is none.
fn time_or_dash(t: Option<onus::Timestamp>) -> String {
    t.map(|t| t.format("%Y-%m-%d %H:%M:%S%.3f").to_string())
        .unwrap_or_else(|| "-".into())
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
            .map(|e| e.message.chars().take(60).collect::<String>())
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
    let _ = writeln!(s, "  run at:         {}", time_or_dash(Some(j.run_at)));
    let _ = writeln!(s, "  created at:     {}", time_or_dash(Some(j.created_at)));
    let _ = writeln!(s, "  attempted at:   {}", time_or_dash(j.attempted_at));
    let _ = writeln!(s, "  finalized at:   {}", time_or_dash(j.finalized_at));
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
            time_or_dash(j.lease_expires_at)
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
            time_or_dash(Some(p.at))
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
            time_or_dash(Some(e.at)),
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
            (Some(at), Some(e)) => format!(
                "{}: {}",
                time_or_dash(Some(*at)),
                e.chars().take(60).collect::<String>()
            ),
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
            time_or_dash(r.next_run_at),
            failure
        );
    }
    s
}
