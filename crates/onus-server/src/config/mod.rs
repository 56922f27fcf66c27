//! Configuration: `onus.toml` (or the file `ONUS_CONFIG` names), then `ONUS_*` environment
//! variables and command-line flags on top.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

mod http;
mod kinds;
mod mail;
mod panel;
mod periodic;
mod retention;
mod server;
mod webhooks;

pub use self::http::HttpSection;
pub use kinds::{KindConfig, RateConfig};
pub use mail::{DkimSection, LimitSection, MailSection};
pub use panel::PanelConfig;
pub use periodic::PeriodicConfig;
pub use retention::RetentionConfig;
pub use server::{encryption_key, ByteSize, FrontDoor};
pub use webhooks::WebhooksConfig;

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
    fn every_toml_example_in_the_readme_parses() {
        let readme = include_str!("../../../../README.md");
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
}
