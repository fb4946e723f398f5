//! Byte vectors for every PDU type: each header is written out by hand from
//! the RFC 7143 section 11 layouts (as byte patches over 48 zero bytes), then
//! decoded into the typed message and encoded back.

use bw_iscsi::msg::*;
use bw_iscsi::pdu::{Bhs, Decoder, Digests, Pdu};
use bytes::{Bytes, BytesMut};

/// 48 bytes: zeroes with (offset, bytes) patches.
fn bhs(patches: &[(usize, &[u8])]) -> Bhs {
    let mut b = [0u8; 48];
    for (at, bytes) in patches {
        b[*at..*at + bytes.len()].copy_from_slice(bytes);
    }
    Bhs(b)
}

fn check(raw: Bhs, msg: Message) {
    assert_eq!(Message::decode(&raw).unwrap(), msg, "decode of {raw:?}");
    assert_eq!(msg.encode(), raw, "encode of {msg:?}");
}

const LUN1: &[u8] = &[0, 1, 0, 0, 0, 0, 0, 0];

#[test]
fn nop_out_and_nop_in() {
    check(
        bhs(&[(0, &[0x40, 0x80]), (8, LUN1), (16, &[0, 0, 0, 9]), (20, &[0xFF; 4]), (24, &[0, 0, 0, 5]), (28, &[0, 0, 0, 7])]),
        Message::NopOut(NopOut { immediate: true, lun: 1 << 48, itt: 9, ttt: 0xFFFF_FFFF, cmd_sn: 5, exp_stat_sn: 7 }),
    );
    check(
        bhs(&[(0, &[0x20, 0x80]), (16, &[0xFF; 4]), (20, &[0, 0, 0, 3]), (24, &[0, 0, 1, 0]), (28, &[0, 0, 0, 2]), (32, &[0, 0, 0, 0x41])]),
        Message::NopIn(NopIn { lun: 0, itt: 0xFFFF_FFFF, ttt: 3, stat_sn: 256, exp_cmd_sn: 2, max_cmd_sn: 65 }),
    );
}

#[test]
fn scsi_command_and_response() {
    let mut cdb = [0u8; 16];
    cdb[..10].copy_from_slice(&[0x28, 0, 0, 0, 0, 0x10, 0, 0, 8, 0]);
    check(
        bhs(&[
            (0, &[0x01, 0xC1]), // F, R, SIMPLE
            (8, LUN1),
            (16, &[0xAB, 0xCD, 0, 1]),
            (20, &[0, 0, 0x10, 0]),
            (24, &[0, 0, 0, 0x20]),
            (28, &[0, 0, 0, 0x30]),
            (32, &cdb),
        ]),
        Message::ScsiCommand(ScsiCommand {
            immediate: false,
            final_: true,
            read: true,
            write: false,
            attr: 1,
            lun: 1 << 48,
            itt: 0xABCD_0001,
            edtl: 4096,
            cmd_sn: 0x20,
            exp_stat_sn: 0x30,
            cdb,
        }),
    );
    check(
        bhs(&[
            (0, &[0x21, 0x82, 0x00, 0x02]), // U bit, CHECK CONDITION
            (16, &[0, 0, 0, 4]),
            (24, &[0, 0, 0, 10]),
            (28, &[0, 0, 0, 11]),
            (32, &[0, 0, 0, 74]),
            (36, &[0, 0, 0, 1]),
            (44, &[0, 0, 0x02, 0]),
        ]),
        Message::ScsiResponse(ScsiResponse {
            response: 0,
            status: 2,
            itt: 4,
            stat_sn: 10,
            exp_cmd_sn: 11,
            max_cmd_sn: 74,
            exp_data_sn: 1,
            residual: Residual::Underflow(512),
        }),
    );
}

#[test]
fn task_management() {
    check(
        bhs(&[(0, &[0x42, 0x81]), (8, LUN1), (16, &[0, 0, 0, 8]), (20, &[0, 0, 0, 4]), (24, &[0, 0, 0, 9]), (28, &[0, 0, 0, 3]), (32, &[0, 0, 0, 6])]),
        Message::TaskMgmtRequest(TaskMgmtRequest {
            immediate: true,
            function: TmfFunction::AbortTask as u8,
            lun: 1 << 48,
            itt: 8,
            referenced_task_tag: 4,
            cmd_sn: 9,
            exp_stat_sn: 3,
            ref_cmd_sn: 6,
            exp_data_sn: 0,
        }),
    );
    check(
        bhs(&[(0, &[0x22, 0x80, 0x01]), (16, &[0, 0, 0, 8]), (24, &[0, 0, 0, 4]), (28, &[0, 0, 0, 10]), (32, &[0, 0, 0, 73])]),
        Message::TaskMgmtResponse(TaskMgmtResponse { response: tmf_response::TASK_DOES_NOT_EXIST, itt: 8, stat_sn: 4, exp_cmd_sn: 10, max_cmd_sn: 73 }),
    );
}

#[test]
fn login_request_and_response() {
    let isid = [0x80, 0x00, 0x02, 0x3d, 0x00, 0x01];
    check(
        bhs(&[(0, &[0x43, 0x87, 0x00, 0x00]), (8, &isid), (16, &[0, 0, 0, 0]), (20, &[0, 0]), (24, &[0, 0, 0, 1])]),
        Message::LoginRequest(LoginRequest {
            transit: true,
            continue_: false,
            csg: 1,
            nsg: 3,
            version_max: 0,
            version_min: 0,
            isid,
            tsih: 0,
            itt: 0,
            cid: 0,
            cmd_sn: 1,
            exp_stat_sn: 0,
        }),
    );
    check(
        bhs(&[
            (0, &[0x23, 0x87, 0x00, 0x00]),
            (8, &isid),
            (14, &[0x00, 0x2a]),
            (24, &[0, 0, 0, 2]),
            (28, &[0, 0, 0, 1]),
            (32, &[0, 0, 0, 128]),
            (36, &[0x02, 0x01]),
        ]),
        Message::LoginResponse(LoginResponse {
            transit: true,
            continue_: false,
            csg: 1,
            nsg: 3,
            version_max: 0,
            version_active: 0,
            isid,
            tsih: 42,
            itt: 0,
            stat_sn: 2,
            exp_cmd_sn: 1,
            max_cmd_sn: 128,
            status_class: 2,
            status_detail: 1,
        }),
    );
}

#[test]
fn text_request_and_response() {
    check(
        bhs(&[(0, &[0x44, 0x80]), (16, &[0, 0, 0, 1]), (20, &[0xFF; 4]), (24, &[0, 0, 0, 1]), (28, &[0, 0, 0, 2])]),
        Message::TextRequest(TextRequest { immediate: true, final_: true, continue_: false, lun: 0, itt: 1, ttt: 0xFFFF_FFFF, cmd_sn: 1, exp_stat_sn: 2 }),
    );
    check(
        bhs(&[(0, &[0x24, 0x40]), (16, &[0, 0, 0, 1]), (20, &[0, 0, 0, 5]), (24, &[0, 0, 0, 2]), (28, &[0, 0, 0, 1]), (32, &[0, 0, 0, 64])]),
        Message::TextResponse(TextResponse { final_: false, continue_: true, lun: 0, itt: 1, ttt: 5, stat_sn: 2, exp_cmd_sn: 1, max_cmd_sn: 64 }),
    );
}

#[test]
fn data_out_data_in_r2t() {
    check(
        bhs(&[(0, &[0x05, 0x80]), (8, LUN1), (16, &[0, 0, 0, 7]), (20, &[0, 0, 0, 3]), (28, &[0, 0, 0, 9]), (36, &[0, 0, 0, 1]), (40, &[0, 0, 0x20, 0])]),
        Message::DataOut(DataOut { final_: true, lun: 1 << 48, itt: 7, ttt: 3, exp_stat_sn: 9, data_sn: 1, buffer_offset: 8192 }),
    );
    // Last Data-In with status (S), overflow residual.
    check(
        bhs(&[
            (0, &[0x25, 0x85, 0x00, 0x00]),
            (8, LUN1),
            (16, &[0, 0, 0, 7]),
            (20, &[0xFF; 4]),
            (24, &[0, 0, 0, 12]),
            (28, &[0, 0, 0, 13]),
            (32, &[0, 0, 0, 76]),
            (36, &[0, 0, 0, 2]),
            (40, &[0, 0, 0x40, 0]),
            (44, &[0, 0, 0x01, 0x38]),
        ]),
        Message::DataIn(DataIn {
            final_: true,
            ack: false,
            has_status: true,
            status: 0,
            lun: 1 << 48,
            itt: 7,
            ttt: 0xFFFF_FFFF,
            stat_sn: 12,
            exp_cmd_sn: 13,
            max_cmd_sn: 76,
            data_sn: 2,
            buffer_offset: 16384,
            residual: Residual::Overflow(312),
        }),
    );
    check(
        bhs(&[
            (0, &[0x31, 0x80]),
            (8, LUN1),
            (16, &[0, 0, 0, 7]),
            (20, &[0, 0, 0, 4]),
            (24, &[0, 0, 0, 12]),
            (28, &[0, 0, 0, 13]),
            (32, &[0, 0, 0, 76]),
            (36, &[0, 0, 0, 1]),
            (40, &[0, 0x04, 0, 0]),
            (44, &[0, 0x04, 0, 0]),
        ]),
        Message::R2t(R2t {
            lun: 1 << 48,
            itt: 7,
            ttt: 4,
            stat_sn: 12,
            exp_cmd_sn: 13,
            max_cmd_sn: 76,
            r2t_sn: 1,
            buffer_offset: 262144,
            desired_length: 262144,
        }),
    );
}

/// Byte 3 of a Data-In is its status only with the S bit; without it the
/// byte is reserved and decodes as 0 (it used to decode as given, so the
/// message did not re-encode to itself; found by the pdu fuzz target).
#[test]
fn data_in_without_s_bit_has_no_status() {
    let raw = bhs(&[(0, &[0x25, 0x00, 0x00, 0x2F]), (16, &[0, 0, 0, 7]), (20, &[0xFF; 4])]);
    let Message::DataIn(d) = Message::decode(&raw).unwrap() else { panic!("not a Data-In") };
    assert_eq!((d.has_status, d.status), (false, 0));
    assert_eq!(Message::decode(&Message::DataIn(d.clone()).encode()).unwrap(), Message::DataIn(d));
}

#[test]
fn logout_snack_async_reject() {
    check(
        bhs(&[(0, &[0x46, 0x80]), (16, &[0, 0, 0, 2]), (20, &[0, 1]), (24, &[0, 0, 0, 3]), (28, &[0, 0, 0, 4])]),
        Message::LogoutRequest(LogoutRequest { immediate: true, reason: 0, itt: 2, cid: 1, cmd_sn: 3, exp_stat_sn: 4 }),
    );
    check(
        bhs(&[(0, &[0x26, 0x80, 0x02]), (16, &[0, 0, 0, 2]), (24, &[0, 0, 0, 4]), (28, &[0, 0, 0, 3]), (32, &[0, 0, 0, 66]), (40, &[0, 2, 0, 20])]),
        Message::LogoutResponse(LogoutResponse { response: 2, itt: 2, stat_sn: 4, exp_cmd_sn: 3, max_cmd_sn: 66, time2wait: 2, time2retain: 20 }),
    );
    check(
        bhs(&[(0, &[0x10, 0x81]), (8, LUN1), (16, &[0, 0, 0, 7]), (20, &[0xFF; 4]), (28, &[0, 0, 0, 5]), (40, &[0, 0, 0, 1]), (44, &[0, 0, 0, 2])]),
        Message::SnackRequest(SnackRequest { snack_type: 1, lun: 1 << 48, itt: 7, ttt: 0xFFFF_FFFF, exp_stat_sn: 5, beg_run: 1, run_length: 2 }),
    );
    check(
        bhs(&[
            (0, &[0x32, 0x80]),
            (16, &[0xFF; 4]),
            (24, &[0, 0, 0, 9]),
            (28, &[0, 0, 0, 8]),
            (32, &[0, 0, 0, 71]),
            (36, &[0x03, 0x00, 0, 0, 0, 2, 0, 0]),
        ]),
        Message::AsyncMessage(AsyncMessage {
            lun: 0,
            stat_sn: 9,
            exp_cmd_sn: 8,
            max_cmd_sn: 71,
            event: async_event::DROP_ALL_CONNECTIONS,
            vcode: 0,
            parameter1: 0,
            parameter2: 2,
            parameter3: 0,
        }),
    );
    check(
        bhs(&[(0, &[0x3F, 0x80, 0x04]), (16, &[0xFF; 4]), (24, &[0, 0, 0, 9]), (28, &[0, 0, 0, 8]), (32, &[0, 0, 0, 71])]),
        Message::Reject(Reject { reason: reject_reason::PROTOCOL_ERROR, stat_sn: 9, exp_cmd_sn: 8, max_cmd_sn: 71, data_sn: 0 }),
    );
}

#[test]
fn whole_pdu_on_the_wire() {
    // A Text Request carrying "SendTargets=All\0" (16 bytes, no padding),
    // then a 5-byte segment padded to 8 with both digests.
    let raw = bhs(&[(0, &[0x44, 0x80]), (16, &[0, 0, 0, 1]), (20, &[0xFF; 4])]);
    let p = Pdu::new(raw, Bytes::from_static(b"SendTargets=All\0"));
    let wire = p.encode(Digests::default());
    assert_eq!(wire.len(), 64);
    assert_eq!(&wire[5..8], &[0, 0, 16]);
    assert_eq!(&wire[48..], b"SendTargets=All\0");
    let p = Pdu::new(raw, Bytes::from_static(b"a=b\0c"));
    let d = Digests { header: true, data: true };
    let wire = p.encode(d);
    assert_eq!(wire.len(), 48 + 4 + 8 + 4);
    assert_eq!(&wire[52..60], b"a=b\0c\0\0\0");
    // Header digest is CRC32C of the 48 header bytes, little-endian on the wire.
    let mut hdr = raw.0;
    hdr[7] = 5;
    assert_eq!(&wire[48..52], &crc32c::crc32c(&hdr).to_le_bytes());
    assert_eq!(&wire[60..64], &crc32c::crc32c(b"a=b\0c\0\0\0").to_le_bytes());
    let mut dec = Decoder::new(8192);
    dec.digests = d;
    let back = dec.decode(&mut BytesMut::from(&wire[..])).unwrap().unwrap();
    assert_eq!(back.data, &b"a=b\0c"[..]);
}
