//! Reaching PostgreSQL: the database URL, TLS with libpq's meaning of `sslmode`, the timeouts that
//! turn a hung connection into an error, and the URL as it may be shown in logs and errors.
//!
//! `sslmode` (default `prefer`, as in libpq):
//!
//! | sslmode | encrypted | certificate checked |
//! |---|---|---|
//! | `disable` | never | - |
//! | `prefer` | when the server offers TLS | no |
//! | `require` | always (fails otherwise) | no; with `sslrootcert` given, as `verify-ca` |
//! | `verify-ca` | always | signed by `sslrootcert` |
//! | `verify-full` | always | signed by `sslrootcert` and issued for the host |
//!
//! tokio-postgres alone knows only the first three, so Onus reads `sslmode` and `sslrootcert`
//! itself and hands the rest of the URL on.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres::config::{Host, SslMode};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::super::{StoreError, StoreResult};

/// Time to open a connection (TCP, TLS, authentication).
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long sent data may go unacknowledged before the kernel drops the connection, and how soon
/// an idle connection is probed: a partitioned connection becomes an error instead of a hang.
pub(crate) const TCP_USER_TIMEOUT: Duration = Duration::from_secs(10);
const KEEPALIVES_IDLE: Duration = Duration::from_secs(10);
const KEEPALIVES_INTERVAL: Duration = Duration::from_secs(5);
const KEEPALIVES_RETRIES: u32 = 3;
/// The server cancels any statement running longer (migrations lift it for themselves).
pub(crate) const STATEMENT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a caller waits for a pooled connection.
pub(crate) const POOL_WAIT_TIMEOUT: Duration = Duration::from_secs(10);

/// A parsed database URL: the driver's config, the TLS connector, and the URL to show.
#[derive(Clone)]
pub(crate) struct Target {
    pub(crate) config: tokio_postgres::Config,
    pub(crate) tls: MakeRustlsConnect,
    pub(crate) shown: String,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target").field("url", &self.shown).finish()
    }
}

/// How the server's certificate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    None,
    Ca,
    Full,
}

/// The URL as it may be shown: built from the parsed config, so no password (in the authority or
/// in `?password=`) can appear.
fn shown(config: &tokio_postgres::Config, sslmode: Option<&str>) -> String {
    let user = config.get_user().unwrap_or("");
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let host = match h {
                Host::Tcp(h) if h.contains(':') => format!("[{h}]"),
                Host::Tcp(h) => h.clone(),
                Host::Unix(p) => p.display().to_string(),
            };
            match config.get_ports().get(i).or(config.get_ports().first()) {
                Some(port) => format!("{host}:{port}"),
                None => host,
            }
        })
        .collect();
    let at = if user.is_empty() {
        String::new()
    } else {
        format!("{user}@")
    };
    let mut s = format!(
        "postgres://{at}{}/{}",
        hosts.join(","),
        config.get_dbname().unwrap_or("")
    );
    if let Some(m) = sslmode {
        s.push_str(&format!("?sslmode={m}"));
    }
    s
}

/// A PostgreSQL URL rebuilt from its parsed parts, so no password can appear.
pub(crate) fn redact(url: &str) -> String {
    match parse(url) {
        Ok(t) => t.shown,
        Err(_) => crate::store::crude_redact(url),
    }
}

/// Parses `url` and sets up TLS and the timeouts Onus needs (each only where the URL sets none).
pub(crate) fn parse(url: &str) -> StoreResult<Target> {
    let fallback = crate::store::crude_redact(url);
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, q),
        None => (url, ""),
    };
    let mut sslmode: Option<String> = None;
    let mut rootcert: Option<String> = None;
    // Every other parameter goes to the driver exactly as written (re-encoding would change how
    // it decodes them: `+`, `%20`).
    let mut rest: Vec<&str> = Vec::new();
    for piece in query.split('&').filter(|p| !p.is_empty()) {
        // Percent-decoded only, as libpq does: a `+` stays a `+`.
        let plus_kept = piece.replace('+', "%2B");
        let Some((k, v)) = url::form_urlencoded::parse(plus_kept.as_bytes()).next() else {
            rest.push(piece);
            continue;
        };
        match k.as_ref() {
            "sslmode" => sslmode = Some(v.into_owned()),
            "sslrootcert" => rootcert = Some(v.into_owned()),
            "sslcert" | "sslkey" | "sslpassword" => {
                return Err(StoreError::BadUrl(format!(
                    "{fallback}: client certificates ({k}) are not supported; authenticate with a password instead"
                )))
            }
            _ => rest.push(piece),
        }
    }
    let driver_url = if rest.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    let mut config = tokio_postgres::Config::from_str(&driver_url).map_err(|e| {
        StoreError::BadUrl(format!(
            "{fallback} is not a PostgreSQL URL ({}); write it like postgres://user:password@host:5432/database",
            super::describe(&e)
        ))
    })?;
    let shown_url = shown(&config, sslmode.as_deref());
    let (mode, check) = match sslmode.as_deref().unwrap_or("prefer") {
        "disable" => (SslMode::Disable, Check::None),
        "prefer" => (SslMode::Prefer, Check::None),
        "require" if rootcert.is_some() => (SslMode::Require, Check::Ca),
        "require" => (SslMode::Require, Check::None),
        "verify-ca" => (SslMode::Require, Check::Ca),
        "verify-full" => (SslMode::Require, Check::Full),
        other => {
            return Err(StoreError::BadUrl(format!(
                "{shown_url}: sslmode={other} is not supported; use disable, prefer (the default), require, verify-ca or verify-full"
            )))
        }
    };
    config.ssl_mode(mode);
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(TCP_USER_TIMEOUT);
    }
    if config.get_keepalives() && !query.contains("keepalives_idle") {
        config.keepalives_idle(KEEPALIVES_IDLE);
    }
    if config.get_keepalives_interval().is_none() {
        config.keepalives_interval(KEEPALIVES_INTERVAL);
    }
    if config.get_keepalives_retries().is_none() {
        config.keepalives_retries(KEEPALIVES_RETRIES);
    }
    let options = config.get_options().unwrap_or("").to_string();
    if !options.contains("statement_timeout") {
        let ms = STATEMENT_TIMEOUT.as_millis();
        config.options(format!("{options} -c statement_timeout={ms}").trim());
    }
    let tls = tls_config(check, rootcert.as_deref(), &shown_url)?;
    Ok(Target {
        config,
        tls: MakeRustlsConnect::new(tls),
        shown: shown_url,
    })
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn tls_config(check: Check, rootcert: Option<&str>, shown: &str) -> StoreResult<ClientConfig> {
    let bad = |m: String| StoreError::BadUrl(format!("{shown}: {m}"));
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(format!("cannot set up TLS: {e}")))?
        .dangerous();
    let webpki = match check {
        Check::None => None,
        Check::Ca | Check::Full => Some(webpki_verifier(rootcert, &bad)?),
    };
    Ok(builder
        .with_custom_certificate_verifier(Arc::new(Verifier {
            check,
            webpki,
            provider: provider(),
        }))
        .with_no_client_auth())
}

/// The verifier for `sslrootcert` (or libpq's default `~/.postgresql/root.crt`).
fn webpki_verifier(
    rootcert: Option<&str>,
    bad: &dyn Fn(String) -> StoreError,
) -> StoreResult<Arc<rustls::client::WebPkiServerVerifier>> {
    let path = match rootcert {
        Some(p) => std::path::PathBuf::from(p),
        None => {
            let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
            match home.map(|h| h.join(".postgresql/root.crt")).filter(|p| p.is_file()) {
                Some(p) => p,
                None => {
                    return Err(bad(
                        "checking the server's certificate needs the CA certificate: add sslrootcert=/path/to/root.crt (PEM) to the URL".into(),
                    ))
                }
            }
        }
    };
    let mut roots = RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(&path)
        .map_err(|e| bad(format!("cannot read sslrootcert {}: {e}", path.display())))?;
    for cert in certs {
        let cert =
            cert.map_err(|e| bad(format!("sslrootcert {} is not PEM: {e}", path.display())))?;
        roots
            .add(cert)
            .map_err(|e| bad(format!("sslrootcert {}: {e}", path.display())))?;
    }
    if roots.is_empty() {
        return Err(bad(format!(
            "sslrootcert {} holds no certificate",
            path.display()
        )));
    }
    rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(|e| bad(format!("cannot use sslrootcert {}: {e}", path.display())))
}

/// Checks the server's certificate as `sslmode` says: not at all (`prefer`, `require`: encrypted
/// only, libpq's meaning), its chain to `sslrootcert` (`verify-ca`: the name on it is not
/// checked), or its chain and its name (`verify-full`). Handshake signatures are always checked.
#[derive(Debug)]
struct Verifier {
    check: Check,
    webpki: Option<Arc<rustls::client::WebPkiServerVerifier>>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        use rustls::CertificateError::{NotValidForName, NotValidForNameContext};
        let Some(webpki) = self.webpki.as_ref().filter(|_| self.check != Check::None) else {
            return Ok(ServerCertVerified::assertion());
        };
        match webpki.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                NotValidForName | NotValidForNameContext { .. },
            )) if self.check == Check::Ca => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show() {
        for url in [
            "postgres://ada:s3cret@db.example.com:5432/jobs",
            "postgres://ada@db.example.com/jobs?password=s3cret",
            "postgresql://ada@db.example.com/jobs?sslmode=require&password=s3cret&application_name=x",
        ] {
            let shown = redact(url);
            assert!(!shown.contains("s3cret"), "{shown}");
            assert!(shown.contains("ada@db.example.com"), "{shown}");
        }
        // Unparsable: still nothing secret.
        let shown = crate::store::redact_url(
            "postgres://ada:s3cret@db.example.com:notaport/jobs?password=s3cret",
        );
        assert!(!shown.contains("s3cret"), "{shown}");
        assert_eq!(
            crate::store::redact_url("sqlite://onus.db"),
            "sqlite://onus.db"
        );
    }

    #[test]
    fn sslmode_is_read_with_libpq_meaning() {
        let t = parse("postgres://u@h/db").unwrap();
        assert_eq!(t.config.get_ssl_mode(), SslMode::Prefer);
        let t = parse("postgres://u@h/db?sslmode=disable").unwrap();
        assert_eq!(t.config.get_ssl_mode(), SslMode::Disable);
        let t = parse("postgres://u@h/db?sslmode=require").unwrap();
        assert_eq!(t.config.get_ssl_mode(), SslMode::Require);
        let e = parse("postgres://u@h/db?sslmode=verify-full&sslrootcert=/nonexistent/root.crt")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cannot read sslrootcert /nonexistent/root.crt"),
            "{e}"
        );
        let e = parse("postgres://u@h/db?sslmode=allow")
            .unwrap_err()
            .to_string();
        assert!(e.contains("sslmode=allow is not supported"), "{e}");
        // The timeouts that turn a hung connection into an error.
        let t = parse("postgres://u@h/db").unwrap();
        assert_eq!(t.config.get_connect_timeout(), Some(&CONNECT_TIMEOUT));
        assert_eq!(t.config.get_tcp_user_timeout(), Some(&TCP_USER_TIMEOUT));
        assert!(t
            .config
            .get_options()
            .unwrap()
            .contains("statement_timeout=60000"));
        // The URL's own settings win.
        let t = parse("postgres://u@h/db?connect_timeout=3").unwrap();
        assert_eq!(
            t.config.get_connect_timeout(),
            Some(&Duration::from_secs(3))
        );
    }
}
