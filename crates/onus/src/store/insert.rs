//! Inserting jobs, written once for both backends: rows with a unique key one by one (a conflict
//! answers with the job that holds the key), runs of rows without one by the engine's bulk
//! statement (SQLite: multi-row `VALUES`; PostgreSQL: `unnest` of arrays), then the counters kept
//! (SQLite) or the idle workers told (PostgreSQL), and the rows an insert claims written `running`.

use std::collections::BTreeMap;

use crate::clock::{from_micros, Timestamp};
use crate::job::JobState;
use crate::sql::{AnyTx, Backend, Sql, Tx, Value};
use crate::store::{manage, postgres, sqlite, taken, InsertClaim, InsertRow, Inserted};
use crate::store::{StoreError, StoreResult};

// A row with a unique key: its narrow row in onus_live takes the key (the unique index there holds
// while the job is unfinished), and only then is the job's row written. On PostgreSQL one
// statement, which also counts the job; on SQLite (one writer) the row is written if no
// unfinished job holds the key, then [`LIVE_OF`] writes its narrow row.
static UNIQUE: Sql = Sql::per_backend(
    "onus_job_rows",
    concat!(
        "INSERT INTO onus_job_rows (kind, queue, args, priority, state, max_attempts, run_at, created_at, \
         unique_key, lease_key, tags, rate_key)
         SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12
         WHERE NOT EXISTS (SELECT 1 FROM onus_live WHERE kind = $1 AND unique_key = $9)
         RETURNING ",
        job_cols!()
    ),
    concat!(
        "WITH id AS (SELECT nextval(pg_get_serial_sequence('onus_job_rows', 'id')) AS id),
         live AS (
            INSERT INTO onus_live (id, queue, kind, priority, state, run_at, created_at, attempt, lease_key,
                                   rate_key, unique_key)
            SELECT id, $2::text, $1::text, $4::smallint, $5::text, $7::timestamptz, $8::timestamptz, 0,
                   $10::text, $12::text, $9::text FROM id
            ON CONFLICT (kind, unique_key) WHERE unique_key IS NOT NULL DO NOTHING
            RETURNING id
         ), ins AS (
            INSERT INTO onus_job_rows (id, kind, queue, args, priority, state, max_attempts, run_at, created_at,
                                       unique_key, lease_key, tags, rate_key)
            OVERRIDING SYSTEM VALUE
            SELECT id, $1::text, $2::text, $3::jsonb, $4::smallint, $5::text, $6::integer, $7::timestamptz,
                   $8::timestamptz, $9::text, $10::text, $11::jsonb, $12::text FROM live
            RETURNING ",
        job_cols!(),
        "
         ), counted AS (
            INSERT INTO onus_job_deltas (queue, kind, state, n) SELECT queue, kind, state, 1 FROM ins
         )
         SELECT ",
        job_cols!(),
        " FROM ins"
    ),
);

// SQLite: the narrow row of a job just written (see migration 10).
static LIVE_OF: Sql = Sql::new(
    "onus_live",
    "INSERT INTO onus_live (id, queue, kind, priority, state, run_at, created_at, attempt, lease_key, rate_key,
                            unique_key)
     SELECT id, queue, kind, priority, state, run_at, created_at, attempt, lease_key, rate_key, unique_key
     FROM onus_job_rows WHERE id = $1",
);

static HOLDER: Sql = Sql::new(
    "onus_jobs",
    concat!(
        "SELECT ",
        job_cols!(),
        " FROM onus_jobs WHERE id = (SELECT id FROM onus_live WHERE kind = $1 AND unique_key = $2)"
    ),
);

/// SQLite counts inserts here rather than by a trigger (see its migration 5).
static COUNT: Sql = Sql::new(
    "onus_job_counts",
    "INSERT INTO onus_job_counts (queue, kind, state, n) VALUES ($1, $2, $3, $4)
     ON CONFLICT (queue, kind, state) DO UPDATE SET n = n + excluded.n",
);

/// Tells idle workers of queues `$1` (each once), at the transaction's commit.
pub(crate) static NOTIFY: Sql = Sql::new(
    "onus_jobs",
    "SELECT pg_notify('onus_jobs', q) FROM unnest($1::text[]) AS q",
);

static PAUSED: Sql = Sql::new(
    "onus_queues",
    "SELECT name FROM onus_queues WHERE name = $1 AND paused_at IS NOT NULL",
);

static TAKE: Sql = Sql::new(
    "onus_live",
    "UPDATE onus_live SET state = 'running', attempt = 1, attempted_at = $1, lease_owner = $2,
     lease_expires_at = $3 WHERE id = $4 AND state = 'available'",
);

/// Inserts `rows` in order in `tx`; with `claim`, the rows it takes that are due now (and whose
/// queue is not paused by hand) are written `running` under its lease in the same transaction.
pub(crate) async fn insert<T: Tx + ?Sized>(
    tx: &T,
    rows: Vec<InsertRow>,
    claim: Option<&InsertClaim>,
) -> StoreResult<Vec<Inserted>> {
    let take = taken(&rows, 0..rows.len(), claim);
    let mut out = Vec::with_capacity(rows.len());
    let mut rows = rows.into_iter().peekable();
    let mut run = Vec::new();
    while let Some(row) = rows.next() {
        if row.unique_key.is_some() {
            out.push(unique(tx, row).await?);
            continue;
        }
        run.push(row);
        if rows.peek().is_none_or(|r| r.unique_key.is_some()) {
            let run = std::mem::take(&mut run);
            match tx.engine() {
                AnyTx::Sqlite(t) => sqlite::insert_run(t.conn, run, &mut out)?,
                AnyTx::Postgres(pg) => {
                    let took = &take[out.len()..out.len() + run.len()];
                    let claims = postgres::claims_of(took, claim);
                    let run: Vec<&InsertRow> = run.iter().collect();
                    out.extend(postgres::insert_bulk(pg.0, &run, &claims, false).await?);
                }
            }
        }
    }
    match tx.backend() {
        Backend::Sqlite => count(tx, &out).await?,
        Backend::Postgres => notify(tx, &out).await?,
    }
    // PostgreSQL's bulk statement claimed its rows itself.
    if let (Some(claim), Backend::Sqlite) = (claim, tx.backend()) {
        claim_inserted(tx, &mut out, &take, claim).await?;
    }
    Ok(out)
}

/// One row with a unique key: inserted, or the unfinished job that holds the key.
async fn unique<T: Tx + ?Sized>(tx: &T, r: InsertRow) -> StoreResult<Inserted> {
    let params = [
        r.kind.as_str().into(),
        r.queue.as_str().into(),
        Value::Json(r.args),
        r.priority.into(),
        r.state.as_str().into(),
        r.max_attempts.into(),
        r.run_at.into(),
        r.created_at.into(),
        r.unique_key.as_deref().into(),
        r.lease_key.into(),
        Value::Json(serde_json::json!(r.tags)),
        r.rate_key.into(),
    ];
    if let Some(row) = tx.query(&UNIQUE, &params).await?.pop() {
        let job = manage::job(row)?;
        if tx.backend() == Backend::Sqlite {
            tx.execute(&LIVE_OF, &[job.id.into()]).await?;
        }
        return Ok(Inserted {
            job,
            inserted: true,
        });
    }
    let holder = [r.kind.into(), r.unique_key.into()];
    let row = tx.query(&HOLDER, &holder).await?.pop().ok_or_else(|| {
        StoreError::Query(
            "the job holding the unique key finished meanwhile; insert again".into(),
            None,
        )
    })?;
    Ok(Inserted {
        job: manage::job(row)?,
        inserted: false,
    })
}

/// Adds the jobs inserted to the counters, one statement per (queue, kind, state).
async fn count<T: Tx + ?Sized>(tx: &T, out: &[Inserted]) -> StoreResult<()> {
    let mut groups: BTreeMap<(&str, &str, &str), i64> = BTreeMap::new();
    for i in out.iter().filter(|i| i.inserted) {
        let j = &i.job;
        *groups
            .entry((&j.queue, &j.kind, j.state.as_str()))
            .or_default() += 1;
    }
    for ((queue, kind, state), n) in groups {
        let params = [queue.into(), kind.into(), state.into(), n.into()];
        tx.execute(&COUNT, &params).await?;
    }
    Ok(())
}

/// Tells idle workers of the queues that have new due jobs (when the transaction commits).
async fn notify<T: Tx + ?Sized>(tx: &T, out: &[Inserted]) -> StoreResult<()> {
    let mut queues: Vec<&str> = out
        .iter()
        .filter(|r| r.inserted && r.job.state == JobState::Available)
        .map(|r| r.job.queue.as_str())
        .collect();
    queues.sort_unstable();
    queues.dedup();
    if !queues.is_empty() {
        tx.execute(&NOTIFY, &[Value::list(queues)]).await?;
    }
    Ok(())
}

/// Writes `running` the rows `take` marks that are due now, unless their queue is paused by hand.
async fn claim_inserted<T: Tx + ?Sized>(
    tx: &T,
    out: &mut [Inserted],
    take: &[bool],
    claim: &InsertClaim,
) -> StoreResult<()> {
    let stored = |t: Timestamp| from_micros(t.timestamp_micros());
    let mut paused: BTreeMap<String, bool> = BTreeMap::new();
    for (i, _) in out.iter_mut().zip(take).filter(|(_, took)| **took) {
        let j = &mut i.job;
        if !i.inserted || j.state != JobState::Available {
            continue;
        }
        if !paused.contains_key(&j.queue) {
            let rows = tx.query(&PAUSED, &[j.queue.as_str().into()]).await?;
            paused.insert(j.queue.clone(), !rows.is_empty());
        }
        if paused[&j.queue] {
            continue;
        }
        let params = [
            claim.now.into(),
            claim.owner.as_str().into(),
            claim.lease_until.into(),
            j.id.into(),
        ];
        if tx.execute(&TAKE, &params).await? == 1 {
            j.state = JobState::Running;
            j.attempt = 1;
            j.attempted_at = Some(stored(claim.now));
            j.lease_owner = Some(claim.owner.clone());
            j.lease_expires_at = Some(stored(claim.lease_until));
        }
    }
    Ok(())
}
