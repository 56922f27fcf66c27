//! The top-level keys, before any `[section]`: body size, front door, leases, clock, encryption key.

use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, FileConfig};

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
            "encryption_key_file = {:?}: cannot read it ({e}); `onus encryption generate > {}` makes one",
            path.display(),
            path.display()
        ))
    })?;
    onus_webhooks::crypto::Key::from_base64(&text)
        .map(Some)
        .map_err(|e| ConfigError(format!("encryption_key_file = {:?}: {e}", path.display())))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse;

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
