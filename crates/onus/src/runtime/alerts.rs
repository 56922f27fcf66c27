//! Alerts raised by exhausted jobs, as a front door lists and acknowledges them. Written once on
//! the shared database layer.

use crate::db::{Db, FromRow, Row, Sql};
use crate::store::Alert;
use crate::StoreResult;

use super::{Client, Error};

const ALERTS: &str = "onus_alerts";

static OPEN_FIRST: Sql = Sql::new(
    ALERTS,
    "SELECT id, job_id, kind, message, created_at, acked_at FROM onus_alerts
     ORDER BY CASE WHEN acked_at IS NULL THEN 0 ELSE 1 END, id DESC LIMIT $1",
);

static ONE: Sql = Sql::new(
    ALERTS,
    "SELECT id, job_id, kind, message, created_at, acked_at FROM onus_alerts WHERE id = $1",
);

static OPEN_COUNT: Sql = Sql::new(
    ALERTS,
    "SELECT COUNT(*) AS n FROM onus_alerts WHERE acked_at IS NULL",
);

impl FromRow for Alert {
    fn from_row(r: &Row) -> StoreResult<Self> {
        Ok(Alert {
            id: r.get("id")?,
            job_id: r.get("job_id")?,
            kind: r.get("kind")?,
            message: r.get("message")?,
            created_at: r.get("created_at")?,
            acked_at: r.get("acked_at")?,
        })
    }
}

static OPEN_UPTO: Sql = Sql::new(
    ALERTS,
    "SELECT COUNT(*) AS n FROM (SELECT id FROM onus_alerts WHERE acked_at IS NULL LIMIT $1) AS o",
);

static ACK_ALL: Sql = Sql::new(
    ALERTS,
    "UPDATE onus_alerts SET acked_at = $1 WHERE acked_at IS NULL",
);

struct Count(i64);

impl FromRow for Count {
    fn from_row(r: &Row) -> StoreResult<Self> {
        Ok(Count(r.get("n")?))
    }
}

impl Client {
    /// Up to `limit` alerts: open ones first, newest first within each.
    pub async fn alerts(&self, limit: usize) -> Result<Vec<Alert>, Error> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        Ok(Db::new(self.shared.store.clone())
            .read_rows(&OPEN_FIRST, vec![limit.into()])
            .await?)
    }

    /// How many alerts are open.
    pub async fn open_alerts(&self) -> Result<u64, Error> {
        let rows: Vec<Count> = Db::new(self.shared.store.clone())
            .read_rows(&OPEN_COUNT, Vec::new())
            .await?;
        Ok(rows.first().map_or(0, |c| c.0.max(0) as u64))
    }

    /// How many alerts are open, counting no further than `cap` (a badge that costs the same
    /// however many alerts nobody acknowledged).
    pub async fn open_alerts_upto(&self, cap: u64) -> Result<u64, Error> {
        let cap = i64::try_from(cap).unwrap_or(i64::MAX);
        let rows: Vec<Count> = Db::new(self.shared.store.clone())
            .read_rows(&OPEN_UPTO, vec![cap.into()])
            .await?;
        Ok(rows.first().map_or(0, |c| c.0.max(0) as u64))
    }

    /// Acknowledges every open alert in one statement; how many it acknowledged.
    pub async fn ack_all_alerts(&self) -> Result<u64, Error> {
        let now = self.now();
        Ok(Db::new(self.shared.store.clone())
            .execute(&ACK_ALL, vec![now.into()])
            .await?)
    }

    /// One alert, if there is one with that id.
    pub async fn alert(&self, id: i64) -> Result<Option<Alert>, Error> {
        let rows: Vec<Alert> = Db::new(self.shared.store.clone())
            .read_rows(&ONE, vec![id.into()])
            .await?;
        Ok(rows.into_iter().next())
    }

    /// Acknowledges an alert (again: keeps the first time) and returns it; `None` when there is
    /// none with that id.
    pub async fn ack_alert(&self, id: i64) -> Result<Option<Alert>, Error> {
        if !self.shared.store.ack_alert(id, self.now()).await? {
            return Ok(None);
        }
        self.alert(id).await
    }
}
