//! The throwaway cluster starts, serves fresh databases with durable settings, and restarts.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use onus_testkit::PgCluster;

async fn query_one(url: &str, sql: &str) -> String {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client.query_one(sql, &[]).await.unwrap().get(0)
}

#[tokio::test]
async fn a_cluster_starts_with_durable_settings_and_restarts() {
    let pg = PgCluster::start().unwrap();
    let a = pg.fresh_database().await.unwrap();
    let b = pg.fresh_database().await.unwrap();
    assert_ne!(a, b);
    assert!(a.starts_with("postgres://postgres@127.0.0.1:"));
    assert_eq!(query_one(&a, "SHOW fsync").await, "on");
    assert_eq!(query_one(&a, "SHOW synchronous_commit").await, "on");
    pg.stop().unwrap();
    assert!(tokio_postgres::connect(&a, tokio_postgres::NoTls)
        .await
        .is_err());
    pg.restart().unwrap();
    assert_eq!(
        query_one(&b, "SELECT current_database()::text").await,
        b.rsplit('/').next().unwrap()
    );
}
