//! The API token: configured (`ONUS_API_TOKEN`, `api_token`), or generated on the first start and
//! kept in the database so every process sharing it accepts the same token. Compared in
//! constant time; never logged.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::Response;
use subtle::ConstantTimeEq as _;

use super::{ApiError, App};
use crate::secrets::{self, Secrets, Version};

/// How long the accepted tokens are cached before they are read again (so a token retired by
/// another process stops working here within this long). A token this process has not seen
/// (made by a rotation elsewhere) is looked up at once: misses share one read at a time, so
/// wrong tokens cost the database at most one small read in flight.
const CACHE_FOR: Duration = Duration::from_secs(10);

/// The prefix of generated API tokens.
pub const TOKEN_PREFIX: &str = "onus_";

/// Checks bearer tokens.
pub struct Auth {
    configured: Option<String>,
    secrets: Secrets,
    cache: Mutex<Cache>,
    reading: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("configured", &self.configured.is_some())
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Cache {
    tokens: Vec<Version>,
    /// When the read that filled it began.
    read_at: Option<Instant>,
}

/// Compares two tokens in constant time, their lengths included: both are hashed first, so the
/// comparison always runs over 32 bytes.
fn matches(a: &str, b: &str) -> bool {
    use sha2::Digest as _;
    let (x, y) = (
        sha2::Sha256::digest(a.as_bytes()),
        sha2::Sha256::digest(b.as_bytes()),
    );
    bool::from(x.as_slice().ct_eq(y.as_slice()))
}

/// SHA-256 of a credential, in hex: safe to mix into a signature, never the credential.
pub fn fingerprint(credential: &str) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(credential.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Auth {
    /// Checks against `configured` when set, else against the tokens kept in the database.
    pub fn new(configured: Option<String>, secrets: Secrets) -> Self {
        Auth {
            configured,
            secrets,
            cache: Mutex::new(Cache::default()),
            reading: tokio::sync::Mutex::new(()),
        }
    }

    /// Whether the token is configured rather than kept in the database.
    pub fn is_configured(&self) -> bool {
        self.configured.is_some()
    }

    /// Whether `presented` is among the cached tokens (and the cache is fresh), and when the
    /// cache was read.
    fn cached(&self, presented: &str, now: onus::Timestamp) -> (bool, Option<Instant>) {
        let c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let hit = c.tokens.iter().fold(false, |any, v| {
            // Every version is compared, so the time taken does not tell which one matched.
            let valid = v.expires_at.is_none_or(|t| t > now);
            any | (matches(&v.value, presented) & valid)
        });
        let fresh = c.read_at.is_some_and(|t| t.elapsed() < CACHE_FOR);
        (hit && fresh, c.read_at)
    }

    /// Reads the accepted tokens again.
    pub async fn refresh(&self) -> Result<(), onus::StoreError> {
        // Stamped with when the read began: it sees every token made before then.
        let began = Instant::now();
        let tokens = self
            .secrets
            .valid(secrets::API_TOKEN, chrono::Utc::now())
            .await?;
        let mut c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        c.tokens = tokens;
        c.read_at = Some(began);
        Ok(())
    }

    /// The current token (the configured one, or the newest kept in the database, read again
    /// now so a rotation in any process counts at once) with its version, if there is one.
    async fn current(&self) -> Result<Option<(i64, String)>, onus::StoreError> {
        if let Some(t) = &self.configured {
            return Ok(Some((0, t.clone())));
        }
        self.refresh().await?;
        let c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        Ok(c.tokens
            .iter()
            .find(|v| v.expires_at.is_none())
            .map(|v| (v.version, v.value.clone())))
    }

    /// A fingerprint of the current token: what panel sessions are bound to, so a rotation ends
    /// them. Never the token itself.
    pub async fn fingerprint(&self) -> Result<String, onus::StoreError> {
        let current = self.current().await?;
        Ok(fingerprint(
            &current.map(|(v, t)| format!("{v}:{t}")).unwrap_or_default(),
        ))
    }

    /// Whether `presented` is the current token, not one kept for a rotation's grace: a panel
    /// login takes only this, so no session rests on a retired token.
    pub async fn is_current(&self, presented: &str) -> Result<bool, onus::StoreError> {
        Ok(self
            .current()
            .await?
            .is_some_and(|(_, t)| matches(&t, presented)))
    }

    /// True when `presented` is an accepted token.
    pub async fn check(&self, presented: &str) -> Result<bool, ApiError> {
        if let Some(t) = &self.configured {
            return Ok(matches(t, presented));
        }
        let now = chrono::Utc::now();
        let asked = Instant::now();
        if self.cached(presented, now).0 {
            return Ok(true);
        }
        let _one_at_a_time = self.reading.lock().await;
        // A read that began after this request did sees what this one would.
        let (hit, read_at) = self.cached(presented, now);
        if hit || read_at.is_some_and(|t| t > asked) {
            return Ok(hit);
        }
        self.refresh().await?;
        Ok(self.cached(presented, now).0)
    }
}

/// The bearer token of a request, if it sent one.
pub fn bearer(req: &Request) -> Option<&str> {
    let v = req.headers().get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Middleware: refuses a URL whose path or query holds a NUL character (`%00`), which no
/// database stores alike, with 422 before anything reads it.
pub async fn refuse_nul(req: Request, next: Next) -> Result<Response, ApiError> {
    if let Some(e) = nul_in(req.uri()) {
        return Err(e);
    }
    Ok(next.run(req).await)
}

/// The refusal of a URL whose path or query holds a NUL (`%00`), which no database stores.
pub fn nul_in(uri: &axum::http::Uri) -> Option<ApiError> {
    let raw = format!("{}?{}", uri.path(), uri.query().unwrap_or_default());
    raw.to_ascii_lowercase()
        .contains("%00")
        .then(|| ApiError::invalid("the URL contains a NUL character (%00); remove it"))
}

/// Refuses a request without an accepted token with 401.
pub async fn authorize(app: &App, token: Option<String>) -> Result<(), ApiError> {
    let Some(token) = token else {
        return Err(ApiError::unauthorized());
    };
    if !app.auth.check(&token).await? {
        return Err(ApiError::unauthorized());
    }
    Ok(())
}

/// Middleware: refuses a request without an accepted token with 401, before it is read.
pub async fn require_token(
    State(app): State<App>,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    authorize(&app, bearer(&req).map(str::to_owned)).await?;
    Ok(next.run(req).await)
}
