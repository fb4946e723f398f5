//! A raw NVMe/TCP connection for tests that speak the protocol by hand
//! (hostile input, authentication): ICReq, then PDUs and commands one at a
//! time, with the target's answers as they come.

use bw_nvme::fabrics::{Connect, ConnectData};
use bw_nvme::pdu::{self, Digests, IcReq, Pdu};
use bw_nvme::queue_entry::Sqe;
use bw_nvme::Cqe;
use bytes::BytesMut;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// One raw connection after its ICReq.
pub struct RawNvme {
    pub s: TcpStream,
    buf: BytesMut,
}

/// What the target did with a connection: sent these PDUs, then closed it
/// (`closed`) or went quiet.
pub struct Seen {
    pub pdus: Vec<Pdu>,
    pub closed: bool,
}

impl RawNvme {
    /// How long an answer may take on a busy machine (an upper bound, not a
    /// measurement).
    pub const WAIT: Duration = Duration::from_secs(20);

    /// Connect and exchange ICReq/ICResp.
    pub fn open(port: u16) -> RawNvme {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let ic = Pdu::IcReq(IcReq { pfv: 0, hpda: 0, digests: Digests::default(), maxr2t: 0 });
        s.write_all(&ic.encode_parts(Digests::default()).concat()).unwrap();
        let mut r = RawNvme { s, buf: BytesMut::new() };
        assert!(matches!(r.next(Self::WAIT), Some(Pdu::IcResp(_))));
        r
    }

    /// [`RawNvme::open`] and a Connect of queue `qid` of `subnqn` (to
    /// controller `cntlid` for an I/O queue), with its completion.
    pub fn connected(port: u16, subnqn: &str, qid: u16, cntlid: u16, hostnqn: &str, hostid: [u8; 16]) -> (RawNvme, Cqe) {
        let mut q = RawNvme::open(port);
        let kato_ms = if qid == 0 { 30_000 } else { 0 };
        let cqe = q.connect(subnqn, qid, cntlid, hostnqn, hostid, kato_ms).expect("Connect answered");
        (q, cqe)
    }

    /// A Connect command on this connection; None if the target closed it.
    pub fn connect(&mut self, subnqn: &str, qid: u16, cntlid: u16, hostnqn: &str, hostid: [u8; 16], kato_ms: u32) -> Option<Cqe> {
        let c = Connect { recfmt: 0, qid, sqsize: 31, cattr: 0, kato_ms };
        let d = ConnectData { hostid, cntlid, subnqn: subnqn.into(), hostnqn: hostnqn.into() };
        self.command(c.to_sqe(1), &d.encode())
    }

    /// The next PDU within `wait`; None when the target closed the
    /// connection or sent nothing for that long.
    pub fn next(&mut self, wait: Duration) -> Option<Pdu> {
        self.s.set_read_timeout(Some(wait)).unwrap();
        loop {
            if let Some(p) = pdu::decode(&mut self.buf, Digests::default(), 1 << 24).unwrap() {
                return Some(p);
            }
            let mut b = [0u8; 4096];
            match self.s.read(&mut b) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&b[..n]),
            }
        }
    }

    /// Every PDU until the target closes the connection, or `want` PDUs
    /// have come, or it has been quiet for `wait`.
    pub fn until_closed(&mut self, want: usize, wait: Duration) -> Seen {
        let mut pdus = Vec::new();
        self.s.set_read_timeout(Some(wait)).unwrap();
        loop {
            while let Ok(Some(p)) = pdu::decode(&mut self.buf, Digests::default(), 1 << 24) {
                pdus.push(p);
            }
            if pdus.len() >= want {
                return Seen { pdus, closed: false };
            }
            let mut b = [0u8; 4096];
            match self.s.read(&mut b) {
                Ok(0) => return Seen { pdus, closed: true },
                Ok(n) => self.buf.extend_from_slice(&b[..n]),
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return Seen { pdus, closed: true },
                Err(_) => return Seen { pdus, closed: false },
            }
        }
    }

    /// A command's completion (data read is dropped); None if the target
    /// closed the connection instead.
    pub fn command(&mut self, sqe: Sqe, data: &[u8]) -> Option<Cqe> {
        self.exchange(sqe, data).map(|(c, _)| c)
    }

    /// A command and its completion with the data read; None if the
    /// target closed the connection instead.
    pub fn exchange(&mut self, sqe: Sqe, data: &[u8]) -> Option<(Cqe, Vec<u8>)> {
        let mut out = Vec::new();
        pdu::encode_capsule(&sqe, data, Digests::default(), &mut out);
        self.s.write_all(&out).ok()?;
        let mut read = Vec::new();
        loop {
            match self.next(Self::WAIT)? {
                Pdu::CapsuleResp(c) => return Some((c, read)),
                Pdu::C2HData(d) => read.extend_from_slice(&d.data),
                p => panic!("unexpected PDU {:#x}", p.kind()),
            }
        }
    }
}
