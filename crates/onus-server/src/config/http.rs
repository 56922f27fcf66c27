//! `[http]`: the outbound HTTP client of `http.request` jobs.

use serde::Deserialize;

use super::{duration, ConfigError};

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
