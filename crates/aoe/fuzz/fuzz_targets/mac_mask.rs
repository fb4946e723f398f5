#![no_main]
// MAC Mask List argument: directive count never trusted past the frame.
use bw_aoe::mask::{self, MaskList};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = MaskList::parse(data) {
        let ds: Vec<_> = m.directives().collect();
        assert_eq!(ds.len(), m.len());
        let mut out = vec![0u8; 28 + 8 * ds.len()];
        let n = mask::encode(&mut out, m.mcmd, m.merror, &ds).unwrap();
        assert_eq!(MaskList::parse(&out[..n]).unwrap().directives().collect::<Vec<_>>(), ds);
    }
});
