//! `[webhooks]`: webhook delivery settings.

use serde::Deserialize;

use super::{duration, ConfigError};

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
