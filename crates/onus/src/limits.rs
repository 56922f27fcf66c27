//! Limits as data: lease keys and rate windows.
//!
//! - A **lease key** caps how many jobs holding the same key run at once, across every process
//!   (default 1). The key is set on the job ([`NewJob::lease_key`](crate::NewJob::lease_key)) and the
//!   number of slots on the kind ([`Kind::lease_slots`](crate::Kind::lease_slots)). The runtime takes
//!   a slot before the handler runs; a job that finds every slot busy is snoozed (no attempt spent)
//!   and woken as soon as a slot frees.
//! - A **rate window** allows at most `max` uses of a key per fixed window (windows are aligned to the
//!   Unix epoch). A handler takes a use with [`JobContext::take`](crate::JobContext::take); when the
//!   window is spent the job either snoozes to the next window (nothing lost) or is dropped on purpose
//!   (discarded with reason *dropped*, recorded in its history, never silently).
//!
//! Both decide *when* a job may run, so both live in the job layer; a handler only names the key.

use std::time::Duration;

use crate::Timestamp;

use serde::{Deserialize, Serialize};

/// What happens to a job whose rate window is spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WhenSpent {
    /// Snooze until the next window opens; no attempt is spent and nothing is lost.
    Snooze,
    /// Drop the job on purpose: discarded with reason *dropped*, recorded in its history.
    Drop,
}

/// At most `max` uses of a key per `window`.
///
/// ```
/// use std::time::Duration;
/// use onus::{RateWindow, WhenSpent};
/// // The seed's mail limits: 30 per recipient per hour (wait), 5 per owner per hour (drop).
/// let per_recipient = RateWindow::new("mail.recipient", 30, Duration::from_secs(3600), WhenSpent::Snooze);
/// let per_owner = RateWindow::new("mail.owner-burst", 5, Duration::from_secs(3600), WhenSpent::Drop);
/// assert_eq!(per_owner.max, 5);
/// # let _ = per_recipient;
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateWindow {
    /// A name for the limit; the stored key is `name:key`.
    pub name: String,
    /// Uses allowed per window.
    pub max: u32,
    /// The window's length.
    #[serde(with = "crate::policy::duration_str")]
    pub window: Duration,
    /// What a job meets when the window is spent.
    pub when_spent: WhenSpent,
}

impl RateWindow {
    /// A rate window.
    pub fn new(name: impl Into<String>, max: u32, window: Duration, when_spent: WhenSpent) -> Self {
        RateWindow {
            name: name.into(),
            max,
            window,
            when_spent,
        }
    }
}

/// A slot of a lease key as stored: the slot, the job holding it, and until when.
pub(crate) type SlotRow = (u32, crate::JobId, crate::Timestamp);

/// A running job asking for a slot of a lease key, as the runtime asks a store.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseAsk<'a> {
    pub key: &'a str,
    pub slots: u32,
    pub job: &'a crate::Job,
    pub owner: &'a str,
    pub now: crate::Timestamp,
    /// Until when the slot is held (unless renewed).
    pub until: crate::Timestamp,
}

impl LeaseAsk<'_> {
    /// The slot the job takes: the one it already holds, or the first one free or expired;
    /// `None` when every slot is busy.
    pub(crate) fn free_slot(&self, held: &[SlotRow]) -> Option<u32> {
        held.iter()
            .find(|(_, j, _)| *j == self.job.id)
            .map(|(s, _, _)| *s)
            .or_else(|| {
                (0..self.slots.max(1)).find(|s| {
                    held.iter()
                        .find(|(hs, _, _)| hs == s)
                        .is_none_or(|(_, _, busy)| *busy <= self.now)
                })
            })
    }

    /// The snooze written when every slot is busy: no attempt spent, until the earliest slot
    /// frees, or a slot's lease after the latest other waiter (`last_waiter`), so waiters whose
    /// holder died wake one by one.
    pub(crate) fn busy_snooze(
        &self,
        held: &[SlotRow],
        last_waiter: Option<crate::Timestamp>,
    ) -> crate::store::Finish {
        let slots = self.slots.max(1);
        let now = self.now;
        let free_at = held
            .iter()
            .map(|(_, _, b)| *b)
            .min()
            .unwrap_or(now)
            .max(now);
        let spacing = (self.until - now).to_std().unwrap_or_default() / slots;
        let run_at = lease_waiter_wakes_at(free_at, last_waiter, spacing);
        crate::store::Finish {
            id: self.job.id,
            owner: self.owner.to_string(),
            attempt: self.job.attempt,
            transition: crate::outcome::Transition::Snooze {
                run_at,
                entry: crate::job::HistoryEntry {
                    at: now,
                    attempt: self.job.attempt,
                    class: crate::job::EntryClass::Snooze,
                    message: format!(
                        "lease key {} busy ({} of {slots} slots held)",
                        self.key,
                        held.len()
                    ),
                },
            },
            now,
            release_lease: None,
            periodic: None,
            expired_before: None,
        }
    }
}

/// When a job that found lease key busy wakes on its own: the first waiter when the earliest slot
/// frees (`free_at`); each later one a slot's lease (`spacing`) after the waiter before it. A
/// release wakes the longest waiter at once, so waiters normally run one after another, woken in
/// order; these times only matter when a release never comes (its holder died), and then they
/// wake one by one instead of all at once as a herd that finds the key busy again.
fn lease_waiter_wakes_at(
    free_at: Timestamp,
    last_waiter: Option<Timestamp>,
    spacing: Duration,
) -> Timestamp {
    match last_waiter {
        Some(last) if last >= free_at => crate::clock::add(last, spacing),
        _ => free_at,
    }
}
