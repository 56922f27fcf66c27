//! Claiming due jobs, written once for both backends around each engine's claim statement: the
//! claim itself, and the claim with kinds capped across every process.

use std::collections::BTreeMap;

use crate::job::Job;
use crate::sql::{Backend, Row, Sql, Tx, Value};
use crate::store::{manage, ClaimRequest, StoreResult};

static RUNNING: Sql = Sql::new(
    "onus_jobs",
    "SELECT count(*) AS n FROM onus_jobs WHERE state = 'running' AND kind = $1",
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
    tx.query(sql, &params).await
}

/// Claims for `req` with `plain` (when none of its kinds is capped) or `capped`, the jobs in the
/// order they run.
pub(crate) async fn claim<T: Tx + ?Sized>(
    tx: &T,
    req: &ClaimRequest,
    plain: &Sql,
    capped: &Sql,
) -> StoreResult<Vec<Job>> {
    let mut jobs = if req.caps.iter().any(|(k, _)| req.kinds.contains(k)) {
        with_caps(tx, req, capped).await?
    } else {
        let kinds: Vec<&String> = req.kinds.iter().collect();
        manage::jobs(rows(tx, plain, req, &kinds, req.limit, Vec::new()).await?)?
    };
    jobs.sort_by_key(|j| (j.priority, j.run_at, j.id));
    Ok(jobs)
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
        let got = manage::jobs(rows(tx, sql, req, &kinds, want, extra).await?)?;
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
