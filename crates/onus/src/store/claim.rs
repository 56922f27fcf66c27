//! Claiming due jobs, written once for both backends around each engine's claim statement: the
//! claim itself, the claim with kinds capped across every process, and the lease-key slots the
//! claimed jobs take in the same transaction.

use std::collections::{BTreeMap, HashSet};

use crate::job::{Job, JobId};
use crate::sql::{Backend, Row, Sql, Tx, Value};
use crate::store::{keys, manage, ClaimRequest, LeaseDecision, StoreResult};

static RUNNING: Sql = Sql::new(
    "onus_live",
    "SELECT count(*) AS n FROM onus_live WHERE state = 'running' AND kind = $1",
);

/// Runs an engine's claim statement `sql` for `req`: at most `limit` jobs of `kinds`, its
/// parameters $1 to $6 as every claim numbers them (now, owner, lease end, queue, kinds, limit)
/// and `extra` after them.
pub(crate) async fn rows<T: Tx + ?Sized>(
    tx: &T,
    sql: &Sql,
    req: &ClaimRequest,
    kinds: &[&String],
    limit: usize,
    extra: Vec<Value>,
) -> StoreResult<Vec<Row>> {
    let mut params: Vec<Value> = vec![
        req.now.into(),
        req.owner.as_str().into(),
        req.lease_until.into(),
        req.queue.as_str().into(),
        Value::list(kinds.iter().copied()),
        (limit as i64).into(),
    ];
    params.extend(extra);
    let rows = tx.query(sql, &params).await?;
    if tx.backend() == Backend::Sqlite {
        // SQLite's claim writes onus_live alone and returns the ids: its RETURNING reads only
        // the table it writes.
        let ids = rows
            .iter()
            .map(|r| r.get::<JobId>("id"))
            .collect::<StoreResult<Vec<_>>>()?;
        return manage::claimed_rows_by_ids(tx, &ids).await;
    }
    Ok(rows)
}

/// The jobs a claim for `req` took, from its rows.
pub(crate) fn claimed(rows: Vec<Row>, req: &ClaimRequest) -> StoreResult<Vec<Job>> {
    rows.into_iter().map(|r| manage::claimed(r, req)).collect()
}

/// Claims for `req` with `plain` (when none of its kinds is capped) or `capped`, the jobs in the
/// order they run, each holding its lease key's slot (see [`LeaseRounds`]).
pub(crate) async fn claim<T: Tx + ?Sized>(
    tx: &T,
    req: &ClaimRequest,
    plain: &Sql,
    capped: &Sql,
) -> StoreResult<Claimed> {
    let mut rounds = LeaseRounds::new(req);
    while let Some(r) = rounds.next() {
        let got = if r.caps.iter().any(|(k, _)| r.kinds.contains(k)) {
            with_caps(tx, r, capped).await?
        } else {
            let kinds: Vec<&String> = r.kinds.iter().collect();
            let got = rows(tx, plain, r, &kinds, r.limit, Vec::new()).await?;
            claimed(got, r)?
        };
        rounds.took(tx, got).await?;
    }
    Ok(rounds.into_claimed())
}

/// A claim's jobs, and the keys whose jobs it set asleep.
#[derive(Debug, Default)]
pub(crate) struct Claimed {
    pub jobs: Vec<Job>,
    pub waited: Vec<(String, u32)>,
}

/// How many times a claim goes on when jobs it took wait for their lease keys instead: each round
/// asks for the room the waiting ones left, so a backlog of one busy key is set aside a few
/// claims' worth at a time and the jobs behind it are reached.
const LEASE_ROUNDS: usize = 2;

/// A claim's rounds: each claims up to [`LeaseRounds::next`]'s limit with the engine's statement,
/// then [`LeaseRounds::took`] gives each claimed job with a lease key a slot of it in the same
/// transaction ([`keys::acquire`]). A job whose key is busy waits asleep until a release wakes it,
/// one whose key is paused is held; neither spends its attempt or is returned. While some waited
/// and the rounds found as many as they asked for, another round asks for the room left.
pub(crate) struct LeaseRounds<'r> {
    req: &'r ClaimRequest,
    ask: ClaimRequest,
    out: Vec<Job>,
    /// The keys (with their slots) whose jobs were set asleep, for [`keys::wake_free`].
    waited: Vec<(String, u32)>,
    rounds: usize,
    done: bool,
}

impl<'r> LeaseRounds<'r> {
    pub(crate) fn new(req: &'r ClaimRequest) -> Self {
        LeaseRounds {
            req,
            ask: req.clone(),
            out: Vec::new(),
            waited: Vec::new(),
            rounds: 0,
            done: req.limit == 0,
        }
    }

    /// What the next round asks for, if there is one.
    pub(crate) fn next(&mut self) -> Option<&ClaimRequest> {
        if self.done || self.rounds >= LEASE_ROUNDS {
            return None;
        }
        self.rounds += 1;
        self.ask.limit = self.req.limit - self.out.len();
        Some(&self.ask)
    }

    /// Gives the jobs a round claimed their lease keys' slots, keeping those that run.
    pub(crate) async fn took<T: Tx + ?Sized>(
        &mut self,
        tx: &T,
        mut got: Vec<Job>,
    ) -> StoreResult<()> {
        got.sort_by_key(|j| (j.priority, j.run_at, j.id));
        let short = got.len() < self.ask.limit;
        let req = self.req;
        let asks: Vec<(&Job, &str, u32)> = got
            .iter()
            .filter_map(|j| Some((j, j.lease_key.as_deref()?, req.slots_of(&j.kind))))
            .collect();
        let leases = keys::LeaseAsks {
            jobs: &asks,
            owner: &req.owner,
            now: req.now,
            until: req.lease_until,
        };
        let acquired = keys::acquire(tx, leases).await?;
        self.waited.extend(acquired.waited);
        let waiting: HashSet<JobId> = asks
            .iter()
            .zip(&acquired.decisions)
            .filter(|(_, d)| !matches!(d, LeaseDecision::Acquired))
            .map(|((j, _, _), _)| j.id)
            .collect();
        if waiting.is_empty() {
            // Every job runs (the usual case): the round's jobs join whole, not one by one.
            if self.out.is_empty() {
                self.out = got;
            } else {
                self.out.append(&mut got);
            }
        } else {
            self.out
                .extend(got.into_iter().filter(|j| !waiting.contains(&j.id)));
        }
        self.done = short || waiting.is_empty() || self.out.len() >= req.limit;
        Ok(())
    }

    /// The jobs that run, in the order they run, and the keys whose jobs were set asleep (to
    /// hand to [`keys::wake_free`] once the claim commits).
    pub(crate) fn into_claimed(mut self) -> Claimed {
        self.out.sort_by_key(|j| (j.priority, j.run_at, j.id));
        self.waited.sort();
        self.waited.dedup();
        Claimed {
            jobs: self.out,
            waited: self.waited,
        }
    }
}

/// A claim with kinds capped across every process: under each capped kind's lock (taken in one
/// order), each takes at most its cap less its jobs running now, in one ordered claim with the
/// uncapped kinds (`sql` takes the capped kinds' rooms after the usual parameters: on SQLite a
/// JSON object of kind to room, on PostgreSQL the kinds and their rooms as two arrays). A capped
/// kind whose room ran out may have crowded the others out of the scan: the claim goes on
/// without it.
async fn with_caps<T: Tx + ?Sized>(tx: &T, req: &ClaimRequest, sql: &Sql) -> StoreResult<Vec<Job>> {
    let mut capped: Vec<&(String, u32)> = req
        .caps
        .iter()
        .filter(|(k, _)| req.kinds.contains(k))
        .collect();
    capped.sort();
    capped.dedup_by(|a, b| a.0 == b.0);
    let mut rooms: BTreeMap<&str, i64> = BTreeMap::new();
    for (kind, cap) in capped {
        tx.lock(&format!("onus.cap:{kind}")).await?;
        let running = tx.count(&RUNNING, &[kind.as_str().into()]).await?;
        rooms.insert(kind.as_str(), (i64::from(*cap) - running as i64).max(0));
    }
    let mut out: Vec<Job> = Vec::new();
    loop {
        let want = req.limit.saturating_sub(out.len());
        let kinds: Vec<&String> = req
            .kinds
            .iter()
            .filter(|k| rooms.get(k.as_str()).is_none_or(|r| *r > 0))
            .collect();
        if want == 0 || kinds.is_empty() {
            break;
        }
        let open: BTreeMap<&str, i64> = rooms
            .iter()
            .filter(|(_, r)| **r > 0)
            .map(|(k, r)| (*k, *r))
            .collect();
        let extra = match tx.backend() {
            Backend::Sqlite => vec![Value::Json(serde_json::json!(open))],
            Backend::Postgres => vec![
                Value::list(open.keys().copied()),
                Value::list(open.values().copied()),
            ],
        };
        let got = claimed(rows(tx, sql, req, &kinds, want, extra).await?, req)?;
        let mut filled = false;
        for j in &got {
            if let Some(r) = rooms.get_mut(j.kind.as_str()) {
                *r -= 1;
                filled |= *r == 0;
            }
        }
        let short = got.len() < want;
        out.extend(got);
        if !(short && filled) {
            break;
        }
    }
    Ok(out)
}
