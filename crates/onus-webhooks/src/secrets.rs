//! Endpoint signing secrets: sealing at rest, rotation and re-encryption.

use crate::{crypto, signing, sql, Endpoint, Error, Webhooks};

impl Webhooks {
    pub(crate) fn seal(&self, secret: &str) -> String {
        crypto::seal_all(
            self.inner.cfg.encryption_key.as_ref(),
            &[secret.to_string()],
        )
        .remove(0)
    }

    /// An endpoint's signing secrets in plaintext, newest first.
    pub(crate) fn plain_secrets(&self, ep: &Endpoint) -> Result<Vec<String>, crypto::CryptoError> {
        crypto::open_all(self.inner.cfg.encryption_key.as_ref(), &ep.secrets)
    }

    /// Checks that every stored secret opens with the configured key (or that none is encrypted
    /// when no key is configured), and encrypts the plaintext ones when a key is configured.
    /// Returns how many endpoints were encrypted now. Run at every start.
    pub async fn seal_stored_secrets(&self) -> Result<usize, Error> {
        let key = self.inner.cfg.encryption_key.clone();
        let mut changed = 0;
        for ep in self.endpoints().await? {
            crypto::open_all(key.as_ref(), &ep.secrets)
                .map_err(|e| Error::Invalid(format!("endpoint {}: {e}", ep.id)))?;
            let Some(k) = &key else { continue };
            if ep.secrets.iter().all(|s| crypto::is_sealed(s)) {
                continue;
            }
            let sealed: Vec<String> = ep
                .secrets
                .iter()
                .map(|s| {
                    if crypto::is_sealed(s) {
                        s.clone()
                    } else {
                        k.seal(s)
                    }
                })
                .collect();
            let now = chrono::Utc::now();
            let id = ep.id.clone();
            self.inner
                .db
                .tx(move |tx| {
                    Box::pin(async move { sql::set_secrets(tx, &id, &sealed, now).await })
                })
                .await?;
            changed += 1;
        }
        Ok(changed)
    }

    /// Re-encrypts every endpoint's secrets under `new` (from the configured key, or from
    /// plaintext), in one transaction; returns how many endpoints. Configure `new` afterwards.
    pub async fn reencrypt(&self, new: &crypto::Key) -> Result<usize, Error> {
        let old = self.inner.cfg.encryption_key.clone();
        let mut rows = Vec::new();
        for ep in self.endpoints().await? {
            let plain = crypto::open_all(old.as_ref(), &ep.secrets)
                .map_err(|e| Error::Invalid(format!("endpoint {}: {e}", ep.id)))?;
            rows.push((ep.id, plain.iter().map(|s| new.seal(s)).collect::<Vec<_>>()));
        }
        let n = rows.len();
        let now = chrono::Utc::now();
        self.inner
            .db
            .tx(move |tx| {
                Box::pin(async move {
                    for (id, sealed) in rows {
                        sql::set_secrets(tx, &id, &sealed, now).await?;
                    }
                    Ok::<_, Error>(())
                })
            })
            .await?;
        Ok(n)
    }

    /// Adds a new signing secret (made when `secret` is `None`) while keeping the previous one,
    /// so consumers can switch over: deliveries are signed with both until the next rotation.
    /// Returns the new secret.
    pub async fn rotate_secret(&self, id: &str, secret: Option<String>) -> Result<String, Error> {
        let ep = self.endpoint(id).await?;
        let new = match secret {
            Some(s) => {
                signing::check_secret(&s)?;
                s
            }
            None => signing::new_secret(),
        };
        // Stored as they are: the previous one is kept in whatever form it was stored.
        let mut secrets = vec![self.seal(&new)];
        secrets.extend(ep.secrets.into_iter().take(1));
        let now = self.client()?.now();
        let id = ep.id;
        self.inner
            .db
            .tx(move |tx| Box::pin(async move { sql::set_secrets(tx, &id, &secrets, now).await }))
            .await?;
        Ok(new)
    }
}
