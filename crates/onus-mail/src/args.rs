//! The `mail.send` job's args, checked at insert (every problem names its field), and the
//! message they make.

use std::collections::BTreeMap;
use std::time::SystemTime;

use lettre::message::header::{ContentType, HeaderName, HeaderValue};
use lettre::message::{Mailbox, MultiPart, SinglePart};
use lettre::{Address, Message};
use serde::{Deserialize, Deserializer, Serialize};

/// One address or a list of them (`"a@example.com"` or `["a@example.com", "B <b@example.com>"]`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Recipients(pub Vec<String>);

impl<'de> Deserialize<'de> for Recipients {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged, expecting = "an address or a list of addresses")]
        enum OneOrMany {
            One(String),
            Many(Vec<String>),
        }
        Ok(match OneOrMany::deserialize(d)? {
            OneOrMany::One(s) => Recipients(vec![s]),
            OneOrMany::Many(v) => Recipients(v),
        })
    }
}

impl From<&str> for Recipients {
    fn from(s: &str) -> Self {
        Recipients(vec![s.to_string()])
    }
}

/// A job to insert in the transaction that marks the mail sent (from the API: `after_send`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AfterSend {
    /// Its kind.
    pub kind: String,
    /// Its args.
    #[serde(default = "empty_object")]
    pub args: serde_json::Value,
}

fn empty_object() -> serde_json::Value {
    serde_json::json!({})
}

/// The args of a `mail.send` job.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendArgs {
    /// Recipients.
    pub to: Recipients,
    /// Copy recipients.
    #[serde(default, skip_serializing_if = "is_empty")]
    pub cc: Recipients,
    /// Blind copy recipients (in the envelope only, never in the headers).
    #[serde(default, skip_serializing_if = "is_empty")]
    pub bcc: Recipients,
    /// The sender; the configured `from` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Where replies go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    /// The subject.
    pub subject: String,
    /// The plain-text body.
    pub text: String,
    /// An HTML body, sent beside the text one (multipart/alternative).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
    /// Extra headers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// Whom the notification is about, for the per-owner burst cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The event this mail tells of: `Message-ID: <event_id@domain>` on every attempt (the job's
    /// id stands in when absent), so copies fold in the recipient's mailbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
    /// A job inserted in the transaction that marks the mail sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_send: Option<AfterSend>,
}

fn is_empty(r: &Recipients) -> bool {
    r.0.is_empty()
}

/// Headers the message builds itself: given in `headers`, they are refused.
const OWN_HEADERS: &[&str] = &[
    "from",
    "to",
    "cc",
    "bcc",
    "reply-to",
    "subject",
    "message-id",
    "date",
    "mime-version",
    "content-type",
    "content-transfer-encoding",
    "dkim-signature",
];

/// The args as checked: addresses parsed, the Message-ID's left part known.
#[derive(Debug, Clone)]
pub(crate) struct Checked {
    pub from: Mailbox,
    pub reply_to: Option<Mailbox>,
    pub to: Vec<Mailbox>,
    pub cc: Vec<Mailbox>,
    pub bcc: Vec<Mailbox>,
}

impl Checked {
    /// Every envelope recipient once, by normalised address (lower case), in order.
    pub(crate) fn recipients(&self) -> Vec<Address> {
        let mut seen = std::collections::HashSet::new();
        self.to
            .iter()
            .chain(&self.cc)
            .chain(&self.bcc)
            .filter(|m| seen.insert(normalise(&m.email)))
            .map(|m| m.email.clone())
            .collect()
    }
}

/// The key of an address in the per-recipient window: the address in lower case.
pub fn normalise(a: &Address) -> String {
    a.to_string().to_ascii_lowercase()
}

fn mailbox(field: &str, v: &str) -> Result<Mailbox, String> {
    v.trim().parse::<Mailbox>().map_err(|e| {
        format!("{field}: {v:?} is not an email address ({e}); write name@example.com or \"Name <name@example.com>\"")
    })
}

fn mailboxes(field: &str, r: &Recipients) -> Result<Vec<Mailbox>, String> {
    r.0.iter()
        .enumerate()
        .map(|(i, v)| mailbox(&format!("{field}[{i}]"), v))
        .collect()
}

/// The left part of a Message-ID: printable ASCII without spaces, `<`, `>`, `@` or `"`.
fn check_id_left(field: &str, id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > 200 {
        return Err(format!("{field}: give 1 to 200 characters"));
    }
    if let Some(c) = id.chars().find(|c| {
        !c.is_ascii_graphic()
            || matches!(
                c,
                '<' | '>' | '@' | '"' | '\\' | '(' | ')' | ',' | ';' | ':' | '[' | ']'
            )
    }) {
        return Err(format!(
            "{field}: {c:?} cannot stand in a Message-ID; use letters, digits and . - _ + = / ! # $ % & ' * ? ^ ` {{ | }} ~"
        ));
    }
    Ok(())
}

impl SendArgs {
    /// Decodes and checks args; the error names the field and says what to fix.
    pub fn decode(v: &serde_json::Value) -> Result<SendArgs, String> {
        serde_path_to_error::deserialize(v).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            if path == "." {
                inner.to_string()
            } else {
                format!("{path}: {inner}")
            }
        })
    }

    /// Checks the args against a configured default sender.
    pub(crate) fn check(&self, default_from: Option<&Mailbox>) -> Result<Checked, String> {
        let to = mailboxes("to", &self.to)?;
        if to.is_empty() {
            return Err("to: give at least one recipient".into());
        }
        let cc = mailboxes("cc", &self.cc)?;
        let bcc = mailboxes("bcc", &self.bcc)?;
        let from = match &self.from {
            Some(f) => mailbox("from", f)?,
            None => default_from.cloned().ok_or_else(|| {
                "from: give a sender, or set `from` in the [mail] configuration".to_string()
            })?,
        };
        let reply_to = self
            .reply_to
            .as_deref()
            .map(|r| mailbox("reply_to", r))
            .transpose()?;
        for (name, value) in &self.headers {
            let field = format!("headers.{name}");
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic() && b != b':') {
                return Err(format!(
                    "{field}: a header name is printable ASCII without spaces or ':'"
                ));
            }
            if OWN_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
                return Err(format!(
                    "{field}: this header is set from the mail's own fields; use them instead"
                ));
            }
            if value.contains(['\r', '\n']) {
                return Err(format!("{field}: a header value is one line (no CR or LF)"));
            }
        }
        for (field, v) in [("subject", &self.subject)] {
            if v.contains(['\r', '\n']) {
                return Err(format!("{field}: one line (no CR or LF)"));
            }
        }
        if let Some(id) = &self.event_id {
            check_id_left("event_id", id)?;
        }
        if let Some(a) = &self.after_send {
            if a.kind.trim().is_empty() {
                return Err("after_send.kind: name the kind of the job to insert".into());
            }
        }
        Ok(Checked {
            from,
            reply_to,
            to,
            cc,
            bcc,
        })
    }

    /// The Message-ID of this mail in job `job_id`.
    pub fn message_id(&self, job_id: i64, domain: &str) -> String {
        match &self.event_id {
            Some(id) => format!("<{id}@{domain}>"),
            None => format!("<onus-job-{job_id}@{domain}>"),
        }
    }

    /// The message, ready to sign and send.
    pub(crate) fn message(
        &self,
        checked: &Checked,
        message_id: String,
        date: SystemTime,
    ) -> Result<Message, String> {
        let mut b = Message::builder()
            .from(checked.from.clone())
            .subject(self.subject.clone())
            .message_id(Some(message_id))
            .date(date);
        if let Some(r) = &checked.reply_to {
            b = b.reply_to(r.clone());
        }
        for m in &checked.to {
            b = b.to(m.clone());
        }
        for m in &checked.cc {
            b = b.cc(m.clone());
        }
        for m in &checked.bcc {
            b = b.bcc(m.clone());
        }
        for (name, value) in &self.headers {
            let name = HeaderName::new_from_ascii(name.clone())
                .map_err(|e| format!("headers.{name}: {e}"))?;
            b = b.raw_header(HeaderValue::new(name, value.clone()));
        }
        let built = match &self.html {
            None => b.singlepart(
                SinglePart::builder()
                    .header(ContentType::TEXT_PLAIN)
                    .body(self.text.clone()),
            ),
            Some(html) => b.multipart(MultiPart::alternative_plain_html(
                self.text.clone(),
                html.clone(),
            )),
        };
        built.map_err(|e| format!("the message cannot be built: {e}"))
    }
}
