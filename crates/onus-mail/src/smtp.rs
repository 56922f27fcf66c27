//! One SMTP session per job attempt, through the configured relay: connect (implicit TLS, or
//! STARTTLS when the URL asks for it), authenticate, `MAIL FROM`, one `RCPT TO` per recipient,
//! `DATA`, `QUIT`. Nothing here tries anything twice: a failure is classified and returned, and
//! the job layer decides when to try again.

use std::time::Duration;

use lettre::transport::smtp::authentication::{Credentials, Mechanism};
use lettre::transport::smtp::client::{AsyncSmtpConnection, Certificate, TlsParameters};
use lettre::transport::smtp::commands::{Data, Mail, Rcpt};
use lettre::transport::smtp::extension::{ClientId, Extension, MailBodyParameter, MailParameter};
use lettre::Address;

use crate::Error;

/// How a session is encrypted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Security {
    /// Plain text (`smtp://` without `tls`).
    None,
    /// STARTTLS when the relay offers it (`?tls=opportunistic`).
    Opportunistic,
    /// STARTTLS, refusing a relay that does not offer it (`?tls=required`).
    Required,
    /// TLS from the first byte (`smtps://`).
    Implicit,
}

/// The relay, from its URL: `smtp://user:password@host:587?tls=required` or `smtps://host`.
#[derive(Clone)]
pub struct Relay {
    /// Host name or address.
    pub host: String,
    /// Port.
    pub port: u16,
    /// Encryption.
    pub security: Security,
    credentials: Option<(String, String)>,
    /// Extra root certificates (PEM) trusted besides the system's.
    pub roots: Vec<Vec<u8>>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("security", &self.security)
            .field("user", &self.credentials.as_ref().map(|(u, _)| u))
            .finish()
    }
}

impl Relay {
    /// Parses a relay URL. Errors say what to write; they never repeat the password.
    pub fn parse(raw: &str) -> Result<Relay, String> {
        let url = url::Url::parse(raw).map_err(|e| {
            format!("not a URL ({e}); write smtp://user:password@relay.example.com:587?tls=required or smtps://relay.example.com")
        })?;
        let implicit = match url.scheme() {
            "smtp" => false,
            "smtps" => true,
            s => {
                return Err(format!(
                    "scheme {s}: use smtp:// (plain or STARTTLS) or smtps:// (implicit TLS)"
                ))
            }
        };
        let host = url
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or("name the relay's host: smtp://relay.example.com")?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let mut security = if implicit {
            Security::Implicit
        } else {
            Security::None
        };
        for (k, v) in url.query_pairs() {
            match (k.as_ref(), v.as_ref(), implicit) {
                ("tls", "required", false) => security = Security::Required,
                ("tls", "opportunistic", false) => security = Security::Opportunistic,
                ("tls", "none", false) => security = Security::None,
                ("tls", _, true) => {
                    return Err("smtps:// is TLS from the start: drop ?tls= (or use smtp:// with ?tls=required for STARTTLS)".into())
                }
                ("tls", other, false) => {
                    return Err(format!("tls={other}: use tls=required, tls=opportunistic or tls=none"))
                }
                (other, _, _) => return Err(format!("unknown URL parameter {other}: only tls is known")),
            }
        }
        let port = url.port().unwrap_or(match security {
            Security::Implicit => 465,
            Security::Required | Security::Opportunistic => 587,
            Security::None => 25,
        });
        let decode = |s: &str| {
            percent_decode(s).ok_or_else(|| {
                "the user or password is not valid percent-encoded UTF-8".to_string()
            })
        };
        let credentials = if url.username().is_empty() {
            None
        } else if security == Security::None {
            return Err("a user and password need TLS, so they are never sent in clear text: add ?tls=required (STARTTLS) or use smtps://".into());
        } else {
            Some((
                decode(url.username())?,
                decode(url.password().unwrap_or(""))?,
            ))
        };
        Ok(Relay {
            host,
            port,
            security,
            credentials,
            roots: Vec::new(),
        })
    }

    fn tls(&self) -> Result<TlsParameters, Error> {
        let mut b = TlsParameters::builder(self.host.clone());
        for pem in &self.roots {
            let cert =
                Certificate::from_pem(pem).map_err(|e| Error::Config(format!("ca_file: {e}")))?;
            b = b.add_root_certificate(cert);
        }
        b.build_rustls()
            .map_err(|e| Error::Config(format!("TLS settings for {}: {e}", self.host)))
    }
}

fn percent_decode(s: &str) -> Option<String> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .ok()
        .map(|c| c.into_owned())
}

/// A recipient the relay refused, with its reply.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Refused {
    /// The address.
    pub address: String,
    /// The relay's reply (code and text).
    pub reply: String,
}

/// What a session that reached the end of `DATA` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    /// Recipients the relay took.
    pub accepted: Vec<String>,
    /// Recipients it refused for good.
    pub refused: Vec<Refused>,
}

/// How a session failed, classified.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// Worth another attempt: a 4xx reply, a connection, TLS or timeout failure.
    #[error("{0}")]
    Transient(String),
    /// Never worth another attempt: a 5xx reply (every recipient refused, say).
    #[error("{0}")]
    Permanent(String),
}

fn classify(step: &str, e: &lettre::transport::smtp::Error) -> SendError {
    let msg = format!("{step}: {e}");
    if e.is_permanent() {
        SendError::Permanent(msg)
    } else {
        SendError::Transient(msg)
    }
}

/// One session: sends `message` from `from` to `rcpts`, within `total`. Once the relay accepted
/// the message, `QUIT` is sent on its own short time, and its answer changes nothing.
pub(crate) async fn send(
    relay: &Relay,
    hello: &str,
    connect_timeout: Duration,
    total: Duration,
    from: &Address,
    rcpts: &[Address],
    message: &[u8],
) -> Result<Accepted, SendError> {
    let mut conn = None;
    let timed = tokio::time::timeout(
        total,
        session(
            &mut conn,
            relay,
            hello,
            connect_timeout,
            from,
            rcpts,
            message,
        ),
    )
    .await;
    let out = match timed {
        Ok(r) => r,
        Err(_) => Err(SendError::Transient(format!(
            "the session with {}:{} took longer than {}s",
            relay.host,
            relay.port,
            total.as_secs_f64()
        ))),
    };
    if let Some(mut c) = conn {
        let bye = async {
            match &out {
                Ok(_) => {
                    let _ = c.quit().await;
                }
                Err(_) => c.abort().await,
            }
        };
        let _ = tokio::time::timeout(QUIT_TIME, bye).await;
    }
    out
}

/// How long `QUIT` may take after the session's work is done.
const QUIT_TIME: Duration = Duration::from_secs(5);

async fn session(
    slot: &mut Option<AsyncSmtpConnection>,
    relay: &Relay,
    hello: &str,
    connect_timeout: Duration,
    from: &Address,
    rcpts: &[Address],
    message: &[u8],
) -> Result<Accepted, SendError> {
    let tls = |r: &Relay| r.tls().map_err(|e| SendError::Permanent(e.to_string()));
    let hello = ClientId::Domain(hello.to_string());
    let implicit = match relay.security {
        Security::Implicit => Some(tls(relay)?),
        _ => None,
    };
    let conn = AsyncSmtpConnection::connect_tokio1(
        (relay.host.as_str(), relay.port),
        Some(connect_timeout),
        &hello,
        implicit,
        None,
    )
    .await
    .map_err(|e| classify(&format!("connect to {}:{}", relay.host, relay.port), &e))?;
    let conn = slot.insert(conn);
    talk(conn, relay, &hello, from, rcpts, message, tls).await
}

async fn talk(
    conn: &mut AsyncSmtpConnection,
    relay: &Relay,
    hello: &ClientId,
    from: &Address,
    rcpts: &[Address],
    message: &[u8],
    tls: impl Fn(&Relay) -> Result<TlsParameters, SendError>,
) -> Result<Accepted, SendError> {
    match relay.security {
        Security::Required if !conn.can_starttls() => {
            return Err(SendError::Transient(format!(
                "{} does not offer STARTTLS, which the relay URL requires (tls=required)",
                relay.host
            )))
        }
        Security::Required | Security::Opportunistic if conn.can_starttls() => {
            conn.starttls(tls(relay)?, hello)
                .await
                .map_err(|e| classify("STARTTLS", &e))?;
        }
        _ => {}
    }
    if let Some((user, password)) = &relay.credentials {
        if !conn.is_encrypted() {
            // tls=opportunistic and the relay offered no STARTTLS (perhaps stripped on the way).
            return Err(SendError::Transient(format!(
                "{} offered no STARTTLS, and the password is never sent in clear text",
                relay.host
            )));
        }
        conn.auth(
            &[Mechanism::Plain, Mechanism::Login],
            &Credentials::new(user.clone(), password.clone()),
        )
        .await
        .map_err(|e| classify("AUTH", &e))?;
    }
    let mut params = Vec::new();
    let utf8 = std::iter::once(from)
        .chain(rcpts)
        .any(|a| !a.to_string().is_ascii());
    if utf8 {
        if !conn.server_info().supports_feature(Extension::SmtpUtfEight) {
            return Err(SendError::Permanent(
                "an address is not ASCII and the relay does not support SMTPUTF8".into(),
            ));
        }
        params.push(MailParameter::SmtpUtfEight);
    }
    if !message.is_ascii() {
        if !conn.server_info().supports_feature(Extension::EightBitMime) {
            return Err(SendError::Permanent(
                "the message is not ASCII and the relay does not support 8BITMIME".into(),
            ));
        }
        params.push(MailParameter::Body(MailBodyParameter::EightBitMime));
    }
    conn.command(Mail::new(Some(from.clone()), params))
        .await
        .map_err(|e| classify("MAIL FROM", &e))?;
    let mut accepted = Vec::new();
    let mut refused = Vec::new();
    for r in rcpts {
        match conn.command(Rcpt::new(r.clone(), vec![])).await {
            Ok(_) => accepted.push(r.to_string()),
            Err(e) if e.is_permanent() => refused.push(Refused {
                address: r.to_string(),
                reply: e.to_string(),
            }),
            // A recipient refused for now: nothing is sent, the whole mail tries again later
            // (so no recipient gets a copy the others do not).
            Err(e) => return Err(classify(&format!("RCPT TO {r}"), &e)),
        }
    }
    if accepted.is_empty() {
        let replies: Vec<String> = refused
            .iter()
            .map(|r| format!("{}: {}", r.address, r.reply))
            .collect();
        return Err(SendError::Permanent(format!(
            "the relay refused every recipient: {}",
            replies.join("; ")
        )));
    }
    conn.command(Data).await.map_err(|e| classify("DATA", &e))?;
    conn.message(message)
        .await
        .map_err(|e| classify("the message", &e))?;
    Ok(Accepted { accepted, refused })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relay_urls_parse_or_say_what_to_write() {
        let r = Relay::parse("smtp://user:p%40ss@relay.example.com:587?tls=required").unwrap();
        assert_eq!(
            (r.host.as_str(), r.port, r.security),
            ("relay.example.com", 587, Security::Required)
        );
        assert_eq!(r.credentials, Some(("user".into(), "p@ss".into())));
        assert!(
            !format!("{r:?}").contains("p@ss"),
            "the password is never printed"
        );
        let r = Relay::parse("smtps://relay.example.com").unwrap();
        assert_eq!((r.port, r.security), (465, Security::Implicit));
        let r = Relay::parse("smtp://127.0.0.1:2525").unwrap();
        assert_eq!(
            (r.port, r.security, r.credentials),
            (2525, Security::None, None)
        );
        for (bad, says) in [
            ("http://relay", "scheme http"),
            ("smtp://relay?tls=yes", "tls=yes"),
            ("smtps://relay?tls=required", "smtps://"),
            ("smtp://relay?pool=1", "unknown URL parameter pool"),
            ("smtp://user:pw@relay", "need TLS"),
            ("relay.example.com", "not a URL"),
        ] {
            let e = Relay::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        let e = Relay::parse("smtp://user:secret@relay?x=1").unwrap_err();
        assert!(!e.contains("secret"));
    }
}
