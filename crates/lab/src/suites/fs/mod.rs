//! The fs suite: its workloads and how their output is read
//! ([`workloads`]), the file system each subject gets ([`fs_kind`]), putting
//! it on a subject here ([`mounts`]) or on a client host over ssh
//! ([`remote_fs`]), the one choice between those two ([`client`]), and
//! the stage that gives each subject its turn ([`stage`]).

pub mod client;
pub mod fs_kind;
pub mod mounts;
pub mod remote_fs;
pub mod stage;
pub mod workloads;
