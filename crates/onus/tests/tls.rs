//! PostgreSQL over TLS, with libpq's meaning of `sslmode`, against a throwaway cluster with
//! `ssl = on` and a certificate made for the test; and database URLs never logged with their
//! password. A test binary of its own: it captures every log line the process writes.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use onus::postgres::PostgresStore;
use onus::{JobContext, JobState, Kind, NewJob, Onus, Options};
use onus_testkit::PgCluster;

static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();

struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn capture_logs() -> Arc<Mutex<Vec<u8>>> {
    LOG.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let b = buf.clone();
        tracing_subscriber::fmt()
            .with_env_filter("debug")
            .with_writer(move || Capture(b.clone()))
            .with_ansi(false)
            .init();
        buf
    })
    .clone()
}

async fn ssl_in_use(store: &Arc<dyn onus::Store>) -> bool {
    let pg = store.as_any().downcast_ref::<PostgresStore>().unwrap();
    let c = pg.pool().get().await.unwrap();
    c.query_one(
        "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_sslmode_has_libpq_meaning_and_passwords_never_reach_a_log_line() {
    let log = capture_logs();
    let pg = PgCluster::start_tls().unwrap();
    let url = pg.fresh_database().await.unwrap();
    let ca = pg.ca_cert().display().to_string();
    const SECRET: &str = "hunter2-never-logged";

    // require: encrypted, the certificate not checked.
    let store = onus::open(&format!("{url}?sslmode=require&password={SECRET}"))
        .await
        .unwrap();
    assert!(
        ssl_in_use(&store).await,
        "sslmode=require connects encrypted"
    );
    // The default (prefer) encrypts when the server offers TLS.
    assert!(ssl_in_use(&onus::open(&url).await.unwrap()).await);
    // disable: plaintext.
    let plain = onus::open(&format!("{url}?sslmode=disable")).await.unwrap();
    assert!(!ssl_in_use(&plain).await);
    // verify-full against the CA that signed the server's certificate (issued for 127.0.0.1).
    let full = onus::open(&format!("{url}?sslmode=verify-full&sslrootcert={ca}"))
        .await
        .unwrap();
    assert!(ssl_in_use(&full).await);
    // verify-ca and verify-full refuse a certificate the given root did not sign.
    let wrong = pg
        .ca_cert()
        .with_file_name("server.crt")
        .display()
        .to_string();
    for mode in ["verify-ca", "verify-full"] {
        let e = onus::open(&format!("{url}?sslmode={mode}&sslrootcert={wrong}"))
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("certificate"), "{mode}: {e}");
    }
    // verify-full with no root given says what to add.
    let e = onus::open(&format!("{url}?sslmode=verify-full"))
        .await
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("sslrootcert"), "{e}");

    // The password in the query string never shows: not in errors, not in logs, even while the
    // database goes away and comes back.
    let e = onus::open(&format!(
        "postgres://postgres@127.0.0.1:1/nowhere?password={SECRET}&connect_timeout=2"
    ))
    .await
    .unwrap_err()
    .to_string();
    assert!(!e.contains(SECRET), "{e}");
    assert!(e.contains("postgres://postgres@127.0.0.1:1/nowhere"), "{e}");
    let onus = Onus::builder(store.clone())
        .options(Options {
            poll_interval: Duration::from_millis(100),
            ..Options::default()
        })
        .kind(Kind::new("k").handler(|_c: JobContext| async { Ok(()) }))
        .build()
        .unwrap();
    let client = onus.client();
    let running = onus.start();
    pg.stop().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !String::from_utf8_lossy(&log.lock().unwrap()).contains("notice connection") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no outage was logged"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    pg.restart().unwrap();
    let job = loop {
        if let Ok(i) = client.insert(NewJob::new("k", serde_json::json!({}))).await {
            break i.job.id;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the database never came back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    client
        .wait_for(
            job,
            |j| j.state == JobState::Completed,
            Duration::from_secs(20),
        )
        .await
        .unwrap();
    running.shutdown(Duration::from_secs(5)).await;
    let text = String::from_utf8_lossy(&log.lock().unwrap()).to_string();
    assert!(
        text.contains("127.0.0.1"),
        "the database was named in the logs"
    );
    assert!(!text.contains(SECRET), "a password reached a log line");
}
