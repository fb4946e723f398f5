//! Client workloads over any [`BlockClient`]:
//! - [`verify`]: write a deterministic pattern, read it back, compare, name the
//!   first bad byte;
//! - [`bench`]: fio-like load (sequential/random, read/write/mix, block size,
//!   queue depth x jobs) with IOPS, bandwidth, latency percentiles and the
//!   client's CPU time.

pub mod bench;
mod clock;
pub mod cpu;
pub mod flowop;
pub mod pattern;
mod ready_set;
pub mod verify;

pub use bench::{bench, BenchParams, BenchReport, Rw};
pub use ready_set::DEFAULT_SUBMIT_BATCH;
pub use verify::{verify, VerifyParams, VerifyReport};
