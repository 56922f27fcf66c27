//! `[mail]`: the SMTP relay for `mail.send` jobs.

use std::path::PathBuf;

use serde::Deserialize;

use super::{duration, ConfigError};

/// `[mail]`.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MailSection {
    /// The relay: `smtp://user:password@relay.example.com:587?tls=required`, `smtps://...`.
    /// `ONUS_MAIL_URL` wins, so the password need not be in the file.
    pub url: Option<String>,
    /// The sender when a mail names none: `"Example <noreply@example.com>"`.
    pub from: Option<String>,
    /// The right part of every Message-ID (and the name given in EHLO).
    pub message_id_domain: Option<String>,
    /// Time for one whole SMTP session (`"30s"`).
    pub timeout: Option<String>,
    /// Time to connect (`"10s"`).
    pub connect_timeout: Option<String>,
    /// A PEM file of CA certificates trusted besides the system's (a private relay).
    pub ca_file: Option<PathBuf>,
    /// Per recipient: `{ limit = 30, per = "1h" }`; when spent, mail snoozes to the next window.
    pub recipient_limit: Option<LimitSection>,
    /// Per owner: `{ limit = 5, per = "1h" }`; beyond it, mail is dropped on purpose.
    pub owner_limit: Option<LimitSection>,
    /// DKIM signing.
    pub dkim: Option<DkimSection>,
}

impl std::fmt::Debug for MailSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may hold the relay's password: only whether it is set.
        f.debug_struct("MailSection")
            .field("url", &self.url.as_ref().map(|_| "<set>"))
            .field("from", &self.from)
            .field("message_id_domain", &self.message_id_domain)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// A rate window: `{ limit = 30, per = "1h" }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitSection {
    /// Uses per window.
    pub limit: u32,
    /// The window (`"1h"`).
    pub per: String,
}

/// `dkim = { domain = "example.com", selector = "s1", key_file = "dkim.pem" }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DkimSection {
    /// The signing domain.
    pub domain: String,
    /// The selector (`s1._domainkey.example.com`).
    pub selector: String,
    /// The private key, PEM (RSA PKCS#1 or Ed25519).
    pub key_file: PathBuf,
}

impl MailSection {
    /// The settings, defaults filled in; the error names the bad setting.
    pub fn resolve(&self) -> Result<onus_mail::MailConfig, ConfigError> {
        let bad = |key: &str, what: String| ConfigError(format!("[mail] {key}: {what}"));
        let url = std::env::var("ONUS_MAIL_URL")
            .ok()
            .filter(|u| !u.is_empty())
            .or_else(|| self.url.clone())
            .ok_or_else(|| bad("url", "name the relay: url = \"smtp://user:password@relay.example.com:587?tls=required\" (or set ONUS_MAIL_URL)".into()))?;
        let mut relay = onus_mail::Relay::parse(&url).map_err(|e| bad("url", e))?;
        if let Some(ca) = &self.ca_file {
            let pem = std::fs::read(ca)
                .map_err(|e| bad("ca_file", format!("cannot read {}: {e}", ca.display())))?;
            relay.roots.push(pem);
        }
        let domain = match &self.message_id_domain {
            Some(d) => d.clone(),
            None => self
                .from
                .as_deref()
                .and_then(|f| f.rsplit_once('@'))
                .map(|(_, d)| d.trim_end_matches('>').trim().to_string())
                .ok_or_else(|| {
                    bad(
                        "message_id_domain",
                        "name the domain of Message-IDs: message_id_domain = \"example.com\""
                            .into(),
                    )
                })?,
        };
        if domain.is_empty()
            || !domain
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
        {
            return Err(bad(
                "message_id_domain",
                format!("{domain:?} is not a domain name; write it like \"example.com\""),
            ));
        }
        let mut c = onus_mail::MailConfig::new(relay, domain);
        if let Some(f) = &self.from {
            c.from = Some(f.parse().map_err(|e| {
                bad(
                    "from",
                    format!(
                        "{f:?} is not an address ({e}); write \"Example <noreply@example.com>\""
                    ),
                )
            })?);
        }
        if let Some(d) = duration("mail", "timeout", &self.timeout)? {
            c.timeout = d;
        }
        if let Some(d) = duration("mail", "connect_timeout", &self.connect_timeout)? {
            c.connect_timeout = d;
        }
        for (key, section, slot) in [
            (
                "recipient_limit",
                &self.recipient_limit,
                &mut c.recipient_limit,
            ),
            ("owner_limit", &self.owner_limit, &mut c.owner_limit),
        ] {
            if let Some(l) = section {
                let per = duration("mail", &format!("{key}.per"), &Some(l.per.clone()))?
                    .unwrap_or_default();
                if l.limit == 0 || per.is_zero() {
                    return Err(bad(key, "give a limit of at least 1 and a window longer than 0: { limit = 30, per = \"1h\" }".into()));
                }
                *slot = (l.limit, per);
            }
        }
        if let Some(d) = &self.dkim {
            let pem = std::fs::read_to_string(&d.key_file).map_err(|e| {
                bad(
                    "dkim.key_file",
                    format!("cannot read {}: {e}", d.key_file.display()),
                )
            })?;
            c.dkim = Some(
                onus_mail::Dkim::new(&d.domain, &d.selector, &pem)
                    .map_err(|e| ConfigError(format!("[mail] {e}")))?,
            );
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::parse;

    #[test]
    fn the_mail_section_resolves_or_names_the_bad_key() {
        let c = parse(
            r#"
            [mail]
            url = "smtp://user:password@relay.example.com:587?tls=required"
            from = "Example <noreply@example.com>"
            message_id_domain = "example.com"
            timeout = "30s"
            recipient_limit = { limit = 30, per = "1h" }
            owner_limit = { limit = 5, per = "1h" }
            "#,
        )
        .unwrap();
        let section = c.mail.unwrap();
        assert!(!format!("{section:?}").contains("password"), "{section:?}");
        let m = section.resolve().unwrap();
        assert!(!format!("{m:?}").contains("password"), "{m:?}");
        assert_eq!(m.relay.port, 587);
        assert_eq!(m.recipient_limit, (30, Duration::from_secs(3600)));
        assert_eq!(m.owner_limit, (5, Duration::from_secs(3600)));
        assert_eq!(m.message_id_domain, "example.com");
        // The domain defaults to the sender's.
        let c = parse("[mail]\nurl = \"smtp://127.0.0.1:2525\"\nfrom = \"a@mail.example.org\"")
            .unwrap();
        assert_eq!(
            c.mail.unwrap().resolve().unwrap().message_id_domain,
            "mail.example.org"
        );
        for (text, says) in [
            ("[mail]\nfrom = \"a@example.com\"", "[mail] url"),
            ("[mail]\nurl = \"http://relay\"\nfrom = \"a@example.com\"", "[mail] url: scheme http"),
            ("[mail]\nurl = \"smtp://relay\"", "[mail] message_id_domain"),
            ("[mail]\nurl = \"smtp://relay\"\nfrom = \"nobody\"", "[mail] "),
            ("[mail]\nurl = \"smtp://relay\"\nfrom = \"a@example.com\"\nowner_limit = { limit = 0, per = \"1h\" }", "[mail] owner_limit"),
            ("[mail]\nurl = \"smtp://relay\"\nfrom = \"a@example.com\"\ntimeout = \"soon\"", "[mail] timeout"),
            ("[mail]\nurl = \"smtp://relay\"\nfrom = \"a@example.com\"\nretries = 3", "retries"),
            ("[mail]\nurl = \"smtp://relay\"\nfrom = \"a@example.com\"\ndkim = { domain = \"example.com\", selector = \"s1\", key_file = \"/nonexistent.pem\" }", "[mail] dkim.key_file"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.0.contains(says), "{text}: {e}");
        }
    }
}
