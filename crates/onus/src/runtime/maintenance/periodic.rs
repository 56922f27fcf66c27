//! Periodic jobs, as the leader enqueues them: schedules registered, due periods found and
//! enqueued once each.

use crate::job::NewJob;
use crate::runtime::Shared;

pub(super) async fn register_periodics(shared: &Shared) -> bool {
    let now = shared.clock.now();
    for p in &shared.periodics {
        let next = p.schedule.next_after(now);
        if let Err(e) = shared
            .store
            .upsert_periodic(&p.name, &p.job.kind, &p.schedule.describe(), next)
            .await
        {
            shared.outage.report("cannot register periodic jobs", &e);
            return false;
        }
    }
    true
}

pub(super) async fn enqueue_due_periods(shared: &Shared) {
    if shared.periodics.is_empty() {
        return;
    }
    let rows = match shared.store.list_periodic().await {
        Ok(r) => r,
        Err(e) => {
            shared.outage.report("cannot read periodic schedules", &e);
            return;
        }
    };
    let now = shared.clock.now();
    for p in &shared.periodics {
        let Some(row) = rows.iter().find(|r| r.name == p.name) else {
            continue;
        };
        let Some(first) = row.next_run_at else {
            continue;
        };
        if first > now {
            continue;
        }
        if row.paused_at.is_some() {
            continue; // paused: nothing is enqueued; a resume moves it to its next period
        }
        let periods = due_periods(
            &p.schedule,
            first,
            now,
            shared.options.periodic_catch_up,
            p.catch_up,
        );
        if periods.is_empty() {
            // Every missed period skipped: the schedule goes on from its next one.
            let next = p.schedule.next_after(now);
            if let Err(e) = shared.store.skip_periods(&p.name, next).await {
                shared.outage.report("cannot enqueue periodic jobs", &e);
            }
        }
        for period in periods {
            enqueue_period(shared, p, period).await;
        }
    }
}

/// The periods to enqueue when `first` (and maybe more) have come due by `now`, oldest first:
/// each one that came due within the last `window` (so a leader failover skips none), and of the
/// older ones, missed while nothing ran, what `catch_up` says: none, the latest (only when no
/// recent one runs: one run catches up), or each, at most its limit (the latest ones).
pub(crate) fn due_periods(
    schedule: &crate::runtime::Schedule,
    first: crate::Timestamp,
    now: crate::Timestamp,
    window: std::time::Duration,
    catch_up: crate::runtime::CatchUp,
) -> Vec<crate::Timestamp> {
    let recent_from = now - chrono::TimeDelta::from_std(window).unwrap_or(chrono::TimeDelta::MAX);
    let keep = match catch_up {
        crate::runtime::CatchUp::Skip => 0,
        crate::runtime::CatchUp::Latest => 1,
        crate::runtime::CatchUp::All { limit } => limit as usize,
    };
    let mut old = std::collections::VecDeque::new();
    let mut recent = Vec::new();
    let mut p = first;
    for _ in 0..1_000_000 {
        if p > now {
            break;
        }
        if p >= recent_from {
            recent.push(p);
        } else {
            old.push_back(p);
            if old.len() > keep {
                old.pop_front();
            }
        }
        p = schedule.next_after(p);
    }
    if catch_up == crate::runtime::CatchUp::Latest && !recent.is_empty() {
        old.clear();
    }
    old.into_iter().chain(recent).collect()
}

async fn enqueue_period(shared: &Shared, p: &crate::runtime::Periodic, period: crate::Timestamp) {
    // The next period after the one enqueued (the periods are enqueued oldest first, the last
    // the latest due, so the schedule goes on from the first period after now), never from the
    // time of the enqueue: a late enqueue skips no period.
    let next = p.schedule.next_after(period);
    let job: NewJob = p
        .job
        .clone()
        .unique_key(crate::runtime::periodic_unique_key(&p.name, period));
    let row = match crate::runtime::prepare::prepare_with(shared, job) {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(periodic = %p.name, error = %e, "periodic job is invalid");
            return;
        }
    };
    let queue = row.queue.clone();
    match shared
        .store
        .enqueue_period(&p.name, period, next, row)
        .await
    {
        Ok(Some(id)) => {
            tracing::info!(periodic = %p.name, job = id, period = %period, "enqueued periodic job");
            shared.hub.wake(&queue);
        }
        Ok(None) => {}
        Err(e) => shared.outage.report("cannot enqueue periodic jobs", &e),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::due_periods;
    use crate::runtime::{CatchUp, Schedule};

    fn t(s: &str) -> crate::Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn recent_periods_are_each_due_and_an_old_backlog_collapses_to_one() {
        let every = Schedule::every(Duration::from_secs(1)).unwrap();
        let win = Duration::from_secs(60);
        // A failover of three seconds: each missed period is enqueued.
        let v = due_periods(
            &every,
            t("2026-01-01T00:00:10Z"),
            t("2026-01-01T00:00:12.5Z"),
            win,
            CatchUp::Latest,
        );
        assert_eq!(
            v,
            vec![
                t("2026-01-01T00:00:10Z"),
                t("2026-01-01T00:00:11Z"),
                t("2026-01-01T00:00:12Z")
            ]
        );
        // Down for a day: only the recent ones, not 86,400.
        let v = due_periods(
            &every,
            t("2026-01-01T00:00:00Z"),
            t("2026-01-02T00:00:00Z"),
            win,
            CatchUp::Latest,
        );
        assert_eq!(v.len(), 61);
        // An hourly schedule down for five hours: the latest missed period once.
        let hourly = Schedule::every(Duration::from_secs(3600)).unwrap();
        let v = due_periods(
            &hourly,
            t("2026-01-01T03:00:00Z"),
            t("2026-01-01T07:30:00Z"),
            win,
            CatchUp::Latest,
        );
        assert_eq!(v, vec![t("2026-01-01T07:00:00Z")]);
        // Not due yet: nothing.
        assert!(due_periods(
            &hourly,
            t("2026-01-01T08:00:00Z"),
            t("2026-01-01T07:30:00Z"),
            win,
            CatchUp::Latest,
        )
        .is_empty());
    }

    #[test]
    fn missed_periods_follow_the_catch_up_policy() {
        let hourly = Schedule::every(Duration::from_secs(3600)).unwrap();
        let win = Duration::from_secs(60);
        let (first, now) = (t("2026-01-01T03:00:00Z"), t("2026-01-01T07:30:00Z"));
        let missed = |c| due_periods(&hourly, first, now, win, c);
        assert!(missed(CatchUp::Skip).is_empty());
        assert_eq!(missed(CatchUp::Latest), vec![t("2026-01-01T07:00:00Z")]);
        assert_eq!(missed(CatchUp::All { limit: 100 }).len(), 5);
        assert_eq!(
            missed(CatchUp::All { limit: 2 }),
            vec![t("2026-01-01T06:00:00Z"), t("2026-01-01T07:00:00Z")]
        );
        // A period due within the failover window runs under every policy, and after it the
        // older ones as the policy says.
        let now = t("2026-01-01T07:00:30Z");
        assert_eq!(
            due_periods(&hourly, first, now, win, CatchUp::Skip),
            vec![t("2026-01-01T07:00:00Z")]
        );
        assert_eq!(
            due_periods(&hourly, first, now, win, CatchUp::Latest),
            vec![t("2026-01-01T07:00:00Z")]
        );
        assert_eq!(
            due_periods(&hourly, first, now, win, CatchUp::All { limit: 2 }),
            vec![
                t("2026-01-01T05:00:00Z"),
                t("2026-01-01T06:00:00Z"),
                t("2026-01-01T07:00:00Z")
            ]
        );
    }
}
