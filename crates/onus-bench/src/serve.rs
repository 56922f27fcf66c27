//! A server in a process of its own, for the workloads that measure the server apart from the
//! load they make (webhook fan-out, memory): the code of `onus serve` (`onus_server::serve`, its
//! API, panel, webhooks, push and pull workers) on a loopback listener, plus one no-op kind,
//! `bench.noop` in the queue `default`, so that jobs can run as fast as the job layer goes.
//!
//! The parent starts it with [`Child::start`]; the child prints one JSON line with its address
//! and API token, and exits when its standard input closes.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, ExitCode, Stdio};

use onus::{JobContext, Kind};
use serde_json::{json, Value};

use crate::api::{block_on, exit_with, Server};
use crate::contract::KIND;

/// The child's side (`ONUS_BENCH_ROLE=serve`, `DATABASE_URL`, `ONUS_BENCH_CONFIG`).
pub fn main() -> ExitCode {
    exit_with(
        "serve",
        block_on(async {
            let url = std::env::var("DATABASE_URL").map_err(|_| "DATABASE_URL is not set")?;
            let config = std::env::var("ONUS_BENCH_CONFIG").unwrap_or_default();
            let s = Server::start_with(&url, &config, |b| {
                b.kind(Kind::new(KIND).handler(|_ctx: JobContext| async { Ok(()) }))
            })
            .await?;
            println!("{}", json!({"base": s.base, "token": s.token}));
            // Until the parent closes our standard input.
            tokio::task::spawn_blocking(|| std::io::stdin().read_to_end(&mut Vec::new()))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?;
            Ok(())
        }),
    )
}

/// A running child server, stopped when dropped.
pub(crate) struct Child {
    proc: std::process::Child,
    pub base: String,
    pub token: String,
    pub http: reqwest::Client,
}

impl Child {
    /// Starts a server on the database at `url` (its schema installed) under `config` (TOML).
    pub async fn start(url: &str, config: &str) -> Result<Child, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut proc = Command::new(exe)
            .env("ONUS_BENCH_ROLE", "serve")
            .env("DATABASE_URL", url)
            .env("ONUS_BENCH_CONFIG", config)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start the server process: {e}"))?;
        let out = proc.stdout.take().ok_or("no stdout")?;
        let line = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            BufReader::new(out).read_line(&mut line).map(|_| line)
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
        let v: Value = serde_json::from_str(line.trim())
            .map_err(|e| format!("the server process said {line:?}: {e}"))?;
        Ok(Child {
            proc,
            base: v["base"].as_str().unwrap_or_default().to_string(),
            token: v["token"].as_str().unwrap_or_default().to_string(),
            http: reqwest::Client::new(),
        })
    }

    /// `POST /api/v1{path}`.
    pub async fn post(&self, path: &str, body: &Value) -> Result<Value, String> {
        crate::api::post(&self.http, &self.base, &self.token, path, body).await
    }

    /// The most memory the process has held resident so far (`VmHWM`), in MiB.
    pub fn peak_rss_mib(&self) -> Result<f64, String> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.proc.id()))
            .map_err(|e| format!("cannot read the server's memory: {e}"))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map(|kib| kib / 1024.0)
            .ok_or_else(|| "no VmHWM in /proc/PID/status".to_string())
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        drop(self.proc.stdin.take()); // the child exits when its input closes
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.proc.try_wait() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = self.proc.kill();
        let _ = self.proc.wait();
    }
}
