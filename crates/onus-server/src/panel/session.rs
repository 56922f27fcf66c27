//! Panel sessions: a cookie signed with a key kept in the database (so every process sharing a
//! PostgreSQL database accepts it, and a cookie made by another server is refused), expiring after
//! [`SESSION_FOR`]; a CSRF token derived from the session, checked on every POST; and a counter of
//! failed logins per address.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine as _;
use hmac::{KeyInit, Mac};
use subtle::ConstantTimeEq as _;

use crate::secrets::{self, Secrets};

/// How long a session lasts.
pub const SESSION_FOR: Duration = Duration::from_secs(12 * 3600);
/// The session cookie's name.
pub const COOKIE: &str = "onus_session";
/// The name the session key is kept under.
const KEY_NAME: &str = "panel.session_key";
/// Failed logins from one address within [`FAILURE_WINDOW`] before it is refused for as long.
pub const MAX_FAILURES: usize = 5;
/// See [`MAX_FAILURES`].
pub const FAILURE_WINDOW: Duration = Duration::from_secs(60);

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// Makes and checks sessions.
///
/// A session is signed over the credential it was opened with (the panel password, or the API
/// token current at login) and the session key: changing the password, rotating the token
/// (`onus token rotate`) or rotating the key (`onus sessions revoke`) ends every session in every
/// process sharing the database. The key is read from the database on each check, so a revoke
/// made elsewhere takes effect at the next page.
pub struct Sessions {
    secrets: Secrets,
    failures: Mutex<HashMap<IpAddr, Tries>>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions").finish_non_exhaustive()
    }
}

/// A valid session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// Its random id (part of the cookie).
    pub id: String,
    /// The token every form of this session carries.
    pub csrf: String,
    /// What the last action did, shown once on the page it led to (see `Panel::notify`).
    pub notice: Option<String>,
}

impl Sessions {
    /// Sessions signed with the key kept in `secrets` (made on first use).
    pub fn new(secrets: Secrets) -> Self {
        Sessions {
            secrets,
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// The signing key for sessions opened with `credential` (a fingerprint of the password or
    /// token): the stored session key, bound to the credential.
    async fn key(&self, credential: &str) -> Result<Vec<u8>, onus::StoreError> {
        let now = chrono::Utc::now();
        let stored = match self.secrets.valid(KEY_NAME, now).await?.into_iter().next() {
            Some(v) => v,
            None => {
                self.secrets
                    .ensure(KEY_NAME, secrets::generate(""), now)
                    .await?
                    .0
            }
        };
        Ok(Self::mac(
            stored.value.as_bytes(),
            &format!("credential:{credential}"),
        ))
    }

    /// Ends every session: a new session key, the previous one refused at once.
    pub async fn revoke_all(&self) -> Result<(), onus::StoreError> {
        self.secrets
            .rotate(
                KEY_NAME,
                secrets::generate(""),
                chrono::Utc::now(),
                Duration::ZERO,
            )
            .await
            .map(|_| ())
    }

    fn mac(key: &[u8], what: &str) -> Vec<u8> {
        // HMAC takes a key of any length.
        let mut m = <HmacSha256 as KeyInit>::new_from_slice(key).expect("any key length");
        m.update(what.as_bytes());
        m.finalize().into_bytes().to_vec()
    }

    /// A new session cookie value for a login with `credential`, valid until `now` +
    /// [`SESSION_FOR`].
    pub async fn create(
        &self,
        now: chrono::DateTime<chrono::Utc>,
        credential: &str,
    ) -> Result<String, onus::StoreError> {
        let key = self.key(credential).await?;
        let id = secrets::generate("");
        let until =
            (now + chrono::TimeDelta::from_std(SESSION_FOR).unwrap_or_default()).timestamp();
        let body = format!("{id}.{until}");
        let sig = B64.encode(Self::mac(&key, &format!("session:{body}")));
        Ok(format!("{body}.{sig}"))
    }

    /// The session a cookie value names, if it is genuine, not expired, and opened with the
    /// `credential` that is current.
    pub async fn check(
        &self,
        cookie: &str,
        now: chrono::DateTime<chrono::Utc>,
        credential: &str,
    ) -> Result<Option<Session>, onus::StoreError> {
        let key = self.key(credential).await?;
        let mut parts = cookie.rsplitn(2, '.');
        let (Some(sig), Some(body)) = (parts.next(), parts.next()) else {
            return Ok(None);
        };
        let want = Self::mac(&key, &format!("session:{body}"));
        let Ok(got) = B64.decode(sig) else {
            return Ok(None);
        };
        if got.len() != want.len() || !bool::from(got.ct_eq(&want)) {
            return Ok(None);
        }
        let Some((id, until)) = body.split_once('.') else {
            return Ok(None);
        };
        let Ok(until) = until.parse::<i64>() else {
            return Ok(None);
        };
        if until <= now.timestamp() {
            return Ok(None);
        }
        let csrf = B64.encode(Self::mac(&key, &format!("csrf:{id}")));
        Ok(Some(Session {
            id: id.to_string(),
            csrf,
            notice: None,
        }))
    }

    /// Whether `given` is the session's CSRF token (compared in constant time).
    pub fn csrf_ok(session: &Session, given: &str) -> bool {
        session.csrf.len() == given.len()
            && bool::from(session.csrf.as_bytes().ct_eq(given.as_bytes()))
    }

    /// Whether `addr` may try to log in now: not while it is refused, for a whole
    /// [`FAILURE_WINDOW`] after its [`MAX_FAILURES`]th failure within one.
    pub fn may_try(&self, addr: IpAddr) -> bool {
        let f = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        f.get(&addr)
            .and_then(|t| t.refused_until)
            .is_none_or(|until| Instant::now() >= until)
    }

    /// Counts a failed login from `addr`; the [`MAX_FAILURES`]th within a minute refuses the
    /// address for the next minute.
    pub fn failed(&self, addr: IpAddr) {
        let mut f = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        if f.len() > 10_000 {
            // Bounded: addresses with nothing recent are forgotten.
            f.retain(|_, t| !t.lapsed());
        }
        let t = f.entry(addr).or_default();
        let now = Instant::now();
        t.failures.retain(|at| at.elapsed() < FAILURE_WINDOW);
        t.failures.push(now);
        if t.failures.len() >= MAX_FAILURES {
            t.failures.clear();
            t.refused_until = Some(now + FAILURE_WINDOW);
        }
    }
}

/// One address's recent failed logins, and until when it is refused.
#[derive(Debug, Default)]
struct Tries {
    failures: Vec<Instant>,
    refused_until: Option<Instant>,
}

impl Tries {
    fn lapsed(&self) -> bool {
        self.refused_until.is_none_or(|u| Instant::now() >= u)
            && self.failures.iter().all(|t| t.elapsed() >= FAILURE_WINDOW)
    }
}
