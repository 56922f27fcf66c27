//! `[retention]`: how long finished jobs are kept.

use serde::Deserialize;

use super::{duration, ConfigError};

/// `[retention]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionConfig {
    /// Completed jobs are kept this long (`"1d"`).
    pub completed: Option<String>,
    /// Discarded and cancelled jobs are kept this long (`"7d"`).
    pub discarded: Option<String>,
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
