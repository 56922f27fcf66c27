//! The conformance suite: every store and runtime behaviour, run against each backend from one
//! source (the way River's shared driver tests work). A behaviour that differs between backends
//! is a bug.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

#[path = "conformance/harness.rs"]
mod harness;

#[path = "conformance/actions.rs"]
mod actions;
#[path = "conformance/budget.rs"]
mod budget;
#[path = "conformance/counts.rs"]
mod counts;
#[path = "conformance/durability.rs"]
mod durability;
#[path = "conformance/faulty.rs"]
mod faulty;
#[path = "conformance/jobs.rs"]
mod jobs;
#[path = "conformance/limits.rs"]
mod limits;
#[path = "conformance/pauses.rs"]
mod pauses;
#[path = "conformance/periodic.rs"]
mod periodic;
#[path = "conformance/postgres_only.rs"]
mod postgres_only;
#[path = "conformance/processes.rs"]
mod processes;
#[path = "conformance/progress.rs"]
mod progress;
#[path = "conformance/regressions.rs"]
mod regressions;
#[path = "conformance/round_three.rs"]
mod round_three;
#[path = "conformance/sqlite_only.rs"]
mod sqlite_only;
#[path = "conformance/state_machine.rs"]
mod state_machine;
#[path = "conformance/timelines.rs"]
mod timelines;

onus_testkit::both!(
    setup = crate::harness::Env::new;
            jobs: [
                insert_and_complete,
                args_that_fail_to_decode_are_discarded_naming_the_field,
                retryable_error_waits_out_the_backoff,
                snooze_spends_no_attempt,
                discard_is_permanent,
                panic_counts_as_a_retryable_failure,
                timeout_counts_as_a_retryable_failure,
                unique_key_returns_the_unfinished_job,
                scheduled_jobs_wait_and_priorities_order,
                queues_have_their_own_concurrency,
                batch_insert_is_all_or_nothing,
                never_claims_unknown_kinds,
                exhausted_jobs_raise_an_alert,
                complete_with_commits_the_job_and_its_writes_together,
                a_kinds_args_check_refuses_bad_inserts,
                another_process_insert_wakes_an_idle_worker_long_before_its_poll,
                an_insert_claims_its_job_for_an_idle_worker_of_its_own_process,
            ],
            actions: [
                manual_retry_runs_now_with_one_more_attempt,
                bulk_retry_acts_on_every_matching_job,
                cancel_waiting_job_at_once,
                cancel_running_job_signals_the_handler,
                bulk_cancel_acts_on_every_matching_job,
                retry_and_cancel_refuse_with_a_reason,
                cancel_with_no_filter_cancels_everything_waiting,
                a_cancel_requested_elsewhere_wins_over_a_failed_attempt,
            ],
            limits: [
                lease_key_runs_one_at_a_time,
                lease_key_allows_n_slots,
                lease_keys_under_contention_lose_no_wakeup,
                jobs_of_a_busy_key_wait_in_the_claim,
                a_completion_hands_the_key_to_its_next_job_in_the_same_commit,
                rate_window_snoozes_to_the_next_window,
                rate_window_drops_on_purpose,
                lease_slot_outlives_its_ttl_while_the_holder_runs,
                a_handler_snooze_on_a_leased_job_keeps_its_time,
                limits_hold_across_processes,
                max_running_caps_a_kind_across_processes,
                a_kinds_rate_window_is_taken_before_each_attempt,
            ],
            pauses: [
                a_paused_key_holds_its_jobs_until_the_pause_ends,
                a_handler_that_pauses_its_key_holds_the_others_and_a_resume_frees_them,
                an_operators_pause_is_replaced_and_a_jobs_only_lengthened,
                a_paused_rate_key_holds_the_jobs_that_take_it,
            ],
            budget: [
                a_spent_retry_budget_defers_retries_and_loses_nothing,
            ],
            progress: [
                progress_and_a_result_are_kept_with_the_job,
            ],
            processes: [
                a_running_process_is_listed_with_its_queues_and_jobs_until_it_stops,
                a_named_pull_worker_is_listed_and_goes_stale,
            ],
            periodic: [
                interval_enqueues_once_per_period_across_restarts,
                cron_schedule_enqueues_at_its_time,
                periodic_failure_waits_for_the_next_period,
                a_daily_schedule_in_a_time_zone_runs_once_across_both_dst_changes,
                missed_periods_follow_the_catch_up_policy_after_an_outage,
                a_schedule_is_paused_resumed_and_run_now,
            ],
            timelines: [
                webhook_preset_full_timeline,
                mail_preset_full_timeline,
                default_preset_full_timeline,
            ],
            durability: [
                rescuer_turns_expired_leases_into_failed_attempts,
                rescuer_ignores_unknown_kinds,
                graceful_shutdown_returns_jobs_unspent,
                sigkill_loses_no_job,
                confirmed_inserts_survive_a_crash,
                confirmed_concurrent_inserts_survive_a_crash,
                cancel_from_another_process_reaches_the_handler,
                many_workers_complete_each_job_exactly_once,
                retention_prunes_finished_jobs,
            ],
            counts: [
                counters_follow_every_change_folded_or_not,
            ],
            state_machine: [
                state_machine_invariants,
            ],
            regressions: [
                regression_hung_heartbeat_trips_the_fence,
                regression_a_lost_claim_reply_is_rescued,
                regression_a_lease_lost_elsewhere_stops_the_attempt_at_once,
                regression_a_nul_in_an_error_never_wedges_other_outcomes,
                regression_a_refused_outcome_does_not_hold_up_the_others,
                regression_bulk_retry_with_shared_unique_keys,
                regression_huge_retention_prunes_nothing,
                regression_bulk_actions_run_in_chunks,
                regression_shutdown_is_bounded_when_the_store_hangs,
                regression_lease_waiters_wake_in_order,
                regression_a_clock_ahead_never_rescues_healthy_jobs,
                regression_an_outcome_that_keeps_timing_out_is_given_up,
            ],
            round_three: [
                regression_a_retry_budget_never_stalls_a_job,
                regression_a_capped_kind_keeps_its_priority,
                regression_cron_in_a_time_zone_survives_the_repeated_hour,
                regression_resuming_an_unpaused_schedule_changes_nothing,
                regression_a_requested_cancel_is_enforced_on_pull_jobs,
            ],
);

/// Not a test of its own: the child process of `durability::sigkill_loses_no_job` (the test binary
/// runs itself with `ONUS_CHILD_URL` set). Without that variable it returns at once.
#[test]
fn child_worker_process() {
    if let Ok(url) = std::env::var("ONUS_CHILD_URL") {
        match std::env::var("ONUS_CHILD_MODE")
            .unwrap_or_default()
            .as_str()
        {
            mode @ ("work" | "periodic") => postgres_only::child_main(&url, mode),
            mode => durability::child_main(&url, mode),
        }
    }
}
