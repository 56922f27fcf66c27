//! `[panel]`: the tasks panel.

use serde::Deserialize;

use super::ConfigError;

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
