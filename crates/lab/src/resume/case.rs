//! What a case is, by name: one workload (or one setting) measured on
//! every subject with all its repetitions, at one place in the plan (link
//! shape, MTU, factors). A case is what a resumed run keeps or measures
//! again whole: its repetitions are interleaved over the subjects, so they
//! belong together. The names are read by people (the report lists which
//! start measured each), and compared as they are.

use bw_lab_results::{Factors, LinkName, Suite};

/// Where in the plan the run is: the link shape and the factors measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct At {
    pub shape: LinkName,
    pub factors: Factors,
}

fn place(at: &At, mtu: u32) -> String {
    let f = at.factors.describe();
    if f.is_empty() {
        format!("link {}, MTU {mtu}", at.shape)
    } else {
        format!("link {}, MTU {mtu}, {f}", at.shape)
    }
}

/// iperf3 on one link of a shape.
pub fn net(shape: &LinkName, mtu: u32) -> String {
    format!("net, link {shape}, MTU {mtu}")
}

/// A micro or sweep workload on every subject of one link.
pub fn bench(suite: Suite, workload: &str, at: &At, mtu: u32) -> String {
    format!("{suite} {workload}, {}", place(at, mtu))
}

/// A micro or sweep workload of the local baseline.
pub fn local(suite: Suite, workload: &str) -> String {
    format!("{suite} {workload}, local")
}

/// The fs suite at one (file system, fsync) setting on every subject and
/// the local baseline.
pub fn fs(kind: &str, fsync: &str, shape: &LinkName, mtu: u32) -> String {
    format!("fs on {kind}, fsync {fsync}, link {shape}, MTU {mtu}")
}

/// The targets of one link starting: no case (nothing is measured), but
/// what it records (a target that did not start) belongs to it.
pub fn targets(at: &At, mtu: u32) -> String {
    format!("{TARGETS}{}", place(at, mtu))
}

const TARGETS: &str = "targets, ";

/// Whether `name` is a case (not a link's targets starting).
pub fn is_case(name: &str) -> bool {
    !name.starts_with(TARGETS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_say_where_and_what() {
        let at = At { shape: "1gbit".into(), factors: Factors { offload: bw_lab_results::OffloadFactor::None, digest: bw_lab_results::DigestFactor::Crc32c, tls: Default::default() } };
        assert_eq!(bench(Suite::Micro, "seqread-1m", &at, 9000), "micro seqread-1m, link 1gbit, MTU 9000, offload none, digest crc32c");
        let plain = At { shape: "none".into(), factors: Factors::default() };
        assert_eq!(bench(Suite::Sweep, "sweep-j1-qd1", &plain, 1500), "sweep sweep-j1-qd1, link none, MTU 1500");
        assert_eq!(local(Suite::Micro, "seqread-1m"), "micro seqread-1m, local");
        assert!(is_case(&net(&LinkName::none(), 1500)) && is_case(&fs("ext4", "honour", &LinkName::none(), 1500)));
        assert!(!is_case(&targets(&plain, 1500)));
    }
}
