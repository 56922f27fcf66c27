//! Configuration: `onus.toml` (or the file `ONUS_CONFIG` names), then `ONUS_*` environment
//! variables and command-line flags on top.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// The default database: a SQLite file in the working directory.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://onus.db";
/// The default listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

/// The whole configuration file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// `sqlite://path` or `postgres://...`.
    pub database_url: Option<String>,
    /// Address the HTTP server listens on.
    pub listen: Option<String>,
    /// Bearer token for the API (else one is generated and kept in the database).
    pub api_token: Option<String>,
    /// The most bytes of an API request body: a number of bytes or `"512KiB"`, `"4MiB"`
    /// (default 1 MiB; `POST /jobs/batch` has its own limit of 32 MiB).
    pub body_limit: Option<ByteSize>,
    /// How long a client may take to send a request's headers, and an idle connection may wait
    /// for its next request, before it is closed (`"10s"`).
    pub header_timeout: Option<String>,
    /// How long a request body may go without a byte arriving before the request fails with 408
    /// (`"30s"`).
    pub body_timeout: Option<String>,
    /// The most connections served at once (4096); more wait in the listen queue.
    pub max_connections: Option<usize>,
    /// For fault drills only: this process's clock runs this far off the machine's (`"30s"`
    /// ahead, `"-30s"` behind), as a machine whose clock drifted would.
    pub clock_offset: Option<String>,
    /// How long a claim on a job lasts without renewal (`"30s"`): a process that dies is noticed
    /// this long after, and its attempts counted lost. Heartbeats renew it every fifteenth of it
    /// and rescues look every sixth.
    pub lease_ttl: Option<String>,
    /// Serve `/metrics` without a token.
    #[serde(default)]
    pub metrics_public: bool,
    /// A file holding the key webhook secrets are encrypted under at rest (32 bytes, base64);
    /// `ONUS_ENCRYPTION_KEY` gives the key itself and wins.
    pub encryption_key_file: Option<PathBuf>,
    /// Queue name to concurrency in this process.
    #[serde(default)]
    pub queues: BTreeMap<String, usize>,
    /// Per-kind settings.
    #[serde(default)]
    pub kinds: BTreeMap<String, KindConfig>,
    /// How long finished jobs are kept.
    #[serde(default)]
    pub retention: RetentionConfig,
    /// Webhook delivery settings.
    #[serde(default)]
    pub webhooks: WebhooksConfig,
    /// Outbound HTTP settings for `http.request` jobs.
    #[serde(default)]
    pub http: HttpSection,
    /// SMTP mail (`mail.send` jobs); without it `mail.send` inserts are refused.
    #[serde(default)]
    pub mail: Option<MailSection>,
    /// The tasks panel.
    #[serde(default)]
    pub panel: PanelConfig,
    /// Every kind's retry budget unless `[kinds."<kind>"] retry_budget` sets its own; none when
    /// absent.
    pub retry_budget: Option<onus::RetryBudget>,
    /// Periodic jobs, by name.
    #[serde(default)]
    pub periodic: BTreeMap<String, PeriodicConfig>,
}

/// `[periodic."<name>"]`: a job enqueued on a schedule.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeriodicConfig {
    /// A cron expression (`"0 9 * * MON-FRI"`; 6 fields with seconds).
    pub cron: Option<String>,
    /// Or a fixed interval (`"15m"`).
    pub every: Option<String>,
    /// The time zone the cron expression is read in (IANA: `"Europe/Berlin"`; UTC by default).
    pub timezone: Option<String>,
    /// The kind of the job.
    pub kind: String,
    /// Its args (`{}` when absent).
    #[serde(default)]
    pub args: Option<toml::Value>,
    /// Its queue (the kind's when absent).
    pub queue: Option<String>,
    /// Periods missed while nothing ran: `"skip"`, `"latest"` (the default) or `"all"`.
    pub catch_up: Option<String>,
    /// With `catch_up = "all"`, the most missed periods run (default 100).
    pub catch_up_limit: Option<u32>,
}

impl PeriodicConfig {
    /// The schedule, checked; the error names the setting.
    pub fn periodic(&self, name: &str) -> Result<onus::Periodic, ConfigError> {
        let section = format!("periodic.\"{name}\"");
        let schedule = match (&self.cron, &self.every) {
            (Some(c), None) => onus::Schedule::cron(c)
                .map_err(|e| ConfigError(format!("[{section}] cron = {e}")))?,
            (None, Some(e)) => {
                let d = humantime::parse_duration(e).map_err(|err| {
                    ConfigError(format!(
                        "[{section}] every = {e:?} is not a duration ({err}); write it like \"15m\""
                    ))
                })?;
                onus::Schedule::every(d).map_err(|e| ConfigError(format!("[{section}] {e}")))?
            }
            _ => {
                return Err(ConfigError(format!(
                    "[{section}] give either cron = \"0 9 * * *\" or every = \"15m\", not both and not neither"
                )))
            }
        };
        let schedule = match &self.timezone {
            Some(tz) => schedule
                .in_timezone(tz)
                .map_err(|e| ConfigError(format!("[{section}] {e}")))?,
            None => schedule,
        };
        let catch_up = match (self.catch_up.as_deref(), self.catch_up_limit) {
            (None | Some("latest"), None) => onus::CatchUp::Latest,
            (None | Some("skip" | "latest"), Some(_)) => {
                return Err(ConfigError(format!(
                    "[{section}] catch_up_limit applies to catch_up = \"all\""
                )))
            }
            (Some("skip"), None) => onus::CatchUp::Skip,
            (Some("all"), limit) => match limit.unwrap_or(100) {
                l @ 1..=10_000 => onus::CatchUp::All { limit: l },
                l => {
                    return Err(ConfigError(format!(
                        "[{section}] catch_up_limit = {l}: give 1 to 10000"
                    )))
                }
            },
            (Some(other), _) => {
                return Err(ConfigError(format!(
                    "[{section}] catch_up = {other:?}: write \"skip\", \"latest\" or \"all\""
                )))
            }
        };
        let args = match &self.args {
            Some(v) => serde_json::to_value(v)
                .map_err(|e| ConfigError(format!("[{section}] args: {e}")))?,
            None => serde_json::json!({}),
        };
        let mut job = onus::NewJob::new(self.kind.clone(), args);
        job.queue = self.queue.clone();
        Ok(onus::Periodic::new(name, schedule, job).catch_up(catch_up))
    }
}

/// `[panel]`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PanelConfig {
    /// The password of the login form; the API token when absent.
    pub password: Option<String>,
    /// The path the panel is served under, behind a reverse proxy (`"/onus"`; default: the root).
    pub base_path: Option<String>,
    /// Mark the session cookie `Secure` (default: only when the request came over HTTPS, as a
    /// proxy's `X-Forwarded-Proto` says).
    pub secure_cookies: Option<bool>,
}

impl PanelConfig {
    /// The base path, checked: empty, or `/` and letters, digits, `-`, `_`, `/`, without a
    /// trailing `/`.
    pub fn base(&self) -> Result<String, ConfigError> {
        let Some(b) = &self.base_path else {
            return Ok(String::new());
        };
        let b = b.trim_end_matches('/');
        let ok = b.is_empty()
            || (b.starts_with('/')
                && b[1..]
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '/')));
        if !ok {
            return Err(ConfigError(format!(
                "[panel] base_path = {b:?}: write a path like \"/onus\" (letters, digits, -, _ and /)"
            )));
        }
        if b.starts_with("/api") || b.starts_with("/healthz") || b.starts_with("/metrics") {
            return Err(ConfigError(format!(
                "[panel] base_path = {b:?} would hide the API; choose another path"
            )));
        }
        Ok(b.to_string())
    }
}

/// `[kinds."<kind>"]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KindConfig {
    /// Policy overrides.
    #[serde(default)]
    pub policy: Option<onus::PolicyOverride>,
    /// The URL jobs of this kind are POSTed to (push kinds); without one the kind is pulled by
    /// workers through the API.
    pub url: Option<String>,
    /// Headers sent with every push request.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Time for one push request (`"30s"`, the default).
    pub timeout: Option<String>,
    /// The push requests' signing secret (`whsec_...`); generated and kept in the database when
    /// absent.
    pub secret: Option<String>,
    /// The queue jobs of this kind go to by default.
    pub queue: Option<String>,
    /// The lease key of each job, built from its args (`"customer:{customer_id}"`).
    pub lease_key: Option<String>,
    /// How many jobs holding one lease key run at once (default 1).
    pub slots: Option<u32>,
    /// This kind's retry budget (`{ ratio = 0.2, window = "1m", min_per_window = 10 }`),
    /// replacing `[retry_budget]`.
    pub retry_budget: Option<onus::RetryBudget>,
    /// At most this many jobs of the kind run at once across every process.
    pub max_running: Option<u32>,
    /// A rate window taken before each attempt:
    /// `{ key = "customer:{customer_id}", limit = 30, per = "1h", when_spent = "snooze" }`.
    pub rate: Option<RateConfig>,
}

/// `rate = { key, limit, per, when_spent }` of a kind.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateConfig {
    /// The key each job takes a use of, built from its args (`"customer:{customer_id}"`; a
    /// fixed text is one window for the whole kind).
    pub key: String,
    /// Uses allowed per window.
    pub limit: u32,
    /// The window (`"1h"`).
    pub per: String,
    /// `"snooze"` (to the next window; the default) or `"drop"` (discarded on purpose).
    pub when_spent: Option<onus::WhenSpent>,
}

impl KindConfig {
    /// `max_running` and `rate`, checked: the cap and the rate window with its key.
    #[allow(clippy::type_complexity)]
    pub fn limits(
        &self,
        name: &str,
    ) -> Result<(Option<u32>, Option<(onus::RateWindow, onus::KeyTemplate)>), ConfigError> {
        let section = format!("kinds.\"{name}\"");
        if let Some(n) = self.max_running {
            if !(1..=100_000).contains(&n) {
                return Err(ConfigError(format!(
                    "[{section}] max_running = {n}: give 1 to 100000"
                )));
            }
        }
        let rate = match &self.rate {
            None => None,
            Some(r) => {
                let key = onus::KeyTemplate::parse(&r.key)
                    .map_err(|e| ConfigError(format!("[{section}] rate key = {e}")))?;
                if r.limit == 0 {
                    return Err(ConfigError(format!(
                        "[{section}] rate limit = 0: allow at least 1 use per window"
                    )));
                }
                let per = match humantime::parse_duration(&r.per) {
                    Ok(d)
                        if d >= Duration::from_secs(1)
                            && d <= Duration::from_secs(366 * 86_400) =>
                    {
                        d
                    }
                    Ok(_) => {
                        return Err(ConfigError(format!(
                            "[{section}] rate per = {:?}: give \"1s\" to \"366d\"",
                            r.per
                        )))
                    }
                    Err(e) => {
                        return Err(ConfigError(format!(
                        "[{section}] rate per = {:?} is not a duration ({e}); write it like \"1h\"",
                        r.per
                    )))
                    }
                };
                Some((
                    onus::RateWindow::new(
                        name,
                        r.limit,
                        per,
                        r.when_spent.unwrap_or(onus::WhenSpent::Snooze),
                    ),
                    key,
                ))
            }
        };
        Ok((self.max_running, rate))
    }
}

impl KindConfig {
    /// `lease_key` and `slots`, checked.
    pub fn lease(&self, name: &str) -> Result<Option<(onus::KeyTemplate, u32)>, ConfigError> {
        let section = format!("kinds.\"{name}\"");
        let Some(text) = &self.lease_key else {
            if self.slots.is_some() {
                return Err(ConfigError(format!(
                    "[{section}] slots needs lease_key = \"...\" (the key the slots are counted by)"
                )));
            }
            return Ok(None);
        };
        let t = onus::KeyTemplate::parse(text)
            .map_err(|e| ConfigError(format!("[{section}] lease_key = {e}")))?;
        let slots = self.slots.unwrap_or(1);
        if !(1..=10_000).contains(&slots) {
            return Err(ConfigError(format!(
                "[{section}] slots = {slots}: give 1 to 10000"
            )));
        }
        Ok(Some((t, slots)))
    }

    /// Checks the push settings; the error names the setting.
    pub fn check(&self, name: &str) -> Result<(), ConfigError> {
        let section = format!("kinds.\"{name}\"");
        duration(&section, "timeout", &self.timeout)?;
        let push_only = [
            ("headers", !self.headers.is_empty()),
            ("timeout", self.timeout.is_some()),
            ("secret", self.secret.is_some()),
        ];
        match &self.url {
            Some(u) => {
                let parsed = url::Url::parse(u).map_err(|e| {
                    ConfigError(format!(
                        "[{section}] url = {u:?} is not a URL ({e}); write it like \"http://127.0.0.1:3000/jobs\""
                    ))
                })?;
                if !matches!(parsed.scheme(), "http" | "https") {
                    return Err(ConfigError(format!(
                        "[{section}] url = {u:?}: the scheme must be http or https"
                    )));
                }
            }
            None => {
                if let Some((key, _)) = push_only.iter().find(|(_, set)| *set) {
                    return Err(ConfigError(format!(
                        "[{section}] {key} applies to push kinds only; add url = \"http://...\" or remove {key}"
                    )));
                }
            }
        }
        onus_webhooks::signing::check_headers(&self.headers)
            .map_err(|e| ConfigError(format!("[{section}] {e}")))?;
        self.lease(name)?;
        if let Some(s) = &self.secret {
            onus_webhooks::signing::check_secret(s).map_err(|e| {
                ConfigError(format!(
                    "[{section}] secret: {e}; write a whsec_ secret (24 to 64 bytes, base64 after the prefix), or leave it out to have one made"
                ))
            })?;
        }
        Ok(())
    }
}

/// `[webhooks]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhooksConfig {
    /// New deliveries to a failing endpoint wait this long (`"5m"`).
    pub cooldown: Option<String>,
    /// An endpoint failing continuously this long is disabled (`"5d"`).
    pub disable_after: Option<String>,
    /// Time for one delivery request (`"30s"`).
    pub timeout: Option<String>,
    /// Networks deliveries may reach although the SSRF guard refuses them.
    #[serde(default)]
    pub allow_networks: Vec<String>,
}

/// `[mail]`.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MailSection {
    /// The relay: `smtp://user:password@relay.example.com:587?tls=required`, `smtps://...`.
    /// `ONUS_MAIL_URL` wins, so the password need not be in the file.
    pub url: Option<String>,
    /// The sender when a mail names none: `"Example <noreply@example.com>"`.
    pub from: Option<String>,
    /// The right part of every Message-ID (and the name given in EHLO).
    pub message_id_domain: Option<String>,
    /// Time for one whole SMTP session (`"30s"`).
    pub timeout: Option<String>,
    /// Time to connect (`"10s"`).
    pub connect_timeout: Option<String>,
    /// A PEM file of CA certificates trusted besides the system's (a private relay).
    pub ca_file: Option<PathBuf>,
    /// Per recipient: `{ limit = 30, per = "1h" }`; when spent, mail snoozes to the next window.
    pub recipient_limit: Option<LimitSection>,
    /// Per owner: `{ limit = 5, per = "1h" }`; beyond it, mail is dropped on purpose.
    pub owner_limit: Option<LimitSection>,
    /// DKIM signing.
    pub dkim: Option<DkimSection>,
}

impl std::fmt::Debug for MailSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may hold the relay's password: only whether it is set.
        f.debug_struct("MailSection")
            .field("url", &self.url.as_ref().map(|_| "<set>"))
            .field("from", &self.from)
            .field("message_id_domain", &self.message_id_domain)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// A rate window: `{ limit = 30, per = "1h" }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitSection {
    /// Uses per window.
    pub limit: u32,
    /// The window (`"1h"`).
    pub per: String,
}

/// `dkim = { domain = "example.com", selector = "s1", key_file = "dkim.pem" }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DkimSection {
    /// The signing domain.
    pub domain: String,
    /// The selector (`s1._domainkey.example.com`).
    pub selector: String,
    /// The private key, PEM (RSA PKCS#1 or Ed25519).
    pub key_file: PathBuf,
}

impl MailSection {
    /// The settings, defaults filled in; the error names the bad setting.
    pub fn resolve(&self) -> Result<onus_mail::MailConfig, ConfigError> {
        let bad = |key: &str, what: String| ConfigError(format!("[mail] {key}: {what}"));
        let url = std::env::var("ONUS_MAIL_URL")
            .ok()
            .filter(|u| !u.is_empty())
            .or_else(|| self.url.clone())
            .ok_or_else(|| bad("url", "name the relay: url = \"smtp://user:password@relay.example.com:587?tls=required\" (or set ONUS_MAIL_URL)".into()))?;
        let mut relay = onus_mail::Relay::parse(&url).map_err(|e| bad("url", e))?;
        if let Some(ca) = &self.ca_file {
            let pem = std::fs::read(ca)
                .map_err(|e| bad("ca_file", format!("cannot read {}: {e}", ca.display())))?;
            relay.roots.push(pem);
        }
        let domain = match &self.message_id_domain {
            Some(d) => d.clone(),
            None => self
                .from
                .as_deref()
                .and_then(|f| f.rsplit_once('@'))
                .map(|(_, d)| d.trim_end_matches('>').trim().to_string())
                .ok_or_else(|| {
                    bad(
                        "message_id_domain",
                        "name the domain of Message-IDs: message_id_domain = \"example.com\""
                            .into(),
                    )
                })?,
        };
        if domain.is_empty()
            || !domain
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
        {
            return Err(bad(
                "message_id_domain",
                format!("{domain:?} is not a domain name; write it like \"example.com\""),
            ));
        }
        let mut c = onus_mail::MailConfig::new(relay, domain);
        if let Some(f) = &self.from {
            c.from = Some(f.parse().map_err(|e| {
                bad(
                    "from",
                    format!(
                        "{f:?} is not an address ({e}); write \"Example <noreply@example.com>\""
                    ),
                )
            })?);
        }
        if let Some(d) = duration("mail", "timeout", &self.timeout)? {
            c.timeout = d;
        }
        if let Some(d) = duration("mail", "connect_timeout", &self.connect_timeout)? {
            c.connect_timeout = d;
        }
        for (key, section, slot) in [
            (
                "recipient_limit",
                &self.recipient_limit,
                &mut c.recipient_limit,
            ),
            ("owner_limit", &self.owner_limit, &mut c.owner_limit),
        ] {
            if let Some(l) = section {
                let per = duration("mail", &format!("{key}.per"), &Some(l.per.clone()))?
                    .unwrap_or_default();
                if l.limit == 0 || per.is_zero() {
                    return Err(bad(key, "give a limit of at least 1 and a window longer than 0: { limit = 30, per = \"1h\" }".into()));
                }
                *slot = (l.limit, per);
            }
        }
        if let Some(d) = &self.dkim {
            let pem = std::fs::read_to_string(&d.key_file).map_err(|e| {
                bad(
                    "dkim.key_file",
                    format!("cannot read {}: {e}", d.key_file.display()),
                )
            })?;
            c.dkim = Some(
                onus_mail::Dkim::new(&d.domain, &d.selector, &pem)
                    .map_err(|e| ConfigError(format!("[mail] {e}")))?,
            );
        }
        Ok(c)
    }
}

/// `[http]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSection {
    /// Time for one `http.request` call (`"30s"`).
    pub timeout: Option<String>,
    /// Networks `http.request` jobs may reach although the SSRF guard refuses them.
    #[serde(default)]
    pub allow_networks: Vec<String>,
}

/// A size in bytes: a number, or text with a unit (`"512KiB"`, `"4MiB"`, `"1MB"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(pub usize);

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Num(u64),
            Text(String),
        }
        let bad = |v: &str| {
            serde::de::Error::custom(format!(
                "{v:?} is not a size; write a number of bytes or like \"512KiB\", \"4MiB\""
            ))
        };
        let n = match Raw::deserialize(d)? {
            Raw::Num(n) => n,
            Raw::Text(t) => {
                let v = t.trim();
                let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
                let (num, unit) = v.split_at(split);
                let num: u64 = num.parse().map_err(|_| bad(&t))?;
                let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
                    "" | "b" => 1,
                    "kb" => 1000,
                    "kib" => 1 << 10,
                    "mb" => 1_000_000,
                    "mib" => 1 << 20,
                    "gb" => 1_000_000_000,
                    "gib" => 1 << 30,
                    _ => return Err(bad(&t)),
                };
                num.checked_mul(mult).ok_or_else(|| bad(&t))?
            }
        };
        if n == 0 {
            return Err(serde::de::Error::custom(
                "a size of 0 bytes refuses every body; give at least 1",
            ));
        }
        usize::try_from(n)
            .map(ByteSize)
            .map_err(|_| serde::de::Error::custom("the size is too large"))
    }
}

/// The longest duration a setting may name: ten years (longer ones only overflow the calendar).
const MAX_SETTING: Duration = Duration::from_secs(3650 * 86_400);

fn duration(section: &str, key: &str, v: &Option<String>) -> Result<Option<Duration>, ConfigError> {
    v.as_ref()
        .map(|v| {
            let d = humantime::parse_duration(v).map_err(|e| {
                ConfigError(format!("[{section}] {key} = {v:?} is not a duration ({e}); write it like \"30s\", \"5m\" or \"5d\""))
            })?;
            if d > MAX_SETTING {
                return Err(ConfigError(format!(
                    "[{section}] {key} = {v:?} is too long; the most is ten years (\"3650d\")"
                )));
            }
            Ok(d)
        })
        .transpose()
}

impl WebhooksConfig {
    /// The settings, defaults filled in; the error names the bad setting.
    pub fn resolve(&self) -> Result<onus_webhooks::WebhookConfig, ConfigError> {
        let mut c = onus_webhooks::WebhookConfig::default();
        if let Some(d) = duration("webhooks", "cooldown", &self.cooldown)? {
            c.cooldown = d;
        }
        if let Some(d) = duration("webhooks", "disable_after", &self.disable_after)? {
            c.disable_after = d;
        }
        if let Some(d) = duration("webhooks", "timeout", &self.timeout)? {
            c.timeout = d;
        }
        onus_http::Guard::parse(&self.allow_networks)
            .map_err(|e| ConfigError(format!("[webhooks] allow_networks: {e}")))?;
        c.allow_networks = self.allow_networks.clone();
        Ok(c)
    }
}

impl HttpSection {
    /// The client settings; the error names the bad setting.
    pub fn resolve(&self) -> Result<onus_http::HttpConfig, ConfigError> {
        let mut c = onus_http::HttpConfig::default();
        if let Some(d) = duration("http", "timeout", &self.timeout)? {
            c.timeout = d;
        }
        onus_http::Guard::parse(&self.allow_networks)
            .map_err(|e| ConfigError(format!("[http] allow_networks: {e}")))?;
        c.allow_networks = self.allow_networks.clone();
        Ok(c)
    }
}

/// `[retention]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionConfig {
    /// Completed jobs are kept this long (`"1d"`).
    pub completed: Option<String>,
    /// Discarded and cancelled jobs are kept this long (`"7d"`).
    pub discarded: Option<String>,
}

/// The key webhook secrets are encrypted under: `ONUS_ENCRYPTION_KEY`, else the file
/// `encryption_key_file` names, else none.
pub fn encryption_key(
    file: &FileConfig,
) -> Result<Option<onus_webhooks::crypto::Key>, ConfigError> {
    if let Some(k) = std::env::var("ONUS_ENCRYPTION_KEY")
        .ok()
        .filter(|k| !k.trim().is_empty())
    {
        return onus_webhooks::crypto::Key::from_base64(&k)
            .map(Some)
            .map_err(|e| ConfigError(format!("ONUS_ENCRYPTION_KEY: {e}")));
    }
    let Some(path) = &file.encryption_key_file else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigError(format!(
            "encryption_key_file = {:?}: cannot read it ({e}); `onus keys generate > {}` makes one",
            path.display(),
            path.display()
        ))
    })?;
    onus_webhooks::crypto::Key::from_base64(&text)
        .map(Some)
        .map_err(|e| ConfigError(format!("encryption_key_file = {:?}: {e}", path.display())))
}

/// A configuration problem, with what to fix.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// Reads the configuration file: `explicit` if given (it must exist), else `onus.toml` in the
/// working directory if there is one, else nothing.
pub fn load(explicit: Option<&Path>) -> Result<(FileConfig, Option<PathBuf>), ConfigError> {
    let path = match explicit {
        Some(p) => {
            if !p.is_file() {
                return Err(ConfigError(format!(
                    "configuration file {} does not exist; fix ONUS_CONFIG / --config or create the file",
                    p.display()
                )));
            }
            p.to_path_buf()
        }
        None => {
            let p = PathBuf::from("onus.toml");
            if !p.is_file() {
                return Ok((FileConfig::default(), None));
            }
            p
        }
    };
    let text = std::fs::read_to_string(&path).map_err(|e| {
        ConfigError(format!(
            "cannot read configuration file {}: {e}",
            path.display()
        ))
    })?;
    let cfg = parse(&text).map_err(|e| ConfigError(format!("in {}: {}", path.display(), e.0)))?;
    Ok((cfg, Some(path)))
}

/// Parses and checks a configuration text.
pub fn parse(text: &str) -> Result<FileConfig, ConfigError> {
    let cfg: FileConfig =
        toml::from_str(text).map_err(|e| ConfigError(e.to_string().trim().to_string()))?;
    for (q, n) in &cfg.queues {
        if *n == 0 {
            return Err(ConfigError(format!(
                "[queues] {q} = 0: a queue needs a concurrency of at least 1"
            )));
        }
    }
    for (name, k) in &cfg.kinds {
        if let Some(o) = &k.policy {
            onus::Policy::preset_default()
                .with_overrides(o)
                .map_err(|e| ConfigError(format!("[kinds.\"{name}\".policy]: {e}")))?;
        }
        k.check(name)?;
        k.limits(name)?;
        if let Some(b) = &k.retry_budget {
            b.check()
                .map_err(|e| ConfigError(format!("[kinds.\"{name}\"] {e}")))?;
        }
    }
    for (name, p) in &cfg.periodic {
        p.periodic(name)?;
    }
    if let Some(b) = &cfg.retry_budget {
        b.check().map_err(|e| {
            ConfigError(format!(
                "[retry_budget] {}",
                e.trim_start_matches("retry_budget ")
            ))
        })?;
    }
    cfg.retention.durations()?;
    cfg.front_door()?;
    cfg.clock_offset()?;
    cfg.leases(onus::Options::default())?;
    cfg.panel.base()?;
    cfg.webhooks.resolve()?;
    cfg.http.resolve()?;
    if let Some(m) = &cfg.mail {
        m.resolve()?;
    }
    Ok(cfg)
}

/// The HTTP server's limits on its clients, as configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrontDoor {
    /// `header_timeout`.
    pub header_timeout: Duration,
    /// `body_timeout`.
    pub body_timeout: Duration,
    /// `max_connections`.
    pub max_connections: usize,
}

impl Default for FrontDoor {
    fn default() -> Self {
        FrontDoor {
            header_timeout: crate::api::DEFAULT_HEADER_TIMEOUT,
            body_timeout: crate::api::DEFAULT_BODY_TIMEOUT,
            max_connections: crate::api::DEFAULT_MAX_CONNECTIONS,
        }
    }
}

impl FileConfig {
    /// `options` with `lease_ttl` applied, and the heartbeat and rescue intervals that go with it
    /// (a fifteenth and a sixth of it: 2 s and 5 s for the default 30 s).
    pub fn leases(&self, options: onus::Options) -> Result<onus::Options, ConfigError> {
        let Some(v) = &self.lease_ttl else {
            return Ok(options);
        };
        let ttl = match humantime::parse_duration(v) {
            Ok(d) if d >= Duration::from_secs(1) && d <= Duration::from_secs(3600) => d,
            Ok(_) => {
                return Err(ConfigError(format!(
                    "lease_ttl = {v:?}: give a duration from \"1s\" to \"1h\""
                )))
            }
            Err(e) => {
                return Err(ConfigError(format!(
                    "lease_ttl = {v:?} is not a duration ({e}); write it like \"30s\""
                )))
            }
        };
        Ok(onus::Options {
            lease_ttl: ttl,
            heartbeat_interval: ttl / 15,
            rescue_interval: ttl / 6,
            ..options
        })
    }

    /// `clock_offset`, checked: at most a day either way.
    pub fn clock_offset(&self) -> Result<Option<chrono::TimeDelta>, ConfigError> {
        let Some(v) = &self.clock_offset else {
            return Ok(None);
        };
        let (sign, text) = match v.trim().strip_prefix('-') {
            Some(rest) => (-1, rest.trim()),
            None => (1, v.trim()),
        };
        let d = humantime::parse_duration(text).map_err(|e| {
            ConfigError(format!(
                "clock_offset = {v:?} is not a duration ({e}); write it like \"30s\" or \"-30s\""
            ))
        })?;
        if d > Duration::from_secs(86_400) {
            return Err(ConfigError(format!(
                "clock_offset = {v:?} is more than a day; a drill needs seconds to minutes"
            )));
        }
        let d = chrono::TimeDelta::from_std(d).map_err(|e| ConfigError(e.to_string()))?;
        Ok(Some(d * sign))
    }

    /// `header_timeout`, `body_timeout` and `max_connections`, checked, defaults filled in.
    pub fn front_door(&self) -> Result<FrontDoor, ConfigError> {
        let timeout = |key: &str, v: &Option<String>, default: Duration| {
            let Some(v) = v else { return Ok(default) };
            match humantime::parse_duration(v) {
                Ok(d) if !d.is_zero() && d <= Duration::from_secs(3600) => Ok(d),
                Ok(_) => Err(ConfigError(format!(
                    "{key} = {v:?}: give a duration from \"1ms\" to \"1h\""
                ))),
                Err(e) => Err(ConfigError(format!(
                    "{key} = {v:?} is not a duration ({e}); write it like \"10s\""
                ))),
            }
        };
        let d = FrontDoor::default();
        let max_connections = match self.max_connections {
            Some(0) => {
                return Err(ConfigError(
                    "max_connections = 0: the server needs at least 1 connection".into(),
                ))
            }
            Some(n) => n,
            None => d.max_connections,
        };
        Ok(FrontDoor {
            header_timeout: timeout("header_timeout", &self.header_timeout, d.header_timeout)?,
            body_timeout: timeout("body_timeout", &self.body_timeout, d.body_timeout)?,
            max_connections,
        })
    }
}

impl RetentionConfig {
    /// The retention as durations, defaults filled in.
    pub fn durations(&self) -> Result<onus::store::Retention, ConfigError> {
        let mut r = onus::store::Retention::default();
        if let Some(d) = duration("retention", "completed", &self.completed)? {
            r.completed = d;
        }
        if let Some(d) = duration("retention", "discarded", &self.discarded)? {
            r.discarded = d;
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regression_durations_past_ten_years_are_refused() {
        let e = parse("[retention]\ncompleted = \"300000years\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("[retention] completed = \"300000years\" is too long"),
            "{e}"
        );
        let e = parse("[webhooks]\ntimeout = \"20000d\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("[webhooks] timeout"), "{e}");
    }

    #[test]
    fn parses_the_documented_shapes() {
        let cfg = parse(
            r#"
            database_url = "sqlite://data/onus.db"
            listen = "127.0.0.1:9000"
            [queues]
            default = 20
            [kinds."search.index".policy]
            max_attempts = 5
            backoff = { initial = "1s", factor = 2, cap = "15m" }
            [kinds."webhook.deliver".policy]
            backoff = { schedule = ["5s", "5m"] }
            jitter = 0.2
            timeout = "10s"
            [kinds."report.build"]
            url = "http://127.0.0.1:3000/jobs"
            [retention]
            completed = "12h"
            [webhooks]
            cooldown = "5m"
            disable_after = "5d"
            allow_networks = ["127.0.0.1/32"]
            "#,
        )
        .unwrap();
        assert_eq!(cfg.queues["default"], 20);
        assert_eq!(
            cfg.kinds["search.index"]
                .policy
                .as_ref()
                .unwrap()
                .max_attempts,
            Some(5)
        );
        assert_eq!(
            cfg.retention.durations().unwrap().completed,
            Duration::from_secs(12 * 3600)
        );
    }

    #[test]
    fn a_retry_budget_is_checked_where_it_is_written() {
        let cfg = parse(
            "[retry_budget]\nratio = 0.1\nwindow = \"1m\"\nmin_per_window = 5\n\
             [kinds.\"a\"]\nretry_budget = { ratio = 0.2, window = \"30s\" }\n",
        )
        .unwrap();
        assert_eq!(cfg.retry_budget.unwrap().min_per_window, 5);
        assert_eq!(
            cfg.kinds["a"].retry_budget.unwrap().window,
            Duration::from_secs(30)
        );
        for (text, want) in [
            (
                "[kinds.\"a\"]\nretry_budget = { ratio = 2.0, window = \"1m\" }\n",
                "[kinds.\"a\"] retry_budget ratio = 2: give 0 to 1",
            ),
            (
                "[retry_budget]\nratio = 0.2\nwindow = \"10ms\"\n",
                "[retry_budget] window = \"10ms\": give \"1s\" to \"1d\"",
            ),
            (
                "[retry_budget]\nratio = 0.2\nwindow = \"soon\"\n",
                "not a duration",
            ),
            ("[retry_budget]\nratio = 0.2\n", "missing field `window`"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn a_periodic_job_is_checked_where_it_is_written() {
        let ok = parse(
            "[periodic.\"r\"]\ncron = \"0 9 * * MON-FRI\"\ntimezone = \"Europe/Berlin\"\nkind = \"k\"\n\
             catch_up = \"all\"\ncatch_up_limit = 7\n",
        )
        .unwrap();
        let p = ok.periodic["r"].periodic("r").unwrap();
        assert_eq!(
            p.schedule().describe(),
            "cron: 0 9 * * MON-FRI (Europe/Berlin)"
        );
        for (body, want) in [
            ("cron = \"0 9 * * *\"\nevery = \"1h\"", "either cron"),
            ("every = \"soon\"", "every = \"soon\" is not a duration"),
            ("cron = \"0 9 * * *\"\ntimezone = \"Berlin\"", "IANA"),
            ("every = \"1h\"\ntimezone = \"UTC\"", "applies to cron"),
            (
                "cron = \"0 9 * * *\"\ncatch_up = \"some\"",
                "\"skip\", \"latest\" or \"all\"",
            ),
            (
                "cron = \"0 9 * * *\"\ncatch_up_limit = 3",
                "applies to catch_up = \"all\"",
            ),
            ("cron = \"99 9 * * *\"", "cron = "),
        ] {
            let text = format!("[periodic.\"r\"]\nkind = \"k\"\n{body}\n");
            let e = parse(&text).unwrap_err().to_string();
            assert!(
                e.contains(want) && e.contains("[periodic.\"r\"]"),
                "{text}: {e}"
            );
        }
    }

    #[test]
    fn every_toml_example_in_the_readme_parses() {
        let readme = include_str!("../../../README.md");
        let mut n = 0;
        for block in readme.split("```toml\n").skip(1) {
            let text = &block[..block.find("```").unwrap_or(block.len())];
            if let Err(e) = parse(text) {
                panic!("a README example does not parse: {e}\n{text}");
            }
            n += 1;
        }
        assert!(n >= 2, "the README shows its configuration");
    }

    #[test]
    fn an_unknown_key_names_itself_and_where_it_is() {
        for (text, want) in [
            ("[webhooks]\ncooldwn = \"5m\"\n", "cooldwn"),
            ("[kinds.\"x\"]\nurll = \"http://a\"\n", "urll"),
            ("[kinds.\"x\".policy]\nmax_attempt = 3\n", "max_attempt"),
            ("metrics_publik = true\n", "metrics_publik"),
        ] {
            let e = parse(text).unwrap_err().0;
            assert!(
                e.contains(want) && e.contains("unknown field"),
                "{text}: {e}"
            );
        }
        let e = parse("[kinds.\"x\"]\nurl = \"ftp://a\"\n").unwrap_err().0;
        assert!(
            e.contains("[kinds.\"x\"] url") && e.contains("http or https"),
            "{e}"
        );
        let e = parse("[kinds.\"x\"]\nheaders = { a = \"b\" }\n")
            .unwrap_err()
            .0;
        assert!(e.contains("push kinds only"), "{e}");
        let e = parse("body_limit = \"lots\"\n").unwrap_err().0;
        assert!(e.contains("is not a size"), "{e}");
        assert_eq!(
            parse("body_limit = \"4MiB\"\n").unwrap().body_limit,
            Some(ByteSize(4 << 20))
        );
    }

    #[test]
    fn bad_input_says_what_to_fix() {
        let e = parse("[kinds.\"x\".policy]\njitter = 3.0").unwrap_err();
        assert!(e.0.contains("jitter"), "{e}");
        let e = parse("[kinds.\"x\".policy]\ntimeout = \"soon\"").unwrap_err();
        assert!(e.0.contains("not a duration"), "{e}");
        let e = parse("databse_url = \"x\"").unwrap_err();
        assert!(e.0.contains("databse_url"), "{e}");
        let e = parse("[queues]\ndefault = 0").unwrap_err();
        assert!(e.0.contains("at least 1"), "{e}");
    }

    #[test]
    fn the_mail_section_resolves_or_names_the_bad_key() {
        let c = parse(
            r#"
            [mail]
            url = "smtp://user:password@relay.example.com:587?tls=required"
            from = "Example <noreply@example.com>"
            message_id_domain = "example.com"
            timeout = "30s"
            recipient_limit = { limit = 30, per = "1h" }
            owner_limit = { limit = 5, per = "1h" }
            "#,
        )
        .unwrap();
        let section = c.mail.unwrap();
        assert!(!format!("{section:?}").contains("password"), "{section:?}");
        let m = section.resolve().unwrap();
        assert!(!format!("{m:?}").contains("password"), "{m:?}");
        assert_eq!(m.relay.port, 587);
        assert_eq!(m.recipient_limit, (30, Duration::from_secs(3600)));
        assert_eq!(m.owner_limit, (5, Duration::from_secs(3600)));
        assert_eq!(m.message_id_domain, "example.com");
        // The domain defaults to the sender's.
        let c = parse("[mail]\nurl = \"smtp://127.0.0.1:2525\"\nfrom = \"a@mail.example.org\"")
            .unwrap();
        assert_eq!(
            c.mail.unwrap().resolve().unwrap().message_id_domain,
            "mail.example.org"
        );
        for (text, says) in [
            ("[mail]\nfrom = \"a@example.com\"", "[mail] url"),
            ("[mail]\nurl = \"http://relay\"\nfrom = \"a@example.com\"", "[mail] url: scheme http"),
            ("[mail]\nurl = \"smtp://relay\"", "[mail] message_id_domain"),
            ("[mail]\nurl = \"smtp://relay\"\nfrom = \"nobody\"", "[mail] "),
            ("[mail]\nurl = \"smtp://relay\"\nfrom = \"a@example.com\"\nowner_limit = { limit = 0, per = \"1h\" }", "[mail] owner_limit"),
            ("[mail]\nurl = \"smtp://relay\"\nfrom = \"a@example.com\"\ntimeout = \"soon\"", "[mail] timeout"),
            ("[mail]\nurl = \"smtp://relay\"\nfrom = \"a@example.com\"\nretries = 3", "retries"),
            ("[mail]\nurl = \"smtp://relay\"\nfrom = \"a@example.com\"\ndkim = { domain = \"example.com\", selector = \"s1\", key_file = \"/nonexistent.pem\" }", "[mail] dkim.key_file"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.0.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn clock_offset_and_front_door_settings_are_checked() {
        let c = parse("clock_offset = \"-30s\"\n").unwrap();
        assert_eq!(
            c.clock_offset().unwrap(),
            Some(chrono::TimeDelta::seconds(-30))
        );
        let c = parse("clock_offset = \"2m\"\n").unwrap();
        assert_eq!(
            c.clock_offset().unwrap(),
            Some(chrono::TimeDelta::seconds(120))
        );
        assert_eq!(parse("").unwrap().clock_offset().unwrap(), None);
        for (text, says) in [
            ("clock_offset = \"soon\"\n", "write it like \"30s\""),
            ("clock_offset = \"3d\"\n", "more than a day"),
            ("header_timeout = \"0s\"\n", "from \"1ms\" to \"1h\""),
            ("body_timeout = \"fast\"\n", "not a duration"),
            ("max_connections = 0\n", "at least 1 connection"),
            ("lease_ttl = \"500ms\"\n", "from \"1s\" to \"1h\""),
            ("lease_ttl = \"long\"\n", "write it like \"30s\""),
            (
                "[kinds.\"k\"]\nurl = \"http://127.0.0.1:1/\"\nlease_key = \"c:{id\"\n",
                "never closed",
            ),
            ("[kinds.\"k\"]\nslots = 2\n", "slots needs lease_key"),
            (
                "[kinds.\"k\"]\nurl = \"http://127.0.0.1:1/\"\nlease_key = \"c\"\nslots = 0\n",
                "give 1 to 10000",
            ),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.0.contains(says), "{text}: {e}");
        }
        let d = parse("header_timeout = \"2s\"\nmax_connections = 9\n")
            .unwrap()
            .front_door()
            .unwrap();
        assert_eq!(
            (d.header_timeout, d.body_timeout, d.max_connections),
            (Duration::from_secs(2), Duration::from_secs(30), 9)
        );
        let o = parse("lease_ttl = \"3s\"\n")
            .unwrap()
            .leases(onus::Options::default())
            .unwrap();
        assert_eq!(
            (o.lease_ttl, o.heartbeat_interval, o.rescue_interval),
            (
                Duration::from_secs(3),
                Duration::from_millis(200),
                Duration::from_millis(500)
            )
        );
        assert!(o.validate().is_ok());
        let o = parse("").unwrap().leases(onus::Options::default()).unwrap();
        assert_eq!(o.lease_ttl, onus::Options::default().lease_ttl);
    }
}
