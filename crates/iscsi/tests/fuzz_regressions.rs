//! The fuzz campaign's crash inputs for this crate, replayed (see
//! tests/support/fuzz_replay.rs).

#[path = "../../../tests/support/fuzz_replay.rs"]
mod fuzz_replay;

fn replay(target: &str, harness: fn(&[u8])) -> usize {
    fuzz_replay::replay(env!("CARGO_MANIFEST_DIR"), target, harness)
}

/// Immediate SCSI commands used to open a CmdSN slot when they ended, and
/// commands beyond MaxCmdSN were accepted: the window grew without bound.
#[test]
fn session_regressions() {
    assert!(replay("session", bw_iscsi::fuzzing::session_stream) > 0);
}

/// A Data-In without the S bit decoded its reserved status byte, so it did
/// not re-encode to the same message.
#[test]
fn pdu_regressions() {
    assert!(replay("pdu", bw_iscsi::fuzzing::pdu_stream) > 0);
}
