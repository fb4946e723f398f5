//! Where the lab's processes run, and what it reads and leaves there: a
//! [`host::Host`] (a namespace of this machine, this machine, or another
//! over [`ssh`]), the hosts of a run across machines opened and checked
//! ([`remote`]), facts and CPU time from /proc ([`proc`], [`machine_cpu`]),
//! the client's memory cgroup ([`cgroup`]), and the state file of what a
//! run makes on a host ([`state_file`], this machine's: [`local_state`]).

pub mod cgroup;
pub mod host;
pub mod local_state;
pub mod machine_cpu;
pub mod proc;
pub mod remote;
pub mod ssh;
pub mod state_file;
