//! The `onus` binary: `onus serve` runs the workers and the HTTP server; `onus jobs` and
//! `onus policy` inspect and act from the command line. This crate only wires things together:
//! retry timing lives in the `onus` crate alone.

use std::io::IsTerminal as _;
use std::process::ExitCode;

use clap::Parser;
use onus_server::cli;

#[tokio::main]
async fn main() -> ExitCode {
    let args = cli::Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("ONUS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only on a terminal; `ONUS_LOG_FORMAT=json` for one JSON object per line.
    let ansi = std::io::stderr().is_terminal();
    let json = std::env::var("ONUS_LOG_FORMAT").is_ok_and(|v| v.eq_ignore_ascii_case("json"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    if json {
        logs.json().init();
    } else {
        logs.init();
    }
    match cli::run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
