//! The store-level suite: the `Store` trait driven directly, with no runtime, on every backend,
//! one file per area (insert, claim, finish, keys, manage, periodic, maintenance). A third backend
//! is checked by adding it to `onus_testkit::Backend`: every operation the job layer relies on is
//! here, and `maintenance::both_backends_create_the_same_tables_and_columns` compares the schemas
//! the migration lines create.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::sync::Arc;
use std::time::Duration;

use chrono::TimeDelta;
use onus::job::{EntryClass, HistoryEntry};
use onus::outcome::Transition;
use onus::store::{
    ClaimRequest, Finish, HeldJob, InsertRow, LeaseDecision, RateAsk, RateDecision, Retention,
};
use onus::{DiscardReason, Job, JobFilter, JobState, Store, Timestamp};
use onus_testkit::{Backend, TestDb};

mod claim;
mod finish;
mod insert;
mod keys;
mod maintenance;
mod manage;
mod periodic;
mod upgrade;

const OWNER: &str = "suite-owner";

struct World {
    store: Arc<dyn Store>,
    now: Timestamp,
    db: TestDb,
}

async fn world(backend: Backend) -> World {
    let db = TestDb::new(backend).await;
    let store = onus::open(&db.url).await.unwrap();
    World {
        store,
        now: "2026-03-01T00:00:00Z".parse().unwrap(),
        db,
    }
}

fn secs(n: i64) -> TimeDelta {
    TimeDelta::seconds(n)
}

impl World {
    fn row(&self, kind: &str) -> InsertRow {
        InsertRow {
            kind: kind.into(),
            queue: "default".into(),
            args: serde_json::json!({"k": kind}),
            priority: 0,
            state: JobState::Available,
            max_attempts: 3,
            run_at: self.now,
            created_at: self.now,
            unique_key: None,
            lease_key: None,
            rate_key: None,
            tags: Vec::new(),
        }
    }

    async fn insert(&self, row: InsertRow) -> Job {
        self.store.insert(vec![row]).await.unwrap().remove(0).job
    }

    async fn claim(&self, kinds: &[&str], limit: usize, at: Timestamp) -> Vec<Job> {
        let req = self.claim_request(kinds, limit, at);
        self.store.claim(req).await.unwrap()
    }

    /// A claim of `kinds` in the default queue at `at`, leased for 30 s, nothing capped.
    fn claim_request(&self, kinds: &[&str], limit: usize, at: Timestamp) -> ClaimRequest {
        ClaimRequest {
            queue: "default".into(),
            kinds: kinds.iter().map(|k| k.to_string()).collect(),
            limit,
            owner: OWNER.into(),
            now: at,
            lease_until: at + secs(30),
            caps: Vec::new(),
            lease_slots: Vec::new(),
        }
    }

    fn finish(&self, job: &Job, transition: Transition, at: Timestamp) -> Finish {
        Finish {
            id: job.id,
            owner: OWNER.into(),
            attempt: job.attempt,
            transition,
            now: at,
            release_lease: job.lease_key.clone(),
            periodic: None,
            expired_before: None,
            result: None,
        }
    }

    async fn get(&self, job: &Job) -> Job {
        self.store.get(job.id).await.unwrap().unwrap()
    }
}

fn entry(at: Timestamp, attempt: u32, message: &str) -> HistoryEntry {
    HistoryEntry {
        at,
        attempt,
        class: EntryClass::Error,
        message: message.into(),
    }
}

/// The backend itself: each test builds its own world.
async fn on(backend: Backend) -> Backend {
    backend
}

onus_testkit::both!(setup = crate::on;
    insert: [
        a_batch_insert_returns_every_row_in_order_as_stored,
        an_insert_claims_only_due_rows_of_unpaused_queues,
        concurrent_inserts_each_get_their_own_rows_and_a_refused_row_fails_alone,
    ],
    claim: [
        claim_takes_due_jobs_of_known_kinds_once,
        claims_through_a_backlog_miss_nothing_sorting_before_what_they_took,
        a_paused_queue_claims_nothing_until_resumed,
        a_claimed_job_is_the_job_as_stored,
        a_capped_kind_takes_no_more_than_its_room,
    ],
    finish: [
        finish_applies_only_for_the_lease_holder,
        heartbeat_renews_held_jobs_and_reports_lost_and_cancelled,
        a_rescue_applies_only_to_a_lease_that_really_expired,
        one_attempt_ended_twice_at_once_applies_once,
    ],
    keys: [
        a_lease_key_takes_its_slots_and_a_release_wakes_the_waiter,
        a_claim_holds_the_jobs_of_a_paused_key_and_fills_every_slot,
        a_rate_window_counts_uses_and_names_the_next_window,
        rate_windows_are_taken_all_or_none,
        a_key_pause_holds_its_jobs_until_resumed,
    ],
    manage: [
        retry_cancel_and_retention,
        a_completed_job_reads_counts_and_goes_as_one,
        regression_retry_clears_lease_wait_alike,
        filters_by_tag_time_and_text_alike_and_delete_takes_finished_jobs,
        a_corrupted_job_row_is_an_error_naming_its_column,
        a_cancel_meeting_a_claim_in_flight_asks_the_running_job_to_stop,
    ],
    periodic: [
        a_period_is_enqueued_once,
        a_schedule_skips_pauses_and_resumes,
    ],
    maintenance: [
        leadership_is_held_by_one_until_it_expires,
        migrations_are_recorded_per_line,
        counters_and_history_follow_every_change_folded_or_not,
    ],
    upgrade: [
        a_database_at_migration_9_upgrades_in_place,
    ],
);
