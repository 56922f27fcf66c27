//! Endpoint health: when failures disable an endpoint.
//!
//! Any non-success sets `failing_since` (unless set) and `last_failure_at`; a failure more than
//! `failure_reset` after the previous one starts a new run of failures, so one stale failure
//! cannot disable an endpoint; one success clears both. A 410, or `disable_after` of continuous
//! failure, disables the endpoint, and its pending deliveries are discarded.

use std::time::Duration;

use onus::Timestamp;

/// Why an endpoint is disabled after a failure, if it is.
pub(crate) fn disable_reason(
    status: Option<u16>,
    failing_since: Timestamp,
    now: Timestamp,
    disable_after: Duration,
) -> Option<String> {
    if status == Some(410) {
        return Some("gone: the endpoint answered 410".to_string());
    }
    let failing_for = (now - failing_since).to_std().unwrap_or_default();
    (failing_for >= disable_after).then(|| {
        format!(
            "failing continuously for {}",
            onus::policy::human(disable_after)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap_or_default()
    }

    #[test]
    fn a_410_disables_at_once_and_a_long_failure_run_disables() {
        let five_days = Duration::from_secs(5 * 86_400);
        let start = at("2026-03-01T00:00:00Z");
        assert!(
            disable_reason(Some(410), start, start, five_days).is_some_and(|r| r.contains("410"))
        );
        assert_eq!(
            disable_reason(Some(500), start, at("2026-03-05T23:59:59Z"), five_days),
            None
        );
        assert_eq!(
            disable_reason(None, start, at("2026-03-06T00:00:00Z"), five_days).as_deref(),
            Some("failing continuously for 5days")
        );
    }
}
