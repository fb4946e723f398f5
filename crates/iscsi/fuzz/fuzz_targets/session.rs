//! Full-feature session logic fed arbitrary PDUs after a login.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    bw_iscsi::fuzzing::session_stream(data);
});
