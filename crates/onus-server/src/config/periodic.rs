//! `[periodic."<name>"]`: jobs enqueued on a schedule.

use serde::Deserialize;

use super::ConfigError;

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

#[cfg(test)]
mod tests {
    use crate::config::parse;

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
}
