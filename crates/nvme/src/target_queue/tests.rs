use super::*;
use crate::fabric_queue::FabricError;
use crate::auth::{ControllerAuth, FailureReason};
use crate::controller::KeepAlive;
use crate::fabrics::{self, Connect, ConnectData};
use std::sync::Arc;
use crate::limits::MAX_QUEUE_ENTRIES;
use crate::fabrics::NQN_MAX_LEN;
use crate::queue_entry::{nvm, Sgl};
use crate::pdu::{CapsuleCmd, IcReq, DATA_HLEN};
use crate::subsystem::{Namespace, Subsystem};
use bw_block::{BackendSpec, Volume};
use std::time::Duration;

const CNTLID: u64 = 7;

/// A host talking to one [`TargetQueue`], with the clock in its hand.
struct Host {
    q: TargetQueue,
    d: Digests,
    t0: Instant,
    now: Instant,
    ka: Arc<KeepAlive>,
    sub: Arc<Subsystem>,
}

fn subsystem() -> Arc<Subsystem> {
    let v = Volume::open("v", &BackendSpec::ram(64 << 20)).unwrap();
    Arc::new(Subsystem {
        nqn: "nqn.t:s".into(),
        serial: "s".into(),
        model: "m".into(),
        namespaces: vec![Namespace::new("nqn.t:s", 1, v, false)],
        allowed_hosts: vec![],
        ana: Default::default(),
    })
}

impl Host {
    fn new(d: Digests) -> Host {
        Host::with(d, |_| {})
    }
    fn with(d: Digests, tune: impl FnOnce(&mut QueueConfig)) -> Host {
        let t0 = Instant::now();
        let mut cfg = QueueConfig::new(t0 + Duration::from_secs(10));
        tune(&mut cfg);
        Host {
            q: TargetQueue::new(cfg),
            d,
            t0,
            now: t0,
            ka: Arc::new(KeepAlive::new(1000, t0)),
            sub: subsystem(),
        }
    }

    /// Send raw bytes; every action and every PDU the queue sent back.
    fn bytes(&mut self, b: &[u8]) -> (Vec<Action>, Vec<Pdu>) {
        let mut buf = BytesMut::from(b);
        let mut tx = Vec::new();
        let mut acts = Vec::new();
        while let Received::Pdu(a) = self.q.receive(&mut buf, self.now, &mut tx) {
            acts.extend(a);
        }
        (acts, self.decode(tx))
    }

    fn send(&mut self, p: &[Pdu]) -> (Vec<Action>, Vec<Pdu>) {
        let mut b = Vec::new();
        for p in p {
            // The ICReq never carries digests.
            let d = if matches!(p, Pdu::IcReq(_)) {
                Digests::default()
            } else {
                self.d
            };
            p.encode_into(d, &mut b);
        }
        self.bytes(&b)
    }

    fn decode(&self, tx: Vec<u8>) -> Vec<Pdu> {
        let mut buf = BytesMut::from(&tx[..]);
        let mut out = Vec::new();
        while let Some(p) =
            pdu::decode(&mut buf, self.d, u32::MAX).expect("the queue sends well-formed PDUs")
        {
            out.push(p);
        }
        assert!(buf.is_empty(), "a partial PDU was sent");
        out
    }

    fn ic(&mut self) {
        let (a, out) = self.send(&[Pdu::IcReq(IcReq {
            pfv: 0,
            hpda: 0,
            digests: self.d,
            maxr2t: 0,
        })]);
        assert!(a.is_empty());
        assert_eq!(
            out,
            vec![Pdu::IcResp(IcResp {
                pfv: 0,
                cpda: 0,
                digests: self.d,
                maxh2cdata: self.q.tcp.cfg.maxh2cdata
            })]
        );
    }

    fn connect_action(&mut self, qid: u16, sqsize: u16, cattr: u8) -> (Vec<Action>, Vec<Pdu>) {
        let c = Connect {
            recfmt: 0,
            qid,
            sqsize,
            cattr,
            kato_ms: 1000,
        };
        let d = ConnectData {
            hostid: [1; 16],
            cntlid: if qid == 0 { 0xFFFF } else { CNTLID as u16 },
            subnqn: "nqn.t:s".into(),
            hostnqn: "nqn.t:h".into(),
        };
        self.send(&[capsule(c.to_sqe(0x33), Bytes::from(d.encode()))])
    }

    /// ICReq, Connect and the transport's answer; returns the Connect's completion.
    fn connect(&mut self, qid: u16, sqsize: u16, cattr: u8) -> Cqe {
        self.ic();
        let (a, out) = self.connect_action(qid, sqsize, cattr);
        assert!(out.is_empty());
        let [Action::Connect { cid, connect, .. }] = &a[..] else {
            panic!("expected Connect, got {a:?}")
        };
        assert_eq!((connect.qid, connect.sqsize), (qid, sqsize));
        let mut tx = Vec::new();
        let c = Connected {
            result: CNTLID,
            keep_alive: self.ka.clone(),
            subsystem: Some(Arc::new(crate::LiveSubsystem::new(self.sub.clone()))),
            hostnqn: "nqn.t:h".into(),
            auth: None,
        };
        self.q.connected(*cid, c, self.now, &mut tx);
        let out = self.decode(tx);
        let [Pdu::CapsuleResp(cqe)] = &out[..] else {
            panic!("expected one completion, got {out:?}")
        };
        assert!(self.q.is_connected());
        *cqe
    }

    fn complete(&mut self, cid: u16, st: Status, data: Option<Bytes>) -> Vec<Pdu> {
        let mut tx = Vec::new();
        self.q.complete(cid, st, 0, data, &mut tx);
        self.decode(tx)
    }
}

fn capsule(sqe: Sqe, data: Bytes) -> Pdu {
    Pdu::CapsuleCmd(CapsuleCmd { sqe, data })
}

fn rw(op: u8, cid: u16, slba: u64, blocks: u32, kind: u8) -> Sqe {
    let mut s = Sqe::new(op, cid, 1);
    s.set_rw(slba, blocks);
    s.set_sgl(Sgl {
        addr: 0,
        length: blocks * 512,
        kind,
    });
    s
}

fn h2c(cid: u16, ttag: u16, offset: u32, data: Vec<u8>, last: bool) -> Pdu {
    Pdu::H2CData(DataPdu {
        cid,
        ttag,
        offset,
        last,
        success: false,
        data: Bytes::from(data),
    })
}

fn term(out: &[Pdu]) -> (u16, u32) {
    match out {
        [.., Pdu::C2HTermReq(t)] => (t.fes, t.fei),
        _ => panic!("expected a C2HTermReq, got {out:?}"),
    }
}

fn cqe(out: &[Pdu]) -> Cqe {
    match out {
        [.., Pdu::CapsuleResp(c)] => *c,
        _ => panic!("expected a completion, got {out:?}"),
    }
}

fn closed(a: &[Action]) -> Option<QueueError> {
    match a {
        [.., Action::Close(e)] => e.clone(),
        _ => panic!("expected Close, got {a:?}"),
    }
}

#[test]
fn icreq_is_answered_with_the_digests_asked_for() {
    for d in [
        Digests::default(),
        Digests {
            header: true,
            data: true,
        },
    ] {
        let mut h = Host::new(d);
        assert_eq!(h.q.max_pdu_len(), pdu::IC_LEN as u32);
        h.ic();
        assert_eq!(h.q.digests(), d);
        // Until Connect, a Connect is all the host may send.
        assert!(h.q.max_pdu_len() < 2048);
        let mut h = Host::new(d);
        h.connect(1, 31, 0);
        assert!(h.q.max_pdu_len() > MAXH2CDATA);
    }
}

#[test]
fn bad_icreq_is_refused_with_the_offending_field() {
    let mut h = Host::new(Digests::default());
    let (a, out) = h.send(&[Pdu::IcReq(IcReq {
        pfv: 1,
        hpda: 0,
        digests: Digests::default(),
        maxr2t: 0,
    })]);
    assert_eq!(term(&out), (fes::UNSUPPORTED_PARAMETER, 8));
    assert_eq!(
        closed(&a),
        Some(QueueError::UnsupportedIcReq("PDU format version"))
    );
    let mut h = Host::new(Digests::default());
    let (_, out) = h.send(&[Pdu::IcReq(IcReq {
        pfv: 0,
        hpda: 3,
        digests: Digests::default(),
        maxr2t: 0,
    })]);
    assert_eq!(term(&out), (fes::UNSUPPORTED_PARAMETER, 10));
    // Anything but an ICReq first is a sequence error; nothing after counts.
    let mut h = Host::new(Digests::default());
    let (a, out) = h.send(&[
        capsule(Sqe::new(nvm::READ, 1, 1), Bytes::new()),
        Pdu::IcReq(IcReq {
            pfv: 0,
            hpda: 0,
            digests: Digests::default(),
            maxr2t: 0,
        }),
    ]);
    assert_eq!(term(&out), (fes::PDU_SEQUENCE_ERROR, 0));
    assert_eq!(out.len(), 1);
    assert_eq!(
        a,
        vec![Action::Close(Some(QueueError::NotIcReq(
            pdu::kind::CAPSULE_CMD
        )))]
    );
    assert!(h.q.is_closed());
}

/// A header announcing an enormous PDU is refused from its 8 bytes, before
/// the queue reserves room for it.
#[test]
fn huge_pdu_length_is_refused_without_buffering() {
    for connected in [false, true] {
        let mut h = Host::new(Digests::default());
        if connected {
            h.connect(1, 31, 0);
        }
        let mut hdr = vec![pdu::kind::H2C_DATA, 0, DATA_HLEN as u8, DATA_HLEN as u8];
        hdr.extend_from_slice(&0xFFFF_FFF0u32.to_le_bytes());
        let mut buf = BytesMut::from(&hdr[..]);
        let cap = buf.capacity();
        let mut tx = Vec::new();
        let r = h.q.receive(&mut buf, h.now, &mut tx);
        assert!(
            matches!(
                r,
                Received::Pdu(Some(Action::Close(Some(QueueError::Malformed(
                    PduError::TooLarge { .. }
                )))))
            ),
            "{r:?}"
        );
        assert_eq!(
            buf.capacity(),
            cap,
            "nothing reserved for the announced length"
        );
        let out = h.decode(tx);
        assert_eq!(term(&out), (fes::DATA_OUT_OF_RANGE, 4));
    }
}

/// Before Connect only a Connect is taken: any other command, even one that
/// would need no data, is a fatal transport error.
#[test]
fn commands_before_connect_end_the_connection() {
    let mut h = Host::new(Digests::default());
    h.ic();
    let (a, out) = h.send(&[capsule(Sqe::new(nvm::READ, 4, 1), Bytes::new())]);
    assert_eq!(term(&out), (fes::PDU_SEQUENCE_ERROR, 0));
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(
        closed(&a),
        Some(QueueError::Fabric(FabricError::NotConnected("a command other than Connect")))
    );
    assert_eq!(h.q.outstanding(), 0);
}

/// A host that never connects cannot make the queue ask for (and then
/// hold) write data: no R2T before Connect but the Connect's own.
#[test]
fn writes_before_connect_get_no_r2t() {
    for d in [
        Digests::default(),
        Digests {
            header: true,
            data: true,
        },
    ] {
        let mut h = Host::new(d);
        h.ic();
        let (a, out) = h.send(&[capsule(
            rw(nvm::WRITE, 1, 0, 2048, sgl::TRANSPORT),
            Bytes::new(),
        )]);
        assert!(
            !out.iter().any(|p| matches!(p, Pdu::R2T(_))),
            "R2T before Connect: {out:?}"
        );
        assert_eq!(term(&out), (fes::PDU_SEQUENCE_ERROR, 0));
        assert!(matches!(closed(&a), Some(QueueError::Fabric(FabricError::NotConnected(_)))));
        assert_eq!(h.q.granted_bytes(), 0);
        // Nothing is taken after the close.
        let (a, out) = h.send(&[h2c(1, 1, 0, vec![0; 4096], false)]);
        assert!(a.is_empty() && out.is_empty());
    }
    // A Connect that asks for more than its 1024 bytes of data.
    let mut h = Host::new(Digests::default());
    h.ic();
    let c = Connect {
        recfmt: 0,
        qid: 0,
        sqsize: 31,
        cattr: 0,
        kato_ms: 0,
    };
    let mut s = c.to_sqe(3);
    s.set_sgl(Sgl {
        addr: 0,
        length: 1 << 20,
        kind: sgl::TRANSPORT,
    });
    let (a, out) = h.send(&[capsule(s, Bytes::new())]);
    assert_eq!(term(&out), (fes::PDU_SEQUENCE_ERROR, 0));
    assert!(matches!(closed(&a), Some(QueueError::Fabric(FabricError::NotConnected(_)))));
    // H2CData nobody asked for.
    let mut h = Host::new(Digests::default());
    h.ic();
    let (a, out) = h.send(&[h2c(1, 1, 0, vec![0; 1024], true)]);
    assert_eq!(term(&out).0, fes::INVALID_HEADER_FIELD);
    assert_eq!(closed(&a), Some(QueueError::UnknownTransferTag(1)));
}

/// The Connect's data may come by R2T (one, of 1024 bytes); while it is
/// awaited no second command is taken.
#[test]
fn connect_data_by_r2t_and_nothing_beside_it() {
    let mut h = Host::new(Digests::default());
    h.ic();
    let c = Connect {
        recfmt: 0,
        qid: 0,
        sqsize: 31,
        cattr: 0,
        kato_ms: 0,
    };
    let d = ConnectData {
        hostid: [1; 16],
        cntlid: 0xFFFF,
        subnqn: "nqn.t:s".into(),
        hostnqn: "nqn.t:h".into(),
    };
    let mut s = c.to_sqe(3);
    s.set_sgl(Sgl {
        addr: 0,
        length: CONNECT_DATA_LEN as u32,
        kind: sgl::TRANSPORT,
    });
    let (a, out) = h.send(&[capsule(s, Bytes::new())]);
    assert!(a.is_empty());
    assert_eq!(
        out,
        vec![Pdu::R2T(R2t {
            cid: 3,
            ttag: 3,
            offset: 0,
            length: CONNECT_DATA_LEN as u32
        })]
    );
    let (a, _) = h.send(&[h2c(3, 3, 0, d.encode(), true)]);
    assert!(
        matches!(&a[..], [Action::Connect { cid: 3, data, .. }] if *data == d),
        "{a:?}"
    );
    // The same, with a second Connect sent before the first one's data.
    let mut h = Host::new(Digests::default());
    h.ic();
    let (_, out) = h.send(&[capsule(s, Bytes::new())]);
    assert!(matches!(out[..], [Pdu::R2T(_)]));
    let mut s2 = s;
    s2.set_cid(4);
    let (a, out) = h.send(&[capsule(s2, Bytes::new())]);
    assert_eq!(term(&out).0, fes::PDU_SEQUENCE_ERROR);
    assert!(matches!(closed(&a), Some(QueueError::Fabric(FabricError::QueueOverflow { .. }))));
}

/// Before Connect, a PDU longer than a Connect capsule with its data is
/// refused from its header.
#[test]
fn before_connect_only_connect_sized_pdus_are_framed() {
    let mut h = Host::new(Digests::default());
    h.ic();
    assert!(h.q.max_pdu_len() < 2048, "{}", h.q.max_pdu_len());
    let mut s = Sqe::new(crate::queue_entry::admin::IDENTIFY, 1, 0);
    s.set_sgl(Sgl {
        addr: 0,
        length: 8192,
        kind: sgl::INCAPSULE,
    });
    let (a, out) = h.send(&[capsule(s, Bytes::from(vec![0u8; 8192]))]);
    assert_eq!(term(&out).0, fes::DATA_OUT_OF_RANGE);
    assert!(matches!(
        closed(&a),
        Some(QueueError::Malformed(PduError::TooLarge { .. }))
    ));
    // A Connect with its data in the capsule still fits, with digests.
    let mut h = Host::new(Digests {
        header: true,
        data: true,
    });
    h.ic();
    let (a, _) = h.connect_action(0, 31, 0);
    assert!(matches!(a[..], [Action::Connect { .. }]), "{a:?}");
}

/// NQNs are at most 223 bytes: longer ones are refused at Connect with the
/// field's offset, before the transport sees them.
#[test]
fn overlong_nqns_are_refused_at_connect() {
    for (field, at) in [("sub", fabrics::CD_SUBNQN), ("host", fabrics::CD_HOSTNQN)] {
        for len in [NQN_MAX_LEN, NQN_MAX_LEN + 1, 255] {
            let mut h = Host::new(Digests::default());
            h.ic();
            let long = format!("nqn.t:{}", "x".repeat(len - 6));
            let d = ConnectData {
                hostid: [1; 16],
                cntlid: 0xFFFF,
                subnqn: if field == "sub" {
                    long.clone()
                } else {
                    "nqn.t:s".into()
                },
                hostnqn: if field == "host" {
                    long.clone()
                } else {
                    "nqn.t:h".into()
                },
            };
            let c = Connect {
                recfmt: 0,
                qid: 0,
                sqsize: 31,
                cattr: 0,
                kato_ms: 0,
            };
            let (a, out) = h.send(&[capsule(c.to_sqe(2), Bytes::from(d.encode()))]);
            if len <= NQN_MAX_LEN {
                assert!(
                    matches!(a[..], [Action::Connect { .. }]),
                    "{field} {len}: {a:?}"
                );
                continue;
            }
            assert!(a.is_empty(), "{field} {len}: {a:?}");
            let c = cqe(&out);
            assert_eq!(
                (c.status, c.result),
                (Status::CONNECT_INVALID_PARAM.dnr(), fabrics::ipo_data(at)),
                "{field} {len}"
            );
            assert!(!h.q.is_closed());
        }
    }
}

#[test]
fn connect_fields_are_checked_before_the_transport_sees_them() {
    let mut h = Host::new(Digests::default());
    h.ic();
    let (a, out) = h.connect_action(0, 0, 0);
    assert!(a.is_empty());
    let c = cqe(&out);
    assert_eq!(
        (c.status, c.result),
        (
            Status::CONNECT_INVALID_PARAM.dnr(),
            fabrics::ipo_sqe(fabrics::CS_SQSIZE)
        )
    );
    let (_, out) = h.connect_action(0, MAX_QUEUE_ENTRIES, 0);
    assert_eq!(cqe(&out).status, Status::CONNECT_INVALID_PARAM.dnr());
    let mut s = Connect {
        recfmt: 1,
        qid: 0,
        sqsize: 31,
        cattr: 0,
        kato_ms: 0,
    }
    .to_sqe(2);
    s.set_sgl(Sgl {
        addr: 0,
        length: 1024,
        kind: sgl::INCAPSULE,
    });
    let (_, out) = h.send(&[capsule(s, Bytes::from(vec![0u8; 1024]))]);
    assert_eq!(cqe(&out).status, Status::CONNECT_FORMAT.dnr());
    // Short Connect data.
    let mut s = Connect {
        recfmt: 0,
        qid: 0,
        sqsize: 31,
        cattr: 0,
        kato_ms: 0,
    }
    .to_sqe(3);
    s.set_sgl(Sgl {
        addr: 0,
        length: 100,
        kind: sgl::INCAPSULE,
    });
    let (_, out) = h.send(&[capsule(s, Bytes::from(vec![0u8; 100]))]);
    assert_eq!(cqe(&out).status, Status::SGL_INVALID_DATA.dnr());
    // A refusal by the transport leaves the queue waiting for a Connect.
    let (a, _) = h.connect_action(0, 31, 0);
    let [Action::Connect { cid, .. }] = a[..] else {
        panic!("{a:?}")
    };
    let mut tx = Vec::new();
    h.q.connect_refused(cid, Status::CONNECT_INVALID_HOST.dnr(), 0x10200, &mut tx);
    let c = cqe(&h.decode(tx));
    assert_eq!(
        (c.cid, c.status, c.result),
        (0x33, Status::CONNECT_INVALID_HOST.dnr(), 0x10200)
    );
    assert!(!h.q.is_connected());
    assert_eq!(h.connect_action(0, 31, 0).0.len(), 1);
}

#[test]
fn connect_binds_the_queue_and_sq_head_wraps() {
    let mut h = Host::new(Digests::default());
    let c = h.connect(2, 3, 0);
    assert_eq!(
        (c.cid, c.status, c.result, c.sq_head, c.sq_id),
        (0x33, Status::SUCCESS, CNTLID, 1, 2)
    );
    assert_eq!(h.q.qid(), 2);
    // Four entries: the head goes 2, 3, 0, 1, ...
    let mut heads = Vec::new();
    for cid in 0..6u16 {
        let (a, _) = h.send(&[capsule(
            rw(nvm::READ, cid, 0, 1, sgl::TRANSPORT),
            Bytes::new(),
        )]);
        assert!(matches!(a[..], [Action::Io { .. }]));
        heads.push(cqe(&h.complete(cid, Status::SUCCESS, None)).sq_head);
    }
    assert_eq!(heads, vec![2, 3, 0, 1, 2, 3]);
    // Connect again on a connected queue is a sequence error.
    let (a, out) = h.connect_action(2, 3, 0);
    assert!(a.is_empty());
    assert_eq!(cqe(&out).status, Status::CMD_SEQ_ERROR);
}

#[test]
fn more_commands_than_queue_entries_end_the_connection() {
    let mut h = Host::new(Digests::default());
    h.connect(1, 3, 0);
    for cid in 0..4u16 {
        let (a, _) = h.send(&[capsule(Sqe::new(nvm::FLUSH, cid, 1), Bytes::new())]);
        assert_eq!(a.len(), 1);
    }
    assert_eq!(h.q.outstanding(), 4);
    let (a, out) = h.send(&[capsule(Sqe::new(nvm::FLUSH, 9, 1), Bytes::new())]);
    assert_eq!(term(&out), (fes::PDU_SEQUENCE_ERROR, 0));
    assert_eq!(
        closed(&a),
        Some(QueueError::Fabric(FabricError::QueueOverflow {
            outstanding: 5,
            entries: 4
        }))
    );
}

#[test]
fn a_command_id_in_flight_is_not_taken_twice() {
    let mut h = Host::new(Digests::default());
    h.connect(1, 31, 0);
    let (a, _) = h.send(&[capsule(Sqe::new(nvm::FLUSH, 5, 1), Bytes::new())]);
    assert_eq!(a.len(), 1);
    let (a, out) = h.send(&[capsule(Sqe::new(nvm::FLUSH, 5, 1), Bytes::new())]);
    assert!(a.is_empty());
    assert_eq!(cqe(&out).status, Status::CMDID_CONFLICT.dnr());
    assert_eq!(h.q.outstanding(), 1);
    // The first one still completes normally, and the ID is free again.
    assert_eq!(
        cqe(&h.complete(5, Status::SUCCESS, None)).status,
        Status::SUCCESS
    );
    assert_eq!(
        h.send(&[capsule(Sqe::new(nvm::FLUSH, 5, 1), Bytes::new())])
            .0
            .len(),
        1
    );
}

#[test]
fn in_capsule_data_is_checked() {
    let mut h = Host::new(Digests::default());
    h.connect(1, 31, 0);
    let data = Bytes::from(vec![7u8; 1024]);
    // Good: offset SGL, the announced length.
    let (a, _) = h.send(&[capsule(
        rw(nvm::WRITE, 1, 0, 2, sgl::INCAPSULE),
        data.clone(),
    )]);
    assert_eq!(
        a,
        vec![Action::Io {
            sqe: rw(nvm::WRITE, 1, 0, 2, sgl::INCAPSULE),
            data: data.clone()
        }]
    );
    h.complete(1, Status::SUCCESS, None);
    let cases = [
        (
            rw(nvm::WRITE, 2, 0, 2, sgl::TRANSPORT),
            Status::SGL_INVALID_TYPE,
        ),
        (
            rw(nvm::WRITE, 3, 0, 1, sgl::INCAPSULE),
            Status::SGL_INVALID_DATA,
        ),
        (
            rw(nvm::READ, 4, 0, 2, sgl::INCAPSULE),
            Status::SGL_INVALID_DATA,
        ),
        (
            {
                let mut s = rw(nvm::WRITE, 5, 0, 2, sgl::INCAPSULE);
                s.set_sgl(Sgl {
                    addr: 512,
                    length: 1024,
                    kind: sgl::INCAPSULE,
                });
                s
            },
            Status::SGL_INVALID_OFFSET,
        ),
    ];
    for (sqe, st) in cases {
        let (a, out) = h.send(&[capsule(sqe, data.clone())]);
        assert!(a.is_empty(), "{sqe:?}");
        let c = cqe(&out);
        assert_eq!((c.cid, c.status), (sqe.cid(), st.dnr()));
    }
    // More than INCAPSULE_DATA.
    let big = Bytes::from(vec![0u8; INCAPSULE_DATA as usize + 512]);
    let (_, out) = h.send(&[capsule(
        rw(nvm::WRITE, 6, 0, INCAPSULE_DATA / 512 + 1, sgl::INCAPSULE),
        big,
    )]);
    assert_eq!(cqe(&out).status, Status::SGL_INVALID_OFFSET.dnr());
    assert_eq!(h.q.outstanding(), 0);
}

#[test]
fn write_data_is_asked_for_with_r2t_and_reassembled() {
    for d in [
        Digests::default(),
        Digests {
            header: true,
            data: true,
        },
    ] {
        let mut h = Host::new(d);
        h.connect(1, 31, 0);
        let sqe = rw(nvm::WRITE, 9, 8, 16, sgl::TRANSPORT);
        let (a, out) = h.send(&[capsule(sqe, Bytes::new())]);
        assert!(a.is_empty());
        assert_eq!(
            out,
            vec![Pdu::R2T(R2t {
                cid: 9,
                ttag: 9,
                offset: 0,
                length: 8192
            })]
        );
        assert_eq!(h.q.granted_bytes(), 8192);
        let (a, out) = h.send(&[h2c(9, 9, 0, vec![1; 3000], false)]);
        assert!(a.is_empty() && out.is_empty());
        let (a, _) = h.send(&[h2c(9, 9, 3000, vec![2; 5192], true)]);
        let [Action::Io { sqe: s, data }] = &a[..] else {
            panic!("{a:?}")
        };
        assert_eq!(*s, sqe);
        assert_eq!(data.len(), 8192);
        assert!(data[..3000].iter().all(|&b| b == 1) && data[3000..].iter().all(|&b| b == 2));
        // The grant is held until the write completes.
        assert_eq!(h.q.granted_bytes(), 8192);
        h.complete(9, Status::SUCCESS, None);
        assert_eq!(h.q.granted_bytes(), 0);
    }
}

/// Write checks that need no data are made before the R2T, so a bad write
/// fails without its data crossing the wire; a transfer claim beyond MDTS
/// is refused without anything being set aside for it.
#[test]
fn bad_writes_fail_before_their_r2t() {
    let mut h = Host::new(Digests::default());
    h.connect(1, 31, 0);
    let mut huge = rw(nvm::WRITE, 1, 0, 8, sgl::TRANSPORT);
    huge.set_sgl(Sgl {
        addr: 0,
        length: u32::MAX,
        kind: sgl::TRANSPORT,
    });
    let (_, out) = h.send(&[capsule(huge, Bytes::new())]);
    assert_eq!(
        out,
        vec![Pdu::CapsuleResp(Cqe {
            result: 0,
            sq_head: 2,
            sq_id: 1,
            cid: 1,
            status: Status::INVALID_FIELD.dnr()
        })]
    );
    // Beyond the namespace (64 MiB = 131072 blocks).
    let (_, out) = h.send(&[capsule(
        rw(nvm::WRITE, 2, 131070, 8, sgl::TRANSPORT),
        Bytes::new(),
    )]);
    assert_eq!(cqe(&out).status, Status::LBA_RANGE.dnr());
    // Unknown namespace.
    let mut s = rw(nvm::WRITE, 3, 0, 8, sgl::TRANSPORT);
    s.0[4] = 9;
    let (_, out) = h.send(&[capsule(s, Bytes::new())]);
    assert_eq!(cqe(&out).status, Status::INVALID_NS.dnr());
    // Keyed SGL (a memory address) is not for TCP.
    let mut s = rw(nvm::WRITE, 4, 0, 8, sgl::TRANSPORT);
    s.set_sgl(Sgl {
        addr: 0x1000,
        length: 4096,
        kind: 0x40,
    });
    let (_, out) = h.send(&[capsule(s, Bytes::new())]);
    assert_eq!(cqe(&out).status, Status::SGL_INVALID_TYPE.dnr());
    assert_eq!((h.q.granted_bytes(), h.q.outstanding()), (0, 0));
}

#[test]
fn hostile_h2c_data_ends_the_connection() {
    // (the PDU, the expected FES and FEI, the reason)
    let cases: Vec<(Pdu, (u16, u32), QueueError)> = vec![
        (
            h2c(1, 77, 0, vec![0; 512], true),
            (fes::INVALID_HEADER_FIELD, 10),
            QueueError::UnknownTransferTag(77),
        ),
        (
            h2c(2, 1, 0, vec![0; 512], true),
            (fes::INVALID_HEADER_FIELD, 8),
            QueueError::TransferTagMismatch { cid: 2, ttag: 1 },
        ),
        (
            h2c(1, 1, 512, vec![0; 512], true),
            (fes::DATA_OUT_OF_RANGE, 12),
            QueueError::H2CDataOutOfRange {
                offset: 512,
                len: 512,
                expected: 0,
                total: 4096,
            },
        ),
        (
            h2c(1, 1, 0, vec![0; 4608], true),
            (fes::DATA_OUT_OF_RANGE, 12),
            QueueError::H2CDataOutOfRange {
                offset: 0,
                len: 4608,
                expected: 0,
                total: 4096,
            },
        ),
    ];
    for (p, want, why) in cases {
        let mut h = Host::new(Digests::default());
        h.connect(1, 31, 0);
        h.send(&[capsule(
            rw(nvm::WRITE, 1, 0, 8, sgl::TRANSPORT),
            Bytes::new(),
        )]);
        let (a, out) = h.send(&[p]);
        assert_eq!(term(&out), want);
        assert_eq!(closed(&a), Some(why));
    }
    // An H2CData longer than MAXH2CDATA (but within the PDU limit).
    let mut h = Host::with(Digests::default(), |c| c.maxh2cdata = 4096);
    h.connect(1, 31, 0);
    h.send(&[capsule(
        rw(nvm::WRITE, 1, 0, 16, sgl::TRANSPORT),
        Bytes::new(),
    )]);
    let (a, out) = h.send(&[h2c(1, 1, 0, vec![0; 8192], true)]);
    assert_eq!(term(&out), (fes::R2T_LIMIT_EXCEEDED, 16));
    assert_eq!(closed(&a), Some(QueueError::H2CDataTooLong(8192)));
}

/// R2Ts go out only while the write data asked for and not completed fits
/// the budget; each completion lets the next waiting write go.
#[test]
fn r2ts_stay_within_the_budget() {
    let mut h = Host::with(Digests::default(), |c| c.r2t_budget = 3 << 20);
    h.connect(1, 31, 0);
    let mut r2ts = Vec::new();
    for cid in 0..6u16 {
        let (_, out) = h.send(&[capsule(
            rw(nvm::WRITE, cid, cid as u64 * 2048, 2048, sgl::TRANSPORT),
            Bytes::new(),
        )]);
        r2ts.extend(out);
    }
    let cids = |v: &[Pdu]| {
        v.iter()
            .map(|p| {
                if let Pdu::R2T(r) = p {
                    r.cid
                } else {
                    panic!("{p:?}")
                }
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(cids(&r2ts), vec![0, 1, 2]);
    assert_eq!(h.q.granted_bytes(), 3 << 20);
    // Data for command 1 arrives and it completes: command 3 may send.
    let (a, _) = h.send(&[h2c(1, 1, 0, vec![0; 1 << 20], true)]);
    assert_eq!(a.len(), 1);
    let out = h.complete(1, Status::SUCCESS, None);
    assert_eq!(out.len(), 2);
    assert_eq!(cids(&out[1..]), vec![3]);
    // A write that waits is not sent an R2T by a read's completion.
    assert_eq!(h.q.outstanding(), 5);
    // Data for a write still waiting is out of order: no R2T for it yet.
    let (a, out) = h.send(&[h2c(4, 4, 0, vec![0; 512], true)]);
    assert_eq!(term(&out), (fes::INVALID_HEADER_FIELD, 10));
    assert_eq!(closed(&a), Some(QueueError::UnknownTransferTag(4)));
}

#[test]
fn read_results_are_split_into_c2h_data_pdus() {
    for sqflow_off in [false, true] {
        let mut h = Host::with(
            Digests {
                header: true,
                data: true,
            },
            |c| c.max_c2h_data = 128 << 10,
        );
        h.connect(1, 31, if sqflow_off { CATTR_DISABLE_SQFLOW } else { 0 });
        h.send(&[capsule(
            rw(nvm::READ, 3, 0, 600, sgl::TRANSPORT),
            Bytes::new(),
        )]);
        let data: Vec<u8> = (0..600 * 512).map(|i| i as u8).collect();
        let out = h.complete(3, Status::SUCCESS, Some(Bytes::from(data.clone())));
        let mut got = Vec::new();
        let mut offsets = Vec::new();
        for p in &out {
            if let Pdu::C2HData(d) = p {
                offsets.push((d.offset, d.last, d.success));
                got.extend_from_slice(&d.data);
            }
        }
        assert_eq!(got, data);
        let k = 128 << 10;
        assert_eq!(
            offsets,
            vec![
                (0, false, false),
                (k, false, false),
                (2 * k, true, sqflow_off)
            ]
        );
        assert_eq!(matches!(out.last(), Some(Pdu::CapsuleResp(_))), !sqflow_off);
        // A failed read has no data PDU, only its status.
        h.send(&[capsule(
            rw(nvm::READ, 4, 0, 1, sgl::TRANSPORT),
            Bytes::new(),
        )]);
        let out = h.complete(4, Status::READ_ERROR, None);
        assert_eq!(out.len(), 1);
        assert_eq!(cqe(&out).status, Status::READ_ERROR);
    }
}

/// The transport's own read path (sendfile, or straight from the volume)
/// produces byte for byte what `complete` with the data would.
#[test]
fn read_pdus_match_complete_with_data() {
    for d in [
        Digests::default(),
        Digests {
            header: true,
            data: true,
        },
    ] {
        for max in [4096u32, 100_000, 1 << 20] {
            let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
            let mut a = Host::with(d, |c| c.max_c2h_data = max);
            let mut b = Host::with(d, |c| c.max_c2h_data = max);
            for h in [&mut a, &mut b] {
                h.connect(1, 31, 0);
                h.send(&[capsule(
                    rw(nvm::READ, 3, 0, 586, sgl::TRANSPORT),
                    Bytes::new(),
                )]);
            }
            let mut want = Vec::new();
            a.q.complete(
                3,
                Status::SUCCESS,
                0,
                Some(Bytes::from(data.clone())),
                &mut want,
            );
            let mut got = Vec::new();
            for (hdr, r) in b.q.read_pdus(3, data.len()) {
                got.extend_from_slice(hdr.bytes());
                got.extend_from_slice(&data[r.clone()]);
                if d.data {
                    got.extend_from_slice(&pdu::crc32c(&data[r]).to_le_bytes());
                }
            }
            b.q.read_sent(3, &mut got);
            assert_eq!(got, want, "digests {d:?}, max {max}");
            assert_eq!(b.q.outstanding(), 0);
        }
    }
}

#[test]
fn admin_and_fabrics_commands_go_where_they_belong() {
    let mut h = Host::new(Digests::default());
    h.connect(0, 31, 0);
    let prop = crate::fabrics::Property::get_sqe(5, crate::fabrics::reg::CAP, true);
    let (a, _) = h.send(&[capsule(prop, Bytes::new())]);
    assert_eq!(
        a,
        vec![Action::Admin {
            sqe: prop,
            data: Bytes::new()
        }]
    );
    // On an I/O queue, fabrics commands other than Connect/Disconnect are refused.
    let mut h = Host::new(Digests::default());
    h.connect(1, 31, 0);
    let (a, out) = h.send(&[capsule(prop, Bytes::new())]);
    assert!(a.is_empty());
    assert_eq!(cqe(&out).status, Status::INVALID_OPCODE.dnr());
    // Disconnect completes, then closes without an error.
    let (a, out) = h.send(&[capsule(crate::fabrics::disconnect_sqe(6), Bytes::new())]);
    assert_eq!(cqe(&out).cid, 6);
    assert_eq!(a, vec![Action::Close(None)]);
    assert_eq!(h.q.poll_timeout(), None);
}

#[test]
fn login_deadline_until_connected() {
    let mut h = Host::new(Digests::default());
    let deadline = h.t0 + Duration::from_secs(10);
    assert_eq!(h.q.poll_timeout(), Some(deadline));
    assert_eq!(
        h.q.handle_timeout(deadline - Duration::from_millis(1)),
        None
    );
    h.ic();
    assert_eq!(h.q.poll_timeout(), Some(deadline));
    assert_eq!(
        h.q.handle_timeout(deadline),
        Some(Action::Close(Some(QueueError::Fabric(FabricError::LoginTimeout))))
    );
    assert!(h.q.is_closed());
    // Connected in time: no login deadline; an I/O queue has no timer at all.
    let mut h = Host::new(Digests::default());
    h.connect(1, 31, 0);
    assert_eq!(h.q.poll_timeout(), None);
    assert_eq!(h.q.handle_timeout(deadline + Duration::from_secs(60)), None);
}

#[test]
fn admin_queue_enforces_keep_alive_with_any_command_as_traffic() {
    let mut h = Host::new(Digests::default());
    h.connect(0, 31, 0);
    let t0 = h.t0;
    let ms = |n| t0 + Duration::from_millis(n);
    assert_eq!(h.q.poll_timeout(), Some(ms(1001)));
    // Traffic at 900 ms (here: a command on another queue of the controller).
    h.ka.touch(ms(900));
    assert_eq!(h.q.handle_timeout(ms(1001)), None);
    assert_eq!(h.q.poll_timeout(), Some(ms(1901)));
    // A command on this queue counts too.
    h.now = ms(1800);
    h.send(&[capsule(
        Sqe::new(crate::queue_entry::admin::KEEP_ALIVE, 1, 0),
        Bytes::new(),
    )]);
    assert_eq!(h.q.poll_timeout(), Some(ms(2801)));
    assert_eq!(
        h.q.handle_timeout(ms(2801)),
        Some(Action::Close(Some(QueueError::Fabric(FabricError::KeepAliveExpired(1000)))))
    );
}

#[test]
fn data_digest_errors() {
    let d = Digests {
        header: true,
        data: true,
    };
    let mut h = Host::new(d);
    h.connect(1, 31, 0);
    // A capsule with bad in-capsule data: only that command fails.
    let mut b = Vec::new();
    capsule(
        rw(nvm::WRITE, 4, 0, 1, sgl::INCAPSULE),
        Bytes::from(vec![5u8; 512]),
    )
    .encode_into(d, &mut b);
    let n = b.len();
    b[n - 1] ^= 0xFF;
    let (a, out) = h.bytes(&b);
    assert!(a.is_empty());
    let c = cqe(&out);
    assert_eq!((c.cid, c.status), (4, Status::TRANSIENT_TRANSPORT));
    assert!(!h.q.is_closed());
    // Bad H2CData: the queue closes.
    h.send(&[capsule(
        rw(nvm::WRITE, 5, 0, 8, sgl::TRANSPORT),
        Bytes::new(),
    )]);
    let mut b = Vec::new();
    h2c(5, 5, 0, vec![1; 4096], true).encode_into(d, &mut b);
    let n = b.len();
    b[n - 1] ^= 0xFF;
    let (a, _) = h.bytes(&b);
    assert!(matches!(
        closed(&a),
        Some(QueueError::Malformed(PduError::DataDigest { .. }))
    ));
    // A header digest error is fatal with a TermReq.
    let mut h = Host::new(d);
    h.connect(1, 31, 0);
    let mut b = Vec::new();
    capsule(Sqe::new(nvm::FLUSH, 1, 1), Bytes::new()).encode_into(d, &mut b);
    b[pdu::CMD_HLEN] ^= 1;
    let (_, out) = h.bytes(&b);
    assert_eq!(term(&out).0, fes::HEADER_DIGEST_ERROR);
}

#[test]
fn term_req_and_unexpected_pdus_close() {
    let mut h = Host::new(Digests::default());
    h.connect(1, 31, 0);
    let (a, out) = h.send(&[Pdu::H2CTermReq(TermReq {
        fes: 2,
        fei: 0,
        data: Bytes::new(),
    })]);
    assert!(out.is_empty());
    assert_eq!(
        closed(&a),
        Some(QueueError::HostTerminated { fes: 2, fei: 0 })
    );
    // Nothing is taken after the close.
    let (a, out) = h.send(&[capsule(Sqe::new(nvm::FLUSH, 1, 1), Bytes::new())]);
    assert!(a.is_empty() && out.is_empty());
    let mut h = Host::new(Digests::default());
    h.connect(1, 31, 0);
    let (a, out) = h.send(&[Pdu::R2T(R2t {
        cid: 1,
        ttag: 1,
        offset: 0,
        length: 4,
    })]);
    assert_eq!(term(&out), (fes::INVALID_HEADER_FIELD, 0));
    assert_eq!(closed(&a), Some(QueueError::UnexpectedPdu(pdu::kind::R2T)));
}

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Arbitrary bytes after a good login never panic, and whatever the
        /// queue sends back is a well-formed PDU stream.
        #[test]
        fn arbitrary_input_after_login(bytes in proptest::collection::vec(any::<u8>(), 0..3000), hd in any::<bool>()) {
            let mut h = Host::new(Digests { header: hd, data: false });
            h.connect(1, 7, 0);
            let (acts, _) = h.bytes(&bytes);
            // Complete whatever ran, in reverse, as a transport might.
            for a in acts.iter().rev() {
                if let Action::Io { sqe, .. } = a {
                    h.complete(sqe.cid(), Status::SUCCESS, None);
                }
            }
        }

        /// A stream of well-formed commands with random fields: the queue's
        /// accounting stays consistent.
        #[test]
        fn random_commands(cmds in proptest::collection::vec((any::<u8>(), 0u16..16, any::<u32>(), 0u32..64, any::<bool>()), 1..40)) {
            let mut h = Host::new(Digests::default());
            h.connect(1, 15, 0);
            for (op, cid, len, blocks, incapsule) in cmds {
                let mut s = Sqe::new(op, cid, 1);
                s.set_rw(0, blocks.max(1));
                let data = if incapsule { Bytes::from(vec![0u8; (len % 20000) as usize]) } else { Bytes::new() };
                s.set_sgl(Sgl { addr: 0, length: if incapsule { data.len() as u32 } else { len % (2 << 20) }, kind: if incapsule { sgl::INCAPSULE } else { sgl::TRANSPORT } });
                let (acts, _) = h.send(&[capsule(s, data)]);
                if h.q.is_closed() {
                    break;
                }
                for a in acts {
                    if let Action::Io { sqe, .. } = a {
                        h.complete(sqe.cid(), Status::SUCCESS, None);
                    }
                }
                prop_assert!(h.q.outstanding() <= 16);
                prop_assert!(h.q.granted_bytes() <= R2T_BUDGET);
            }
        }
    }
}

mod auth {
    //! DH-HMAC-CHAP as part of the queue's login: our host's state machine
    //! against the queue, through capsules.
    use super::*;
    use crate::auth::host::RECEIVE_LEN;
    use crate::auth::{AuthConfig, HostAction, HostAuth, Secret};

    fn key(fill: u8) -> Secret {
        let k: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(fill) ^ fill).collect();
        Secret::from_key(&k, None).unwrap()
    }

    fn entropy(seed: u8) -> Entropy {
        Entropy {
            bytes: core::array::from_fn(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)),
            seqnum: 1000 + seed as u32,
        }
    }

    fn ctrl_cfg() -> Arc<AuthConfig> {
        Arc::new(AuthConfig::new(key(5), None))
    }

    /// ICReq and a Connect whose host must authenticate.
    fn connect_with_auth(h: &mut Host, qid: u16) -> Cqe {
        h.ic();
        let (a, _) = h.connect_action(qid, 31, 0);
        let [Action::Connect { cid, .. }] = a[..] else {
            panic!("expected Connect, got {a:?}")
        };
        let c = Connected {
            result: CNTLID,
            keep_alive: h.ka.clone(),
            subsystem: Some(Arc::new(crate::LiveSubsystem::new(h.sub.clone()))),
            hostnqn: "nqn.t:h".into(),
            auth: Some(ControllerAuth::new(ctrl_cfg(), "nqn.t:h", "nqn.t:s")),
        };
        let mut tx = Vec::new();
        h.q.connected(cid, c, h.now, &mut tx);
        cqe(&h.decode(tx))
    }

    /// Run our host's side over the queue; the last actions and PDUs seen.
    fn authenticate(h: &mut Host, host_key: Secret, qid: u16) -> (Vec<Action>, Vec<Pdu>) {
        let cfg = Arc::new(AuthConfig::new(host_key, None));
        let mut ha = HostAuth::new(cfg, "nqn.t:h", "nqn.t:s", qid, entropy(1));
        let mut act = ha.start();
        let mut last = (vec![], vec![]);
        for _ in 0..10 {
            act = match act {
                HostAction::Send(b) => {
                    let mut s = crate::auth::message::AuthCommand::send_sqe(40, b.len() as u32);
                    s.set_sgl(Sgl {
                        addr: 0,
                        length: b.len() as u32,
                        kind: sgl::INCAPSULE,
                    });
                    let (a, out) = h.send(&[capsule(s, Bytes::from(b.clone()))]);
                    assert!(
                        out.is_empty(),
                        "Auth Send answered before its entropy: {out:?}"
                    );
                    let [Action::AuthSend { sqe, data }] = &a[..] else {
                        panic!("expected AuthSend, got {a:?}")
                    };
                    let mut tx = Vec::new();
                    let a = h.q.auth_send(sqe, data, entropy(2), &mut tx);
                    let out = h.decode(tx);
                    assert_eq!(cqe(&out).status, Status::SUCCESS);
                    last = (a.into_iter().collect(), out);
                    ha.sent()
                }
                HostAction::Receive => {
                    let mut s = crate::auth::message::AuthCommand::receive_sqe(41, RECEIVE_LEN);
                    s.set_sgl(Sgl {
                        addr: 0,
                        length: RECEIVE_LEN,
                        kind: sgl::TRANSPORT,
                    });
                    let (a, out) = h.send(&[capsule(s, Bytes::new())]);
                    let data = match &out[..] {
                        [Pdu::C2HData(d), Pdu::CapsuleResp(c)] if c.status.is_success() => {
                            d.data.clone()
                        }
                        _ => return (a, out),
                    };
                    last = (a, out);
                    ha.received(&data)
                }
                HostAction::Done | HostAction::Failed { .. } => return last,
            };
        }
        panic!("the exchange did not end")
    }

    #[test]
    fn connect_asks_for_authentication_and_commands_wait_for_it() {
        let mut h = Host::new(Digests::default());
        let deadline = h.t0 + Duration::from_secs(10);
        let c = connect_with_auth(&mut h, 1);
        assert!(c.status.is_success());
        assert_eq!(c.result, CNTLID | crate::fabrics::AUTHREQ_ATR as u64);
        assert!(h.q.awaiting_auth());
        // A read, and a write whose data is not even asked for (no R2T).
        let (a, out) = h.send(&[capsule(
            rw(nvm::READ, 1, 0, 8, sgl::TRANSPORT),
            Bytes::new(),
        )]);
        assert!(a.is_empty());
        assert_eq!(cqe(&out).status, Status::AUTH_REQUIRED.dnr());
        let (a, out) = h.send(&[capsule(
            rw(nvm::WRITE, 2, 0, 64, sgl::TRANSPORT),
            Bytes::new(),
        )]);
        assert!(a.is_empty());
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(cqe(&out).status, Status::AUTH_REQUIRED.dnr());
        // The login deadline stays armed, and names what was missing.
        assert_eq!(h.q.poll_timeout(), Some(deadline));
        assert_eq!(
            h.q.handle_timeout(deadline),
            Some(Action::Close(Some(QueueError::Fabric(FabricError::AuthTimeout))))
        );
    }

    #[test]
    fn authenticated_queue_runs_commands_and_drops_the_login_deadline() {
        for qid in [0, 1] {
            let mut h = Host::new(Digests::default());
            let deadline = h.t0 + Duration::from_secs(10);
            connect_with_auth(&mut h, qid);
            // An exchange slower than KATO (1 s here; ffdhe8192 on an
            // emulated CPU takes several): the keep-alive does not run
            // while the host authenticates...
            h.now += Duration::from_millis(3000);
            assert_eq!(h.q.handle_timeout(h.now), None);
            let (a, _) = authenticate(&mut h, key(5), qid);
            // The transport hears once that the login is over.
            assert_eq!(a, vec![Action::Authenticated]);
            // ...and starts when it succeeded, as nvmet's starts when the
            // controller is enabled.
            let started = h.now + Duration::from_millis(1001);
            assert_eq!(h.ka.deadline(), Some(started));
            assert_eq!(h.q.handle_timeout(h.now), None);
            if qid == 0 {
                assert_eq!(h.q.poll_timeout(), Some(started));
            }
            assert!(!h.q.awaiting_auth());
            assert_ne!(h.q.poll_timeout(), Some(deadline));
            let (a, _) = h.send(&[capsule(
                rw(nvm::READ, 1, 0, 8, sgl::TRANSPORT),
                Bytes::new(),
            )]);
            let want = if qid == 0 { "Admin" } else { "Io" };
            assert!(
                format!("{a:?}").starts_with(&format!("[{want} ")),
                "qid {qid}: {a:?}"
            );
            // Only the admin queue's keep-alive can end it now.
            let later = h.q.handle_timeout(deadline);
            if qid == 0 {
                assert!(
                    matches!(
                        later,
                        Some(Action::Close(Some(QueueError::Fabric(FabricError::KeepAliveExpired(_)))))
                    ),
                    "{later:?}"
                );
            } else {
                assert_eq!(later, None);
            }
        }
    }

    #[test]
    fn wrong_secret_closes_the_queue_with_the_reason() {
        let mut h = Host::new(Digests::default());
        connect_with_auth(&mut h, 0);
        let (a, out) = authenticate(&mut h, key(6), 0);
        // The host read its Failure1, then the queue closed.
        assert!(
            matches!(out[..], [Pdu::C2HData(_), Pdu::CapsuleResp(_)]),
            "{out:?}"
        );
        match closed(&a) {
            Some(QueueError::Fabric(FabricError::AuthFailed { hostnqn, why, .. })) => {
                assert_eq!(hostnqn, "nqn.t:h");
                assert!(why.contains("does not match"), "{why}");
            }
            e => panic!("expected AuthFailed, got {e:?}"),
        }
        assert!(h.q.is_closed());
    }

    #[test]
    fn auth_commands_without_authentication_configured_are_refused() {
        let mut h = Host::new(Digests::default());
        h.connect(1, 31, 0);
        let mut s = crate::auth::message::AuthCommand::receive_sqe(9, 64);
        s.set_sgl(Sgl {
            addr: 0,
            length: 64,
            kind: sgl::TRANSPORT,
        });
        let (a, out) = h.send(&[capsule(s, Bytes::new())]);
        assert!(a.is_empty());
        assert_eq!(cqe(&out).status, Status::INVALID_OPCODE.dnr());
    }
}

/// A host NQN comes from the wire: a newline in it must not start a
/// forged line in the target's log.
#[test]
fn names_from_the_wire_are_escaped_in_errors() {
    let e = QueueError::Fabric(FabricError::AuthFailed {
        hostnqn: "nqn.t:h\n[INFO] forged".into(),
        why: "the host's response does not match its secret".into(),
        reason: FailureReason::FAILED,
    });
    let s = e.to_string();
    assert!(!s.contains('\n'), "{s}");
    assert!(s.contains(r"nqn.t:h\n[INFO] forged"), "{s}");
}
