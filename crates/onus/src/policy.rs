//! Retry policies: plain data declared on a job kind.
//!
//! This module (with [`crate::outcome`]) is the only place in Onus that knows backoff, jitter and
//! retry timing. A [`Policy`] says how many attempts a job gets, how long to wait after each failed
//! one, how much jitter to add, how long one attempt may take, and whether exhaustion raises an
//! alert. Nothing outside the job layer may decide when to try again.

use std::fmt;
use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Serialize};

/// How long to wait after a failed attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged, deny_unknown_fields)]
pub enum Backoff {
    /// `initial * factor^(n-1)` after the n-th failed attempt, never more than `cap`.
    Exponential {
        /// Delay after the first failure.
        #[serde(with = "duration_str")]
        initial: Duration,
        /// Growth per attempt (at least 1).
        factor: f64,
        /// The longest delay.
        #[serde(with = "duration_str")]
        cap: Duration,
    },
    /// An explicit list of delays; the last one repeats.
    Schedule {
        /// Delay after the first, second, ... failure.
        #[serde(with = "duration_list")]
        schedule: Vec<Duration>,
    },
    /// No wait: the next attempt is due at once (with `max_attempts = 1`, there is none).
    None(NoneTag),
}

/// The word `"none"` in configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NoneTag {
    /// No backoff.
    None,
}

impl Backoff {
    /// Exponential backoff.
    pub fn exponential(initial: Duration, factor: f64, cap: Duration) -> Self {
        Backoff::Exponential {
            initial,
            factor,
            cap,
        }
    }

    /// An explicit schedule whose last step repeats.
    pub fn schedule(steps: impl Into<Vec<Duration>>) -> Self {
        Backoff::Schedule {
            schedule: steps.into(),
        }
    }

    /// No backoff.
    pub fn none() -> Self {
        Backoff::None(NoneTag::None)
    }

    /// The nominal (un-jittered) delay after the `failed_attempt`-th failed attempt (1-based).
    pub fn nominal_delay(&self, failed_attempt: u32) -> Duration {
        let n = failed_attempt.max(1);
        match self {
            Backoff::Exponential {
                initial,
                factor,
                cap,
            } => {
                let secs =
                    initial.as_secs_f64() * factor.powi(n.saturating_sub(1).min(1024) as i32);
                if !secs.is_finite() || secs >= cap.as_secs_f64() {
                    *cap
                } else {
                    Duration::try_from_secs_f64(secs).unwrap_or(*cap)
                }
            }
            Backoff::Schedule { schedule } => {
                let i = (n as usize - 1).min(schedule.len().saturating_sub(1));
                schedule.get(i).copied().unwrap_or(Duration::ZERO)
            }
            Backoff::None(_) => Duration::ZERO,
        }
    }
}

impl fmt::Display for Backoff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Backoff::Exponential {
                initial,
                factor,
                cap,
            } => write!(
                f,
                "exponential: {}, x{} each time, capped at {}",
                human(*initial),
                factor,
                human(*cap)
            ),
            Backoff::Schedule { schedule } => {
                let steps: Vec<String> = schedule.iter().map(|d| human(*d)).collect();
                write!(f, "schedule: {} (the last step repeats)", steps.join(", "))
            }
            Backoff::None(_) => write!(f, "none"),
        }
    }
}

/// A job kind's retry policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Policy {
    /// Attempts a job gets before it is discarded as exhausted (at least 1).
    pub max_attempts: u32,
    /// The wait after each failed attempt.
    pub backoff: Backoff,
    /// Jitter fraction applied to every delay: 0.1 means +/-10%.
    pub jitter: f64,
    /// How long one attempt may run before it counts as a failed attempt.
    #[serde(with = "duration_str")]
    pub timeout: Duration,
    /// Whether an exhausted job raises an alert.
    pub alert_on_exhaustion: bool,
}

/// The longest duration a policy may name (a backoff step or cap, a timeout): 365 days. Longer
/// ones are refused at validation, so no schedule arithmetic can overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 86_400);

/// The most attempts a policy may allow.
pub const MAX_ATTEMPTS: u32 = 10_000;

/// The names of the built-in presets.
pub const PRESETS: [&str; 4] = ["default", "mail", "webhook", "periodic"];

const MIN: u64 = 60;
const HOUR: u64 = 3600;

impl Default for Policy {
    fn default() -> Self {
        Policy::preset_default()
    }
}

impl Policy {
    /// `default`: 10 attempts, 1 s doubling up to 15 min, alert on exhaustion.
    pub fn preset_default() -> Self {
        Policy {
            max_attempts: 10,
            backoff: Backoff::exponential(
                Duration::from_secs(1),
                2.0,
                Duration::from_secs(15 * MIN),
            ),
            jitter: 0.1,
            timeout: Duration::from_secs(60),
            alert_on_exhaustion: true,
        }
    }

    /// `mail`: 8 attempts, 20 s times 3 each time (about 6 h in all), alert on exhaustion.
    pub fn preset_mail() -> Self {
        Policy {
            max_attempts: 8,
            backoff: Backoff::exponential(
                Duration::from_secs(20),
                3.0,
                Duration::from_secs(24 * HOUR),
            ),
            jitter: 0.1,
            timeout: Duration::from_secs(60),
            alert_on_exhaustion: true,
        }
    }

    /// `webhook`: 18 attempts, 5 s, 5 min, 30 min, 2 h, 5 h, then 10 h (about 5.3 days); no alert.
    pub fn preset_webhook() -> Self {
        Policy {
            max_attempts: 18,
            backoff: Backoff::schedule(vec![
                Duration::from_secs(5),
                Duration::from_secs(5 * MIN),
                Duration::from_secs(30 * MIN),
                Duration::from_secs(2 * HOUR),
                Duration::from_secs(5 * HOUR),
                Duration::from_secs(10 * HOUR),
            ]),
            jitter: 0.1,
            timeout: Duration::from_secs(30),
            alert_on_exhaustion: false,
        }
    }

    /// `periodic`: one attempt, no retry; the next period runs instead.
    pub fn preset_periodic() -> Self {
        Policy {
            max_attempts: 1,
            backoff: Backoff::none(),
            jitter: 0.1,
            timeout: Duration::from_secs(5 * MIN),
            alert_on_exhaustion: false,
        }
    }

    /// A preset by name: `default`, `mail`, `webhook` or `periodic`.
    pub fn preset(name: &str) -> Option<Self> {
        match name {
            "default" => Some(Self::preset_default()),
            "mail" => Some(Self::preset_mail()),
            "webhook" => Some(Self::preset_webhook()),
            "periodic" => Some(Self::preset_periodic()),
            _ => None,
        }
    }

    /// Checks that the policy makes sense; the error says what to fix.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.max_attempts == 0 || self.max_attempts > MAX_ATTEMPTS {
            return Err(PolicyError(format!(
                "max_attempts must be from 1 to {MAX_ATTEMPTS}; got {}",
                self.max_attempts
            )));
        }
        let too_long = |what: &str, d: Duration| {
            (d > MAX_DURATION).then(|| {
                PolicyError(format!(
                    "{what} must be at most 365 days, such as \"10h\" or \"7d\"; got {}",
                    human(d)
                ))
            })
        };
        let mut durations = vec![("timeout", self.timeout)];
        match &self.backoff {
            Backoff::Exponential { initial, cap, .. } => {
                durations.push(("backoff initial", *initial));
                durations.push(("backoff cap", *cap));
            }
            Backoff::Schedule { schedule } => {
                durations.extend(schedule.iter().map(|d| ("a backoff schedule step", *d)));
            }
            Backoff::None(_) => {}
        }
        if let Some(e) = durations.into_iter().find_map(|(w, d)| too_long(w, d)) {
            return Err(e);
        }
        if !(0.0..1.0).contains(&self.jitter) {
            return Err(PolicyError(format!(
                "jitter must be a fraction from 0 up to (not including) 1, such as 0.1 for +/-10%; got {}",
                self.jitter
            )));
        }
        if self.timeout.is_zero() {
            return Err(PolicyError(
                "timeout must be longer than zero, such as \"30s\"".into(),
            ));
        }
        match &self.backoff {
            Backoff::Exponential {
                factor,
                initial,
                cap,
            } => {
                if !factor.is_finite() || *factor < 1.0 {
                    return Err(PolicyError(format!(
                        "backoff factor must be 1 or more; got {factor}"
                    )));
                }
                if cap < initial {
                    return Err(PolicyError(format!(
                        "backoff cap ({}) must not be shorter than initial ({})",
                        human(*cap),
                        human(*initial)
                    )));
                }
            }
            Backoff::Schedule { schedule } if schedule.is_empty() => {
                return Err(PolicyError(
                    "backoff schedule must have at least one step, such as [\"5s\", \"5m\"]".into(),
                ));
            }
            _ => {}
        }
        Ok(())
    }

    /// The nominal delay after the `failed_attempt`-th failed attempt.
    pub fn nominal_delay(&self, failed_attempt: u32) -> Duration {
        self.backoff.nominal_delay(failed_attempt)
    }

    /// The delay after the `failed_attempt`-th failed attempt, with jitter drawn from `rng`:
    /// always within `nominal * (1 +/- jitter)`.
    pub fn delay_with<R: Rng + ?Sized>(&self, failed_attempt: u32, rng: &mut R) -> Duration {
        let nominal = self.nominal_delay(failed_attempt);
        jittered(nominal, self.jitter, rng)
    }

    /// The delay after the `failed_attempt`-th failed attempt, with fresh jitter.
    pub fn delay(&self, failed_attempt: u32) -> Duration {
        self.delay_with(failed_attempt, &mut rand::thread_rng())
    }

    /// When each attempt would run, relative to the first, if every attempt failed.
    pub fn timeline(&self) -> Timeline {
        let mut steps = Vec::with_capacity(self.max_attempts.min(MAX_ATTEMPTS) as usize);
        let mut offset = Duration::ZERO;
        for attempt in 1..=self.max_attempts.min(MAX_ATTEMPTS) {
            let wait = if attempt == 1 {
                Duration::ZERO
            } else {
                self.nominal_delay(attempt - 1)
            };
            offset = offset.saturating_add(wait);
            steps.push(TimelineStep {
                attempt,
                wait,
                offset,
            });
        }
        Timeline {
            steps,
            jitter: self.jitter,
        }
    }

    /// Applies configuration overrides on top of this policy.
    pub fn with_overrides(mut self, o: &PolicyOverride) -> Result<Self, PolicyError> {
        if let Some(p) = &o.preset {
            self = Policy::preset(p).ok_or_else(|| {
                PolicyError(format!(
                    "unknown preset {p:?}; the presets are {}",
                    PRESETS.join(", ")
                ))
            })?;
        }
        if let Some(v) = o.max_attempts {
            self.max_attempts = v;
        }
        if let Some(v) = &o.backoff {
            self.backoff = v.clone();
        }
        if let Some(v) = o.jitter {
            self.jitter = v;
        }
        if let Some(v) = o.timeout {
            self.timeout = v;
        }
        if let Some(v) = o.alert_on_exhaustion {
            self.alert_on_exhaustion = v;
        }
        self.validate()?;
        Ok(self)
    }
}

/// A policy that makes no sense, with what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid policy: {0}")]
pub struct PolicyError(pub String);

/// Per-kind policy overrides from configuration (`[kinds."<kind>".policy]`). Unset fields keep the
/// kind's declared value.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyOverride {
    /// Start from this preset instead of the kind's declared policy.
    pub preset: Option<String>,
    /// Attempts before exhaustion.
    pub max_attempts: Option<u32>,
    /// The backoff.
    pub backoff: Option<Backoff>,
    /// Jitter fraction.
    pub jitter: Option<f64>,
    /// Timeout of one attempt.
    #[serde(default, with = "opt_duration_str")]
    pub timeout: Option<Duration>,
    /// Alert on exhaustion.
    pub alert_on_exhaustion: Option<bool>,
}

/// One attempt in a [`Timeline`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TimelineStep {
    /// 1-based attempt number.
    pub attempt: u32,
    /// The nominal wait before this attempt (zero for the first).
    #[serde(with = "duration_str")]
    pub wait: Duration,
    /// The nominal time since the first attempt.
    #[serde(with = "duration_str")]
    pub offset: Duration,
}

/// The schedule a policy implies when every attempt fails.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Timeline {
    /// One step per attempt.
    pub steps: Vec<TimelineStep>,
    /// The jitter fraction applied to each wait.
    pub jitter: f64,
}

impl Timeline {
    /// Time from the first attempt to the last.
    pub fn span(&self) -> Duration {
        self.steps.last().map(|s| s.offset).unwrap_or_default()
    }
}

impl fmt::Display for Timeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:>7}  {:>14}  {:>16}",
            "attempt", "wait before", "since first"
        )?;
        for s in &self.steps {
            writeln!(
                f,
                "{:>7}  {:>14}  {:>16}",
                s.attempt,
                human(s.wait),
                human(s.offset)
            )?;
        }
        write!(
            f,
            "total span: {} = {} s = {:.2} h = {:.2} days (nominal; each wait +/-{:.0}% jitter)",
            human(self.span()),
            self.span().as_secs(),
            self.span().as_secs_f64() / 3600.0,
            self.span().as_secs_f64() / 86400.0,
            self.jitter * 100.0
        )
    }
}

/// `d * (1 + u)` with `u` drawn uniformly from `[-jitter, +jitter]`.
pub fn jittered<R: Rng + ?Sized>(d: Duration, jitter: f64, rng: &mut R) -> Duration {
    if jitter.is_nan() || jitter <= 0.0 || jitter.is_infinite() || d.is_zero() {
        return d;
    }
    let u: f64 = rng.gen_range(-jitter..=jitter);
    // Saturating: a delay that would overflow is the longest one, never a panic.
    Duration::try_from_secs_f64((d.as_secs_f64() * (1.0 + u)).max(0.0)).unwrap_or(Duration::MAX)
}

/// A duration in words, rounded to the millisecond: `1h 30m`, `5s`, `250ms`.
pub fn human(d: Duration) -> String {
    let d = Duration::from_millis(d.as_millis() as u64);
    if d.is_zero() {
        return "0s".into();
    }
    humantime::format_duration(d).to_string()
}

pub(crate) mod duration_str {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::human(*d))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        parse(&s).map_err(serde::de::Error::custom)
    }

    pub fn parse(s: &str) -> Result<Duration, String> {
        humantime::parse_duration(s.trim()).map_err(|e| {
            format!("{s:?} is not a duration ({e}); write it like \"250ms\", \"5s\", \"15m\", \"2h\" or \"1d\"")
        })
    }
}

pub(crate) mod opt_duration_str {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => super::duration_str::serialize(d, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let s = Option::<String>::deserialize(d)?;
        s.map(|s| super::duration_str::parse(&s).map_err(serde::de::Error::custom))
            .transpose()
    }
}

mod duration_list {
    use std::time::Duration;

    use serde::ser::SerializeSeq;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[Duration], s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(v.len()))?;
        for d in v {
            seq.serialize_element(&super::human(*d))?;
        }
        seq.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Duration>, D::Error> {
        let v = Vec::<String>::deserialize(d)?;
        v.iter()
            .map(|s| super::duration_str::parse(s).map_err(serde::de::Error::custom))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preset_spans_match_the_seed() {
        assert_eq!(
            Policy::preset_default().timeline().span(),
            Duration::from_secs(511)
        );
        let mail = Policy::preset_mail().timeline().span().as_secs_f64() / 3600.0;
        assert!((mail - 6.07).abs() < 0.01, "mail spans {mail} h");
        let webhook = Policy::preset_webhook().timeline().span().as_secs_f64() / 86400.0;
        assert!((webhook - 5.3).abs() < 0.05, "webhook spans {webhook} days");
        assert_eq!(Policy::preset_webhook().timeline().steps.len(), 18);
        assert_eq!(Policy::preset_periodic().timeline().span(), Duration::ZERO);
    }

    #[test]
    fn regression_huge_durations_are_refused_and_never_panic() {
        let huge = Duration::from_secs(u64::MAX);
        let p = Policy {
            backoff: Backoff::exponential(Duration::from_secs(1), 2.0, huge),
            ..Policy::preset_default()
        };
        let e = p.validate().unwrap_err().to_string();
        assert!(e.contains("backoff cap must be at most 365 days"), "{e}");
        // Unvalidated, the arithmetic still saturates instead of panicking.
        let p = Policy {
            max_attempts: 100,
            backoff: Backoff::schedule(vec![huge]),
            ..Policy::preset_default()
        };
        assert_eq!(p.timeline().span(), Duration::MAX);
        let _ = p.delay(5);
        let p = Policy {
            max_attempts: u32::MAX,
            jitter: f64::NAN,
            ..Policy::preset_default()
        };
        assert!(p.validate().is_err());
        assert_eq!(p.timeline().steps.len(), MAX_ATTEMPTS as usize);
        let _ = p.delay(3);
        let bad = PolicyOverride {
            timeout: Some(Duration::from_secs(400 * 86_400)),
            ..Default::default()
        };
        let e = Policy::preset_default().with_overrides(&bad).unwrap_err();
        assert!(
            e.to_string().contains("timeout must be at most 365 days"),
            "{e}"
        );
    }

    #[test]
    fn overrides_parse_from_toml_shapes() {
        let o: PolicyOverride = serde_json::from_value(serde_json::json!({
            "max_attempts": 3, "backoff": {"schedule": ["5s", "5m"]}, "jitter": 0.2, "timeout": "10s"
        }))
        .unwrap();
        let p = Policy::preset_default().with_overrides(&o).unwrap();
        assert_eq!(p.max_attempts, 3);
        assert_eq!(p.nominal_delay(1), Duration::from_secs(5));
        assert_eq!(p.nominal_delay(9), Duration::from_secs(300));
        let o: PolicyOverride = serde_json::from_value(serde_json::json!({
            "backoff": {"initial": "1s", "factor": 2, "cap": "15m"}
        }))
        .unwrap();
        assert!(matches!(o.backoff, Some(Backoff::Exponential { .. })));
        let o: PolicyOverride =
            serde_json::from_value(serde_json::json!({"backoff": "none"})).unwrap();
        assert_eq!(o.backoff, Some(Backoff::none()));
        let bad = PolicyOverride {
            jitter: Some(1.5),
            ..Default::default()
        };
        let err = Policy::preset_default().with_overrides(&bad).unwrap_err();
        assert!(err.to_string().contains("jitter"), "{err}");
    }
}
