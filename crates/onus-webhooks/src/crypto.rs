//! Endpoint secrets encrypted at rest: XChaCha20-Poly1305 (a random 24-byte nonce per value)
//! under a 32-byte key the operator configures. A stored secret is `enc:v1:` and the base64 of
//! nonce and ciphertext; one without the prefix is plaintext (stored before a key was set, and
//! encrypted at the next start with a key).

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use chacha20poly1305::aead::{Aead, KeyInit};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};

/// The prefix of an encrypted value.
pub const PREFIX: &str = "enc:v1:";

/// A key for secrets at rest; during a key rotation, a ring of them: the first seals, every one
/// opens (so servers not yet restarted on the new key keep working while the others are).
#[derive(Clone)]
pub struct Key(Vec<XChaCha20Poly1305>);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(hidden)")
    }
}

/// A key or an encrypted value that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CryptoError {
    /// The key is not 32 bytes of base64.
    #[error("the encryption key must be 32 bytes in base64 (44 characters; `onus encryption generate` makes one): {0}")]
    BadKey(String),
    /// A value does not decrypt under the key: another key encrypted it, or it was altered.
    #[error("a stored secret does not decrypt with the configured encryption key (encrypted under another key, or altered); configure the key it was encrypted with")]
    WrongKey,
}

impl Key {
    /// A key from its base64 text; several separated by commas or whitespace make a ring whose
    /// first key seals (`new,old` while a rotation rolls out).
    pub fn from_base64(text: &str) -> Result<Key, CryptoError> {
        let mut ring = Vec::new();
        for part in text
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|p| !p.is_empty())
        {
            let bytes = B64
                .decode(part)
                .map_err(|e| CryptoError::BadKey(e.to_string()))?;
            if bytes.len() != 32 {
                return Err(CryptoError::BadKey(format!("{} bytes given", bytes.len())));
            }
            ring.push(
                XChaCha20Poly1305::new_from_slice(&bytes)
                    .map_err(|e| CryptoError::BadKey(e.to_string()))?,
            );
        }
        if ring.is_empty() {
            return Err(CryptoError::BadKey("no key given".into()));
        }
        Ok(Key(ring))
    }

    /// A fresh random key, as base64.
    pub fn generate() -> String {
        let k: [u8; 32] = rand::random();
        B64.encode(k)
    }

    /// `plain`, encrypted.
    pub fn seal(&self, plain: &str) -> String {
        let n: [u8; 24] = rand::random();
        let nonce = XNonce::from_slice(&n);
        // Encryption of a bounded in-memory value with a valid key does not fail.
        let ct = self.0[0]
            .encrypt(nonce, plain.as_bytes())
            .unwrap_or_default();
        let mut out = n.to_vec();
        out.extend(ct);
        format!("{PREFIX}{}", B64.encode(out))
    }

    /// A stored value, decrypted (a plaintext one as it is).
    pub fn open(&self, stored: &str) -> Result<String, CryptoError> {
        let Some(b64) = stored.strip_prefix(PREFIX) else {
            return Ok(stored.to_string());
        };
        let raw = B64.decode(b64).map_err(|_| CryptoError::WrongKey)?;
        if raw.len() < 24 {
            return Err(CryptoError::WrongKey);
        }
        let (n, ct) = raw.split_at(24);
        let plain = self
            .0
            .iter()
            .find_map(|k| k.decrypt(XNonce::from_slice(n), ct).ok())
            .ok_or(CryptoError::WrongKey)?;
        String::from_utf8(plain).map_err(|_| CryptoError::WrongKey)
    }
}

/// Whether a stored value is encrypted.
pub fn is_sealed(stored: &str) -> bool {
    stored.starts_with(PREFIX)
}

/// Stored secrets as plaintext: decrypted with `key`, or an error when one is encrypted and no
/// key is configured.
pub fn open_all(key: Option<&Key>, stored: &[String]) -> Result<Vec<String>, CryptoError> {
    stored
        .iter()
        .map(|s| match key {
            Some(k) => k.open(s),
            None if is_sealed(s) => Err(CryptoError::WrongKey),
            None => Ok(s.clone()),
        })
        .collect()
}

/// Secrets to store: encrypted when a key is configured.
pub fn seal_all(key: Option<&Key>, plain: &[String]) -> Vec<String> {
    plain
        .iter()
        .map(|s| match key {
            Some(k) => k.seal(s),
            None => s.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_sealed_secret_opens_only_with_its_key() {
        let k = Key::from_base64(&Key::generate()).unwrap();
        let other = Key::from_base64(&Key::generate()).unwrap();
        let s = k.seal("whsec_abc");
        assert!(is_sealed(&s) && !s.contains("whsec_abc"));
        assert_ne!(k.seal("whsec_abc"), s, "a fresh nonce each time");
        assert_eq!(k.open(&s).unwrap(), "whsec_abc");
        assert_eq!(other.open(&s), Err(CryptoError::WrongKey));
        assert_eq!(k.open("whsec_plain").unwrap(), "whsec_plain");
        let mut altered = s.clone();
        altered.pop();
        altered.push(if s.ends_with('A') { 'B' } else { 'A' });
        assert_eq!(k.open(&altered), Err(CryptoError::WrongKey));
        assert!(
            open_all(None, std::slice::from_ref(&s)).is_err(),
            "no key, sealed: refused"
        );
        // A ring: the first key seals, every one opens.
        let (a, b) = (Key::generate(), Key::generate());
        let ring = Key::from_base64(&format!("{b},{a}")).unwrap();
        let old = Key::from_base64(&a).unwrap();
        assert_eq!(ring.open(&old.seal("x")).unwrap(), "x");
        assert!(
            old.open(&ring.seal("y")).is_err(),
            "the ring seals with its first key"
        );
        assert!(matches!(
            Key::from_base64("c2hvcnQ="),
            Err(CryptoError::BadKey(_))
        ));
    }
}
