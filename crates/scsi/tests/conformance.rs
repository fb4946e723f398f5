//! Byte-level checks of the commands added for the administrators' tools
//! (sg3-utils, smartctl): GET LBA STATUS from the volume's real allocation,
//! LOG SENSE through the target, REPORT TARGET PORT GROUPS and the ALUA
//! bits of INQUIRY, and refusal of media access in standby.

mod common;
use bw_scsi::{AluaState, LunConfig, PortGroup};
use common::*;

fn get_lba_status(lba: u64, alloc: u32, report: u8) -> [u8; 16] {
    let mut c = cdb16(0x9e, 0x12, lba, alloc);
    c[14] = report;
    c
}

fn descriptors(d: &[u8]) -> Vec<(u64, u32, u8)> {
    assert_eq!(u32::from_be_bytes([d[0], d[1], d[2], d[3]]) as usize, d.len() - 4, "parameter data length");
    d[8..]
        .chunks_exact(16)
        .map(|c| {
            (u64::from_be_bytes(c[..8].try_into().unwrap()), u32::from_be_bytes(c[8..12].try_into().unwrap()), c[12])
        })
        .collect()
}

#[test]
fn get_lba_status_reports_holes_of_ram_and_file_volumes() {
    let file = TempFile::new("lbastatus");
    for vol in [ram_volume("disk", 4096), file.volume(4096)] {
        let t = target_with(vol, LunConfig::for_volume("disk", "iqn.2026-11.test:t", 0));
        // Never written: one deallocated extent to the end.
        assert_eq!(descriptors(&good(&t, 1, &get_lba_status(0, 4096, 0), &[])), vec![(0, 4096, 1)]);
        assert_eq!(descriptors(&good(&t, 1, &get_lba_status(100, 4096, 0), &[])), vec![(100, 3996, 1)]);
        // 16 blocks written at 1024 (4 KiB aligned, what filesystems track).
        good(&t, 1, &write10(1024, 16, 0), &pattern(16, 1));
        assert_eq!(
            descriptors(&good(&t, 1, &get_lba_status(0, 4096, 0), &[])),
            vec![(0, 1024, 1), (1024, 16, 0), (1040, 3056, 1)]
        );
        // Report types: mapped only, deallocated only.
        assert_eq!(descriptors(&good(&t, 1, &get_lba_status(0, 4096, 2), &[])), vec![(1024, 16, 0)]);
        assert_eq!(descriptors(&good(&t, 1, &get_lba_status(0, 4096, 3), &[])), vec![(0, 1024, 1), (1040, 3056, 1)]);
        // UNMAP punches the first 8 back out.
        good(&t, 1, &unmap_cdb(24), &unmap_params(&[(1024, 8)]));
        assert_eq!(descriptors(&good(&t, 1, &get_lba_status(1024, 4096, 0), &[])), vec![(1024, 8, 1), (1032, 8, 0), (1040, 3056, 1)]);
        // Allocation length 24 holds one descriptor; 8 holds the header only.
        let one = good(&t, 1, &get_lba_status(0, 24, 0), &[]);
        assert_eq!(one.len(), 24);
        assert_eq!(&one[8..24], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 8, 1, 0, 0, 0]);
        assert_eq!(good(&t, 1, &get_lba_status(0, 8, 0), &[]).len(), 8);
        check(&t, 1, &get_lba_status(4096, 4096, 0), &[], LBA_OUT_OF_RANGE);
        check(&t, 1, &get_lba_status(0, 4096, 5), &[], INVALID_FIELD_IN_CDB);
    }
}

#[test]
fn log_sense_pages_through_the_target() {
    let t = ram_target(64);
    assert_eq!(good(&t, 1, &[0x4d, 0, 0x40, 0, 0, 0, 0, 0, 0xff, 0], &[]), vec![0, 0, 0, 3, 0x00, 0x0d, 0x2f]);
    let ie = good(&t, 1, &[0x4d, 0, 0x6f, 0, 0, 0, 0, 0, 0xff, 0], &[]);
    assert_eq!(ie, vec![0x2f, 0, 0, 7, 0, 0, 3, 3, 0, 0, 0xff]);
    check(&t, 1, &[0x4d, 0, 0x73, 0, 0, 0, 0, 0, 0xff, 0], &[], INVALID_FIELD_IN_CDB);
    // REPORT SUPPORTED OPERATION CODES lists the new commands.
    for (op, sa, opts) in [(0x4du8, 0u16, 1u8), (0x9e, 0x12, 2), (0xa3, 0x0a, 2)] {
        let mut c = [0u8; 12];
        c[0] = 0xa3;
        c[1] = 0x0c;
        c[2] = opts;
        c[3] = op;
        c[4..6].copy_from_slice(&sa.to_be_bytes());
        c[6..10].copy_from_slice(&512u32.to_be_bytes());
        let d = good(&t, 1, &c, &[]);
        assert_eq!(d[1] & 0x07, 0x03, "opcode {op:#x}/{sa:#x} supported");
        assert_eq!(d[4], op);
    }
}

#[test]
fn alua_inquiry_vpd_and_report_target_port_groups() {
    let mut cfg = LunConfig::for_volume("disk", "iqn.2026-11.test:t", 0);
    cfg.port_group = PortGroup { id: 7, state: AluaState::ActiveNonOptimized, relative_port: 1 };
    let t = target_with(ram_volume("disk", 64), cfg.clone());
    let std = good(&t, 1, &[0x12, 0, 0, 0, 0xff, 0], &[]);
    assert_eq!(std[5] & 0x30, 0x10, "TPGS: implicit ALUA");
    let ids = good(&t, 1, &[0x12, 1, 0x83, 0, 0xff, 0], &[]);
    assert!(ids.windows(8).any(|w| w == [0x51, 0x95, 0, 4, 0, 0, 0, 7]), "target port group designator: {ids:02x?}");
    let rtpg = good(&t, 1, &[0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], &[]);
    assert_eq!(rtpg, vec![0, 0, 0, 12, 0x01, 0x0f, 0, 7, 0, 0x02, 0, 1, 0, 0, 0, 1]);
    // Standby: no media access, but inquiry, RTPG and PR IN still run.
    cfg.port_group.state = AluaState::Standby;
    let t = target_with(ram_volume("disk", 64), cfg);
    check(&t, 1, &read10(0, 1, 0), &[], (2, 0x04, 0x0b));
    check(&t, 1, &write10(0, 1, 0), &pattern(1, 0), (2, 0x04, 0x0b));
    good(&t, 1, &[0x12, 0, 0, 0, 0xff, 0], &[]);
    assert_eq!(good(&t, 1, &[0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], &[])[4], 0x02);
}
