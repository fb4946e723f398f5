//! The fuzz campaign's crash inputs for this crate, replayed (see
//! tests/support/fuzz_replay.rs).

#[path = "../../../tests/support/fuzz_replay.rs"]
mod fuzz_replay;

fn replay(target: &str, harness: fn(&[u8])) -> usize {
    fuzz_replay::replay(env!("CARGO_MANIFEST_DIR"), target, harness)
}

/// A TermReq with the DDGST flag and 1-3 bytes after its header: the
/// decoder read a data digest past the end of the PDU and panicked. A
/// C2HTermReq with more than 128 bytes of error data: decoded whole but
/// encoded cut to 128, so it did not decode to itself again.
#[test]
fn pdu_decode_regressions() {
    assert!(replay("pdu_decode", bw_nvme::fuzzing::pdu_decode) > 0);
}
