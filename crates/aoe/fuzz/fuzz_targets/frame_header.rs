#![no_main]
// AoE header view: never panics, and a parsed header re-encodes to the same bytes.
use bw_aoe::frame::{AoeHeader, HeaderFields};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = AoeHeader::parse(data) {
        let mut out = [0u8; 24];
        HeaderFields::decode(&h).encode(&mut out).unwrap();
        // Only the version nibble may differ (we always write version 1).
        assert_eq!(out[..14], data[..14]);
        assert_eq!(out[15..24], data[15..24]);
        assert_eq!(out[14] & 0x0F, data[14] & 0x0F);
    }
});
