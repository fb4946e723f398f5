//! Command-by-command checks of bw-scsi with hand-made CDBs: returned bytes
//! and sense data as SPC-4 / SBC-3 specify them.

mod common;
use bw_scsi::{status, LunConfig, ScsiTarget};
use common::*;

// ---------------------------------------------------------------- INQUIRY

#[test]
fn standard_inquiry() {
    let t = ram_target(64);
    let d = good(&t, 1, &[0x12, 0, 0, 0x01, 0x00, 0], &[]);
    assert_eq!(d.len(), 96);
    assert_eq!(d[0], 0x00, "qualifier 0, direct access");
    assert_eq!(d[1] & 0x80, 0, "not removable");
    assert_eq!(d[2], 0x06, "SPC-4");
    assert_eq!(d[3] & 0x0f, 0x02, "response data format 2");
    assert_eq!(d[4] as usize, d.len() - 5, "additional length");
    assert_eq!(d[7] & 0x02, 0x02, "CMDQUE");
    assert_eq!(&d[8..16], b"BLKWIRE ");
    assert!(d[16..36].iter().all(|b| (0x20..0x7f).contains(b)));
    let descriptors: Vec<u16> = d[58..74].chunks(2).map(|c| u16::from_be_bytes([c[0], c[1]])).collect();
    assert!(descriptors.contains(&0x0460) && descriptors.contains(&0x04c0), "SPC-4 and SBC-3 claimed");
    // Allocation length truncates without error; 511 and 512 give the same bytes.
    assert_eq!(good(&t, 1, &[0x12, 0, 0, 0, 5, 0], &[]), d[..5].to_vec());
    assert_eq!(good(&t, 1, &[0x12, 0, 0, 0x01, 0xff, 0], &[]), good(&t, 1, &[0x12, 0, 0, 0x02, 0x00, 0], &[]));
    // EVPD=0 with a page code, and the obsolete CmdDt bit, are invalid.
    check(&t, 1, &[0x12, 0, 0x80, 0, 0xff, 0], &[], INVALID_FIELD_IN_CDB);
    check(&t, 1, &[0x12, 0x02, 0, 0, 0xff, 0], &[], INVALID_FIELD_IN_CDB);
}

#[test]
fn inquiry_on_unmapped_lun_has_qualifier_3() {
    let t = ram_target(64);
    let (o, d) = run_lun(&t, 1, 5, &[0x12, 0, 0, 0, 0xff, 0], &[]);
    assert_eq!(o.status, status::GOOD);
    assert_eq!(d[0], 0x7f);
    let (o, _) = run_lun(&t, 1, 5, &tur(), &[]);
    assert_eq!(sense(&o), LUN_NOT_SUPPORTED);
    let (o, d) = run_lun(&t, 1, 5, &[0x03, 0, 0, 0, 18, 0], &[]);
    assert_eq!(o.status, status::GOOD);
    assert_eq!((d[2], d[12], d[13]), (5, 0x25, 0));
}

#[test]
fn vpd_pages() {
    let t = ram_target(2048);
    let pages = good(&t, 1, &[0x12, 1, 0x00, 0, 0xff, 0], &[]);
    assert_eq!(&pages[..4], &[0, 0, 0, 6]);
    assert_eq!(&pages[4..], &[0x00, 0x80, 0x83, 0xb0, 0xb1, 0xb2]);
    for &p in &pages[4..] {
        let d = good(&t, 1, &[0x12, 1, p, 0, 0xff, 0], &[]);
        assert_eq!(d[1], p);
        assert_eq!(u16::from_be_bytes([d[2], d[3]]) as usize, d.len() - 4, "page {p:#x} length");
    }
    let cfg = LunConfig::for_volume("disk", "iqn.2026-11.test:t", 0);
    let serial = good(&t, 1, &[0x12, 1, 0x80, 0, 0xff, 0], &[]);
    assert_eq!(&serial[4..], cfg.serial.as_bytes());

    let id = good(&t, 1, &[0x12, 1, 0x83, 0, 0xff, 0], &[]);
    // First designator: binary NAA, LU association, 16 bytes, NAA type 6.
    assert_eq!(&id[4..8], &[0x01, 0x03, 0x00, 16]);
    assert_eq!(id[8] >> 4, 6);
    assert_eq!(&id[8..24], &bw_scsi::naa_designator(cfg.naa_id));
    // Second: T10 vendor id, ASCII, starting with the vendor.
    assert_eq!(id[24 + 1] & 0x0f, 1);
    assert_eq!(&id[28..36], b"BLKWIRE ");

    let bl = good(&t, 1, &[0x12, 1, 0xb0, 0, 0xff, 0], &[]);
    assert_eq!(bl.len(), 64);
    assert_eq!(bl[3], 0x3c);
    assert_eq!(u32::from_be_bytes(bl[8..12].try_into().unwrap()), 8192, "max transfer length");
    assert_eq!(u16::from_be_bytes([bl[6], bl[7]]), 8, "optimal granularity");
    assert!(u32::from_be_bytes(bl[20..24].try_into().unwrap()) > 0, "max unmap LBA count");
    assert!(u32::from_be_bytes(bl[24..28].try_into().unwrap()) > 0, "max unmap descriptors");
    assert!(u64::from_be_bytes(bl[36..44].try_into().unwrap()) > 0, "max write same");

    let b1 = good(&t, 1, &[0x12, 1, 0xb1, 0, 0xff, 0], &[]);
    assert_eq!(u16::from_be_bytes([b1[4], b1[5]]), 1, "non-rotating");
    let b2 = good(&t, 1, &[0x12, 1, 0xb2, 0, 0xff, 0], &[]);
    assert_eq!(b2[5] & 0xe0, 0xe0, "LBPU, LBPWS, LBPWS10 (ram backend discards)");

    check(&t, 1, &[0x12, 1, 0x81, 0, 0xff, 0], &[], INVALID_FIELD_IN_CDB);
}

#[test]
fn lun_config_ids_are_stable_and_distinct() {
    let a = LunConfig::for_volume("vol", "iqn.a", 0);
    assert_eq!(a, LunConfig::for_volume("vol", "iqn.a", 0));
    assert_ne!(a.naa_id, LunConfig::for_volume("vol", "iqn.a", 1).naa_id);
    assert_ne!(a.naa_id, LunConfig::for_volume("vol", "iqn.b", 0).naa_id);
    assert_ne!(a.serial, LunConfig::for_volume("vol2", "iqn.a", 0).serial);
    let d = bw_scsi::naa_designator(a.naa_id);
    assert_eq!(d[0] >> 4, 6, "IEEE Registered Extended");
    assert_eq!(d[0] & 0x0f, 0x0, "OUI 0x026277: high nibble 0");
    assert_eq!(d[1] & 0xf0, 0x20, "locally administered OUI (U/L bit)");
}

// ------------------------------------------------------- capacity, LUNs

#[test]
fn read_capacity() {
    let t = ram_target(1000);
    let d = good(&t, 1, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]);
    assert_eq!(d, [0, 0, 0x03, 0xe7, 0, 0, 0x02, 0x00]);
    check(&t, 1, &[0x25, 0, 0, 0, 0, 1, 0, 0, 0, 0], &[], INVALID_FIELD_IN_CDB);
    let mut c = [0u8; 16];
    c[0] = 0x9e;
    c[1] = 0x10;
    c[13] = 32;
    let d = good(&t, 1, &c, &[]);
    assert_eq!(d.len(), 32);
    assert_eq!(u64::from_be_bytes(d[0..8].try_into().unwrap()), 999);
    assert_eq!(u32::from_be_bytes(d[8..12].try_into().unwrap()), 512);
    assert_eq!(d[14] & 0xc0, 0xc0, "LBPME and LBPRZ");
    c[13] = 12;
    assert_eq!(good(&t, 1, &c, &[]).len(), 12, "allocation length");
    c[1] = 0x11;
    check(&t, 1, &c, &[], INVALID_FIELD_IN_CDB);
}

#[test]
fn read_capacity_10_saturates_for_huge_volumes() {
    // 3 TiB sparse memfd: last LBA does not fit 32 bits.
    let blocks = 3u64 << 31;
    let t = ram_target(blocks);
    let d = good(&t, 1, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]);
    assert_eq!(&d[..4], &[0xff; 4]);
    let mut c = [0u8; 16];
    c[0] = 0x9e;
    c[1] = 0x10;
    c[13] = 32;
    let d = good(&t, 1, &c, &[]);
    assert_eq!(u64::from_be_bytes(d[0..8].try_into().unwrap()), blocks - 1);
}

#[test]
fn report_luns_always_lists_lun_0() {
    let t = ScsiTarget::new(vec![
        (3, ram_volume("a", 8), LunConfig::for_volume("a", "t", 3)),
        (300, ram_volume("b", 8), LunConfig::for_volume("b", "t", 300)),
    ]);
    assert_eq!(t.luns(), vec![3, 300]);
    let c = [0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];
    let (o, d) = run_lun(&t, 1, 0, &c, &[]);
    assert_eq!(o.status, status::GOOD);
    assert_eq!(&d[..4], &24u32.to_be_bytes());
    assert_eq!(&d[8..16], &[0; 8]);
    assert_eq!(&d[16..24], &[0, 3, 0, 0, 0, 0, 0, 0]);
    assert_eq!(&d[24..32], &[0x41, 0x2c, 0, 0, 0, 0, 0, 0], "flat space addressing for 300");
    assert_eq!(bw_scsi::decode_lun(d[24..32].try_into().unwrap()), Some(300));
    // Well-known LUNs only: none.
    let (_, d) = run_lun(&t, 1, 0, &[0xa0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0], &[]);
    assert_eq!(d, vec![0; 8]);
    let (o, _) = run_lun(&t, 1, 0, &[0xa0, 0, 7, 0, 0, 0, 0, 0, 1, 0, 0, 0], &[]);
    assert_eq!(sense(&o), INVALID_FIELD_IN_CDB);
    let (o, _) = run_lun(&t, 1, 0, &[0xa0, 0, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0], &[]);
    assert_eq!(sense(&o), INVALID_FIELD_IN_CDB, "allocation length below 16");
    for lun in [0u64, 1, 255, 256, 16383, 16384, 0xff_ffff] {
        assert_eq!(bw_scsi::decode_lun(bw_scsi::encode_lun(lun)), Some(lun));
    }
}

#[test]
fn unsupported_and_malformed_cdbs() {
    let t = ram_target(64);
    check(&t, 1, &[0x04, 0, 0, 0, 0, 0], &[], INVALID_OPCODE); // FORMAT UNIT
    check(&t, 1, &[0xc0, 0, 0, 0, 0, 0], &[], INVALID_OPCODE);
    check(&t, 1, &[0x00, 0, 0, 0, 0, 0x04], &[], INVALID_FIELD_IN_CDB); // NACA
    check(&t, 1, &read10(0, 1, 0)[..6], &[], INVALID_FIELD_IN_CDB); // CDB cut short
    let (o, _) = run(&t, 1, &[], &[]);
    assert_eq!(sense(&o), INVALID_OPCODE);
    good(&t, 1, &tur(), &[]);
}

// ------------------------------------------------------------ read/write

#[test]
fn read_write_all_sizes_roundtrip() {
    let t = ram_target(600);
    let data = pattern(4, 1);
    good(&t, 1, &write10(10, 4, 0), &data);
    assert_eq!(good(&t, 1, &read10(10, 4, 0), &[]), data);
    let d16 = pattern(3, 2);
    good(&t, 1, &cdb16(0x8a, 0, 500, 3), &d16);
    assert_eq!(good(&t, 1, &cdb16(0x88, 0, 500, 3), &[]), d16);
    let d12 = pattern(2, 3);
    good(&t, 1, &cdb12(0xaa, 0, 100, 2), &d12);
    assert_eq!(good(&t, 1, &cdb12(0xa8, 0, 100, 2), &[]), d12);
    // 6-byte: 21-bit LBA, length 0 means 256 blocks.
    let d6 = pattern(256, 4);
    good(&t, 1, &[0x0a, 0, 0, 20, 0, 0], &d6);
    assert_eq!(good(&t, 1, &[0x08, 0, 0, 20, 0, 0], &[]), d6);
    assert_eq!(good(&t, 1, &[0x08, 0, 0, 20, 1, 0], &[]), d6[..512].to_vec());
    // The 256-block WRITE(6) at 20 overwrote what WRITE(12) put at 100.
    assert_eq!(good(&t, 1, &cdb16(0x88, 0, 100, 2), &[]), d6[80 * 512..82 * 512].to_vec());
    // DPO and FUA are accepted.
    good(&t, 1, &read10(0, 1, 0x18), &[]);
    good(&t, 1, &write10(0, 1, 0x18), &data[..512]);
    // Zero blocks transfers nothing.
    assert!(good(&t, 1, &read10(0, 0, 0), &[]).is_empty());
}

#[test]
fn read_reuses_the_callers_buffer() {
    let t = ram_target(64);
    good(&t, 1, &write10(0, 2, 0), &pattern(2, 9));
    let mut buf = Vec::with_capacity(4096);
    let ptr = buf.as_ptr();
    let o = t.execute(1, 0, &read10(0, 2, 0), &[], &mut buf);
    assert!(o.is_good());
    assert_eq!(buf, pattern(2, 9));
    assert_eq!(buf.as_ptr(), ptr, "no reallocation when capacity suffices");
}

#[test]
fn out_of_range_and_protection_fields() {
    let t = ram_target(100);
    check(&t, 1, &read10(100, 1, 0), &[], LBA_OUT_OF_RANGE);
    check(&t, 1, &read10(99, 2, 0), &[], LBA_OUT_OF_RANGE);
    check(&t, 1, &read10(101, 0, 0), &[], LBA_OUT_OF_RANGE);
    check(&t, 1, &read10(u32::MAX, 0, 0), &[], LBA_OUT_OF_RANGE);
    good(&t, 1, &read10(100, 0, 0), &[]);
    check(&t, 1, &cdb16(0x88, 0, u64::MAX, 1), &[], LBA_OUT_OF_RANGE);
    check(&t, 1, &cdb16(0x8a, 0, 0x8000_0000_0000_0000, 1), &pattern(1, 0), LBA_OUT_OF_RANGE);
    check(&t, 1, &[0x08, 0, 0, 99, 2, 0], &[], LBA_OUT_OF_RANGE);
    check(&t, 1, &read10(0, 1, 0x20), &[], INVALID_FIELD_IN_CDB); // RDPROTECT
    check(&t, 1, &write10(0, 1, 0x40), &pattern(1, 0), INVALID_FIELD_IN_CDB); // WRPROTECT
    let big = ram_target(20000);
    check(&big, 1, &read10(0, 8193, 0), &[], INVALID_FIELD_IN_CDB); // above max transfer length
    good(&big, 1, &read10(0, 8192, 0), &[]);
}

#[test]
fn write_uses_whole_blocks_received_and_ignores_excess() {
    let t = ram_target(16);
    good(&t, 1, &write10(0, 2, 0), &[b'a'; 1024]);
    // CDB says 2 blocks, only one arrived: that one is written, the other kept.
    good(&t, 1, &write10(0, 2, 0), &[b'b'; 512]);
    let d = good(&t, 1, &read10(0, 2, 0), &[]);
    assert!(d[..512].iter().all(|b| *b == b'b') && d[512..].iter().all(|b| *b == b'a'));
    // CDB says 1 block, 2 arrived: the second is ignored.
    good(&t, 1, &write10(0, 1, 0), &[b'c'; 1024]);
    let d = good(&t, 1, &read10(0, 2, 0), &[]);
    assert!(d[..512].iter().all(|b| *b == b'c') && d[512..].iter().all(|b| *b == b'a'));
    // Nothing or a partial block: nothing is written, still GOOD.
    good(&t, 1, &write10(0, 1, 0), &[]);
    good(&t, 1, &write10(0, 1, 0), &[b'd'; 200]);
    assert_eq!(good(&t, 1, &read10(0, 1, 0), &[])[0], b'c');
}

#[test]
fn fua_and_disabled_write_cache_flush() {
    let f = TempFile::new("fua");
    let vol = f.volume(64);
    let t = target_with(vol.clone(), LunConfig::for_volume("f", "t", 0));
    good(&t, 1, &write10(0, 1, 0), &pattern(1, 0));
    assert_eq!(vol.stats().flushes, 0);
    good(&t, 1, &write10(0, 1, 0x08), &pattern(1, 0));
    assert_eq!(vol.stats().flushes, 1, "FUA flushes");
    good(&t, 1, &cdb16(0x91, 0, 0, 0), &[]);
    assert_eq!(vol.stats().flushes, 2, "SYNCHRONIZE CACHE flushes");
    good(&t, 1, &cdb10(0x35, 0, 0, 0), &[]);
    assert_eq!(vol.stats().flushes, 3);
    check(&t, 1, &cdb10(0x35, 0, 64, 1), &[], LBA_OUT_OF_RANGE);

    // Caching page: WCE on, changeable. Turn it off: every write flushes.
    let ms = good(&t, 1, &[0x1a, 0x08, 0x08, 0, 0xff, 0], &[]);
    assert_eq!(ms[4], 0x08);
    assert_eq!(ms[6] & 0x04, 0x04, "WCE");
    let ch = good(&t, 1, &[0x1a, 0x08, 0x48, 0, 0xff, 0], &[]);
    assert_eq!(ch[6] & 0x04, 0x04, "WCE changeable");
    let mut sel = vec![0u8; 4];
    sel.extend_from_slice(&ms[4..]);
    sel[6] &= !0x04;
    good(&t, 1, &[0x15, 0x10, 0, 0, sel.len() as u8, 0], &sel);
    let ms = good(&t, 1, &[0x1a, 0x08, 0x08, 0, 0xff, 0], &[]);
    assert_eq!(ms[6] & 0x04, 0);
    good(&t, 1, &write10(0, 1, 0), &pattern(1, 0));
    assert_eq!(vol.stats().flushes, 4);
}

#[test]
fn read_only_lun_refuses_writes() {
    let mut cfg = LunConfig::for_volume("ro", "t", 0);
    cfg.read_only = true;
    let t = target_with(ram_volume("ro", 64), cfg);
    check(&t, 1, &write10(0, 1, 0), &pattern(1, 0), WRITE_PROTECTED);
    check(&t, 1, &[0x0a, 0, 0, 0, 1, 0], &pattern(1, 0), WRITE_PROTECTED);
    check(&t, 1, &cdb16(0x93, 0x08, 0, 1), &[0; 512], WRITE_PROTECTED);
    check(&t, 1, &unmap_cdb(24), &unmap_params(&[(0, 1)]), WRITE_PROTECTED);
    check(&t, 1, &cdb10(0x2e, 0, 0, 1), &pattern(1, 0), WRITE_PROTECTED);
    good(&t, 1, &read10(0, 1, 0), &[]);
    let ms = good(&t, 1, &[0x1a, 0, 0x3f, 0, 0xff, 0], &[]);
    assert_eq!(ms[2] & 0x80, 0x80, "WP in the mode parameter header");
    let ms10 = good(&t, 1, &[0x5a, 0, 0x3f, 0, 0, 0, 0, 0x10, 0, 0], &[]);
    assert_eq!(ms10[3] & 0x80, 0x80);
}

// ------------------------------------------------------- verify & friends

#[test]
fn verify_and_write_verify() {
    let t = ram_target(64);
    let data = pattern(4, 5);
    good(&t, 1, &cdb10(0x2e, 0x02, 8, 4), &data); // WRITE AND VERIFY (10), BYTCHK
    good(&t, 1, &cdb12(0xae, 0, 12, 1), &data[..512]);
    good(&t, 1, &cdb16(0x8e, 0x02, 13, 1), &data[..512]);
    assert_eq!(good(&t, 1, &read10(8, 4, 0), &[]), data);
    good(&t, 1, &cdb10(0x2f, 0x00, 0, 64), &[]); // medium verify
    good(&t, 1, &cdb10(0x2f, 0x02, 8, 4), &data);
    good(&t, 1, &cdb12(0xaf, 0x02, 8, 4), &data);
    good(&t, 1, &cdb16(0x8f, 0x02, 8, 4), &data);
    let mut bad = data.clone();
    bad[700] ^= b'X';
    let o = check(&t, 1, &cdb10(0x2f, 0x02, 8, 4), &bad, MISCOMPARE);
    assert_eq!(o.sense[0] & 0x80, 0x80, "INFORMATION valid");
    assert_eq!(u32::from_be_bytes(o.sense[3..7].try_into().unwrap()), 700, "offset of the miscompare");
    check(&t, 1, &cdb16(0x8f, 0x02, 8, 4), &bad, MISCOMPARE);
    check(&t, 1, &cdb10(0x2f, 0x04, 8, 4), &data, INVALID_FIELD_IN_CDB); // BYTCHK 10b reserved
    check(&t, 1, &cdb10(0x2f, 0x20, 8, 4), &data, INVALID_FIELD_IN_CDB); // VRPROTECT
    check(&t, 1, &cdb10(0x2f, 0x02, 62, 4), &data, LBA_OUT_OF_RANGE);
    // BYTCHK 11b: one block compared against each block.
    good(&t, 1, &cdb16(0x93, 0, 30, 3), &[0x5a; 512]);
    good(&t, 1, &cdb10(0x2f, 0x06, 30, 3), &[0x5a; 512]);
    check(&t, 1, &cdb10(0x2f, 0x06, 30, 4), &[0x5a; 512], MISCOMPARE);
    good(&t, 1, &cdb10(0x34, 0x02, 0, 64), &[]); // PRE-FETCH
    good(&t, 1, &cdb16(0x90, 0, 63, 1), &[]);
    check(&t, 1, &cdb16(0x90, 0, 63, 2), &[], LBA_OUT_OF_RANGE);
}

#[test]
fn write_same_replicates_or_unmaps() {
    let vol = ram_volume("ws", 4096);
    let t = target_with(vol.clone(), LunConfig::for_volume("ws", "t", 0));
    let block: Vec<u8> = (0..512).map(|i| i as u8).collect();
    good(&t, 1, &cdb10(0x41, 0, 10, 3000), &block);
    let d = good(&t, 1, &read10(10, 3000, 0), &[]);
    assert!(d.chunks(512).all(|c| c == block.as_slice()));
    assert_eq!(good(&t, 1, &read10(9, 1, 0), &[]), vec![0; 512]);
    // UNMAP bit with a zero block deallocates.
    good(&t, 1, &cdb16(0x93, 0x08, 10, 100), &[0; 512]);
    assert_eq!(vol.stats().discards, 1);
    assert!(good(&t, 1, &read10(10, 100, 0), &[]).iter().all(|b| *b == 0));
    assert!(good(&t, 1, &read10(110, 1, 0), &[]) == block);
    // NDOB: no data-out buffer, zeroes.
    good(&t, 1, &cdb16(0x93, 0x09, 110, 10), &[]);
    assert!(good(&t, 1, &read10(110, 10, 0), &[]).iter().all(|b| *b == 0));
    // UNMAP bit with non-zero data writes the data.
    good(&t, 1, &cdb16(0x93, 0x08, 200, 2), &block);
    assert_eq!(good(&t, 1, &read10(201, 1, 0), &[]), block);
    check(&t, 1, &cdb10(0x41, 0, 0, 0), &block, INVALID_FIELD_IN_CDB); // WSNZ
    check(&t, 1, &cdb10(0x41, 0x08, 0, 1), &block[..256], INVALID_FIELD_IN_CDB);
    check(&t, 1, &cdb10(0x41, 0x08, 0, 1), &[0; 1024], INVALID_FIELD_IN_CDB);
    check(&t, 1, &cdb16(0x93, 0, 4095, 2), &block, LBA_OUT_OF_RANGE);
    check(&t, 1, &cdb16(0x93, 0x10, 0, 1), &block, INVALID_FIELD_IN_CDB); // ANCHOR
}

#[test]
fn unmap_parses_descriptors() {
    let vol = ram_volume("u", 256);
    let t = target_with(vol.clone(), LunConfig::for_volume("u", "t", 0));
    good(&t, 1, &cdb16(0x8a, 0, 0, 256), &[0xab; 256 * 512]);
    let p = unmap_params(&[(8, 8), (100, 1), (255, 1), (0, 0)]);
    good(&t, 1, &unmap_cdb(p.len() as u16), &p);
    let d = good(&t, 1, &cdb16(0x88, 0, 0, 256), &[]);
    for (i, c) in d.chunks(512).enumerate() {
        let zero = (8..16).contains(&i) || i == 100 || i == 255;
        assert!(c.iter().all(|b| *b == if zero { 0 } else { 0xab }), "block {i}");
    }
    // A descriptor out of range fails the whole command before anything is unmapped.
    let p = unmap_params(&[(0, 1), (250, 7)]);
    check(&t, 1, &unmap_cdb(p.len() as u16), &p, LBA_OUT_OF_RANGE);
    assert_eq!(good(&t, 1, &read10(0, 1, 0), &[])[0], 0xab);
    // Empty parameter list: nothing to do. 1..7 bytes: length error.
    good(&t, 1, &unmap_cdb(0), &[]);
    check(&t, 1, &unmap_cdb(4), &[0; 4], PARAM_LIST_LENGTH);
    // Block descriptor length pointing past the data.
    let mut p = unmap_params(&[(0, 1)]);
    p[2..4].copy_from_slice(&32u16.to_be_bytes());
    check(&t, 1, &unmap_cdb(p.len() as u16), &p, PARAM_LIST_LENGTH);
    // Too many descriptors.
    let many: Vec<(u64, u32)> = (0..257).map(|i| (i, 0)).collect();
    let p = unmap_params(&many);
    check(&t, 1, &unmap_cdb(p.len() as u16), &p, INVALID_FIELD_IN_PARAM);
    check(&t, 1, &[0x42, 1, 0, 0, 0, 0, 0, 0, 24, 0], &unmap_params(&[(0, 1)]), INVALID_FIELD_IN_CDB);
}

#[test]
fn compare_and_write() {
    let t = ram_target(64);
    let old = pattern(2, 1);
    let new = pattern(2, 2);
    good(&t, 1, &write10(4, 2, 0), &old);
    let mut c = [0u8; 16];
    c[0] = 0x89;
    c[2..10].copy_from_slice(&4u64.to_be_bytes());
    c[13] = 2;
    let mut buf = old.clone();
    buf.extend_from_slice(&new);
    good(&t, 1, &c, &buf);
    assert_eq!(good(&t, 1, &read10(4, 2, 0), &[]), new);
    // Now the compare half no longer matches: miscompare, nothing written.
    let o = check(&t, 1, &c, &buf, MISCOMPARE);
    let first_diff = old.iter().zip(&new).position(|(a, b)| a != b).unwrap() as u32;
    assert_eq!(u32::from_be_bytes(o.sense[3..7].try_into().unwrap()), first_diff);
    assert_eq!(good(&t, 1, &read10(4, 2, 0), &[]), new);
    check(&t, 1, &c, &buf[..1024], INVALID_FIELD_IN_CDB);
    let mut big = buf.clone();
    big.extend_from_slice(&[0; 512]);
    check(&t, 1, &c, &big, INVALID_FIELD_IN_CDB); // more data than 2 x NLB blocks
    let mut zero = c;
    zero[13] = 0;
    good(&t, 1, &zero, &[]);
    check(&t, 1, &zero, &buf, INVALID_FIELD_IN_CDB); // NLB 0 with data
    c[2..10].copy_from_slice(&63u64.to_be_bytes());
    check(&t, 1, &c, &buf, LBA_OUT_OF_RANGE);
    assert_eq!(t.plan(0, &c).data_out_len(), Some(2048));
}

// ------------------------------------------------------------ mode pages

#[test]
fn mode_sense_pages_and_headers() {
    let t = ram_target(1000);
    let all = good(&t, 1, &[0x1a, 0, 0x3f, 0, 0xff, 0], &[]);
    assert_eq!(all[0] as usize, all.len() - 1);
    assert_eq!(all[2] & 0x10, 0x10, "DPOFUA");
    assert_eq!(all[3], 8, "short block descriptor");
    assert_eq!(&all[4..12], &[0, 0, 0x03, 0xe8, 0, 0, 0x02, 0x00]);
    let codes: Vec<u8> = {
        let mut v = vec![];
        let mut i = 12;
        while i < all.len() {
            v.push(all[i] & 0x3f);
            i += all[i + 1] as usize + 2;
        }
        assert_eq!(i, all.len());
        v
    };
    assert_eq!(codes, vec![0x08, 0x0a, 0x1c]);
    // Single pages, DBD.
    let ctl = good(&t, 1, &[0x1a, 0x08, 0x0a, 0, 0xff, 0], &[]);
    assert_eq!(ctl[3], 0);
    assert_eq!(&ctl[4..6], &[0x0a, 0x0a]);
    let ie = good(&t, 1, &[0x1a, 0x08, 0x1c, 0, 0xff, 0], &[]);
    assert_eq!(&ie[4..6], &[0x1c, 0x0a]);
    // Allocation length 4: header only.
    assert_eq!(good(&t, 1, &[0x1a, 0, 0x3f, 0, 4, 0], &[]).len(), 4);
    // Page control: saved is not supported, unknown pages are invalid.
    check(&t, 1, &[0x1a, 0, 0xc8, 0, 0xff, 0], &[], (5, 0x39, 0));
    check(&t, 1, &[0x1a, 0, 0x19, 0, 0xff, 0], &[], INVALID_FIELD_IN_CDB);
    check(&t, 1, &[0x1a, 0, 0x08, 0x01, 0xff, 0], &[], INVALID_FIELD_IN_CDB);
    good(&t, 1, &[0x1a, 0, 0x3f, 0xff, 0xff, 0], &[]);
    good(&t, 1, &[0x1a, 0, 0x88, 0, 0xff, 0], &[]); // default values
    // MODE SENSE (10) with LLBAA: long block descriptor.
    let ms10 = good(&t, 1, &[0x5a, 0x10, 0x08, 0, 0, 0, 0, 0x01, 0, 0], &[]);
    assert_eq!(u16::from_be_bytes([ms10[0], ms10[1]]) as usize, ms10.len() - 2);
    assert_eq!(ms10[4] & 1, 1, "LONGLBA");
    assert_eq!(u16::from_be_bytes([ms10[6], ms10[7]]), 16);
    assert_eq!(u64::from_be_bytes(ms10[8..16].try_into().unwrap()), 1000);
    assert_eq!(&ms10[24..26], &[0x08, 0x12]);
}

#[test]
fn mode_select_swp_and_unchangeable_fields() {
    let t = ram_target(64);
    let ch = good(&t, 1, &[0x1a, 0x08, 0x4a, 0, 0xff, 0], &[]);
    assert_eq!(ch[4 + 4] & 0x08, 0x08, "SWP changeable");
    let cur = good(&t, 1, &[0x1a, 0x08, 0x0a, 0, 0xff, 0], &[]);
    let mut sel = vec![0u8; 4];
    sel.extend_from_slice(&cur[4..]);
    sel[4] &= 0x3f;
    sel[8] |= 0x08; // SWP on
    good(&t, 1, &[0x15, 0x10, 0, 0, sel.len() as u8, 0], &sel);
    check(&t, 1, &write10(0, 1, 0), &pattern(1, 0), WRITE_PROTECTED);
    good(&t, 1, &read10(0, 1, 0), &[]);
    let ms = good(&t, 1, &[0x1a, 0x08, 0x0a, 0, 0xff, 0], &[]);
    assert_eq!(ms[2] & 0x80, 0x80, "WP follows SWP");
    // Changing something unchangeable (QERR) is refused, SWP stays.
    let mut bad = sel.clone();
    bad[7] |= 0x02;
    check(&t, 1, &[0x15, 0x10, 0, 0, bad.len() as u8, 0], &bad, INVALID_FIELD_IN_PARAM);
    // Wrong page length, unknown page, truncated list, SP bit.
    let mut bad = sel.clone();
    bad[5] = 9;
    check(&t, 1, &[0x15, 0x10, 0, 0, bad.len() as u8, 0], &bad, INVALID_FIELD_IN_PARAM);
    let mut bad = sel.clone();
    bad[4] = 0x19;
    check(&t, 1, &[0x15, 0x10, 0, 0, bad.len() as u8, 0], &bad, INVALID_FIELD_IN_PARAM);
    check(&t, 1, &[0x15, 0x10, 0, 0, 10, 0], &sel[..10], PARAM_LIST_LENGTH);
    check(&t, 1, &[0x15, 0x11, 0, 0, sel.len() as u8, 0], &sel, INVALID_FIELD_IN_CDB);
    // A block descriptor with another block size is refused; with 512 accepted.
    let mut with_bd = vec![0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0x10, 0];
    check(&t, 1, &[0x15, 0x10, 0, 0, with_bd.len() as u8, 0], &with_bd, INVALID_FIELD_IN_PARAM);
    with_bd[10] = 0x02;
    good(&t, 1, &[0x15, 0x10, 0, 0, with_bd.len() as u8, 0], &with_bd);
    // MODE SELECT (10) turns SWP off again.
    let mut sel10 = vec![0u8; 8];
    sel10.extend_from_slice(&sel[4..]);
    sel10[8 + 4] &= !0x08;
    good(&t, 1, &[0x55, 0x10, 0, 0, 0, 0, 0, 0, sel10.len() as u8, 0], &sel10);
    good(&t, 1, &write10(0, 1, 0), &pattern(1, 0));
    // A LUN reset also restores defaults.
    good(&t, 1, &[0x15, 0x10, 0, 0, sel.len() as u8, 0], &sel);
    t.lun_reset(0);
    let _ = run(&t, 1, &tur(), &[]); // consume the unit attention
    good(&t, 1, &write10(0, 1, 0), &pattern(1, 0));
    // Unchangeable WCE on a volatile (ram) backend.
    let cache = good(&t, 1, &[0x1a, 0x08, 0x08, 0, 0xff, 0], &[]);
    let mut sel = vec![0u8; 4];
    sel.extend_from_slice(&cache[4..]);
    sel[6] &= !0x04;
    check(&t, 1, &[0x15, 0x10, 0, 0, sel.len() as u8, 0], &sel, INVALID_FIELD_IN_PARAM);
}

// ---------------------------------------------- sense, UAs, misc commands

#[test]
fn unit_attention_after_reset_once_per_nexus() {
    let t = ram_target(64);
    good(&t, 1, &tur(), &[]);
    assert!(t.lun_reset(0));
    assert!(!t.lun_reset(9));
    // INQUIRY and REPORT LUNS neither fail nor consume it.
    good(&t, 1, &[0x12, 0, 0, 0, 0xff, 0], &[]);
    good(&t, 1, &[0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], &[]);
    check(&t, 1, &read10(0, 1, 0), &[], POWER_ON_RESET);
    good(&t, 1, &read10(0, 1, 0), &[]);
    // Another nexus sees it too, once; REQUEST SENSE reports and clears it.
    let rs = good(&t, 2, &[0x03, 0, 0, 0, 18, 0], &[]);
    assert_eq!((rs[2], rs[12], rs[13]), (6, 0x29, 0));
    good(&t, 2, &tur(), &[]);
    let rs = good(&t, 2, &[0x03, 0, 0, 0, 18, 0], &[]);
    assert_eq!((rs[2], rs[12], rs[13]), (0, 0, 0), "NO SENSE");
    check(&t, 2, &[0x03, 1, 0, 0, 18, 0], &[], INVALID_FIELD_IN_CDB); // descriptor format
    assert_eq!(good(&t, 2, &[0x03, 0, 0, 0, 8, 0], &[]).len(), 8);
    // Target reset and capacity change.
    t.target_reset();
    check(&t, 2, &tur(), &[], POWER_ON_RESET);
    assert!(t.capacity_changed(0));
    check(&t, 2, &tur(), &[], (6, 0x2a, 0x09));
    good(&t, 2, &tur(), &[]);
}

#[test]
fn start_stop_and_prevent_allow() {
    let t = ram_target(64);
    good(&t, 1, &[0x1b, 0, 0, 0, 0x00, 0], &[]);
    good(&t, 1, &[0x1b, 1, 0, 0, 0x01, 0], &[]);
    good(&t, 1, &[0x1b, 0, 0, 0, 0x03, 0], &[]);
    good(&t, 1, &tur(), &[]);
    check(&t, 1, &[0x1b, 0, 0, 0, 0x40, 0], &[], INVALID_FIELD_IN_CDB);
    good(&t, 1, &[0x1e, 0, 0, 0, 1, 0], &[]);
    good(&t, 1, &[0x1e, 0, 0, 0, 0, 0], &[]);
    check(&t, 1, &[0x1e, 0, 0, 0, 2, 0], &[], INVALID_FIELD_IN_CDB);
}

#[test]
fn data_out_lengths() {
    let t = ram_target(64);
    assert_eq!(t.plan(0, &write10(0, 3, 0)).data_out_len(), Some(1536));
    assert_eq!(t.plan(0, &[0x0a, 0, 0, 0, 0, 0]).data_out_len(), Some(256 * 512));
    assert_eq!(t.plan(0, &cdb16(0x8a, 0, 0, 8)).data_out_len(), Some(4096));
    assert_eq!(t.plan(0, &cdb12(0xaa, 0, 0, 2)).data_out_len(), Some(1024));
    assert_eq!(t.plan(0, &cdb10(0x2e, 0, 0, 1)).data_out_len(), Some(512));
    assert_eq!(t.plan(0, &read10(0, 3, 0)).data_out_len(), None);
    assert_eq!(t.plan(0, &cdb10(0x2f, 0x00, 0, 4)).data_out_len(), None);
    assert_eq!(t.plan(0, &cdb10(0x2f, 0x02, 0, 4)).data_out_len(), Some(2048));
    assert_eq!(t.plan(0, &cdb10(0x2f, 0x06, 0, 4)).data_out_len(), Some(512));
    assert_eq!(t.plan(0, &cdb10(0x41, 0, 0, 100)).data_out_len(), Some(512));
    assert_eq!(t.plan(0, &cdb16(0x93, 0x01, 0, 100)).data_out_len(), None);
    assert_eq!(t.plan(0, &unmap_cdb(40)).data_out_len(), Some(40));
    assert_eq!(t.plan(0, &[0x15, 0x10, 0, 0, 28, 0]).data_out_len(), Some(28));
    assert_eq!(t.plan(0, &[0x55, 0x10, 0, 0, 0, 0, 0, 1, 4, 0]).data_out_len(), Some(260));
    assert_eq!(t.plan(0, &[0x5f, 0, 0, 0, 0, 0, 0, 0, 24, 0]).data_out_len(), Some(24));
    assert_eq!(t.plan(0, &tur()).data_out_len(), None);
    assert_eq!(t.plan(0, &[0x2a, 0, 0]).data_out_len(), None);
}

// ---------------------------------------------------------------- RSOC

#[test]
fn report_supported_opcodes() {
    let t = ram_target(64);
    let rsoc = |opts: u8, op: u8, sa: u16| {
        let mut c = [0u8; 12];
        c[0] = 0xa3;
        c[1] = 0x0c;
        c[2] = opts;
        c[3] = op;
        c[4..6].copy_from_slice(&sa.to_be_bytes());
        c[6..10].copy_from_slice(&65535u32.to_be_bytes());
        c
    };
    let all = good(&t, 1, &rsoc(0, 0, 0), &[]);
    assert_eq!(u32::from_be_bytes(all[0..4].try_into().unwrap()) as usize, all.len() - 4);
    let descs: Vec<&[u8]> = all[4..].chunks(8).collect();
    assert!(descs.len() > 40);
    for d in &descs {
        let (op, sa, servactv) = (d[0], u16::from_be_bytes([d[2], d[3]]), d[5] & 1 != 0);
        assert!(servactv || sa == 0);
        let one = good(&t, 1, &rsoc(if servactv { 2 } else { 1 }, op, sa), &[]);
        assert_eq!(one[1] & 0x07, 0x03, "supported, op {op:#x}/{sa:#x}");
        let n = u16::from_be_bytes([one[2], one[3]]) as usize;
        assert_eq!(n, u16::from_be_bytes([d[6], d[7]]) as usize);
        assert_eq!(one.len(), 4 + n);
        assert_eq!(one[4], op, "usage data starts with the opcode");
        assert_eq!(n, match op >> 5 { 0 => 6, 1 | 2 => 10, 4 => 16, _ => 12 });
        // The wrong reporting option for this opcode is an invalid field.
        let (o, _) = run(&t, 1, &rsoc(if servactv { 1 } else { 2 }, op, sa), &[]);
        assert_eq!(sense(&o), INVALID_FIELD_IN_CDB);
    }
    // RCTD: every descriptor grows a 12-byte timeouts descriptor.
    let with_to = good(&t, 1, &rsoc(0x80, 0, 0), &[]);
    assert_eq!(with_to.len() - 4, descs.len() * 20);
    assert_eq!(&with_to[4 + 8..4 + 10], &[0, 0x0a]);
    assert_eq!(with_to[4 + 5] & 0x02, 0x02, "CTDP");
    // Unsupported opcode in one-command format: SUPPORT = 1.
    let none = good(&t, 1, &rsoc(1, 0x04, 0), &[]);
    assert_eq!(none[1] & 7, 1);
    // Allocation length is honoured.
    let mut c = rsoc(0, 0, 0);
    c[6..10].copy_from_slice(&10u32.to_be_bytes());
    assert_eq!(good(&t, 1, &c, &[]).len(), 10);
    // REPORT SUPPORTED TASK MANAGEMENT FUNCTIONS.
    let tmf = good(&t, 1, &[0xa3, 0x0d, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0], &[]);
    assert_eq!(tmf.len(), 4);
    assert_eq!(tmf[0] & 0x88, 0x88, "ABORT TASK and LUN RESET");
    check(&t, 1, &[0xa3, 0x05, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0], &[], INVALID_FIELD_IN_CDB);
}

// ------------------------------------------------- zero-copy read planning

/// `plan().read()` hands out the checked byte range of a plain READ
/// (10/16); sending `len` bytes of the volume at `offset`, read or from
/// its zero-copy descriptor, yields what a buffered READ returns. Failed
/// checks come back as the outcome `execute` would give; anything else is
/// left to `execute` untouched.
#[test]
fn plan_read_ranges() {
    use bw_scsi::ReadPlan;
    use std::os::fd::AsRawFd;
    let t = ram_target(64);
    let pattern: Vec<u8> = (0..8 * BS).map(|i| (i * 7 % 251) as u8).collect();
    good(&t, 1, &write10(4, 8, 0), &pattern);
    let mut read16 = [0u8; 16];
    read16[0] = 0x88;
    read16[9] = 6;
    read16[13] = 8;
    for cdb in [&read10(4, 8, 0)[..], &read16[..]] {
        let ReadPlan::Range { volume, offset, len } = t.plan(0, cdb).read() else { panic!("no range for {cdb:02x?}") };
        assert_eq!(len, 8 * BS);
        let mut got = vec![0u8; len];
        volume.read_at(&mut got, offset).unwrap();
        let want = good(&t, 1, cdb, &[]);
        assert_eq!(got, want);
        let fd = volume.zero_copy_read(offset, len as u64).unwrap().expect("a RAM volume sends from its fd");
        let mut sent = vec![0u8; len];
        let n = unsafe { libc_pread(fd.as_raw_fd(), &mut sent, offset) };
        assert_eq!(n, len);
        assert_eq!(sent, want);
        if cdb[0] == 0x28 {
            assert_eq!(got, pattern);
        }
    }
    // Out of range and RDPROTECT fail like execute does.
    let ReadPlan::Done(o) = t.plan(0, &read10(60, 8, 0)).read() else { panic!("out of range planned") };
    assert_eq!(sense(&o), LBA_OUT_OF_RANGE);
    let ReadPlan::Done(o) = t.plan(0, &read10(0, 1, 0x20)).read() else { panic!("RDPROTECT planned") };
    assert_eq!(sense(&o), INVALID_FIELD_IN_CDB);
    // Not for the extent path: other opcodes, unknown LUNs, zero length, and
    // a pending unit attention (which must still be reported by execute).
    assert!(matches!(t.plan(0, &write10(0, 1, 0)).read(), ReadPlan::Buffered));
    assert!(matches!(t.plan(3, &read10(0, 1, 0)).read(), ReadPlan::Buffered));
    assert!(matches!(t.plan(0, &read10(0, 0, 0)).read(), ReadPlan::Buffered));
    assert!(t.lun_reset(0));
    assert!(matches!(t.plan(0, &read10(0, 1, 0)).read(), ReadPlan::Buffered));
    check(&t, 1, &read10(0, 1, 0), &[], POWER_ON_RESET);
}

/// `plan().io()` hands out the one request a plain READ or WRITE needs, with
/// the checks execute makes; running the request and io_outcome give what
/// execute gives.
#[test]
fn plan_io_requests() {
    use bw_block::Request;
    use bw_scsi::{io_outcome, IoPlan};
    use bytes::Bytes;
    let t = ram_target(64);
    let pattern: Vec<u8> = (0..8 * BS).map(|i| (i * 13 % 251) as u8).collect();
    // A WRITE in three pieces (the last block short of a whole one): the
    // request carries the whole blocks, in the pieces they came in.
    let pieces = [Bytes::copy_from_slice(&pattern[..1000]), Bytes::copy_from_slice(&pattern[1000..3000]), Bytes::copy_from_slice(&pattern[3000..3700])];
    let IoPlan::Submit { volume, request } = t.plan(0, &write10(4, 8, 0)).io(&pieces) else { panic!("write not planned") };
    let Request::Write { offset, ref data } = request else { panic!("not a write request") };
    assert_eq!(offset, 4 * BS as u64);
    assert_eq!(data.iter().map(|p| p.len()).collect::<Vec<_>>(), vec![1000, 2000, 584], "7 whole blocks, in the pieces received");
    let (tx, rx) = std::sync::mpsc::channel();
    let t2 = tx.clone();
    volume.submit(request, move |req, r| t2.send((req, io_outcome(&r, true))).unwrap());
    let (_, o) = rx.recv().unwrap();
    assert!(o.is_good());
    assert_eq!(good(&t, 1, &read10(4, 7, 0), &[]), pattern[..7 * BS].to_vec());
    // A READ: its request's buffer is the data-in.
    let IoPlan::Submit { volume, request } = t.plan(0, &cdb16(0x88, 0, 4, 7)).io(&[]) else { panic!("read not planned") };
    assert_eq!((request.offset(), request.len(), request.is_write()), (4 * BS as u64, 7 * BS as u64, false));
    volume.submit(request, move |req, r| tx.send((req, io_outcome(&r, false))).unwrap());
    let (req, o) = rx.recv().unwrap();
    assert!(o.is_good());
    assert_eq!(req.into_buf(), pattern[..7 * BS].to_vec());
    // Failed checks answer like execute.
    let IoPlan::Done(o) = t.plan(0, &read10(60, 8, 0)).io(&[]) else { panic!("out of range planned") };
    assert_eq!(sense(&o), LBA_OUT_OF_RANGE);
    let IoPlan::Done(o) = t.plan(0, &write10(0, 1, 0x20)).io(&pieces) else { panic!("WRPROTECT planned") };
    assert_eq!(sense(&o), INVALID_FIELD_IN_CDB);
    let ro = target_with(ram_volume("ro", 64), LunConfig { read_only: true, ..LunConfig::for_volume("ro", "iqn.2026-11.test:t", 0) });
    let IoPlan::Done(o) = ro.plan(0, &write10(0, 1, 0)).io(&pieces) else { panic!("write to a read-only LUN planned") };
    assert_eq!(sense(&o), WRITE_PROTECTED);
    // Not for one request: other commands, unknown LUNs, nothing to move,
    // WRITE AND VERIFY, a FUA write on a write-back volume (a flush
    // follows), and a pending unit attention (execute reports it).
    assert!(matches!(t.plan(0, &tur()).io(&[]), IoPlan::Buffered));
    assert!(matches!(t.plan(3, &read10(0, 1, 0)).io(&[]), IoPlan::Buffered));
    assert!(matches!(t.plan(0, &read10(0, 0, 0)).io(&[]), IoPlan::Buffered));
    assert!(matches!(t.plan(0, &write10(0, 1, 0)).io(&[]), IoPlan::Buffered));
    assert!(matches!(t.plan(0, &cdb10(0x2e, 0, 0, 1)).io(&pieces), IoPlan::Buffered));
    let f = TempFile::new("plan-io");
    let wb = target_with(f.volume(64), LunConfig::for_volume("filedisk", "iqn.2026-11.test:t", 0));
    assert!(matches!(wb.plan(0, &write10(0, 1, 0x08)).io(&pieces), IoPlan::Buffered));
    assert!(matches!(wb.plan(0, &write10(0, 1, 0)).io(&pieces), IoPlan::Submit { .. }));
    assert!(t.lun_reset(0));
    assert!(matches!(t.plan(0, &read10(0, 1, 0)).io(&[]), IoPlan::Buffered));
    check(&t, 1, &read10(0, 1, 0), &[], POWER_ON_RESET);
}

/// `plan().write()` writes a plain WRITE on the caller's thread as execute
/// would: the whole blocks of the pieces received (excess ignored), the
/// data-out length the CDB transfers, execute's sense for failed checks,
/// and a flush for FUA; anything that execute must see (other commands,
/// unknown LUNs, a pending unit attention) is left to it untouched.
#[test]
fn plan_write_writes_as_execute_does() {
    use bytes::Bytes;
    let t = ram_target(64);
    let pattern: Vec<u8> = (0..8 * BS).map(|i| (i * 11 % 251) as u8).collect();
    // Three pieces, 7.2 blocks: 7 whole blocks are written.
    let pieces = [Bytes::copy_from_slice(&pattern[..1000]), Bytes::copy_from_slice(&pattern[1000..3000]), Bytes::copy_from_slice(&pattern[3000..3700])];
    let (o, wanted) = t.plan(0, &write10(4, 8, 0)).write(&pieces).expect("a plain WRITE");
    assert!(o.is_good());
    assert_eq!(wanted, 8 * BS, "what the CDB transfers");
    let back = good(&t, 1, &read10(4, 8, 0), &[]);
    assert_eq!(&back[..7 * BS], &pattern[..7 * BS]);
    // More than the CDB asks for: the excess is ignored; 16-byte CDBs too.
    let (o, _) = t.plan(0, &cdb16(0x8a, 0, 20, 1)).write(&[&pattern[..]]).expect("WRITE(16)");
    assert!(o.is_good());
    assert_eq!(good(&t, 1, &read10(20, 2, 0), &[]), [&pattern[..BS], &vec![0u8; BS][..]].concat());
    // Failed checks answer like execute, and write nothing.
    let (o, _) = t.plan(0, &write10(60, 8, 0)).write(&[&pattern[..]]).expect("checked");
    assert_eq!(sense(&o), LBA_OUT_OF_RANGE);
    let (o, _) = t.plan(0, &write10(0, 1, 0x20)).write(&[&pattern[..BS]]).expect("checked");
    assert_eq!(sense(&o), INVALID_FIELD_IN_CDB);
    assert_eq!(good(&t, 1, &read10(0, 1, 0), &[]), vec![0u8; BS]);
    let ro = target_with(ram_volume("ro", 64), LunConfig { read_only: true, ..LunConfig::for_volume("ro", "iqn.2026-11.test:t", 0) });
    let (o, _) = ro.plan(0, &write10(0, 1, 0)).write(&[&pattern[..BS]]).expect("checked");
    assert_eq!(sense(&o), WRITE_PROTECTED);
    // FUA on a write-back volume: written and flushed (GOOD).
    let f = TempFile::new("plan-write");
    let wb = target_with(f.volume(64), LunConfig::for_volume("filedisk", "iqn.2026-11.test:t", 0));
    let (o, _) = wb.plan(0, &write10(0, 1, 0x08)).write(&[&pattern[..BS]]).expect("FUA write");
    assert!(o.is_good());
    assert_eq!(good(&wb, 1, &read10(0, 1, 0), &[]), pattern[..BS].to_vec());
    // Not for this path: other commands (WRITE AND VERIFY, READ), unknown
    // LUNs, and a pending unit attention, which execute must report.
    assert!(t.plan(0, &cdb10(0x2e, 0, 0, 1)).write(&[&pattern[..BS]]).is_none());
    assert!(t.plan(0, &read10(0, 1, 0)).write::<&[u8]>(&[]).is_none());
    assert!(t.plan(3, &write10(0, 1, 0)).write(&[&pattern[..BS]]).is_none());
    assert!(t.lun_reset(0));
    assert!(t.plan(0, &write10(0, 1, 0)).write(&[&pattern[..BS]]).is_none());
    check(&t, 1, &write10(0, 1, 0), &pattern[..BS], POWER_ON_RESET);
}

/// pread through std (no libc dependency in this crate's tests).
unsafe fn libc_pread(fd: std::os::fd::RawFd, buf: &mut [u8], offset: u64) -> usize {
    use std::os::unix::fs::FileExt;
    let f = std::mem::ManuallyDrop::new(<std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd));
    f.read_at(buf, offset).unwrap()
}

// ------------------------------------------------------- the command table

/// REPORT SUPPORTED OPERATION CODES is generated from the table: the
/// all-commands list is exactly its rows, in order, and each one-command
/// answer carries the row's usage data.
#[test]
fn report_supported_opcodes_is_the_table() {
    use bw_scsi::commands::COMMANDS;
    let t = ram_target(64);
    let all = good(&t, 1, &[0xa3, 0x0c, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0], &[]);
    let listed: Vec<(u8, Option<u16>)> = all[4..]
        .chunks(8)
        .map(|d| (d[0], (d[5] & 1 != 0).then(|| u16::from_be_bytes([d[2], d[3]]))))
        .collect();
    let rows: Vec<(u8, Option<u16>)> = COMMANDS.iter().map(|c| (c.opcode, c.service_action.map(u16::from))).collect();
    assert_eq!(listed, rows);
    for c in COMMANDS {
        let (opts, sa) = match c.service_action {
            Some(sa) => (2, sa),
            None => (1, 0),
        };
        let one = good(&t, 1, &[0xa3, 0x0c, opts, c.opcode, 0, sa, 0, 0, 1, 0, 0, 0], &[]);
        assert_eq!(&one[4..], c.usage, "{}", c.name);
    }
}

/// Every command with data-in returns at most its allocation length, cut
/// by the dispatcher from the row (handlers do not truncate).
#[test]
fn data_in_is_cut_to_the_allocation_length_of_every_row() {
    use bw_scsi::commands::{Len, Transfer, COMMANDS};
    let t = ram_target(64);
    let mut checked = 0;
    for c in COMMANDS {
        let Transfer::In(len) = c.transfer else { continue };
        // A CDB of this command with its allocation length field set to 3
        // (commands whose length is not a plain field are skipped).
        let mut cdb = c.usage.to_vec();
        cdb.iter_mut().skip(1).for_each(|b| *b = 0);
        if let Some(sa) = c.service_action {
            cdb[1] = sa;
        }
        match len {
            Len::Byte(at) => cdb[at] = 3,
            Len::Be16(at) => cdb[at..at + 2].copy_from_slice(&3u16.to_be_bytes()),
            Len::Be32(at) => cdb[at..at + 4].copy_from_slice(&3u32.to_be_bytes()),
            _ => continue,
        }
        if c.opcode == 0xa0 {
            continue; // REPORT LUNS refuses allocation lengths below 16
        }
        if c.opcode == 0x4d {
            cdb[2] = 0x40; // LOG SENSE: current values of the supported pages
        }
        if c.opcode == 0x1a || c.opcode == 0x5a {
            cdb[2] = 0x3f; // MODE SENSE: all pages
        }
        let (o, d) = run(&t, 1, &cdb, &[]);
        assert!(o.is_good(), "{}: {:02x?}", c.name, o.sense);
        assert_eq!(d.len(), 3, "{}: {} bytes for an allocation length of 3", c.name, d.len());
        checked += 1;
    }
    assert!(checked >= 12, "only {checked} rows checked");
}

/// A transport's data-out beyond what the CDB transfers is cut off, except
/// for the rows that call an excess an invalid request.
#[test]
fn transport_data_out_excess() {
    let t = ram_target(64);
    let mut d = vec![0u8; 4096];
    // WRITE(10) of one block with 2 blocks sent: the first one is written.
    let data = pattern(2, 3);
    let (o, wanted) = t.plan(0, &write10(0, 1, 0)).execute(1, &[&data], 1024, &mut d);
    assert!(o.is_good());
    assert_eq!(wanted, Some(512));
    assert_eq!(good(&t, 1, &read10(0, 1, 0), &[]), data[..512]);
    // WRITE SAME(10) with more than one block: invalid, nothing written.
    let (o, wanted) = t.plan(0, &cdb10(0x41, 0, 8, 1)).execute(1, &[&data], 1024, &mut d);
    assert_eq!((sense(&o), wanted), (INVALID_FIELD_IN_CDB, Some(512)));
    assert_eq!(good(&t, 1, &read10(8, 1, 0), &[]), vec![0u8; 512]);
    // Exactly one block is fine.
    let (o, _) = t.plan(0, &cdb10(0x41, 0, 8, 1)).execute(1, &[&data[..512]], 512, &mut d);
    assert!(o.is_good());
    // Not a data-out command.
    let (o, wanted) = t.plan(0, &tur()).execute(1, &[], 0, &mut d);
    assert!(o.is_good() && wanted.is_none());
}
