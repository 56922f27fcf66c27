//! One migration runner for every line of tables: the job layer's (`jobs`) and each component's
//! (`webhooks`, ...). A line is a numbered list of `.sql` files per backend; each applied file is
//! recorded in `onus_migrations (line, version, name, applied_at)`. A store applies them
//! ([`crate::Store::migrate`]) under one lock (PostgreSQL advisory lock, SQLite write lock), so
//! many processes may start at once; each migration commits with its record or not at all.

use serde::Serialize;

use super::Backend;
use crate::clock::Timestamp;
use crate::sql::error::{StoreError, StoreResult};

/// One numbered migration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migration {
    /// Its number, from 1 with no gaps.
    pub version: u32,
    /// Its file name.
    pub name: &'static str,
    /// Its SQL.
    pub sql: &'static str,
}

/// A named line of migrations, per backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Line {
    /// The line's name (`jobs`, `webhooks`, `mail`).
    pub name: &'static str,
    /// Its SQLite migrations, in order.
    pub sqlite: &'static [Migration],
    /// Its PostgreSQL migrations, in order.
    pub postgres: &'static [Migration],
}

/// Builds a [`Migration`] list from files in a directory next to the calling source file:
/// `migrations!("../migrations/sqlite", "001_tables.sql", "002_more.sql")`, numbered in order.
#[macro_export]
macro_rules! migrations {
    ($dir:literal, $($file:literal),+ $(,)?) => {{
        const FILES: &[(&str, &str)] = &[$(($file, include_str!(concat!($dir, "/", $file)))),+];
        const N: usize = FILES.len();
        const LIST: [$crate::sql::Migration; N] = {
            let mut out = [$crate::sql::Migration { version: 0, name: "", sql: "" }; N];
            let mut i = 0;
            while i < N {
                out[i] = $crate::sql::Migration { version: (i + 1) as u32, name: FILES[i].0, sql: FILES[i].1 };
                i += 1;
            }
            out
        };
        &LIST
    }};
}

impl Line {
    /// Its migrations for `backend`.
    pub fn migrations(&self, backend: Backend) -> &'static [Migration] {
        match backend {
            Backend::Sqlite => self.sqlite,
            Backend::Postgres => self.postgres,
        }
    }

    /// The newest version this build knows for `backend`.
    pub fn latest(&self, backend: Backend) -> u32 {
        self.migrations(backend).len() as u32
    }

    /// The migrations still to apply after `applied` (the newest version recorded). A database
    /// newer than this build is refused: an older Onus must not run on a newer schema.
    pub fn pending(&self, backend: Backend, applied: u32) -> StoreResult<&'static [Migration]> {
        let all = self.migrations(backend);
        if applied as usize > all.len() {
            return Err(StoreError::Open(format!(
                "the database's {} tables are at version {applied}, newer than this Onus knows ({}); upgrade Onus",
                self.name,
                all.len()
            )));
        }
        Ok(&all[applied as usize..])
    }
}

/// Where one line stands in a database (a version recorded before `onus_migrations` existed
/// shows no time applied).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LineStatus {
    /// The line.
    pub line: String,
    /// The newest version applied (0: none).
    pub version: u32,
    /// The newest version this build knows.
    pub latest: u32,
    /// When the newest applied version was applied.
    pub applied_at: Option<Timestamp>,
    /// The files still to apply, in order.
    pub pending: Vec<String>,
}

impl LineStatus {
    /// Where `line` stands given its newest applied version.
    pub fn of(line: &Line, backend: Backend, version: u32, applied_at: Option<Timestamp>) -> Self {
        let all = line.migrations(backend);
        LineStatus {
            line: line.name.to_string(),
            version,
            latest: all.len() as u32,
            applied_at,
            pending: all
                .iter()
                .skip(version as usize)
                .map(|m| m.name.to_string())
                .collect(),
        }
    }

    /// True when the database is at the newest version this build knows.
    pub fn is_current(&self) -> bool {
        self.version == self.latest
    }

    /// True when the database is newer than this build: upgrade Onus.
    pub fn is_ahead(&self) -> bool {
        self.version > self.latest
    }
}

/// A migration a run applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Applied {
    /// The line.
    pub line: String,
    /// Its version.
    pub version: u32,
    /// Its file.
    pub name: String,
}

/// The error for a migration that failed: its line, number and file, and the database's word;
/// still [`StoreError::Unavailable`] when the database could not be reached.
pub(crate) fn failed(line: &Line, m: &Migration, why: StoreError) -> StoreError {
    let what = format!("migration {} {} ({}) failed", line.name, m.version, m.name);
    match why {
        StoreError::Unavailable(e, source) => {
            StoreError::Unavailable(format!("{what}: {e}"), source)
        }
        e => StoreError::Open(format!("{what}: {e}")),
    }
}

/// The line whose version an earlier Onus kept outside `onus_migrations` (SQLite's `PRAGMA
/// user_version`, PostgreSQL's `onus_schema`): the job store's.
pub(crate) const LEGACY_JOBS_LINE: &str = "jobs";

/// The records the schema kept before the shared runner, which a first run adopts: SQLite's
/// `PRAGMA user_version` and PostgreSQL's `onus_schema` for the jobs line, and the table
/// `onus_webhooks_schema` for webhooks. They are left in place (read, never written again).
pub(crate) const LEGACY_WEBHOOKS_TABLE: &str = "onus_webhooks_schema";
