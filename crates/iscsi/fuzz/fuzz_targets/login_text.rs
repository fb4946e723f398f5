//! Login text parsing and the target login state machine on arbitrary text.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    bw_iscsi::fuzzing::login_text(data);
});
