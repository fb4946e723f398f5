#![no_main]
// ATA argument: parse/encode round trip, LBA within 48 bits.
use bw_aoe::ata::AtaArg;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(a) = AtaArg::parse(data) {
        assert!(a.lba() < (1 << 48));
        let mut out = [0u8; 36];
        a.encode(&mut out).unwrap();
        assert_eq!(AtaArg::parse(&out).unwrap(), a);
    }
});
