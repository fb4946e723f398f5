//! Shared helpers for the bw-scsi tests: targets over RAM or temp-file
//! volumes, CDB builders and sense decoding.
#![allow(dead_code)]

use bw_block::{BackendSpec, Volume};
use bw_scsi::{status, LunConfig, NexusId, ScsiOutcome, ScsiTarget};

pub const BS: usize = 512;

pub fn ram_volume(name: &str, blocks: u64) -> Volume {
    Volume::open(name, &BackendSpec::ram(blocks * BS as u64)).unwrap()
}

pub fn target_with(vol: Volume, cfg: LunConfig) -> ScsiTarget {
    ScsiTarget::new(vec![(0, vol, cfg)])
}

pub fn ram_target(blocks: u64) -> ScsiTarget {
    target_with(ram_volume("disk", blocks), LunConfig::for_volume("disk", "iqn.2026-11.test:t", 0))
}

/// A file in a private directory of its own in the temp dir (serve makes
/// backing files only where root alone may write), removed on drop with
/// what lies beside it (file backends are write-back and so exercise the
/// flush paths; their reservations live beside them).
pub struct TempFile(pub std::path::PathBuf);
impl TempFile {
    pub fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("bw-scsi-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        TempFile(dir.join("disk.img"))
    }
    pub fn volume(&self, blocks: u64) -> Volume {
        let spec = BackendSpec::parse(&format!("file:{},size={}", self.0.display(), blocks * BS as u64)).unwrap();
        Volume::open("filedisk", &spec).unwrap()
    }
}
impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

pub fn run(t: &ScsiTarget, nexus: NexusId, cdb: &[u8], data_out: &[u8]) -> (ScsiOutcome, Vec<u8>) {
    run_lun(t, nexus, 0, cdb, data_out)
}

pub fn run_lun(t: &ScsiTarget, nexus: NexusId, lun: u64, cdb: &[u8], data_out: &[u8]) -> (ScsiOutcome, Vec<u8>) {
    let mut data_in = vec![0xEE; 7]; // must be cleared by execute
    let o = t.execute(nexus, lun, cdb, data_out, &mut data_in);
    if o.status == status::GOOD {
        assert!(o.sense.is_empty(), "GOOD with sense data");
    }
    (o, data_in)
}

/// Run and insist on GOOD; returns data-in.
pub fn good(t: &ScsiTarget, nexus: NexusId, cdb: &[u8], data_out: &[u8]) -> Vec<u8> {
    let (o, d) = run(t, nexus, cdb, data_out);
    assert_eq!(o.status, status::GOOD, "cdb {cdb:02x?} failed: sense {:02x?}", o.sense);
    d
}

/// (sense key, ASC, ASCQ) of a CHECK CONDITION.
pub fn sense(o: &ScsiOutcome) -> (u8, u8, u8) {
    assert_eq!(o.status, status::CHECK_CONDITION, "expected CHECK CONDITION, got {:#x}", o.status);
    assert_eq!(o.sense[0] & 0x7f, 0x70, "fixed format sense");
    assert!(o.sense.len() >= 14);
    (o.sense[2] & 0x0f, o.sense[12], o.sense[13])
}

/// Run and insist on CHECK CONDITION with the given key/ASC/ASCQ.
pub fn check(t: &ScsiTarget, nexus: NexusId, cdb: &[u8], data_out: &[u8], want: (u8, u8, u8)) -> ScsiOutcome {
    let (o, d) = run(t, nexus, cdb, data_out);
    assert_eq!(sense(&o), want, "cdb {cdb:02x?}");
    assert!(d.is_empty(), "no data-in on failure");
    o
}

pub const ILLEGAL_REQUEST: u8 = 0x5;
pub const INVALID_OPCODE: (u8, u8, u8) = (5, 0x20, 0);
pub const LBA_OUT_OF_RANGE: (u8, u8, u8) = (5, 0x21, 0);
pub const INVALID_FIELD_IN_CDB: (u8, u8, u8) = (5, 0x24, 0);
pub const LUN_NOT_SUPPORTED: (u8, u8, u8) = (5, 0x25, 0);
pub const INVALID_FIELD_IN_PARAM: (u8, u8, u8) = (5, 0x26, 0);
pub const PARAM_LIST_LENGTH: (u8, u8, u8) = (5, 0x1a, 0);
pub const WRITE_PROTECTED: (u8, u8, u8) = (7, 0x27, 0);
pub const POWER_ON_RESET: (u8, u8, u8) = (6, 0x29, 0);
pub const MISCOMPARE: (u8, u8, u8) = (0xe, 0x1d, 0);

pub fn read10(lba: u32, n: u16, flags: u8) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = 0x28;
    c[1] = flags;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&n.to_be_bytes());
    c
}
pub fn write10(lba: u32, n: u16, flags: u8) -> [u8; 10] {
    let mut c = read10(lba, n, flags);
    c[0] = 0x2a;
    c
}
pub fn cdb16(op: u8, flags: u8, lba: u64, n: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op;
    c[1] = flags;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&n.to_be_bytes());
    c
}
pub fn cdb12(op: u8, flags: u8, lba: u32, n: u32) -> [u8; 12] {
    let mut c = [0u8; 12];
    c[0] = op;
    c[1] = flags;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[6..10].copy_from_slice(&n.to_be_bytes());
    c
}
pub fn cdb10(op: u8, flags: u8, lba: u32, n: u16) -> [u8; 10] {
    let mut c = read10(lba, n, flags);
    c[0] = op;
    c
}
pub fn pattern(blocks: usize, seed: u8) -> Vec<u8> {
    (0..blocks * BS).map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed)).collect()
}
pub fn tur() -> [u8; 6] {
    [0; 6]
}
pub fn unmap_params(ranges: &[(u64, u32)]) -> Vec<u8> {
    let mut p = vec![0u8; 8];
    for (lba, n) in ranges {
        p.extend_from_slice(&lba.to_be_bytes());
        p.extend_from_slice(&n.to_be_bytes());
        p.extend_from_slice(&[0; 4]);
    }
    let total = (p.len() - 2) as u16;
    let bd = (p.len() - 8) as u16;
    p[0..2].copy_from_slice(&total.to_be_bytes());
    p[2..4].copy_from_slice(&bd.to_be_bytes());
    p
}
pub fn unmap_cdb(len: u16) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = 0x42;
    c[7..9].copy_from_slice(&len.to_be_bytes());
    c
}
