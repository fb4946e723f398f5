//! The core on its own, with a [`Wire`] that records what it is asked to
//! send: the behaviours both transports get from it, tested once here
//! (each transport's tests keep a check through its own framing).

use super::*;
use crate::auth::host::RECEIVE_LEN;
use crate::auth::{AuthConfig, HostAction, HostAuth, Secret};
use crate::queue_entry::{admin, nvm, Sgl};
use crate::subsystem::{Namespace, Subsystem};
use bw_block::{BackendSpec, Volume};
use std::time::Duration;

/// What the core asked the transport to send.
#[derive(Debug, Default)]
struct Recorder {
    /// Completions of commands the core counted, with their data.
    completed: Vec<(Cqe, Option<Bytes>)>,
    /// Completions of capsules it refused.
    refused: Vec<Cqe>,
}

impl Wire for Recorder {
    fn complete(&mut self, cqe: Cqe, data: Option<Bytes>) {
        self.completed.push((cqe, data));
    }
    fn refuse(&mut self, cqe: Cqe) {
        self.refused.push(cqe);
    }
}

impl Recorder {
    /// The one completion sent since the last call.
    fn one(&mut self) -> Cqe {
        let all = std::mem::take(&mut self.completed);
        let [(c, _)] = &all[..] else { panic!("expected one completion, got {all:?}") };
        *c
    }
}

type A = Action<FabricError>;

const CNTLID: u64 = 7;
const HOSTNQN: &str = "nqn.t:h";
const SUBNQN: &str = "nqn.t:s";

/// A core, a recorder and the clock, as a transport holds them.
struct Q {
    q: FabricQueue,
    w: Recorder,
    t0: Instant,
    now: Instant,
    ka: Arc<KeepAlive>,
}

fn live() -> Arc<LiveSubsystem> {
    let v = Volume::open("v", &BackendSpec::ram(1 << 20)).unwrap();
    Arc::new(LiveSubsystem::new(Arc::new(Subsystem {
        nqn: SUBNQN.into(),
        serial: "s".into(),
        model: "m".into(),
        namespaces: vec![Namespace::new(SUBNQN, 1, v, false)],
        allowed_hosts: vec![],
        ana: Default::default(),
    })))
}

fn connect_sqe(cid: u16, qid: u16, sqsize: u16) -> Sqe {
    Connect { recfmt: 0, qid, sqsize, cattr: 0, kato_ms: 1000 }.to_sqe(cid)
}

fn connect_data(hostnqn: &str) -> Bytes {
    let d = ConnectData { hostid: [1; 16], cntlid: 0xFFFF, subnqn: SUBNQN.into(), hostnqn: hostnqn.into() };
    Bytes::from(d.encode())
}

fn key(fill: u8) -> Secret {
    let k: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(fill) ^ fill).collect();
    Secret::from_key(&k, None).unwrap()
}

fn entropy(seed: u8) -> Entropy {
    Entropy { bytes: core::array::from_fn(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)), seqnum: 1000 + seed as u32 }
}

impl Q {
    /// A queue as NVMe/TCP starts one: its size unknown, one entry.
    fn new() -> Q {
        Q::with(0, 1)
    }
    fn with(qid: u16, sq_entries: u16) -> Q {
        let t0 = Instant::now();
        let s = Setup { transport: "test", qid, sq_entries, login_deadline: t0 + Duration::from_secs(10) };
        Q { q: FabricQueue::new(s), w: Recorder::default(), t0, now: t0, ka: Arc::new(KeepAlive::new(1000, t0)) }
    }

    /// A capsule whose data (if any) is here: admitted, then dispatched.
    fn send(&mut self, sqe: Sqe, data: Bytes) -> Option<A> {
        if let Some(why) = self.q.out_of_turn(&sqe) {
            return self.q.close(Some(why));
        }
        match self.q.admit(sqe.cid(), self.now, &mut self.w) {
            Ok(()) => self.q.dispatch(sqe, data, &mut self.w),
            Err(Refused::Answered) => None,
            Err(Refused::Fatal(why)) => self.q.close(Some(why)),
        }
    }

    /// Connect queue `qid`; `auth` when the host must authenticate.
    fn connect(&mut self, qid: u16, sqsize: u16, auth: bool) -> Cqe {
        let a = self.send(connect_sqe(1, qid, sqsize), connect_data(HOSTNQN));
        let Some(Action::Connect { cid, connect, data }) = a else { panic!("expected Connect, got {a:?}") };
        assert_eq!((cid, connect.qid, connect.sqsize, data.hostnqn.as_str()), (1, qid, sqsize, HOSTNQN));
        assert!(self.w.completed.is_empty(), "the transport answers the Connect");
        let auth = auth.then(|| ControllerAuth::new(Arc::new(AuthConfig::new(key(5), None)), HOSTNQN, SUBNQN));
        let c = Connected { result: CNTLID, keep_alive: self.ka.clone(), subsystem: Some(live()), hostnqn: "nqn.t:h".into(), auth };
        self.q.connected(cid, c, self.now, &mut self.w);
        assert!(self.q.is_connected());
        self.w.one()
    }

    /// Our host's side of DH-HMAC-CHAP over the core; every action the
    /// core handed out after an exchange step.
    fn authenticate(&mut self, host_key: Secret, qid: u16) -> Vec<A> {
        let mut ha = HostAuth::new(Arc::new(AuthConfig::new(host_key, None)), HOSTNQN, SUBNQN, qid, entropy(1));
        let mut act = ha.start();
        let mut seen = Vec::new();
        for _ in 0..10 {
            act = match act {
                HostAction::Send(b) => {
                    let mut s = AuthCommand::send_sqe(40, b.len() as u32);
                    s.set_sgl(Sgl { addr: 0, length: b.len() as u32, kind: sgl::INCAPSULE });
                    let a = self.send(s, Bytes::from(b));
                    let Some(Action::AuthSend { sqe, data }) = a else { panic!("expected AuthSend, got {a:?}") };
                    assert!(self.w.completed.is_empty(), "Auth Send answered before its entropy");
                    seen.extend(self.q.auth_send(&sqe, &data, entropy(2), &mut self.w));
                    assert_eq!(self.w.one().status, Status::SUCCESS);
                    ha.sent()
                }
                HostAction::Receive => {
                    let mut s = AuthCommand::receive_sqe(41, RECEIVE_LEN);
                    s.set_sgl(Sgl { addr: 0, length: RECEIVE_LEN, kind: sgl::TRANSPORT });
                    seen.extend(self.send(s, Bytes::new()));
                    let done = std::mem::take(&mut self.w.completed);
                    let [(c, Some(d))] = &done[..] else { panic!("expected one completion with data: {done:?}") };
                    assert!(c.status.is_success());
                    ha.received(d)
                }
                HostAction::Done | HostAction::Failed { .. } => return seen,
            };
            if self.q.is_closed() {
                return seen;
            }
        }
        panic!("the exchange did not end")
    }
}

fn read(cid: u16) -> Sqe {
    let mut s = Sqe::new(nvm::READ, cid, 1);
    s.set_rw(0, 8);
    s
}

fn write(cid: u16) -> Sqe {
    let mut s = Sqe::new(nvm::WRITE, cid, 1);
    s.set_rw(0, 8);
    s.set_sgl(Sgl { addr: 0, length: 4096, kind: sgl::TRANSPORT });
    s
}

#[test]
fn only_a_connect_may_come_before_the_queue_is_connected() {
    let q = Q::new();
    assert_eq!(q.q.out_of_turn(&read(1)), Some(FabricError::NotConnected("a command other than Connect")));
    assert_eq!(q.q.out_of_turn(&Sqe::new(admin::IDENTIFY, 1, 0)), Some(FabricError::NotConnected("a command other than Connect")));
    assert_eq!(q.q.out_of_turn(&connect_sqe(1, 0, 31)), None);
    let mut q = Q::new();
    q.connect(0, 31, false);
    assert_eq!(q.q.out_of_turn(&read(2)), None);
}

#[test]
fn connect_binds_the_queue_and_completes_with_the_controller() {
    let mut q = Q::with(0, 1);
    let c = q.connect(3, 15, false);
    // The Connect was the first entry of a queue of 16.
    assert_eq!((c.cid, c.status, c.result, c.sq_id, c.sq_head), (1, Status::SUCCESS, CNTLID, 3, 1));
    assert_eq!((q.q.qid(), q.q.cntlid(), q.q.outstanding()), (3, CNTLID as u16, 0));
    assert_eq!(q.q.connect().map(|c| c.sqsize), Some(15));
    // The submission queue head wraps at the Connect's size.
    for cid in 10..25 {
        assert!(matches!(q.send(read(cid), Bytes::new()), Some(Action::Io { .. })));
        q.q.complete(cid, Status::SUCCESS, 0, None, &mut q.w);
        assert_eq!(q.w.one().sq_head, ((cid - 10 + 2) % 16));
    }
    // A second Connect on a connected queue is out of sequence.
    assert_eq!(q.send(connect_sqe(30, 3, 15), connect_data(HOSTNQN)), None);
    assert_eq!(q.w.one().status, Status::CMD_SEQ_ERROR);
}

#[test]
fn connect_fields_are_checked_before_the_transport_sees_them() {
    let mut q = Q::new();
    // SQSIZE 0 is refused with where the bad field is.
    assert_eq!(q.send(connect_sqe(1, 0, 0), connect_data(HOSTNQN)), None);
    let c = q.w.one();
    assert_eq!((c.status, c.result), (Status::CONNECT_INVALID_PARAM.dnr(), fabrics::ipo_sqe(fabrics::CS_SQSIZE)));
    // A host NQN longer than NQNs may be.
    assert_eq!(q.send(connect_sqe(1, 0, 31), connect_data(&"h".repeat(fabrics::NQN_MAX_LEN + 1))), None);
    let c = q.w.one();
    assert_eq!((c.status, c.result), (Status::CONNECT_INVALID_PARAM.dnr(), fabrics::ipo_data(fabrics::CD_HOSTNQN)));
    // Connect data too short to hold the NQNs.
    assert_eq!(q.send(connect_sqe(1, 0, 31), Bytes::from_static(&[0; 100])), None);
    assert_eq!(q.w.one().status, Status::SGL_INVALID_DATA.dnr());
    assert!(!q.q.is_connected() && !q.q.is_closed());
}

#[test]
fn a_refused_connect_may_be_tried_again_and_one_at_a_time() {
    let mut q = Q::with(0, 4);
    let a = q.send(connect_sqe(1, 0, 31), connect_data(HOSTNQN));
    assert!(matches!(a, Some(Action::Connect { cid: 1, .. })));
    // While the transport decides, another Connect is out of sequence.
    assert_eq!(q.send(connect_sqe(2, 0, 31), connect_data(HOSTNQN)), None);
    assert_eq!(q.w.one().status, Status::CMD_SEQ_ERROR);
    q.q.connect_refused(1, Status::CONNECT_INVALID_HOST.dnr(), 0, &mut q.w);
    assert_eq!(q.w.one().status, Status::CONNECT_INVALID_HOST.dnr());
    assert!(!q.q.is_connected() && q.q.connect().is_none());
    // A late success for the refused Connect changes nothing.
    let c = Connected { result: CNTLID, keep_alive: q.ka.clone(), subsystem: None, hostnqn: "nqn.t:h".into(), auth: None };
    q.q.connected(1, c, q.now, &mut q.w);
    assert!(!q.q.is_connected() && q.w.completed.is_empty());
    assert!(matches!(q.send(connect_sqe(3, 0, 31), connect_data(HOSTNQN)), Some(Action::Connect { cid: 3, .. })));
}

#[test]
fn more_commands_than_queue_entries_close_the_queue() {
    let mut q = Q::new();
    q.connect(1, 3, false);
    for cid in 0..4 {
        assert!(matches!(q.send(read(cid), Bytes::new()), Some(Action::Io { .. })));
    }
    assert_eq!(q.send(read(9), Bytes::new()), Some(Action::Close(Some(FabricError::QueueOverflow { outstanding: 5, entries: 4 }))));
    assert!(q.q.is_closed() && q.q.poll_timeout().is_none());
    // Before the Connect the queue holds what the transport set up: one
    // entry for NVMe/TCP, the Connect itself.
    let mut q = Q::new();
    assert!(q.send(connect_sqe(1, 0, 31), connect_data(HOSTNQN)).is_some());
    assert!(matches!(q.q.admit(2, q.now, &mut q.w), Err(Refused::Fatal(FabricError::QueueOverflow { entries: 1, .. }))));
}

#[test]
fn a_command_id_in_flight_is_not_taken_twice() {
    let mut q = Q::new();
    q.connect(1, 31, false);
    assert!(matches!(q.send(read(5), Bytes::new()), Some(Action::Io { .. })));
    assert_eq!(q.q.admit(5, q.now, &mut q.w), Err(Refused::Answered));
    // Refused, not completed: the transport keeps what it holds for the first.
    assert_eq!(q.w.refused.len(), 1);
    assert_eq!(q.w.refused[0].status, Status::CMDID_CONFLICT.dnr());
    assert!(q.w.completed.is_empty());
    assert_eq!(q.q.outstanding(), 1);
    q.q.complete(5, Status::SUCCESS, 0, Some(Bytes::from_static(b"x")), &mut q.w);
    let done = std::mem::take(&mut q.w.completed);
    assert!(matches!(&done[..], [(c, Some(d))] if c.cid == 5 && d.len() == 1));
    // A completion for a command no longer in flight is dropped.
    q.q.complete(5, Status::SUCCESS, 0, None, &mut q.w);
    assert!(q.w.completed.is_empty());
    // The ID is free again.
    assert!(matches!(q.send(read(5), Bytes::new()), Some(Action::Io { .. })));
}

#[test]
fn commands_go_where_they_belong() {
    let mut q = Q::new();
    q.connect(0, 31, false);
    assert!(matches!(q.send(Sqe::new(admin::IDENTIFY, 2, 0), Bytes::new()), Some(Action::Admin { .. })));
    let get = fabrics::Property::get_sqe(3, fabrics::reg::CAP, true);
    assert!(matches!(q.send(get, Bytes::new()), Some(Action::Admin { .. })));
    let mut q = Q::new();
    q.connect(1, 31, false);
    assert!(matches!(q.send(read(2), Bytes::new()), Some(Action::Io { .. })));
    // Property Get/Set belong to the admin queue.
    assert_eq!(q.send(get, Bytes::new()), None);
    assert_eq!(q.w.one().status, Status::INVALID_OPCODE.dnr());
    // Disconnect completes, then closes.
    assert_eq!(q.send(fabrics::disconnect_sqe(4), Bytes::new()), Some(Action::Close(None)));
    assert_eq!(q.w.one().status, Status::SUCCESS);
    assert!(q.q.is_closed());
}

#[test]
fn login_deadline_until_connected() {
    let mut q = Q::new();
    let deadline = q.t0 + Duration::from_secs(10);
    assert_eq!(q.q.poll_timeout(), Some(deadline));
    assert_eq!(q.q.handle_timeout::<FabricError>(deadline - Duration::from_millis(1)), None);
    assert_eq!(q.q.handle_timeout(deadline), Some(A::Close(Some(FabricError::LoginTimeout))));
    assert!(q.q.is_closed());
    assert_eq!(q.q.poll_timeout(), None);
    // Connected in time: the login deadline is gone.
    let mut q = Q::new();
    q.connect(1, 31, false);
    assert_eq!(q.q.poll_timeout(), None);
    assert_eq!(q.q.handle_timeout::<FabricError>(deadline), None);
}

#[test]
fn admin_queue_enforces_keep_alive_with_any_command_as_traffic() {
    for qid in [0, 1] {
        let mut q = Q::new();
        q.connect(qid, 31, false);
        // KATO 1000 ms from the Connect.
        let first = q.t0 + Duration::from_millis(1001);
        assert_eq!(q.ka.deadline(), Some(first));
        // Any command on any of the controller's queues restarts it.
        q.now += Duration::from_millis(800);
        q.send(read(3), Bytes::new());
        let later = q.now + Duration::from_millis(1001);
        assert_eq!(q.ka.deadline(), Some(later));
        // Only the admin queue enforces it.
        let want = (qid == 0).then_some(later);
        assert_eq!(q.q.poll_timeout(), want);
        assert_eq!(q.q.handle_timeout::<FabricError>(later - Duration::from_millis(2)), None);
        let a = q.q.handle_timeout(later);
        if qid == 0 {
            assert_eq!(a, Some(A::Close(Some(FabricError::KeepAliveExpired(1000)))));
        } else {
            assert_eq!(a, None);
        }
    }
}

/// A batch's commands share its instant: only the first touches the
/// controller's keep-alive, so a later touch from another of its queues is
/// not undone by the rest of the batch.
#[test]
fn the_rest_of_a_batch_does_not_move_the_keep_alive_back() {
    let mut q = Q::with(1, 31);
    q.connect(1, 31, false);
    let batch = q.t0 + Duration::from_millis(500);
    q.now = batch;
    q.send(read(3), Bytes::new());
    // Another queue of the controller takes a command later.
    let other = batch + Duration::from_millis(300);
    q.ka.touch(other);
    q.send(read(4), Bytes::new());
    assert_eq!(q.ka.deadline(), Some(other + Duration::from_millis(1001)), "the later touch stands");
    // The next batch touches it again.
    q.now = other + Duration::from_millis(100);
    q.send(read(5), Bytes::new());
    assert_eq!(q.ka.deadline(), Some(q.now + Duration::from_millis(1001)));
}

#[test]
fn in_capsule_data_must_match_its_descriptor() {
    let mut w = write(1);
    let s = |w: &mut Sqe, addr: u64, length: u32, kind: u8| w.set_sgl(Sgl { addr, length, kind });
    s(&mut w, 0, 512, sgl::INCAPSULE);
    assert_eq!(incapsule_len(&w, 512, false), Ok(512));
    // A transport whose buffers hold more than was sent takes the length announced.
    assert_eq!(incapsule_len(&w, 600, true), Ok(512));
    assert_eq!(incapsule_len(&w, 600, false), Err(Status::SGL_INVALID_DATA.dnr()));
    assert_eq!(incapsule_len(&w, 500, true), Err(Status::SGL_INVALID_DATA.dnr()));
    s(&mut w, 8, 512, sgl::INCAPSULE);
    assert_eq!(incapsule_len(&w, 512, false), Err(Status::SGL_INVALID_OFFSET.dnr()));
    s(&mut w, 0, 512, sgl::TRANSPORT);
    assert_eq!(incapsule_len(&w, 512, false), Err(Status::SGL_INVALID_TYPE.dnr()));
    let n = INCAPSULE_DATA + 512;
    s(&mut w, 0, n, sgl::INCAPSULE);
    assert_eq!(incapsule_len(&w, n as usize, false), Err(Status::SGL_INVALID_OFFSET.dnr()));
    // Data to the host never comes in the capsule.
    let mut r = read(2);
    r.set_sgl(Sgl { addr: 0, length: 512, kind: sgl::INCAPSULE });
    assert_eq!(incapsule_len(&r, 512, false), Err(Status::SGL_INVALID_DATA.dnr()));
}

#[test]
fn write_data_is_asked_for_only_when_the_command_can_run() {
    let mut q = Q::new();
    q.connect(1, 31, false);
    assert_eq!(q.q.may_fetch(&write(1)), Ok(()));
    // A namespace that does not exist, a range past its end.
    let mut bad = write(2);
    bad.0[4] = 9;
    assert_eq!(q.q.may_fetch(&bad), Err(Status::INVALID_NS.dnr()));
    let mut past = write(3);
    past.set_rw(1 << 20, 8);
    assert!(q.q.may_fetch(&past).is_err());
    // The admin queue's commands are the controller's to check.
    let mut q = Q::new();
    q.connect(0, 31, false);
    assert_eq!(q.q.may_fetch(&bad), Ok(()));
}

/// DH-HMAC-CHAP as part of the login.
mod auth {
    use super::*;

    #[test]
    fn connect_asks_for_authentication_and_commands_wait_for_it() {
        let mut q = Q::new();
        let deadline = q.t0 + Duration::from_secs(10);
        let c = q.connect(1, 31, true);
        assert_eq!((c.status, c.result), (Status::SUCCESS, CNTLID | fabrics::AUTHREQ_ATR as u64));
        assert!(q.q.awaiting_auth());
        // Nothing runs, no write data is asked for, but the host's own
        // Auth Send data is.
        assert_eq!(q.send(read(2), Bytes::new()), None);
        assert_eq!(q.w.one().status, Status::AUTH_REQUIRED.dnr());
        assert_eq!(q.q.may_fetch(&write(3)), Err(Status::AUTH_REQUIRED.dnr()));
        assert_eq!(q.q.may_fetch(&AuthCommand::send_sqe(4, 64)), Ok(()));
        // Its commands do not keep the controller alive.
        let before = q.ka.deadline();
        q.now += Duration::from_millis(500);
        q.send(read(5), Bytes::new());
        q.w.one();
        assert_eq!(q.ka.deadline(), before);
        // The login deadline stays armed, and says what was missing.
        assert_eq!(q.q.poll_timeout(), Some(deadline));
        assert_eq!(q.q.handle_timeout(deadline), Some(A::Close(Some(FabricError::AuthTimeout))));
    }

    #[test]
    fn an_exchange_logs_the_queue_in_and_starts_the_keep_alive() {
        for qid in [0, 1] {
            let mut q = Q::new();
            let deadline = q.t0 + Duration::from_secs(10);
            q.connect(qid, 31, true);
            // An exchange slower than KATO (1 s): the keep-alive does not
            // run while the host authenticates...
            q.now += Duration::from_millis(3000);
            assert_eq!(q.q.handle_timeout::<FabricError>(q.now), None);
            let seen = q.authenticate(key(5), qid);
            // The transport hears once that the login is over.
            assert_eq!(seen, vec![A::Authenticated]);
            assert!(!q.q.awaiting_auth());
            // ...and starts when it succeeded.
            let started = q.now + Duration::from_millis(1001);
            assert_eq!(q.ka.deadline(), Some(started));
            let want = (qid == 0).then_some(started);
            assert_eq!(q.q.poll_timeout(), want);
            let a = q.send(read(7), Bytes::new());
            assert!(matches!((qid, a), (0, Some(Action::Admin { .. })) | (1, Some(Action::Io { .. }))));
            // Only the admin queue's keep-alive can end it now.
            let later = q.q.handle_timeout(deadline);
            if qid == 0 {
                assert!(matches!(later, Some(A::Close(Some(FabricError::KeepAliveExpired(_))))), "{later:?}");
            } else {
                assert_eq!(later, None);
            }
        }
    }

    #[test]
    fn a_wrong_secret_closes_the_queue_with_the_reason() {
        let mut q = Q::new();
        q.connect(0, 31, true);
        let seen = q.authenticate(key(6), 0);
        match &seen[..] {
            [A::Close(Some(FabricError::AuthFailed { hostnqn, why, .. }))] => {
                assert_eq!(hostnqn, HOSTNQN);
                assert!(why.contains("does not match"), "{why}");
            }
            other => panic!("expected AuthFailed, got {other:?}"),
        }
        assert!(q.q.is_closed());
    }

    #[test]
    fn auth_commands_without_authentication_configured_are_refused() {
        let mut q = Q::new();
        q.connect(1, 31, false);
        let mut s = AuthCommand::receive_sqe(9, 64);
        s.set_sgl(Sgl { addr: 0, length: 64, kind: sgl::TRANSPORT });
        assert_eq!(q.send(s, Bytes::new()), None);
        assert_eq!(q.w.one().status, Status::INVALID_OPCODE.dnr());
        // An Auth Send handed back with entropy on such a queue too.
        let s = AuthCommand::send_sqe(10, 64);
        q.q.admit(10, q.now, &mut q.w).unwrap();
        assert_eq!(q.q.auth_send::<FabricError>(&s, &[0; 64], entropy(3), &mut q.w), None);
        assert_eq!(q.w.one().status, Status::INVALID_OPCODE.dnr());
    }
}
