//! The cargo-fuzz harnesses (crates/iscsi/fuzz) run on proptest input, so
//! `cargo test` exercises them without nightly.

use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]
    #[test]
    fn pdu_stream(data in prop::collection::vec(any::<u8>(), 0..600)) {
        bw_iscsi::fuzzing::pdu_stream(&data);
    }

    #[test]
    fn login_text(data in prop::collection::vec(prop_oneof![any::<u8>(), Just(0u8), Just(b'='), Just(b'\n')], 0..400)) {
        bw_iscsi::fuzzing::login_text(&data);
    }

    #[test]
    fn login_text_with_real_keys(keys in prop::collection::vec(prop::sample::select(vec![
        "InitiatorName=iqn.2026-11.org.fuzz:i", "TargetName=iqn.2026-11.org.fuzz:chap", "TargetName=iqn.2026-11.org.fuzz:open",
        "SessionType=Discovery", "AuthMethod=CHAP,None", "AuthMethod=None", "CHAP_A=5", "CHAP_N=u", "CHAP_R=0x00",
        "CHAP_I=1", "CHAP_C=0x0102", "HeaderDigest=CRC32C", "MaxRecvDataSegmentLength=1", "X-foo=bar",
    ]), 0..12), flags in prop::collection::vec(any::<u8>(), 1..6)) {
        let mut data = Vec::new();
        for (i, f) in flags.iter().enumerate() {
            data.push(*f);
            for k in keys.iter().skip(i).step_by(flags.len()) {
                data.extend_from_slice(k.as_bytes());
                data.push(0);
            }
            data.push(b'\n');
        }
        bw_iscsi::fuzzing::login_text(&data);
    }

    #[test]
    fn session_stream(data in prop::collection::vec(any::<u8>(), 0..1200)) {
        bw_iscsi::fuzzing::session_stream(&data);
    }
}
