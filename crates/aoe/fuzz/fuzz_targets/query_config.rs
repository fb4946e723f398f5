#![no_main]
// Query Config argument: length field never trusted past the frame.
use bw_aoe::query_config::QueryConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(q) = QueryConfig::parse(data) {
        assert!(q.config.len() <= 1024);
        let mut out = vec![0u8; 24 + 8 + q.config.len()];
        let n = q.encode(&mut out).unwrap();
        assert_eq!(QueryConfig::parse(&out[..n]).unwrap(), q);
    }
});
