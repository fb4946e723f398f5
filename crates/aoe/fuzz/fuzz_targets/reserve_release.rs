#![no_main]
// Reserve/Release argument: MAC count never trusted past the frame.
use bw_aoe::reserve_release::{self, ReserveRelease};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = ReserveRelease::parse(data) {
        let macs: Vec<_> = r.macs().collect();
        let mut out = vec![0u8; 26 + 6 * macs.len()];
        let n = reserve_release::encode(&mut out, r.rcmd, &macs).unwrap();
        assert_eq!(ReserveRelease::parse(&out[..n]).unwrap().macs().collect::<Vec<_>>(), macs);
    }
});
