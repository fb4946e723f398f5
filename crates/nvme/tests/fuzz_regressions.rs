//! Every input the fuzz campaign ever crashed a harness with, kept in
//! crates/nvme/fuzz/regressions/<target>/, runs through that harness on
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

/// A TermReq with the DDGST flag and 1-3 bytes after its header: the
/// decoder read a data digest past the end of the PDU and panicked.
#[test]
fn pdu_decode_regressions() {
    assert!(replay("pdu_decode", bw_nvme::fuzzing::pdu_decode) > 0);
}
