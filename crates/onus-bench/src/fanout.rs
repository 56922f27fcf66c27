//! `onus-bench fanout`: webhook delivery to a loopback sink, with and without one dead endpoint.
//! For each backend and each variant, a fresh database and a fresh server process
//! ([`crate::serve`], `[queues] default = 32`, `[webhooks] timeout = "2s"`) deliver to
//! `--endpoints` healthy endpoints (20), each answering 200 at once; in the second variant one
//! more endpoint, subscribed to the same events, never answers (every request times out).
//!
//! - **rate**: `--events` events (500) are published through `POST /events` from 8 clients at
//!   once; healthy deliveries per second from the first publish until the sink has received every
//!   healthy delivery;
//! - **latency**: then `--paced` events (100) are published one every 20 ms; the time from each
//!   publish to each healthy endpoint's receipt of it, p50 and p99;
//! - **peak RSS** of the server process over the whole run.
//!
//! Each cell is the median of `--reps` runs (3); the last rows give the ratios of the variant
//! with the dead endpoint to the healthy one (the goal: healthy rate and latency within 20%).
//!
//! Options: `--events`, `--paced`, `--endpoints`, `--reps`, `--backends sqlite,postgres`.

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use onus_testkit::sink::{HttpSink, Reply};
use serde_json::json;

use crate::api::{block_on, exit_with, median};
use crate::backlog::backends;
use crate::serve::Child;

struct Opts {
    events: usize,
    paced: usize,
    endpoints: usize,
    reps: usize,
    backends: Vec<String>,
}

fn opts() -> Result<Opts, String> {
    let mut o = Opts {
        events: 500,
        paced: 100,
        endpoints: 20,
        reps: 3,
        backends: vec!["sqlite".into(), "postgres".into()],
    };
    let args: Vec<String> = std::env::args().skip(2).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let v = it.next().ok_or_else(|| format!("{a} needs a value"))?;
        let n = || {
            v.parse::<usize>()
                .map_err(|_| format!("{a} {v}: not a number"))
        };
        match a.as_str() {
            "--events" => o.events = n()?.max(1),
            "--paced" => o.paced = n()?.max(10),
            "--endpoints" => o.endpoints = n()?.max(1),
            "--reps" => o.reps = n()?.max(1),
            "--backends" => o.backends = backends(v)?,
            _ => return Err(format!("unknown option {a}; see the module docs")),
        }
    }
    Ok(o)
}

pub fn main() -> ExitCode {
    exit_with("fanout", opts().and_then(|o| block_on(run(&o))))
}

const CONFIG: &str =
    "[queues]\ndefault = 32\n[webhooks]\ntimeout = \"2s\"\nallow_networks = [\"127.0.0.0/8\"]\n";

/// One run's figures.
#[derive(Default)]
struct Figures {
    rate: f64,
    p50_ms: f64,
    p99_ms: f64,
    rss_mib: f64,
}

/// Healthy receipts: (event id, endpoint path, when the sink got it).
type Receipts = Arc<Mutex<Vec<(String, String, Instant)>>>;

async fn run(o: &Opts) -> Result<(), String> {
    let pg = onus_testkit::PgCluster::start().map_err(|e| e.to_string())?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    println!(
        "| backend | endpoints | healthy deliveries/s ({} events) | latency p50 ms | p99 ms | server peak RSS MiB |",
        o.events
    );
    println!("|---|---|---|---|---|---|");
    let mut ratios = Vec::new();
    let mut fresh = 0;
    for backend in &o.backends {
        let mut cells: Vec<[Vec<f64>; 4]> = vec![Default::default(), Default::default()];
        for _ in 0..o.reps {
            for (v, dead) in [false, true].into_iter().enumerate() {
                fresh += 1;
                let url = match backend.as_str() {
                    "sqlite" => format!(
                        "sqlite://{}",
                        dir.path().join(format!("fanout-{fresh}.db")).display()
                    ),
                    _ => pg.fresh_database().await.map_err(|e| e.to_string())?,
                };
                let f = one(o, &url, dead).await?;
                eprintln!(
                    "fanout: {backend} dead={dead}: {:.0}/s p50 {:.1} ms p99 {:.1} ms, {:.1} MiB",
                    f.rate, f.p50_ms, f.p99_ms, f.rss_mib
                );
                for (i, x) in [f.rate, f.p50_ms, f.p99_ms, f.rss_mib]
                    .into_iter()
                    .enumerate()
                {
                    cells[v][i].push(x);
                }
            }
        }
        let m: Vec<[f64; 4]> = cells.into_iter().map(|c| c.map(median)).collect();
        for (v, label) in [
            format!("{} healthy", o.endpoints),
            format!("{} healthy + 1 dead", o.endpoints),
        ]
        .iter()
        .enumerate()
        {
            println!(
                "| {backend} | {label} | {:.0} | {:.1} | {:.1} | {:.1} |",
                m[v][0], m[v][1], m[v][2], m[v][3]
            );
        }
        ratios.push((backend.clone(), [0, 1, 2, 3].map(|i| m[1][i] / m[0][i])));
    }
    for (backend, r) in ratios {
        println!(
            "| {backend} | with the dead endpoint / without (ratio) | {:.2} | {:.2} | {:.2} | {:.2} |",
            r[0], r[1], r[2], r[3]
        );
    }
    Ok(())
}

async fn one(o: &Opts, url: &str, dead: bool) -> Result<Figures, String> {
    let receipts: Receipts = Arc::default();
    let r = receipts.clone();
    let sink = HttpSink::start(move |req, _| {
        if req.path.starts_with("/dead") {
            return Reply::status(200).delay(Duration::from_secs(3600));
        }
        let id = req.header("webhook-id").unwrap_or_default().to_string();
        r.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((id, req.path.clone(), Instant::now()));
        Reply::status(200)
    })
    .await;
    let server = Arc::new(Child::start(url, CONFIG).await?);
    let mut urls: Vec<String> = (0..o.endpoints)
        .map(|i| sink.url(&format!("/h/{i}")))
        .collect();
    if dead {
        urls.push(sink.url("/dead"));
    }
    for u in &urls {
        server
            .post(
                "/endpoints",
                &json!({"url": u, "event_types": ["bench.event"]}),
            )
            .await?;
    }
    let published: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let publish = |server: Arc<Child>,
                   published: Arc<Mutex<HashMap<String, Instant>>>,
                   i: usize| async move {
        let at = Instant::now();
        let ev = server
            .post(
                "/events",
                &json!({"type": "bench.event", "payload": {"i": i}}),
            )
            .await?;
        let id = ev["id"]
            .as_str()
            .ok_or_else(|| format!("no id in {ev}"))?
            .to_string();
        published
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, at);
        Ok::<_, String>(())
    };

    // Rate: a burst from 8 clients.
    let started = Instant::now();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (server, published, next) = (server.clone(), published.clone(), next.clone());
        let events = o.events;
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if i >= events {
                    return Ok::<_, String>(());
                }
                publish(server.clone(), published.clone(), i).await?;
            }
        }));
    }
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    let want = o.events * o.endpoints;
    let last = wait_for(&receipts, want).await?;
    once_each(&receipts)?;
    let rate = want as f64 / (last - started).as_secs_f64();

    // Latency: paced events, one every 20 ms.
    receipts.lock().unwrap_or_else(|e| e.into_inner()).clear();
    published.lock().unwrap_or_else(|e| e.into_inner()).clear();
    for i in 0..o.paced {
        publish(server.clone(), published.clone(), o.events + i).await?;
        tokio::time::sleep(Duration::from_millis(20)).await; // the pace of the load
    }
    wait_for(&receipts, o.paced * o.endpoints).await?;
    once_each(&receipts)?;
    let published = published.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut lat: Vec<f64> = receipts
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter_map(|(id, _, at)| published.get(id).map(|p| (*at - *p).as_secs_f64() * 1e3))
        .collect();
    lat.sort_by(f64::total_cmp);
    let p99 = lat.get(lat.len() * 99 / 100).copied().unwrap_or(f64::NAN);
    Ok(Figures {
        rate,
        p50_ms: median(lat),
        p99_ms: p99,
        rss_mib: server.peak_rss_mib()?,
    })
}

/// Every healthy endpoint answered at once, so each event reached each of them exactly once: a
/// second request for the same event at the same endpoint is a fault of the run.
fn once_each(receipts: &Receipts) -> Result<(), String> {
    let r = receipts.lock().unwrap_or_else(|e| e.into_inner());
    let mut seen = std::collections::HashSet::new();
    for (id, path, _) in r.iter() {
        if !seen.insert((id, path)) {
            return Err(format!("event {id} reached {path} twice"));
        }
    }
    Ok(())
}

/// Waits until the sink holds `n` healthy receipts; the last one's time.
async fn wait_for(receipts: &Receipts, n: usize) -> Result<Instant, String> {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        {
            let r = receipts.lock().unwrap_or_else(|e| e.into_inner());
            if r.len() >= n {
                return Ok(r
                    .iter()
                    .map(|(_, _, at)| *at)
                    .max()
                    .unwrap_or_else(Instant::now));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "only {} of {n} deliveries arrived in 5 minutes",
                    r.len()
                ));
            }
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
