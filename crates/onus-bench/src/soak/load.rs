//! The load a soak drives (events, jobs, pull workers) and its faults (kills, terminations).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use super::world::World;
use super::{Locked, LEASE_SLACK, PULL, PULL_LEASE, PUSH};

impl World {
    /// Publishes events of random tenants until the load stops; an event whose answer was lost
    /// is published again with the same id (which delivers nothing twice).
    pub(super) async fn publish(&self, d: usize, every: Duration, seed: u64) -> Result<(), String> {
        let mut rng = StdRng::seed_from_u64(seed);
        let dep = &self.deps[d];
        while !self.stop_load.load(Ordering::SeqCst) {
            let t = dep.tenants[rng.gen_range(0..dep.tenants.len())];
            let seq = self.seq.fetch_add(1, Ordering::SeqCst);
            let id = format!("evt_{}_{t}_{seq}", dep.name);
            self.sent_events.locked().insert(id.clone());
            let body = json!({"type": "soak.event", "id": id, "tenant": t,
                              "payload": {"tenant": t, "seq": seq}});
            if self.send(d, &mut rng, "/events", &body).await.is_some() {
                self.acked_events.locked().push((d, id));
                self.tally.add("events published (acknowledged)", 1);
            }
            tokio::time::sleep(every).await;
        }
        Ok(())
    }

    /// Sends an idempotent call (an event with its id, a job with its unique key) to a live
    /// process of deployment `d`, and again to another if no answer came, three times at most;
    /// the answer of the one that took it.
    async fn send(&self, d: usize, rng: &mut StdRng, path: &str, body: &Value) -> Option<Value> {
        for _ in 0..3 {
            let Some(base) = self.pick(d, rng) else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            match self.post(&base, path, body).await {
                Ok((200..=202, v)) => return Some(v),
                _ => self.tally.add("API calls failed (faults)", 1),
            }
        }
        None
    }

    /// Inserts http.request, push and pull jobs in turn until the load stops.
    pub(super) async fn insert_jobs(
        &self,
        d: usize,
        every: Duration,
        seed: u64,
        sink: &str,
    ) -> Result<(), String> {
        let mut rng = StdRng::seed_from_u64(seed ^ 0xabcd);
        let dep = &self.deps[d];
        let mut n = 0u64;
        while !self.stop_load.load(Ordering::SeqCst) {
            n += 1;
            let unique = format!("soak-{}-{n}", dep.name);
            let (kind, body) = match n % 3 {
                0 => (
                    "http.request",
                    json!({"kind": "http.request", "unique_key": unique, "args": {
                        "method": "POST", "url": format!("{sink}/http/{}/{n}", dep.name),
                        "body": {"n": n}}}),
                ),
                1 => (
                    PUSH,
                    json!({"kind": PUSH, "unique_key": unique, "args": {"n": n}}),
                ),
                _ => (
                    PULL,
                    json!({"kind": PULL, "unique_key": unique, "args": {"n": n}}),
                ),
            };
            let answer = self.send(d, &mut rng, "/jobs", &body).await;
            if let Some(id) = answer.and_then(|v| v["id"].as_i64()) {
                self.acked_jobs.locked().push((d, id));
                self.tally
                    .add(&format!("{kind} jobs inserted (acknowledged)"), 1);
            }
            tokio::time::sleep(every).await;
        }
        Ok(())
    }

    /// A pull worker: claims, then completes, fails, snoozes or abandons each job (an abandoned
    /// job's lease lapses and it is rescued), until the drain ends.
    pub(super) async fn pull_worker(&self, d: usize, seed: u64) -> Result<(), String> {
        let mut rng = StdRng::seed_from_u64(seed);
        while !self.stop_all.load(Ordering::SeqCst) {
            let Some(base) = self.pick(d, &mut rng) else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let claim = json!({"kinds": [PULL], "limit": 4, "wait": 1});
            let jobs = match self.post(&base, "/queues/default/claim", &claim).await {
                Ok((200, v)) => v["jobs"].as_array().cloned().unwrap_or_default(),
                Ok((503, v)) if v.to_string().contains("clock") => {
                    self.tally
                        .add("pull claims refused by the skewed process", 1);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                _ => {
                    self.tally.add("API calls failed (faults)", 1);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            for j in jobs {
                let id = j["id"].as_i64().unwrap_or_default();
                let token = j["lease_token"].as_str().unwrap_or_default().to_string();
                let claimed = Instant::now();
                {
                    let mut book = self.pull.locked();
                    book.claims += 1;
                    if let Some((at, answered)) = book.held.get(&(d, id)) {
                        let since = at.elapsed();
                        if !answered && since + LEASE_SLACK < PULL_LEASE {
                            let line = format!(
                                "{} job {id} handed out again {} ms after an unanswered claim",
                                self.deps[d].name,
                                since.as_millis()
                            );
                            book.twice.push(line);
                        }
                    }
                    book.held.insert((d, id), (claimed, false));
                }
                let roll = rng.gen_range(0..100);
                let (path, body) = match roll {
                    0..70 => ("complete", json!({"lease_token": token})),
                    70..82 => (
                        "fail",
                        json!({"lease_token": token, "message": "soak: failed"}),
                    ),
                    82..92 => (
                        "snooze",
                        json!({"lease_token": token, "seconds": 1, "reason": "soak"}),
                    ),
                    _ => {
                        self.tally
                            .add("pull jobs abandoned (lease left to lapse)", 1);
                        continue;
                    }
                };
                // Answered once sent: whether or not the reply comes back, the lease may be over.
                self.pull.locked().held.insert((d, id), (claimed, true));
                match self.post(&base, &format!("/jobs/{id}/{path}"), &body).await {
                    Ok((200, _)) => self.tally.add(&format!("pull answers: {path}"), 1),
                    Ok((409, v)) => {
                        let since = claimed.elapsed();
                        if since + LEASE_SLACK < PULL_LEASE {
                            // Nobody may take a job whose lease is current.
                            self.pull.locked().twice.push(format!(
                                "{} job {id}: answer refused as stale {} ms after its claim: {v}",
                                self.deps[d].name,
                                since.as_millis()
                            ));
                        }
                        self.tally.add("pull answers refused as stale (409)", 1);
                    }
                    _ => self.tally.add("API calls failed (faults)", 1),
                }
            }
        }
        Ok(())
    }

    /// SIGKILLs a random process (not the skewed one, whose counters prove it ran nothing) every
    /// 2 to 4 seconds and starts it again.
    pub(super) async fn killer(&self, seed: u64) -> Result<(), String> {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x4b1);
        let victims: Vec<usize> = (0..self.procs.len())
            .filter(|i| !self.procs[*i].locked().skewed)
            .collect();
        loop {
            let wait = Duration::from_millis(rng.gen_range(2000..4000));
            let until = Instant::now() + wait;
            while Instant::now() < until {
                if self.stop_load.load(Ordering::SeqCst) {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let i = victims[rng.gen_range(0..victims.len())];
            self.kill(i).await;
            self.tally.add("processes killed (SIGKILL)", 1);
            self.start(i).await?;
            self.tally.add("processes restarted", 1);
        }
    }

    /// Terminates a random database connection of the PostgreSQL deployment every 0.5 to 2 s.
    pub(super) async fn terminator(&self, url: &str, seed: u64) -> Result<(), String> {
        use onus::postgres::tokio_postgres;
        let mut rng = StdRng::seed_from_u64(seed ^ 0x7e4);
        while !self.stop_load.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(rng.gen_range(500..2000))).await;
            let Ok((client, conn)) = tokio_postgres::connect(url, tokio_postgres::NoTls).await
            else {
                continue; // PostgreSQL is restarting
            };
            let conn = tokio::spawn(conn);
            let n = client
                .query(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                     WHERE datname = current_database() AND pid <> pg_backend_pid()
                     ORDER BY random() LIMIT 1",
                    &[],
                )
                .await
                .map(|rows| rows.iter().filter(|r| r.get::<_, bool>(0)).count() as u64)
                .unwrap_or(0);
            self.tally.add("database connections terminated", n);
            drop(client);
            let _ = conn.await;
        }
        Ok(())
    }
}
