//! Byte-vector tests for every command the target answers.

use super::*;
use crate::initiator::{self, Addr, AtaRequest, ReplyBody};
use crate::mask::{MCMD_EDIT, MCMD_READ};
use bw_block::BackendSpec;
use proptest::prelude::*;

const TARGET_MAC: Mac = [2, 0, 0, 0, 0, 0x10];
const HOST: Mac = [2, 0, 0, 0, 0, 0x01];
const OTHER: Mac = [2, 0, 0, 0, 0, 0x02];

fn settings(max_sectors: u8) -> ExportSettings {
    ExportSettings { shelf: 1, slot: 2, config_string: vec![], buffer_count: 64, max_sectors, allow: vec![], broadcast_writes: false }
}

fn export_with(spec: &str, max_sectors: u8) -> Export {
    let vol = Volume::open("disk0", &BackendSpec::parse(spec).unwrap()).unwrap();
    Export::new(settings(max_sectors), vol)
}

fn export_settings(s: ExportSettings) -> Export {
    Export::new(s, Volume::open("disk0", &BackendSpec::parse("ram:1M").unwrap()).unwrap())
}

fn export() -> Export {
    export_with("ram:1M", 17)
}

fn to(src: Mac) -> Addr {
    Addr { src, dst: TARGET_MAC, shelf: 1, slot: 2 }
}

/// Send a request built by `build`, return the reply bytes (or the reason for none).
fn roundtrip(e: &Export, build: impl FnOnce(&mut [u8]) -> usize) -> Result<Vec<u8>, Ignored> {
    let mut req = vec![0u8; 9100];
    let n = build(&mut req);
    let mut out = vec![0u8; e.reply_buffer_len()];
    match e.handle(&req[..n], TARGET_MAC, &mut out) {
        Outcome::Reply(len) => Ok(out[..len].to_vec()),
        Outcome::NoReply(why) => Err(why),
    }
}

fn ata(e: &Export, src: Mac, r: AtaRequest<'_>) -> Vec<u8> {
    roundtrip(e, |b| initiator::ata(b, &to(src), 0x1234, &r).unwrap()).expect("reply")
}

fn status(reply: &[u8]) -> (u8, u8) {
    (reply[27], reply[25])
}

#[test]
fn identify_reports_capacity_and_lba48() {
    let e = export();
    let r = ata(&e, HOST, AtaRequest::simple(CMD_IDENTIFY_DEVICE));
    assert_eq!(r.len(), 36 + 512);
    // Reply header: to the host, from the target, R flag, same tag.
    assert_eq!(&r[0..6], &HOST);
    assert_eq!(&r[6..12], &TARGET_MAC);
    assert_eq!(r[14], 0x18);
    assert_eq!(&r[16..24], &[0, 1, 2, 0, 0, 0, 0x12, 0x34]);
    assert_eq!(status(&r), (STATUS_DRDY, 0));
    let info = identify::parse(&r[36..]).unwrap();
    assert_eq!(info.sectors, 2048);
    assert!(info.lba48);
    assert_eq!(info.model, "blockwire disk0");
}

#[test]
fn write_then_read_back_lba48_and_lba28() {
    let e = export();
    let data: Vec<u8> = (0..17 * 512).map(|i| (i % 251) as u8).collect();
    let w = ata(&e, HOST, AtaRequest::write(100, &data));
    assert_eq!(w.len(), 60);
    assert_eq!(status(&w), (STATUS_DRDY, 0));
    let r = ata(&e, HOST, AtaRequest::read(100, 17));
    assert_eq!(r.len(), 36 + 17 * 512);
    assert_eq!(&r[36..], &data[..]);
    // LBA28 read of the same place, as a hand-made byte vector with 0xE0 in byte 3.
    let r28 = roundtrip(&e, |b| {
        let n = initiator::ata(b, &to(HOST), 9, &AtaRequest::read(0, 1)).unwrap();
        b[24..36].copy_from_slice(&[0x00, 0, 1, CMD_READ_SECTORS, 101, 0, 0, 0xE0, 0xAB, 0xCD, 0, 0]);
        n
    })
    .unwrap();
    assert_eq!(status(&r28), (STATUS_DRDY, 0));
    assert_eq!(&r28[36..36 + 512], &data[512..1024]);
}

#[test]
fn lba_past_the_end_is_an_ata_idnf_error() {
    let e = export();
    let r = ata(&e, HOST, AtaRequest::read(2047, 2));
    assert_eq!(r[14] & 0x4, 0, "never the E flag for I/O errors");
    assert_eq!(status(&r), (STATUS_DRDY | STATUS_ERR, ERR_IDNF | ERR_ABRT));
    assert_eq!(r.len(), 60);
    let r = ata(&e, HOST, AtaRequest::write(u64::MAX >> 16, &[0u8; 512]));
    assert_eq!(status(&r).0 & STATUS_ERR, STATUS_ERR);
}

#[test]
fn read_only_export_refuses_writes_with_abrt() {
    let e = export_with("ram:1M,readonly", 17);
    let r = ata(&e, HOST, AtaRequest::write(0, &[1u8; 512]));
    assert_eq!(r[14], 0x18);
    assert_eq!(status(&r), (STATUS_DRDY | STATUS_ERR, ERR_ABRT));
    let r = ata(&e, HOST, AtaRequest::read(0, 1));
    assert_eq!(status(&r), (STATUS_DRDY, 0));
}

#[test]
fn bad_sector_counts_are_protocol_errors() {
    let e = export_with("ram:1M", 2);
    for (count, write) in [(0u8, false), (3, false), (0, true)] {
        let r = roundtrip(&e, |b| {
            let n = initiator::ata(b, &to(HOST), 1, &AtaRequest::read(0, 1)).unwrap();
            b[26] = count;
            if write {
                b[24] |= AFLAG_WRITE;
                b[27] = CMD_WRITE_SECTORS_EXT;
            }
            n
        })
        .unwrap();
        assert_eq!(r[14], 0x1C, "R+E flags for count {count}");
        assert_eq!(r[15], ErrorCode::BadArgument as u8);
    }
    // Write announcing 2 sectors with only 1 present.
    let r = roundtrip(&e, |b| initiator::ata(b, &to(HOST), 1, &AtaRequest::write(0, &[0u8; 1024])).unwrap() - 512).unwrap();
    assert_eq!((r[14], r[15]), (0x1C, 2));
    // Write flag on a read command.
    let r = roundtrip(&e, |b| {
        let n = initiator::ata(b, &to(HOST), 1, &AtaRequest::read(0, 1)).unwrap();
        b[24] |= AFLAG_WRITE;
        n
    })
    .unwrap();
    assert_eq!((r[14], r[15]), (0x1C, 2));
}

#[test]
fn flush_power_mode_and_unknown_commands() {
    let e = export();
    assert_eq!(status(&ata(&e, HOST, AtaRequest::simple(CMD_FLUSH_CACHE_EXT))), (STATUS_DRDY, 0));
    assert_eq!(status(&ata(&e, HOST, AtaRequest::simple(CMD_FLUSH_CACHE))), (STATUS_DRDY, 0));
    assert_eq!(e.volume().stats().flushes, 2);
    let p = ata(&e, HOST, AtaRequest::simple(CMD_CHECK_POWER_MODE));
    assert_eq!((status(&p), p[26]), ((STATUS_DRDY, 0), POWER_MODE_ACTIVE));
    let u = ata(&e, HOST, AtaRequest::simple(0xB0)); // SMART: not supported
    assert_eq!(status(&u), (STATUS_DRDY | STATUS_ERR, ERR_ABRT));
}

#[test]
fn malformed_frames_are_ignored_or_rejected() {
    let e = export();
    let mut out = vec![0u8; e.reply_buffer_len()];
    // Truncated below the AoE header: ignored.
    assert_eq!(e.handle(&[0u8; 10], TARGET_MAC, &mut out), Outcome::NoReply(Ignored::NotAoe));
    let mut req = [0u8; 60];
    let n = initiator::ata(&mut req, &to(HOST), 1, &AtaRequest::read(0, 1)).unwrap();
    // Truncated ATA argument: bad argument.
    assert!(matches!(e.handle(&req[..30], TARGET_MAC, &mut out), Outcome::Reply(60)));
    assert_eq!((out[14], out[15]), (0x1C, 2));
    // Wrong version: error 5.
    req[14] = 0x20;
    assert!(matches!(e.handle(&req[..n], TARGET_MAC, &mut out), Outcome::Reply(60)));
    assert_eq!((out[14], out[15]), (0x1C, 5));
    req[14] = 0x10;
    // Unknown AoE command: error 1.
    req[19] = 0xF0;
    assert!(matches!(e.handle(&req[..n], TARGET_MAC, &mut out), Outcome::Reply(_)));
    assert_eq!((out[14], out[15]), (0x1C, 1));
    req[19] = 0;
    // Responses and other addresses are ignored.
    req[14] = 0x18;
    assert_eq!(e.handle(&req[..n], TARGET_MAC, &mut out), Outcome::NoReply(Ignored::Response));
    req[14] = 0x10;
    req[18] = 3;
    assert_eq!(e.handle(&req[..n], TARGET_MAC, &mut out), Outcome::NoReply(Ignored::NotAddressed));
    // Our shelf.slot but unicast to another MAC: another target's business.
    req[18] = 2;
    req[0..6].copy_from_slice(&OTHER);
    assert_eq!(e.handle(&req[..n], TARGET_MAC, &mut out), Outcome::NoReply(Ignored::NotAddressed));
    req[0..6].copy_from_slice(&TARGET_MAC);
    assert!(matches!(e.handle(&req[..n], TARGET_MAC, &mut out), Outcome::Reply(_)));
}

fn qc(e: &Export, src: Mac, cmd: ConfigCommand, s: &[u8]) -> Result<Vec<u8>, Ignored> {
    roundtrip(e, |b| initiator::query_config(b, &to(src), 7, cmd, s).unwrap())
}

fn qc_string(r: &[u8]) -> Vec<u8> {
    QueryConfig::parse(r).unwrap().config.to_vec()
}

#[test]
fn query_config_reports_geometry_and_string_commands() {
    let e = export();
    let r = qc(&e, HOST, ConfigCommand::Read, b"").unwrap();
    assert_eq!(&r[24..32], &[0, 64, 0, 1, 17, 0x10, 0, 0]);
    // Set if empty, then set again with another string: error 4.
    let r = qc(&e, HOST, ConfigCommand::SetIfEmpty, b"owner=a").unwrap();
    assert_eq!((r[14], qc_string(&r)), (0x18, b"owner=a".to_vec()));
    let r = qc(&e, HOST, ConfigCommand::SetIfEmpty, b"owner=b").unwrap();
    assert_eq!((r[14], r[15]), (0x1C, 4));
    assert_eq!(qc_string(&r), b"owner=a");
    // Test exact / prefix: match answers, mismatch stays silent.
    assert!(qc(&e, HOST, ConfigCommand::TestExact, b"owner=a").is_ok());
    assert_eq!(qc(&e, HOST, ConfigCommand::TestExact, b"owner"), Err(Ignored::ConfigMismatch));
    assert!(qc(&e, HOST, ConfigCommand::TestPrefix, b"owner").is_ok());
    assert_eq!(qc(&e, HOST, ConfigCommand::TestPrefix, b"x"), Err(Ignored::ConfigMismatch));
    // Force set overrides.
    let r = qc(&e, HOST, ConfigCommand::ForceSet, b"owner=b").unwrap();
    assert_eq!(qc_string(&r), b"owner=b");
    assert_eq!(e.config_string(), b"owner=b");
    // Unknown ccmd and a lying length: bad argument.
    let r = roundtrip(&e, |b| {
        let n = initiator::query_config(b, &to(HOST), 7, ConfigCommand::Read, b"").unwrap();
        b[29] = 0x17;
        n
    })
    .unwrap();
    assert_eq!((r[14], r[15]), (0x1C, 2));
    let r = roundtrip(&e, |b| {
        initiator::query_config(b, &to(HOST), 7, ConfigCommand::Read, b"").unwrap();
        b[30] = 0x03;
        b[31] = 0x00; // 768 bytes announced, frame is 60
        60
    })
    .unwrap();
    assert_eq!((r[14], r[15]), (0x1C, 2));
}

#[test]
fn broadcast_discovery_is_answered_with_the_real_address() {
    let e = export();
    let r = roundtrip(&e, |b| {
        let a = Addr { src: HOST, dst: crate::BROADCAST_MAC, shelf: 0xFFFF, slot: 0xFF };
        initiator::query_config(b, &a, 99, ConfigCommand::Read, b"").unwrap()
    })
    .unwrap();
    let rep = initiator::parse_reply(&r).unwrap();
    assert_eq!((rep.src, rep.shelf, rep.slot, rep.tag), (TARGET_MAC, 1, 2, 99));
    assert_eq!(r.len(), 60);
}

fn mask_req(e: &Export, src: Mac, mcmd: u8, ds: &[Directive]) -> Result<Vec<u8>, Ignored> {
    roundtrip(e, |b| initiator::mac_mask(b, &to(src), 3, mcmd, ds).unwrap())
}

fn add(mac: Mac) -> Directive {
    Directive { command: DirectiveCommand::Add, mac }
}

#[test]
fn mac_mask_list_edit_read_and_enforce() {
    let e = export();
    let r = mask_req(&e, HOST, MCMD_READ, &[]).unwrap();
    assert_eq!(&r[24..28], &[0, 0, 0, 0]);
    let r = mask_req(&e, HOST, MCMD_EDIT, &[add(HOST), Directive { command: DirectiveCommand::Nop, mac: OTHER }]).unwrap();
    assert_eq!(&r[24..36], &[0, 1, 0, 1, 0, 0, 2, 0, 0, 0, 0, 1]);
    // OTHER is now ignored for every command; HOST is served.
    assert_eq!(qc(&e, OTHER, ConfigCommand::Read, b""), Err(Ignored::Masked));
    assert_eq!(
        roundtrip(&e, |b| initiator::ata(b, &to(OTHER), 1, &AtaRequest::read(0, 1)).unwrap()),
        Err(Ignored::Masked)
    );
    assert_eq!(status(&ata(&e, HOST, AtaRequest::read(0, 1))), (STATUS_DRDY, 0));
    // Bad directive: merror 2, count = index of the failing directive.
    let r = mask_req(&e, HOST, MCMD_EDIT, &[add(OTHER), Directive { command: DirectiveCommand::Other(9), mac: HOST }]).unwrap();
    assert_eq!((r[26], r[27]), (mask::MERROR_BAD_DIRECTIVE, 1));
    // The add before it took effect.
    assert!(qc(&e, OTHER, ConfigCommand::Read, b"").is_ok());
    // Delete both: open to everyone again.
    let del = |mac| Directive { command: DirectiveCommand::Delete, mac };
    let r = mask_req(&e, HOST, MCMD_EDIT, &[del(HOST), del(OTHER)]).unwrap();
    assert_eq!(r[27], 0);
    assert!(qc(&e, [2, 9, 9, 9, 9, 9], ConfigCommand::Read, b"").is_ok());
    // Unknown mcmd: protocol error.
    let r = mask_req(&e, HOST, 7, &[]).unwrap();
    assert_eq!((r[14], r[15]), (0x1C, 2));
}

#[test]
fn mac_mask_list_fills_up() {
    let e = export();
    let many: Vec<Directive> = (0..=MAX_LIST as u8).map(|i| add([2, 1, 1, 1, 1, i])).collect();
    let r = mask_req(&e, [2, 1, 1, 1, 1, 0], MCMD_EDIT, &many).unwrap();
    assert_eq!((r[26], r[27] as usize), (mask::MERROR_LIST_FULL, MAX_LIST));
}

fn rr_req(e: &Export, src: Mac, rcmd: u8, macs: &[Mac]) -> Vec<u8> {
    roundtrip(e, |b| initiator::reserve(b, &to(src), 4, rcmd, macs).unwrap()).unwrap()
}

#[test]
fn reserve_release_semantics() {
    let e = export();
    let r = rr_req(&e, HOST, reserve_release::RCMD_READ, &[]);
    assert_eq!(&r[24..26], &[0, 0]);
    // HOST reserves for itself (list empty, so set is allowed).
    let r = rr_req(&e, HOST, reserve_release::RCMD_SET, &[HOST]);
    assert_eq!(&r[24..32], &[1, 1, 2, 0, 0, 0, 0, 1]);
    // OTHER: ATA rejected with error 6, IDENTIFY still allowed, set refused.
    let w = ata(&e, OTHER, AtaRequest::write(0, &[1u8; 512]));
    assert_eq!((w[14], w[15]), (0x1C, 6));
    let id = ata(&e, OTHER, AtaRequest::simple(CMD_IDENTIFY_DEVICE));
    assert_eq!(id[14], 0x18);
    let r = rr_req(&e, OTHER, reserve_release::RCMD_SET, &[OTHER]);
    assert_eq!((r[14], r[15]), (0x1C, 6));
    assert_eq!(status(&ata(&e, HOST, AtaRequest::write(0, &[1u8; 512]))), (STATUS_DRDY, 0));
    // Force set by OTHER takes it over.
    let r = rr_req(&e, OTHER, reserve_release::RCMD_FORCE_SET, &[OTHER]);
    assert_eq!(&r[24..32], &[2, 1, 2, 0, 0, 0, 0, 2]);
    assert_eq!(ata(&e, HOST, AtaRequest::read(0, 1))[15], 6);
    // Release (set with no MACs) by the holder.
    let r = rr_req(&e, OTHER, reserve_release::RCMD_SET, &[]);
    assert_eq!(&r[24..26], &[1, 0]);
    assert_eq!(status(&ata(&e, HOST, AtaRequest::read(0, 1))), (STATUS_DRDY, 0));
    // Unknown rcmd.
    let r = rr_req(&e, HOST, 9, &[]);
    assert_eq!((r[14], r[15]), (0x1C, 2));
}

#[test]
fn allow_list_ignores_other_stations_and_the_wire_cannot_change_it() {
    let e = export_settings(ExportSettings { allow: vec![HOST], ..settings(17) });
    let del = |mac| Directive { command: DirectiveCommand::Delete, mac };
    // Another station gets no reply to anything, and its write lands nowhere.
    let write = |src: Mac| roundtrip(&e, |b| initiator::ata(b, &to(src), 1, &AtaRequest::write(0, &[0xEE; 512])).unwrap());
    assert_eq!(write(OTHER), Err(Ignored::NotAllowed));
    assert_eq!(&ata(&e, HOST, AtaRequest::read(0, 1))[36..36 + 512], &[0u8; 512]);
    assert_eq!(qc(&e, OTHER, ConfigCommand::Read, b""), Err(Ignored::NotAllowed));
    assert_eq!(qc(&e, OTHER, ConfigCommand::ForceSet, b"mine"), Err(Ignored::NotAllowed));
    assert_eq!(mask_req(&e, OTHER, MCMD_EDIT, &[add(OTHER)]), Err(Ignored::NotAllowed));
    let r = roundtrip(&e, |b| initiator::reserve(b, &to(OTHER), 4, reserve_release::RCMD_FORCE_SET, &[OTHER]).unwrap());
    assert_eq!(r, Err(Ignored::NotAllowed));
    // The mask list reads as the allow-list; edits that would change it
    // fail with merror 1 at the first such directive, and change nothing.
    let r = mask_req(&e, HOST, MCMD_READ, &[]).unwrap();
    assert_eq!(&r[24..36], &[0, 0, 0, 1, 0, 0, 2, 0, 0, 0, 0, 1]);
    let nop = Directive { command: DirectiveCommand::Nop, mac: OTHER };
    let r = mask_req(&e, HOST, MCMD_EDIT, &[nop, add(OTHER)]).unwrap();
    assert_eq!((r[14], r[26], r[27]), (0x18, mask::MERROR_UNSPECIFIED, 1));
    let r = mask_req(&e, HOST, MCMD_EDIT, &[del(HOST)]).unwrap();
    assert_eq!((r[26], r[27]), (mask::MERROR_UNSPECIFIED, 0));
    assert_eq!(write(OTHER), Err(Ignored::NotAllowed));
    let r = mask_req(&e, HOST, MCMD_READ, &[]).unwrap();
    assert_eq!(&r[24..36], &[0, 0, 0, 1, 0, 0, 2, 0, 0, 0, 0, 1]);
    // The allowed station is served, reservations included.
    assert_eq!(status(&write(HOST).unwrap()), (STATUS_DRDY, 0));
    let r = rr_req(&e, HOST, reserve_release::RCMD_FORCE_SET, &[HOST]);
    assert_eq!(&r[24..32], &[2, 1, 2, 0, 0, 0, 0, 1]);
    assert_eq!(&ata(&e, HOST, AtaRequest::read(0, 1))[36..36 + 512], &[0xEE; 512]);
}

#[test]
fn ata_writes_to_a_broadcast_shelf_or_slot_are_ignored() {
    let e = export();
    let bcast = |shelf, slot, r: AtaRequest<'_>| {
        roundtrip(&e, |b| {
            let a = Addr { src: HOST, dst: crate::BROADCAST_MAC, shelf, slot };
            initiator::ata(b, &a, 5, &r).unwrap()
        })
    };
    for (shelf, slot) in [(0xFFFF, 0xFF), (0xFFFF, 2), (1, 0xFF)] {
        assert_eq!(bcast(shelf, slot, AtaRequest::write(0, &[0xAA; 512])), Err(Ignored::BroadcastWrite));
        // A write flagged W with another opcode is a write all the same.
        let r = roundtrip(&e, |b| {
            let a = Addr { src: HOST, dst: crate::BROADCAST_MAC, shelf, slot };
            let n = initiator::ata(b, &a, 5, &AtaRequest::write(0, &[0xAA; 512])).unwrap();
            b[27] = CMD_READ_SECTORS_EXT;
            n
        });
        assert_eq!(r, Err(Ignored::BroadcastWrite));
        // Reads and IDENTIFY are still answered.
        let r = bcast(shelf, slot, AtaRequest::read(0, 1)).unwrap();
        assert_eq!(status(&r), (STATUS_DRDY, 0));
        assert!(bcast(shelf, slot, AtaRequest::simple(CMD_IDENTIFY_DEVICE)).is_ok());
    }
    assert_eq!(&ata(&e, HOST, AtaRequest::read(0, 1))[36..36 + 512], &[0u8; 512]);
    // Addressed to this export, the same write is done.
    assert_eq!(status(&ata(&e, HOST, AtaRequest::write(0, &[0xAA; 512]))), (STATUS_DRDY, 0));

    // Turned back on, a broadcast write is executed as r11 allows.
    let e = export_settings(ExportSettings { broadcast_writes: true, ..settings(17) });
    let r = roundtrip(&e, |b| {
        let a = Addr { src: HOST, dst: crate::BROADCAST_MAC, shelf: 0xFFFF, slot: 0xFF };
        initiator::ata(b, &a, 5, &AtaRequest::write(0, &[0xBB; 512])).unwrap()
    });
    assert_eq!(status(&r.unwrap()), (STATUS_DRDY, 0));
    assert_eq!(&ata(&e, HOST, AtaRequest::read(0, 1))[36..36 + 512], &[0xBB; 512]);
}

#[test]
fn replies_parse_on_the_initiator_side() {
    let e = export();
    let r = ata(&e, HOST, AtaRequest::read(0, 2));
    match initiator::parse_reply(&r).unwrap().body {
        ReplyBody::Ata(a, data) => {
            assert!(!a.failed());
            assert_eq!(data.len(), 1024);
        }
        other => panic!("{other:?}"),
    }
}

proptest! {
    // Any byte string: the target never panics, and any reply it writes is
    // a well-formed AoE response.
    #[test]
    fn any_frame_gets_a_sane_outcome(mut bytes in proptest::collection::vec(any::<u8>(), 0..2000), cmd in 0u8..5, hdr in any::<bool>()) {
        let e = export();
        if hdr && bytes.len() >= 24 {
            bytes[0..6].copy_from_slice(&TARGET_MAC);
            bytes[12] = 0x88; bytes[13] = 0xa2; bytes[14] = 0x10; bytes[16] = 0; bytes[17] = 1; bytes[18] = 2; bytes[19] = cmd;
        }
        let mut out = vec![0u8; e.reply_buffer_len()];
        if let Outcome::Reply(n) = e.handle(&bytes, TARGET_MAC, &mut out) {
            prop_assert!(n >= 60 && n <= out.len());
            let h = AoeHeader::parse(&out[..n]).unwrap();
            prop_assert!(h.is_response());
            prop_assert_eq!(h.tag(), u32::from_be_bytes([bytes[20], bytes[21], bytes[22], bytes[23]]));
        }
    }

    // Writes then reads through the state machine behave like a byte array.
    #[test]
    fn io_matches_a_model(ops in proptest::collection::vec((0u64..2040, 1u8..=8, any::<u8>()), 1..20)) {
        let e = export();
        let mut model = vec![0u8; 1 << 20];
        for (lba, n, byte) in ops {
            let data = vec![byte; n as usize * 512];
            let w = ata(&e, HOST, AtaRequest::write(lba, &data));
            prop_assert_eq!(status(&w), (STATUS_DRDY, 0));
            model[lba as usize * 512..(lba as usize + n as usize) * 512].fill(byte);
            let r = ata(&e, HOST, AtaRequest::read(lba, n));
            prop_assert_eq!(&r[36..], &model[lba as usize * 512..(lba as usize + n as usize) * 512]);
        }
    }
}
