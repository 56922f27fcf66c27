//! A throwaway PostgreSQL cluster (initdb, start, stop, crash), and the certificates for its TLS.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

/// A running throwaway PostgreSQL server.
#[derive(Debug)]
pub struct PgCluster {
    dir: tempfile::TempDir,
    bindir: PathBuf,
    port: u16,
    as_postgres: bool,
    /// Extra `-c name=value` server settings.
    settings: Vec<String>,
}

/// What went wrong starting a cluster, with what to do about it.
#[derive(Debug)]
pub struct PgError(pub String);

impl std::fmt::Display for PgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PgError {}

fn err(msg: impl Into<String>) -> PgError {
    PgError(msg.into())
}

/// The directory holding `initdb`, `pg_ctl` and `postgres`.
pub fn bindir() -> Result<PathBuf, PgError> {
    if let Ok(dir) = std::env::var("ONUS_PG_BINDIR") {
        return Ok(PathBuf::from(dir));
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if dir.join("initdb").is_file() {
            return Ok(dir);
        }
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|p| p.join("initdb").is_file())
        .collect();
    found.sort();
    found.pop().ok_or_else(|| {
        err(
            "no PostgreSQL server binaries found (pg_config --bindir, /usr/lib/postgresql/*/bin); \
             install Debian's postgresql-15 package or set ONUS_PG_BINDIR",
        )
    })
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn free_port() -> Result<u16, PgError> {
    let l =
        TcpListener::bind("127.0.0.1:0").map_err(|e| err(format!("no free loopback port: {e}")))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| err(e.to_string()))
}

impl PgCluster {
    /// Creates and starts a new cluster.
    pub fn start() -> Result<PgCluster, PgError> {
        Self::start_with(|_| Ok(Vec::new()))
    }

    /// Creates and starts a cluster that also accepts TLS (`ssl = on`), with a certificate for
    /// `127.0.0.1` and `localhost` signed by a CA made for it; [`PgCluster::ca_cert`] is that CA.
    /// Needs the `openssl` command (Debian's `openssl`, which PostgreSQL's packages bring).
    pub fn start_tls() -> Result<PgCluster, PgError> {
        Self::start_with(|dir| {
            make_certificates(dir)?;
            Ok(vec![
                "ssl=on".into(),
                format!("ssl_cert_file={}", dir.join("server.crt").display()),
                format!("ssl_key_file={}", dir.join("server.key").display()),
            ])
        })
    }

    /// Creates and starts a cluster with extra `name=value` server settings (as `-c` options), such
    /// as `shared_preload_libraries=pg_stat_statements` for a benchmark.
    pub fn start_with_settings(settings: Vec<String>) -> Result<PgCluster, PgError> {
        Self::start_with(|_| Ok(settings))
    }

    /// The cluster's data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The postmaster's process id (the first line of `postmaster.pid`).
    pub fn postmaster_pid(&self) -> Result<u32, PgError> {
        let text = std::fs::read_to_string(self.data_dir().join("postmaster.pid"))
            .map_err(|e| err(format!("cannot read postmaster.pid: {e}")))?;
        text.lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .ok_or_else(|| err("postmaster.pid names no process"))
    }

    /// The CA certificate (PEM) that signed the server's, for a cluster from [`PgCluster::start_tls`].
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    fn start_with(
        settings: impl FnOnce(&Path) -> Result<Vec<String>, PgError>,
    ) -> Result<PgCluster, PgError> {
        let bindir = bindir()?;
        let as_postgres = is_root();
        let dir = tempfile::Builder::new()
            .prefix("onus-pg-")
            .tempdir()
            .map_err(|e| err(e.to_string()))?;
        let settings = settings(dir.path())?;
        if as_postgres {
            chown_postgres(dir.path())?;
        }
        let c = PgCluster {
            dir,
            bindir,
            port: free_port()?,
            as_postgres,
            settings,
        };
        c.run(
            "initdb",
            &[
                "-D",
                &c.data(),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
                "--no-instructions",
            ],
        )?;
        c.pg_ctl_start()?;
        c.watchdog();
        Ok(c)
    }

    /// The process-wide shared cluster, started on first use.
    pub fn shared() -> &'static PgCluster {
        static SHARED: OnceLock<PgCluster> = OnceLock::new();
        SHARED.get_or_init(|| {
            PgCluster::start().unwrap_or_else(|e| panic!("cannot start PostgreSQL for tests: {e}"))
        })
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A URL for `database` as the superuser `postgres`.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    fn command(&self, bin: &str, args: &[&str]) -> Command {
        let path = self.bindir.join(bin);
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            Command::new(path)
        };
        cmd.args(args).current_dir(self.dir.path());
        cmd
    }

    fn run(&self, bin: &str, args: &[&str]) -> Result<(), PgError> {
        let out = self
            .command(bin, args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| err(format!("cannot run {bin}: {e}")))?;
        if !out.status.success() {
            return Err(err(format!(
                "{bin} {} failed: {}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(())
    }

    fn pg_ctl_start(&self) -> Result<(), PgError> {
        let sock = self.dir.path().display().to_string();
        let mut opts = format!(
            "-p {} -k {sock} -c listen_addresses=127.0.0.1 -c max_connections=300 -c shared_buffers=128MB \
             -c fsync=on -c synchronous_commit=on -c full_page_writes=on",
            self.port
        );
        for s in &self.settings {
            opts.push_str(&format!(" -c {s}"));
        }
        let log = self.dir.path().join("server.log").display().to_string();
        let r = self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data(),
                "-l",
                &log,
                "-o",
                &opts,
                "-w",
                "-t",
                "60",
                "start",
            ],
        );
        if r.is_err() {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            return Err(err(format!(
                "{}\nserver log:\n{text}",
                r.err().map(|e| e.0).unwrap_or_default()
            )));
        }
        Ok(())
    }

    /// Stops the server (fast shutdown), keeping its data.
    pub fn stop(&self) -> Result<(), PgError> {
        self.run("pg_ctl", &["-D", &self.data(), "-m", "fast", "-w", "stop"])
    }

    /// Starts a stopped server again on the same port and data.
    pub fn restart(&self) -> Result<(), PgError> {
        self.pg_ctl_start()
    }

    /// Kills the server at once, as a crash would (immediate shutdown: recovery runs at restart).
    pub fn crash(&self) -> Result<(), PgError> {
        self.run(
            "pg_ctl",
            &["-D", &self.data(), "-m", "immediate", "-w", "stop"],
        )
    }

    /// Creates a new empty database and returns its URL.
    pub async fn fresh_database(&self) -> Result<String, PgError> {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "onus_{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        );
        let (client, conn) = tokio_postgres::connect(&self.url("postgres"), tokio_postgres::NoTls)
            .await
            .map_err(|e| err(format!("cannot connect to the test cluster: {e}")))?;
        let driver = tokio::spawn(conn);
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .map_err(|e| err(format!("cannot create database {name}: {e}")))?;
        drop(client);
        let _ = driver.await;
        Ok(self.url(&name))
    }

    /// Stops the server and removes the cluster if this process dies without dropping it.
    fn watchdog(&self) {
        let pg_ctl = self.bindir.join("pg_ctl").display().to_string();
        let stop = if self.as_postgres {
            format!(
                "runuser -u postgres -- {pg_ctl} -D {} -m immediate stop",
                self.data()
            )
        } else {
            format!("{pg_ctl} -D {} -m immediate stop", self.data())
        };
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 1; done; {stop} >/dev/null 2>&1; rm -rf {dir}",
            pid = std::process::id(),
            dir = self.dir.path().display()
        );
        let _ = Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let _ = self.run(
            "pg_ctl",
            &["-D", &self.data(), "-m", "immediate", "-w", "stop"],
        );
    }
}

/// A CA and a server certificate it signed (for 127.0.0.1 and localhost), made with `openssl`.
pub fn make_certificates(dir: &Path) -> Result<(), PgError> {
    let run = |args: &[&str]| -> Result<(), PgError> {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| {
                err(format!(
                    "cannot run openssl (install Debian's openssl): {e}"
                ))
            })?;
        if !out.status.success() {
            return Err(err(format!(
                "openssl {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(())
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=onus test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
    ])?;
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=localhost",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ])?;
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName = IP:127.0.0.1, DNS:localhost\nbasicConstraints = CA:FALSE\n",
    )
    .map_err(|e| err(e.to_string()))?;
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "san.ext",
        "-out",
        "server.crt",
    ])?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            dir.join("server.key"),
            std::fs::Permissions::from_mode(0o600),
        )
        .map_err(|e| err(e.to_string()))?;
    }
    Ok(())
}

fn chown_postgres(path: &Path) -> Result<(), PgError> {
    let status = Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(path)
        .status()
        .map_err(|e| err(format!("cannot run chown: {e}")))?;
    if !status.success() {
        return Err(err(format!(
            "cannot give {} to the postgres user",
            path.display()
        )));
    }
    Ok(())
}
