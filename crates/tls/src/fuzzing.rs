//! Harness bodies of the cargo-fuzz targets (crates/tls/fuzz), also run
//! by the crate's tests: untrusted bytes where a peer that has proven
//! nothing can put them. Panics mean bugs.

use crate::handshake::{Handshake, OneKey, HANDSHAKE_LIMIT};
use crate::record::{Keys, Opener};
use crate::Suite;
use bytes::BytesMut;
use std::sync::Arc;

/// A server's handshake fed arbitrary bytes, in pieces whose sizes the
/// first byte picks: never panics, never takes a partial record, never
/// takes more than [`HANDSHAKE_LIMIT`], and an error is final.
pub fn server_handshake(data: &[u8]) {
    let Some((&sel, rest)) = data.split_first() else { return };
    // The interchange example of bw_nvme::tls_psk's tests, for any host.
    let store = OneKey::any_host("NVMeTLSkey-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:").expect("a valid key");
    let Ok(mut hs) = Handshake::server(Arc::new(store)) else { return };
    let step = 1 + sel as usize * 7;
    let mut buf = Vec::new();
    let mut taken = 0;
    for piece in rest.chunks(step) {
        buf.extend_from_slice(piece);
        match hs.feed(&buf) {
            Ok((n, done)) => {
                assert!(n <= buf.len());
                taken += n;
                assert!(taken <= HANDSHAKE_LIMIT);
                buf.drain(..n);
                let _ = hs.take_output();
                if done.is_some() {
                    return;
                }
            }
            Err(_) => {
                let _ = hs.take_output();
                return;
            }
        }
    }
}

/// The user-space record layer's receive side on arbitrary bytes: never
/// panics, takes only whole records, and adds at most what they held.
pub fn records(data: &[u8]) {
    let keys = Keys::from_secret(Suite::Aes128GcmSha256, &[9; 32]);
    let mut o = Opener::new(&keys, data.first().is_some_and(|b| b & 1 != 0));
    let mut plain = BytesMut::new();
    let mut at = 0;
    while let Ok(Some((n, _))) = o.open(&data[at..], &mut plain) {
        assert!(n > 0 && at + n <= data.len());
        at += n;
        assert!(plain.len() <= at);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn server_handshake_never_panics(data in proptest::collection::vec(any::<u8>(), 0..2048)) {
            super::server_handshake(&data);
        }

        /// A TLS handshake record's framing with arbitrary contents.
        #[test]
        fn framed_garbage(body in proptest::collection::vec(any::<u8>(), 0..600), kind in 20u8..25, sel: u8) {
            let mut d = vec![sel, kind, 3, 1, (body.len() >> 8) as u8, body.len() as u8];
            d.extend_from_slice(&body);
            super::server_handshake(&d);
        }

        #[test]
        fn records_never_panic(data in proptest::collection::vec(any::<u8>(), 0..4096)) {
            super::records(&data);
        }
    }
}
