//! Admission before an attempt starts, as far as the database holds it: the rate windows a job
//! takes a use of once it holds its lease key.

use crate::limits::{RateWindow, WhenSpent};

/// Takes one use of each `(limit, key)` at `now`, all or none: when any window is spent nothing
/// is taken and the error is the job's answer (a snooze to the next window, or a drop; a spent
/// limit that drops wins).
pub(crate) async fn take_rates(
    store: &dyn crate::store::Store,
    now: crate::Timestamp,
    limits: &[(&RateWindow, &str)],
) -> Result<(), crate::JobError> {
    use crate::store::{RateAsk, RateDecision};
    use crate::JobError;
    if limits.is_empty() {
        return Ok(());
    }
    let asks: Vec<RateAsk> = limits
        .iter()
        .map(|(l, key)| RateAsk {
            key: format!("{}:{key}", l.name),
            max: l.max,
            window: l.window,
        })
        .collect();
    let answers = store
        .take_rates(&asks, now)
        .await
        .map_err(|e| JobError::Retryable(Box::new(e)))?;
    let spent: Vec<(&RateWindow, &str, crate::Timestamp)> = limits
        .iter()
        .zip(&answers)
        .filter_map(|((l, k), a)| match a {
            RateDecision::Spent(next) => Some((*l, *k, *next)),
            RateDecision::Taken { .. } => None,
        })
        .collect();
    let say = |l: &RateWindow, key: &str| {
        format!(
            "rate window {} spent for {key} ({} per {})",
            l.name,
            l.max,
            crate::policy::human(l.window)
        )
    };
    if let Some((l, key, _)) = spent
        .iter()
        .find(|(l, _, _)| l.when_spent == WhenSpent::Drop)
    {
        return Err(JobError::Drop(format!(
            "{}: dropped on purpose",
            say(l, key)
        )));
    }
    match spent.iter().max_by_key(|(_, _, next)| *next) {
        None => Ok(()),
        Some((l, key, next)) => Err(JobError::snooze_until(*next, say(l, key))),
    }
}
