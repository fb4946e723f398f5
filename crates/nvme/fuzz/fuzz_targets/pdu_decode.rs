//! The NVMe/TCP PDU parser on arbitrary bytes: never panics, consumes only
//! whole PDUs, and whatever it accepts re-encodes to something it decodes
//! to the same PDU.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    bw_nvme::fuzzing::pdu_decode(data);
});
