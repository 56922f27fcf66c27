//! The retry-owner gate catches planted violations and passes the real tree.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn gate(root: &Path) -> (bool, String) {
    let out = Command::new(repo().join("scripts/check-retry-owner"))
        .arg("--root")
        .arg(root)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in files {
        let p = dir.path().join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    dir
}

const CLEAN: &str = "pub async fn deliver() -> Result<(), String> { send_once().await }\n";

#[test]
fn the_real_tree_passes() {
    let (ok, out) = gate(&repo());
    assert!(ok, "{out}");
}

#[test]
fn a_clean_integration_passes() {
    let t = tree(&[
        ("crates/onus-webhooks/src/lib.rs", CLEAN),
        (
            "crates/onus-webhooks/src/notes.rs",
            "// never sleep(1) between tries here\n/// nor retries += 1\n",
        ),
        // The job layer itself may wait: it owns retry timing.
        (
            "crates/onus/src/runtime.rs",
            "async fn f() { tokio::time::sleep(d).await; attempts += 1; }\n",
        ),
    ]);
    let (ok, out) = gate(t.path());
    assert!(ok, "{out}");
}

#[test]
fn a_sleep_between_tries_is_caught() {
    let planted = "pub async fn deliver() {\n    loop {\n        if send().await.is_ok() { break }\n        tokio::time::sleep(Duration::from_secs(1)).await;\n    }\n}\n";
    let t = tree(&[("crates/onus-webhooks/src/deliver.rs", planted)]);
    let (ok, out) = gate(t.path());
    assert!(!ok, "{out}");
    assert!(
        out.contains("crates/onus-webhooks/src/deliver.rs:4"),
        "{out}"
    );
    assert!(out.contains("sleeps outside the job layer"), "{out}");
}

#[test]
fn a_retry_loop_is_caught() {
    for planted in [
        "fn f() { let mut retries = 0; while retries < 3 { retries += 1; } }\n",
        "fn f() { for attempt in 0..MAX_ATTEMPTS { call(); } }\n",
        "fn f() { std::thread::sleep(WAIT); }\n",
    ] {
        let t = tree(&[("crates/onus-mail/src/smtp.rs", planted)]);
        let (ok, out) = gate(t.path());
        assert!(!ok, "not caught: {planted}\n{out}");
        assert!(out.contains("crates/onus-mail/src/smtp.rs:1"), "{out}");
    }
}

#[test]
fn a_retry_crate_is_caught() {
    let t = tree(&[
        ("crates/onus-http/src/lib.rs", CLEAN),
        (
            "crates/onus-http/Cargo.toml",
            "[package]\nname = \"onus-http\"\n\n[dependencies]\nbackoff = \"0.4\"\n",
        ),
    ]);
    let (ok, out) = gate(t.path());
    assert!(!ok, "{out}");
    assert!(out.contains("depends on a retry crate"), "{out}");
    let t = tree(&[(
        "Cargo.lock",
        "[[package]]\nname = \"tokio-retry\"\nversion = \"0.3.0\"\n",
    )]);
    let (ok, out) = gate(t.path());
    assert!(!ok, "{out}");
    assert!(out.contains("dependency graph"), "{out}");
}

#[test]
fn an_http_client_outside_onus_http_or_with_retries_is_caught() {
    let t = tree(&[(
        "crates/onus-webhooks/src/deliver.rs",
        "fn c() { let c = reqwest::Client::builder().build(); }\n",
    )]);
    let (ok, out) = gate(t.path());
    assert!(!ok, "{out}");
    assert!(out.contains("outside crates/onus-http"), "{out}");
    let t = tree(&[(
        "crates/onus-http/src/client.rs",
        "fn c() {\n    let c = reqwest::Client::builder()\n        .timeout(t)\n        .build();\n}\n",
    )]);
    let (ok, out) = gate(t.path());
    assert!(!ok, "{out}");
    assert!(
        out.contains("without .retry(reqwest::retry::never())"),
        "{out}"
    );
    let t = tree(&[(
        "crates/onus-http/src/client.rs",
        "fn c() {\n    let c = reqwest::Client::builder()\n        .retry(reqwest::retry::never())\n        .build();\n}\n",
    )]);
    let (ok, out) = gate(t.path());
    assert!(ok, "{out}");
}

#[test]
fn an_smtp_client_outside_onus_mail_or_a_pooled_one_is_caught() {
    let t = tree(&[(
        "crates/onus-webhooks/src/notify.rs",
        "fn m() { let t = lettre::SmtpTransport::relay(\"relay.example.com\"); }\n",
    )]);
    let (ok, out) = gate(t.path());
    assert!(!ok, "{out}");
    assert!(out.contains("outside crates/onus-mail"), "{out}");
    let t = tree(&[(
        "crates/onus-mail/src/send.rs",
        "fn m() { let t = AsyncSmtpTransport::<Tokio1Executor>::from_url(u); }\n",
    )]);
    let (ok, out) = gate(t.path());
    assert!(!ok, "{out}");
    assert!(out.contains("pooled SMTP transport"), "{out}");
    let t = tree(&[(
        "crates/onus-server/Cargo.toml",
        "[dependencies]\nlettre = \"0.11\"\n",
    )]);
    let (ok, out) = gate(t.path());
    assert!(!ok, "{out}");
    assert!(
        out.contains("SMTP client outside crates/onus-mail"),
        "{out}"
    );
    let t = tree(&[(
        "crates/onus-mail/src/smtp.rs",
        "fn m() { let c = AsyncSmtpConnection::connect_tokio1(a, t, h, None, None); }\n",
    )]);
    let (ok, out) = gate(t.path());
    assert!(ok, "{out}");
}
