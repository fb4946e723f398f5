//! The micro and sweep suites: `blockwire bench` or fio on every subject,
//! interleaved ([`stage`]).

pub mod stage;
