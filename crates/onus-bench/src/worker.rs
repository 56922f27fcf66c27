//! A worker process of a throughput run: no-op handlers, progress reported on stdout.

use std::io::BufRead;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use onus::{JobContext, Kind, Onus};

use crate::contract::{unix_us, KIND};

pub fn main() -> ExitCode {
    let url = std::env::var("DATABASE_URL").unwrap_or_default();
    let slots: usize = std::env::var("ONUS_BENCH_SLOTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    // "calls": progress every few ms; "starts": one line per handler start (a latency run).
    let starts = std::env::var("ONUS_BENCH_REPORT").as_deref() == Ok("starts");
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("worker: {e}");
            return ExitCode::FAILURE;
        }
    };
    let r: Result<(), String> = rt.block_on(async move {
        let store = onus::open(&url).await.map_err(|e| e.to_string())?;
        let calls = Arc::new(AtomicU64::new(0));
        let last = Arc::new(AtomicU64::new(0));
        let (c, l) = (calls.clone(), last.clone());
        let onus = Onus::builder(store)
            .queue("default", slots)
            .kind(Kind::new(KIND).handler(move |_ctx: JobContext| {
                let now = unix_us();
                c.fetch_add(1, Ordering::SeqCst);
                l.store(now, Ordering::SeqCst);
                if starts {
                    use std::io::Write;
                    let mut out = std::io::stdout().lock();
                    let _ = writeln!(out, "start {now}");
                    let _ = out.flush();
                }
                async { Ok(()) }
            }))
            .build()
            .map_err(|e| e.to_string())?;
        // Commands arrive on stdin: "go", then "stop".
        let (cmd_tx, mut cmd_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines().map_while(Result::ok) {
                if cmd_tx.send(line.trim().to_string()).is_err() {
                    return;
                }
            }
        });
        println!("ready");
        while cmd_rx.recv().await.ok_or("no go")? != "go" {}
        let running = onus.start();
        let mut reported = u64::MAX;
        loop {
            tokio::select! {
                cmd = cmd_rx.recv() => if cmd.as_deref() != Some("go") { break },
                _ = tokio::time::sleep(Duration::from_millis(5)) => {}
            }
            let n = calls.load(Ordering::SeqCst);
            if n != reported && !starts {
                println!("calls {n} {}", last.load(Ordering::SeqCst));
                reported = n;
            }
        }
        running.shutdown(Duration::from_secs(30)).await;
        println!(
            "calls {} {}",
            calls.load(Ordering::SeqCst),
            last.load(Ordering::SeqCst)
        );
        Ok(())
    });
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("worker: {e}");
            ExitCode::FAILURE
        }
    }
}
