//! A TLS server's handshake (the pre-handshake path of an NVMe/TCP port
//! with TLS) fed arbitrary bytes in arbitrary pieces: never panics, never
//! takes a partial record or more than the handshake limit.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    bw_tls::fuzzing::server_handshake(data);
});
