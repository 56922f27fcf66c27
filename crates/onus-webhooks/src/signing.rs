//! Standard Webhooks signing and verification.
//!
//! Every delivery carries `webhook-id` (the event id, the same on every attempt, for consumers to
//! de-duplicate on), `webhook-timestamp` (the time of *this* attempt, in Unix seconds) and
//! `webhook-signature`: `v1,` + base64 HMAC-SHA256 of `id.timestamp.body`, one per active secret,
//! separated by spaces. A secret is `whsec_` + base64 of its key bytes.
//!
//! The signature itself is the Standard Webhooks project's own crate (`standardwebhooks`). Around
//! it this module adds what a delivery system needs and the crate leaves out: several active
//! secrets at once (rotation), secrets made and checked for strength, and verification against a
//! clock the caller gives (the crate reads the system clock, which a test's manual clock or a
//! consumer replaying a delivery cannot use), over headers as plain name and value pairs.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use subtle::ConstantTimeEq;

/// The header carrying the event id, the same on every attempt (consumers de-duplicate on it).
pub const WEBHOOK_ID: &str = "webhook-id";
/// The header carrying the time of the attempt, in Unix seconds.
pub const WEBHOOK_TIMESTAMP: &str = "webhook-timestamp";
/// The header carrying one signature per active secret.
pub const WEBHOOK_SIGNATURE: &str = "webhook-signature";

/// How far a consumer accepts a timestamp from its own clock (the spec's 5 minutes).
pub const TOLERANCE_SECS: i64 = 300;

/// A new random secret: `whsec_` + base64 of 24 random bytes.
pub fn new_secret() -> String {
    let key: [u8; 24] = rand::random();
    format!("whsec_{}", B64.encode(key))
}

/// The key bytes of a `whsec_...` secret (the prefix is optional, as in the reference libraries).
pub fn key_of(secret: &str) -> Result<Vec<u8>, SignError> {
    let b64 = secret.strip_prefix("whsec_").unwrap_or(secret);
    B64.decode(b64.trim()).map_err(|_| SignError::BadSecret)
}

/// Checks a secret an endpoint owner supplies: `whsec_` + base64 of 24 to 64 bytes.
pub fn check_secret(secret: &str) -> Result<(), SignError> {
    if !secret.starts_with("whsec_") {
        return Err(SignError::WeakSecret);
    }
    match key_of(secret)?.len() {
        24..=64 => Ok(()),
        _ => Err(SignError::WeakSecret),
    }
}

/// A problem with a secret or a signature.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignError {
    /// The secret is not `whsec_` + base64.
    #[error("a webhook secret is \"whsec_\" followed by base64; this one is not")]
    BadSecret,
    /// The secret's key is too short or too long.
    #[error("a webhook secret is \"whsec_\" followed by the base64 of 24 to 64 random bytes")]
    WeakSecret,
    /// A required header is missing.
    #[error("the {0} header is missing")]
    MissingHeader(&'static str),
    /// The timestamp is not a number.
    #[error("webhook-timestamp is not a Unix time in seconds")]
    BadTimestamp,
    /// The timestamp is too far from now.
    #[error("webhook-timestamp is more than 5 minutes from now")]
    Stale,
    /// No signature matches.
    #[error("no webhook-signature matches")]
    NoMatch,
    /// The body is not UTF-8 text (Standard Webhooks signs text).
    #[error("a webhook body is signed as text; this one is not UTF-8")]
    NotText,
}

/// `v1,` + base64 HMAC-SHA256 of `id.timestamp.body` under `secret`.
pub fn sign_one(secret: &str, id: &str, timestamp: i64, body: &[u8]) -> Result<String, SignError> {
    let key = key_of(secret)?;
    standardwebhooks::Webhook::from_bytes(key)
        .and_then(|w| w.sign(id, timestamp, body))
        .map_err(|e| match e {
            standardwebhooks::WebhookError::InvalidPayload => SignError::NotText,
            _ => SignError::BadSecret,
        })
}

/// The `webhook-signature` value: one signature per secret, space-separated.
pub fn signature_header(
    secrets: &[String],
    id: &str,
    timestamp: i64,
    body: &[u8],
) -> Result<String, SignError> {
    let sigs = secrets
        .iter()
        .map(|s| sign_one(s, id, timestamp, body))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(sigs.join(" "))
}

/// The headers of a signed JSON request: `extra` (an endpoint's or a push kind's own, checked
/// with [`check_headers`]) first, then `content-type`, `webhook-id`, `webhook-timestamp` and
/// `webhook-signature` under each of `secrets`. Webhook deliveries and push kinds both sign so.
pub fn signed_headers(
    extra: &std::collections::BTreeMap<String, String>,
    secrets: &[String],
    id: &str,
    timestamp: i64,
    body: &[u8],
) -> Result<Vec<(String, String)>, SignError> {
    let signature = signature_header(secrets, id, timestamp, body)?;
    let mut headers: Vec<(String, String)> =
        extra.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    headers.extend([
        (crate::CONTENT_TYPE.into(), "application/json".into()),
        (WEBHOOK_ID.into(), id.to_string()),
        (WEBHOOK_TIMESTAMP.into(), timestamp.to_string()),
        (WEBHOOK_SIGNATURE.into(), signature),
    ]);
    Ok(headers)
}

/// Headers a signed request's own set may not hold: the signed ones and those the transport owns.
const RESERVED_HEADERS: [&str; 8] = [
    WEBHOOK_ID,
    WEBHOOK_TIMESTAMP,
    WEBHOOK_SIGNATURE,
    crate::CONTENT_TYPE,
    "content-length",
    "host",
    "transfer-encoding",
    "connection",
];

/// Checks headers to send along with signed requests; the error says which one and why.
pub fn check_headers(h: &std::collections::BTreeMap<String, String>) -> Result<(), String> {
    if h.len() > 20 {
        return Err("headers: at most 20 headers".into());
    }
    for (k, v) in h {
        let name_ok = !k.is_empty()
            && k.len() <= 100
            && k.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !name_ok {
            return Err(format!(
                "headers: {k:?} is not a header name (letters, digits and -, at most 100)"
            ));
        }
        if RESERVED_HEADERS.iter().any(|r| r.eq_ignore_ascii_case(k)) {
            return Err(format!(
                "headers: {k} is set by Onus on every request; choose another header"
            ));
        }
        if v.len() > 4096 || v.bytes().any(|b| b < 0x20 && b != b'\t' || b == 0x7f) {
            return Err(format!(
                "headers: the value of {k} must be at most 4096 characters without control characters"
            ));
        }
    }
    Ok(())
}

/// Verifies a delivery as a consumer would: `headers` are (name, value) pairs (names compared
/// without case), `now` is the consumer's Unix time in seconds.
pub fn verify(
    secret: &str,
    headers: &[(String, String)],
    body: &[u8],
    now: i64,
) -> Result<(), SignError> {
    let get = |name: &'static str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .ok_or(SignError::MissingHeader(name))
    };
    let id = get(WEBHOOK_ID)?;
    let ts: i64 = get(WEBHOOK_TIMESTAMP)?
        .trim()
        .parse()
        .map_err(|_| SignError::BadTimestamp)?;
    if now.abs_diff(ts) > TOLERANCE_SECS as u64 {
        return Err(SignError::Stale);
    }
    let expected = sign_one(secret, id, ts, body)?;
    let expected = expected.strip_prefix("v1,").unwrap_or(&expected);
    for sig in get(WEBHOOK_SIGNATURE)?.split_whitespace() {
        let Some(given) = sig.strip_prefix("v1,") else {
            continue;
        };
        if bool::from(given.as_bytes().ct_eq(expected.as_bytes())) {
            return Ok(()); // compared in constant time
        }
    }
    Err(SignError::NoMatch)
}

#[cfg(test)]
mod tests {
    use super::*;

    // The Standard Webhooks specification's published test vector.
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const TS: i64 = 1614265330;
    const BODY: &[u8] = br#"{"test": 2432232314}"#;
    const SIG: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    fn headers(sig: &str, ts: i64) -> Vec<(String, String)> {
        vec![
            ("webhook-id".into(), ID.into()),
            ("Webhook-Timestamp".into(), ts.to_string()),
            ("webhook-signature".into(), sig.into()),
        ]
    }

    #[test]
    fn reproduces_the_spec_vector() {
        assert_eq!(sign_one(SECRET, ID, TS, BODY).unwrap(), SIG);
        assert_eq!(
            sign_one(SECRET.trim_start_matches("whsec_"), ID, TS, BODY).unwrap(),
            SIG,
            "the prefix is optional"
        );
    }

    #[test]
    fn verifies_within_tolerance_and_rejects_the_rest() {
        assert_eq!(verify(SECRET, &headers(SIG, TS), BODY, TS + 299), Ok(()));
        assert_eq!(verify(SECRET, &headers(SIG, TS), BODY, TS - 299), Ok(()));
        assert_eq!(
            verify(SECRET, &headers(SIG, TS), BODY, TS + 301),
            Err(SignError::Stale)
        );
        assert_eq!(
            verify(SECRET, &headers(SIG, TS), br#"{"test": 1}"#, TS),
            Err(SignError::NoMatch)
        );
        assert_eq!(
            verify(SECRET, &headers(SIG, TS + 1), BODY, TS),
            Err(SignError::NoMatch),
            "the timestamp is signed"
        );
        let other = new_secret();
        assert_eq!(
            verify(&other, &headers(SIG, TS), BODY, TS),
            Err(SignError::NoMatch)
        );
        // Any of several signatures (secret rotation) may match.
        let two = format!("v1,bm9wZQ== {SIG}");
        assert_eq!(verify(SECRET, &headers(&two, TS), BODY, TS), Ok(()));
        let both = signature_header(&[other.clone(), SECRET.into()], ID, TS, BODY).unwrap();
        assert_eq!(verify(SECRET, &headers(&both, TS), BODY, TS), Ok(()));
        assert_eq!(verify(&other, &headers(&both, TS), BODY, TS), Ok(()));
        assert_eq!(
            verify(SECRET, &[], BODY, TS),
            Err(SignError::MissingHeader("webhook-id"))
        );
        assert_eq!(
            sign_one("whsec_!!!", ID, TS, BODY),
            Err(SignError::BadSecret)
        );
        assert!(new_secret().starts_with("whsec_"));
        assert_eq!(check_secret(&new_secret()), Ok(()));
        assert_eq!(check_secret("whsec_"), Err(SignError::WeakSecret));
        assert_eq!(check_secret(SECRET), Ok(()));
        assert_eq!(
            check_secret("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
            Err(SignError::WeakSecret)
        );
        let hostile = vec![
            ("webhook-id".to_string(), ID.to_string()),
            ("webhook-timestamp".to_string(), i64::MIN.to_string()),
            ("webhook-signature".to_string(), SIG.to_string()),
        ];
        assert_eq!(
            verify(SECRET, &hostile, BODY, TS),
            Err(SignError::Stale),
            "no overflow on a hostile timestamp"
        );
    }
}
