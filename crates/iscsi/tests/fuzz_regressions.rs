//! Every input the fuzz campaign ever crashed a harness with, kept in
//! crates/iscsi/fuzz/regressions/<target>/, runs through that harness on
//! each `cargo test`.

use std::path::Path;

fn replay(target: &str, harness: fn(&[u8])) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions").join(target);
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("directory entry").path();
        let data = std::fs::read(&path).expect("read regression input");
        eprintln!("{target}: {}", path.display());
        harness(&data);
        n += 1;
    }
    n
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
