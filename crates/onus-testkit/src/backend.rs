//! The backend matrix every component's tests run on: a SQLite file and a throwaway PostgreSQL
//! database, and [`both!`](crate::both), which turns one async test function into a test per
//! backend.

/// A storage backend under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A SQLite file in a temporary directory.
    Sqlite,
    /// A fresh database on the shared throwaway PostgreSQL cluster.
    Postgres,
}

impl Backend {
    /// Every backend.
    pub const ALL: [Backend; 2] = [Backend::Sqlite, Backend::Postgres];

    /// Its name, as in a database URL's scheme.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A fresh, empty database for one test. A SQLite file lives as long as this value.
#[derive(Debug)]
pub struct TestDb {
    /// The backend.
    pub backend: Backend,
    /// Its URL (`sqlite://...` or `postgres://...`).
    pub url: String,
    dir: tempfile::TempDir,
}

impl TestDb {
    /// A fresh database on `backend` (PostgreSQL: on the shared cluster, started on first use).
    pub async fn new(backend: Backend) -> TestDb {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("no temporary directory: {e}"));
        let url = match backend {
            Backend::Sqlite => format!("sqlite://{}", dir.path().join("onus.db").display()),
            Backend::Postgres => crate::PgCluster::shared()
                .fresh_database()
                .await
                .unwrap_or_else(|e| panic!("no PostgreSQL database: {e}")),
        };
        TestDb { backend, url, dir }
    }

    /// The SQLite file's path (for a SQLite database).
    pub fn sqlite_path(&self) -> Option<std::path::PathBuf> {
        (self.backend == Backend::Sqlite).then(|| self.dir.path().join("onus.db"))
    }

    /// Runs `sql` (several statements) on the database directly, as a person with a SQL shell
    /// would: to load a fixture, or to corrupt a row on purpose.
    pub async fn batch_execute(&self, sql: &str) {
        match self.backend {
            Backend::Sqlite => {
                self.sqlite_conn()
                    .execute_batch(sql)
                    .unwrap_or_else(|e| panic!("SQL failed on SQLite: {e}"));
            }
            Backend::Postgres => {
                let (client, driver) = self.pg_conn().await;
                client
                    .batch_execute(sql)
                    .await
                    .unwrap_or_else(|e| panic!("SQL failed on PostgreSQL: {e}"));
                drop(client);
                let _ = driver.await;
            }
        }
    }

    /// Holds a transaction that blocks every write to the job table (reads go on) until the
    /// lock is released or dropped: on SQLite the database's write lock (`BEGIN IMMEDIATE`), on
    /// PostgreSQL `LOCK TABLE onus_jobs IN EXCLUSIVE MODE`. A test holds it to keep a process from
    /// committing anything while the test kills it.
    pub async fn lock_writes(&self) -> WriteLock {
        match self.backend {
            Backend::Sqlite => {
                let conn = self.sqlite_conn();
                conn.busy_timeout(std::time::Duration::from_secs(30))
                    .unwrap_or_else(|e| panic!("busy timeout: {e}"));
                conn.execute_batch("BEGIN IMMEDIATE")
                    .unwrap_or_else(|e| panic!("cannot take the write lock: {e}"));
                WriteLock::Sqlite(conn)
            }
            Backend::Postgres => {
                let (client, driver) = self.pg_conn().await;
                client
                    .batch_execute("BEGIN; LOCK TABLE onus_jobs IN EXCLUSIVE MODE")
                    .await
                    .unwrap_or_else(|e| panic!("cannot lock onus_jobs: {e}"));
                WriteLock::Postgres(client, driver)
            }
        }
    }

    /// Runs `sql` in a transaction of its own left open on PostgreSQL, as another session does
    /// mid-way (a claim not yet committed): its row locks hold until [`WriteLock::commit`] or
    /// [`WriteLock::release`]. On SQLite it takes the database's write lock, which serializes
    /// writers, so only PostgreSQL can be asked what waits for it ([`TestDb::lock_waiters`]).
    pub async fn open_transaction(&self, sql: &str) -> WriteLock {
        match self.backend {
            Backend::Sqlite => {
                let conn = self.sqlite_conn();
                conn.execute_batch(&format!("BEGIN IMMEDIATE; {sql}"))
                    .unwrap_or_else(|e| panic!("SQL failed on SQLite: {e}"));
                WriteLock::Sqlite(conn)
            }
            Backend::Postgres => {
                let (client, driver) = self.pg_conn().await;
                client
                    .batch_execute(&format!("BEGIN; {sql}"))
                    .await
                    .unwrap_or_else(|e| panic!("SQL failed on PostgreSQL: {e}"));
                WriteLock::Postgres(client, driver)
            }
        }
    }

    /// How many sessions of this PostgreSQL database wait for a lock another holds (0 on
    /// SQLite, whose writers wait inside the library).
    pub async fn lock_waiters(&self) -> i64 {
        match self.backend {
            Backend::Sqlite => 0,
            Backend::Postgres => {
                let (client, driver) = self.pg_conn().await;
                let n: i64 = client
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity
                         WHERE datname = current_database() AND wait_event_type = 'Lock'",
                        &[],
                    )
                    .await
                    .unwrap_or_else(|e| panic!("cannot read pg_stat_activity: {e}"))
                    .get(0);
                drop(client);
                let _ = driver.await;
                n
            }
        }
    }

    /// A connection of its own to the SQLite file.
    fn sqlite_conn(&self) -> rusqlite::Connection {
        let path = self.dir.path().join("onus.db");
        rusqlite::Connection::open(&path)
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()))
    }

    /// A connection of its own to the PostgreSQL database, and the task driving it.
    async fn pg_conn(
        &self,
    ) -> (
        tokio_postgres::Client,
        tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>,
    ) {
        let (client, conn) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| panic!("cannot connect to the test database: {e}"));
        (client, tokio::spawn(conn))
    }

    /// A directory that lives as long as the database, for other files of the test.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }
}

/// Runs each named `async fn name(backend: Backend)` once per backend, as tests
/// `sqlite::name` and `postgres::name` on a multi-threaded runtime.
///
/// ```text
/// async fn inserts_survive(backend: onus_testkit::Backend) { /* ... */ }
/// onus_testkit::both!(inserts_survive);
/// ```
///
/// A suite whose tests take a world of their own lists them by module, with the function that
/// makes the world from a backend: each `module::name(world)` becomes the tests
/// `sqlite::module::name` and `postgres::module::name`.
///
/// ```text
/// onus_testkit::both!(setup = crate::harness::Env::new; jobs: [insert_and_complete], limits: [...]);
/// ```
#[macro_export]
macro_rules! both {
    (setup = $setup:path; $($module:ident: [$($name:ident),* $(,)?]),* $(,)?) => {
        mod sqlite {
            $(
                mod $module {
                    $(
                        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                        async fn $name() {
                            let world = $setup($crate::Backend::Sqlite).await;
                            super::super::$module::$name(world).await
                        }
                    )*
                }
            )*
        }
        mod postgres {
            $(
                mod $module {
                    $(
                        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                        async fn $name() {
                            let world = $setup($crate::Backend::Postgres).await;
                            super::super::$module::$name(world).await
                        }
                    )*
                }
            )*
        }
    };
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::Backend::Sqlite).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::Backend::Postgres).await
                }
            )*
        }
    };
}

/// A held write lock (see [`TestDb::lock_writes`]); dropping it releases it too.
#[derive(Debug)]
pub enum WriteLock {
    /// SQLite's write lock, in an open transaction.
    Sqlite(rusqlite::Connection),
    /// A PostgreSQL transaction holding the table lock.
    Postgres(
        tokio_postgres::Client,
        tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>,
    ),
}

impl WriteLock {
    /// Commits the holding transaction.
    pub async fn commit(self) {
        self.end("COMMIT").await
    }

    /// Rolls the holding transaction back.
    pub async fn release(self) {
        self.end("ROLLBACK").await
    }

    async fn end(self, sql: &str) {
        match self {
            WriteLock::Sqlite(conn) => {
                conn.execute_batch(sql)
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
            }
            WriteLock::Postgres(client, driver) => {
                client
                    .batch_execute(sql)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
                drop(client);
                let _ = driver.await;
            }
        }
    }
}
