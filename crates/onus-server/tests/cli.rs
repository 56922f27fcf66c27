//! The `onus` binary, run as a user would: help, policies, job commands, and `serve`.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use onus::{JobState, NewJob};
use serde_json::json;

fn onus(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_onus"))
        .current_dir(dir)
        .args(args)
        .env_remove("ONUS_DATABASE_URL")
        .env_remove("ONUS_CONFIG")
        .env_remove("ONUS_LISTEN")
        .output()
        .expect("run onus")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn every_command_has_help() {
    let dir = tempfile::tempdir().unwrap();
    for cmd in [
        vec!["--help"],
        vec!["serve", "--help"],
        vec!["jobs", "--help"],
        vec!["jobs", "list", "--help"],
        vec!["jobs", "show", "--help"],
        vec!["token", "--help"],
        vec!["token", "rotate", "--help"],
        vec!["encryption", "rotate", "--help"],
        vec!["encryption", "generate", "--help"],
        vec!["jobs", "insert", "--help"],
        vec!["jobs", "delete", "--help"],
        vec!["queues", "list", "--help"],
        vec!["queues", "pause", "--help"],
        vec!["keys", "list", "--help"],
        vec!["keys", "pause", "--help"],
        vec!["keys", "resume", "--help"],
        vec!["periodic", "run", "--help"],
        vec!["jobs", "retry", "--help"],
        vec!["jobs", "cancel", "--help"],
        vec!["policy", "--help"],
        vec!["policy", "show", "--help"],
        vec!["periodic", "--help"],
        vec!["periodic", "list", "--help"],
        vec!["migrate", "--help"],
        vec!["sessions", "revoke", "--help"],
    ] {
        let o = onus(dir.path(), &cmd);
        assert!(o.status.success(), "{cmd:?}: {}", stderr(&o));
        assert!(
            stdout(&o).contains("Usage: onus"),
            "{cmd:?}: {}",
            stdout(&o)
        );
    }
}

#[test]
fn migrate_applies_every_line_and_status_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // A database with no tables yet (an empty file): --status lists every line at version 0 and
    // creates nothing.
    std::fs::write(dir.path().join("onus.db"), b"").unwrap();
    let o = onus(dir.path(), &["migrate", "--status"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("LINE"), "{out}");
    assert!(
        out.contains("jobs") && out.contains("001_jobs.sql"),
        "{out}"
    );
    assert!(
        out.contains("webhooks") && out.contains("001_tables.sql"),
        "{out}"
    );
    let conn = onus::sqlite::rusqlite::Connection::open(dir.path().join("onus.db")).unwrap();
    let tables: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(tables, 0, "--status wrote nothing");
    drop(conn);
    // serve --no-migrate refuses a database that needs migrations, saying what to run.
    let o = onus(
        dir.path(),
        &["serve", "--no-migrate", "--listen", "127.0.0.1:0"],
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("onus migrate"), "{}", stderr(&o));
    // migrate applies every line, once.
    let o = onus(dir.path(), &["migrate"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("applied jobs 1 (001_jobs.sql)"),
        "{}",
        stdout(&o)
    );
    assert!(
        stdout(&o).contains("applied webhooks 1 (001_tables.sql)"),
        "{}",
        stdout(&o)
    );
    let o = onus(dir.path(), &["migrate"]);
    assert!(stdout(&o).contains("nothing to apply"), "{}", stdout(&o));
    let o = onus(dir.path(), &["migrate", "--status", "--json"]);
    let lines: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines.iter().map(|l| l["line"].clone()).collect::<Vec<_>>(),
        vec![json!("jobs"), json!("server"), json!("webhooks")]
    );
    for l in &lines {
        assert_eq!(l["version"], l["latest"], "{l}");
        assert_eq!(l["pending"], json!([]), "{l}");
        assert!(l["applied_at"].is_string(), "{l}");
    }
}

#[test]
fn policy_show_prints_each_presets_timeline() {
    let dir = tempfile::tempdir().unwrap();
    let o = onus(dir.path(), &["policy", "show", "webhook"]);
    assert!(o.status.success());
    let out = stdout(&o);
    assert!(out.contains("max attempts:     18"), "{out}");
    assert!(out.contains("5.32 days"), "{out}");
    assert_eq!(
        out.lines()
            .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
            .count(),
        18
    );
    let out = stdout(&onus(dir.path(), &["policy", "show", "mail"]));
    assert!(out.contains("6.07 h"), "{out}");
    let out = stdout(&onus(dir.path(), &["policy", "show", "default"]));
    assert!(out.contains("= 511 s"), "{out}");
    assert!(out.contains("alert"), "{out}");
    let out = stdout(&onus(dir.path(), &["policy", "show", "periodic"]));
    assert!(out.contains("max attempts:     1"), "{out}");
    let o = onus(dir.path(), &["policy", "show", "webhook", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["timeline"]["steps"].as_array().unwrap().len(), 18);
    assert!((v["span_seconds"].as_f64().unwrap() - 459_305.0).abs() < 1.0);

    let o = onus(dir.path(), &["policy", "show", "nope"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("no kind or preset named \"nope\""),
        "{}",
        stderr(&o)
    );
}

#[test]
fn policy_show_applies_configuration_overrides() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("onus.toml"),
        "[kinds.\"search.index\".policy]\nmax_attempts = 3\nbackoff = { schedule = [\"5s\", \"5m\"] }\n",
    )
    .unwrap();
    let out = stdout(&onus(dir.path(), &["policy", "show", "search.index"]));
    assert!(out.contains("max attempts:     3"), "{out}");
    assert!(out.contains("= 305 s"), "{out}");

    std::fs::write(
        dir.path().join("bad.toml"),
        "[kinds.\"x\".policy]\njitter = 2.0\n",
    )
    .unwrap();
    let o = onus(dir.path(), &["--config", "bad.toml", "policy", "show", "x"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("jitter"), "{}", stderr(&o));
    let o = onus(
        dir.path(),
        &["--config", "missing.toml", "policy", "show", "x"],
    );
    assert!(stderr(&o).contains("does not exist"), "{}", stderr(&o));
}

#[test]
fn bad_database_urls_fail_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let o = onus(
        dir.path(),
        &[
            "--database-url",
            "sqlite:///no/such/dir/onus.db",
            "jobs",
            "list",
        ],
    );
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("directory /no/such/dir does not exist"),
        "{}",
        stderr(&o)
    );
    let o = onus(dir.path(), &["--database-url", "mysql://db", "serve"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("not understood"), "{}", stderr(&o));
    std::fs::write(dir.path().join("junk.db"), vec![b'x'; 4096]).unwrap();
    let o = onus(
        dir.path(),
        &["--database-url", "sqlite://junk.db", "jobs", "list"],
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("not a database"), "{}", stderr(&o));
}

/// A command run where there is no database created an empty one and answered as if it had
/// found nothing. Every command but `serve` and `migrate` says so, creating nothing.
#[test]
fn regression_a_command_where_there_is_no_database_says_so() {
    let dir = tempfile::tempdir().unwrap();
    for cmd in [
        vec!["jobs", "list"],
        vec!["jobs", "show", "1"],
        vec!["jobs", "retry", "1"],
        vec!["jobs", "cancel", "--all"],
        vec!["periodic", "list"],
        vec!["jobs", "insert", "http.request"],
        vec!["jobs", "delete", "1"],
        vec!["queues", "list"],
        vec!["keys", "list"],
        vec!["keys", "resume", "customer:7"],
        vec!["token", "show"],
        vec!["token", "rotate"],
        vec!["migrate", "--status"],
        vec!["sessions", "revoke"],
    ] {
        let o = onus(dir.path(), &cmd);
        assert!(!o.status.success(), "{cmd:?}");
        let e = stderr(&o);
        assert!(
            e.contains("no database at") && e.contains("onus.db") && e.contains("--database-url"),
            "{cmd:?}: {e}"
        );
        assert!(
            std::fs::read_dir(dir.path()).unwrap().next().is_none(),
            "{cmd:?} created a file"
        );
    }
    // Policies need no database.
    assert!(onus(dir.path(), &["policy", "show", "webhook"])
        .status
        .success());
}

#[tokio::test]
async fn jobs_commands_list_show_retry_and_cancel() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("onus.db").display());
    let client = onus::Onus::builder(onus::open(&url).await.unwrap())
        .build()
        .unwrap()
        .client();
    let a = client
        .insert(NewJob::new("mail.send", json!({"to": "a@example.com"})))
        .await
        .unwrap()
        .job
        .id;
    let b = client
        .insert(NewJob::new("mail.send", json!({})))
        .await
        .unwrap()
        .job
        .id;
    let c = client
        .insert(NewJob::new("search.index", json!({})).queue("indexing"))
        .await
        .unwrap()
        .job
        .id;
    let run = |args: &[&str]| {
        let mut v = vec!["--database-url", url.as_str()];
        v.extend_from_slice(args);
        onus(dir.path(), &v)
    };
    // The job layer's line alone: the commands ask for every line first.
    let o = run(&["jobs", "list"]);
    assert!(
        !o.status.success() && stderr(&o).contains("onus migrate"),
        "{}",
        stderr(&o)
    );
    assert!(run(&["migrate"]).status.success());

    let out = stdout(&run(&["jobs", "list"]));
    assert_eq!(out.lines().count(), 4, "{out}");
    let out = stdout(&run(&["jobs", "list", "--kind", "search.index", "--json"]));
    let rows: Vec<onus::Job> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.iter().map(|j| j.id).collect::<Vec<_>>(), vec![c]);

    let o = run(&["jobs", "cancel"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("name job ids, or a filter"),
        "{}",
        stderr(&o)
    );

    let o = run(&["jobs", "cancel", &a.to_string()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("cancelled 1 waiting job(s)"));
    let show = stdout(&run(&["jobs", "show", &a.to_string()]));
    assert!(show.contains("state:          cancelled"), "{show}");
    assert!(show.contains("cancelled by request"), "{show}");
    assert!(show.contains("a@example.com"), "{show}");

    let o = run(&["jobs", "retry", &a.to_string()]);
    assert!(stdout(&o).contains("retried 1 job(s)"), "{}", stdout(&o));
    assert_eq!(client.get(a).await.unwrap().state, JobState::Available);

    let o = run(&["jobs", "cancel", "--kind", "mail.send"]);
    assert!(
        stdout(&o).contains("cancelled 2 waiting job(s)"),
        "{}",
        stdout(&o)
    );
    assert_eq!(client.get(b).await.unwrap().state, JobState::Cancelled);
    assert_eq!(client.get(c).await.unwrap().state, JobState::Available);

    let o = run(&["jobs", "cancel", &a.to_string()]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("already finished"), "{}", stderr(&o));
    let o = run(&["jobs", "show", "999"]);
    assert!(stderr(&o).contains("no job with id 999"), "{}", stderr(&o));
    let out = stdout(&run(&["periodic", "list"]));
    assert_eq!(out, "(no periodic jobs)\n");
    let o = run(&["jobs", "list", "--state", "sleeping"]);
    assert!(stderr(&o).contains("unknown job state"), "{}", stderr(&o));
}

/// Reads `serve`'s log until it names the address it listens on.
fn wait_for_listen(stderr: &mut impl BufRead, log: &mut String) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut line = String::new();
    while Instant::now() < deadline {
        line.clear();
        if stderr.read_line(&mut line).unwrap() == 0 {
            panic!("serve exited before listening");
        }
        log.push_str(&line);
        if let Some(i) = line.find("listening on http://") {
            let rest = &line[i + "listening on http://".len()..];
            return rest
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
                .collect::<String>()
                .trim_end_matches(|c: char| !c.is_ascii_digit())
                .to_string();
        }
    }
    panic!("serve never said where it listens");
}

fn http_get(addr: &str, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// Starts `onus serve` in `dir` with `env`, answers `GET /healthz`, and stops it with SIGTERM;
/// returns everything it logged.
fn serve_and_check(dir: &Path, env: &[(&str, &str)], database: &str) -> String {
    serve_while(dir, env, database, |_| {})
}

/// Like `serve_and_check`, running `during` while the server is up.
fn serve_while(
    dir: &Path,
    env: &[(&str, &str)],
    database: &str,
    during: impl FnOnce(&str),
) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_onus"));
    cmd.current_dir(dir)
        .arg("serve")
        .env_remove("ONUS_DATABASE_URL")
        .env_remove("ONUS_CONFIG")
        .env("ONUS_LISTEN", "127.0.0.1:0")
        .env_remove("NO_COLOR")
        .env_remove("ONUS_API_TOKEN")
        .stderr(Stdio::piped())
        .stdout(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut log = String::new();
    let addr = wait_for_listen(&mut err, &mut log);
    let resp = http_get(&addr, "/healthz");
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(resp.contains("\"status\":\"ok\""), "{resp}");
    assert!(
        resp.contains(&format!("\"database\":\"{database}\"")),
        "{resp}"
    );
    during(&addr);
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let code = child.wait().unwrap();
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    assert!(code.success(), "serve exits cleanly on SIGTERM: {rest}");
    assert!(rest.contains("stopped"), "{rest}");
    let log = log + &rest;
    assert!(
        !log.contains('\u{1b}'),
        "no colour codes when the log is not a terminal: {log}"
    );
    log
}

/// One HTTP call with a bearer token; the whole answer as text.
fn http_call(addr: &str, method: &str, path: &str, token: &str, body: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn the_generated_token_is_shown_rotated_and_kept_for_a_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let o = onus(dir.path(), &["token", "show"]);
    assert!(!o.status.success(), "no token before the first start");
    let mut tokens = Vec::new();
    let log = serve_while(dir.path(), &[], "sqlite", |addr| {
        let show = onus(dir.path(), &["token", "show"]);
        assert!(show.status.success(), "{}", stderr(&show));
        let first = stdout(&show).trim().to_string();
        assert!(first.starts_with("onus_") && first.len() >= 40, "{first}");
        assert!(http_call(addr, "GET", "/api/v1/kinds", &first, "").starts_with("HTTP/1.1 200"));
        assert!(
            http_call(addr, "GET", "/api/v1/kinds", "onus_wrong", "").starts_with("HTTP/1.1 401")
        );
        let rot = onus(dir.path(), &["token", "rotate"]);
        assert!(rot.status.success(), "{}", stderr(&rot));
        let second = stdout(&rot).trim().to_string();
        assert_ne!(first, second);
        assert!(stderr(&rot).contains("1h more"), "{}", stderr(&rot));
        // Both work during the grace period, in the running server too.
        let r = http_call(addr, "GET", "/api/v1/kinds", &second, "");
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
        assert!(http_call(addr, "GET", "/api/v1/kinds", &first, "").starts_with("HTTP/1.1 200"));
        assert_eq!(stdout(&onus(dir.path(), &["token", "show"])).trim(), second);
        let bad = onus(dir.path(), &["token", "rotate", "--grace", "soon"]);
        assert!(
            !bad.status.success() && stderr(&bad).contains("--grace"),
            "{}",
            stderr(&bad)
        );
        let now = onus(dir.path(), &["token", "rotate", "--grace", "0s"]);
        let third = stdout(&now).trim().to_string();
        assert!(http_call(addr, "GET", "/api/v1/kinds", &third, "").starts_with("HTTP/1.1 200"));
        tokens = vec![first, second, third];
    });
    assert!(log.contains("generated an API token"), "{log}");
    for t in &tokens {
        assert!(!log.contains(t.as_str()), "a token reached the log: {log}");
    }
    // A configured token wins, and is not rotated here.
    let o = Command::new(env!("CARGO_BIN_EXE_onus"))
        .current_dir(dir.path())
        .args(["token", "rotate"])
        .env("ONUS_API_TOKEN", "configured-token")
        .output()
        .unwrap();
    assert!(
        !o.status.success() && stderr(&o).contains("configured"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn json_logs_are_one_object_per_line() {
    let dir = tempfile::tempdir().unwrap();
    let log = serve_while(
        dir.path(),
        &[("ONUS_LOG_FORMAT", "json")],
        "sqlite",
        |addr| {
            http_get(addr, "/api/v1/jobs");
        },
    );
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l["fields"]["status"] == 401 && l["span"]["path"] == "/api/v1/jobs"),
        "request logs carry method, path, status and duration: {log}"
    );
}

#[test]
fn encryption_keys_are_made_and_secrets_re_encrypted() {
    let dir = tempfile::tempdir().unwrap();
    let key = stdout(&onus(dir.path(), &["encryption", "generate"]))
        .trim()
        .to_string();
    assert_eq!(key.len(), 44, "{key}");
    std::fs::write(dir.path().join("new.key"), &key).unwrap();
    std::fs::write(dir.path().join("bad.key"), "short").unwrap();
    assert!(onus(dir.path(), &["migrate"]).status.success());
    let o = onus(
        dir.path(),
        &["encryption", "rotate", "--new-key-file", "new.key"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("re-encrypted the secrets of 0 endpoint(s)"),
        "{}",
        stdout(&o)
    );
    let o = onus(
        dir.path(),
        &["encryption", "rotate", "--new-key-file", "bad.key"],
    );
    assert!(
        !o.status.success() && stderr(&o).contains("32 bytes"),
        "{}",
        stderr(&o)
    );
    std::fs::write(
        dir.path().join("onus.toml"),
        "encryption_key_file = 'missing.key'\n",
    )
    .unwrap();
    let o = onus(dir.path(), &["serve", "--listen", "127.0.0.1:0"]);
    assert!(
        !o.status.success() && stderr(&o).contains("missing.key"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn serve_defaults_to_sqlite_in_the_working_directory_and_answers_healthz() {
    let dir = tempfile::tempdir().unwrap();
    serve_and_check(dir.path(), &[], "sqlite");
    assert!(
        dir.path().join("onus.db").is_file(),
        "the default database is onus.db in the working directory"
    );
}

#[tokio::test]
async fn serve_runs_unchanged_on_postgresql() {
    let dir = tempfile::tempdir().unwrap();
    let url = onus_testkit::PgCluster::shared()
        .fresh_database()
        .await
        .unwrap();
    let d = dir.path().to_path_buf();
    // A password in the query string (the test cluster trusts every local login) never shows.
    let url = format!("{url}?password=hunter2-never-logged");
    let log = tokio::task::spawn_blocking(move || {
        serve_and_check(&d, &[("ONUS_DATABASE_URL", url.as_str())], "postgres")
    })
    .await
    .unwrap();
    assert!(!dir.path().join("onus.db").exists());
    assert!(log.contains("postgres://postgres@127.0.0.1:"), "{log}");
    assert!(
        !log.contains("hunter2"),
        "a password reached the log: {log}"
    );
}

#[test]
fn serve_delivers_webhooks_published_by_another_process() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("onus.toml"),
        "[webhooks]\nallow_networks = [\"127.0.0.1/32\"]\n",
    )
    .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let url = format!("sqlite://{}", dir.path().join("onus.db").display());
    let sink = rt.block_on(onus_testkit::sink::HttpSink::start(|_, _| {
        onus_testkit::sink::Reply::status(204)
    }));
    serve_while(dir.path(), &[], "sqlite", |_| {
        rt.block_on(async {
            let store = onus::open(&url).await.unwrap();
            // This process registers the endpoint: its guard must allow the loopback sink too.
            let hooks = onus_webhooks::Webhooks::open(
                store.clone(),
                onus_webhooks::WebhookConfig {
                    allow_networks: vec!["127.0.0.1/32".into()],
                    ..Default::default()
                },
            )
            .await
            .unwrap();
            let _onus = onus::Onus::builder(store)
                .component(&hooks)
                .build()
                .unwrap();
            let (_, secret) = hooks
                .create_endpoint(onus_webhooks::NewEndpoint {
                    url: sink.url("/hook"),
                    ..Default::default()
                })
                .await
                .unwrap();
            let ev = hooks
                .publish("invoice.paid", json!({"n": 1}), None)
                .await
                .unwrap();
            let deadline = Instant::now() + Duration::from_secs(30);
            while sink.count() == 0 {
                assert!(
                    Instant::now() < deadline,
                    "serve never delivered the webhook"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let r = &sink.received()[0];
            assert_eq!(r.header("webhook-id"), Some(ev.id.as_str()));
            let ts: i64 = r.header("webhook-timestamp").unwrap().parse().unwrap();
            assert_eq!(
                onus_webhooks::signing::verify(&secret, &r.headers, &r.body, ts),
                Ok(())
            );
        });
    });
}

#[test]
fn bad_webhook_settings_stop_serve_with_what_to_fix() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("onus.toml"),
        "[webhooks]\nallow_networks = [\"localhost\"]\n",
    )
    .unwrap();
    let o = onus(dir.path(), &["serve"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("allow_networks"), "{}", stderr(&o));
}

/// A running `onus serve` and where it listens.
struct Served {
    child: std::process::Child,
    addr: String,
}

impl Served {
    fn start(dir: &Path, env: &[(&str, &str)]) -> Served {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_onus"));
        cmd.current_dir(dir)
            .arg("serve")
            .env_remove("ONUS_CONFIG")
            .env_remove("ONUS_API_TOKEN")
            .env("ONUS_LISTEN", "127.0.0.1:0")
            .stderr(Stdio::piped())
            .stdout(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let mut log = String::new();
        let addr = wait_for_listen(&mut err, &mut log);
        // Keep reading the log so the server never blocks on a full pipe.
        std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
        Served { child, addr }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The JSON body of an HTTP answer.
fn json_of(answer: &str) -> serde_json::Value {
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{answer}: {e}"))
}

/// Polls `GET path` on `addr` until `done` holds, at most 30 s.
fn wait_until(
    addr: &str,
    path: &str,
    token: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v = json_of(&http_call(addr, "GET", path, token, ""));
        if done(&v) {
            return v;
        }
        assert!(Instant::now() < deadline, "GET {path} never got there: {v}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_on_postgresql_share_jobs_pauses_and_the_token() {
    let sink =
        onus_testkit::sink::HttpSink::start(|_, _| onus_testkit::sink::Reply::status(200)).await;
    let target = sink.url("/work");
    let url = onus_testkit::PgCluster::shared()
        .fresh_database()
        .await
        .unwrap();
    tokio::task::spawn_blocking(move || {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("onus.toml"),
            "[queues]\ndefault = 2\nother = 1\n[http]\nallow_networks = [\"127.0.0.1/32\"]\n",
        )
        .unwrap();
        let env = [("ONUS_DATABASE_URL", url.as_str())];
        let a = Served::start(dir.path(), &env);
        let b = Served::start(dir.path(), &env);
        let show = Command::new(env!("CARGO_BIN_EXE_onus"))
            .current_dir(dir.path())
            .args(["token", "show"])
            .env("ONUS_DATABASE_URL", &url)
            .output()
            .unwrap();
        let token = stdout(&show).trim().to_string();
        assert!(token.starts_with("onus_"), "{}", stderr(&show));
        let job = |queue: &str| {
            format!(r#"{{"kind": "http.request", "queue": "{queue}", "args": {{"method": "POST", "url": "{target}"}}}}"#)
        };
        // A job inserted through one server runs in either; both see it done.
        let j = json_of(&http_call(&a.addr, "POST", "/api/v1/jobs", &token, &job("default")));
        let id = j["id"].as_i64().unwrap();
        wait_until(&b.addr, &format!("/api/v1/jobs/{id}"), &token, |v| v["state"] == "completed");
        // A queue paused through one is paused in both.
        let p = json_of(&http_call(&a.addr, "POST", "/api/v1/queues/default/pause", &token, ""));
        assert_eq!(p["paused"], json!(true), "{p}");
        let qs = json_of(&http_call(&b.addr, "GET", "/api/v1/queues", &token, ""));
        let default = qs["queues"].as_array().unwrap().iter().find(|q| q["name"] == "default").unwrap().clone();
        assert_eq!(default["paused"], json!(true), "{qs}");
        let held = json_of(&http_call(&b.addr, "POST", "/api/v1/jobs", &token, &job("default")))["id"].as_i64().unwrap();
        let other = json_of(&http_call(&b.addr, "POST", "/api/v1/jobs", &token, &job("other")))["id"].as_i64().unwrap();
        wait_until(&a.addr, &format!("/api/v1/jobs/{other}"), &token, |v| v["state"] == "completed");
        let h = json_of(&http_call(&a.addr, "GET", &format!("/api/v1/jobs/{held}"), &token, ""));
        assert_eq!(h["state"], json!("available"), "no process claims from a paused queue: {h}");
        http_call(&b.addr, "POST", "/api/v1/queues/default/resume", &token, "");
        wait_until(&a.addr, &format!("/api/v1/jobs/{held}"), &token, |v| v["state"] == "completed");
        drop((a, b));
    })
    .await
    .unwrap();
    assert_eq!(sink.count(), 3);
}

#[test]
fn a_policy_override_shows_alike_in_policy_show_and_get_kinds() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("onus.toml"),
        "[kinds.\"report.build\".policy]\nmax_attempts = 4\nbackoff = { schedule = [\"5s\", \"2m\"] }\n",
    )
    .unwrap();
    let shown = onus(dir.path(), &["policy", "show", "report.build", "--json"]);
    assert!(shown.status.success(), "{}", stderr(&shown));
    let shown: serde_json::Value = serde_json::from_str(&stdout(&shown)).unwrap();
    assert_eq!(shown["policy"]["max_attempts"], json!(4));
    let mut served = serde_json::Value::Null;
    serve_while(dir.path(), &[], "sqlite", |addr| {
        let token = stdout(&onus(dir.path(), &["token", "show"]))
            .trim()
            .to_string();
        let kinds = json_of(&http_call(addr, "GET", "/api/v1/kinds", &token, ""));
        served = kinds["kinds"]
            .as_array()
            .unwrap()
            .iter()
            .find(|k| k["name"] == "report.build")
            .unwrap()
            .clone();
    });
    assert_eq!(served["timeline"], shown["timeline"], "{served}");
    assert_eq!(served["policy"], shown["policy"]);
    assert_eq!(served["span_seconds"], json!(245.0));
}

#[test]
fn the_cli_reaches_what_the_api_does() {
    let dir = tempfile::tempdir().unwrap();
    assert!(onus(dir.path(), &["migrate"]).status.success());
    let run = |args: &[&str]| onus(dir.path(), args);
    let ok = |args: &[&str]| {
        let o = run(args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        stdout(&o)
    };
    let refused = |args: &[&str]| {
        let o = run(args);
        assert!(!o.status.success(), "{args:?} was taken: {}", stdout(&o));
        stderr(&o)
    };

    assert_eq!(ok(&["jobs", "list"]), "(no jobs)\n");
    let later = "2100-01-01T00:00:00Z";
    let out = ok(&[
        "jobs",
        "insert",
        "http.request",
        "--args",
        r#"{"method": "POST", "url": "https://example.com/hook", "body": "Invoice 42"}"#,
        "--queue",
        "outbound",
        "--priority",
        "-1",
        "--run-at",
        later,
        "--tag",
        "billing,eu",
        "--lease-key",
        "customer:7",
    ]);
    assert!(
        out.starts_with(
            "enqueued job 1 (http.request in queue outbound, scheduled at 2100-01-01 00:00:00 UTC)"
        ),
        "{out}"
    );
    let job: serde_json::Value =
        serde_json::from_str(&ok(&["jobs", "show", "1", "--json"])).unwrap();
    assert_eq!(job["priority"], -1);
    assert_eq!(job["tags"], json!(["billing", "eu"]));
    assert_eq!(job["lease_key"], "customer:7");
    let out = ok(&[
        "jobs",
        "insert",
        "http.request",
        "--args",
        r#"{"method": "POST", "url": "https://example.com/b"}"#,
        "--unique-key",
        "once",
        "--run-at",
        later,
    ]);
    assert!(out.starts_with("enqueued job 2"), "{out}");
    let out = ok(&[
        "jobs",
        "insert",
        "http.request",
        "--args",
        r#"{"method": "POST", "url": "https://example.com/b"}"#,
        "--unique-key",
        "once",
        "--run-at",
        later,
    ]);
    assert!(
        out.starts_with("not inserted: job 2 (scheduled) holds the unique key \"once\""),
        "{out}"
    );
    // Refused as the API refuses it, and checked before anything is written.
    let e = refused(&["jobs", "insert", "no.such.kind"]);
    assert!(
        e.contains("unknown kind \"no.such.kind\"") && e.contains("known kinds"),
        "{e}"
    );
    let e = refused(&["jobs", "insert", "webhook.deliver"]);
    assert!(e.contains("publish an event instead"), "{e}");
    let e = refused(&["jobs", "insert", "http.request", "--args", "{url"]);
    assert!(e.contains("--args") && e.contains("not JSON"), "{e}");
    let e = refused(&["jobs", "insert", "http.request", "--run-at", "tomorrow"]);
    assert!(e.contains("--run-at") && e.contains("RFC 3339"), "{e}");

    // The list's filters, times with their zone.
    let out = ok(&["jobs", "list", "--tag", "eu"]);
    assert_eq!(out.lines().count(), 2, "{out}");
    assert!(out.contains("2100-01-01 00:00:00 UTC"), "{out}");
    assert_eq!(ok(&["jobs", "list", "--tag", "nothing"]), "(no jobs)\n");
    assert_eq!(ok(&["jobs", "list", "--q", "invoice"]).lines().count(), 2);
    assert_eq!(
        ok(&["jobs", "list", "--created-after", later]),
        "(no jobs)\n"
    );
    assert_eq!(
        ok(&["jobs", "list", "--created-before", later])
            .lines()
            .count(),
        3
    );
    let show = ok(&["jobs", "show", "1"]);
    assert!(
        show.contains("run at:         2100-01-01 00:00:00.000 UTC"),
        "{show}"
    );

    // Delete: finished jobs only.
    let e = refused(&["jobs", "delete", "1"]);
    assert!(
        e.contains("only finished jobs") && e.contains("cancel it first"),
        "{e}"
    );
    let out = ok(&["jobs", "delete", "--queue", "outbound"]);
    assert!(
        out.contains("deleted 0 finished job(s)") && out.contains("left 1 unfinished"),
        "{out}"
    );
    ok(&["jobs", "cancel", "1"]);
    let out = ok(&["jobs", "delete", "--state", "cancelled"]);
    assert!(out.starts_with("deleted 1 finished job(s): 1"), "{out}");
    assert!(refused(&["jobs", "show", "1"]).contains("no job with id 1"));
    assert!(refused(&["jobs", "delete"]).contains("name job ids, or a filter"));

    // Queues.
    let out = ok(&["queues", "pause", "outbound"]);
    assert!(
        out.starts_with("queue outbound is paused (since 20"),
        "{out}"
    );
    assert!(
        out.contains("UTC)") && out.contains("onus queues resume outbound"),
        "{out}"
    );
    let out = ok(&["queues", "list"]);
    let line = out
        .lines()
        .find(|l| l.starts_with("outbound"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("paused") && line.ends_with('-'), "{out}");
    let line = out.lines().find(|l| l.starts_with("default")).unwrap();
    assert!(
        line.contains("running") && line.ends_with("scheduled 1"),
        "{out}"
    );
    let out = ok(&["queues", "resume", "outbound"]);
    assert!(out.starts_with("queue outbound runs"), "{out}");
    let q: Vec<serde_json::Value> = ok(&["queues", "list", "--json"])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // Resumed and empty, it is listed no more; the default queue holds the job left.
    assert!(
        !q.iter().any(|q| q["paused"] == true) && q.iter().any(|q| q["name"] == "default"),
        "{q:?}"
    );

    // Paused lease keys (not encryption keys).
    assert_eq!(ok(&["keys", "list"]), "(no paused keys)\n");
    let out = ok(&[
        "keys",
        "pause",
        "customer:7",
        "--for",
        "10m",
        "--reason",
        "maintenance",
    ]);
    assert!(
        out.starts_with("paused customer:7 until 20") && out.contains("UTC: 0 waiting job(s) held"),
        "{out}"
    );
    let out = ok(&["keys", "list"]);
    assert!(
        out.contains("customer:7") && out.contains("maintenance"),
        "{out}"
    );
    assert!(refused(&["keys", "pause", "customer:7", "--for", "0s"])
        .contains("a pause lasts at least 1s"));
    assert!(refused(&["keys", "pause", "customer:7"]).contains("--until"));
    let e = refused(&[
        "keys",
        "pause",
        "customer:7",
        "--for",
        "1h",
        "--until",
        later,
    ]);
    assert!(e.contains("cannot be used with"), "{e}");
    assert_eq!(
        ok(&["keys", "resume", "customer:7"]),
        "resumed customer:7: 0 job(s) due now\n"
    );
    assert_eq!(
        ok(&["keys", "resume", "customer:7"]),
        "customer:7 was not paused: nothing changed\n"
    );
    assert!(refused(&["keys", "generate"]).contains("onus encryption generate"));
}

#[test]
fn flags_are_checked_before_a_database_is_made() {
    let dir = tempfile::tempdir().unwrap();
    for (args, says) in [
        (
            vec!["serve", "--listen", "not-an-address"],
            "cannot listen on not-an-address",
        ),
        (
            vec!["jobs", "insert", "http.request", "--run-at", "soon"],
            "--run-at",
        ),
        (vec!["jobs", "list", "--limit", "0"], "--limit"),
        (vec!["keys", "pause", "k", "--for", "a while"], "--for"),
        (
            vec!["keys", "pause", "k", "--for", "0s"],
            "a pause lasts at least 1s",
        ),
    ] {
        let o = onus(dir.path(), &args);
        assert!(!o.status.success(), "{args:?}");
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
        assert!(
            std::fs::read_dir(dir.path()).unwrap().next().is_none(),
            "{args:?} made a file before it refused its flags"
        );
    }
    let help = stdout(&onus(dir.path(), &["--help"]));
    assert!(help.contains("[env: ONUS_CONFIG]"), "{help}");
    assert!(!help.contains("ONUS_CONFIG="), "{help}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_logs_how_a_job_ended_and_where_the_panel_is() {
    let sink = onus_testkit::sink::HttpSink::start(|_, _| {
        onus_testkit::sink::Reply::status(500).body("upstream says session=s3cr3t-in-the-body")
    })
    .await;
    let target = sink.url("/fails");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("onus.toml"),
        "[http]\nallow_networks = [\"127.0.0.1/32\"]\n\n[kinds.\"http.request\".policy]\nmax_attempts = 1\n",
    )
    .unwrap();
    let d = dir.path().to_path_buf();
    let log = tokio::task::spawn_blocking(move || {
        serve_while(&d, &[], "sqlite", |addr| {
            let token = stdout(&onus(&d, &["token", "show"])).trim().to_string();
            let body = json!({"kind": "http.request", "args": {"method": "POST", "url": target}})
                .to_string();
            let r = http_call(addr, "POST", "/api/v1/jobs", &token, &body);
            assert!(r.starts_with("HTTP/1.1 201"), "{r}");
            let j = wait_until(addr, "/api/v1/jobs/1", &token, |j| {
                j["state"] == "discarded"
            });
            assert_eq!(
                j["errors"][0]["message"],
                "HTTP 500; response: upstream says session=s3cr3t-in-the-body",
                "the history keeps what the other side said: {j}"
            );
        })
    })
    .await
    .unwrap();
    assert!(
        log.contains("the tasks panel is at http://127.0.0.1:")
            && log.contains("`onus token show` prints it"),
        "{log}"
    );
    let ending = log
        .lines()
        .find(|l| l.contains("discarded ("))
        .unwrap_or_else(|| panic!("no ending logged: {log}"));
    assert!(
        ending.contains("discarded (exhausted after 1 attempt); alert raised"),
        "{ending}"
    );
    assert!(!log.contains("retryable:"), "{log}");
    assert!(
        ending.contains("error=HTTP 500") && !log.contains("s3cr3t"),
        "a response body is not logged: {log}"
    );
    // Request durations are rounded.
    let ms = log
        .lines()
        .filter(|l| l.contains("answered"))
        .filter_map(|l| l.split("ms=").nth(1))
        .map(|v| v.split_whitespace().next().unwrap_or_default().to_string())
        .collect::<Vec<_>>();
    assert!(!ms.is_empty(), "{log}");
    for v in &ms {
        let decimals = v.split('.').nth(1).map_or(0, str::len);
        assert!(decimals <= 1, "a duration not rounded: {v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_schedules_are_paused_resumed_and_run_from_the_cli() {
    let sink =
        onus_testkit::sink::HttpSink::start(|_, _| onus_testkit::sink::Reply::status(200)).await;
    let target = sink.url("/nightly");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("onus.toml"),
        format!(
            "[http]\nallow_networks = [\"127.0.0.1/32\"]\n\n[periodic.nightly]\nevery = \"1h\"\nkind = \"http.request\"\nargs = {{ method = \"POST\", url = \"{target}\" }}\n"
        ),
    )
    .unwrap();
    let d = dir.path().to_path_buf();
    tokio::task::spawn_blocking(move || {
        serve_while(&d, &[], "sqlite", |addr| {
            let token = stdout(&onus(&d, &["token", "show"])).trim().to_string();
            // Registered by the server's start.
            wait_until(addr, "/api/v1/periodic", &token, |v| {
                v["periodic"].as_array().is_some_and(|p| !p.is_empty())
            });
            let cli = |args: &[&str]| {
                let o = onus(&d, args);
                assert!(o.status.success(), "{args:?}: {}", stderr(&o));
                stdout(&o)
            };
            let out = cli(&["periodic", "pause", "nightly"]);
            assert!(
                out.starts_with("schedule nightly is paused")
                    && out.contains("onus periodic resume nightly"),
                "{out}"
            );
            let list = cli(&["periodic", "list"]);
            assert!(
                list.contains("nightly") && list.contains("paused"),
                "{list}"
            );
            let out = cli(&["periodic", "run", "nightly"]);
            assert!(
                out.starts_with("enqueued job 1 for schedule nightly (http.request in queue"),
                "{out}"
            );
            wait_until(addr, "/api/v1/jobs/1", &token, |j| {
                j["state"] == "completed"
            });
            let out = cli(&["periodic", "resume", "nightly"]);
            assert!(
                out.starts_with("schedule nightly runs (every: 1h); next run 20")
                    && out.contains(" UTC"),
                "{out}"
            );
            let o = onus(&d, &["periodic", "run", "weekly"]);
            assert!(!o.status.success(), "{}", stdout(&o));
            assert!(stderr(&o).contains("weekly"), "{}", stderr(&o));
        })
    })
    .await
    .unwrap();
    assert_eq!(sink.count(), 1);
}

#[test]
fn processes_shows_the_running_server_and_forgets_it_once_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_path_buf();
    serve_while(dir.path(), &[], "sqlite", |_| {
        let o = onus(&d, &["processes"]);
        assert!(o.status.success(), "{}", stderr(&o));
        let out = stdout(&o);
        let mut lines = out.lines();
        assert!(lines.next().unwrap().starts_with("PROCESS"), "{out}");
        let row = lines.next().unwrap_or_else(|| panic!("{out}"));
        assert!(
            row.contains("runtime  yes") && row.contains("default ("),
            "{out}"
        );
        assert!(row.contains(" UTC"), "{out}");
        let json: serde_json::Value =
            serde_json::from_str(&stdout(&onus(&d, &["processes", "--json"]))).unwrap();
        assert_eq!(json["processes"][0]["role"], "runtime", "{json}");
        assert_eq!(json["processes"][0]["live"], true, "{json}");
    });
    assert_eq!(
        stdout(&onus(dir.path(), &["processes"])),
        "(no processes seen in the last hour)\n"
    );
}
