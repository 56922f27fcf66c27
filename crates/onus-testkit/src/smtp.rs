//! A scripted SMTP relay on loopback for tests: it speaks SMTP over TCP (STARTTLS on a
//! certificate made for the test, AUTH PLAIN and LOGIN), answers each recipient and each message
//! as scripted, and records everything it received.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// One message the relay received (whatever it answered).
#[derive(Debug, Clone)]
pub struct Message {
    /// `MAIL FROM` address.
    pub from: String,
    /// The recipients it accepted (`RCPT TO` answered 250).
    pub rcpts: Vec<String>,
    /// The message as sent (dot-stuffing undone), CRLF line ends.
    pub data: String,
    /// The reply code it gave at the end of `DATA`.
    pub reply: u16,
    /// Whether the session was encrypted when the message came.
    pub tls: bool,
    /// The user and password the client authenticated with.
    pub auth: Option<(String, String)>,
}

impl Message {
    /// The value of the first header `name` (case-insensitive), unfolded.
    pub fn header(&self, name: &str) -> Option<String> {
        let head = self.data.split("\r\n\r\n").next().unwrap_or("");
        let mut lines = head.split("\r\n").peekable();
        while let Some(line) = lines.next() {
            let Some((k, v)) = line.split_once(':') else {
                continue;
            };
            if !k.eq_ignore_ascii_case(name) || line.starts_with([' ', '\t']) {
                continue;
            }
            let mut out = v.trim().to_string();
            while let Some(next) = lines.next_if(|l| l.starts_with([' ', '\t'])) {
                out.push(' ');
                out.push_str(next.trim());
            }
            return Some(out);
        }
        None
    }
}

#[derive(Default)]
struct Script {
    data: VecDeque<(u16, String)>,
    data_default: Option<(u16, String)>,
    rcpt: HashMap<String, (u16, String)>,
    held: bool,
}

struct Shared {
    script: Mutex<Script>,
    received: Mutex<Vec<Message>>,
    sessions: Mutex<usize>,
    quits: Mutex<usize>,
    release: Semaphore,
    arrived: tokio::sync::Notify,
    tls: Option<tokio_rustls::TlsAcceptor>,
    /// TLS from the first byte (smtps), not STARTTLS.
    implicit: bool,
}

/// The relay. Dropping it stops it.
pub struct SmtpSink {
    /// Where it listens.
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    ca: Option<PathBuf>,
    _dir: Option<tempfile::TempDir>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for SmtpSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmtpSink")
            .field("addr", &self.addr)
            .finish()
    }
}

impl Drop for SmtpSink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SmtpSink {
    /// A plain relay (no STARTTLS) that accepts everything.
    pub async fn start() -> SmtpSink {
        Self::start_with(false, false).await
    }

    /// A relay that offers STARTTLS on a certificate for 127.0.0.1 and localhost, signed by a
    /// CA made for it ([`SmtpSink::ca_cert`]); needs the `openssl` command.
    pub async fn start_tls() -> SmtpSink {
        Self::start_with(true, false).await
    }

    /// A relay that speaks TLS from the first byte (`smtps://`), on a certificate as
    /// [`SmtpSink::start_tls`] makes.
    pub async fn start_implicit_tls() -> SmtpSink {
        Self::start_with(true, true).await
    }

    async fn start_with(tls: bool, implicit: bool) -> SmtpSink {
        let (dir, acceptor) = if tls {
            let dir = tempfile::tempdir().expect("a temporary directory");
            crate::make_certificates(dir.path()).expect("certificates");
            let acceptor = acceptor(dir.path());
            (Some(dir), Some(acceptor))
        } else {
            (None, None)
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let shared = Arc::new(Shared {
            script: Mutex::new(Script::default()),
            received: Mutex::new(Vec::new()),
            sessions: Mutex::new(0),
            quits: Mutex::new(0),
            release: Semaphore::new(0),
            arrived: tokio::sync::Notify::new(),
            tls: acceptor,
            implicit,
        });
        let s = shared.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let s = s.clone();
                tokio::spawn(async move {
                    *s.sessions.lock().unwrap_or_else(|e| e.into_inner()) += 1;
                    let _ = session(s, stream).await;
                });
            }
        });
        SmtpSink {
            addr,
            shared,
            ca: dir.as_ref().map(|d| d.path().join("ca.crt")),
            _dir: dir,
            task,
        }
    }

    /// The CA (PEM file) that signed the relay's certificate (a relay from [`SmtpSink::start_tls`]).
    pub fn ca_cert(&self) -> Option<&Path> {
        self.ca.as_deref()
    }

    /// `smtp://127.0.0.1:PORT` (add `?tls=required` for STARTTLS).
    pub fn url(&self) -> String {
        format!("smtp://{}", self.addr)
    }

    /// The next messages are answered with these replies at the end of `DATA`, in order.
    pub fn reply_to_data(&self, replies: &[(u16, &str)]) {
        let mut s = self.shared.script.lock().unwrap_or_else(|e| e.into_inner());
        s.data
            .extend(replies.iter().map(|(c, t)| (*c, t.to_string())));
    }

    /// Every message without a queued reply is answered with this one (250 when unset).
    pub fn always_reply_to_data(&self, code: u16, text: &str) {
        self.shared
            .script
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .data_default = Some((code, text.to_string()));
    }

    /// `RCPT TO` for `address` is answered with this reply.
    pub fn reply_to_rcpt(&self, address: &str, code: u16, text: &str) {
        self.shared
            .script
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .rcpt
            .insert(address.to_ascii_lowercase(), (code, text.to_string()));
    }

    /// From now on the relay records a message and holds its reply until [`SmtpSink::release`].
    pub fn hold(&self) {
        self.shared
            .script
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .held = true;
    }

    /// Stops holding replies, and lets every held one go.
    pub fn unhold(&self) {
        self.shared
            .script
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .held = false;
        self.shared.release.add_permits(1024);
    }

    /// Lets one held reply go.
    pub fn release(&self) {
        self.shared.release.add_permits(1);
    }

    /// Everything received so far.
    pub fn received(&self) -> Vec<Message> {
        self.shared
            .received
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// How many sessions clients opened.
    pub fn sessions(&self) -> usize {
        *self
            .shared
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// How many times clients said `QUIT` (a client says it once it has the answer to its
    /// message).
    pub fn quits(&self) -> usize {
        *self.shared.quits.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits (up to `secs` seconds) until clients said `QUIT` at least `n` times.
    pub async fn wait_for_quits(&self, n: usize, secs: u64) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(secs);
        loop {
            let notified = self.shared.arrived.notified();
            if self.quits() >= n {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                panic!(
                    "clients said QUIT {} times, not {n}, within {secs} s",
                    self.quits()
                );
            }
        }
    }

    /// Waits (up to `secs` seconds) until at least `n` messages were received.
    pub async fn wait_for(&self, n: usize, secs: u64) -> Vec<Message> {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(secs);
        loop {
            let notified = self.shared.arrived.notified();
            let got = self.received();
            if got.len() >= n {
                return got;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                panic!(
                    "the relay received {} messages, not {n}, within {secs} s",
                    self.received().len()
                );
            }
        }
    }
}

fn acceptor(dir: &Path) -> tokio_rustls::TlsAcceptor {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(dir.join("server.crt"))
        .expect("server.crt")
        .collect::<Result<_, _>>()
        .expect("server.crt parses");
    let key = PrivateKeyDer::from_pem_file(dir.join("server.key")).expect("server.key");
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocol versions")
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .expect("a server certificate");
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

async fn session(s: Arc<Shared>, stream: TcpStream) -> std::io::Result<()> {
    let (mut io, mut tls): (BufReader<Box<dyn Stream>>, bool) = match (&s.tls, s.implicit) {
        (Some(acceptor), true) => (
            BufReader::new(Box::new(acceptor.clone().accept(stream).await?)),
            true,
        ),
        _ => (BufReader::new(Box::new(stream)), false),
    };
    let mut from = String::new();
    let mut rcpts: Vec<String> = Vec::new();
    let mut auth: Option<(String, String)> = None;
    io.get_mut()
        .write_all(b"220 sink.test ESMTP ready\r\n")
        .await?;
    let mut line = String::new();
    loop {
        line.clear();
        if io.read_line(&mut line).await? == 0 {
            return Ok(());
        }
        let cmd = line.trim_end().to_string();
        let upper = cmd.to_ascii_uppercase();
        let reply: String = if upper.starts_with("EHLO") || upper.starts_with("HELO") {
            let mut r =
                String::from("250-sink.test\r\n250-8BITMIME\r\n250-SMTPUTF8\r\n250-AUTH PLAIN\r\n");
            if s.tls.is_some() && !tls {
                r.push_str("250-STARTTLS\r\n");
            }
            r.push_str("250 OK\r\n");
            r
        } else if upper == "STARTTLS" && s.tls.is_some() && !tls {
            io.get_mut().write_all(b"220 go ahead\r\n").await?;
            let acceptor = s.tls.clone().expect("tls");
            let plain = io.into_inner();
            let secured = acceptor.accept(plain).await?;
            io = BufReader::new(Box::new(secured));
            tls = true;
            continue;
        } else if upper.starts_with("AUTH PLAIN") {
            let b64 = cmd.split_whitespace().nth(2).unwrap_or("");
            auth = decode_plain(b64);
            "235 2.7.0 authenticated\r\n".into()
        } else if upper.starts_with("MAIL FROM:") {
            from = angle(&cmd["MAIL FROM:".len()..]);
            rcpts.clear();
            "250 2.1.0 OK\r\n".into()
        } else if upper.starts_with("RCPT TO:") {
            let to = angle(&cmd["RCPT TO:".len()..]);
            let scripted = s
                .script
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .rcpt
                .get(&to.to_ascii_lowercase())
                .cloned();
            match scripted {
                Some((code, text)) => format!("{code} {text}\r\n"),
                None => {
                    rcpts.push(to);
                    "250 2.1.5 OK\r\n".into()
                }
            }
        } else if upper == "DATA" {
            io.get_mut()
                .write_all(b"354 end with <CRLF>.<CRLF>\r\n")
                .await?;
            let mut data = String::new();
            loop {
                line.clear();
                if io.read_line(&mut line).await? == 0 {
                    return Ok(());
                }
                if line == ".\r\n" || line == ".\n" {
                    break;
                }
                let l = line.strip_prefix('.').unwrap_or(&line);
                data.push_str(l);
            }
            let (code, text, held) = {
                let mut sc = s.script.lock().unwrap_or_else(|e| e.into_inner());
                let (c, t) = sc
                    .data
                    .pop_front()
                    .or_else(|| sc.data_default.clone())
                    .unwrap_or((250, "2.0.0 queued".into()));
                (c, t, sc.held)
            };
            s.received
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(Message {
                    from: from.clone(),
                    rcpts: rcpts.clone(),
                    data,
                    reply: code,
                    tls,
                    auth: auth.clone(),
                });
            s.arrived.notify_waiters();
            if held {
                s.release.acquire().await.expect("open").forget();
            }
            format!("{code} {text}\r\n")
        } else if upper == "RSET" || upper == "NOOP" {
            "250 OK\r\n".into()
        } else if upper == "QUIT" {
            *s.quits.lock().unwrap_or_else(|e| e.into_inner()) += 1;
            s.arrived.notify_waiters();
            io.get_mut().write_all(b"221 bye\r\n").await?;
            return Ok(());
        } else {
            "502 5.5.2 command not recognised\r\n".into()
        };
        io.get_mut().write_all(reply.as_bytes()).await?;
        io.get_mut().flush().await?;
    }
}

fn angle(s: &str) -> String {
    let s = s.trim();
    let end = s.find('>').map(|i| i + 1).unwrap_or(s.len());
    s[..end]
        .trim_start_matches('<')
        .trim_end_matches('>')
        .to_string()
}

fn decode_plain(b64: &str) -> Option<(String, String)> {
    let bytes = base64_decode(b64)?;
    let mut parts = bytes.split(|b| *b == 0);
    let _authzid = parts.next()?;
    let user = String::from_utf8(parts.next()?.to_vec()).ok()?;
    let pass = String::from_utf8(parts.next()?.to_vec()).ok()?;
    Some((user, pass))
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.decode(s).ok()
}
