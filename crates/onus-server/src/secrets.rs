//! Secrets the server keeps in the database, so every process sharing it agrees: the API token
//! (rotated with a grace period for the previous one) and the signing secrets of push kinds.
//! A component like the others: its table in its own migration line, its SQL on the shared
//! database layer.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use onus::sql::{FromRow, Line, Row, Sql, Tx};
use onus::store::Db;
use onus::{Store, StoreResult, Timestamp};
use rand::RngCore as _;

/// The server's migration line.
pub static MIGRATIONS: Line = Line {
    name: "server",
    sqlite: onus::migrations!("../migrations/sqlite", "001_secrets.sql"),
    postgres: onus::migrations!("../migrations/postgres", "001_secrets.sql"),
};

const TABLE: &str = "onus_server_secrets";

/// The API token's name in the table.
pub const API_TOKEN: &str = "api_token";

/// The name a push kind's signing secret is kept under.
pub fn kind_secret_name(kind: &str) -> String {
    format!("kind:{kind}")
}

static CREATE: Sql = Sql::new(
    TABLE,
    "INSERT INTO onus_server_secrets (name, version, value, created_at) VALUES ($1, 1, $2, $3)
     ON CONFLICT (name, version) DO NOTHING",
);

static VALID: Sql = Sql::new(
    TABLE,
    "SELECT version, value, expires_at FROM onus_server_secrets
     WHERE name = $1 AND (expires_at IS NULL OR expires_at > $2) ORDER BY version DESC",
);

static RETIRE: Sql = Sql::new(
    TABLE,
    "UPDATE onus_server_secrets SET expires_at = $1 WHERE name = $2 AND (expires_at IS NULL OR expires_at > $1)",
);

static NEXT: Sql = Sql::new(
    TABLE,
    "INSERT INTO onus_server_secrets (name, version, value, created_at)
     SELECT $1, COALESCE(MAX(version), 0) + 1, $2, $3 FROM onus_server_secrets WHERE name = $1",
);

/// One valid version of a secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Version {
    /// Its number (1 for the first, one more per rotation).
    pub version: i64,
    /// The secret itself.
    pub value: String,
    /// Until when it is accepted (`None`: the current one, until the next rotation).
    pub expires_at: Option<Timestamp>,
}

impl std::fmt::Debug for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Version")
            .field("version", &self.version)
            .field("value", &"(hidden)")
            .field("expires_at", &self.expires_at)
            .finish()
    }
}

impl FromRow for Version {
    fn from_row(r: &Row) -> StoreResult<Self> {
        Ok(Version {
            version: r.get("version")?,
            value: r.get("value")?,
            expires_at: r.get("expires_at")?,
        })
    }
}

/// A strong random token: `prefix` and 32 random bytes in URL-safe base64.
pub fn generate(prefix: &str) -> String {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    format!(
        "{prefix}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

/// The server's secrets table. With an encryption key, values are stored encrypted under it
/// (the key that seals webhook secrets), and opened when read.
#[derive(Debug, Clone)]
pub struct Secrets {
    db: Db,
    key: Option<onus_webhooks::crypto::Key>,
}

impl onus::Component for Secrets {
    fn migrations(&self) -> Option<&'static Line> {
        Some(&MIGRATIONS)
    }

    fn install(&self, b: onus::Builder) -> onus::Builder {
        b
    }

    fn bind(&self, _client: onus::Client) {}
}

async fn valid_in<T: Tx + ?Sized>(tx: &T, name: &str, now: Timestamp) -> StoreResult<Vec<Version>> {
    tx.fetch(&VALID, &[name.into(), now.into()]).await
}

static ALL: Sql = Sql::new(
    TABLE,
    "SELECT name, version, value FROM onus_server_secrets",
);

static SET_VALUE: Sql = Sql::new(
    TABLE,
    "UPDATE onus_server_secrets SET value = $1 WHERE name = $2 AND version = $3",
);

struct Stored {
    name: String,
    version: i64,
    value: String,
}

impl FromRow for Stored {
    fn from_row(r: &Row) -> StoreResult<Self> {
        Ok(Stored {
            name: r.get("name")?,
            version: r.get("version")?,
            value: r.get("value")?,
        })
    }
}

impl Secrets {
    /// The table in `store`'s database, its values sealed under `key` when one is given.
    pub fn new(store: Arc<dyn Store>, key: Option<onus_webhooks::crypto::Key>) -> Self {
        Secrets {
            db: Db::new(store),
            key,
        }
    }

    fn seal(&self, v: String) -> String {
        match &self.key {
            Some(k) => k.seal(&v),
            None => v,
        }
    }

    fn open(&self, mut v: Version) -> StoreResult<Version> {
        v.value = onus_webhooks::crypto::open_all(self.key.as_ref(), &[v.value])
            .map_err(|e| onus::StoreError::Query(format!("server secret: {e}"), None))?
            .remove(0);
        Ok(v)
    }

    /// Checks that every stored secret opens with the configured key, and encrypts the
    /// plaintext ones when a key is configured; returns how many were encrypted now.
    pub async fn seal_stored(&self) -> StoreResult<usize> {
        let rows: Vec<Stored> = self.db.read_rows(&ALL, Vec::new()).await?;
        let mut changed = 0;
        for r in rows {
            onus_webhooks::crypto::open_all(self.key.as_ref(), std::slice::from_ref(&r.value))
                .map_err(|e| {
                    onus::StoreError::Query(format!("server secret {}: {e}", r.name), None)
                })?;
            let Some(k) = &self.key else { continue };
            if onus_webhooks::crypto::is_sealed(&r.value) {
                continue;
            }
            let params = vec![k.seal(&r.value).into(), r.name.into(), r.version.into()];
            self.db.execute(&SET_VALUE, params).await?;
            changed += 1;
        }
        Ok(changed)
    }

    /// Re-encrypts every stored secret under `new` (from the configured key or plaintext) in
    /// one transaction; returns how many.
    pub async fn reencrypt(&self, new: &onus_webhooks::crypto::Key) -> StoreResult<usize> {
        let rows: Vec<Stored> = self.db.read_rows(&ALL, Vec::new()).await?;
        let mut sealed = Vec::with_capacity(rows.len());
        for r in rows {
            let plain = onus_webhooks::crypto::open_all(self.key.as_ref(), &[r.value])
                .map_err(|e| {
                    onus::StoreError::Query(format!("server secret {}: {e}", r.name), None)
                })?
                .remove(0);
            sealed.push((new.seal(&plain), r.name, r.version));
        }
        let n = sealed.len();
        self.db
            .tx(move |tx| {
                Box::pin(async move {
                    for (v, name, version) in sealed {
                        tx.execute(&SET_VALUE, &[v.into(), name.into(), version.into()])
                            .await?;
                    }
                    Ok::<_, onus::StoreError>(())
                })
            })
            .await?;
        Ok(n)
    }

    /// The versions of `name` accepted at `now`, newest first.
    pub async fn valid(&self, name: &str, now: Timestamp) -> StoreResult<Vec<Version>> {
        let name = name.to_string();
        let rows = self
            .db
            .read(move |tx| Box::pin(async move { valid_in(tx, &name, now).await }))
            .await?;
        rows.into_iter().map(|v| self.open(v)).collect()
    }

    /// The current version of `name`, created as `fresh` when there is none yet (two processes
    /// starting at once agree on one). True when this call created it.
    pub async fn ensure(
        &self,
        name: &str,
        fresh: String,
        now: Timestamp,
    ) -> StoreResult<(Version, bool)> {
        let name = name.to_string();
        let fresh = self.seal(fresh);
        let (v, created) = self
            .db
            .tx(move |tx| {
                Box::pin(async move {
                    if let Some(v) = valid_in(tx, &name, now).await?.into_iter().next() {
                        return Ok((v, false));
                    }
                    let created = tx
                        .execute(&CREATE, &[name.as_str().into(), fresh.into(), now.into()])
                        .await?
                        > 0;
                    let v = valid_in(tx, &name, now)
                        .await?
                        .into_iter()
                        .next()
                        .ok_or_else(|| {
                            onus::StoreError::Query(
                                format!(
                            "the secret {name} exists but none of its versions is valid; rotate it"
                        ),
                                None,
                            )
                        })?;
                    Ok((v, created))
                })
            })
            .await?;
        Ok((self.open(v)?, created))
    }

    /// Replaces the current version of `name` with `fresh`; the versions valid until now stay
    /// valid for `grace` more (zero: refused at once).
    pub async fn rotate(
        &self,
        name: &str,
        fresh: String,
        now: Timestamp,
        grace: Duration,
    ) -> StoreResult<Version> {
        let name = name.to_string();
        let until = onus::clock::add(now, grace);
        let fresh = self.seal(fresh);
        let v = self
            .db
            .tx(move |tx| {
                Box::pin(async move {
                    tx.execute(&RETIRE, &[until.into(), name.as_str().into()])
                        .await?;
                    tx.execute(&NEXT, &[name.as_str().into(), fresh.into(), now.into()])
                        .await?;
                    valid_in(tx, &name, now)
                        .await?
                        .into_iter()
                        .find(|v| v.expires_at.is_none())
                        .ok_or_else(|| {
                            onus::StoreError::Query("the rotation wrote nothing".into(), None)
                        })
                })
            })
            .await?;
        self.open(v)
    }
}
