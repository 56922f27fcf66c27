//! Alerts raised by exhausted jobs, as a front door lists and acknowledges them (the store's
//! flows in `store::maintenance`).

use crate::store::maintenance::{self, AlertOrder};
use crate::store::{db, Alert};

use super::{Client, Error};

impl Client {
    /// Up to `limit` alerts: open ones first, newest first within each.
    pub async fn alerts(&self, limit: usize) -> Result<Vec<Alert>, Error> {
        let store = &*self.shared.store;
        Ok(db::read(store, move |tx| {
            Box::pin(maintenance::alerts(tx, AlertOrder::OpenFirst, limit))
        })
        .await?)
    }

    /// How many alerts are open.
    pub async fn open_alerts(&self) -> Result<u64, Error> {
        self.open_alerts_upto(u64::MAX).await
    }

    /// How many alerts are open, counting no further than `cap` (a badge that costs the same
    /// however many alerts nobody acknowledged).
    pub async fn open_alerts_upto(&self, cap: u64) -> Result<u64, Error> {
        let store = &*self.shared.store;
        Ok(db::read(store, move |tx| {
            Box::pin(maintenance::open_alerts_upto(tx, cap))
        })
        .await?)
    }

    /// Acknowledges every open alert in one statement; how many it acknowledged.
    pub async fn ack_all_alerts(&self) -> Result<u64, Error> {
        let now = self.now();
        let store = &*self.shared.store;
        Ok(db::write(store, move |tx| {
            Box::pin(maintenance::ack_all_alerts(tx, now))
        })
        .await?)
    }

    /// One alert, if there is one with that id.
    pub async fn alert(&self, id: i64) -> Result<Option<Alert>, Error> {
        let store = &*self.shared.store;
        Ok(db::read(store, move |tx| Box::pin(maintenance::alert(tx, id))).await?)
    }

    /// The alerts job `job` raised (one per exhaustion: a job retried by hand may raise another),
    /// oldest first.
    pub async fn alerts_of_job(&self, job: crate::JobId) -> Result<Vec<Alert>, Error> {
        let store = &*self.shared.store;
        Ok(db::read(store, move |tx| {
            Box::pin(maintenance::alerts_of_job(tx, job))
        })
        .await?)
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
