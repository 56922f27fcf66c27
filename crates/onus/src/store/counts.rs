//! Job counts per state, kind and queue, and the per-minute history of endings, written once for
//! both backends over [`Tx`]. Triggers keep them in the transaction of every change of a job: on
//! SQLite in place (one writer at a time), on PostgreSQL as appended deltas that
//! [`fold`] adds up now and then, so concurrent writers never queue on one counter row.

use crate::clock::Timestamp;
use crate::sql::{Backend, FromRow, Row, Sql, StoreError, StoreResult, Tx};
use crate::store::{CountRow, HistoryRow};

const COUNTS: &str = "onus_job_counts";
const HISTORY: &str = "onus_job_history";

static CURRENT: Sql = Sql::per_backend(
    COUNTS,
    "SELECT state, kind, queue, n FROM onus_job_counts WHERE n <> 0",
    // The folded totals plus the changes not yet folded: one snapshot, so exact.
    "SELECT state, kind, queue, sum(n)::bigint AS n FROM (
         SELECT queue, kind, state, n FROM onus_job_counts
         UNION ALL SELECT queue, kind, state, n FROM onus_job_deltas) AS c
     GROUP BY state, kind, queue HAVING sum(n) <> 0",
);

static SINCE: Sql = Sql::per_backend(
    HISTORY,
    "SELECT minute, kind, state, n FROM onus_job_history WHERE minute >= $1
     ORDER BY minute, kind, state",
    "SELECT minute, kind, state, sum(n)::bigint AS n FROM (
         SELECT minute, kind, state, n FROM onus_job_history WHERE minute >= $1
         UNION ALL SELECT minute, kind, state, n FROM onus_job_deltas
         WHERE minute IS NOT NULL AND minute >= $1) AS h
     GROUP BY minute, kind, state ORDER BY minute, kind, state",
);

// PostgreSQL only. One statement: the deltas it deletes are the ones it adds, atomically. A delta
// appended meanwhile is not in its snapshot and waits for the next fold.
static FOLD_DELTAS: Sql = Sql::new(
    "onus_job_deltas",
    "WITH d AS (DELETE FROM onus_job_deltas RETURNING queue, kind, state, minute, n),
     c AS (
         INSERT INTO onus_job_counts AS t (queue, kind, state, n)
         SELECT queue, kind, state, sum(n) FROM d GROUP BY queue, kind, state
         ON CONFLICT (queue, kind, state) DO UPDATE SET n = t.n + excluded.n)
     INSERT INTO onus_job_history AS t (minute, kind, state, n)
     SELECT minute, kind, state, sum(n) FROM d WHERE minute IS NOT NULL GROUP BY minute, kind, state
     ON CONFLICT (minute, kind, state) DO UPDATE SET n = t.n + excluded.n",
);

static DROP_ZEROS: Sql = Sql::new(COUNTS, "DELETE FROM onus_job_counts WHERE n = 0");

static DROP_OLD: Sql = Sql::new(HISTORY, "DELETE FROM onus_job_history WHERE minute < $1");

fn state(r: &Row) -> StoreResult<crate::job::JobState> {
    r.get::<String>("state")?
        .parse()
        .map_err(|e| StoreError::Query(e, None))
}

impl FromRow for CountRow {
    fn from_row(r: &Row) -> StoreResult<Self> {
        Ok(CountRow {
            state: state(r)?,
            kind: r.get("kind")?,
            queue: r.get("queue")?,
            count: r.get::<i64>("n")?.max(0) as u64,
        })
    }
}

impl FromRow for HistoryRow {
    fn from_row(r: &Row) -> StoreResult<Self> {
        Ok(HistoryRow {
            minute: r.get("minute")?,
            kind: r.get("kind")?,
            state: state(r)?,
            count: r.get::<i64>("n")?.max(0) as u64,
        })
    }
}

/// How many jobs stand in each (state, kind, queue) now.
pub(crate) async fn current<T: Tx + ?Sized>(tx: &T) -> StoreResult<Vec<CountRow>> {
    tx.fetch(&CURRENT, &[]).await
}

/// The endings per minute and kind since `since`.
pub(crate) async fn history<T: Tx + ?Sized>(
    tx: &T,
    since: Timestamp,
) -> StoreResult<Vec<HistoryRow>> {
    tx.fetch(&SINCE, &[since.into()]).await
}

/// Adds up the deltas (PostgreSQL), drops counters at zero and minutes before `keep_since`.
pub(crate) async fn fold<T: Tx + ?Sized>(tx: &T, keep_since: Timestamp) -> StoreResult<()> {
    if tx.backend() == Backend::Postgres {
        tx.execute(&FOLD_DELTAS, &[]).await?;
    }
    tx.execute(&DROP_ZEROS, &[]).await?;
    tx.execute(&DROP_OLD, &[keep_since.into()]).await?;
    Ok(())
}

static ADD: Sql = Sql::per_backend(
    COUNTS,
    "INSERT INTO onus_job_counts (queue, kind, state, n) VALUES ($1, $2, $3, $4)
     ON CONFLICT (queue, kind, state) DO UPDATE SET n = n + excluded.n",
    "INSERT INTO onus_job_deltas (queue, kind, state, minute, n)
     VALUES ($1, $2, $3, date_trunc('minute', CAST($5 AS timestamptz)), $4)",
);

// SQLite only: PostgreSQL's delta carries its minute.
static ADD_HISTORY: Sql = Sql::new(
    HISTORY,
    "INSERT INTO onus_job_history (minute, kind, state, n) VALUES ($1 / 60000000 * 60000000, $2, $3, $4)
     ON CONFLICT (minute, kind, state) DO UPDATE SET n = n + excluded.n",
);

/// Adds `n` jobs to the count of (`queue`, `kind`, `state`), and with `minute` to the history of
/// arrivals in `state` at that minute. The statements that insert jobs, finish them or remove
/// finished ones count themselves through this; `onus_live`'s triggers count the moves between
/// unfinished states (see migration 10).
pub(crate) async fn add<T: Tx + ?Sized>(
    tx: &T,
    queue: &str,
    kind: &str,
    state: &str,
    minute: Option<Timestamp>,
    n: i64,
) -> StoreResult<()> {
    if n == 0 {
        return Ok(());
    }
    let mut params = vec![queue.into(), kind.into(), state.into(), n.into()];
    if tx.backend() == Backend::Postgres {
        params.push(minute.into());
    }
    tx.execute(&ADD, &params).await?;
    if let (Some(minute), Backend::Sqlite) = (minute, tx.backend()) {
        tx.execute(
            &ADD_HISTORY,
            &[minute.into(), kind.into(), state.into(), n.into()],
        )
        .await?;
    }
    Ok(())
}

/// Adds `sign` times the jobs `rows` (each with its `queue` and `kind`) to `state`'s counts, one
/// statement per queue and kind.
pub(crate) async fn grouped<T: Tx + ?Sized>(
    tx: &T,
    state: &str,
    minute: Option<Timestamp>,
    sign: i64,
    rows: &[Row],
) -> StoreResult<()> {
    let mut groups: std::collections::BTreeMap<(String, String), i64> = Default::default();
    for r in rows {
        *groups.entry((r.get("queue")?, r.get("kind")?)).or_default() += sign;
    }
    for ((queue, kind), n) in groups {
        add(tx, &queue, &kind, state, minute, n).await?;
    }
    Ok(())
}

/// Subtracts the finished jobs `rows` (each with its `queue` and `kind`), removed, from `state`'s
/// counts.
pub(crate) async fn removed<T: Tx + ?Sized>(tx: &T, state: &str, rows: &[Row]) -> StoreResult<()> {
    grouped(tx, state, None, -1, rows).await
}
