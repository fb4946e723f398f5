//! DH-HMAC-CHAP messages (the data of Auth Send / Auth Receive) and the
//! two commands' fields. Multi-byte fields are little-endian; every message
//! starts with AUTH_TYPE, AUTH_ID, 2 reserved bytes and T_ID. Layouts:
//!
//! ```text
//! Negotiate  00 00 rsvd T_ID SC_C NAPD, NAPD x 64-byte descriptors:
//!            AUTHID(01) rsvd HALEN DHLEN IDLIST[60] (hashes at 0.., groups at 30..)
//! Challenge  01 01 rsvd T_ID HL rsvd HASHID DHGID DHVLEN(2) SEQNUM(4) C1[HL] DHV[DHVLEN]
//! Reply      01 02 rsvd T_ID HL rsvd CVALID rsvd DHVLEN(2) SEQNUM(4) R1[HL] C2[HL] DHV[DHVLEN]
//! Success1   01 03 rsvd T_ID HL rsvd RVALID rsvd[7] R2[HL]
//! Success2   01 04 rsvd T_ID rsvd[10]
//! Failure1/2 00 F1/F0 rsvd T_ID RESCODE RESCODE_EXP
//! ```
//!
//! Parsers accept trailing bytes: a host reads messages into a larger
//! buffer (Linux: 4 KiB), and controllers pad them to it.

use super::codes::FailureReason;
use crate::queue_entry::Sqe;
use crate::fabrics::fctype;
use crate::status::Status;

/// Security protocol of DH-HMAC-CHAP in Auth Send/Receive (SECP).
pub const SECP_DHCHAP: u8 = 0xE9;
/// SPSP0 and SPSP1 of NVMe in-band authentication.
pub const SPSP: u8 = 0x01;
/// AUTHID of the DH-HMAC-CHAP protocol descriptor in Negotiate.
pub const AUTHID_DHCHAP: u8 = 0x01;
/// Reason code of Failure1/2: "authentication failure" (the explanation
/// says why).
pub const RESCODE_FAILED: u8 = 0x01;

pub mod auth_type {
    pub const COMMON: u8 = 0x00;
    pub const DHCHAP: u8 = 0x01;
}

pub mod auth_id {
    pub const NEGOTIATE: u8 = 0x00;
    pub const CHALLENGE: u8 = 0x01;
    pub const REPLY: u8 = 0x02;
    pub const SUCCESS1: u8 = 0x03;
    pub const SUCCESS2: u8 = 0x04;
    pub const FAILURE2: u8 = 0xF0;
    pub const FAILURE1: u8 = 0xF1;
}

const DESCRIPTOR_LEN: usize = 64;
/// Identifiers a descriptor lists of each kind (IDLIST halves).
const MAX_IDS: usize = 30;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MessageError {
    #[error("authentication message of {got} bytes, {need} needed")]
    Short { need: usize, got: usize },
    #[error("unknown authentication message type {auth_type:#04x} id {auth_id:#04x}")]
    Unknown { auth_type: u8, auth_id: u8 },
    #[error("AUTH_Negotiate offers no DH-HMAC-CHAP protocol descriptor")]
    NoDhchap,
    #[error("AUTH_Negotiate lists {0} identifiers of one kind; at most 30 fit")]
    TooManyIds(usize),
    #[error("hash length {0} is not that of SHA-256, -384 or -512")]
    HashLength(usize),
}

impl MessageError {
    /// The Failure reason a controller reports for it.
    pub fn reason(&self) -> FailureReason {
        match self {
            MessageError::Unknown { .. } => FailureReason::INCORRECT_MESSAGE,
            MessageError::NoDhchap => FailureReason::PROTOCOL_NOT_USABLE,
            _ => FailureReason::INCORRECT_PAYLOAD,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiate {
    pub tid: u16,
    /// Secure channel concatenation requested (0: none).
    pub sc_c: u8,
    /// Hash function ids offered, as sent (unknown ones included).
    pub hashes: Vec<u8>,
    /// DH group ids offered, as sent.
    pub groups: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    pub tid: u16,
    pub hash_id: u8,
    pub group_id: u8,
    pub seqnum: u32,
    /// C1, HL bytes.
    pub challenge: Vec<u8>,
    /// The controller's g^x (empty for the null group).
    pub dh_value: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub tid: u16,
    /// R1, HL bytes.
    pub response: Vec<u8>,
    /// C2 when the host asks the controller to authenticate (CVALID).
    pub challenge: Option<Vec<u8>>,
    /// S2 (0 without controller authentication).
    pub seqnum: u32,
    /// The host's g^y (empty for the null group).
    pub dh_value: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Success1 {
    pub tid: u16,
    pub hl: u8,
    /// R2 when the controller answers C2 (RVALID).
    pub response: Option<Vec<u8>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure {
    pub tid: u16,
    pub rescode: u8,
    pub reason: FailureReason,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Negotiate(Negotiate),
    Challenge(Challenge),
    Reply(Reply),
    Success1(Success1),
    Success2 {
        tid: u16,
    },
    /// Controller to host (read with Auth Receive).
    Failure1(Failure),
    /// Host to controller (sent with Auth Send).
    Failure2(Failure),
}

/// Header fields the parser reads at fixed offsets (the encoders append
/// each message in order).
mod field {
    use bw_wire::{Field, Le};

    /// Every message.
    pub const TID: Field<Le<u16>> = Field::at(4);
    /// DH-HMAC-CHAP Challenge and Reply.
    pub const DHVLEN: Field<Le<u16>> = Field::at(10);
    pub const SEQNUM: Field<Le<u32>> = Field::at(12);
    /// Auth Send / Auth Receive SQE: SPSP0, SPSP1, SECP, and TL or AL.
    pub const SPSP0: Field<u8> = Field::at(41);
    pub const SPSP1: Field<u8> = Field::at(42);
    pub const SECP: Field<u8> = Field::at(43);
    pub const LENGTH: Field<Le<u32>> = Field::at(44);
}

fn need(b: &[u8], n: usize) -> Result<(), MessageError> {
    if b.len() < n {
        return Err(MessageError::Short {
            need: n,
            got: b.len(),
        });
    }
    Ok(())
}

fn hash_len(hl: usize) -> Result<usize, MessageError> {
    match hl {
        32 | 48 | 64 => Ok(hl),
        _ => Err(MessageError::HashLength(hl)),
    }
}

/// The 8 bytes every message starts with.
fn header(out: &mut Vec<u8>, auth_type: u8, auth_id: u8, tid: u16) {
    out.extend_from_slice(&[auth_type, auth_id, 0, 0]);
    out.extend_from_slice(&tid.to_le_bytes());
}

impl Message {
    pub fn tid(&self) -> u16 {
        match self {
            Message::Negotiate(m) => m.tid,
            Message::Challenge(m) => m.tid,
            Message::Reply(m) => m.tid,
            Message::Success1(m) => m.tid,
            Message::Success2 { tid } => *tid,
            Message::Failure1(f) | Message::Failure2(f) => f.tid,
        }
    }

    /// Its name in the specification, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Message::Negotiate(_) => "AUTH_Negotiate",
            Message::Challenge(_) => "DH-HMAC-CHAP_Challenge",
            Message::Reply(_) => "DH-HMAC-CHAP_Reply",
            Message::Success1(_) => "DH-HMAC-CHAP_Success1",
            Message::Success2 { .. } => "DH-HMAC-CHAP_Success2",
            Message::Failure1(_) => "AUTH_Failure1",
            Message::Failure2(_) => "AUTH_Failure2",
        }
    }

    pub fn parse(b: &[u8]) -> Result<Message, MessageError> {
        need(b, 8)?;
        let tid = field::TID.get(b);
        Ok(match (b[0], b[1]) {
            (auth_type::COMMON, auth_id::NEGOTIATE) => {
                let (sc_c, napd) = (b[6], b[7] as usize);
                need(b, 8 + napd * DESCRIPTOR_LEN)?;
                let d = (0..napd)
                    .map(|i| &b[8 + i * DESCRIPTOR_LEN..8 + (i + 1) * DESCRIPTOR_LEN])
                    .find(|d| d[0] == AUTHID_DHCHAP)
                    .ok_or(MessageError::NoDhchap)?;
                let (halen, dhlen) = (d[2] as usize, d[3] as usize);
                if halen > MAX_IDS || dhlen > MAX_IDS {
                    return Err(MessageError::TooManyIds(halen.max(dhlen)));
                }
                let ids = &d[4..];
                Message::Negotiate(Negotiate {
                    tid,
                    sc_c,
                    hashes: ids[..halen].to_vec(),
                    groups: ids[MAX_IDS..MAX_IDS + dhlen].to_vec(),
                })
            }
            (auth_type::DHCHAP, auth_id::CHALLENGE) => {
                need(b, 16)?;
                let hl = hash_len(b[6] as usize)?;
                let dhvlen = field::DHVLEN.get(b) as usize;
                need(b, 16 + hl + dhvlen)?;
                Message::Challenge(Challenge {
                    tid,
                    hash_id: b[8],
                    group_id: b[9],
                    seqnum: field::SEQNUM.get(b),
                    challenge: b[16..16 + hl].to_vec(),
                    dh_value: b[16 + hl..16 + hl + dhvlen].to_vec(),
                })
            }
            (auth_type::DHCHAP, auth_id::REPLY) => {
                need(b, 16)?;
                let hl = hash_len(b[6] as usize)?;
                let cvalid = b[8] & 1 != 0;
                let dhvlen = field::DHVLEN.get(b) as usize;
                need(b, 16 + 2 * hl + dhvlen)?;
                Message::Reply(Reply {
                    tid,
                    response: b[16..16 + hl].to_vec(),
                    challenge: cvalid.then(|| b[16 + hl..16 + 2 * hl].to_vec()),
                    seqnum: field::SEQNUM.get(b),
                    dh_value: b[16 + 2 * hl..16 + 2 * hl + dhvlen].to_vec(),
                })
            }
            (auth_type::DHCHAP, auth_id::SUCCESS1) => {
                need(b, 16)?;
                let hl = b[6];
                let response = if b[8] & 1 != 0 {
                    let n = hash_len(hl as usize)?;
                    need(b, 16 + n)?;
                    Some(b[16..16 + n].to_vec())
                } else {
                    None
                };
                Message::Success1(Success1 { tid, hl, response })
            }
            (auth_type::DHCHAP, auth_id::SUCCESS2) => {
                need(b, 16)?;
                Message::Success2 { tid }
            }
            (auth_type::COMMON, id @ (auth_id::FAILURE1 | auth_id::FAILURE2)) => {
                let f = Failure {
                    tid,
                    rescode: b[6],
                    reason: FailureReason(b[7]),
                };
                if id == auth_id::FAILURE1 {
                    Message::Failure1(f)
                } else {
                    Message::Failure2(f)
                }
            }
            (t, i) => {
                return Err(MessageError::Unknown {
                    auth_type: t,
                    auth_id: i,
                })
            }
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(96);
        match self {
            Message::Negotiate(m) => {
                header(&mut out, auth_type::COMMON, auth_id::NEGOTIATE, m.tid);
                out.extend_from_slice(&[m.sc_c, 1]);
                let mut d = [0u8; DESCRIPTOR_LEN];
                let (h, g) = (m.hashes.len().min(MAX_IDS), m.groups.len().min(MAX_IDS));
                d[0] = AUTHID_DHCHAP;
                d[2] = h as u8;
                d[3] = g as u8;
                d[4..4 + h].copy_from_slice(&m.hashes[..h]);
                d[4 + MAX_IDS..4 + MAX_IDS + g].copy_from_slice(&m.groups[..g]);
                out.extend_from_slice(&d);
            }
            Message::Challenge(m) => {
                header(&mut out, auth_type::DHCHAP, auth_id::CHALLENGE, m.tid);
                out.extend_from_slice(&[m.challenge.len() as u8, 0, m.hash_id, m.group_id]);
                out.extend_from_slice(&(m.dh_value.len() as u16).to_le_bytes());
                out.extend_from_slice(&m.seqnum.to_le_bytes());
                out.extend_from_slice(&m.challenge);
                out.extend_from_slice(&m.dh_value);
            }
            Message::Reply(m) => {
                header(&mut out, auth_type::DHCHAP, auth_id::REPLY, m.tid);
                let hl = m.response.len();
                out.extend_from_slice(&[hl as u8, 0, m.challenge.is_some() as u8, 0]);
                out.extend_from_slice(&(m.dh_value.len() as u16).to_le_bytes());
                out.extend_from_slice(&m.seqnum.to_le_bytes());
                out.extend_from_slice(&m.response);
                match &m.challenge {
                    Some(c) => out.extend_from_slice(c),
                    None => out.resize(out.len() + hl, 0),
                }
                out.extend_from_slice(&m.dh_value);
            }
            Message::Success1(m) => {
                header(&mut out, auth_type::DHCHAP, auth_id::SUCCESS1, m.tid);
                out.extend_from_slice(&[m.hl, 0, m.response.is_some() as u8]);
                out.resize(16, 0);
                match &m.response {
                    Some(r) => out.extend_from_slice(r),
                    None => out.resize(16 + m.hl as usize, 0),
                }
            }
            Message::Success2 { tid } => {
                header(&mut out, auth_type::DHCHAP, auth_id::SUCCESS2, *tid);
                out.resize(16, 0);
            }
            Message::Failure1(f) | Message::Failure2(f) => {
                let id = if matches!(self, Message::Failure1(_)) {
                    auth_id::FAILURE1
                } else {
                    auth_id::FAILURE2
                };
                header(&mut out, auth_type::COMMON, id, f.tid);
                out.extend_from_slice(&[f.rescode, f.reason.0]);
            }
        }
        out
    }
}

/// The fields of Auth Send (host to controller: TL bytes) and Auth Receive
/// (controller to host: at most AL bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthCommand {
    pub send: bool,
    pub secp: u8,
    pub spsp0: u8,
    pub spsp1: u8,
    /// TL (Send) or AL (Receive).
    pub len: u32,
}

impl AuthCommand {
    /// None unless `s` is a fabrics Auth Send or Auth Receive.
    pub fn parse(s: &Sqe) -> Option<AuthCommand> {
        if !s.is_fabrics() || !matches!(s.fctype(), fctype::AUTH_SEND | fctype::AUTH_RECEIVE) {
            return None;
        }
        let b = &s.0;
        Some(AuthCommand {
            send: s.fctype() == fctype::AUTH_SEND,
            secp: field::SECP.get(b),
            spsp0: field::SPSP0.get(b),
            spsp1: field::SPSP1.get(b),
            len: field::LENGTH.get(b),
        })
    }

    fn sqe(fct: u8, cid: u16, len: u32) -> Sqe {
        let mut s = Sqe::fabrics(fct, cid);
        field::SPSP0.set(&mut s.0, SPSP);
        field::SPSP1.set(&mut s.0, SPSP);
        field::SECP.set(&mut s.0, SECP_DHCHAP);
        field::LENGTH.set(&mut s.0, len);
        s
    }
    /// Auth Send of `tl` bytes (the caller attaches the data and its SGL).
    pub fn send_sqe(cid: u16, tl: u32) -> Sqe {
        Self::sqe(fctype::AUTH_SEND, cid, tl)
    }
    /// Auth Receive of at most `al` bytes.
    pub fn receive_sqe(cid: u16, al: u32) -> Sqe {
        Self::sqe(fctype::AUTH_RECEIVE, cid, al)
    }

    /// What a controller checks before looking at the data (as Linux's
    /// target does): DH-HMAC-CHAP's SECP and SPSP, a nonzero length, and a
    /// data transfer (`transfer_len`, from the SGL) of exactly that length.
    pub fn check(&self, transfer_len: u32) -> Result<(), Status> {
        if self.secp != SECP_DHCHAP || self.spsp0 != SPSP || self.spsp1 != SPSP || self.len == 0 {
            return Err(Status::INVALID_FIELD.dnr());
        }
        if transfer_len != self.len {
            return Err(Status::SGL_INVALID_DATA.dnr());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_linux_structs() {
        let n = Message::Negotiate(Negotiate {
            tid: 0x0102,
            sc_c: 0,
            hashes: vec![1, 2, 3],
            groups: vec![0, 1, 2, 3, 4, 5],
        });
        let b = n.encode();
        assert_eq!(b.len(), 72);
        assert_eq!(&b[..12], &[0, 0, 0, 0, 2, 1, 0, 1, 1, 0, 3, 6]);
        assert_eq!(&b[12..15], &[1, 2, 3]);
        assert_eq!(&b[8 + 4 + 30..8 + 4 + 36], &[0, 1, 2, 3, 4, 5]);
        assert_eq!(Message::parse(&b).unwrap(), n);

        let c = Message::Challenge(Challenge {
            tid: 7,
            hash_id: 2,
            group_id: 1,
            seqnum: 0xAABBCCDD,
            challenge: vec![9; 48],
            dh_value: vec![5; 256],
        });
        let b = c.encode();
        assert_eq!(
            &b[..16],
            &[1, 1, 0, 0, 7, 0, 48, 0, 2, 1, 0, 1, 0xDD, 0xCC, 0xBB, 0xAA]
        );
        assert_eq!(b.len(), 16 + 48 + 256);
        assert_eq!(Message::parse(&b).unwrap(), c);

        let r = Message::Reply(Reply {
            tid: 7,
            response: vec![1; 32],
            challenge: Some(vec![2; 32]),
            seqnum: 9,
            dh_value: vec![],
        });
        let b = r.encode();
        assert_eq!(&b[..16], &[1, 2, 0, 0, 7, 0, 32, 0, 1, 0, 0, 0, 9, 0, 0, 0]);
        assert_eq!(b.len(), 16 + 64);
        assert_eq!(Message::parse(&b).unwrap(), r);
        // Without C2 the field is still there, zeroed.
        let r1 = Message::Reply(Reply {
            tid: 7,
            response: vec![1; 32],
            challenge: None,
            seqnum: 0,
            dh_value: vec![3; 4],
        });
        assert_eq!(r1.encode().len(), 16 + 64 + 4);
        assert_eq!(Message::parse(&r1.encode()).unwrap(), r1);

        let s = Message::Success1(Success1 {
            tid: 7,
            hl: 64,
            response: Some(vec![4; 64]),
        });
        let b = s.encode();
        assert_eq!(&b[..9], &[1, 3, 0, 0, 7, 0, 64, 0, 1]);
        assert_eq!(b.len(), 80);
        assert_eq!(Message::parse(&b).unwrap(), s);
        assert_eq!(
            Message::Success2 { tid: 7 }.encode(),
            [1, 4, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        let f = Message::Failure1(Failure {
            tid: 7,
            rescode: 1,
            reason: FailureReason::HASH_UNUSABLE,
        });
        assert_eq!(f.encode(), [0, 0xF1, 0, 0, 7, 0, 1, 4]);
        assert_eq!(Message::parse(&f.encode()).unwrap(), f);
        // Trailing padding (a 4 KiB receive buffer) is ignored.
        let mut padded = f.encode();
        padded.resize(4096, 0);
        assert_eq!(Message::parse(&padded).unwrap(), f);
    }

    #[test]
    fn malformed_messages_are_errors_not_panics() {
        assert_eq!(
            Message::parse(&[1, 1, 0]),
            Err(MessageError::Short { need: 8, got: 3 })
        );
        assert!(matches!(
            Message::parse(&[9, 9, 0, 0, 0, 0, 0, 0]),
            Err(MessageError::Unknown { .. })
        ));
        let mut c = Message::Challenge(Challenge {
            tid: 1,
            hash_id: 1,
            group_id: 0,
            seqnum: 1,
            challenge: vec![0; 32],
            dh_value: vec![],
        })
        .encode();
        c[10] = 0xFF; // DH value longer than the message
        assert!(matches!(
            Message::parse(&c),
            Err(MessageError::Short { .. })
        ));
        c[10] = 0;
        c[6] = 33;
        assert_eq!(Message::parse(&c), Err(MessageError::HashLength(33)));
        let mut n = Message::Negotiate(Negotiate {
            tid: 1,
            sc_c: 0,
            hashes: vec![1],
            groups: vec![0],
        })
        .encode();
        n[8] = 2; // not DH-HMAC-CHAP
        assert_eq!(Message::parse(&n), Err(MessageError::NoDhchap));
        n[8] = 1;
        n[10] = 31;
        assert_eq!(Message::parse(&n), Err(MessageError::TooManyIds(31)));
        n[7] = 4; // four descriptors announced, one present
        assert!(matches!(
            Message::parse(&n),
            Err(MessageError::Short { .. })
        ));
        // Arbitrary bytes never panic.
        for len in 0..200usize {
            let b: Vec<u8> = (0..len).map(|i| (i * 37 + len) as u8).collect();
            for t in [0u8, 1] {
                for id in [0u8, 1, 2, 3, 4, 0xF0, 0xF1] {
                    let mut m = b.clone();
                    if m.len() >= 2 {
                        m[0] = t;
                        m[1] = id;
                    }
                    let _ = Message::parse(&m);
                }
            }
        }
    }

    #[test]
    fn auth_command_fields() {
        let s = AuthCommand::send_sqe(5, 72);
        assert_eq!(&s.0[..5], &[0x7F, 0x40, 5, 0, 0x05]);
        assert_eq!(&s.0[40..48], &[0, 1, 1, 0xE9, 72, 0, 0, 0]);
        let c = AuthCommand::parse(&s).unwrap();
        assert_eq!(
            c,
            AuthCommand {
                send: true,
                secp: 0xE9,
                spsp0: 1,
                spsp1: 1,
                len: 72
            }
        );
        assert_eq!(c.check(72), Ok(()));
        assert_eq!(c.check(64), Err(Status::SGL_INVALID_DATA.dnr()));
        assert_eq!(
            AuthCommand { secp: 0xEA, ..c }.check(72),
            Err(Status::INVALID_FIELD.dnr())
        );
        assert_eq!(
            AuthCommand { spsp1: 0, ..c }.check(72),
            Err(Status::INVALID_FIELD.dnr())
        );
        assert_eq!(
            AuthCommand { len: 0, ..c }.check(0),
            Err(Status::INVALID_FIELD.dnr())
        );
        let r = AuthCommand::parse(&AuthCommand::receive_sqe(6, 4096)).unwrap();
        assert!(!r.send);
        assert_eq!(r.len, 4096);
        assert_eq!(AuthCommand::parse(&crate::fabrics::disconnect_sqe(1)), None);
    }
}
