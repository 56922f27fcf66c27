//! Reading and managing jobs, written once for both backends: a job row decoded, the filter
//! every list, count and bulk action takes, and `get`, `list`, `count`, `expired`, `retry`,
//! `cancel` and `delete`.

use crate::clock::{trunc, Timestamp};
use crate::job::{DiscardReason, HistoryEntry, Job, JobId, JobState, Progress};
use crate::sql::{Backend, FromRow, Json, Row, Sql, Tx, Value};
use crate::store::{
    counts, CancelOutcome, ClaimRequest, JobFilter, Refused, RetryOutcome, StoreError, StoreResult,
};

/// Every column of a job.
pub(crate) const JOB_COLS: &str = job_cols!();

/// A job row decoded, its values moved out of the row. Claims return no progress or result.
pub(crate) fn job(mut r: Row) -> StoreResult<Job> {
    let parsed = |column: &str, problem: String| StoreError::Decode {
        table: "onus_jobs",
        column: column.to_string(),
        problem,
    };
    // Taken in the columns' order (see `Row::take`).
    let (id, kind, queue, args, priority) = (
        r.take("id")?,
        r.take("kind")?,
        r.take("queue")?,
        r.take("args")?,
        r.take("priority")?,
    );
    let state: String = r.take("state")?;
    let (attempt, max_attempts, run_at, created_at, attempted_at, finalized_at) = (
        r.take("attempt")?,
        r.take("max_attempts")?,
        r.take("run_at")?,
        r.take("created_at")?,
        r.take("attempted_at")?,
        r.take("finalized_at")?,
    );
    let errors: Json<Vec<HistoryEntry>> = r.take("errors")?;
    let snoozes = r.take("snoozes")?;
    let reason: Option<String> = r.take("discard_reason")?;
    let (unique_key, lease_key, lease_owner, lease_expires_at, cancel_requested) = (
        r.take("unique_key")?,
        r.take("lease_key")?,
        r.take("lease_owner")?,
        r.take("lease_expires_at")?,
        r.take("cancel_requested")?,
    );
    let tags: Json<Vec<String>> = r.take("tags")?;
    let progress: Option<Json<Progress>> = if r.has("progress") {
        r.take("progress")?
    } else {
        None
    };
    Ok(Job {
        id,
        kind,
        queue,
        args,
        priority,
        state: state.parse().map_err(|e| parsed("state", e))?,
        attempt,
        max_attempts,
        run_at,
        created_at,
        attempted_at,
        finalized_at,
        errors: errors.0,
        snoozes,
        discard_reason: reason
            .map(|s| s.parse::<DiscardReason>())
            .transpose()
            .map_err(|e| parsed("discard_reason", e))?,
        unique_key,
        lease_key,
        lease_owner,
        lease_expires_at,
        cancel_requested,
        tags: tags.0,
        progress: progress.map(|p| p.0),
        result: if r.has("result") {
            r.take("result")?
        } else {
            None
        },
    })
}

/// The columns a claim reads back of each job it took, in this order: what the store kept of
/// the job. What the claim itself wrote (the state, the attempt's time, the lease) [`claimed`]
/// sets from the request instead of decoding it again (23% of a worker's instructions went to
/// decoding claimed rows).
macro_rules! claimed_cols {
    () => {
        "id, kind, args, priority, attempt, max_attempts, run_at, created_at, errors, snoozes, \
         unique_key, lease_key, tags"
    };
}

/// A claim's rows by their ids, with the columns [`claimed`] reads.
static CLAIMED_BY_IDS: Sql = Sql::per_backend(
    "onus_jobs",
    concat!(
        "SELECT ",
        claimed_cols!(),
        " FROM onus_jobs WHERE id IN (SELECT value FROM json_each($1))"
    ),
    concat!(
        "SELECT ",
        claimed_cols!(),
        " FROM onus_jobs WHERE id = ANY($1)"
    ),
);

/// A job the claim `req` took, from a row with [`claimed_cols`]: running, its attempt begun at
/// the claim's time and leased to its owner until the claim's lease end, in the claim's queue,
/// with no cancel asked for, no progress and no result.
pub(crate) fn claimed(mut r: Row, req: &ClaimRequest) -> StoreResult<Job> {
    // Taken in the columns' order (see `Row::take`).
    let (id, kind, args, priority, attempt, max_attempts, run_at, created_at) = (
        r.take("id")?,
        r.take("kind")?,
        r.take("args")?,
        r.take("priority")?,
        r.take("attempt")?,
        r.take("max_attempts")?,
        r.take("run_at")?,
        r.take("created_at")?,
    );
    let errors: Json<Vec<HistoryEntry>> = r.take("errors")?;
    let (snoozes, unique_key, lease_key) = (
        r.take("snoozes")?,
        r.take("unique_key")?,
        r.take("lease_key")?,
    );
    let tags: Json<Vec<String>> = r.take("tags")?;
    Ok(Job {
        id,
        kind,
        queue: req.queue.clone(),
        args,
        priority,
        state: JobState::Running,
        attempt,
        max_attempts,
        run_at,
        created_at,
        // As stored: to the microsecond.
        attempted_at: Some(trunc(req.now)),
        finalized_at: None,
        errors: errors.0,
        snoozes,
        discard_reason: None,
        unique_key,
        lease_key,
        lease_owner: Some(req.owner.clone()),
        lease_expires_at: Some(trunc(req.lease_until)),
        cancel_requested: false,
        tags: tags.0,
        progress: None,
        result: None,
    })
}

/// The jobs of a statement's rows.
pub(crate) fn jobs(rows: Vec<Row>) -> StoreResult<Vec<Job>> {
    rows.into_iter().map(job).collect()
}

impl FromRow for Job {
    fn from_row(r: &Row) -> StoreResult<Self> {
        job(r.clone())
    }

    fn from_owned(r: Row) -> StoreResult<Self> {
        job(r)
    }
}

/// A filter's conditions, each ` AND ...`, numbering its parameters after `params`' (which it
/// extends): the one place a filter becomes SQL.
pub(crate) fn conditions(b: Backend, f: &JobFilter, params: &mut Vec<Value>) -> String {
    let mut sql = String::new();
    let mut add = |sql: &mut String, v: Value, sqlite: &str, postgres: &str| {
        params.push(v);
        let text = match b {
            Backend::Sqlite => sqlite,
            Backend::Postgres => postgres,
        };
        sql.push_str(" AND ");
        sql.push_str(&text.replace("$n", &format!("${}", params.len())));
    };
    for (col, list) in [
        ("id", Value::list(f.ids.iter().copied())),
        ("state", Value::list(f.states.iter().map(|s| s.as_str()))),
        ("kind", Value::list(&f.kinds)),
        ("queue", Value::list(&f.queues)),
        ("lease_key", Value::list(&f.lease_keys)),
    ] {
        if !matches!(&list, Value::List(v) if v.is_empty()) {
            let sqlite = format!("{col} IN (SELECT value FROM json_each($n))");
            add(&mut sql, list, &sqlite, &format!("{col} = ANY($n)"));
        }
    }
    if let Some(floor) = f.id_above {
        add(&mut sql, floor.into(), "id > $n", "id > $n");
    }
    if !f.tags.is_empty() {
        add(
            &mut sql,
            Value::list(&f.tags),
            "EXISTS (SELECT 1 FROM json_each(onus_jobs.tags) WHERE value IN (SELECT value FROM json_each($n)))",
            "tags ?| $n",
        );
    }
    for (col, op, t) in [
        ("finalized_at", ">=", f.finalized_after),
        ("created_at", ">=", f.created_after),
        ("created_at", "<", f.created_before),
    ] {
        if let Some(t) = t {
            let cond = format!("{col} {op} $n");
            add(&mut sql, t.into(), &cond, &cond);
        }
    }
    if let Some(text) = f.q_folded() {
        // ASCII letters only, as SQLite's lower() folds them, so both backends match alike: on
        // PostgreSQL lower() under the "C" collation folds ASCII alone (and is many times faster
        // than translate()).
        add(
            &mut sql,
            text.into(),
            "instr(replace(lower(args), ' ', ''), $n) > 0",
            "strpos(replace(lower(args::text COLLATE \"C\"), ' ', ''), $n) > 0",
        );
    }
    if let Some(n) = f.limit {
        params.push(Value::Int(n as i64));
        sql = format!(
            " AND id IN (SELECT id FROM onus_jobs WHERE 1 = 1{sql} ORDER BY id DESC LIMIT ${})",
            params.len()
        );
    }
    sql
}

/// A statement built around a filter's conditions, prepared for this use only.
fn built(b: Backend, text: String) -> Sql {
    Sql::built("onus_jobs", b, text)
}

/// The ids a statement returned.
async fn ids<T: Tx + ?Sized>(tx: &T, sql: &Sql, params: &[Value]) -> StoreResult<Vec<JobId>> {
    tx.query(sql, params)
        .await?
        .iter()
        .map(|r| r.get("id"))
        .collect()
}

static GET: Sql = Sql::new(
    "onus_jobs",
    concat!("SELECT ", job_cols!(), " FROM onus_jobs WHERE id = $1"),
);

static BY_IDS: Sql = Sql::per_backend(
    "onus_jobs",
    concat!(
        "SELECT ",
        job_cols!(),
        " FROM onus_jobs WHERE id IN (SELECT value FROM json_each($1))"
    ),
    concat!("SELECT ", job_cols!(), " FROM onus_jobs WHERE id = ANY($1)"),
);

/// The jobs `ids` as rows, in no order (a write of `onus_live` that returned their ids reads the
/// rest of each job here).
pub(crate) async fn rows_by_ids<T: Tx + ?Sized>(tx: &T, ids: &[JobId]) -> StoreResult<Vec<Row>> {
    by_ids(tx, &BY_IDS, ids).await
}

/// The rows of a claim's jobs by their ids, with the columns [`claimed`] reads.
pub(crate) async fn claimed_rows_by_ids<T: Tx + ?Sized>(
    tx: &T,
    ids: &[JobId],
) -> StoreResult<Vec<Row>> {
    by_ids(tx, &CLAIMED_BY_IDS, ids).await
}

async fn by_ids<T: Tx + ?Sized>(tx: &T, sql: &Sql, ids: &[JobId]) -> StoreResult<Vec<Row>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    tx.query(sql, &[Value::list(ids.iter().copied())]).await
}

/// Job `id`, if there is one.
pub(crate) async fn get<T: Tx + ?Sized>(tx: &T, id: JobId) -> StoreResult<Option<Job>> {
    tx.fetch_opt(&GET, &[id.into()]).await
}

/// Up to `limit` jobs matching `filter` below id `before`, newest first.
pub(crate) async fn list<T: Tx + ?Sized>(
    tx: &T,
    filter: &JobFilter,
    limit: usize,
    before: Option<JobId>,
) -> StoreResult<Vec<Job>> {
    let b = tx.backend();
    let mut p = vec![Value::Int(before.unwrap_or(i64::MAX))];
    let cond = conditions(b, filter, &mut p);
    p.push(Value::Int(limit as i64));
    let n = p.len();
    let text =
        format!("SELECT {JOB_COLS} FROM onus_jobs WHERE id < $1{cond} ORDER BY id DESC LIMIT ${n}");
    tx.fetch(&built(b, text), &p).await
}

/// How many jobs match `filter`.
pub(crate) async fn count<T: Tx + ?Sized>(tx: &T, filter: &JobFilter) -> StoreResult<u64> {
    let b = tx.backend();
    let mut p = Vec::new();
    let cond = conditions(b, filter, &mut p);
    let rows = tx
        .query(
            &built(
                b,
                format!("SELECT count(*) AS n FROM onus_jobs WHERE 1 = 1{cond}"),
            ),
            &p,
        )
        .await?;
    rows.first()
        .map_or(Ok(0), |r| r.get::<i64>("n").map(|n| n as u64))
}

// Found among the narrow rows of running jobs by lease end (see migration 10).
static EXPIRED: Sql = Sql::per_backend(
    "onus_live",
    concat!(
        "SELECT ",
        job_cols!(),
        " FROM onus_jobs WHERE id IN (SELECT id FROM onus_live WHERE state = 'running' AND lease_expires_at < $1
         AND kind IN (SELECT value FROM json_each($2)) ORDER BY lease_expires_at LIMIT $3)
         ORDER BY lease_expires_at"
    ),
    concat!(
        "SELECT ",
        job_cols!(),
        " FROM onus_jobs WHERE id = ANY(ARRAY(SELECT id FROM onus_live WHERE state = 'running'
         AND lease_expires_at < $1 AND kind = ANY($2) ORDER BY lease_expires_at LIMIT $3))
         ORDER BY lease_expires_at"
    ),
);

/// Running jobs of `kinds` whose lease lapsed before `now`, the longest lapsed first.
pub(crate) async fn expired<T: Tx + ?Sized>(
    tx: &T,
    kinds: &[String],
    now: Timestamp,
    limit: usize,
) -> StoreResult<Vec<Job>> {
    tx.fetch(
        &EXPIRED,
        &[now.into(), Value::list(kinds), Value::Int(limit as i64)],
    )
    .await
}

const RETRY_STATES: &str =
    "state IN ('discarded', 'cancelled', 'retryable', 'scheduled', 'snoozed')";

// Manual retries (see migration 10 for the two tables). A job still unfinished (retryable,
// scheduled, snoozed) is made due in its narrow row ($2: the ids chosen), its row's ending
// cleared; a finished one (discarded, cancelled) gets a narrow row again, unless an unfinished
// job of its kind holds its unique key.
static RETRY_LIVE: Sql = Sql::per_backend(
    "onus_live",
    "UPDATE onus_live SET state = 'available', run_at = $1, lease_owner = NULL, lease_expires_at = NULL,
        cancel_requested = 0, lease_wait = 0
     WHERE id IN (SELECT value FROM json_each($2)) AND state IN ('retryable', 'scheduled', 'snoozed')
     RETURNING id, queue, attempt",
    "UPDATE onus_live SET state = 'available', run_at = $1, lease_owner = NULL, lease_expires_at = NULL,
        cancel_requested = false, lease_wait = false
     WHERE id = ANY($2) AND state IN ('retryable', 'scheduled', 'snoozed')
     RETURNING id, queue, attempt",
);

static RETRY_ROW: Sql = Sql::per_backend(
    "onus_job_rows",
    "UPDATE onus_job_rows SET max_attempts = MAX(max_attempts, $1 + 1), finalized_at = NULL,
        discard_reason = NULL WHERE id = $2",
    "UPDATE onus_job_rows SET max_attempts = GREATEST(max_attempts, $1 + 1), finalized_at = NULL,
        discard_reason = NULL WHERE id = $2",
);

static REVIVABLE: Sql = Sql::per_backend(
    "onus_job_rows",
    "SELECT id, queue, kind, state FROM onus_job_rows j
     WHERE id IN (SELECT value FROM json_each($1)) AND state IN ('discarded', 'cancelled')
       AND NOT EXISTS (SELECT 1 FROM onus_live l WHERE l.id = j.id)
       AND (unique_key IS NULL OR NOT EXISTS (SELECT 1 FROM onus_live o
            WHERE o.kind = j.kind AND o.unique_key = j.unique_key))",
    "SELECT id, queue, kind, state FROM onus_job_rows j
     WHERE id = ANY($1) AND state IN ('discarded', 'cancelled')
       AND NOT EXISTS (SELECT 1 FROM onus_live l WHERE l.id = j.id)
       AND (unique_key IS NULL OR NOT EXISTS (SELECT 1 FROM onus_live o
            WHERE o.kind = j.kind AND o.unique_key = j.unique_key))
     FOR UPDATE",
);

static REVIVE_LIVE: Sql = Sql::new(
    "onus_live",
    "INSERT INTO onus_live (id, queue, kind, priority, state, run_at, created_at, attempt, attempted_at, lease_key,
                            rate_key, unique_key)
     SELECT id, queue, kind, priority, 'available', $1, created_at, attempt, attempted_at, lease_key, rate_key,
            unique_key
     FROM onus_job_rows WHERE id = $2",
);

static REVIVE_ROW: Sql = Sql::per_backend(
    "onus_job_rows",
    "UPDATE onus_job_rows SET state = 'available', run_at = $1, max_attempts = MAX(max_attempts, attempt + 1),
        finalized_at = NULL, discard_reason = NULL, lease_owner = NULL, lease_expires_at = NULL,
        cancel_requested = 0, lease_wait = 0
     WHERE id = $2",
    "UPDATE onus_job_rows SET state = 'available', run_at = $1, max_attempts = GREATEST(max_attempts, attempt + 1),
        finalized_at = NULL, discard_reason = NULL, lease_owner = NULL, lease_expires_at = NULL,
        cancel_requested = false, lease_wait = false
     WHERE id = $2",
);

/// Retries `chosen` at `now` (see [`RETRY_LIVE`]): the ids retried, and on PostgreSQL the
/// workers of their queues told.
async fn retry_chosen<T: Tx + ?Sized>(
    tx: &T,
    chosen: &[JobId],
    now: Timestamp,
) -> StoreResult<Vec<JobId>> {
    let list = Value::list(chosen.iter().copied());
    let mut retried = Vec::new();
    let mut queues: Vec<String> = Vec::new();
    for r in tx.query(&RETRY_LIVE, &[now.into(), list.clone()]).await? {
        let (id, attempt): (JobId, i64) = (r.get("id")?, r.get("attempt")?);
        tx.execute(&RETRY_ROW, &[attempt.into(), id.into()]).await?;
        retried.push(id);
        queues.push(r.get("queue")?);
    }
    let revived = tx.query(&REVIVABLE, std::slice::from_ref(&list)).await?;
    for r in &revived {
        let id: JobId = r.get("id")?;
        tx.execute(&REVIVE_LIVE, &[now.into(), id.into()]).await?;
        tx.execute(&REVIVE_ROW, &[now.into(), id.into()]).await?;
        let state: String = r.get("state")?;
        let (queue, kind): (String, String) = (r.get("queue")?, r.get("kind")?);
        counts::add(tx, &queue, &kind, &state, None, -1).await?;
        counts::add(tx, &queue, &kind, "available", None, 1).await?;
        retried.push(id);
        queues.push(queue);
    }
    if tx.backend() == Backend::Postgres && !queues.is_empty() {
        queues.sort_unstable();
        queues.dedup();
        tx.query(&crate::store::insert::NOTIFY, &[Value::list(queues)])
            .await?;
    }
    retried.sort_unstable_by(|a, b| b.cmp(a));
    Ok(retried)
}

/// Makes the jobs matching `filter` that can run again due at `now` (on PostgreSQL waking the
/// workers of their queues); a job whose unique key an unfinished job holds is refused.
pub(crate) async fn retry<T: Tx + ?Sized>(
    tx: &T,
    filter: &JobFilter,
    now: Timestamp,
) -> StoreResult<RetryOutcome> {
    let b = tx.backend();
    let mut p = Vec::new();
    let cond = conditions(b, filter, &mut p);
    // Not locked (a view of two tables): the writes check each job's state again.
    let text = format!(
        "SELECT id, kind, unique_key FROM onus_jobs WHERE {RETRY_STATES}{cond} ORDER BY id DESC"
    );
    let candidates = tx
        .query(&built(b, text), &p)
        .await?
        .iter()
        .map(|r| Ok((r.get("id")?, r.get("kind")?, r.get("unique_key")?)))
        .collect::<StoreResult<Vec<(JobId, String, Option<String>)>>>()?;
    let (chosen, mut refused) = pick_retries(&candidates, &mut RetriedKeys::new());
    let retried = retry_chosen(tx, &chosen, now).await.map_err(|e| match e {
        e if e.is_unique_violation() => StoreError::Conflict(
            "another unfinished job of the same kind took the unique key meanwhile; try again"
                .into(),
        ),
        e => e,
    })?;
    refused.extend(held_key_refusals(&candidates, &chosen, &retried));
    if retried.is_empty() {
        if let Some(id) = single_id(filter) {
            return Err(refusal(id, get(tx, id).await?.as_ref(), true));
        }
    }
    Ok(RetryOutcome { retried, refused })
}

/// Cancels the waiting jobs matching `filter` at `now` and asks the processes running the
/// running ones to stop them (on PostgreSQL with a notice).
pub(crate) async fn cancel<T: Tx + ?Sized>(
    tx: &T,
    filter: &JobFilter,
    now: Timestamp,
) -> StoreResult<CancelOutcome> {
    let b = tx.backend();
    let (mut p, entry) = match b {
        Backend::Sqlite => (
            vec![now.into(), now.to_rfc3339().into()],
            "json_insert(errors, '$[#]', json_object('at', $2, 'attempt', l.attempt, 'class', 'cancelled', \
             'message', 'cancelled by request'))",
        ),
        Backend::Postgres => (
            vec![now.into()],
            "errors || jsonb_build_array(jsonb_build_object('at', to_jsonb($1::timestamptz), \
             'attempt', l.attempt, 'class', 'cancelled', 'message', 'cancelled by request'))",
        ),
    };
    let cond = conditions(b, filter, &mut p);
    // The job's row takes its ending from its narrow row, which goes (see migration 10).
    let text = format!(
        "UPDATE onus_job_rows SET state = 'cancelled', finalized_at = $1, errors = {entry},
            attempt = l.attempt, attempted_at = l.attempted_at, run_at = l.run_at, lease_wait = {no},
            lease_owner = NULL, lease_expires_at = NULL
         FROM (SELECT * FROM onus_live
               WHERE state IN ('available', 'scheduled', 'retryable', 'snoozed')
                 AND id IN (SELECT id FROM onus_jobs WHERE state IN ('available', 'scheduled', 'retryable', 'snoozed'){cond}){lock}) l
         WHERE l.id = onus_job_rows.id
         RETURNING onus_job_rows.id, onus_job_rows.queue, onus_job_rows.kind",
        no = if b == Backend::Sqlite { "0" } else { "false" },
        // A job a claim takes meanwhile is passed over once that claim commits (its waiting row
        // is gone): it is running, and asked to stop below. Locked in the order of their ids, as
        // a bulk retry takes them, so two bulk operations never wait on each other in a cycle.
        lock = if b == Backend::Sqlite { "" } else { " ORDER BY id FOR UPDATE" },
    );
    let rows = tx.query(&built(b, text), &p).await?;
    let cancelled: Vec<JobId> = rows
        .iter()
        .map(|r| r.get("id"))
        .collect::<StoreResult<_>>()?;
    if !cancelled.is_empty() {
        let gone = Sql::built(
            "onus_live",
            b,
            match b {
                Backend::Sqlite => {
                    "DELETE FROM onus_live WHERE id IN (SELECT value FROM json_each($1))"
                }
                Backend::Postgres => "DELETE FROM onus_live WHERE id = ANY($1)",
            }
            .into(),
        );
        tx.execute(&gone, &[Value::list(cancelled.iter().copied())])
            .await?;
        counts::grouped(tx, "cancelled", None, 1, &rows).await?;
    }
    let mut p = Vec::new();
    let cond = conditions(b, filter, &mut p);
    let text = match b {
        Backend::Sqlite => format!(
            "UPDATE onus_live SET cancel_requested = 1 WHERE state = 'running'
               AND id IN (SELECT id FROM onus_jobs WHERE state = 'running'{cond}) RETURNING id"
        ),
        Backend::Postgres => format!(
            "WITH r AS (UPDATE onus_live SET cancel_requested = true WHERE state = 'running'
                          AND id IN (SELECT id FROM onus_jobs WHERE state = 'running'{cond}) RETURNING id)
             SELECT id, pg_notify('onus_cancel', id::text) IS NULL FROM r"
        ),
    };
    let requested = ids(tx, &built(b, text), &p).await?;
    if cancelled.is_empty() && requested.is_empty() {
        if let Some(id) = single_id(filter) {
            return Err(refusal(id, get(tx, id).await?.as_ref(), false));
        }
    }
    Ok(CancelOutcome {
        cancelled,
        requested,
    })
}

/// The ends of jobs deleted (see jobs migration 11).
static DELETE_ENDS: Sql = Sql::per_backend(
    "onus_job_ends",
    "DELETE FROM onus_job_ends WHERE id IN (SELECT value FROM json_each($1))",
    "DELETE FROM onus_job_ends WHERE id = ANY($1)",
);

/// Deletes the finished jobs matching `filter`.
pub(crate) async fn delete<T: Tx + ?Sized>(tx: &T, filter: &JobFilter) -> StoreResult<Vec<JobId>> {
    let b = tx.backend();
    let mut p = Vec::new();
    let cond = conditions(b, filter, &mut p);
    // A finished job has no narrow row (see migration 10): its row says how it ended, or its
    // end does (a completion on PostgreSQL, migration 11), which goes with it.
    let text = format!(
        "DELETE FROM onus_job_rows
         WHERE NOT EXISTS (SELECT 1 FROM onus_live l WHERE l.id = onus_job_rows.id)
           AND (state IN ('completed', 'discarded', 'cancelled')
                OR EXISTS (SELECT 1 FROM onus_job_ends e WHERE e.id = onus_job_rows.id))
           AND id IN (SELECT id FROM onus_jobs WHERE state IN ('completed', 'discarded', 'cancelled'){cond})
         RETURNING id, queue, kind,
           CASE WHEN EXISTS (SELECT 1 FROM onus_job_ends e WHERE e.id = onus_job_rows.id)
                THEN 'completed' ELSE state END AS state"
    );
    let rows = tx.query(&built(b, text), &p).await?;
    let ids: Vec<JobId> = rows
        .iter()
        .map(|r| r.get("id"))
        .collect::<StoreResult<_>>()?;
    if !ids.is_empty() {
        tx.execute(&DELETE_ENDS, &[Value::list(ids.iter().copied())])
            .await?;
    }
    let mut deleted = Vec::with_capacity(rows.len());
    for state in ["completed", "discarded", "cancelled"] {
        let mine: Vec<crate::sql::Row> = rows
            .iter()
            .filter(|r| r.get::<String>("state").is_ok_and(|s| s == state))
            .cloned()
            .collect();
        counts::removed(tx, state, &mine).await?;
    }
    deleted.extend(ids);
    if deleted.is_empty() {
        if let Some(id) = single_id(filter) {
            return Err(delete_refusal(id, get(tx, id).await?.as_ref()));
        }
    }
    Ok(deleted)
}

/// The job each `(kind, unique_key)` retried so far, newest first.
pub(crate) type RetriedKeys = std::collections::HashMap<(String, String), JobId>;

/// Picks, among retry candidates `(id, kind, unique_key)` newest first, the ones to retry: every
/// job without a unique key, and of the jobs sharing a kind and unique key only the newest (the
/// unique index allows one unfinished job per key), counting those already in `seen` (a bulk
/// retry in chunks passes the same map to every chunk). The others are refused with the reason.
pub(crate) fn pick_retries(
    candidates: &[(JobId, String, Option<String>)],
    seen: &mut RetriedKeys,
) -> (Vec<JobId>, Vec<Refused>) {
    let mut chosen = Vec::new();
    let mut refused = Vec::new();
    for (id, kind, key) in candidates {
        let Some(k) = key else {
            chosen.push(*id);
            continue;
        };
        match seen.entry((kind.clone(), k.clone())) {
            std::collections::hash_map::Entry::Occupied(newer) => refused.push(Refused {
                id: *id,
                reason: format!(
                    "job {} of kind {kind} has the same unique key {k:?} and is retried instead",
                    newer.get()
                ),
            }),
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(*id);
                chosen.push(*id);
            }
        }
    }
    (chosen, refused)
}

/// The refusals for chosen jobs with a unique key that the update left alone: an unfinished job
/// of the same kind holds the key.
pub(crate) fn held_key_refusals(
    candidates: &[(JobId, String, Option<String>)],
    chosen: &[JobId],
    retried: &[JobId],
) -> Vec<Refused> {
    let retried: std::collections::HashSet<&JobId> = retried.iter().collect();
    let chosen: std::collections::HashSet<&JobId> = chosen.iter().collect();
    candidates
        .iter()
        .filter(|(id, _, key)| key.is_some() && chosen.contains(id) && !retried.contains(id))
        .map(|(id, kind, key)| Refused {
            id: *id,
            reason: format!(
                "another unfinished {kind} job holds its unique key {:?}; finish or cancel that one first",
                key.as_deref().unwrap_or_default()
            ),
        })
        .collect()
}

/// When a retry or cancel by filter changed nothing: the single job it named, if it named exactly
/// one, so the caller can explain why (see [`refusal`]).
pub(crate) fn single_id(f: &JobFilter) -> Option<JobId> {
    match f.ids.as_slice() {
        [id] if f.states.is_empty()
            && f.kinds.is_empty()
            && f.queues.is_empty()
            && f.lease_keys.is_empty()
            && f.tags.is_empty()
            && f.id_above.is_none()
            && f.finalized_after.is_none()
            && f.created_after.is_none()
            && f.created_before.is_none()
            && f.q.is_none()
            && f.limit.is_none() =>
        {
            Some(*id)
        }
        _ => None,
    }
}

/// Why one named job was not deleted: it is absent, or not finished.
pub(crate) fn delete_refusal(id: JobId, job: Option<&Job>) -> StoreError {
    match job {
        None => StoreError::NotFound(id),
        Some(j) => StoreError::Conflict(format!(
            "job {id} is {}; only finished jobs (completed, discarded, cancelled) can be deleted: cancel it first",
            j.state
        )),
    }
}

/// Why a single-job retry (`retry = true`) or cancel did nothing, as an error the caller can act on.
pub(crate) fn refusal(id: JobId, job: Option<&Job>, retry: bool) -> StoreError {
    let Some(j) = job else {
        return StoreError::NotFound(id);
    };
    if retry && j.state != JobState::Completed && j.state != JobState::Running {
        if let Some(key) = &j.unique_key {
            return StoreError::Conflict(format!(
                "job {id} cannot be retried: another unfinished {} job holds its unique key {key:?}; finish or cancel that one first",
                j.kind
            ));
        }
    }
    let (action, why) = if retry {
        (
            "retried",
            "only discarded, cancelled, retryable, scheduled and snoozed jobs can be retried",
        )
    } else {
        ("cancelled", "it is already finished")
    };
    StoreError::Conflict(format!(
        "job {id} is {}; it cannot be {action}: {why}",
        j.state
    ))
}
