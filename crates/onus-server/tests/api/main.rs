//! The HTTP API, call by call, on both backends: a real server on loopback, a real client.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod admin;
mod errors;
mod examples;
mod harness;
mod hostile;
mod jobs;
mod keys;
mod mail;
mod openapi;
mod panel;
mod push;
mod round_three;
mod schema;
mod secrets;
mod webhooks;
mod workers;

onus_testkit::both!(
    setup = crate::harness::api;
    jobs: [
        insert_show_and_a_unique_key_answers_the_holder,
        a_batch_answers_in_order_and_inserts_all_or_nothing,
        list_filters_and_pages_stably_while_jobs_arrive,
        retry_cancel_and_delete_one_job,
        bulk_actions_reach_every_match_and_a_dry_run_changes_nothing,
        a_filtered_list_reads_a_bounded_window_and_its_cursor_goes_on,
    ],
    errors: [
        refused_calls_say_why_and_change_nothing,
        healthz_needs_no_token_and_the_body_limit_is_configurable,
    ],
    hostile: [hostile_clients_get_a_clear_4xx_or_a_closed_connection],
    admin: [
        kinds_show_how_each_is_handled_and_its_timeline,
        a_paused_queue_runs_nothing_until_resumed,
        periodic_jobs_are_listed_with_their_next_run,
        a_configured_periodic_job_is_paused_resumed_and_run,
        an_exhausted_job_raises_an_alert_that_is_acknowledged,
        clock_offset_shifts_what_the_server_stamps,
    ],
    webhooks: [
        an_event_reaches_only_its_tenants_endpoints,
        one_event_id_is_one_event,
        endpoints_are_managed_and_bad_ones_refused,
        a_fixed_endpoint_gets_its_discarded_deliveries_again,
    ],
    keys: [
        a_key_is_paused_listed_and_resumed_through_the_api,
        a_pull_workers_snooze_can_pause_its_jobs_key,
    ],
    workers: [
        a_claimed_job_is_answered_once_with_its_lease,
        a_pull_worker_reports_progress_and_keeps_a_result,
        a_snooze_spends_no_attempt_and_a_discard_ends_the_job,
        a_late_answer_after_a_rescue_is_refused,
        a_cancel_reaches_the_worker_through_its_heartbeat,
        a_long_poll_returns_when_a_job_arrives,
        the_readme_python_worker_drains_a_thousand_jobs_once_each,
        many_answers_in_one_call_are_each_applied_or_refused_alone,
        many_heartbeats_in_one_call_are_each_renewed_or_refused_alone,
        processes_list_this_server_and_the_named_pull_workers,
    ],
    push: [
        a_push_kind_posts_each_job_signed_and_the_answer_is_classified,
        a_retry_after_snoozes_a_push_without_spending_an_attempt,
        regression_a_push_url_to_a_refused_address_is_refused_at_start,
        a_lease_key_from_configuration_runs_one_job_per_key_at_once,
        a_retry_budget_from_configuration_caps_the_retries_sent,
    ],
    secrets: [
        secrets_are_encrypted_at_rest_once_a_key_is_configured,
        secrets_are_re_encrypted_under_a_new_key,
    ],
    examples: [the_search_indexing_example_survives_two_503s],
    panel: [
        login_sets_a_strict_session_and_forms_need_their_token,
        failed_logins_are_limited_and_other_servers_sessions_refused,
        every_page_renders_and_a_bulk_action_confirms_its_count,
        every_page_renders_empty_and_with_thousands_in_every_state,
        the_panel_works_under_a_base_path,
        events_come_in_pages_with_their_filters,
        regression_sessions_end_with_the_credential,
        regression_a_nul_in_a_panel_query_is_a_422_page,
        an_action_says_what_it_did_once_and_a_refused_form_keeps_its_input,
        a_job_page_says_why_it_waits_and_what_ran_when,
        the_jobs_list_has_state_tabs_and_acts_on_the_chosen_jobs,
        the_endpoints_list_shows_each_endpoints_last_answer_and_success_rate,
    ],
    openapi: [
        every_documented_route_is_served_and_every_route_documented,
        regression_the_document_is_valid_and_every_get_answer_fits_it,
    ],
    mail: [a_mail_job_is_sent_and_marked_through_the_api],
    round_three: [
        regression_a_budget_without_a_minimum_retries_a_lone_pulled_job,
        regression_a_capped_kind_is_claimed_in_priority_order,
        regression_a_short_key_pause_is_refused_naming_seconds,
        regression_post_jobs_refuses_the_servers_own_kinds,
        regression_a_claim_from_the_wrong_queue_names_the_kinds_queue,
        regression_a_lease_token_is_not_readable_from_the_job,
    ],
);

/// `/healthz` answers 503 while PostgreSQL does not answer, and 200 again once it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_is_503_while_the_database_does_not_answer() {
    let db = onus_testkit::TestDb::new(onus_testkit::Backend::Postgres).await;
    let port = onus_testkit::PgCluster::shared().port();
    let proxy = onus_testkit::TcpProxy::start(([127, 0, 0, 1], port).into())
        .await
        .unwrap();
    let url = db
        .url
        .replace(&format!(":{port}/"), &format!(":{}/", proxy.addr().port()));
    let w = harness::api_at(db, &url, onus_testkit::Backend::Postgres, harness::CONFIG)
        .await
        .unwrap_or_else(|(_, e)| panic!("{e}"));
    assert_eq!(w.raw("GET", "/healthz", None, None).await.0, 200);
    proxy.freeze();
    let (s, h) = w.raw("GET", "/healthz", None, None).await;
    assert_eq!(
        (s, &h["status"]),
        (503, &serde_json::json!("unavailable")),
        "{h}"
    );
    assert!(
        !h.to_string().contains("postgres://"),
        "no connection detail without a token: {h}"
    );
    proxy.thaw();
    w.wait_get_raw_ok("/healthz").await;
}

/// PostgreSQL gone mid-run and back: inserts answered 201 before and after are there; inserts
/// while it is gone get a 503 (never a 201), `/healthz` says 503 meanwhile, and the server
/// recovers by itself. Unreachable at start, the server refuses to start naming where it looked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_lost_mid_run_loses_no_confirmed_insert_and_recovers() {
    let db = onus_testkit::TestDb::new(onus_testkit::Backend::Postgres).await;
    let direct = db.url.clone();
    let port = onus_testkit::PgCluster::shared().port();
    let proxy = onus_testkit::TcpProxy::start(([127, 0, 0, 1], port).into())
        .await
        .unwrap();
    let url = direct.replace(&format!(":{port}/"), &format!(":{}/", proxy.addr().port()));

    // Unreachable at start: a clear refusal naming the address.
    proxy.cut();
    let file = onus_server::config::parse(harness::CONFIG).unwrap();
    let e = match onus_server::serve::prepare(&file, &url, true).await {
        Ok(_) => panic!("a server started without its database"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains(&proxy.addr().port().to_string()),
        "the error names where it looked: {e}"
    );
    proxy.restore();

    let w = harness::api_at(db, &url, onus_testkit::Backend::Postgres, harness::CONFIG)
        .await
        .unwrap_or_else(|(_, e)| panic!("{e}"));
    let insert = |tag: &'static str| {
        let w = &w;
        async move {
            w.post(
                "/api/v1/jobs",
                serde_json::json!({"kind": "report.build", "args": {"tag": tag}}),
            )
            .await
        }
    };
    let (s, before) = insert("before").await;
    assert_eq!(s, 201, "{before}");

    proxy.cut();
    for _ in 0..3 {
        let (s, e) = insert("during").await;
        assert_eq!(s, 503, "an insert while the database is gone: {e}");
    }
    let (s, h) = w.raw("GET", "/healthz", None, None).await;
    assert_eq!(s, 503, "{h}");

    proxy.restore();
    w.wait_get_raw_ok("/healthz").await;
    let (s, after) = insert("after").await;
    assert_eq!(s, 201, "{after}");

    // Straight from the database: the two confirmed inserts, and none of those refused.
    let (client, conn) =
        onus::postgres::tokio_postgres::connect(&direct, onus::postgres::tokio_postgres::NoTls)
            .await
            .unwrap();
    tokio::spawn(conn);
    let rows = client
        .query(
            "SELECT args->>'tag' FROM onus_jobs WHERE kind = 'report.build' ORDER BY id",
            &[],
        )
        .await
        .unwrap();
    let tags: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(tags, ["before", "after"]);
}

/// Limits from configuration on a push kind, across two server processes on one PostgreSQL
/// database: one request in flight per customer (lease key, one slot), never more than three in
/// all (`max_running`), and four requests per customer per window (`rate`), the rest snoozed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_from_configuration_hold_across_two_processes() {
    use std::time::Duration;

    use onus_testkit::sink::{HttpSink, Reply};
    use serde_json::json;

    let sink = HttpSink::start(|_, _| Reply::status(200).delay(Duration::from_millis(100))).await;
    let toml = format!(
        r#"{}
[kinds."push.limited"]
url = "{url}"
lease_key = "customer:{{customer}}"
slots = 1
max_running = 3
rate = {{ key = "customer:{{customer}}", limit = 4, per = "300d" }}
"#,
        harness::CONFIG,
        url = sink.url("/limited"),
    );
    let db = onus_testkit::TestDb::new(onus_testkit::Backend::Postgres).await;
    let url = db.url.clone();
    let a = harness::api_at(db, &url, onus_testkit::Backend::Postgres, &toml)
        .await
        .unwrap_or_else(|(_, e)| panic!("{e}"));
    // A second server process on the same database (its own throwaway database unused).
    let spare = onus_testkit::TestDb::new(onus_testkit::Backend::Postgres).await;
    let b = harness::api_at(spare, &url, onus_testkit::Backend::Postgres, &toml)
        .await
        .unwrap_or_else(|(_, e)| panic!("{e}"));
    let mut ids = Vec::new();
    for i in 0..30 {
        let w = if i % 2 == 0 { &a } else { &b };
        let (s, j) = w
            .post(
                "/api/v1/jobs",
                json!({"kind": "push.limited", "args": {"customer": i % 6, "i": i}}),
            )
            .await;
        assert_eq!(s, 201, "{j}");
        assert_eq!(j["lease_key"], json!(format!("customer:{}", i % 6)));
        ids.push(j["id"].as_i64().unwrap());
    }
    let mut done = 0;
    for id in &ids {
        // Completed, or snoozed by the spent window (a snooze behind a busy key is a wait).
        let j = a
            .wait_job(*id, |j| {
                j["state"] == "completed"
                    || (j["state"] == "snoozed"
                        && j["errors"]
                            .as_array()
                            .and_then(|e| e.last())
                            .is_some_and(|e| e["message"].to_string().contains("rate window")))
            })
            .await;
        if j["state"] == "completed" {
            done += 1;
        } else {
            let last = j["errors"].as_array().unwrap().last().unwrap().clone();
            assert!(
                last["message"].as_str().unwrap().contains("rate window"),
                "{j}"
            );
            assert_eq!(
                j["attempt"],
                json!(0),
                "a spent window spends no attempt: {j}"
            );
        }
    }
    assert_eq!(done, 24, "four per customer in the window");
    assert_eq!(sink.count(), 24);
    assert!(
        sink.max_in_flight() <= 3,
        "at most three at once: {}",
        sink.max_in_flight()
    );
    // One at a time per customer: each of its requests starts after the one before answered.
    let got = sink.received();
    for c in 0..6 {
        let at: Vec<_> = got
            .iter()
            .filter(|r| {
                serde_json::from_slice::<serde_json::Value>(&r.body)
                    .is_ok_and(|b| b["args"]["customer"] == json!(c))
            })
            .map(|r| r.at)
            .collect();
        assert_eq!(at.len(), 4, "customer {c}");
        for w in at.windows(2) {
            assert!(
                w[1].duration_since(w[0]) >= Duration::from_millis(95),
                "customer {c}: two requests in flight at once"
            );
        }
    }
}
