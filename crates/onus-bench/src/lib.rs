//! The benchmark program's library: the soak scenario, shared by `onus-bench soak` and the test
//! suite's short run (`crates/onus-server/tests/soak.rs`).

pub mod soak;
