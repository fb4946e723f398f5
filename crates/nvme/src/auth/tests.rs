//! Our host against our controller, through the same Auth Send/Receive
//! commands the transport carries: every hash x group, one-way and
//! bidirectional, and the ways it must fail.

use super::controller::MAX_UNPROVEN_NEGOTIATIONS;
use super::host::{HostError, RECEIVE_LEN};
use super::message::{auth_id, AuthCommand, Message};
use super::*;
use crate::queue_entry::{sgl, Sgl, Sqe};
use crate::status::Status;
use std::sync::Arc;

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:host-under-test";
const SUB: &str = "nqn.2026-11.org.blockwire:auth";

fn key(fill: u8, transform: Option<HashId>) -> Secret {
    let len = transform.map_or(32, HashId::digest_len) as u8;
    let k: Vec<u8> = (0..len).map(|i| i.wrapping_mul(fill) ^ fill).collect();
    Secret::from_key(&k, transform).unwrap()
}

fn entropy(seed: u8) -> Entropy {
    Entropy {
        bytes: core::array::from_fn(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)),
        seqnum: 1000 + seed as u32,
    }
}

fn send_sqe(len: usize) -> Sqe {
    let mut s = AuthCommand::send_sqe(1, len as u32);
    s.set_sgl(Sgl {
        addr: 0,
        length: len as u32,
        kind: sgl::INCAPSULE,
    });
    s
}

fn receive_sqe(al: u32) -> Sqe {
    let mut s = AuthCommand::receive_sqe(2, al);
    s.set_sgl(Sgl {
        addr: 0,
        length: al,
        kind: sgl::TRANSPORT,
    });
    s
}

/// Which way a message travels, for tampering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    ToCtrl,
    ToHost,
}

/// Run one transaction; `tamper` may change any message in flight.
fn exchange(
    host: &AuthConfig,
    ctrl: &AuthConfig,
    hostnqn: &str,
    mut tamper: impl FnMut(Dir, &mut Vec<u8>),
) -> (Result<(), HostError>, ControllerAuth) {
    let mut c = ControllerAuth::new(Arc::new(ctrl.clone()), HOST, SUB);
    let mut h = HostAuth::new(Arc::new(host.clone()), hostnqn, SUB, 9, entropy(7));
    let mut act = h.start();
    for _ in 0..10 {
        act = match act {
            HostAction::Send(mut b) => {
                tamper(Dir::ToCtrl, &mut b);
                assert_eq!(
                    c.auth_send(&send_sqe(b.len()), &b, entropy(3)),
                    Status::SUCCESS
                );
                h.sent()
            }
            HostAction::Receive => {
                let mut d = c
                    .auth_receive(&receive_sqe(RECEIVE_LEN))
                    .expect("Auth Receive status");
                assert_eq!(
                    d.len(),
                    RECEIVE_LEN as usize,
                    "padded to AL like Linux's target"
                );
                tamper(Dir::ToHost, &mut d);
                h.received(&d)
            }
            HostAction::Done => return (Ok(()), c),
            HostAction::Failed { send, error } => {
                if let Some(b) = send {
                    assert_eq!(Message::parse(&b).map(|m| m.name()), Ok("AUTH_Failure2"));
                    c.auth_send(&send_sqe(b.len()), &b, entropy(4));
                }
                return (Err(error), c);
            }
        };
    }
    panic!("exchange did not end");
}

fn cfg(
    host_key: Secret,
    ctrl_key: Option<Secret>,
    hashes: &[HashId],
    groups: &[DhGroup],
) -> AuthConfig {
    AuthConfig {
        host_key,
        ctrl_key,
        hashes: hashes.to_vec(),
        groups: groups.to_vec(),
    }
}

#[test]
fn every_hash_and_group_one_way_and_bidirectional() {
    for hash in HashId::ALL {
        for group in DhGroup::ALL {
            for mutual in [false, true] {
                let kc = mutual.then(|| key(5, Some(HashId::Sha512)));
                let host = cfg(key(3, Some(hash)), kc.clone(), &HashId::ALL, &DhGroup::ALL);
                let ctrl = cfg(key(3, Some(hash)), kc, &[hash], &[group]);
                let (r, c) = exchange(&host, &ctrl, HOST, |_, _| {});
                assert_eq!(r, Ok(()), "{hash} {group} mutual={mutual}");
                assert!(c.authenticated() && c.failed().is_none(), "{hash} {group}");
                assert_eq!(c.mutual(), mutual);
            }
        }
    }
}

#[test]
fn the_controller_picks_its_preference_among_what_the_host_offers() {
    let mut seen = None;
    let host = cfg(
        key(3, None),
        None,
        &[HashId::Sha384, HashId::Sha512],
        &[DhGroup::Null, DhGroup::Ffdhe3072],
    );
    let ctrl = cfg(
        key(3, None),
        None,
        &[HashId::Sha256, HashId::Sha512, HashId::Sha384],
        &[DhGroup::Ffdhe2048, DhGroup::Ffdhe3072, DhGroup::Null],
    );
    let (r, _) = exchange(&host, &ctrl, HOST, |d, b| {
        if let (Dir::ToHost, Ok(Message::Challenge(c))) = (d, Message::parse(b)) {
            seen = Some((c.hash_id, c.group_id, c.dh_value.len()));
        }
    });
    assert_eq!(r, Ok(()));
    assert_eq!(
        seen,
        Some((HashId::Sha512.id(), DhGroup::Ffdhe3072.id(), 384))
    );
}

#[test]
fn wrong_host_secret_is_refused_with_failure1() {
    let host = cfg(key(4, None), None, &HashId::ALL, &DhGroup::ALL);
    let ctrl = AuthConfig::new(key(3, None), None);
    let (r, c) = exchange(&host, &ctrl, HOST, |_, _| {});
    assert_eq!(r, Err(HostError::Refused(FailureReason::FAILED)));
    assert_eq!(c.failed(), Some(FailureReason::FAILED));
    assert!(!c.authenticated());
    assert!(
        c.why().unwrap().contains("wrong dhchap_secret"),
        "{:?}",
        c.why()
    );
}

#[test]
fn the_secret_is_bound_to_the_host_nqn() {
    // Same key, but the host claims another NQN than the one it connected
    // with: the transformation and the response both change.
    for t in [None, Some(HashId::Sha256)] {
        let k = cfg(key(3, t), None, &HashId::ALL, &DhGroup::ALL);
        let (r, _) = exchange(
            &k,
            &k,
            "nqn.2014-08.org.nvmexpress:uuid:someone-else",
            |_, _| {},
        );
        assert_eq!(r, Err(HostError::Refused(FailureReason::FAILED)), "{t:?}");
    }
}

#[test]
fn wrong_controller_secret_is_detected_by_the_host() {
    let host = cfg(
        key(3, None),
        Some(key(6, None)),
        &HashId::ALL,
        &DhGroup::ALL,
    );
    let ctrl = AuthConfig::new(key(3, None), Some(key(5, None)));
    let (r, c) = exchange(&host, &ctrl, HOST, |_, _| {});
    assert_eq!(r, Err(HostError::ControllerNotAuthenticated));
    // The host told the controller (Failure2), which gives up too.
    assert_eq!(c.failed(), Some(FailureReason::FAILED));
    assert!(!c.authenticated());
}

#[test]
fn bidirectional_without_a_controller_secret_is_refused() {
    let host = cfg(
        key(3, None),
        Some(key(6, None)),
        &HashId::ALL,
        &DhGroup::ALL,
    );
    let ctrl = AuthConfig::new(key(3, None), None);
    let (r, c) = exchange(&host, &ctrl, HOST, |_, _| {});
    assert_eq!(r, Err(HostError::Refused(FailureReason::FAILED)));
    assert!(c.why().unwrap().contains("dhchap_ctrl_secret"));
}

#[test]
fn unsupported_hash_or_group_is_refused_with_its_reason() {
    let ctrl = cfg(key(3, None), None, &[HashId::Sha512], &[DhGroup::Ffdhe4096]);
    let host = cfg(key(3, None), None, &[HashId::Sha256], &DhGroup::ALL);
    assert_eq!(
        exchange(&host, &ctrl, HOST, |_, _| {}).0,
        Err(HostError::Refused(FailureReason::HASH_UNUSABLE))
    );
    let host = cfg(
        key(3, None),
        None,
        &HashId::ALL,
        &[DhGroup::Null, DhGroup::Ffdhe2048],
    );
    assert_eq!(
        exchange(&host, &ctrl, HOST, |_, _| {}).0,
        Err(HostError::Refused(FailureReason::DHGROUP_UNUSABLE))
    );
    // A controller that picks something the host never offered.
    let host = cfg(key(3, None), None, &[HashId::Sha256], &[DhGroup::Null]);
    let ctrl = cfg(key(3, None), None, &[HashId::Sha256], &[DhGroup::Null]);
    let (r, c) = exchange(&host, &ctrl, HOST, |d, b| {
        if d == Dir::ToHost && b[1] == auth_id::CHALLENGE {
            b[8] = HashId::Sha384.id();
        }
    });
    assert!(
        matches!(
            r,
            Err(HostError::Unusable {
                reason: FailureReason::HASH_UNUSABLE,
                ..
            })
        ),
        "{r:?}"
    );
    assert_eq!(
        c.failed(),
        Some(FailureReason::HASH_UNUSABLE),
        "the host's Failure2 reached the controller"
    );
}

#[test]
fn a_replayed_reply_is_refused() {
    for group in [DhGroup::Null, DhGroup::Ffdhe2048] {
        let k = cfg(key(3, None), None, &HashId::ALL, &[group]);
        let mut recorded = None;
        let (r, _) = exchange(&k, &k, HOST, |d, b| {
            if d == Dir::ToCtrl && b[1] == auth_id::REPLY {
                recorded = Some(b.clone());
            }
        });
        assert_eq!(r, Ok(()));
        let old = recorded.unwrap();
        // A new transaction (fresh challenge): the eavesdropped Reply fails.
        let mut c = ControllerAuth::new(Arc::new(k.clone()), HOST, SUB);
        let n = Message::Negotiate(message::Negotiate {
            tid: 9,
            sc_c: 0,
            hashes: vec![1, 2, 3],
            groups: vec![group.id()],
        })
        .encode();
        assert_eq!(
            c.auth_send(&send_sqe(n.len()), &n, entropy(42)),
            Status::SUCCESS
        );
        c.auth_receive(&receive_sqe(RECEIVE_LEN)).unwrap();
        assert_eq!(
            c.auth_send(&send_sqe(old.len()), &old, entropy(43)),
            Status::SUCCESS
        );
        let f = Message::parse(&c.auth_receive(&receive_sqe(RECEIVE_LEN)).unwrap()).unwrap();
        assert!(
            matches!(f, Message::Failure1(x) if x.reason == FailureReason::FAILED),
            "{group}: {f:?}"
        );
        assert!(!c.authenticated());
    }
}

#[test]
fn altered_messages_are_refused() {
    let k = cfg(
        key(3, None),
        Some(key(5, None)),
        &HashId::ALL,
        &[DhGroup::Ffdhe2048],
    );
    // (what, direction, message id, byte flipped, outcome).
    type Alteration<'a> = (&'a str, Dir, u8, usize, Result<(), HostError>);
    let cases: Vec<Alteration> = vec![
        (
            "R1 flipped",
            Dir::ToCtrl,
            auth_id::REPLY,
            16,
            Err(HostError::Refused(FailureReason::FAILED)),
        ),
        (
            "host DH value flipped",
            Dir::ToCtrl,
            auth_id::REPLY,
            16 + 64 + 100,
            Err(HostError::Refused(FailureReason::FAILED)),
        ),
        (
            "C2 flipped",
            Dir::ToCtrl,
            auth_id::REPLY,
            16 + 32,
            Err(HostError::ControllerNotAuthenticated),
        ),
        (
            "Reply T_ID changed",
            Dir::ToCtrl,
            auth_id::REPLY,
            4,
            Err(HostError::Refused(FailureReason::INCORRECT_PAYLOAD)),
        ),
        (
            "C1 flipped",
            Dir::ToHost,
            auth_id::CHALLENGE,
            16,
            Err(HostError::Refused(FailureReason::FAILED)),
        ),
        (
            "S1 changed",
            Dir::ToHost,
            auth_id::CHALLENGE,
            12,
            Err(HostError::Refused(FailureReason::FAILED)),
        ),
        (
            "controller DH value flipped",
            Dir::ToHost,
            auth_id::CHALLENGE,
            16 + 32 + 7,
            Err(HostError::Refused(FailureReason::FAILED)),
        ),
        (
            "R2 flipped",
            Dir::ToHost,
            auth_id::SUCCESS1,
            16 + 3,
            Err(HostError::ControllerNotAuthenticated),
        ),
    ];
    for (what, dir, id, at, want) in cases {
        let (r, c) = exchange(&k, &k, HOST, |d, b| {
            if d == dir && b[1] == id {
                b[at] ^= 0x01;
            }
        });
        assert_eq!(r, want, "{what}");
        assert!(!c.authenticated(), "{what}: controller still authenticated");
        assert!(c.failed().is_some(), "{what}: controller did not give up");
    }
    // The RVALID bit cleared: the controller skips proving itself.
    let (r, _) = exchange(&k, &k, HOST, |d, b| {
        if d == Dir::ToHost && b[1] == auth_id::SUCCESS1 {
            b[8] = 0;
        }
    });
    assert_eq!(r, Err(HostError::ControllerNotAuthenticated));
}

#[test]
fn out_of_order_and_malformed_commands() {
    let k = Arc::new(AuthConfig::new(key(3, None), None));
    // Auth Receive first: Failure1 "incorrect protocol message", then dead.
    let mut c = ControllerAuth::new(k.clone(), HOST, SUB);
    let f = Message::parse(&c.auth_receive(&receive_sqe(64)).unwrap()).unwrap();
    assert!(matches!(f, Message::Failure1(x) if x.reason == FailureReason::INCORRECT_MESSAGE));
    assert_eq!(c.failed(), Some(FailureReason::INCORRECT_MESSAGE));
    assert_eq!(
        c.auth_receive(&receive_sqe(64)),
        Err(Status::CMD_SEQ_ERROR.dnr())
    );
    // A Reply before any Negotiate.
    let mut c = ControllerAuth::new(k.clone(), HOST, SUB);
    let r = Message::Reply(message::Reply {
        tid: 1,
        response: vec![0; 32],
        challenge: None,
        seqnum: 0,
        dh_value: vec![],
    })
    .encode();
    assert_eq!(
        c.auth_send(&send_sqe(r.len()), &r, entropy(1)),
        Status::SUCCESS
    );
    let f = Message::parse(&c.auth_receive(&receive_sqe(64)).unwrap()).unwrap();
    assert!(
        matches!(f, Message::Failure1(x) if x.reason == FailureReason::INCORRECT_MESSAGE),
        "{f:?}"
    );
    // Garbage: incorrect payload.
    let mut c = ControllerAuth::new(k.clone(), HOST, SUB);
    assert_eq!(
        c.auth_send(&send_sqe(3), &[0, 0, 1], entropy(1)),
        Status::SUCCESS
    );
    let f = Message::parse(&c.auth_receive(&receive_sqe(64)).unwrap()).unwrap();
    assert!(
        matches!(f, Message::Failure1(x) if x.reason == FailureReason::INCORRECT_PAYLOAD),
        "{f:?}"
    );
    // Secure channel concatenation is not offered.
    let mut c = ControllerAuth::new(k.clone(), HOST, SUB);
    let n = Message::Negotiate(message::Negotiate {
        tid: 2,
        sc_c: 1,
        hashes: vec![1],
        groups: vec![0],
    })
    .encode();
    c.auth_send(&send_sqe(n.len()), &n, entropy(1));
    let f = Message::parse(&c.auth_receive(&receive_sqe(64)).unwrap()).unwrap();
    assert!(
        matches!(f, Message::Failure1(x) if x.reason == FailureReason::CONCAT_MISMATCH && x.tid == 2),
        "{f:?}"
    );
    let why = c.why().unwrap_or_default();
    assert!(why.contains("secure channel concatenation") && why.contains("does not implement") && why.contains("tls_psk"), "{why}");
    // Command fields: wrong SECP or a length that disagrees with the data.
    let mut c = ControllerAuth::new(k.clone(), HOST, SUB);
    let n = Message::Negotiate(message::Negotiate {
        tid: 2,
        sc_c: 0,
        hashes: vec![1],
        groups: vec![1],
    })
    .encode();
    let mut bad = send_sqe(n.len());
    bad.0[43] = 0xEA;
    assert_eq!(
        c.auth_send(&bad, &n, entropy(1)),
        Status::INVALID_FIELD.dnr()
    );
    assert_eq!(
        c.auth_send(&send_sqe(n.len() + 1), &n, entropy(1)),
        Status::SGL_INVALID_DATA.dnr()
    );
    // A receive buffer too small for the Challenge: refused, and a larger
    // one still gets it.
    assert_eq!(
        c.auth_send(&send_sqe(n.len()), &n, entropy(1)),
        Status::SUCCESS
    );
    assert_eq!(
        c.auth_receive(&receive_sqe(64)),
        Err(Status::INVALID_FIELD.dnr())
    );
    let ch = c.auth_receive(&receive_sqe(1024)).unwrap();
    assert!(matches!(Message::parse(&ch), Ok(Message::Challenge(x)) if x.dh_value.len() == 256));
    assert!(!c.authenticated() && c.failed().is_none());
}

#[test]
fn re_authentication_keeps_the_queue_authenticated_until_it_fails() {
    let k = Arc::new(cfg(key(3, None), None, &HashId::ALL, &[DhGroup::Null]));
    let mut c = ControllerAuth::new(k.clone(), HOST, SUB);
    for (round, host_key) in [(0u8, key(3, None)), (1, key(3, None)), (2, key(9, None))] {
        let mut h = HostAuth::new(
            Arc::new(cfg(host_key, None, &HashId::ALL, &[DhGroup::Null])),
            HOST,
            SUB,
            round as u16,
            entropy(round),
        );
        let mut act = h.start();
        let mut steps = 0;
        let result = loop {
            // Until the new Reply is judged, the old authentication holds.
            if round > 0 && steps < 2 {
                assert!(
                    c.authenticated(),
                    "round {round} step {steps}: authenticated while re-authenticating"
                );
            }
            steps += 1;
            act = match act {
                HostAction::Send(b) => {
                    c.auth_send(&send_sqe(b.len()), &b, entropy(50 + round));
                    h.sent()
                }
                HostAction::Receive => {
                    h.received(&c.auth_receive(&receive_sqe(RECEIVE_LEN)).unwrap())
                }
                HostAction::Done => break true,
                HostAction::Failed { .. } => break false,
            };
        };
        assert_eq!(result, round < 2, "round {round}");
        assert_eq!(c.authenticated(), round < 2);
    }
}

/// Untransformed keys of every length with every hash, and transformed keys.
#[test]
fn keys_of_every_length_and_transformation() {
    for (len, t) in [
        (32, None),
        (48, None),
        (64, None),
        (32, Some(HashId::Sha256)),
        (48, Some(HashId::Sha384)),
        (64, Some(HashId::Sha512)),
    ] {
        for hash in HashId::ALL {
            let s = Secret::from_key(&vec![0x42; len], t).unwrap();
            let k = cfg(
                Secret::parse(&s.encode()).unwrap(),
                None,
                &[hash],
                &[DhGroup::Null],
            );
            assert_eq!(
                exchange(&k, &k, HOST, |_, _| {}).0,
                Ok(()),
                "{len} {t:?} {hash}"
            );
        }
    }
}

/// Each Negotiate costs the controller a DH key pair; a host that has not
/// proved its secret gets a bounded number of them on one queue, and one
/// that has proved it starts afresh.
#[test]
fn negotiates_without_proof_are_bounded() {
    let k = Arc::new(cfg(key(3, None), None, &HashId::ALL, &[DhGroup::Ffdhe2048]));
    let host = Arc::new(cfg(key(3, None), None, &HashId::ALL, &[DhGroup::Ffdhe2048]));
    let mut c = ControllerAuth::new(k, HOST, SUB);
    let negotiate = |c: &mut ControllerAuth, tid: u16| {
        let mut h = HostAuth::new(host.clone(), HOST, SUB, tid, entropy(tid as u8));
        let HostAction::Send(b) = h.start() else {
            panic!("the host starts with a Negotiate")
        };
        assert_eq!(
            c.auth_send(&send_sqe(b.len()), &b, entropy(60)),
            Status::SUCCESS
        );
        c.auth_receive(&receive_sqe(RECEIVE_LEN)).unwrap()
    };
    for tid in 0..MAX_UNPROVEN_NEGOTIATIONS as u16 {
        let d = negotiate(&mut c, tid);
        assert_eq!(
            Message::parse(&d).map(|m| m.name()),
            Ok("DH-HMAC-CHAP_Challenge"),
            "negotiation {tid}"
        );
    }
    let d = negotiate(&mut c, 99);
    assert!(
        matches!(Message::parse(&d), Ok(Message::Failure1(f)) if f.reason == FailureReason::FAILED),
        "{:?}",
        Message::parse(&d).map(|m| m.name())
    );
    assert_eq!(c.failed(), Some(FailureReason::FAILED));
    assert!(c.why().unwrap().contains("without a valid Reply"));

    // Proving the secret resets the count: re-authentication goes on.
    let k = Arc::new(cfg(key(3, None), None, &HashId::ALL, &[DhGroup::Null]));
    let host = Arc::new(cfg(key(3, None), None, &HashId::ALL, &[DhGroup::Null]));
    let mut c = ControllerAuth::new(k, HOST, SUB);
    for round in 0..2 * MAX_UNPROVEN_NEGOTIATIONS as u16 {
        let mut h = HostAuth::new(host.clone(), HOST, SUB, round, entropy(round as u8));
        let mut act = h.start();
        let done = loop {
            act = match act {
                HostAction::Send(b) => {
                    c.auth_send(&send_sqe(b.len()), &b, entropy(70));
                    h.sent()
                }
                HostAction::Receive => {
                    h.received(&c.auth_receive(&receive_sqe(RECEIVE_LEN)).unwrap())
                }
                HostAction::Done => break true,
                HostAction::Failed { .. } => break false,
            };
        };
        assert!(done, "round {round}");
    }
}
