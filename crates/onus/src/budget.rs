//! Retry budgets: at most a share of a kind's attempts in a sliding window may be retries.
//!
//! The job layer is the one owner of retries, so it is the one place they can be budgeted. A
//! budget is data (`ratio`, `window`, `min_per_window`) set on a kind or as every kind's default;
//! off unless set. When an attempt that is a retry (attempt 2 or later) is about to start and the
//! kind's budget is spent, the attempt does not start: the job is deferred (`scheduled`, its
//! attempt given back, a `deferred` entry in its history) to when the budget allows, so during a
//! downstream's outage the job layer sends at most `max(min_per_window, ratio * attempts)` retries
//! per window. Nothing is dropped: every job still ends retried or discarded.
//!
//! Each process keeps its own budget (counting the attempts it starts), as client-side retry
//! budgets do; N processes allow N times the retries of one.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::clock::{self, Timestamp};

/// A retry budget: of the attempts a kind starts in any `window`, at most `ratio` (or
/// `min_per_window`, whichever allows more, and never fewer than one) may be retries.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryBudget {
    /// The share of attempts that may be retries, from 0 to 1 (0.2: one in five).
    pub ratio: f64,
    /// The sliding window.
    #[serde(with = "crate::policy::duration_str")]
    pub window: Duration,
    /// Retries always allowed per window, however few first attempts there were (one when 0:
    /// a budget never stops retries, it spaces them).
    #[serde(default)]
    pub min_per_window: u32,
}

impl RetryBudget {
    /// A budget, checked: the error says what to fix.
    pub fn new(ratio: f64, window: Duration, min_per_window: u32) -> Result<Self, String> {
        let b = RetryBudget {
            ratio,
            window,
            min_per_window,
        };
        b.check()?;
        Ok(b)
    }

    /// Whether the budget makes sense; the error says what to fix.
    pub fn check(&self) -> Result<(), String> {
        if !(self.ratio.is_finite() && (0.0..=1.0).contains(&self.ratio)) {
            return Err(format!(
                "retry_budget ratio = {}: give 0 to 1 (0.2 lets one attempt in five be a retry)",
                self.ratio
            ));
        }
        if self.window < Duration::from_secs(1) || self.window > Duration::from_secs(86_400) {
            return Err(format!(
                "retry_budget window = {:?}: give \"1s\" to \"1d\"",
                crate::policy::human(self.window)
            ));
        }
        Ok(())
    }

    /// Retries allowed in a window that saw `attempts` attempts (this one included): never
    /// fewer than one, so a budget slows retries but never stops them (a lone failing job under
    /// `ratio = 0.2` still gets its retry; `ratio = 0` allows one a window).
    fn allowance(&self, attempts: usize) -> usize {
        ((self.ratio * attempts as f64).floor() as usize)
            .max(self.min_per_window as usize)
            .max(1)
    }
}

/// The attempts one kind started within its window, oldest first: (when, whether a retry).
#[derive(Debug, Default)]
struct Window {
    starts: VecDeque<(Timestamp, bool)>,
    retries: usize,
    /// When the next deferred retry is due: deferrals take turns a share of the window apart,
    /// so they come back at the rate the budget allows instead of all at once.
    next_turn: Option<Timestamp>,
    /// When the next deferred retry that came back and still found no room is due: those take
    /// turns too, ahead of the queue, so they do not all meet at the next free moment.
    front: Option<Timestamp>,
}

impl Window {
    fn evict(&mut self, before: Timestamp) {
        while let Some(&(t, retry)) = self.starts.front() {
            if t > before {
                break;
            }
            self.starts.pop_front();
            if retry {
                self.retries -= 1;
            }
        }
    }
}

/// Every kind's window in this process.
#[derive(Debug, Default)]
pub(crate) struct Budgets {
    windows: Mutex<HashMap<String, Window>>,
}

/// The gauge of budget pressure: retries in the window over the retries it allows (1 or more:
/// spent, retries are being deferred).
pub const PRESSURE: &str = "onus_retry_budget_pressure";
/// Retries deferred by a spent budget.
pub const DEFERRALS: &str = "onus_retry_budget_deferrals_total";

impl Budgets {
    /// Admits an attempt of `kind` starting at `now` (a retry when `retry`) under `budget`:
    /// `Ok` counts it; `Err(t)` means the budget is spent and the retry should wait until `t`.
    /// A retry `returning` from a deferral comes back at its turn; any other retry waits behind
    /// the deferred ones still to come back, so none is passed over again and again.
    pub(crate) fn admit(
        &self,
        kind: &str,
        budget: &RetryBudget,
        retry: bool,
        returning: bool,
        now: Timestamp,
    ) -> Result<(), Timestamp> {
        let mut all = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let w = all.entry(kind.to_string()).or_default();
        w.evict(clock::sub(now, budget.window));
        let allowed = budget.allowance(w.starts.len() + 1);
        let pressure = (w.retries + usize::from(retry)) as f64 / allowed.max(1) as f64;
        metrics::gauge!(PRESSURE, "kind" => kind.to_string()).set(pressure);
        let queued = !returning && w.next_turn.is_some_and(|t| t > now);
        if retry && (w.retries + 1 > allowed || queued) {
            metrics::counter!(DEFERRALS, "kind" => kind.to_string()).increment(1);
            // No sooner than when the oldest retry in the window leaves it (and so there is room
            // for one more: the allowance is at least one).
            let oldest = w.starts.iter().find(|(_, r)| *r).map_or(now, |(t, _)| *t);
            let frees = clock::add(oldest, budget.window).max(now);
            let gap = budget.window / allowed as u32;
            // Up to a tenth of a turn later, so those deferred together do not meet at one instant.
            let spread = gap.mul_f64(rand::thread_rng().gen_range(0.0..0.1));
            if returning {
                // A deferred retry back at its turn that still finds no room keeps its place
                // ahead of the queue: it takes the next front turn, from the first room on, and
                // no later deferral passes it.
                let turn = w.front.filter(|t| *t > frees).unwrap_or(frees);
                w.front = Some(clock::add(turn, gap));
                return Err(clock::trunc(clock::add(turn, spread)));
            }
            // After the deferrals before it, one turn (the window over the retries it allows)
            // apart.
            let turn = w.next_turn.filter(|t| *t > frees).unwrap_or(frees);
            w.next_turn = Some(clock::add(turn, gap));
            return Err(clock::trunc(clock::add(turn, spread)));
        }
        w.starts.push_back((now, retry));
        if retry {
            w.retries += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> Timestamp {
        clock::from_micros(s * 1_000_000)
    }

    #[test]
    fn retries_stay_within_the_share_and_the_minimum() {
        let b = RetryBudget::new(0.2, Duration::from_secs(60), 2).unwrap();
        let budgets = Budgets::default();
        // Ten first attempts allow two retries (0.2 * 12 attempts, floor 2).
        for i in 0..10 {
            assert!(budgets.admit("k", &b, false, false, at(i)).is_ok());
        }
        assert!(budgets.admit("k", &b, true, false, at(10)).is_ok());
        assert!(budgets.admit("k", &b, true, false, at(11)).is_ok());
        let until = budgets.admit("k", &b, true, false, at(12)).unwrap_err();
        // Deferred until the first retry (at 10 s) leaves the window, within a tenth of a turn.
        assert!(until >= at(70) && until < at(73), "{until}");
        // The next deferral takes the next turn: the window over the two retries it allows.
        let next = budgets.admit("k", &b, true, false, at(13)).unwrap_err();
        assert!(next >= at(100) && next < at(103), "{next}");
        // Another kind has its own window.
        assert!(budgets.admit("other", &b, true, false, at(12)).is_ok());
        // A fresh retry waits behind the deferred ones still to come back...
        assert!(budgets.admit("k", &b, true, false, at(71)).is_err());
        // ...which come back at their turn and run, the window having slid past the first.
        assert!(budgets.admit("k", &b, true, true, at(71)).is_ok());
        assert!(budgets.admit("k", &b, true, true, at(72)).is_ok());
        assert!(budgets.admit("k", &b, true, true, at(73)).is_err());
    }

    #[test]
    fn regression_a_budget_without_a_minimum_never_stops_retries() {
        // ratio 0.2 with no minimum: a lone failing job's retry would be allowed 0.2 * 2 = 0.
        let b = RetryBudget::new(0.2, Duration::from_secs(5), 0).unwrap();
        let budgets = Budgets::default();
        assert!(budgets.admit("k", &b, false, false, at(0)).is_ok());
        assert!(budgets.admit("k", &b, true, false, at(1)).is_ok());
        // The next retry in the same window waits for the first to leave it...
        let until = budgets.admit("k", &b, true, false, at(2)).unwrap_err();
        assert!(until >= at(6) && until < at(7), "{until}");
        // ...and runs when it comes back.
        assert!(budgets.admit("k", &b, true, true, until).is_ok());
        // A budget of no retries at all still lets one a window through.
        let none = RetryBudget::new(0.0, Duration::from_secs(5), 0).unwrap();
        assert!(budgets.admit("z", &none, false, false, at(0)).is_ok());
        assert!(budgets.admit("z", &none, true, false, at(1)).is_ok());
        let until = budgets.admit("z", &none, true, false, at(2)).unwrap_err();
        assert!(budgets.admit("z", &none, true, true, until).is_ok());
    }

    #[test]
    fn regression_a_returning_retry_keeps_its_place() {
        let b = RetryBudget::new(0.0, Duration::from_secs(10), 1).unwrap();
        let budgets = Budgets::default();
        assert!(budgets.admit("k", &b, true, false, at(0)).is_ok());
        // Three deferred: turns at 10, 20 and 30 s.
        let first = budgets.admit("k", &b, true, false, at(1)).unwrap_err();
        let second = budgets.admit("k", &b, true, false, at(2)).unwrap_err();
        let third = budgets.admit("k", &b, true, false, at(3)).unwrap_err();
        assert!(first < second && second < third);
        // Another retry took the room at 10 s: the first, back at its turn, finds none, and
        // waits for the next room (20 s), not behind the third's turn.
        assert!(budgets.admit("k", &b, true, true, at(10)).is_ok());
        let again = budgets.admit("k", &b, true, true, first).unwrap_err();
        assert!(again < third, "{again} is behind {third}");
    }

    #[test]
    fn returning_retries_without_room_take_turns_instead_of_meeting() {
        let b = RetryBudget::new(0.0, Duration::from_secs(10), 1).unwrap();
        let budgets = Budgets::default();
        assert!(budgets.admit("k", &b, true, false, at(0)).is_ok());
        // Five come back at once and find no room: each gets a turn of its own, a window apart.
        let mut times: Vec<Timestamp> = (0..5)
            .map(|_| budgets.admit("k", &b, true, true, at(5)).unwrap_err())
            .collect();
        times.sort();
        for pair in times.windows(2) {
            assert!(
                pair[1] - pair[0] >= chrono::TimeDelta::seconds(9),
                "{times:?}"
            );
        }
    }

    #[test]
    fn a_budget_is_checked() {
        assert!(RetryBudget::new(1.5, Duration::from_secs(60), 0)
            .unwrap_err()
            .contains("0 to 1"));
        assert!(RetryBudget::new(0.1, Duration::ZERO, 0)
            .unwrap_err()
            .contains("1s"));
    }
}
