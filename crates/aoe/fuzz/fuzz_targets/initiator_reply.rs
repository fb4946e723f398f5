#![no_main]
// Initiator reply classifier.
use bw_aoe::initiator::{parse_reply, ReplyBody};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = parse_reply(data) {
        if let ReplyBody::Ata(_, d) = r.body {
            assert_eq!(d.len(), data.len() - 36);
        }
    }
});
