//! The checks at the end of a soak: one function per invariant, and the report's figures.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use onus::{EntryClass, Job, JobState};
use onus_testkit::sink::{HttpSink, Received};
use serde_json::Value;

use super::world::World;
use super::{Invariant, Locked, Report, PULL, PUSH};

/// Sums of a process's outbound counters.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Counters {
    requests: f64,
    attempts_sent: f64,
    retry_after: f64,
    attempts: f64,
}

impl Counters {
    pub(super) fn parse(text: &str) -> Counters {
        let mut c = Counters::default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((name, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let v: f64 = value.parse().unwrap_or(0.0);
            let metric = name.split('{').next().unwrap_or_default();
            match metric {
                onus_http::metrics::REQUESTS => c.requests += v,
                onus_http::metrics::ATTEMPTS if name.contains("sent=\"true\"") => {
                    c.attempts_sent += v
                }
                onus_http::metrics::RETRY_AFTER_SNOOZES => c.retry_after += v,
                onus::runtime::metrics::ATTEMPTS => c.attempts += v,
                _ => {}
            }
        }
        c
    }
}

/// How many of a job's snoozes came from a `Retry-After`.
fn retry_after_snoozes(j: &Job) -> u64 {
    j.errors
        .iter()
        .filter(|e| {
            e.class == EntryClass::Snooze && onus_http::classify::is_retry_after(&e.message)
        })
        .count() as u64
}

/// Every endpoint the soak made, by its path: (deployment, tenant, secret).
type Endpoints = HashMap<String, (usize, String, String)>;

/// Checks every invariant, in order, and adds the figures of the run.
pub(super) fn check(
    world: &World,
    jobs: &[Vec<Job>],
    received: &[Received],
    sink: &HttpSink,
    metrics: &[(String, bool, Counters)],
    drain: Duration,
) -> Report {
    let endpoints = endpoints_by_path(world);
    let invariants = vec![
        none_lost(world, jobs),
        every_job_ended(world, jobs),
        every_discard_says_why(world, jobs),
        one_request_in_flight_per_endpoint(sink, &endpoints),
        no_amplification(world, jobs, received),
        metrics_add_up(metrics),
        tenants_kept_apart(received, &endpoints),
        ids_and_signatures_valid(world, received, &endpoints),
        no_job_ran_twice_at_once(world, received),
        skewed_clock_ran_nothing(world, metrics),
    ];
    Report {
        figures: figures(world, jobs, received, &endpoints),
        invariants,
        drain,
    }
}

/// Everything accounted for: every acknowledged job is in its database, every acknowledged event
/// was fanned out and has a delivery to every endpoint of its tenant.
fn none_lost(world: &World, jobs: &[Vec<Job>]) -> Invariant {
    let acked_jobs = world.acked_jobs.locked().clone();
    let acked_events = world.acked_events.locked().clone();
    let by_id: Vec<HashMap<i64, &Job>> = jobs
        .iter()
        .map(|v| v.iter().map(|j| (j.id, j)).collect())
        .collect();
    let mut lost = Vec::new();
    for (d, id) in &acked_jobs {
        if !by_id[*d].contains_key(id) {
            lost.push(format!(
                "{} job {id} acknowledged, not in the database",
                world.deps[*d].name
            ));
        }
    }
    let mut fanned: Vec<HashSet<String>> = vec![HashSet::new(); jobs.len()];
    for (d, v) in jobs.iter().enumerate() {
        for j in v
            .iter()
            .filter(|j| j.kind == "webhook.fanout" && j.state == JobState::Completed)
        {
            if let Some(e) = j.args["event_id"].as_str() {
                fanned[d].insert(e.to_string());
            }
        }
    }
    // Every event has a delivery to every endpoint of its tenant (those never answer 410, so
    // they stay enabled).
    let delivered: HashSet<(usize, String, String)> = jobs
        .iter()
        .enumerate()
        .flat_map(|(d, v)| {
            v.iter()
                .filter(|j| j.kind == "webhook.deliver")
                .map(move |j| {
                    let ev = j.args["event_id"].as_str().unwrap_or_default().to_string();
                    let ep = j.args["endpoint_id"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string();
                    (d, ev, ep)
                })
        })
        .collect();
    // An event for a few endpoints fans out in its publish's transaction, without a job: its
    // deliveries show it.
    for (d, ev, _) in &delivered {
        fanned[*d].insert(ev.clone());
    }
    for (d, id) in &acked_events {
        let dep = &world.deps[*d];
        if !fanned[*d].contains(id) {
            lost.push(format!(
                "{} event {id} acknowledged, never fanned out",
                dep.name
            ));
        }
        let tenant = id.split('_').nth(2).unwrap_or_default();
        let endpoints = dep.endpoints();
        for (ep, path) in dep.ids.locked().iter() {
            let ours = endpoints.get(path).is_some_and(|(t, _)| t == tenant);
            if ours
                && path.starts_with("/hook/")
                && !delivered.contains(&(*d, id.clone(), ep.clone()))
            {
                lost.push(format!("{} event {id}: no delivery to {path}", dep.name));
            }
        }
    }
    Invariant {
        name: "acknowledged jobs and events all there (none lost)",
        checked: (acked_jobs.len() + acked_events.len()) as u64,
        violations: lost,
    }
}

/// Every job ended (completed, cancelled or discarded): none is still waiting or running.
fn every_job_ended(world: &World, jobs: &[Vec<Job>]) -> Invariant {
    let mut open = Vec::new();
    let mut total = 0;
    for (d, v) in jobs.iter().enumerate() {
        for j in v {
            total += 1;
            match j.state {
                JobState::Completed | JobState::Cancelled | JobState::Discarded => {}
                s => open.push(format!(
                    "{} job {} ({}) still {s:?}",
                    world.deps[d].name, j.id, j.kind
                )),
            }
        }
    }
    Invariant {
        name: "every job ended (none waiting, none running past its lease)",
        checked: total,
        violations: open,
    }
}

/// Every discarded job has a discard reason and a last error that says something.
fn every_discard_says_why(world: &World, jobs: &[Vec<Job>]) -> Invariant {
    let mut discarded = 0;
    let mut unexplained = Vec::new();
    for (d, v) in jobs.iter().enumerate() {
        for j in v.iter().filter(|j| j.state == JobState::Discarded) {
            discarded += 1;
            let said = j
                .errors
                .last()
                .is_some_and(|e| !e.message.trim().is_empty());
            if j.discard_reason.is_none() || !said {
                unexplained.push(format!(
                    "{} job {} discarded without a reason",
                    world.deps[d].name, j.id
                ));
            }
        }
    }
    Invariant {
        name: "every discarded job says why",
        checked: discarded,
        violations: unexplained,
    }
}

/// One request in flight per endpoint, at most.
fn one_request_in_flight_per_endpoint(sink: &HttpSink, endpoints: &Endpoints) -> Invariant {
    let by_path = sink.max_in_flight_by_path();
    let twice: Vec<String> = endpoints
        .keys()
        .filter_map(|p| {
            let m = by_path.get(p).copied().unwrap_or(0);
            (m > 1).then(|| format!("{p}: {m} requests in flight at once"))
        })
        .collect();
    Invariant {
        name: "no endpoint ever had two requests in flight",
        checked: endpoints.len() as u64,
        violations: twice,
    }
}

/// No amplification: per job, requests <= attempts + Retry-After snoozes.
fn no_amplification(world: &World, jobs: &[Vec<Job>], received: &[Received]) -> Invariant {
    let mut requests: HashMap<String, u64> = HashMap::new();
    for q in received {
        let key = format!(
            "{} {}",
            q.path_only(),
            q.header("webhook-id").unwrap_or_default()
        );
        *requests.entry(key).or_default() += 1;
    }
    let mut over = Vec::new();
    let mut outbound_jobs = 0u64;
    // Several jobs may aim at one key: an insert whose answer was lost is sent again with its
    // unique key, which makes a second job when the first has already ended. Their bounds add up.
    let mut keyed: HashMap<String, (u64, String)> = HashMap::new();
    for (d, v) in jobs.iter().enumerate() {
        let dep = &world.deps[d];
        for j in v {
            let key = match j.kind.as_str() {
                "http.request" => {
                    let url = j.args["url"].as_str().unwrap_or_default();
                    let path = url.splitn(4, '/').nth(3).map(|p| format!("/{p}"));
                    path.map(|p| format!("{p} "))
                }
                k if k == PUSH => Some(format!("/push/{} job_{}", dep.name, j.id)),
                _ => None,
            };
            if let Some(key) = key {
                outbound_jobs += 1;
                let bound = u64::from(j.attempt) + retry_after_snoozes(j);
                let e = keyed
                    .entry(key)
                    .or_insert((0, format!("{} {}", dep.name, j.kind)));
                e.0 += bound;
                e.1.push_str(&format!(" job {}", j.id));
            }
        }
    }
    // Deliveries: their key is the endpoint's path and the event's id; the endpoint's path comes
    // from its id, which only the API knows, so match by the event's id over the endpoint paths.
    let mut deliveries = 0u64;
    let mut delivery_bound: HashMap<(usize, String, String), u64> = HashMap::new();
    for (d, v) in jobs.iter().enumerate() {
        for j in v.iter().filter(|j| j.kind == "webhook.deliver") {
            deliveries += 1;
            let ev = j.args["event_id"].as_str().unwrap_or_default().to_string();
            let ep = j.args["endpoint_id"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            *delivery_bound.entry((d, ev, ep)).or_default() +=
                u64::from(j.attempt) + retry_after_snoozes(j);
        }
    }
    for (key, (bound, what)) in &keyed {
        let n = requests.get(key).copied().unwrap_or(0);
        if n > *bound {
            over.push(format!("{what}: {n} requests, bound {bound}"));
        }
    }
    // Per delivery: the requests to one endpoint with one event's id.
    let ep_paths = endpoint_paths(world);
    for ((d, ev, ep), bound) in &delivery_bound {
        let Some(path) = ep_paths.get(&(*d, ep.clone())) else {
            over.push(format!(
                "delivery of {ev} to an endpoint the soak never made: {ep}"
            ));
            continue;
        };
        let n = requests.get(&format!("{path} {ev}")).copied().unwrap_or(0);
        if n > *bound {
            over.push(format!(
                "delivery of {ev} to {path}: {n} requests, bound {bound}"
            ));
        }
    }
    Invariant {
        name: "no job drew more requests than attempts + Retry-After snoozes",
        checked: outbound_jobs + deliveries,
        violations: over,
    }
}

/// Every process's metrics: requests == attempts sent + Retry-After snoozes.
fn metrics_add_up(metrics: &[(String, bool, Counters)]) -> Invariant {
    let mut unequal = Vec::new();
    for (name, _, c) in metrics {
        if (c.requests - (c.attempts_sent + c.retry_after)).abs() > 0.5 {
            unequal.push(format!(
                "{name}: {} requests != {} attempts sent + {} Retry-After snoozes",
                c.requests, c.attempts_sent, c.retry_after
            ));
        }
    }
    Invariant {
        name: "metrics: requests == attempts sent + Retry-After snoozes",
        checked: metrics.len() as u64,
        violations: unequal,
    }
}

/// Tenants: no webhook request carried an event of another tenant than its endpoint's.
fn tenants_kept_apart(received: &[Received], endpoints: &Endpoints) -> Invariant {
    let mut crossed = Vec::new();
    let mut hook_requests = 0u64;
    for q in received {
        let path = q.path_only();
        let Some((_, tenant, _)) = endpoints.get(path) else {
            continue;
        };
        hook_requests += 1;
        let id = q.header("webhook-id").unwrap_or_default();
        let envelope: Value = serde_json::from_slice(&q.body).unwrap_or(Value::Null);
        // The event's payload: the envelope's data (the endpoints are made with the default).
        let body = &envelope["data"];
        let event_tenant = id.split('_').nth(2).unwrap_or_default();
        if event_tenant != tenant || body["tenant"].as_str() != Some(tenant.as_str()) {
            crossed.push(format!(
                "{path} (tenant {tenant}) got {id} of tenant {event_tenant}"
            ));
        }
    }
    Invariant {
        name: "no event reached an endpoint of another tenant",
        checked: hook_requests,
        violations: crossed,
    }
}

/// Ids and signatures: every webhook request's id is its body's event, one the soak published,
/// and its signature verifies with its endpoint's secret.
fn ids_and_signatures_valid(
    world: &World,
    received: &[Received],
    endpoints: &Endpoints,
) -> Invariant {
    let sent = world.sent_events.locked().clone();
    let mut unsigned = Vec::new();
    let mut hook_requests = 0u64;
    for q in received {
        let path = q.path_only();
        let Some((_, _, secret)) = endpoints.get(path) else {
            continue;
        };
        hook_requests += 1;
        let id = q.header("webhook-id").unwrap_or_default();
        let envelope: Value = serde_json::from_slice(&q.body).unwrap_or(Value::Null);
        // The event's payload: the envelope's data (the endpoints are made with the default).
        let body = &envelope["data"];
        let seq = id.rsplit('_').next().and_then(|n| n.parse::<u64>().ok());
        if seq.is_none() || body["seq"].as_u64() != seq {
            unsigned.push(format!(
                "{path}: webhook-id {id:?} is not the id of the body's event"
            ));
        }
        let ts: i64 = q
            .header("webhook-timestamp")
            .and_then(|t| t.parse().ok())
            .unwrap_or_default();
        if !sent.contains(id)
            || onus_webhooks::signing::verify(secret, &q.headers, &q.body, ts).is_err()
        {
            unsigned.push(format!(
                "{path}: webhook-id {id:?} unknown or its signature does not verify"
            ));
        }
    }
    Invariant {
        name: "every webhook request had the event's id and a valid signature",
        checked: hook_requests,
        violations: unsigned,
    }
}

/// No job ran twice at once: no two requests of one job in flight together, and no pull job
/// handed out while an earlier claim of it was leased and unanswered.
fn no_job_ran_twice_at_once(world: &World, received: &[Received]) -> Invariant {
    let mut overlapped: Vec<String> = received
        .iter()
        .filter(|q| q.in_flight_same > 1)
        .map(|q| {
            format!(
                "{} {}: {} requests of one job in flight at once",
                q.path_only(),
                q.header("webhook-id").unwrap_or_default(),
                q.in_flight_same
            )
        })
        .collect();
    let book = world.pull.locked();
    overlapped.extend(book.twice.iter().cloned());
    let checked = received.len() as u64 + book.claims;
    Invariant {
        name: "no job ran in two places at once (requests, pull leases)",
        checked,
        violations: overlapped,
    }
}

/// The skewed process took no lease: it ran no attempt, sent nothing, and its log (of its whole
/// life: it is never killed) shows no rescue.
fn skewed_clock_ran_nothing(world: &World, metrics: &[(String, bool, Counters)]) -> Invariant {
    let mut stole = Vec::new();
    for p in &world.procs {
        let p = p.locked();
        if p.skewed {
            let log = std::fs::read_to_string(&p.log).unwrap_or_default();
            stole.extend(
                log.lines()
                    .filter(|l| l.contains("rescuing a job"))
                    .map(|l| format!("{} rescued: {l}", p.name)),
            );
        }
    }
    let mut skewed = 0;
    for (name, is_skewed, c) in metrics {
        if *is_skewed {
            skewed += 1;
            if c.attempts > 0.0 || c.requests > 0.0 {
                stole.push(format!(
                    "{name} (clock 30 s ahead) ran {} attempts and sent {} requests",
                    c.attempts, c.requests
                ));
            }
        }
    }
    Invariant {
        name: "the skewed clock claimed, rescued and ran nothing",
        checked: skewed,
        violations: stole,
    }
}

/// The figures of the run: the work done, the jobs by state and the faults.
fn figures(
    world: &World,
    jobs: &[Vec<Job>],
    received: &[Received],
    endpoints: &Endpoints,
) -> Vec<(String, u64)> {
    let deliveries = jobs
        .iter()
        .flatten()
        .filter(|j| j.kind == "webhook.deliver")
        .count() as u64;
    let hook_requests = received
        .iter()
        .filter(|q| endpoints.contains_key(q.path_only()))
        .count() as u64;
    let mut states: BTreeMap<String, u64> = BTreeMap::new();
    let mut total = 0;
    for j in jobs.iter().flatten() {
        total += 1;
        *states
            .entry(format!("{:?}", j.state).to_lowercase())
            .or_default() += 1;
    }
    let t = &world.tally;
    let mut figures = Vec::new();
    let mut fig = |k: &str, v: u64| figures.push((k.to_string(), v));
    fig(
        "events published (acknowledged)",
        t.get("events published (acknowledged)"),
    );
    fig("webhook deliveries (jobs)", deliveries);
    fig("webhook requests at the sink", hook_requests);
    fig(
        "http.request jobs",
        t.get("http.request jobs inserted (acknowledged)"),
    );
    fig(
        "push jobs",
        t.get(&format!("{PUSH} jobs inserted (acknowledged)")),
    );
    fig(
        "pull jobs",
        t.get(&format!("{PULL} jobs inserted (acknowledged)")),
    );
    fig("requests at the sink, all", received.len() as u64);
    fig("jobs in the databases", total);
    for (s, n) in &states {
        fig(&format!("  of them {s}"), *n);
    }
    for k in [
        "processes killed (SIGKILL)",
        "processes restarted",
        "PostgreSQL restarts",
        "database connections terminated",
        "pull claims refused by the skewed process",
        "pull answers: complete",
        "pull answers: fail",
        "pull answers: snooze",
        "pull jobs abandoned (lease left to lapse)",
        "pull answers refused as stale (409)",
        "API calls failed (faults)",
    ] {
        fig(k, t.get(k));
    }
    let lost_attempts: u64 = jobs
        .iter()
        .flatten()
        .map(|j| {
            j.errors
                .iter()
                .filter(|e| e.class == EntryClass::WorkerLost)
                .count() as u64
        })
        .sum();
    fig("attempts lost with a process and rescued", lost_attempts);
    figures
}

/// Each endpoint's path by (deployment, its id).
fn endpoint_paths(world: &World) -> HashMap<(usize, String), String> {
    let mut out = HashMap::new();
    for (d, dep) in world.deps.iter().enumerate() {
        for (id, path) in dep.ids.locked().iter() {
            out.insert((d, id.clone()), path.clone());
        }
    }
    out
}

/// Every endpoint the soak made, by its path.
fn endpoints_by_path(world: &World) -> Endpoints {
    world
        .deps
        .iter()
        .enumerate()
        .flat_map(|(d, dep)| {
            dep.endpoints()
                .into_iter()
                .map(move |(p, (t, s))| (p, (d, t, s)))
        })
        .collect()
}
