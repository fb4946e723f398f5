use super::*;
use crate::fabric_queue::FabricError;
use crate::auth::ControllerAuth;
use crate::controller::KeepAlive;
use crate::fabrics::{Connect, ConnectData};
use crate::queue_entry::sgl;
use crate::subsystem::LiveSubsystem;
use std::sync::Arc;
use crate::queue_entry::{nvm, Sgl};
use crate::subsystem::{Namespace, Subsystem};
use bw_block::{BackendSpec, Volume};
use std::time::Duration;

fn shape(qid: u16, sq_entries: u16) -> Shape {
    Shape { qid, sq_entries, rq_entries: sq_entries }
}

fn keyed(addr: u64, length: u32, key: u32, invalidate: bool) -> Keyed {
    Keyed { addr, length, key, invalidate }
}

fn cqe_of(p: &Post) -> Cqe {
    match p {
        Post::Send { cqe, .. } => Cqe::parse(cqe),
        other => panic!("not a SEND: {other:?}"),
    }
}

fn subsystem() -> Arc<LiveSubsystem> {
    let v = Volume::open("v", &BackendSpec::ram(1 << 20)).unwrap();
    Arc::new(LiveSubsystem::new(Arc::new(Subsystem {
        nqn: "nqn.t:s".into(),
        serial: "s".into(),
        model: "m".into(),
        namespaces: vec![Namespace::new("nqn.t:s", 1, v, false)],
        allowed_hosts: vec![],
        ana: Default::default(),
    })))
}

fn connect_sqe(qid: u16, sqsize: u16, sgl: Keyed) -> Sqe {
    let mut s = Connect { recfmt: 0, qid, sqsize, cattr: 0, kato_ms: 0 }.to_sqe(1);
    s.set_keyed_sgl(sgl);
    s
}

fn connect_data() -> Bytes {
    let d = ConnectData { hostid: [1; 16], cntlid: 0xFFFF, subnqn: "nqn.t:s".into(), hostnqn: "nqn.h:1".into() };
    Bytes::from(d.encode())
}

/// A queue through its Connect (fetched with RDMA READ), connected as
/// controller 5.
fn connected(qid: u16, entries: u16) -> RdmaQueue {
    let now = Instant::now();
    let mut q = RdmaQueue::new(shape(qid, entries), now + Duration::from_secs(10));
    let mut out = Vec::new();
    let k = keyed(0x1000, 1024, 77, false);
    let a = q.capsule(&connect_sqe(qid, entries - 1, k).0, now, &mut out);
    assert_eq!((a, out.pop()), (None, Some(Post::Read { cid: 1, from: k })));
    let Some(Action::Connect { cid, connect, data }) = q.fetched(1, connect_data(), &mut out) else { panic!("no Connect") };
    assert_eq!((cid, connect.qid, data.hostnqn.as_str()), (1, qid, "nqn.h:1"));
    let ka = Arc::new(KeepAlive::new(0, now));
    q.connected(1, Connected { result: 5, keep_alive: ka, subsystem: Some(subsystem()), hostnqn: "nqn.t:h".into(), auth: None }, now, &mut out);
    assert_eq!(out.len(), 1);
    let c = cqe_of(&out[0]);
    assert_eq!((c.cid, c.status, c.result, c.sq_id, c.sq_head), (1, Status::SUCCESS, 5, qid, 1));
    assert!(q.is_connected());
    q
}

#[test]
fn cm_private_data_layout_and_checks() {
    let r = cm::Request { recfmt: 0, qid: 2, hrqsize: 128, hsqsize: 127, cntlid: 9 };
    let b = r.encode();
    assert_eq!(&b[..10], &[0, 0, 2, 0, 128, 0, 127, 0, 9, 0]);
    assert_eq!(cm::Request::parse(&b), Some(r));
    assert_eq!(cm::check_request(&b), Ok(Shape { qid: 2, sq_entries: 128, rq_entries: 128 }));
    assert_eq!(cm::check_request(&b[..16]), Err(cm::reject::INVALID_LEN));
    let bad = |f: fn(&mut cm::Request)| {
        let mut r = r;
        f(&mut r);
        cm::check_request(&r.encode())
    };
    assert_eq!(bad(|r| r.recfmt = 1), Err(cm::reject::INVALID_RECFMT));
    assert_eq!(bad(|r| r.qid = 1000), Err(cm::reject::INVALID_QID));
    assert_eq!(bad(|r| r.hsqsize = 0), Err(cm::reject::INVALID_HSQSIZE));
    assert_eq!(bad(|r| r.hsqsize = 1023), Err(cm::reject::INVALID_HSQSIZE));
    assert_eq!(bad(|r| r.hrqsize = 100), Err(cm::reject::INVALID_HRQSIZE));
    assert_eq!(cm::accept(128)[..4], [0, 0, 128, 0]);
    assert_eq!(cm::parse_accept(&cm::accept(32)), Some(32));
    assert_eq!(cm::parse_reject(&cm::reject(cm::reject::INVALID_HSQSIZE)), Some(4));
}

#[test]
fn connect_must_match_the_cm_request() {
    let now = Instant::now();
    let mut out = Vec::new();
    // SQSIZE other than the request's HSQSIZE: refused, the queue stays open.
    let mut q = RdmaQueue::new(shape(0, 32), now + Duration::from_secs(10));
    let k = keyed(0x1000, 1024, 77, false);
    assert_eq!(q.capsule(&connect_sqe(0, 63, k).0, now, &mut out), None);
    assert!(matches!(out.pop(), Some(Post::Read { .. })));
    assert_eq!(q.fetched(1, connect_data(), &mut out), None);
    let c = cqe_of(&out[0]);
    assert_eq!((c.status, c.result), (Status::CONNECT_INVALID_PARAM.dnr(), fabrics::CS_SQSIZE as u64));
    assert!(!q.is_closed() && !q.is_connected());
    // Another queue ID than the connection's: the queue closes.
    let mut q = RdmaQueue::new(shape(1, 32), now + Duration::from_secs(10));
    q.capsule(&connect_sqe(2, 31, k).0, now, &mut out);
    assert!(matches!(q.fetched(1, connect_data(), &mut out), Some(Action::Close(Some(RdmaQueueError::QueueIdMismatch { .. })))));
}

#[test]
fn commands_before_connect_and_overflow_close_the_queue() {
    let now = Instant::now();
    let mut out = Vec::new();
    let mut q = RdmaQueue::new(shape(1, 4), now + Duration::from_secs(10));
    let a = q.capsule(&Sqe::new(nvm::FLUSH, 3, 1).0, now, &mut out);
    assert!(matches!(a, Some(Action::Close(Some(RdmaQueueError::Fabric(FabricError::NotConnected(_)))))));
    let mut q = RdmaQueue::new(shape(1, 4), now + Duration::from_secs(10));
    assert!(matches!(q.capsule(&[0u8; 40], now, &mut out), Some(Action::Close(Some(RdmaQueueError::ShortCapsule(40))))));
    let mut q = connected(1, 4);
    for cid in 10..14 {
        let mut s = Sqe::new(nvm::READ, cid, 1);
        s.set_rw(0, 1);
        s.set_keyed_sgl(keyed(0, 512, 1, false));
        assert!(matches!(q.capsule(&s.0, now, &mut out), Some(Action::Io { .. })));
    }
    let mut s = Sqe::new(nvm::READ, 20, 1);
    s.set_keyed_sgl(keyed(0, 512, 1, false));
    assert!(matches!(q.capsule(&s.0, now, &mut out), Some(Action::Close(Some(RdmaQueueError::Fabric(FabricError::QueueOverflow { .. }))))));
    // A login that never comes ends at the deadline.
    let mut q = RdmaQueue::new(shape(1, 4), now + Duration::from_secs(1));
    assert_eq!(q.poll_timeout(), Some(now + Duration::from_secs(1)));
    assert_eq!(q.handle_timeout(now + Duration::from_secs(2)), Some(Action::Close(Some(RdmaQueueError::Fabric(FabricError::LoginTimeout)))));
}

#[test]
fn read_result_is_written_before_the_completion() {
    let now = Instant::now();
    let mut q = connected(1, 8);
    let mut out = Vec::new();
    let mut s = Sqe::new(nvm::READ, 4, 1);
    s.set_rw(0, 8);
    let k = keyed(0xABC000, 4096, 0x55, true);
    s.set_keyed_sgl(k);
    assert!(matches!(q.capsule(&s.0, now, &mut out), Some(Action::Io { .. })));
    q.complete(4, Status::SUCCESS, 0, Some(Bytes::from(vec![7u8; 4096])), &mut out);
    assert_eq!(out.len(), 2);
    assert!(matches!(&out[0], Post::Write { to, data } if *to == k && data.len() == 4096));
    assert!(matches!(&out[1], Post::Send { invalidate: Some(0x55), .. }));
    assert_eq!(cqe_of(&out[1]).status, Status::SUCCESS);
    // A result longer than the host's buffer fails the command instead.
    out.clear();
    s.set_cid(5);
    s.set_keyed_sgl(keyed(0xABC000, 512, 0x55, false));
    q.capsule(&s.0, now, &mut out);
    q.complete(5, Status::SUCCESS, 0, Some(Bytes::from(vec![7u8; 4096])), &mut out);
    assert_eq!(out.len(), 1);
    assert_eq!(cqe_of(&out[0]).status, Status::SGL_INVALID_DATA.dnr());
}

#[test]
fn write_data_is_fetched_or_in_the_capsule() {
    let now = Instant::now();
    let mut q = connected(1, 8);
    let mut out = Vec::new();
    // Keyed: fetched with RDMA READ, then run.
    let mut s = Sqe::new(nvm::WRITE, 6, 1);
    s.set_rw(8, 8);
    let k = keyed(0x2000, 4096, 9, false);
    s.set_keyed_sgl(k);
    assert_eq!(q.capsule(&s.0, now, &mut out), None);
    assert_eq!(out.pop(), Some(Post::Read { cid: 6, from: k }));
    let a = q.fetched(6, Bytes::from(vec![1u8; 4096]), &mut out);
    assert!(matches!(a, Some(Action::Io { sqe, data }) if sqe.cid() == 6 && data.len() == 4096));
    // In the capsule: offset descriptor of exactly the data's length.
    let mut s = Sqe::new(nvm::WRITE, 7, 1);
    s.set_rw(0, 1);
    s.set_sgl(Sgl { addr: 0, length: 512, kind: sgl::INCAPSULE });
    let mut capsule = s.0.to_vec();
    capsule.extend_from_slice(&[3u8; 512]);
    assert!(matches!(q.capsule(&capsule, now, &mut out), Some(Action::Io { data, .. }) if data.len() == 512));
    // A transport SGL (NVMe/TCP's) is not this transport's: the command fails.
    let mut s = Sqe::new(nvm::WRITE, 8, 1);
    s.set_rw(0, 1);
    s.set_sgl(Sgl { addr: 0, length: 512, kind: sgl::TRANSPORT });
    assert_eq!(q.capsule(&s.0, now, &mut out), None);
    assert_eq!(cqe_of(out.last().unwrap()).status, Status::SGL_INVALID_TYPE.dnr());
    // Longer than MDTS: refused before anything is fetched.
    let mut s = Sqe::new(nvm::WRITE, 9, 1);
    s.set_keyed_sgl(keyed(0, MAX_TRANSFER + 512, 9, false));
    assert_eq!(q.capsule(&s.0, now, &mut out), None);
    assert_eq!(cqe_of(out.last().unwrap()).status, Status::INVALID_FIELD.dnr());
}

#[test]
fn disconnect_completes_then_closes() {
    let now = Instant::now();
    let mut q = connected(1, 8);
    let mut out = Vec::new();
    let mut s = fabrics::disconnect_sqe(3);
    s.set_keyed_sgl(keyed(0, 0, 0, false));
    assert_eq!(q.capsule(&s.0, now, &mut out), Some(Action::Close(None)));
    assert_eq!(cqe_of(&out[0]).status, Status::SUCCESS);
}

/// DH-HMAC-CHAP on an RDMA queue: our host's state machine against the
/// queue, Auth Send in the capsule, Auth Receive through the host's buffer.
mod auth {
    use super::*;
    use crate::auth::host::RECEIVE_LEN;
    use crate::auth::message::AuthCommand;
    use crate::auth::{AuthConfig, HostAction, HostAuth, Secret};

    fn key() -> Secret {
        let k: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(5) ^ 5).collect();
        Secret::from_key(&k, None).unwrap()
    }

    fn entropy(seed: u8) -> Entropy {
        Entropy { bytes: core::array::from_fn(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)), seqnum: 1000 + seed as u32 }
    }

    /// A queue whose host must authenticate, through its Connect.
    fn connect_with_auth(qid: u16, now: Instant, deadline: Instant) -> RdmaQueue {
        let mut q = RdmaQueue::new(shape(qid, 32), deadline);
        let mut out = Vec::new();
        let k = keyed(0x1000, 1024, 77, false);
        q.capsule(&connect_sqe(qid, 31, k).0, now, &mut out);
        assert!(matches!(out.pop(), Some(Post::Read { cid: 1, .. })));
        let Some(Action::Connect { cid, .. }) = q.fetched(1, connect_data(), &mut out) else { panic!("no Connect") };
        let auth = ControllerAuth::new(Arc::new(AuthConfig::new(key(), None)), "nqn.h:1", "nqn.t:s");
        let c = Connected { result: 5, keep_alive: Arc::new(KeepAlive::new(1000, now)), subsystem: Some(subsystem()), hostnqn: "nqn.t:h".into(), auth: Some(auth) };
        q.connected(cid, c, now, &mut out);
        let c = cqe_of(&out[0]);
        assert_eq!((c.status, c.result), (Status::SUCCESS, 5 | fabrics::AUTHREQ_ATR as u64));
        q
    }

    #[test]
    fn commands_wait_for_authentication_and_the_login_deadline_stays() {
        let now = Instant::now();
        let deadline = now + Duration::from_secs(10);
        let mut q = connect_with_auth(1, now, deadline);
        assert!(q.awaiting_auth());
        let mut out = Vec::new();
        // A write whose data is not even fetched.
        let mut w = Sqe::new(nvm::WRITE, 2, 1);
        w.set_rw(0, 8);
        w.set_keyed_sgl(keyed(0x2000, 4096, 9, false));
        assert_eq!(q.capsule(&w.0, now, &mut out), None);
        assert_eq!(cqe_of(&out[0]).status, Status::AUTH_REQUIRED.dnr());
        assert_eq!(q.poll_timeout(), Some(deadline));
        assert_eq!(q.handle_timeout(deadline), Some(Action::Close(Some(RdmaQueueError::Fabric(FabricError::AuthTimeout)))));
    }

    #[test]
    fn an_exchange_logs_the_queue_in() {
        let now = Instant::now();
        let deadline = now + Duration::from_secs(10);
        let mut q = connect_with_auth(0, now, deadline);
        // The exchange runs longer than KATO (1 s): the keep-alive waits
        // for it and starts when it succeeded.
        let now = now + Duration::from_secs(3);
        assert_eq!(q.handle_timeout(now), None);
        let mut ha = HostAuth::new(Arc::new(AuthConfig::new(key(), None)), "nqn.h:1", "nqn.t:s", 0, entropy(1));
        let mut act = ha.start();
        let mut authenticated = false;
        for _ in 0..10 {
            let mut out = Vec::new();
            act = match act {
                HostAction::Send(b) => {
                    let mut s = AuthCommand::send_sqe(40, b.len() as u32);
                    s.set_sgl(Sgl { addr: 0, length: b.len() as u32, kind: sgl::INCAPSULE });
                    let capsule = [&s.0[..], &b].concat();
                    let Some(Action::AuthSend { sqe, data }) = q.capsule(&capsule, now, &mut out) else { panic!("no AuthSend") };
                    let a = q.auth_send(&sqe, &data, entropy(2), &mut out);
                    authenticated |= a == Some(Action::Authenticated);
                    assert_eq!(cqe_of(out.last().unwrap()).status, Status::SUCCESS);
                    ha.sent()
                }
                HostAction::Receive => {
                    let mut s = AuthCommand::receive_sqe(41, RECEIVE_LEN);
                    s.set_keyed_sgl(keyed(0x3000, RECEIVE_LEN, 11, false));
                    let a = q.capsule(&s.0, now, &mut out);
                    assert!(a.is_none() || a == Some(Action::Authenticated), "{a:?}");
                    authenticated |= a.is_some();
                    let [Post::Write { to, data }, send] = &out[..] else { panic!("expected data and completion: {out:?}") };
                    assert_eq!((to.addr, to.key), (0x3000, 11));
                    assert!(cqe_of(send).status.is_success());
                    ha.received(data)
                }
                HostAction::Done => break,
                HostAction::Failed { .. } => panic!("authentication failed"),
            };
        }
        assert!(authenticated && !q.awaiting_auth());
        // The login deadline is gone; the keep-alive runs from here.
        assert_eq!(q.poll_timeout(), Some(now + Duration::from_millis(1001)));
        assert_eq!(q.handle_timeout(now), None);
        let mut out = Vec::new();
        let a = q.capsule(&Sqe::new(crate::queue_entry::admin::IDENTIFY, 7, 0).0, now, &mut out);
        assert!(matches!(a, Some(Action::Admin { .. })), "{a:?}");
    }
}

mod fuzz {
    use proptest::prelude::*;

    proptest! {
        /// Capsules after a good Connect (see [`crate::fuzzing::rdma_queue`])
        /// whose fields are drawn so that most reach the data path: reads,
        /// writes, flushes, an opcode nobody has and a fabrics command, small LBA ranges, keyed or
        /// in-capsule descriptors whose length may or may not match.
        #[test]
        fn arbitrary_capsules_after_login(capsules in proptest::collection::vec((0u8..5, 0u16..40, 0u64..4, 0u32..9, any::<bool>(), 0u32..5000, 0u8..8), 1..48)) {
            use crate::queue_entry::{nvm, sgl, Keyed, Sgl};
            let mut input = Vec::new();
            for (op, cid, slba, nlb, keyed, len, odd) in capsules {
                // (0x7f: a fabrics command, here a Connect on a connected queue.)
                let opcode = [nvm::READ, nvm::WRITE, nvm::FLUSH, 0x7e, 0x7f][op as usize];
                // Mostly the length the blocks need.
                let len = if odd < 6 { nlb.max(1) * 512 } else { len };
                let mut s = crate::Sqe::new(opcode, cid, 1);
                s.set_rw(slba * 8, nlb.max(1));
                // Now and then, data that does not match the descriptor.
                let mut data = if keyed { 0 } else { len as usize % 8192 };
                if odd == 0 {
                    data = (data + 100) % 8192;
                }
                if keyed {
                    s.set_keyed_sgl(Keyed { addr: 0x1000, length: len, key: 7, invalidate: len % 2 == 0 });
                } else {
                    s.set_sgl(Sgl { addr: 0, length: len % 8192, kind: sgl::INCAPSULE });
                }
                let mut capsule = s.0.to_vec();
                capsule.resize(64 + data, 0xA5);
                input.extend_from_slice(&(capsule.len() as u16).to_le_bytes());
                input.extend_from_slice(&capsule);
            }
            crate::fuzzing::rdma_queue(&input);
        }

        #[test]
        fn arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..4000)) {
            crate::fuzzing::rdma_queue(&bytes);
        }
    }
}
