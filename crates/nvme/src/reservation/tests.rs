//! Reservations through the I/O queue's entry point (`nvm_io::execute`),
//! as a host's commands reach them.

use super::*;
use crate::nvm_io::execute;
use crate::queue_entry::{nvm, sgl, Sgl};
use bw_block::{BackendSpec, Volume};

fn subsys() -> Subsystem {
    let v = Volume::open("v", &BackendSpec::ram(64 * 512)).unwrap();
    Subsystem {
        nqn: "nqn.t:s".into(),
        serial: "s".into(),
        model: "m".into(),
        namespaces: vec![Namespace::new("nqn.t:s", 1, v, false)],
        allowed_hosts: vec![],
        ana: Default::default(),
    }
}

fn cmd(op: u8, cdw10: u32, len: u32) -> Sqe {
    let mut s = Sqe::new(op, 1, 1);
    s.set_cdw(10, cdw10);
    s.set_sgl(Sgl { addr: 0, length: len, kind: sgl::INCAPSULE });
    s
}
fn keys(a: u64, b: u64) -> Vec<u8> {
    [a.to_le_bytes(), b.to_le_bytes()].concat()
}
fn reg(s: &Subsystem, h: &Host, rrega: u32, crkey: u64, nrkey: u64) -> Status {
    execute(s, h, &cmd(nvm::RESV_REGISTER, rrega, 16), &keys(crkey, nrkey)).status
}
fn acq(s: &Subsystem, h: &Host, racqa: u32, rtype: u32, crkey: u64, prkey: u64) -> Status {
    execute(s, h, &cmd(nvm::RESV_ACQUIRE, racqa | rtype << 8, 16), &keys(crkey, prkey)).status
}
fn rel(s: &Subsystem, h: &Host, rrela: u32, rtype: u32, crkey: u64) -> Status {
    execute(s, h, &cmd(nvm::RESV_RELEASE, rrela | rtype << 8, 8), &crkey.to_le_bytes()).status
}
/// (gen, rtype, [(rcsts, rkey)]) from an extended report.
fn report(s: &Subsystem, h: &Host) -> (u32, u8, Vec<(u8, u64)>) {
    let mut c = cmd(nvm::RESV_REPORT, 4096 / 4 - 1, 4096);
    c.set_cdw(11, 1);
    let d = execute(s, h, &c, &[]).data.unwrap();
    let n = u16::from_le_bytes([d[5], d[6]]) as usize;
    let regs = (0..n).map(|i| (d[64 + 64 * i + 2], u64::from_le_bytes(d[64 + 64 * i + 8..][..8].try_into().unwrap()))).collect();
    (u32::from_le_bytes(d[..4].try_into().unwrap()), d[4], regs)
}
fn write(s: &Subsystem, h: &Host) -> Status {
    let mut c = Sqe::new(nvm::WRITE, 1, 1);
    c.set_rw(0, 1);
    c.set_sgl(Sgl { addr: 0, length: 512, kind: sgl::INCAPSULE });
    execute(s, h, &c, &[0u8; 512]).status
}

/// blktests nvme/054's sequence, with the generations and report
/// fields its expected output has (Linux nvmet's answers).
#[test]
fn blktests_054_sequence() {
    let s = subsys();
    let h = Host::new([1; 16], "nqn.t:h");
    assert_eq!(report(&s, &h), (0, 0, vec![]));
    assert_eq!(reg(&s, &h, 0, 0, 4), Status::SUCCESS);
    assert_eq!(report(&s, &h), (1, 0, vec![(0, 4)]));
    assert_eq!(reg(&s, &h, 2, 4, 5), Status::SUCCESS); // replace
    assert_eq!(report(&s, &h), (2, 0, vec![(0, 5)]));
    assert_eq!(reg(&s, &h, 1, 5, 0), Status::SUCCESS); // unregister
    assert_eq!(report(&s, &h), (3, 0, vec![]));
    assert_eq!(reg(&s, &h, 0, 0, 4), Status::SUCCESS);
    assert_eq!(acq(&s, &h, 0, 1, 4, 0), Status::SUCCESS);
    assert_eq!(report(&s, &h), (4, 1, vec![(1, 4)]));
    assert_eq!(acq(&s, &h, 1, 2, 4, 4), Status::SUCCESS); // preempt itself to EA
    assert_eq!(report(&s, &h), (5, 2, vec![(1, 4)]));
    assert_eq!(rel(&s, &h, 0, 2, 4), Status::SUCCESS);
    assert_eq!(report(&s, &h), (5, 0, vec![(0, 4)]));
    assert_eq!(acq(&s, &h, 0, 1, 4, 0), Status::SUCCESS);
    assert_eq!(report(&s, &h), (5, 1, vec![(1, 4)]));
    assert_eq!(rel(&s, &h, 1, 0, 4), Status::SUCCESS); // clear
    assert_eq!(report(&s, &h), (6, 0, vec![]));
}

#[test]
fn a_reservation_fences_other_hosts_and_refuses_bad_keys() {
    let s = subsys();
    let (a, b) = (Host::new([1; 16], "nqn.t:h"), Host::new([2; 16], "nqn.t:h"));
    assert_eq!(reg(&s, &a, 0, 0, 0xA), Status::SUCCESS);
    assert_eq!(reg(&s, &a, 0, 0, 0xA), Status::SUCCESS, "registering the same key again");
    assert_eq!(reg(&s, &a, 0, 0, 0xB), Status::RESERVATION_CONFLICT.dnr());
    assert_eq!(reg(&s, &a, 0, 0, 0), Status::INVALID_FIELD.dnr());
    assert_eq!(acq(&s, &a, 0, 1, 0x99, 0), Status::RESERVATION_CONFLICT.dnr(), "wrong key");
    assert_eq!(acq(&s, &a, 0, 7, 0xA, 0), Status::INVALID_FIELD.dnr(), "no such type");
    assert_eq!(acq(&s, &a, 0, 1, 0xA, 0), Status::SUCCESS);
    assert_eq!(write(&s, &b), Status::RESERVATION_CONFLICT.dnr());
    assert_eq!(write(&s, &a), Status::SUCCESS);
    assert_eq!(acq(&s, &b, 0, 1, 0xB, 0), Status::RESERVATION_CONFLICT.dnr(), "not registered");
    assert_eq!(rel(&s, &a, 0, 2, 0xA), Status::INVALID_FIELD.dnr(), "release of another type");
    // B registers and preempts A.
    assert_eq!(reg(&s, &b, 0, 0, 0xB), Status::SUCCESS);
    assert_eq!(acq(&s, &b, 1, 1, 0xB, 0xA), Status::SUCCESS);
    assert_eq!(write(&s, &a), Status::RESERVATION_CONFLICT.dnr());
    assert_eq!(report(&s, &a).2, vec![(1, 0xB)]);
    // The report without the extended structure: 64-bit host ids do not exist here.
    assert_eq!(execute(&s, &a, &cmd(nvm::RESV_REPORT, 15, 64), &[]).status, Status::HOST_ID_INCONSISTENT.dnr());
    // Sizes a host chooses: NUMD past MDTS (up to 16 GiB) fails before
    // anything is allocated by it, as does an SGL of another length;
    // a short report is the page's start.
    let sized = |numd: u32, len: u32| {
        let mut c = cmd(nvm::RESV_REPORT, numd, len);
        c.set_cdw(11, 1);
        execute(&s, &a, &c, &[])
    };
    assert_eq!(sized(u32::MAX, u32::MAX).status, Status::INVALID_FIELD.dnr());
    assert_eq!(sized(crate::limits::MAX_TRANSFER / 4, u32::MAX).status, Status::INVALID_FIELD.dnr());
    assert_eq!(sized(15, u32::MAX).status, Status::SGL_INVALID_DATA.dnr());
    assert_eq!(sized(15, 32).status, Status::SGL_INVALID_DATA.dnr());
    let short = sized(3, 16);
    assert_eq!((short.status, short.data.map(|d| d.len())), (Status::SUCCESS, Some(16)));
    let max = sized(crate::limits::MAX_TRANSFER / 4 - 1, crate::limits::MAX_TRANSFER);
    assert_eq!((max.status, max.data.map(|d| d.len())), (Status::SUCCESS, Some(crate::limits::MAX_TRANSFER as usize)));
}
