//! What an iSCSI initiator with no credentials can make `blockwire serve`
//! hold or write, probed with a raw TCP client (issue 24): an endless
//! unsolicited Data-Out burst, more write data withheld than a connection
//! may hold, and names from the wire that would forge log lines.

use crate::common::*;
use crate::load::{proc_stats, Sampler};
use bw_iscsi::msg::{DataOut, LoginRequest, Message, NopOut, ScsiCommand};
use bw_iscsi::pdu::{field, Bhs, Decoder, Digests, Pdu};
use bytes::{Bytes, BytesMut};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const IQN: &str = "iqn.2026-11.org.blockwire.test:hostile";
const K: u32 = 1024;

fn target() -> (TempDir, Serve, u16) {
    let dir = TempDir::new("iscsi-hostile");
    let port = free_port();
    let toml = format!(
        "[[volume]]\nname = \"v\"\nbackend = \"ram:64M\"\n\
         [iscsi]\nlisten = [\"127.0.0.1:{port}\"]\n\
         [[iscsi.target]]\niqn = \"{IQN}\"\nluns = [{{ lun = 0, volume = \"v\" }}]\n"
    );
    let serve = Serve::with_config(&dir, &toml, &[]);
    (dir, serve, port)
}

/// A raw initiator connection; every wait is bounded.
struct Client {
    s: TcpStream,
    inbox: BytesMut,
    dec: Decoder,
    cmd_sn: u32,
}

impl Client {
    /// Log in to [`IQN`] offering `keys` (no digests), as `initiator`.
    /// Returns the client and the Login Response's status (0: logged in).
    fn login(port: u16, initiator: &str, keys: &[(&str, &str)]) -> (Client, u16) {
        Client::login_to(port, initiator, IQN, keys)
    }

    /// A login that must succeed (status 0).
    fn logged_in(port: u16, initiator: &str, keys: &[(&str, &str)]) -> Client {
        let (c, status) = Client::login(port, initiator, keys);
        assert_eq!(status, 0, "login of {initiator:?} refused");
        c
    }

    fn login_to(port: u16, initiator: &str, target: &str, keys: &[(&str, &str)]) -> (Client, u16) {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_nodelay(true).expect("nodelay");
        s.set_write_timeout(Some(Duration::from_secs(30))).expect("write timeout");
        let mut c = Client { s, inbox: BytesMut::new(), dec: Decoder::new(1 << 20), cmd_sn: 1 };
        let mut pairs = vec![("InitiatorName", initiator), ("TargetName", target), ("SessionType", "Normal"), ("HeaderDigest", "None"), ("DataDigest", "None")];
        pairs.extend_from_slice(keys);
        let login = LoginRequest { transit: true, csg: 1, nsg: 3, isid: [0x80, 0, 0, 0, 0, 24], cmd_sn: 1, ..Default::default() };
        c.send(Message::LoginRequest(login).encode(), Bytes::from(bw_iscsi::text::encode(&pairs)));
        let p = c.next_pdu(Duration::from_secs(10)).expect("no Login Response");
        let status = u16::from(p.bhs.get(field::STATUS_CLASS)) << 8 | u16::from(p.bhs.get(field::STATUS_DETAIL));
        c.cmd_sn = p.bhs.get(field::EXP_CMD_SN);
        (c, status)
    }

    /// Send one PDU; `false` once the target has closed the connection.
    fn send(&mut self, bhs: Bhs, data: Bytes) -> bool {
        self.s.write_all(&Pdu::new(bhs, data).encode(Digests::default())).is_ok()
    }

    /// The next PDU from the target within `wait` (keep-alive NOP-Ins
    /// aside); `None` on close or timeout.
    fn next_pdu(&mut self, wait: Duration) -> Option<Pdu> {
        let deadline = Instant::now() + wait;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            if let Some(p) = self.dec.decode(&mut self.inbox).expect("a PDU the target sent does not parse") {
                // The target's keep-alive pings (every 15 s) are not answers.
                if p.bhs.0[0] & 0x3F == 0x20 && p.bhs.itt() == 0xFFFF_FFFF {
                    continue;
                }
                return Some(p);
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            self.s.set_read_timeout(Some(left.max(Duration::from_millis(1)))).ok()?;
            match self.s.read(&mut buf) {
                Ok(0) => return None,
                Ok(n) => self.inbox.extend_from_slice(&buf[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
                Err(_) => return None,
            }
        }
    }

    /// A WRITE(16) of `blocks` 512-byte blocks at LBA `lba`; `final_`
    /// false announces unsolicited Data-Out.
    fn write(&mut self, itt: u32, lba: u64, blocks: u32, final_: bool) -> bool {
        let cdb = bw_scsi::initiator::write_16(lba, blocks);
        let c = ScsiCommand { final_, write: true, itt, edtl: blocks * 512, cmd_sn: self.cmd_sn, cdb, ..Default::default() };
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        self.send(Message::ScsiCommand(c).encode(), Bytes::new())
    }

    /// A WRITE(16) carrying `data` as immediate data (F set: nothing more
    /// follows unsolicited).
    fn write_immediate(&mut self, itt: u32, lba: u64, data: Bytes) -> bool {
        let blocks = (data.len() / 512) as u32;
        let cdb = bw_scsi::initiator::write_16(lba, blocks);
        let c = ScsiCommand { final_: true, write: true, itt, edtl: data.len() as u32, cmd_sn: self.cmd_sn, cdb, ..Default::default() };
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        self.send(Message::ScsiCommand(c).encode(), data)
    }

    /// READ(16) of `blocks` 512-byte blocks at `lba`: the data, or `None`
    /// if the command failed or the connection ended.
    fn read(&mut self, itt: u32, lba: u64, blocks: u32) -> Option<Vec<u8>> {
        let cdb = bw_scsi::initiator::read_16(lba, blocks);
        let c = ScsiCommand { final_: true, read: true, itt, edtl: blocks * 512, cmd_sn: self.cmd_sn, cdb, ..Default::default() };
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        if !self.send(Message::ScsiCommand(c).encode(), Bytes::new()) {
            return None;
        }
        let mut data = vec![0u8; blocks as usize * 512];
        loop {
            let p = self.next_pdu(Duration::from_secs(30))?;
            match Message::decode(&p.bhs) {
                Ok(Message::DataIn(d)) if d.itt == itt => {
                    let at = d.buffer_offset as usize;
                    data[at..at + p.data.len()].copy_from_slice(&p.data);
                    if d.has_status {
                        return (d.status == bw_scsi::status::GOOD).then_some(data);
                    }
                }
                Ok(Message::ScsiResponse(r)) if r.itt == itt => return (r.status == bw_scsi::status::GOOD).then_some(data),
                _ => {}
            }
        }
    }

    fn data_out(&mut self, itt: u32, ttt: u32, data_sn: u32, buffer_offset: u32, data: Bytes, final_: bool) -> bool {
        let d = DataOut { final_, itt, ttt, data_sn, buffer_offset, ..Default::default() };
        self.send(Message::DataOut(d).encode(), data)
    }

    /// Every PDU the target sends before the answer to a NOP-Out ping
    /// (PDUs are answered in order, so this is all that what came before
    /// the ping produced), without the answer.
    fn until_ping_answered(&mut self) -> Vec<Pdu> {
        let n = NopOut { immediate: true, itt: 0x7000_0000, ttt: 0xFFFF_FFFF, cmd_sn: self.cmd_sn, ..Default::default() };
        assert!(self.send(Message::NopOut(n).encode(), Bytes::new()), "connection closed");
        let mut seen = Vec::new();
        loop {
            let p = self.next_pdu(Duration::from_secs(30)).expect("no answer to a NOP-Out ping");
            if p.bhs.0[0] & 0x3F == 0x20 && p.bhs.itt() == 0x7000_0000 {
                return seen;
            }
            seen.push(p);
        }
    }

    /// The SCSI Response to `itt`, skipping anything else.
    fn response(&mut self, itt: u32) -> Option<Pdu> {
        self.until_response(itt).pop()
    }

    /// Every PDU up to and with the SCSI Response to `itt` (none if the
    /// connection closes first).
    fn until_response(&mut self, itt: u32) -> Vec<Pdu> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut seen = Vec::new();
        loop {
            let Some(p) = self.next_pdu(deadline.saturating_duration_since(Instant::now())) else { return Vec::new() };
            let done = p.bhs.0[0] & 0x3F == 0x21 && p.bhs.itt() == itt;
            seen.push(p);
            if done {
                return seen;
            }
        }
    }
}

fn is_r2t(p: &Pdu) -> bool {
    p.bhs.0[0] & 0x3F == 0x31
}

/// The probe of issue 24: with InitialR2T=No, one 4 MiB WRITE, then 192
/// MiB of 256 KiB unsolicited Data-Out PDUs all at offset 0 with F=0 and a
/// counting DataSN. The target took every one (9 MB -> 231 MB of RSS, freed
/// only at disconnect). Now the second PDU, which does not continue where
/// the first ended, fails the task with CHECK CONDITION (ABORTED COMMAND,
/// DATA PHASE ERROR), the rest are dropped, the target's memory stays flat
/// and the session goes on.
#[test]
fn iscsi_unsolicited_data_out_flood_is_bounded() {
    let (_dir, mut serve, port) = target();
    let pid = serve.pid();
    let keys = [
        ("InitialR2T", "No"),
        ("ImmediateData", "Yes"),
        ("FirstBurstLength", "262144"),
        ("MaxBurstLength", "1048576"),
        ("MaxRecvDataSegmentLength", "262144"),
    ];
    let mut c = Client::logged_in(port, "iqn.2026-11.org.blockwire.test:flood", &keys);
    let before = proc_stats(pid);
    let sampler = Sampler::start(pid);
    assert!(c.write(1, 0, (4 << 20) / 512, false));
    let piece = Bytes::from(vec![0xA5u8; 256 * K as usize]);
    let mut sent = 0u64;
    for data_sn in 0..768u32 {
        if !c.data_out(1, 0xFFFF_FFFF, data_sn, 0, piece.clone(), false) {
            break;
        }
        sent += piece.len() as u64;
    }
    let response = c.response(1);
    let peak = sampler.finish();
    let grown_kib = peak.rss_kib.saturating_sub(before.rss_kib);
    eprintln!("unsolicited flood: {} MiB sent; target VmRSS {} -> peak {} KiB (+{grown_kib} KiB)", sent >> 20, before.rss_kib, peak.rss_kib);
    assert_eq!(sent, 192 << 20, "the target closed the connection during the flood");
    assert!(grown_kib < 64 * 1024, "192 MiB of repeated unsolicited Data-Out grew the target by {grown_kib} KiB");
    let r = response.expect("no SCSI Response for the WRITE whose Data-Out repeated offset 0");
    assert_eq!(r.bhs.0[3], bw_scsi::status::CHECK_CONDITION);
    // Sense: length (2 bytes), then fixed format: key 0x0B, ASC/ASCQ 4B/00.
    assert_eq!((r.data[2 + 2] & 0x0F, r.data[2 + 12], r.data[2 + 13]), (0x0B, 0x4B, 0x00), "sense {:02x?}", &r.data[..]);
    // The session still works: a WRITE done right (256 KiB unsolicited in
    // order, the rest by R2T) completes.
    assert!(c.write(2, 0, (1 << 20) / 512, false));
    for i in 0..4u32 {
        assert!(c.data_out(2, 0xFFFF_FFFF, i, i * 64 * K, Bytes::from(vec![7u8; 64 * K as usize]), i == 3));
    }
    let r2t = c.next_pdu(Duration::from_secs(30)).expect("no R2T after the unsolicited burst");
    assert!(is_r2t(&r2t), "expected an R2T, got opcode {:#x}", r2t.bhs.0[0]);
    let (ttt, offset, len) = (r2t.bhs.get(field::TTT), r2t.bhs.get(field::BUFFER_OFFSET), r2t.bhs.get(field::DESIRED_LENGTH));
    assert_eq!((offset, len), (256 * K, 768 * K));
    for i in 0..3u32 {
        assert!(c.data_out(2, ttt, i, offset + i * 256 * K, Bytes::from(vec![7u8; 256 * K as usize]), i == 2));
    }
    let r = c.response(2).expect("no SCSI Response for a well-formed WRITE");
    assert_eq!(r.bhs.0[3], bw_scsi::status::GOOD);
    assert!(serve.is_running());
    assert!(serve.stop().success());
}

/// Write data withheld by one byte: 128 WRITEs of 4 MiB (the whole command
/// window) would each be given R2Ts, 512 MiB the target would hold for one
/// connection. Now only the commands whose data fits the per-connection
/// budget (16 MiB) are served; the next is served when one of those
/// completes.
#[test]
fn iscsi_write_data_out_budget_per_connection() {
    let (_dir, mut serve, port) = target();
    let keys = [("InitialR2T", "Yes"), ("ImmediateData", "No"), ("MaxBurstLength", "1048576"), ("MaxOutstandingR2T", "1")];
    let mut c = Client::logged_in(port, "iqn.2026-11.org.blockwire.test:budget", &keys);
    let blocks = (4 << 20) / 512;
    for itt in 0..128u32 {
        assert!(c.write(itt, u64::from(itt % 8) * u64::from(blocks), blocks, true), "connection closed");
    }
    let first: Vec<Pdu> = c.until_ping_answered().into_iter().filter(is_r2t).collect();
    let served: Vec<u32> = first.iter().map(|p| p.bhs.itt()).collect();
    assert_eq!(served, vec![0, 1, 2, 3], "R2Ts for the first 128 WRITEs of 4 MiB");
    // Complete the first: its four 1 MiB bursts, each asked for by an R2T.
    let mut r2t = first.into_iter().next().expect("an R2T");
    for burst in 0..4u32 {
        let (ttt, offset) = (r2t.bhs.get(field::TTT), r2t.bhs.get(field::BUFFER_OFFSET));
        assert_eq!(offset, burst << 20);
        for i in 0..4u32 {
            assert!(c.data_out(0, ttt, i, offset + i * 256 * K, Bytes::from(vec![9u8; 256 * K as usize]), i == 3));
        }
        if burst < 3 {
            r2t = c.next_pdu(Duration::from_secs(30)).expect("no next R2T");
            assert!(is_r2t(&r2t) && r2t.bhs.itt() == 0, "expected the next R2T of the first WRITE");
        }
    }
    // The WRITE runs (perhaps on another thread); its SCSI Response and the
    // R2T its end makes room for come together.
    let mut done = c.until_response(0);
    let resp = done.pop().expect("no SCSI Response for the completed WRITE");
    assert_eq!(resp.bhs.0[3], bw_scsi::status::GOOD);
    done.extend(c.until_ping_answered());
    let next: Vec<u32> = done.iter().filter(|p| is_r2t(p)).map(|p| p.bhs.itt()).collect();
    assert_eq!(next, vec![4], "the completed WRITE's budget goes to the next one in line");
    assert!(serve.is_running());
    assert!(serve.stop().success());
}

/// The opcode of a PDU.
fn opcode(p: &Pdu) -> u8 {
    p.bhs.0[0] & 0x3F
}

/// Immediate data within what was negotiated is written with no R2T round
/// trip (the 4 KiB write of open-iscsi and libiscsi: one PDU each way);
/// more than FirstBurstLength of it, or any when ImmediateData=No was
/// negotiated, is refused (a Reject, then the connection ends) and nothing
/// of it is written.
#[test]
fn iscsi_immediate_data_within_the_negotiated_bounds_only() {
    let (_dir, mut serve, port) = target();
    let keys = [("InitialR2T", "No"), ("ImmediateData", "Yes"), ("FirstBurstLength", "8192"), ("MaxRecvDataSegmentLength", "262144")];
    let mut c = Client::logged_in(port, "iqn.2026-11.org.blockwire.test:imm", &keys);
    let block = Bytes::from((0..4096u32).map(|i| (i % 251) as u8 + 1).collect::<Vec<u8>>());
    assert!(c.write_immediate(1, 8, block.clone()));
    let answer = c.until_ping_answered();
    assert!(!answer.iter().any(is_r2t), "an R2T for a write whose data all came with the command");
    let r = answer.iter().find(|p| opcode(p) == 0x21 && p.bhs.itt() == 1).expect("no SCSI Response to a 4 KiB write with immediate data");
    assert_eq!(r.bhs.0[3], bw_scsi::status::GOOD);
    assert_eq!(c.read(2, 8, 8).as_deref(), Some(&block[..]), "the immediate data was not written");
    // 64 KiB of immediate data against FirstBurstLength 8192: refused.
    let big = Bytes::from(vec![0xEEu8; 64 * 1024]);
    assert!(c.write_immediate(3, 64, big.clone()));
    let p = c.next_pdu(Duration::from_secs(30)).expect("no answer to immediate data past FirstBurstLength");
    assert_eq!(opcode(&p), 0x3F, "expected a Reject, got opcode {:#x}", opcode(&p));
    assert!(c.next_pdu(Duration::from_secs(30)).is_none(), "the connection stays up after immediate data past FirstBurstLength");
    // ImmediateData=No negotiated: 4 KiB of it is refused as well.
    let keys = [("InitialR2T", "Yes"), ("ImmediateData", "No")];
    let mut c = Client::logged_in(port, "iqn.2026-11.org.blockwire.test:imm-no", &keys);
    assert!(c.write_immediate(4, 200, block.clone()));
    let p = c.next_pdu(Duration::from_secs(30)).expect("no answer to immediate data with ImmediateData=No");
    assert_eq!(opcode(&p), 0x3F, "expected a Reject, got opcode {:#x}", opcode(&p));
    assert!(c.next_pdu(Duration::from_secs(30)).is_none());
    // Nothing of either refused write is on the volume.
    let mut c = Client::logged_in(port, "iqn.2026-11.org.blockwire.test:check", &[]);
    assert_eq!(c.read(5, 64, 128), Some(vec![0u8; 64 * 1024]), "refused immediate data was written");
    assert_eq!(c.read(6, 200, 8), Some(vec![0u8; 4096]), "refused immediate data was written");
    assert!(serve.is_running());
    assert!(serve.stop().success());
}

/// A hostile initiator sends more unsolicited Data-Out than it negotiated
/// (FirstBurstLength 64 KiB) for eight 4 MiB WRITEs at once: in order and
/// on past the burst's end (or one PDU straddling it), up to the end of
/// each write, 32 MiB in all. Each task fails with DATA PHASE ERROR at the
/// first byte past its burst and the rest is dropped: the target holds no
/// more than the negotiated bursts (a target that took it all would hold
/// 32 MiB), writes nothing of it, and the session goes on.
#[test]
fn iscsi_unsolicited_data_past_first_burst_is_refused_and_not_held() {
    let (_dir, mut serve, port) = target();
    let pid = serve.pid();
    let keys = [("InitialR2T", "No"), ("ImmediateData", "Yes"), ("FirstBurstLength", "65536"), ("MaxBurstLength", "262144"), ("MaxRecvDataSegmentLength", "262144")];
    let mut c = Client::logged_in(port, "iqn.2026-11.org.blockwire.test:burst", &keys);
    let before = proc_stats(pid);
    let sampler = Sampler::start(pid);
    let piece = |n: usize| Bytes::from(vec![0x5Au8; n]);
    const WRITE: u32 = 4 << 20;
    // The burst before the flood, as (offset, length): one PDU straddling
    // its end, or the whole burst and then an unsolicited PDU after it.
    let bursts: [&[(u32, usize)]; 2] = [&[(0, 16 * 1024), (16 * K, 16 * 1024), (32 * K, 16 * 1024), (48 * K, 32 * 1024)], &[(0, 64 * 1024), (64 * K, 64 * 1024)]];
    let itts: Vec<u32> = (10..18).collect();
    let mut next = vec![0u32; itts.len()];
    let mut sn = vec![0u32; itts.len()];
    for (i, &itt) in itts.iter().enumerate() {
        assert!(c.write(itt, u64::from(itt - 10) * u64::from(WRITE / 512), WRITE / 512, false));
        for &(off, len) in bursts[i % 2] {
            assert!(c.data_out(itt, 0xFFFF_FFFF, sn[i], off, piece(len), false), "connection closed");
            sn[i] += 1;
            next[i] = off + len as u32;
        }
    }
    // The flood: on in order, 256 KiB at a time, every write to its end.
    let mut sent = 0usize;
    loop {
        let mut any = false;
        for (i, &itt) in itts.iter().enumerate() {
            let len = (WRITE.saturating_sub(next[i])).min(256 * K) as usize;
            if len == 0 {
                continue;
            }
            assert!(c.data_out(itt, 0xFFFF_FFFF, sn[i], next[i], piece(len), false), "the target closed the connection during the flood");
            sn[i] += 1;
            next[i] += len as u32;
            sent += len;
            any = true;
        }
        if !any {
            break;
        }
    }
    for &itt in &itts {
        let r = c.response(itt).expect("no SCSI Response for a write whose unsolicited data ran past FirstBurstLength");
        assert_eq!(r.bhs.0[3], bw_scsi::status::CHECK_CONDITION, "unsolicited data past FirstBurstLength was taken");
        assert_eq!((r.data[2 + 2] & 0x0F, r.data[2 + 12], r.data[2 + 13]), (0x0B, 0x4B, 0x00), "sense {:02x?}", &r.data[..]);
    }
    let peak = sampler.finish();
    let grown_kib = peak.rss_kib.saturating_sub(before.rss_kib);
    eprintln!("unsolicited data past FirstBurstLength: {} MiB sent; target VmRSS {} -> peak {} KiB (+{grown_kib} KiB)", sent >> 20, before.rss_kib, peak.rss_kib);
    assert!(grown_kib < 8 * 1024, "the target held {grown_kib} KiB of unsolicited data past the negotiated bursts");
    // Nothing of it was written, and the session still works.
    for (i, &itt) in itts.iter().enumerate().take(2) {
        assert_eq!(c.read(20 + i as u32, u64::from(itt - 10) * u64::from(WRITE / 512), 128), Some(vec![0u8; 64 * 1024]), "refused unsolicited data was written");
    }
    assert!(serve.is_running());
    assert!(serve.stop().success());
}

/// Every line with the forged name is a log record of its own (env_logger
/// indents the lines a newline inside a record starts).
fn one_record_per_line(log: &str) -> bool {
    log.lines().filter(|l| l.contains("FORGED")).all(|l| l.starts_with('['))
}

/// Names from the wire are logged escaped: an InitiatorName with a newline
/// does not start a line of its own in the target's log. Names over 223
/// bytes are refused at login.
#[test]
fn iscsi_initiator_names_are_logged_escaped() {
    let (_dir, serve, port) = target();
    let forged = "iqn.2026-11.org.blockwire.test:a\nFORGED-iSCSI-LINE";
    let mut c = Client::logged_in(port, forged, &[]);
    c.until_ping_answered();
    drop(c);
    // The target logs the session before it answers anything in it; its
    // log reaches us through a pipe: wait for the name to arrive (`times`
    // lines with it, escaped or not).
    let logged = |times: usize| {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let log = serve.log_text();
            if log.matches("FORGED-iSCSI-LINE").count() >= times {
                return log;
            }
            assert!(Instant::now() < deadline, "no log line with the name:\n{log}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let log = logged(1);
    assert!(one_record_per_line(&log), "a name from the wire forged a log line:\n{log}");
    // A refused login logs the name too.
    let (_, status) = Client::login_to(port, forged, "iqn.2026-11.org.blockwire.test:no-such-target", &[]);
    assert_eq!(status, bw_iscsi::msg::login_status::NOT_FOUND);
    let log = logged(2);
    assert!(log.contains("refused with status 0x0203"), "{log}");
    assert!(one_record_per_line(&log), "a name from the wire forged a log line:\n{log}");
    // A name over 223 bytes is refused as an initiator error.
    let (_, status) = Client::login(port, &format!("iqn.2026-11.org.blockwire.test:{}", "x".repeat(200)), &[]);
    assert_eq!(status, bw_iscsi::msg::login_status::INITIATOR_ERROR, "a 231-byte InitiatorName");
    assert!(serve.stop().success());
}
