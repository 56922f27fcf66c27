//! `[kinds."<kind>"]`: per-kind policy, push, lease and rate settings.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use super::{duration, ConfigError};

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
