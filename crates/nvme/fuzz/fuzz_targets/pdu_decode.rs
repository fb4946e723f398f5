//! The NVMe/TCP PDU parser on arbitrary bytes: never panics, consumes only
//! whole PDUs, and whatever it accepts re-encodes to something it decodes
//! to the same PDU.
#![no_main]
use bw_nvme::pdu::{decode, Digests};
use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else { return };
    let d = Digests { header: sel & 1 != 0, data: sel & 2 != 0 };
    let max = if sel & 4 != 0 { 1 << 20 } else { 4096 };
    let mut buf = BytesMut::from(rest);
    while let Ok(Some(p)) = decode(&mut buf, d, max) {
        let bytes = p.encode_parts(d).concat();
        let mut again = BytesMut::from(&bytes[..]);
        let q = decode(&mut again, d, u32::MAX).expect("re-encoded PDU must decode").expect("complete");
        assert_eq!(p, q);
        assert!(again.is_empty());
    }
});
