//! The user-space record layer's receive side on arbitrary bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    bw_tls::fuzzing::records(data);
});
