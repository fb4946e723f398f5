use super::*;
use crate::queue_entry::nvm;
use crate::pdu::{IcResp, R2t, TermReq};
use crate::Status;

/// A caller's context: an optional read buffer and a name to tell them apart.
#[derive(Debug)]
struct Ctx {
    name: u32,
    buf: Option<Vec<u8>>,
}

impl Context for Ctx {
    fn read_buf(&mut self) -> Option<&mut [u8]> {
        self.buf.as_deref_mut()
    }
}

fn ctx(name: u32, buf: Option<usize>) -> Ctx {
    Ctx {
        name,
        buf: buf.map(|n| vec![0u8; n]),
    }
}

/// A controller talking to one [`HostQueue`].
struct Ctrl {
    q: HostQueue<Ctx>,
    d: Digests,
    t0: Instant,
}

impl Ctrl {
    fn new(d: Digests, depth: usize, maxh2cdata: u32) -> Ctrl {
        let t0 = Instant::now();
        let mut q = HostQueue::new(HostConfig {
            qid: 1,
            digests: d,
            depth,
            timeout: Duration::from_secs(1),
            incapsule: 8192,
        });
        let sent = take(&mut q);
        let mut b = BytesMut::from(&sent[..]);
        let Some(Pdu::IcReq(r)) = pdu::decode(&mut b, Digests::default(), 4096).unwrap() else {
            panic!("no ICReq first")
        };
        assert_eq!(r.digests, d);
        let mut c = Ctrl { q, d, t0 };
        c.send_raw(&[Pdu::IcResp(IcResp {
            pfv: 0,
            cpda: 0,
            digests: d,
            maxh2cdata,
        })])
        .unwrap();
        assert!(c.q.is_ready());
        c
    }

    fn send_raw(&mut self, ps: &[Pdu]) -> Result<(), ProtocolError> {
        let mut b = Vec::new();
        for p in ps {
            let d = if matches!(p, Pdu::IcResp(_)) {
                Digests::default()
            } else {
                self.d
            };
            p.encode_into(d, &mut b);
        }
        let mut buf = BytesMut::from(&b[..]);
        while self.q.receive(&mut buf)? {}
        assert!(buf.is_empty());
        Ok(())
    }

    fn send(&mut self, ps: &[Pdu]) {
        self.send_raw(ps).expect("the queue takes these PDUs")
    }

    /// What the host sent, decoded.
    fn sent(&mut self) -> Vec<Pdu> {
        let b = take(&mut self.q);
        let mut buf = BytesMut::from(&b[..]);
        let mut out = Vec::new();
        while let Some(p) = pdu::decode(&mut buf, self.d, u32::MAX).unwrap() {
            out.push(p);
        }
        assert!(buf.is_empty());
        out
    }

    fn read(&mut self, name: u32, len: usize, own_buf: bool) -> Ticket {
        let mut s = Sqe::new(nvm::READ, 0, 1);
        s.set_rw(0, (len / 512) as u32);
        self.q
            .submit(
                s,
                Payload::None,
                len as u32,
                ctx(name, own_buf.then_some(len)),
                self.t0,
            )
            .map_err(|e| e.1)
            .unwrap()
    }

    fn write(&mut self, name: u32, data: Vec<u8>) -> Ticket {
        let mut s = Sqe::new(nvm::WRITE, 0, 1);
        s.set_rw(0, (data.len() / 512) as u32);
        self.q
            .submit(
                s,
                Payload::Owned(Bytes::from(data)),
                0,
                ctx(name, None),
                self.t0,
            )
            .map_err(|e| e.1)
            .unwrap()
    }

    fn completions(&mut self) -> Vec<(Ctx, Result<Done, HostError>)> {
        std::iter::from_fn(|| self.q.poll_completion()).collect()
    }
}

/// Everything the queue has to send, payloads sent in place in their places.
fn take(q: &mut HostQueue<Ctx>) -> Vec<u8> {
    let (mut out, mut refs) = (Vec::new(), Vec::new());
    q.poll_transmit(&mut out, &mut refs);
    wire(&out, &refs)
}

/// The bytes on the wire: `out` with each of `refs` where it goes.
fn wire(out: &[u8], refs: &[(usize, Bytes)]) -> Vec<u8> {
    let mut all = Vec::new();
    let mut at = 0;
    for (end, b) in refs {
        all.extend_from_slice(&out[at..*end]);
        all.extend_from_slice(b);
        at = *end;
    }
    all.extend_from_slice(&out[at..]);
    all
}

fn c2h(cid: u16, offset: u32, data: Vec<u8>, last: bool, success: bool) -> Pdu {
    Pdu::C2HData(DataPdu {
        cid,
        ttag: 0,
        offset,
        last,
        success,
        data: Bytes::from(data),
    })
}

fn resp(cid: u16, status: Status) -> Pdu {
    Pdu::CapsuleResp(Cqe {
        cid,
        status,
        ..Default::default()
    })
}

fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn icresp_is_checked() {
    let bad = [
        IcResp {
            pfv: 0,
            cpda: 0,
            digests: Digests {
                header: true,
                data: false,
            },
            maxh2cdata: 8192,
        },
        IcResp {
            pfv: 0,
            cpda: 1,
            digests: Digests::default(),
            maxh2cdata: 8192,
        },
        IcResp {
            pfv: 0,
            cpda: 0,
            digests: Digests::default(),
            maxh2cdata: 1000,
        },
        IcResp {
            pfv: 0,
            cpda: 0,
            digests: Digests::default(),
            maxh2cdata: 8190,
        },
    ];
    for r in bad {
        let mut q: HostQueue<Ctx> = HostQueue::new(HostConfig {
            qid: 0,
            digests: Digests::default(),
            depth: 4,
            timeout: Duration::from_secs(1),
            incapsule: 0,
        });
        let mut b = Vec::new();
        Pdu::IcResp(r).encode_into(Digests::default(), &mut b);
        assert!(
            matches!(
                q.receive(&mut BytesMut::from(&b[..])),
                Err(ProtocolError::IcResp(_))
            ),
            "{r:?}"
        );
        assert!(q.dead().is_some() && !q.is_ready());
    }
    // A TermReq instead of the ICResp.
    let mut q: HostQueue<Ctx> = HostQueue::new(HostConfig {
        qid: 0,
        digests: Digests::default(),
        depth: 4,
        timeout: Duration::from_secs(1),
        incapsule: 0,
    });
    let mut b = Vec::new();
    Pdu::C2HTermReq(TermReq {
        fes: 6,
        fei: 8,
        data: Bytes::new(),
    })
    .encode_into(Digests::default(), &mut b);
    assert_eq!(
        q.receive(&mut BytesMut::from(&b[..])),
        Err(ProtocolError::Terminated { fes: 6, fei: 8 })
    );
}

#[test]
fn command_ids_are_multiplexed_and_reused() {
    let mut c = Ctrl::new(Digests::default(), 3, 8192);
    let ts: Vec<Ticket> = (0..3).map(|i| c.read(i, 512, false)).collect();
    let mut cids: Vec<u16> = ts.iter().map(|t| t.cid).collect();
    cids.sort();
    assert_eq!(cids, vec![0, 1, 2]);
    let sent = c.sent();
    assert_eq!(sent.len(), 3);
    for (p, t) in sent.iter().zip(&ts) {
        let Pdu::CapsuleCmd(cc) = p else {
            panic!("{p:?}")
        };
        assert_eq!(cc.sqe.cid(), t.cid);
        assert_eq!(
            cc.sqe.sgl(),
            Sgl {
                addr: 0,
                length: 512,
                kind: sgl::TRANSPORT
            }
        );
    }
    // All IDs taken.
    let mut s = Sqe::new(nvm::FLUSH, 0, 1);
    s.set_cdw(10, 0);
    let e =
        c.q.submit(s, Payload::None, 0, ctx(9, None), c.t0)
            .unwrap_err();
    assert_eq!((e.0.name, e.1), (9, HostError::NoFreeCid));
    // One completes: its ID is the next one handed out.
    c.send(&[resp(ts[1].cid, Status::SUCCESS)]);
    assert_eq!(c.completions().len(), 1);
    let again = c.read(10, 512, false);
    assert_eq!(again.cid, ts[1].cid);
    assert_ne!(again, ts[1], "a ticket names one submission");
}

#[test]
fn out_of_order_completions_reach_their_callers() {
    for sqflow_off in [false, true] {
        let mut c = Ctrl::new(
            Digests {
                header: true,
                data: true,
            },
            8,
            8192,
        );
        let t: Vec<Ticket> = (0..3).map(|i| c.read(i, 4096, i != 1)).collect();
        let data: Vec<Vec<u8>> = (0..3).map(|i| pattern(i as u8, 4096)).collect();
        // Data for 2, then 1 in two PDUs, then 0; completions in reverse.
        c.send(&[c2h(t[2].cid, 0, data[2].clone(), true, sqflow_off)]);
        c.send(&[
            c2h(t[1].cid, 0, data[1][..1000].to_vec(), false, false),
            c2h(t[1].cid, 1000, data[1][1000..].to_vec(), true, sqflow_off),
        ]);
        c.send(&[c2h(t[0].cid, 0, data[0].clone(), true, sqflow_off)]);
        if !sqflow_off {
            c.send(&[
                resp(t[0].cid, Status::SUCCESS),
                resp(t[1].cid, Status::SUCCESS),
                resp(t[2].cid, Status::SUCCESS),
            ]);
        }
        let mut got = c.completions();
        got.sort_by_key(|x| x.0.name);
        assert_eq!(got.len(), 3);
        for (ctx, r) in got {
            let i = ctx.name as usize;
            let d = r.unwrap();
            assert_eq!(d.received, 4096);
            if i == 1 {
                assert_eq!(d.data, data[1], "collected without a buffer");
            } else {
                assert!(d.data.is_empty());
                assert_eq!(ctx.buf.unwrap(), data[i], "into the caller's buffer");
            }
        }
        assert_eq!(c.q.in_flight(), 0);
    }
}

#[test]
fn r2t_is_answered_with_h2c_data_split_to_maxh2cdata() {
    for d in [
        Digests::default(),
        Digests {
            header: true,
            data: true,
        },
    ] {
        let mut c = Ctrl::new(d, 8, 4096);
        let data = pattern(3, 200 * 1024);
        let t = c.write(0, data.clone());
        let Pdu::CapsuleCmd(cc) = &c.sent()[0] else {
            panic!()
        };
        assert_eq!(
            cc.sqe.sgl(),
            Sgl {
                addr: 0,
                length: data.len() as u32,
                kind: sgl::TRANSPORT
            }
        );
        assert!(cc.data.is_empty());
        // The controller asks for 10000 bytes at 4096, then the rest.
        c.send(&[Pdu::R2T(R2t {
            cid: t.cid,
            ttag: 77,
            offset: 4096,
            length: 10000,
        })]);
        let got = c.sent();
        let shape: Vec<(u16, u32, usize, bool)> = got
            .iter()
            .map(|p| {
                if let Pdu::H2CData(h) = p {
                    (h.ttag, h.offset, h.data.len(), h.last)
                } else {
                    panic!("{p:?}")
                }
            })
            .collect();
        assert_eq!(
            shape,
            vec![
                (77, 4096, 4096, false),
                (77, 8192, 4096, false),
                (77, 12288, 1808, true)
            ]
        );
        for p in &got {
            let Pdu::H2CData(h) = p else { unreachable!() };
            assert_eq!(
                &h.data[..],
                &data[h.offset as usize..h.offset as usize + h.data.len()]
            );
        }
        // Big MAXH2CDATA: large payloads are handed over to write in place.
        let mut c = Ctrl::new(d, 8, 1 << 20);
        let t = c.write(0, data.clone());
        c.sent();
        c.send(&[Pdu::R2T(R2t {
            cid: t.cid,
            ttag: 5,
            offset: 0,
            length: data.len() as u32,
        })]);
        let (mut out, mut refs) = (Vec::new(), Vec::new());
        c.q.poll_transmit(&mut out, &mut refs);
        assert_eq!(refs.len(), 1, "the payload is not copied");
        assert_eq!(refs[0].1.len(), data.len());
        let got = c.decode(&wire(&out, &refs));
        let [Pdu::H2CData(h)] = &got[..] else {
            panic!("{got:?}")
        };
        assert_eq!((h.offset, h.last, &h.data[..]), (0, true, &data[..]));
        c.send(&[resp(t.cid, Status::SUCCESS)]);
        assert!(c.completions()[0].1.is_ok());
    }
}

impl Ctrl {
    /// Decode what went on the wire.
    fn decode(&mut self, all: &[u8]) -> Vec<Pdu> {
        let mut buf = BytesMut::from(all);
        let mut out = Vec::new();
        while let Some(p) = pdu::decode(&mut buf, self.d, u32::MAX).unwrap() {
            out.push(p);
        }
        assert!(buf.is_empty());
        out
    }
}

#[test]
fn small_writes_go_in_the_capsule() {
    let mut c = Ctrl::new(Digests::default(), 8, 8192);
    c.write(0, pattern(1, 4096));
    let Pdu::CapsuleCmd(cc) = &c.sent()[0] else {
        panic!()
    };
    assert_eq!(
        cc.sqe.sgl(),
        Sgl {
            addr: 0,
            length: 4096,
            kind: sgl::INCAPSULE
        }
    );
    assert_eq!(&cc.data[..], &pattern(1, 4096)[..]);
}

/// A write's data handed over (owned) goes on the wire from the caller's
/// buffer, gathered between its capsule's header and the next command,
/// with or without digests; a caller that gives up meanwhile cannot take
/// it away (the queue holds a reference until the transport takes it).
/// Short payloads and borrowed ones are copied.
#[test]
fn owned_write_data_is_sent_from_where_it_is() {
    for d in [Digests::default(), Digests { header: true, data: true }] {
        let mut c = Ctrl::new(d, 8, 8192);
        let data = Bytes::from(pattern(4, 4096));
        let mut s = Sqe::new(nvm::WRITE, 0, 1);
        s.set_rw(0, 8);
        let t = c.q.submit(s, Payload::Owned(data.clone()), 0, ctx(1, None), c.t0).map_err(|e| e.1).unwrap();
        let small = pattern(5, 512);
        c.q.submit(s, Payload::Owned(Bytes::from(small.clone())), 0, ctx(2, None), c.t0).map_err(|e| e.1).unwrap();
        let borrowed = pattern(6, 2048);
        c.q.submit(s, Payload::Borrowed(&borrowed), 0, ctx(3, None), c.t0).map_err(|e| e.1).unwrap();
        c.q.cancel(t);
        let ptr = data.as_ptr();
        drop(data);
        let (mut out, mut refs) = (Vec::new(), Vec::new());
        c.q.poll_transmit(&mut out, &mut refs);
        assert_eq!(refs.len(), 1, "{d:?}: only the long owned payload goes in place");
        assert_eq!(refs[0].1.as_ptr(), ptr, "{d:?}: the payload was copied");
        let got = c.decode(&wire(&out, &refs));
        let datas: Vec<&[u8]> = got
            .iter()
            .map(|p| match p {
                Pdu::CapsuleCmd(cc) => &cc.data[..],
                p => panic!("{p:?}"),
            })
            .collect();
        assert_eq!(datas, [&pattern(4, 4096)[..], &small[..], &borrowed[..]], "{d:?}");
        assert!(!c.q.has_transmit());
    }
}

/// Replies that do not fit a command in flight end the queue, and every
/// command in flight fails with the reason.
#[test]
fn bad_command_ids_and_bad_data_end_the_queue() {
    type Case = (fn(&Ticket, &Ticket) -> Pdu, fn(&ProtocolError) -> bool);
    let cases: Vec<Case> = vec![
        (
            |_, _| resp(7, Status::SUCCESS),
            |e| {
                matches!(
                    e,
                    ProtocolError::UnknownCommand {
                        kind: pdu::kind::CAPSULE_RESP,
                        cid: 7
                    }
                )
            },
        ),
        (
            |_, _| c2h(6, 0, vec![0; 512], true, false),
            |e| {
                matches!(
                    e,
                    ProtocolError::UnknownCommand {
                        kind: pdu::kind::C2H_DATA,
                        cid: 6
                    }
                )
            },
        ),
        (
            |r, _| c2h(r.cid, 512, vec![0; 512], true, false),
            |e| {
                matches!(
                    e,
                    ProtocolError::DataOffset {
                        offset: 512,
                        expected: 0,
                        ..
                    }
                )
            },
        ),
        (
            |r, _| c2h(r.cid, 0, vec![0; 8192], true, false),
            |e| {
                matches!(
                    e,
                    ProtocolError::DataOverrun {
                        end: 8192,
                        len: 4096,
                        ..
                    }
                )
            },
        ),
        (
            |r, _| c2h(r.cid, 0, vec![0; 512], false, true),
            |e| matches!(e, ProtocolError::SuccessNotLast(_)),
        ),
        (
            |r, _| {
                Pdu::R2T(R2t {
                    cid: r.cid,
                    ttag: 1,
                    offset: 0,
                    length: 512,
                })
            },
            |e| matches!(e, ProtocolError::R2tWithoutData(_)),
        ),
        (
            |_, w| {
                Pdu::R2T(R2t {
                    cid: w.cid,
                    ttag: 1,
                    offset: 16384,
                    length: 512,
                })
            },
            |e| matches!(e, ProtocolError::R2tRange { .. }),
        ),
        (
            |_, w| {
                Pdu::R2T(R2t {
                    cid: w.cid,
                    ttag: 1,
                    offset: 0,
                    length: 0,
                })
            },
            |e| matches!(e, ProtocolError::R2tRange { .. }),
        ),
        (
            |r, _| {
                Pdu::H2CData(DataPdu {
                    cid: r.cid,
                    ttag: 0,
                    offset: 0,
                    last: true,
                    success: false,
                    data: Bytes::from_static(b"x"),
                })
            },
            |e| matches!(e, ProtocolError::UnexpectedPdu(pdu::kind::H2C_DATA)),
        ),
    ];
    for (make, is) in cases {
        let mut c = Ctrl::new(Digests::default(), 8, 8192);
        let r = c.read(0, 4096, true);
        let w = c.write(1, pattern(0, 16384));
        let p = make(&r, &w);
        let e = c.send_raw(std::slice::from_ref(&p)).unwrap_err();
        assert!(is(&e), "{p:?}: {e}");
        let done = c.completions();
        assert_eq!(done.len(), 2);
        for (_, r) in done {
            assert_eq!(r, Err(HostError::Closed(e.to_string())));
        }
        // Nothing more is taken or sent.
        let t = c.q.submit(
            Sqe::new(nvm::FLUSH, 0, 1),
            Payload::None,
            0,
            ctx(5, None),
            c.t0,
        );
        assert!(matches!(t, Err((_, HostError::Closed(_)))));
        assert!(!c.q.has_transmit());
    }
}

#[test]
fn short_data_fails_the_command_only() {
    let mut c = Ctrl::new(Digests::default(), 8, 8192);
    let t = c.read(0, 8192, true);
    let u = c.read(1, 512, false);
    c.send(&[
        c2h(t.cid, 0, vec![1; 4096], true, false),
        resp(t.cid, Status::SUCCESS),
    ]);
    let [(_, r)] = &c.completions()[..] else {
        panic!()
    };
    assert_eq!(
        *r,
        Err(HostError::ShortData {
            cid: t.cid,
            got: 4096,
            want: 8192
        })
    );
    // An error status with no data is not short data: the status says why.
    c.send(&[resp(u.cid, Status::READ_ERROR)]);
    let [(_, r)] = &c.completions()[..] else {
        panic!()
    };
    assert_eq!(r.as_ref().unwrap().cqe.status, Status::READ_ERROR);
    assert!(c.q.dead().is_none());
}

#[test]
fn a_late_command_times_the_queue_out() {
    let mut c = Ctrl::new(Digests::default(), 8, 8192);
    let t0 = c.t0;
    c.read(0, 512, false);
    c.q.submit(
        Sqe::new(nvm::FLUSH, 0, 1),
        Payload::None,
        0,
        ctx(1, None),
        t0 + Duration::from_millis(500),
    )
    .map_err(|e| e.1)
    .unwrap();
    assert_eq!(c.q.poll_timeout(), Some(t0 + Duration::from_secs(1)));
    c.q.handle_timeout(t0 + Duration::from_millis(999));
    assert!(c.completions().is_empty());
    c.q.handle_timeout(t0 + Duration::from_secs(1));
    let mut done = c.completions();
    done.sort_by_key(|x| x.0.name);
    assert_eq!(done[0].1, Err(HostError::Timeout));
    assert_eq!(
        done[1].1,
        Err(HostError::Closed("a command timed out".into()))
    );
    assert!(c.q.dead().is_some());
    assert_eq!(c.q.poll_timeout(), None);
}

/// A cancelled read keeps its command ID until the controller answers; its
/// data goes nowhere (the caller's buffer is gone) and nobody is told.
#[test]
fn cancelled_commands_keep_their_id_until_answered() {
    let mut c = Ctrl::new(Digests::default(), 2, 8192);
    let t = c.read(0, 4096, true);
    c.q.cancel(t);
    let other = c.read(1, 512, false);
    assert_ne!(other.cid, t.cid);
    assert!(
        c.q.submit(
            Sqe::new(nvm::FLUSH, 0, 1),
            Payload::None,
            0,
            ctx(2, None),
            c.t0
        )
        .is_err(),
        "ID still taken"
    );
    // Its data arrives, both through the decoder and the direct path.
    let mut b = Vec::new();
    c2h(t.cid, 0, vec![9; 2048], false, false).encode_into(Digests::default(), &mut b);
    let mut buf = BytesMut::from(&b[..]);
    assert!(
        c.q.begin_direct(&mut buf).unwrap().is_none(),
        "no buffer to read into"
    );
    assert!(c.q.receive(&mut buf).unwrap());
    c.send(&[
        c2h(t.cid, 2048, vec![9; 2048], true, false),
        resp(t.cid, Status::SUCCESS),
    ]);
    assert!(c.completions().is_empty());
    assert_eq!(c.read(3, 512, false).cid, t.cid, "ID free after the answer");
    // Cancelling a finished ticket does not touch the command now using its ID.
    c.q.cancel(t);
    c.send(&[resp(t.cid, Status::SUCCESS)]);
    assert_eq!(c.completions()[0].0.name, 3);
}

/// The direct path: a large payload read from the "socket" in pieces lands
/// in the caller's buffer, the part already buffered included.
#[test]
fn direct_reads_fill_the_callers_buffer() {
    for hd in [false, true] {
        let d = Digests {
            header: hd,
            data: false,
        };
        let mut c = Ctrl::new(d, 4, 8192);
        let t = c.read(0, 300_000, true);
        let data = pattern(7, 300_000);
        let mut wire = Vec::new();
        c2h(t.cid, 0, data.clone(), true, true).encode_into(d, &mut wire);
        // The header and 1000 payload bytes are buffered; the rest comes later.
        let hl = pdu::DATA_HLEN + if hd { 4 } else { 0 };
        let mut buf = BytesMut::from(&wire[..hl - 3]);
        assert!(
            c.q.begin_direct(&mut buf).unwrap().is_none(),
            "header incomplete"
        );
        let mut buf = BytesMut::from(&wire[..hl + 1000]);
        let mut dr = c.q.begin_direct(&mut buf).unwrap().expect("a direct read");
        assert!(buf.is_empty());
        assert_eq!(dr.left(), 299_000);
        let mut rest = &wire[hl + 1000..];
        while !dr.is_done() {
            let n = c.q.direct_fill(&mut dr, |dst| {
                let n = dst.len().min(rest.len()).min(70_000);
                dst[..n].copy_from_slice(&rest[..n]);
                Ok::<_, ()>(n)
            });
            rest = &rest[n.unwrap()..];
        }
        let [(ctx, r)] = &c.completions()[..] else {
            panic!()
        };
        assert_eq!(r.as_ref().unwrap().received, 300_000);
        assert_eq!(ctx.buf.as_ref().unwrap(), &data);
    }
    // With data digests the payload goes through the decoder instead.
    let mut c = Ctrl::new(
        Digests {
            header: false,
            data: true,
        },
        4,
        8192,
    );
    let t = c.read(0, 4096, true);
    let mut wire = Vec::new();
    c2h(t.cid, 0, vec![1; 4096], true, true).encode_into(
        Digests {
            header: false,
            data: true,
        },
        &mut wire,
    );
    assert!(c
        .q
        .begin_direct(&mut BytesMut::from(&wire[..]))
        .unwrap()
        .is_none());
}

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Arbitrary bytes from a controller never panic; afterwards the
        /// queue is either alive or has failed every command.
        #[test]
        fn arbitrary_replies(bytes in proptest::collection::vec(any::<u8>(), 0..3000), direct in any::<bool>()) {
            let mut c = Ctrl::new(Digests::default(), 4, 8192);
            c.read(0, 4096, true);
            c.read(1, 512, false);
            c.write(2, pattern(0, 20000));
            let mut buf = BytesMut::from(&bytes[..]);
            loop {
                if direct {
                    match c.q.begin_direct(&mut buf) {
                        Ok(Some(mut d)) => {
                            while !d.is_done() && !buf.is_empty() {
                                let n = c.q.direct_fill(&mut d, |dst| { let n = dst.len().min(buf.len()); dst[..n].copy_from_slice(&buf[..n]); Ok::<_, ()>(n) }).unwrap();
                                buf.advance(n);
                            }
                            continue;
                        }
                        Ok(None) => {}
                        Err(_) => break,
                    }
                }
                match c.q.receive(&mut buf) {
                    Ok(true) => {}
                    _ => break,
                }
            }
            let done = c.completions().len();
            if c.q.dead().is_some() {
                prop_assert_eq!(c.q.in_flight(), 0);
            }
            prop_assert!(done + c.q.in_flight() <= 3);
        }
    }
}

/// The transport reads the socket in large chunks only while no large read
/// is in flight: the count must follow every way a command leaves the
/// queue (answered, cancelled and then answered, the queue's end).
#[test]
fn large_reads_are_counted_until_they_leave_the_queue() {
    let mut c = Ctrl::new(Digests::default(), 8, 8192);
    let small = c.read(0, 4096, false);
    assert_eq!(c.q.large_reads(), 0);
    let large = c.read(1, LARGE_READ, false);
    let cancelled = c.read(2, 2 * LARGE_READ, true);
    c.write(3, pattern(3, 2 * LARGE_READ));
    assert_eq!(c.q.large_reads(), 2, "two reads of 64 KiB or more; a large write is no read");
    c.q.cancel(cancelled);
    assert_eq!(c.q.large_reads(), 2, "a cancelled read's data is still to come");
    c.send(&[c2h(small.cid, 0, pattern(0, 4096), true, true)]);
    c.send(&[c2h(large.cid, 0, pattern(1, LARGE_READ), true, true)]);
    assert_eq!(c.q.large_reads(), 1);
    c.send(&[c2h(cancelled.cid, 0, pattern(2, 2 * LARGE_READ), true, true)]);
    assert_eq!(c.q.large_reads(), 0);
    c.read(4, LARGE_READ, false);
    assert_eq!(c.q.large_reads(), 1);
    c.q.fail_all("gone");
    assert_eq!(c.q.large_reads(), 0);
}

/// The header [`HostQueue::receive_placed`] gets for piece `i`: a whole
/// transfer in one C2HData.
fn c2h_header(cid: u16, len: usize, success: bool) -> Vec<u8> {
    let h = pdu::DataPduHeader { cid, ttag: 0, offset: 0, last: true, success };
    pdu::DataHeader::new(false, &h, len as u32, Digests::default()).bytes().to_vec()
}

/// The cids of the commands the host sent, in order.
fn cids(c: &mut Ctrl) -> Vec<u16> {
    c.sent()
        .iter()
        .map(|p| match p {
            Pdu::CapsuleCmd(c) => c.sqe.cid(),
            _ => panic!("not a command"),
        })
        .collect()
}

#[test]
fn planned_reads_are_taken_only_when_the_controller_answers_in_turn() {
    let mut c = Ctrl::new(Digests::default(), 8, 8192);
    c.read(0, 4096, true);
    c.read(1, 4096, true);
    c.read(2, 8192, true);
    // No buffer of its own: the plan ends before it.
    c.read(3, 512, false);
    c.read(4, 4096, true);
    let cid = cids(&mut c);
    let mut lens = Vec::new();
    assert_eq!(c.q.plan_placed(|b| {
        lens.push(b.len());
        true
    }), 3);
    assert_eq!(lens, [4096, 4096, 8192]);
    // Piece 0 as planned, all of it: done, completed (SUCCESS).
    let d = c.q.receive_placed(0, &c2h_header(cid[0], 4096, true), 4096).expect("piece 0 taken");
    assert!(d.is_done());
    let done = c.completions();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].0.name, 0);
    assert_eq!(done[0].1.as_ref().unwrap().received, 4096);
    // Piece 1: another command's answer, another length, not a data PDU,
    // a split transfer: refused, nothing taken.
    assert!(c.q.receive_placed(1, &c2h_header(cid[2], 4096, true), 4096).is_none());
    assert!(c.q.receive_placed(1, &c2h_header(cid[1], 2048, true), 2048).is_none());
    let mut r = Vec::new();
    resp(cid[1], Status::SUCCESS).encode_into(Digests::default(), &mut r);
    assert!(c.q.receive_placed(1, &r, 0).is_none());
    let mut split = c2h_header(cid[1], 4096, true);
    split[1] &= !pdu::flags::DATA_LAST;
    assert!(c.q.receive_placed(1, &split, 4096).is_none());
    assert!(c.completions().is_empty());
    // Piece 1 in part: taken, the rest to read in place.
    let mut d = c.q.receive_placed(1, &c2h_header(cid[1], 4096, true), 100).expect("piece 1 taken");
    assert_eq!(d.left(), 3996);
    c.q.direct_fill(&mut d, |dst| Ok::<usize, ()>(dst.len())).unwrap();
    assert_eq!(c.completions()[0].0.name, 1);
    // Piece 2 without SUCCESS: its CapsuleResp completes it.
    let d = c.q.receive_placed(2, &c2h_header(cid[2], 8192, false), 8192).expect("piece 2 taken");
    assert!(d.is_done());
    assert!(c.completions().is_empty());
    c.send(&[resp(cid[2], Status::SUCCESS)]);
    let done = c.completions();
    assert_eq!((done[0].0.name, done[0].1.as_ref().unwrap().received), (2, 8192));
    // A refused buffer ends the plan; the next plan starts at read 3,
    // which has no buffer: nothing planned until it is answered.
    assert_eq!(c.q.plan_placed(|_| true), 0);
    c.send(&[c2h(cid[3], 0, pattern(3, 512), true, true)]);
    assert_eq!(c.q.plan_placed(|_| false), 0);
    assert_eq!(c.q.plan_placed(|_| true), 1);
    assert!(c.q.receive_placed(0, &c2h_header(cid[4], 4096, true), 4096).is_some());
    assert_eq!(c.q.staged_bytes(), 0);
}

#[test]
fn planned_reads_stop_at_a_write_and_go_on_after_it() {
    let mut c = Ctrl::new(Digests::default(), 8, 8192);
    c.read(0, 4096, true);
    c.write(1, pattern(1, 4096));
    c.read(2, 4096, true);
    let cid = cids(&mut c);
    assert_eq!(c.q.plan_placed(|_| true), 1);
    assert!(c.q.receive_placed(0, &c2h_header(cid[0], 4096, true), 4096).is_some());
    // The write's answer first: then the read behind it is planned.
    assert_eq!(c.q.plan_placed(|_| true), 0);
    c.send(&[resp(cid[1], Status::SUCCESS)]);
    assert_eq!(c.q.plan_placed(|_| true), 1);
    assert!(c.q.receive_placed(0, &c2h_header(cid[2], 4096, true), 4096).is_some());
    let names: Vec<u32> = c.completions().iter().map(|d| d.0.name).collect();
    assert_eq!(names, [0, 1, 2]);
}

#[test]
fn a_large_read_ends_the_plan_and_nothing_is_planned_with_digests() {
    let mut c = Ctrl::new(Digests::default(), 8, 8192);
    c.read(0, 4096, true);
    c.read(1, 1 << 20, true);
    c.read(2, 4096, true);
    assert_eq!(c.q.plan_placed(|_| true), 2);
    for d in [Digests { header: true, data: false }, Digests { header: false, data: true }] {
        let mut c = Ctrl::new(d, 8, 8192);
        c.read(0, 4096, true);
        assert_eq!(c.q.plan_placed(|_| true), 0);
    }
}

/// What `receive_placed` asked of a piece's header through the generic
/// parse before `placed_header_success`: `Some(success)` if taken.
fn placed_by_generic_parse(h: &[u8], cid: u16, len: usize) -> Option<bool> {
    let v = pdu::peek_data_header(h, Digests::default(), MAX_PLEN).ok()??;
    let bad = v.kind != pdu::kind::C2H_DATA
        || v.data_start != pdu::DATA_HLEN
        || v.data_len != len
        || v.hdr.offset != 0
        || !v.hdr.last
        || v.hdr.cid != cid
        || pdu::CommonHeader::parse(h).flags & !(pdu::flags::DATA_LAST | pdu::flags::DATA_SUCCESS) != 0;
    (!bad).then_some(v.hdr.success)
}

/// The fixed-field check of a planned piece's header gives the generic
/// parse's answer for the header a plan expects and for every one-byte
/// change of it (each byte set to 0, to 0xFF, and with each bit flipped),
/// other PDU types, other commands and other lengths.
#[test]
fn a_planned_header_is_checked_as_the_generic_parse_checks_it() {
    let mut seen = [0usize; 2];
    for &(cid, len) in &[(0u16, 1usize), (5, 512), (0x1234, 4096), (65535, 65536), (7, MAX_PLEN as usize - pdu::DATA_HLEN)] {
        for success in [false, true] {
            let good = c2h_header(cid, len, success);
            let mut hs = vec![good.clone()];
            for i in 0..pdu::DATA_HLEN {
                for v in [0u8, 0xFF] {
                    let mut h = good.clone();
                    h[i] = v;
                    hs.push(h);
                }
                for bit in 0..8 {
                    let mut h = good.clone();
                    h[i] ^= 1 << bit;
                    hs.push(h);
                }
            }
            let mut r = Vec::new();
            resp(cid, Status::SUCCESS).encode_into(Digests::default(), &mut r);
            r.resize(pdu::DATA_HLEN.max(r.len()), 0);
            hs.push(r);
            for h in &hs {
                let h24: &[u8; pdu::DATA_HLEN] = h[..pdu::DATA_HLEN].try_into().unwrap();
                for (c, l) in [(cid, len), (cid.wrapping_add(1), len), (cid, len + 1), (cid, len.saturating_sub(1).max(1))] {
                    let want = placed_by_generic_parse(h, c, l);
                    assert_eq!(placed_header_success(h24, c, l), want, "{h:02x?} cid {c} len {l}");
                    seen[want.is_some() as usize] += 1;
                }
            }
            assert_eq!(placed_header_success(good[..].try_into().unwrap(), cid, len), Some(success));
        }
    }
    assert!(seen[0] > 1000 && seen[1] > 20, "{seen:?}");
}
