//! Our client against our server in memory, and hostile input against the
//! server: what reaches OpenSSL, and what each failure says.

use super::*;
use crate::record::{Opened, Opener, Sealer, MAX_CIPHERTEXT};
use bw_nvme::tls_psk::{ConfiguredPsk, Derivation, IdentityVersion, PskHash};
use bytes::BytesMut;

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:host";
const SUB: &str = "nqn.2026-11.org.blockwire:sub";
const K256: &str = "NVMeTLSkey-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
const K384: &str = "NVMeTLSkey-1:02:QEFCQ0RFRkdISUpLTE1OT1BRUlNUVVZXWFlaW1xdXl9gYWJjZGVmZ2hpamtsbW5voBXMjQ==:";

fn server(key: &str) -> Handshake {
    Handshake::server(Arc::new(OneKey { key: ConfiguredPsk::parse(key).unwrap(), hosts: vec![HOST.into()] })).unwrap()
}

fn client(key: &str, d: Derivation, v: IdentityVersion) -> Handshake {
    let psk = ConfiguredPsk::parse(key).unwrap();
    let id = psk.identity(d, v, HOST, SUB);
    Handshake::client(&id.to_string(), psk.tls_psk(d, &id).unwrap()).unwrap()
}

/// Run both to the end, passing each side's output to the other whole; the
/// two results, and the bytes the server left after its last record.
fn run(mut c: Handshake, mut s: Handshake, after: &[u8]) -> (Result<Established, HandshakeError>, Result<Established, HandshakeError>, Vec<u8>) {
    let (mut cr, mut sr) = (None, None);
    let mut to_server = c.take_output();
    let mut left = Vec::new();
    for _ in 0..10 {
        if sr.is_none() {
            let done = cr.as_ref().is_some_and(|r: &Result<_, _>| r.is_ok());
            if done {
                to_server.extend_from_slice(after);
            }
            match s.feed(&to_server) {
                Ok((n, e)) => {
                    if let Some(e) = e {
                        left = to_server[n..].to_vec();
                        sr = Some(Ok(e));
                    }
                }
                Err(e) => sr = Some(Err(e)),
            }
        }
        let to_client = s.take_output();
        if cr.is_none() {
            match c.feed(&to_client) {
                Ok((_, Some(e))) => cr = Some(Ok(e)),
                Ok((_, None)) => {}
                Err(e) => cr = Some(Err(e)),
            }
        }
        to_server = c.take_output();
        if cr.is_some() && sr.is_some() {
            break;
        }
        if to_server.is_empty() && sr.is_none() && cr.as_ref().is_some_and(|r| r.is_err()) {
            sr = Some(Err(HandshakeError::Tls("client gave up".into())));
        }
    }
    (cr.expect("client finished"), sr.expect("server finished"), left)
}

#[test]
fn both_suites_both_identity_versions_both_derivations() {
    for key in [K256, K384] {
        for d in Derivation::ALL {
            for v in [IdentityVersion::V0, IdentityVersion::V1] {
                let (c, s, left) = run(client(key, d, v), server(key), b"after");
                let (c, s) = (c.unwrap(), s.unwrap());
                let want = if key == K256 { Suite::Aes128GcmSha256 } else { Suite::Aes256GcmSha384 };
                assert_eq!((c.suite, s.suite), (want, want));
                assert_eq!(c.identity, s.identity);
                assert_eq!(s.note.as_deref(), Some(format!("{d:?}").as_str()), "{key} {d:?} {v:?}");
                // The client's Finished was the server's last record; what
                // followed it is the caller's.
                assert_eq!(left, b"after");
                // Each side's send keys are the other's receive keys.
                assert_eq!((&*c.tx.key, c.tx.iv), (&*s.rx.key, s.rx.iv));
                assert_eq!((&*s.tx.key, s.tx.iv), (&*c.rx.key, c.rx.iv));
                let mut wire = Vec::new();
                Sealer::new(&c.tx).seal_all(b"ICReq", &mut wire);
                let mut plain = BytesMut::new();
                assert_eq!(Opener::new(&s.rx, false).open(&wire, &mut plain).unwrap(), Some((wire.len(), Opened::Data(5))));
                assert_eq!(&plain[..], b"ICReq");
            }
        }
    }
}

#[test]
fn a_wrong_key_fails_on_both_sides_with_reasons() {
    // Same identity (version 0 names no key), another key of the same hash.
    let other = ConfiguredPsk::from_key(&[0x55; 32], Some(PskHash::Sha256)).unwrap().encode();
    let (c, s, _) = run(client(&other, Derivation::Rfc8446, IdentityVersion::V0), server(K256), b"");
    let s = s.unwrap_err();
    assert!(matches!(&s, HandshakeError::WrongKey { identity, tried } if identity.starts_with("NVMe0R01") && tried.contains("Rfc8446") && tried.contains("Libnvme115")), "{s}");
    assert!(s.to_string().contains("binder"), "{s}");
    let c = c.unwrap_err();
    assert!(matches!(c, HandshakeError::PeerAlert { .. }), "client: {c}");
    // A host the store does not know.
    let psk = ConfiguredPsk::parse(K256).unwrap();
    let id = psk.identity(Derivation::Rfc8446, IdentityVersion::V0, "nqn.2014-08.org.nvmexpress:uuid:stranger", SUB);
    let (_, s, _) = run(Handshake::client(&id.to_string(), psk.tls_psk(Derivation::Rfc8446, &id).unwrap()).unwrap(), server(K256), b"");
    let s = s.unwrap_err();
    assert!(matches!(&s, HandshakeError::Refused { why, .. } if why.contains("no key")), "{s}");
    // An identity that is not NVMe's form.
    let (_, s, _) = run(Handshake::client("psk-identity", psk.tls_psk(Derivation::Rfc8446, &id).unwrap()).unwrap(), server(K256), b"");
    assert!(matches!(s.unwrap_err(), HandshakeError::Refused { why, .. } if why.contains("NVMe0R")));
    // A SHA-384 key offered for a SHA-256 identity: no candidate.
    let (_, s, _) = run(client(K384, Derivation::Rfc8446, IdentityVersion::V0), server(K256), b"");
    assert!(matches!(s.unwrap_err(), HandshakeError::Refused { .. }));
}

/// A client that offers no PSK at all (a certificate handshake).
#[test]
fn a_clienthello_without_a_psk_is_refused() {
    let mut b = openssl::ssl::SslConnector::builder(SslMethod::tls_client()).unwrap();
    b.set_verify(openssl::ssl::SslVerifyMode::NONE);
    let mut ssl = b.build().configure().unwrap().into_ssl("target").unwrap();
    ssl.set_connect_state();
    let mut c = SslStream::new(ssl, Pipe::default()).unwrap();
    assert_eq!(c.do_handshake().unwrap_err().code(), ErrorCode::WANT_READ);
    let hello = std::mem::take(&mut c.get_mut().output);
    let mut s = server(K256);
    let e = s.feed(&hello).unwrap_err();
    assert!(matches!(e, HandshakeError::NoPsk), "{e}");
    assert!(e.to_string().contains("no pre-shared key"));
    // The peer is told (an alert).
    assert!(!s.take_output().is_empty());
}

#[test]
fn hostile_framing_is_refused_before_openssl() {
    let hello = client(K256, Derivation::Rfc8446, IdentityVersion::V0).take_output();
    // A truncated record takes nothing, however it is cut.
    for cut in 0..hello.len() {
        let mut s = server(K256);
        let (n, done) = s.feed(&hello[..cut]).unwrap();
        assert!(n == 0 && done.is_none(), "cut at {cut}");
        assert!(s.take_output().is_empty());
    }
    // Oversized, unknown type, bad version, application data first.
    let cases: [(&[u8], &str); 5] = [
        (&[22, 3, 1, 0x41, 0x01], "over the 16640"),
        (&[24, 3, 3, 0, 1, 0], "unknown content type 24"),
        (&[22, 2, 0, 0, 1, 0], "version 0x0200"),
        (&[23, 3, 3, 0, 1, 0], "ApplicationData record where the TLS handshake"),
        (&[21, 3, 3, 0, 2, 2, 40], "alert 40 (handshake_failure)"),
    ];
    for (bytes, says) in cases {
        let e = server(K256).feed(bytes).unwrap_err();
        assert!(e.to_string().contains(says), "{bytes:?}: {e}");
    }
    // Records of the largest size carrying a ClientHello that claims 16 MB:
    // OpenSSL waits for the rest; we stop at HANDSHAKE_LIMIT.
    let mut s = server(K256);
    let mut body = vec![0u8; MAX_CIPHERTEXT - 256];
    body[..4].copy_from_slice(&[1, 0xFF, 0xFF, 0xFF]);
    let mut rec = vec![22, 3, 1, (body.len() >> 8) as u8, body.len() as u8];
    rec.extend_from_slice(&body);
    let mut fed = 0;
    let e = loop {
        match s.feed(&rec) {
            Ok((n, None)) => {
                assert_eq!(n, rec.len());
                fed += n;
                assert!(fed <= HANDSHAKE_LIMIT);
                rec[5..].fill(0);
            }
            Ok((_, Some(_))) => panic!("a handshake out of zeros"),
            Err(e) => break e,
        }
    };
    assert!(matches!(e, HandshakeError::TooLarge | HandshakeError::Tls(_)), "{e}");
    // Garbage in a well-framed handshake record: OpenSSL's own refusal.
    let e = server(K256).feed(&[22, 3, 1, 0, 4, 1, 0, 0, 0]).unwrap_err();
    assert!(matches!(e, HandshakeError::Tls(_) | HandshakeError::NoPsk), "{e}");
}

/// A Linux host whose tlshd 1.0 binds a SHA-384 PSK with SHA-256 and
/// offers TLS_AES_256_GCM_SHA384 and TLS_CHACHA20_POLY1305_SHA256 (its
/// ClientHello as captured from Debian 13's tlshd): the server takes the
/// binder's hash and the one suite of it offered, and records flow.
#[test]
fn a_sha384_psk_bound_with_sha256_as_tlshd_1_0_does() {
    let psk = ConfiguredPsk::parse(K384).unwrap();
    let id = psk.identity(Derivation::Rfc8446, IdentityVersion::V0, HOST, SUB);
    assert!(id.to_string().starts_with("NVMe0R02 "));
    let key = psk.tls_psk(Derivation::Rfc8446, &id).unwrap();
    let c = Handshake::client_offering(&id.to_string(), key, PskHash::Sha256, &[Suite::Aes256GcmSha384, Suite::Chacha20Poly1305Sha256]).unwrap();
    let (c, s, _) = run(c, server(K384), b"");
    let (c, s) = (c.unwrap(), s.unwrap());
    assert_eq!((c.suite, s.suite), (Suite::Chacha20Poly1305Sha256, Suite::Chacha20Poly1305Sha256));
    assert!(s.note.as_deref().unwrap().contains("bound with SHA-256, not the identity's SHA-384"), "{:?}", s.note);
    let mut wire = Vec::new();
    Sealer::new(&c.tx).seal_all(&[7u8; 40000], &mut wire);
    let mut plain = BytesMut::new();
    let mut o = Opener::new(&s.rx, false);
    let mut at = 0;
    while let Some((n, _)) = o.open(&wire[at..], &mut plain).unwrap() {
        at += n;
    }
    assert_eq!(&plain[..], &[7u8; 40000][..]);
    // A host offering AES-128-GCM too gets it (ours first), bound with SHA-256.
    let key = psk.tls_psk(Derivation::Rfc8446, &id).unwrap();
    let c = Handshake::client_offering(&id.to_string(), key, PskHash::Sha256, &[Suite::Chacha20Poly1305Sha256, Suite::Aes128GcmSha256]).unwrap();
    let (_, s, _) = run(c, server(K384), b"");
    assert_eq!(s.unwrap().suite, Suite::Aes128GcmSha256);
}

#[test]
fn binder_hash_reads_the_first_binder() {
    // identities: one of 3 bytes + age; binders: one of 32, then 48
    let mut ext = vec![0, 9, 0, 3, b'a', b'b', b'c', 0, 0, 0, 0];
    ext.extend_from_slice(&[0, 33 + 49, 32]);
    ext.extend_from_slice(&[0; 32]);
    ext.push(48);
    ext.extend_from_slice(&[0; 48]);
    assert_eq!(binder_hash(&ext), Some(PskHash::Sha256));
    ext[13] = 48;
    assert_eq!(binder_hash(&ext), Some(PskHash::Sha384));
    ext[13] = 20;
    assert_eq!(binder_hash(&ext), None);
    assert_eq!(binder_hash(&ext[..12]), None);
    assert_eq!(binder_hash(&[0xff, 0xff]), None);
}

/// nvmet's server as tlshd 1.0 makes it (GnuTLS PSK credentials allocated
/// without a hash): every key, a SHA-384 PSK's 48 bytes too, is bound with
/// SHA-256, so a SHA-384 binder is refused (`unhandled error -55,
/// returning EACCES`), with `suites` as its priorities. In the VM it
/// agreed on TLS_AES_128_GCM_SHA256 with our client; its client side
/// offers TLS_AES_256_GCM_SHA384 and TLS_CHACHA20_POLY1305_SHA256 only.
fn tlshd_server(key: TlsPsk, suites: &str) -> Handshake {
    unsafe extern "C" fn find(ssl: *mut openssl_sys::SSL, _id: *const libc::c_uchar, _len: libc::size_t, sess: *mut *mut openssl_sys::SSL_SESSION) -> libc::c_int {
        // SAFETY: OpenSSL passes the live SSL; its state holds the key.
        let st = state(unsafe { SslRef::from_ptr(ssl) });
        let Some(psk) = st.psk.as_ref() else { return 0 };
        *sess = psk_session(ssl, psk, PskHash::Sha256);
        (!(*sess).is_null()) as libc::c_int
    }
    let mut b = SslContextBuilder::new(SslMethod::tls_server()).unwrap();
    b.set_min_proto_version(Some(SslVersion::TLS1_3)).unwrap();
    b.set_ciphersuites(suites).unwrap();
    b.set_num_tickets(0).unwrap();
    b.set_keylog_callback(keylog);
    // SAFETY: a context being built; the callback has OpenSSL's signature.
    unsafe { ffi::SSL_CTX_set_psk_find_session_callback(b.as_ptr(), Some(find)) };
    let ctx = b.build();
    let mut ssl = Ssl::new(&ctx).unwrap();
    ssl.set_ex_data(index(), Mutex::new(State { psk: Some(key), ..State::default() }));
    ssl.set_accept_state();
    let stream = SslStream::new(ssl, Pipe::default()).unwrap();
    Handshake { role: Role::Server, stream, taken: 0, replay: Vec::new(), sent: false, peer_alert: None, done: false }
}

/// Our client with a SHA-384 PSK against a tlshd 1.0 server: TP 8011's
/// binding is refused; the SHA-256 binding of the same 48 bytes gets
/// TLS_AES_128_GCM_SHA256 (as nvmet gave in the VM), or
/// TLS_CHACHA20_POLY1305_SHA256 from a server whose only SHA-256 suite it
/// is, and records flow both ways. Our own server takes either binding.
#[test]
fn a_sha384_psk_bound_with_sha256_for_a_tlshd_server() {
    let psk = ConfiguredPsk::parse(K384).unwrap();
    let id = psk.identity(Derivation::Rfc8446, IdentityVersion::V0, HOST, SUB);
    let key = || psk.tls_psk(Derivation::Rfc8446, &id).unwrap();
    assert_eq!(key().key().len(), 48);
    assert_eq!(Binding::candidates(PskHash::Sha384), &[Binding::Specified, Binding::Sha256]);
    assert_eq!(Binding::candidates(PskHash::Sha256), &[Binding::Specified]);
    for (suites, want) in [
        ("TLS_AES_256_GCM_SHA384:TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256", Suite::Aes128GcmSha256),
        ("TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256", Suite::Chacha20Poly1305Sha256),
    ] {
        let (c, s, _) = run(Handshake::client_bound(&id.to_string(), key(), Binding::Specified).unwrap(), tlshd_server(key(), suites), b"");
        assert!(c.is_err() && s.is_err(), "TP 8011's SHA-384 binding against tlshd 1.0 ({suites}): {:?} / {:?}", c.map(|e| e.suite), s.map(|e| e.suite));
        let (c, s, _) = run(Handshake::client_bound(&id.to_string(), key(), Binding::Sha256).unwrap(), tlshd_server(key(), suites), b"");
        let (c, s) = (c.unwrap(), s.unwrap());
        assert_eq!((c.suite, s.suite), (want, want), "{suites}");
        for (tx, rx) in [(&c.tx, &s.rx), (&s.tx, &c.rx)] {
            let mut wire = Vec::new();
            Sealer::new(tx).seal_all(b"ICReq", &mut wire);
            let mut plain = BytesMut::new();
            assert_eq!(Opener::new(rx, false).open(&wire, &mut plain).unwrap(), Some((wire.len(), Opened::Data(5))));
            assert_eq!(&plain[..], b"ICReq");
        }
    }
    // Our own server: TP 8011's binding gets TLS_AES_256_GCM_SHA384, the
    // SHA-256 one AES-128-GCM (ours before ChaCha20), the key's note says so.
    let (_, s, _) = run(Handshake::client_bound(&id.to_string(), key(), Binding::Specified).unwrap(), server(K384), b"");
    assert_eq!(s.unwrap().suite, Suite::Aes256GcmSha384);
    let (c, s, _) = run(Handshake::client_bound(&id.to_string(), key(), Binding::Sha256).unwrap(), server(K384), b"");
    let s = s.unwrap();
    assert_eq!((c.unwrap().suite, s.suite), (Suite::Aes128GcmSha256, Suite::Aes128GcmSha256));
    assert!(s.note.as_deref().unwrap().contains("bound with SHA-256"), "{:?}", s.note);
    // A SHA-256 PSK: one binding, the same suite either way.
    let k256 = ConfiguredPsk::parse(K256).unwrap();
    let id = k256.identity(Derivation::Rfc8446, IdentityVersion::V0, HOST, SUB);
    let (c, _, _) = run(Handshake::client_bound(&id.to_string(), k256.tls_psk(Derivation::Rfc8446, &id).unwrap(), Binding::Sha256).unwrap(), server(K256), b"");
    assert_eq!(c.unwrap().suite, Suite::Aes128GcmSha256);
}
