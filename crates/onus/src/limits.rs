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

/// A key built from a job's args, as configuration writes it: `"customer:{customer_id}"`, with
/// `{a.b}` for a nested field and `{{` / `}}` for literal braces. A field must be a string, a
/// number or a boolean; a missing one refuses the job with a message naming it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyTemplate {
    text: String,
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Field(Vec<String>),
}

/// A template that cannot be used, with what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{template:?}: {problem}")]
pub struct TemplateError {
    template: String,
    problem: String,
}

impl KeyTemplate {
    /// Parses `text`; the error says what to fix.
    pub fn parse(text: &str) -> Result<KeyTemplate, TemplateError> {
        let bad = |problem: &str| TemplateError {
            template: text.to_string(),
            problem: problem.to_string(),
        };
        if text.is_empty() {
            return Err(bad(
                "a key template is empty; write it like \"customer:{customer_id}\"",
            ));
        }
        let mut parts = Vec::new();
        let mut lit = String::new();
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    lit.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    lit.push('}');
                }
                '{' => {
                    let mut name = String::new();
                    loop {
                        match chars.next() {
                            Some('}') => break,
                            Some(c) => name.push(c),
                            None => {
                                return Err(bad(
                                    "a '{' is never closed; write {field}, or {{ for a brace",
                                ))
                            }
                        }
                    }
                    let path: Vec<String> = name.trim().split('.').map(str::to_string).collect();
                    if path.iter().any(|p| p.is_empty()) {
                        return Err(bad(
                            "an empty field name between braces; write {field} or {a.b}",
                        ));
                    }
                    if !lit.is_empty() {
                        parts.push(Part::Text(std::mem::take(&mut lit)));
                    }
                    parts.push(Part::Field(path));
                }
                '}' => return Err(bad("a '}' without its '{'; write }} for a brace")),
                c => lit.push(c),
            }
        }
        if !lit.is_empty() {
            parts.push(Part::Text(lit));
        }
        Ok(KeyTemplate {
            text: text.to_string(),
            parts,
        })
    }

    /// The template as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The key for a job with `args`, or what is missing from them.
    pub fn render(&self, args: &serde_json::Value) -> Result<String, String> {
        let mut out = String::new();
        for p in &self.parts {
            match p {
                Part::Text(t) => out.push_str(t),
                Part::Field(path) => {
                    let name = path.join(".");
                    let v = path.iter().try_fold(args, |v, k| v.get(k)).ok_or_else(|| {
                        format!(
                            "args: no {name}, which the key {:?} is built from",
                            self.text
                        )
                    })?;
                    match v {
                        serde_json::Value::String(s) => out.push_str(s),
                        serde_json::Value::Number(n) => out.push_str(&n.to_string()),
                        serde_json::Value::Bool(b) => out.push_str(&b.to_string()),
                        _ => {
                            return Err(format!(
                                "args: {name} is {v}, but the key {:?} needs a string, a number or a boolean there",
                                self.text
                            ))
                        }
                    }
                }
            }
        }
        Ok(out)
    }
}

/// When a job that found lease key busy wakes on its own: the first waiter when the earliest slot
/// frees (`free_at`); each later one a slot's lease (`spacing`) after the waiter before it. A
/// release wakes the longest waiter at once, so waiters normally run one after another, woken in
/// order; these times only matter when a release never comes (its holder died), and then they
/// wake one by one instead of all at once as a herd that finds the key busy again.
pub(crate) fn lease_waiter_wakes_at(
    free_at: crate::Timestamp,
    last_waiter: Option<crate::Timestamp>,
    spacing: Duration,
) -> crate::Timestamp {
    match last_waiter {
        Some(last) if last >= free_at => crate::clock::add(last, spacing),
        _ => free_at,
    }
}

#[cfg(test)]
mod template_tests {
    use super::KeyTemplate;
    use serde_json::json;

    #[test]
    fn keys_are_built_from_args() {
        let t = KeyTemplate::parse("customer:{customer_id}/{order.region}{{x}}").unwrap();
        let args = json!({"customer_id": 42, "order": {"region": "eu"}});
        assert_eq!(t.render(&args).unwrap(), "customer:42/eu{x}");
        let t = KeyTemplate::parse("all").unwrap();
        assert_eq!(t.render(&json!({})).unwrap(), "all");
        let t = KeyTemplate::parse("{flag}-{name}").unwrap();
        assert_eq!(
            t.render(&json!({"flag": true, "name": "a"})).unwrap(),
            "true-a"
        );
    }

    #[test]
    fn what_cannot_be_built_says_why() {
        let t = KeyTemplate::parse("customer:{customer_id}").unwrap();
        let e = t.render(&json!({"other": 1})).unwrap_err();
        assert!(e.contains("no customer_id"), "{e}");
        let e = t.render(&json!({"customer_id": null})).unwrap_err();
        assert!(e.contains("needs a string, a number or a boolean"), "{e}");
        let e = t.render(&json!({"customer_id": {"a": 1}})).unwrap_err();
        assert!(e.contains("needs a string"), "{e}");
        for (text, says) in [
            ("", "empty"),
            ("a:{b", "never closed"),
            ("a}", "without its '{'"),
            ("a:{}", "empty field name"),
            ("a:{b..c}", "empty field name"),
        ] {
            let e = KeyTemplate::parse(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
    }
}
