//! The `onus` server: configuration, the HTTP API (and its OpenAPI document), the command line,
//! and the wiring of the job layer and its components into one process. Retry timing lives in
//! the `onus` crate alone.

pub mod api;
pub mod cli;
pub mod config;
mod error;
mod front;
pub mod panel;
pub mod push;
pub mod secrets;
pub mod serve;
pub mod views;

pub use error::Error;

/// The allocator of every process built on this crate (`onus serve`, the benchmark program, the
/// tests): a worker makes and frees about fourteen small allocations a job, decoded on one thread
/// and freed on another, which cost glibc's malloc a quarter of a worker's instructions and 30,000
/// page faults per 100,000 jobs (docs/benchmarks.md). It is built with one arena for all threads
/// (`.cargo/config.toml`; `cargo install` reads it only when given `--config .cargo/config.toml`,
/// as the README says): a server's few threads share it at no measured cost, and each arena more
/// kept pages of its own (peak memory 43 to 63 MiB with jemalloc's default of four arenas per
/// core, 40 to 52 with one, against 37 to 48 with glibc's malloc).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
