//! The controller-side queues' own cost per command, for comparing two
//! builds of bw-nvme by instruction count (load-independent): 4 KiB reads
//! and writes over NVMe/TCP (capsule in, R2T/H2CData for writes, C2HData
//! and CapsuleResp out) and 4 KiB reads over NVMe/RDMA (capsule in, WRITE
//! and SEND out). No volume, no sockets: only the state machines.
//!
//! ```text
//! cargo build --release -p bw-nvme --example queue_cost
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/examples/queue_cost rdma-read 50000 2>&1 | grep Collected
//! ```
//! Subtract the `none` run and divide by the count.
use bw_nvme::fabrics::{Connect, ConnectData};
use bw_nvme::pdu::{self, CapsuleCmd, DataPdu, Digests, IcReq, Pdu};
use bw_nvme::queue_entry::{nvm, sgl, Keyed, Sgl};
use bw_nvme::target_queue::{Action, Connected, QueueConfig, Received, TargetQueue};
use bw_nvme::{rdma_queue, Sqe, Status};
use bytes::{Bytes, BytesMut};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn main() {
    let n: usize = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(200_000);
    match std::env::args().nth(1).as_deref() {
        Some("tcp-read") => tcp(n, false),
        Some("tcp-write") => tcp(n, true),
        Some("rdma-read") => rdma(n),
        Some("none") => {}
        _ => panic!("tcp-read|tcp-write|rdma-read|none N"),
    }
}

fn ka(now: Instant) -> Arc<bw_nvme::controller::KeepAlive> {
    Arc::new(bw_nvme::controller::KeepAlive::new(0, now))
}

fn tcp(n: usize, write: bool) {
    let now = Instant::now();
    let mut q = TargetQueue::new(QueueConfig::new(now + Duration::from_secs(60)));
    let d = Digests::default();
    let mut wire = Vec::new();
    Pdu::IcReq(IcReq { pfv: 0, hpda: 0, digests: d, maxr2t: 0 }).encode_into(d, &mut wire);
    let c = Connect { recfmt: 0, qid: 1, sqsize: 127, cattr: 0, kato_ms: 0 };
    let cd = ConnectData { hostid: [0; 16], cntlid: 1, subnqn: "s".into(), hostnqn: "h".into() };
    let mut sqe = c.to_sqe(1);
    sqe.set_sgl(Sgl { addr: 0, length: 1024, kind: sgl::INCAPSULE });
    Pdu::CapsuleCmd(CapsuleCmd { sqe, data: Bytes::from(cd.encode()) }).encode_into(d, &mut wire);
    let mut buf = BytesMut::from(&wire[..]);
    let mut tx = Vec::new();
    while let Received::Pdu(a) = q.receive(&mut buf, now, &mut tx) {
        if let Some(Action::Connect { cid, .. }) = a {
            q.connected(cid, Connected { result: 1, keep_alive: ka(now), subsystem: None, hostnqn: "h".into(), auth: None }, now, &mut tx);
        }
    }
    assert!(q.is_connected());
    let data = Bytes::from(vec![7u8; 4096]);
    let mut ios = 0;
    for i in 0..n {
        let cid = (i % 64) as u16;
        let mut s = Sqe::new(if write { nvm::WRITE } else { nvm::READ }, cid, 1);
        s.set_rw(0, 8);
        s.set_sgl(Sgl { addr: 0, length: 4096, kind: sgl::TRANSPORT });
        wire.clear();
        pdu::encode_capsule(&s, &[], d, &mut wire);
        let mut buf = BytesMut::from(&wire[..]);
        tx.clear();
        loop {
            match q.receive(&mut buf, now, &mut tx) {
                Received::NeedMore => break,
                Received::Pdu(Some(Action::Io { sqe, .. })) => {
                    ios += 1;
                    let out = (!write).then(|| data.clone());
                    q.complete(sqe.cid(), Status::SUCCESS, 0, out, &mut tx);
                }
                Received::Pdu(None) => {}
                Received::Pdu(a) => panic!("{a:?}"),
            }
            if write && buf.is_empty() && !tx.is_empty() && ios <= i {
                // The R2T: answer it with the data.
                wire.clear();
                Pdu::H2CData(DataPdu { cid, ttag: cid, offset: 0, last: true, success: false, data: data.clone() }).encode_into(d, &mut wire);
                buf.extend_from_slice(&wire);
                tx.clear();
            }
        }
    }
    assert_eq!(ios, n);
}

fn rdma(n: usize) {
    use rdma_queue::{Post, RdmaQueue, Shape};
    let now = Instant::now();
    let mut q = RdmaQueue::new(Shape { qid: 1, sq_entries: 128, rq_entries: 128 }, now + Duration::from_secs(60));
    let c = Connect { recfmt: 0, qid: 1, sqsize: 127, cattr: 0, kato_ms: 0 };
    let cd = ConnectData { hostid: [0; 16], cntlid: 1, subnqn: "s".into(), hostnqn: "h".into() };
    let mut sqe = c.to_sqe(1);
    sqe.set_sgl(Sgl { addr: 0, length: 1024, kind: sgl::INCAPSULE });
    let capsule = [&sqe.0[..], &cd.encode()[..]].concat();
    let mut out: Vec<Post> = Vec::new();
    let Some(rdma_queue::Action::Connect { cid, .. }) = q.capsule(&capsule, now, &mut out) else { panic!("no Connect") };
    q.connected(cid, rdma_queue::Connected { result: 1, keep_alive: ka(now), subsystem: None, hostnqn: "h".into(), auth: None }, now, &mut out);
    assert!(q.is_connected());
    let data = Bytes::from(vec![7u8; 4096]);
    let mut ios = 0;
    for i in 0..n {
        let cid = (i % 64) as u16;
        let mut s = Sqe::new(nvm::READ, cid, 1);
        s.set_rw(0, 8);
        s.set_keyed_sgl(Keyed { addr: 0x1000, length: 4096, key: 5, invalidate: true });
        out.clear();
        if let Some(rdma_queue::Action::Io { sqe, .. }) = q.capsule(&s.0, now, &mut out) {
            ios += 1;
            q.complete(sqe.cid(), Status::SUCCESS, 0, Some(data.clone()), &mut out);
        }
        assert_eq!(out.len(), 2);
    }
    assert_eq!(ios, n);
}
