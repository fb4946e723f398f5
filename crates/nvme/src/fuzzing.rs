//! Harness bodies shared by the cargo-fuzz targets (crates/nvme/fuzz) and
//! the regression replay (tests/fuzz_regressions.rs): feed untrusted bytes
//! to the PDU parser and the command sets and check invariants. Panics mean
//! bugs.

use crate::controller::{AdminOutcome, Role};
use crate::pdu::{decode, Digests};
use crate::{nvm_io, Controller, Namespace, Sqe, Subsystem};
use bw_block::{BackendSpec, Volume};
use bytes::BytesMut;
use std::sync::Arc;
use std::time::Instant;

/// The PDU parser on arbitrary bytes (the first picks digests and the
/// size limit): never panics, consumes only whole PDUs, and whatever it
/// accepts re-encodes to something it decodes to the same PDU.
pub fn pdu_decode(data: &[u8]) {
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
}

const COMMANDS_VOLUME: u64 = 64 * 1024;

thread_local! {
    /// One RAM volume per thread (libFuzzer runs one): a memfd per input
    /// cost more than the commands. Punched back to all-holes before each
    /// input, the state a new RAM volume starts in.
    static COMMANDS_VOLUME_CACHE: Volume = Volume::open("f", &BackendSpec::ram(COMMANDS_VOLUME)).expect("ram volume");
}

/// A subsystem of one namespace over the thread's RAM volume, punched back
/// to all-holes (the state a new RAM volume starts in).
fn subsystem() -> Subsystem {
    let v = COMMANDS_VOLUME_CACHE.with(|v| v.clone());
    v.discard(0, COMMANDS_VOLUME).expect("punch the volume back to holes");
    Subsystem {
        nqn: "nqn.f:s".into(),
        serial: "s".into(),
        model: "m".into(),
        namespaces: vec![Namespace::new("nqn.f:s", 1, v, false)],
        allowed_hosts: vec![],
        ana: Default::default(),
    }
}

/// Arbitrary submission entries (64 bytes, then 16 bytes of data each)
/// through the admin state machine and the NVM command set over a small RAM
/// volume: never panics, and a completion's data never exceeds what the
/// command's SGL asked for. Each input gets a new subsystem and controller;
/// only the volume's I/O counters carry over (they feed SMART's totals).
pub fn commands(data: &[u8]) {
    let s = Arc::new(subsystem());
    let mut c = Controller::new(1, Role::Nvm(s.clone()), "h".into(), [0; 16], 1000, Instant::now());
    for chunk in data.chunks(80) {
        if chunk.len() < 64 {
            break;
        }
        let sqe = Sqe::from_slice(&chunk[..64]);
        let extra = &chunk[64..];
        if let AdminOutcome::Complete(done) = c.execute_admin(&sqe, extra, Instant::now()) {
            if let Some(d) = done.data {
                assert!(d.len() <= sqe.sgl().length as usize);
            }
        }
        let r = nvm_io::execute(&s, &nvm_io::Host::new([0; 16], "nqn.t:h"), &sqe, extra);
        if let Some(d) = r.data {
            assert_eq!(d.len(), sqe.sgl().length as usize);
        }
    }
}

/// Arbitrary capsules through an NVMe/RDMA controller queue (I/O queue 1
/// of 8 entries, connected first), the transport's side played as
/// `serve` plays it without a volume: each two bytes give the next
/// capsule's length (up to a RECV's), data the queue asks to READ arrives,
/// commands complete (in order, once more are held back than the queue has
/// entries, so that the host can overrun it and reuse IDs in flight), a
/// read with its blocks' worth of data. Never panics, never has more commands outstanding than
/// the queue's entries, and completes only commands it was sent.
pub fn rdma_queue(data: &[u8]) {
    use crate::fabric_queue::{Action, Connected};
    use crate::fabrics::{Connect, ConnectData};
    use crate::queue_entry::Keyed;
    use crate::rdma_queue::{Post, RdmaQueue, Shape, CAPSULE_LEN};
    use bytes::Bytes;
    use std::collections::{HashSet, VecDeque};
    const ENTRIES: u16 = 8;
    /// Results held back before the oldest completes: more than the queue
    /// holds, so that a host that keeps sending overruns it.
    const HELD: usize = ENTRIES as usize + 2;
    let now = Instant::now();
    let s = Arc::new(crate::LiveSubsystem::new(Arc::new(subsystem())));
    let mut q = RdmaQueue::new(Shape { qid: 1, sq_entries: ENTRIES, rq_entries: ENTRIES }, now + std::time::Duration::from_secs(10));
    let mut out = Vec::new();
    let mut connect = Connect { recfmt: 0, qid: 1, sqsize: ENTRIES - 1, cattr: 0, kato_ms: 0 }.to_sqe(0);
    connect.set_keyed_sgl(Keyed { addr: 0, length: 1024, key: 1, invalidate: false });
    q.capsule(&connect.0, now, &mut out);
    let d = ConnectData { hostid: [0; 16], cntlid: 1, subnqn: "nqn.f:s".into(), hostnqn: "nqn.f:h".into() };
    let mut acts: Vec<_> = q.fetched(0, Bytes::from(d.encode()), &mut out).into_iter().collect();
    // Command IDs sent and not yet completed, as the host sees them.
    let mut sent: HashSet<u16> = HashSet::from([0]);
    let mut later = VecDeque::new();
    let mut rest = data;
    loop {
        while let Some(a) = acts.pop() {
            let done = match a {
                Action::Connect { cid, .. } => {
                    let ka = Arc::new(crate::controller::KeepAlive::new(0, now));
                    let c = Connected { result: 1, keep_alive: ka, subsystem: Some(s.clone()), hostnqn: "nqn.t:h".into(), auth: None };
                    q.connected(cid, c, now, &mut out);
                    continue;
                }
                // A read returns what its blocks hold, whatever its
                // descriptor says (the queue must not write past the
                // host's buffer); the rest return nothing.
                Action::Io { sqe, .. } if sqe.opcode() == crate::queue_entry::nvm::READ => {
                    let len = (sqe.nlb() as usize * crate::LBA_SIZE as usize).min(1 << 20);
                    (sqe.cid(), crate::Status::SUCCESS, Some(Bytes::from(vec![0; len])))
                }
                Action::Io { sqe, .. } => (sqe.cid(), crate::Status::SUCCESS, None),
                Action::Admin { sqe, .. } | Action::AuthSend { sqe, .. } => (sqe.cid(), crate::Status::INTERNAL, None),
                Action::Authenticated => continue,
                Action::Close(_) => return,
            };
            later.push_back(done);
        }
        while later.len() > HELD || (rest.len() < 2 && !later.is_empty()) {
            let Some((cid, status, data)) = later.pop_front() else { break };
            q.complete(cid, status, 0, data, &mut out);
        }
        for p in std::mem::take(&mut out) {
            match p {
                Post::Read { cid, from } => acts.extend(q.fetched(cid, Bytes::from(vec![0; from.length as usize]), &mut out)),
                Post::Write { to, data } => assert!(data.len() <= to.length as usize),
                Post::Send { cqe, .. } => {
                    let c = crate::Cqe::parse(&cqe);
                    // (A refused duplicate ID is answered while the first is in flight.)
                    assert!(sent.contains(&c.cid), "completion for command {} never sent", c.cid);
                    if c.status != crate::Status::CMDID_CONFLICT.dnr() {
                        sent.remove(&c.cid);
                    }
                }
            }
        }
        assert!(q.outstanding() <= ENTRIES as usize);
        if !out.is_empty() || !acts.is_empty() {
            continue;
        }
        let [a, b, tail @ ..] = rest else { return };
        let n = (u16::from_le_bytes([*a, *b]) as usize % (CAPSULE_LEN + 1)).min(tail.len());
        let (capsule, r) = tail.split_at(n);
        rest = r;
        if capsule.len() >= 64 {
            sent.insert(Sqe::from_slice(&capsule[..64]).cid());
        }
        acts.extend(q.capsule(capsule, now, &mut out));
    }
}
