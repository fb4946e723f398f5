//! Harness bodies shared by the cargo-fuzz targets (crates/iscsi/fuzz) and
//! the proptest smoke test: feed untrusted bytes to every parser and state
//! machine and check invariants. Panics mean bugs.

use crate::target_login::{LoginConfig, LoginStep, Secret, TargetInfo, TargetLogin};
use crate::msg::Message;
use crate::negotiate::{LocalLimits, SessionParams, SessionType};
use crate::pdu::{field, Bhs, Decoder, Digests, Pdu, BHS_LEN};
use crate::target_session::{Action, SessionConfig, TargetSession};
use bytes::{Bytes, BytesMut};

/// Frame `data` as a PDU stream (both digest settings) and round-trip each
/// decoded header through its typed form.
pub fn pdu_stream(data: &[u8]) {
    for digests in [Digests::default(), Digests { header: true, data: true }] {
        let mut dec = Decoder::new(1 << 16);
        dec.digests = digests;
        let mut buf = BytesMut::from(data);
        while let Ok(Some(p)) = dec.decode(&mut buf) {
            if let Ok(m) = Message::decode(&p.bhs) {
                let again = Message::decode(&m.encode()).expect("re-encoded header decodes");
                assert_eq!(again, m);
            }
            let _ = crate::pdu::extended_cdb(&p.ahs);
        }
    }
}

fn config() -> LoginConfig {
    LoginConfig {
        targets: vec![
            TargetInfo {
                name: "iqn.2026-11.org.fuzz:open".into(),
                alias: None,
                portal_group_tag: 1,
                allowed_initiators: vec![],
                chap: None,
                mutual_chap: None,
            },
            TargetInfo {
                name: "iqn.2026-11.org.fuzz:chap".into(),
                alias: Some("chap".into()),
                portal_group_tag: 2,
                allowed_initiators: vec!["iqn.2026-11.org.fuzz:i".into()],
                chap: Some(Secret::new("u", "secret-secret")),
                mutual_chap: Some(Secret::new("t", "other-secret")),
            },
        ],
        limits: LocalLimits::default(),
        queue_depth: 8,
        discovery_chap: Some(Secret::new("d", "discovery-secret")),
        discovery_mutual_chap: None,
    }
}

/// Parse arbitrary text, then run it through the login state machine as
/// the data of successive Login Requests whose flags come from the input.
pub fn login_text(data: &[u8]) {
    let _ = crate::text::parse(data);
    let cfg = config();
    let mut login = TargetLogin::new(&cfg, 1, crate::chap::ChapEntropy([7; 33]));
    for (i, chunk) in data.split(|b| *b == b'\n').enumerate().take(8) {
        let mut bhs = Bhs::default();
        bhs.set_bits(field::OPCODE, crate::pdu::Opcode::LoginRequest as u8);
        bhs.set_flag(field::IMMEDIATE, true);
        // T, C, CSG and NSG from the input (the reserved bits 5..4 clear).
        bhs.0[1] = chunk.first().copied().unwrap_or(0x87) & 0xCF;
        bhs.set(field::CMD_SN, (i as u32) << 24);
        let pdu = Pdu::new(bhs, Bytes::copy_from_slice(chunk.get(1..).unwrap_or(&[])));
        let (resp, step) = login.step(&pdu);
        assert!(resp.bhs.opcode().is_ok());
        match step {
            LoginStep::Continue => {}
            LoginStep::Complete => {
                assert!(login.result().is_some());
                return;
            }
            LoginStep::Failed(s) => {
                assert_ne!(s, 0);
                return;
            }
        }
    }
}

/// A logged-in normal session fed PDUs cut from `data` (48-byte headers,
/// data lengths from the header capped by what is left); completes every
/// command it is asked to run so the window keeps moving.
pub fn session_stream(data: &[u8]) {
    let params = SessionParams { initial_r2t: data.first().is_some_and(|b| b & 1 == 1), ..SessionParams::default() };
    let mut s = TargetSession::new(SessionConfig {
        session_type: if data.get(1).is_some_and(|b| b & 1 == 1) { SessionType::Discovery } else { SessionType::Normal },
        params,
        queue_depth: 8,
        exp_cmd_sn: 0,
        stat_sn: 0,
        cid: 0,
        targets: vec![("iqn.2026-11.org.fuzz:open".into(), vec!["127.0.0.1:3260,1".into()])],
        current_target: Some("iqn.2026-11.org.fuzz:open".into()),
        data_out_budget: crate::target_session::DATA_OUT_BUDGET,
    });
    let mut rest = data.get(2..).unwrap_or(&[]);
    while rest.len() >= BHS_LEN {
        let mut bhs = Bhs::default();
        bhs.0.copy_from_slice(&rest[..BHS_LEN]);
        rest = &rest[BHS_LEN..];
        let dlen = bhs.data_segment_len().min(rest.len()).min(4096);
        let pdu = Pdu::new(bhs, Bytes::copy_from_slice(&rest[..dlen]));
        rest = &rest[dlen..];
        let mut out = Vec::new();
        if s.on_pdu(pdu, std::time::Instant::now(), &mut out).is_err() {
            return; // connection would close
        }
        let mut more = Vec::new();
        for a in out {
            match a {
                Action::Execute(e) => s.complete(e.itt, e.id, 0, &[], vec![0u8; (e.edtl as usize).min(65536)], Default::default(), &mut more),
                Action::Close => return,
                _ => {}
            }
        }
        // The window and the commands in it never exceed the queue depth;
        // immediate commands sit outside it, and are bounded on their own.
        let window = s.max_cmd_sn().wrapping_sub(s.exp_cmd_sn()).wrapping_add(1);
        let in_window = s.outstanding() - s.immediate_outstanding();
        assert!(window as usize + in_window <= 8 + 1, "window {window} + outstanding {in_window} exceeds the queue depth");
        assert!(s.immediate_outstanding() <= crate::target_session::MAX_IMMEDIATE_TASKS);
    }
}
