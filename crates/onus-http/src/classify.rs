//! One classification of an outbound call's result, the same for every caller:
//!
//! | result | class |
//! |---|---|
//! | 2xx | success |
//! | 429 or 503 with `Retry-After` (seconds or an HTTP date) | snooze until then, capped, pausing the job's lease key |
//! | 408, 429 without `Retry-After`, 5xx, 3xx, timeout, connection or TLS failure | retryable |
//! | any other 4xx | permanent |
//! | a refused (SSRF) address | permanent, nothing sent |
//!
//! A class only *names* what happened; the job layer decides when a retryable call runs again.

use std::time::Duration;

use onus::{JobError, JobResult, Timestamp};

/// What an outbound call's result means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Class {
    /// It worked.
    Success,
    /// The other side asked to be left alone until this time.
    Snooze {
        /// When to call again.
        until: Timestamp,
        /// Why (status and header).
        reason: String,
    },
    /// A transient failure.
    Retryable(String),
    /// Trying again cannot help.
    Permanent(String),
}

impl Class {
    /// The handler's answer for this class.
    pub fn into_result(self) -> JobResult {
        match self {
            Class::Success => Ok(()),
            // The answer is the upstream's as a whole: the job's lease key (an endpoint's, a
            // customer's) is paused until then, so the key's other jobs wait without asking.
            Class::Snooze { until, reason } => {
                Err(JobError::snooze_until(until, reason).pausing_key())
            }
            Class::Retryable(m) => Err(JobError::retryable(m)),
            Class::Permanent(m) => Err(JobError::discard(m)),
        }
    }

    /// This class with the response's first characters after a failure's reason (`HTTP 500;
    /// response: {"error": "database down"}`, see [`onus::job::RESPONSE_QUOTE`]), so a job's
    /// history says what the other side answered. A snooze's reason stays as it is (it names the
    /// `Retry-After` it obeys).
    pub fn with_excerpt(self, excerpt: &str) -> Class {
        let quoted = onus::job::shorten(excerpt, REASON_EXCERPT);
        if quoted.is_empty() {
            return self;
        }
        match self {
            Class::Retryable(r) => {
                Class::Retryable(format!("{r}{}{quoted}", onus::job::RESPONSE_QUOTE))
            }
            Class::Permanent(r) => {
                Class::Permanent(format!("{r}{}{quoted}", onus::job::RESPONSE_QUOTE))
            }
            other => other,
        }
    }

    /// Whether the call worked.
    pub fn is_success(&self) -> bool {
        matches!(self, Class::Success)
    }

    /// The handler's answer for this class for `job`: like [`Class::into_result`], but a snooze
    /// after [`MAX_SNOOZES_PER_ATTEMPT`] `Retry-After` snoozes in a row becomes a retryable
    /// failure. Only snoozes that came from `Retry-After` count: waiting for a busy lease key or a
    /// rate window neither counts nor breaks the row.
    pub fn into_job_result(self, job: &onus::Job) -> JobResult {
        if let Class::Snooze { reason, .. } = &self {
            let in_a_row = job
                .errors
                .iter()
                .rev()
                .take_while(|e| e.class == onus::EntryClass::Snooze)
                .filter(|e| is_retry_after(&e.message))
                .count();
            if in_a_row >= MAX_SNOOZES_PER_ATTEMPT {
                return Err(JobError::retryable(format!(
                    "{reason}, {in_a_row} times in a row: counted as a failed attempt"
                )));
            }
        }
        self.into_result()
    }
}

/// The most characters of a response quoted in a failure's reason.
pub const REASON_EXCERPT: usize = 200;

/// The shortest snooze a `Retry-After` can ask for.
pub const MIN_SNOOZE: Duration = Duration::from_secs(1);

/// How many `Retry-After` snoozes one attempt may take in a row; past that the answer counts as a
/// retryable failure, spending an attempt. Snoozes spend none, so without this bound a server
/// answering `429 Retry-After: 1` forever would get a request every second forever.
pub const MAX_SNOOZES_PER_ATTEMPT: usize = 5;

/// How every `Retry-After` snooze's reason starts (see [`is_retry_after`]).
const RETRY_AFTER_REASON: &str = "Retry-After: ";

/// Whether a snooze's reason says it came from a `Retry-After` header.
pub fn is_retry_after(reason: &str) -> bool {
    reason.starts_with("HTTP ") && reason.contains(RETRY_AFTER_REASON)
}

/// Parses `Retry-After`: delay seconds, or an HTTP date (a date in the past means now). A delay
/// too large to count is the longest delay (the caller caps it), not an absent header.
pub fn retry_after(value: &str, now: Timestamp) -> Option<Duration> {
    let v = value.trim();
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        return Some(v.parse::<u64>().map_or(Duration::MAX, Duration::from_secs));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    let at: Timestamp = at.into();
    Some((at - now).to_std().unwrap_or(Duration::ZERO))
}

/// Classifies a response by its status and `Retry-After` header; a snooze is capped at `cap`.
pub fn classify_status(
    status: u16,
    retry_after_header: Option<&str>,
    now: Timestamp,
    cap: Duration,
) -> Class {
    match status {
        200..=299 => Class::Success,
        429 | 503 => match retry_after_header.and_then(|h| retry_after(h, now)) {
            Some(d) => {
                let d = d.max(MIN_SNOOZE).min(cap.max(MIN_SNOOZE));
                let until = chrono::TimeDelta::from_std(d)
                    .ok()
                    .and_then(|d| now.checked_add_signed(d))
                    .unwrap_or(chrono::DateTime::<chrono::Utc>::MAX_UTC);
                Class::Snooze {
                    until,
                    reason: format!(
                        "HTTP {status} with {RETRY_AFTER_REASON}{}",
                        retry_after_header.unwrap_or("").trim()
                    ),
                }
            }
            None => Class::Retryable(format!("HTTP {status}")),
        },
        408 => Class::Retryable("HTTP 408 request timeout".into()),
        300..=399 => Class::Retryable(format!("HTTP {status}: redirects are not followed")),
        400..=499 => Class::Permanent(format!("HTTP {status}")),
        500..=599 => Class::Retryable(format!("HTTP {status}")),
        _ => Class::Retryable(format!("HTTP {status}: unexpected status")),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_failure_quotes_the_start_of_the_answer_and_a_snooze_does_not() {
        let now = chrono::Utc::now();
        assert_eq!(
            Class::Retryable("HTTP 500".into()).with_excerpt("  {\"error\":\n  \"down\"} "),
            Class::Retryable("HTTP 500; response: {\"error\": \"down\"}".into())
        );
        assert_eq!(
            Class::Permanent("HTTP 404".into()).with_excerpt(""),
            Class::Permanent("HTTP 404".into())
        );
        let long = Class::Retryable("HTTP 502".into()).with_excerpt(&"word ".repeat(100));
        let Class::Retryable(m) = long else { panic!() };
        assert!(
            m.chars().count() <= "HTTP 502; response: ".len() + REASON_EXCERPT && m.ends_with('…'),
            "{m}"
        );
        let snooze = Class::Snooze {
            until: now,
            reason: "HTTP 429 with Retry-After: 5".into(),
        };
        assert_eq!(snooze.clone().with_excerpt("slow down"), snooze);
    }

    use super::*;

    fn now() -> Timestamp {
        "2026-03-01T00:00:00Z".parse().unwrap()
    }

    #[test]
    fn the_table() {
        let cap = Duration::from_secs(10 * 3600);
        let c = |s, h| classify_status(s, h, now(), cap);
        assert_eq!(c(200, None), Class::Success);
        assert_eq!(c(204, None), Class::Success);
        for s in [408, 429, 500, 502, 503, 504, 301, 302, 307] {
            assert!(matches!(c(s, None), Class::Retryable(_)), "{s}");
        }
        for s in [400, 401, 403, 404, 405, 409, 410, 413, 422] {
            assert!(matches!(c(s, None), Class::Permanent(_)), "{s}");
        }
        // Retry-After in seconds and as an HTTP date.
        let until = |cl: Class| match cl {
            Class::Snooze { until, .. } => until,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            until(c(429, Some("2"))),
            now() + chrono::TimeDelta::seconds(2)
        );
        assert_eq!(
            until(c(503, Some("Sun, 01 Mar 2026 00:01:00 GMT"))),
            now() + chrono::TimeDelta::seconds(60)
        );
        assert_eq!(
            until(c(503, Some("Sat, 28 Feb 2026 00:00:00 GMT"))),
            now() + chrono::TimeDelta::seconds(1),
            "a past date means now, at least a second out"
        );
        assert_eq!(
            until(c(429, Some("0"))),
            now() + chrono::TimeDelta::seconds(1),
            "never less than a second"
        );
        // Capped.
        assert_eq!(
            until(c(429, Some("999999"))),
            now() + chrono::TimeDelta::hours(10)
        );
        // A delay too large for any integer is capped, not ignored; so is a huge cap.
        assert_eq!(
            until(c(429, Some("99999999999999999999999"))),
            now() + chrono::TimeDelta::hours(10)
        );
        assert!(matches!(
            classify_status(429, Some("5"), now(), Duration::MAX),
            Class::Snooze { .. }
        ));
        assert_eq!(
            until(classify_status(
                429,
                Some("99999999999999999999999"),
                now(),
                Duration::MAX
            )),
            chrono::DateTime::<chrono::Utc>::MAX_UTC
        );
        // Retry-After only counts with 429 and 503; garbage is as if absent.
        assert!(matches!(c(500, Some("5")), Class::Retryable(_)));
        assert!(matches!(c(429, Some("soon")), Class::Retryable(_)));
    }

    #[test]
    fn regression_lease_waits_do_not_count_against_retry_after() {
        let snooze = |message: &str| onus::HistoryEntry {
            at: now(),
            attempt: 1,
            class: onus::EntryClass::Snooze,
            message: message.into(),
        };
        let mut job: onus::Job = serde_json::from_value(serde_json::json!({
            "id": 1, "kind": "webhook.deliver", "queue": "default", "args": {}, "priority": 0,
            "state": "running", "attempt": 1, "max_attempts": 18, "run_at": now(),
            "created_at": now(), "attempted_at": null, "finalized_at": null, "errors": [],
            "snoozes": 0, "discard_reason": null, "unique_key": null, "lease_key": "ep",
            "lease_owner": "me", "lease_expires_at": null, "cancel_requested": false
        }))
        .unwrap();
        let cap = Duration::from_secs(10 * 3600);
        let answer = || classify_status(429, Some("30"), now(), cap);
        // Five waits behind a busy endpoint, then the first real 429: a snooze, not an attempt.
        job.errors = (0..5)
            .map(|_| snooze("lease key webhook-endpoint:ep busy (1 of 1 slots held)"))
            .collect();
        assert!(matches!(
            answer().into_job_result(&job),
            Err(JobError::Snooze { .. })
        ));
        // Five Retry-After snoozes in a row, with waits between them: the sixth is an attempt.
        job.errors = (0..5)
            .flat_map(|_| {
                [
                    snooze("HTTP 429 with Retry-After: 30"),
                    snooze("lease key webhook-endpoint:ep busy (1 of 1 slots held)"),
                ]
            })
            .collect();
        assert!(matches!(
            answer().into_job_result(&job),
            Err(JobError::Retryable(_))
        ));
        // A failed attempt ends the row.
        job.errors.push(onus::HistoryEntry {
            class: onus::EntryClass::Error,
            ..snooze("HTTP 500")
        });
        assert!(matches!(
            answer().into_job_result(&job),
            Err(JobError::Snooze { .. })
        ));
    }
}
