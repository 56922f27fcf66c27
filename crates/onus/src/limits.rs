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
