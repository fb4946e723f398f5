//! PDU framing and header decoding on arbitrary bytes: never panics, and
//! every decoded header re-encodes to a header that decodes the same.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    bw_iscsi::fuzzing::pdu_stream(data);
});
