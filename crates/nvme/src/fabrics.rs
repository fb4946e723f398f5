//! NVMe over Fabrics commands: Connect (with its 1024-byte data), Property
//! Get/Set, Disconnect. Auth Send/Receive are in [`crate::auth`].

use crate::limits::MAX_QUEUE_ENTRIES;
use crate::queue_entry::{sgl, Sgl, Sqe};
use crate::{get_str, put_str, Status};

/// Fabrics command fields in the SQE (after the common ones, see
/// [`crate::queue_entry::sqe`]), each defined once.
mod field {
    use bw_wire::{Field, Le};

    // Connect.
    pub const RECFMT: Field<Le<u16>> = Field::at(40);
    pub const QID: Field<Le<u16>> = Field::at(42);
    pub const SQSIZE: Field<Le<u16>> = Field::at(44);
    pub const CATTR: Field<u8> = Field::at(46);
    pub const KATO: Field<Le<u32>> = Field::at(48);
    // Property Get/Set.
    pub const ATTRIB: Field<u8> = Field::at(40);
    pub const OFST: Field<Le<u32>> = Field::at(44);
    pub const VALUE: Field<Le<u64>> = Field::at(48);
    // Connect data.
    pub const HOSTID: Field<[u8; 16]> = Field::at(0);
    pub const CNTLID: Field<Le<u16>> = Field::at(16);
}

pub mod fctype {
    pub const PROPERTY_SET: u8 = 0x00;
    pub const CONNECT: u8 = 0x01;
    pub const PROPERTY_GET: u8 = 0x04;
    pub const AUTH_SEND: u8 = 0x05;
    pub const AUTH_RECEIVE: u8 = 0x06;
    pub const DISCONNECT: u8 = 0x08;
}

/// Controller property offsets.
pub mod reg {
    pub const CAP: u32 = 0x00;
    pub const VS: u32 = 0x08;
    pub const CC: u32 = 0x14;
    pub const CSTS: u32 = 0x1C;
}

pub const CONNECT_DATA_LEN: usize = 1024;
/// Longest NQN the specification allows, in bytes (its 256-byte fields
/// hold it NUL-terminated).
pub const NQN_MAX_LEN: usize = 223;
/// Connect response dword 0, AUTHREQ: in-band authentication (ATR) or
/// secure channel concatenation (ASCR) is required before other commands.
pub const AUTHREQ_ATR: u32 = 1 << 17;
pub const AUTHREQ_ASCR: u32 = 1 << 18;
/// Connect CATTR bit: the host disables submission queue flow control.
pub const CATTR_DISABLE_SQFLOW: u8 = 1 << 2;

/// Offsets inside the Connect data, for error reporting (IPO).
pub const CD_CNTLID: u32 = 16;
pub const CD_SUBNQN: u32 = 256;
pub const CD_HOSTNQN: u32 = 512;
/// Offsets inside the Connect SQE.
pub const CS_QID: u32 = 42;
pub const CS_SQSIZE: u32 = 44;

/// Invalid parameter attributes for a Connect error in the Connect data.
pub fn ipo_data(offset: u32) -> u64 {
    ((1u32 << 16) | offset) as u64
}
/// ... or in the Connect SQE.
pub fn ipo_sqe(offset: u32) -> u64 {
    offset as u64
}

/// The SQE fields of Connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Connect {
    pub recfmt: u16,
    pub qid: u16,
    /// Zero-based submission queue size.
    pub sqsize: u16,
    pub cattr: u8,
    /// Keep-alive timeout in milliseconds (admin queue; 0 = none).
    pub kato_ms: u32,
}

impl Connect {
    pub fn parse(s: &Sqe) -> Connect {
        Connect {
            recfmt: field::RECFMT.get(&s.0),
            qid: field::QID.get(&s.0),
            sqsize: field::SQSIZE.get(&s.0),
            cattr: field::CATTR.get(&s.0),
            kato_ms: field::KATO.get(&s.0),
        }
    }
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let mut s = Sqe::fabrics(fctype::CONNECT, cid);
        s.set_sgl(Sgl { addr: 0, length: CONNECT_DATA_LEN as u32, kind: sgl::INCAPSULE });
        field::RECFMT.set(&mut s.0, self.recfmt);
        field::QID.set(&mut s.0, self.qid);
        field::SQSIZE.set(&mut s.0, self.sqsize);
        field::CATTR.set(&mut s.0, self.cattr);
        field::KATO.set(&mut s.0, self.kato_ms);
        s
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectData {
    pub hostid: [u8; 16],
    /// 0xFFFF on the admin queue asks for a dynamic controller ID.
    pub cntlid: u16,
    pub subnqn: String,
    pub hostnqn: String,
}

impl ConnectData {
    /// None if the data is shorter than 1024 bytes.
    pub fn parse(b: &[u8]) -> Option<ConnectData> {
        if b.len() < CONNECT_DATA_LEN {
            return None;
        }
        Some(ConnectData {
            hostid: field::HOSTID.get(b),
            cntlid: field::CNTLID.get(b),
            subnqn: get_str(&b[256..512]), hostnqn: get_str(&b[512..768]) })
    }
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; CONNECT_DATA_LEN];
        field::HOSTID.set(&mut b, self.hostid);
        field::CNTLID.set(&mut b, self.cntlid);
        put_str(&mut b[256..511], &self.subnqn, 0);
        put_str(&mut b[512..767], &self.hostnqn, 0);
        b
    }
}

/// A Connect's own checks, the same on every transport: record format,
/// queue size, the data's length and NQN lengths. The command and its data,
/// or the status and result (invalid parameter location) refusing it.
pub fn check_connect(sqe: &Sqe, data: &[u8]) -> Result<(Connect, ConnectData), (Status, u64)> {
    let c = Connect::parse(sqe);
    if c.recfmt != 0 {
        return Err((Status::CONNECT_FORMAT.dnr(), 0));
    }
    if c.sqsize == 0 || c.sqsize >= MAX_QUEUE_ENTRIES {
        return Err((Status::CONNECT_INVALID_PARAM.dnr(), ipo_sqe(CS_SQSIZE)));
    }
    let d = ConnectData::parse(data).ok_or((Status::SGL_INVALID_DATA.dnr(), 0))?;
    for (nqn, at) in [(&d.subnqn, CD_SUBNQN), (&d.hostnqn, CD_HOSTNQN)] {
        if nqn.len() > NQN_MAX_LEN {
            return Err((Status::CONNECT_INVALID_PARAM.dnr(), ipo_data(at)));
        }
    }
    Ok((c, d))
}

/// Property Get/Set fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Property {
    /// 8-byte access (CAP) instead of 4.
    pub size8: bool,
    pub offset: u32,
    pub value: u64,
}

impl Property {
    pub fn parse(s: &Sqe) -> Property {
        Property {
            size8: field::ATTRIB.get(&s.0) & 0x7 == 1,
            offset: field::OFST.get(&s.0),
            value: field::VALUE.get(&s.0),
        }
    }
    pub fn get_sqe(cid: u16, offset: u32, size8: bool) -> Sqe {
        let mut s = Sqe::fabrics(fctype::PROPERTY_GET, cid);
        field::ATTRIB.set(&mut s.0, size8 as u8);
        field::OFST.set(&mut s.0, offset);
        s
    }
    pub fn set_sqe(cid: u16, offset: u32, value: u64) -> Sqe {
        let mut s = Sqe::fabrics(fctype::PROPERTY_SET, cid);
        field::OFST.set(&mut s.0, offset);
        field::VALUE.set(&mut s.0, value);
        s
    }
}

pub fn disconnect_sqe(cid: u16) -> Sqe {
    Sqe::fabrics(fctype::DISCONNECT, cid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_sqe_and_data_layout() {
        let c = Connect { recfmt: 0, qid: 3, sqsize: 127, cattr: 0, kato_ms: 5000 };
        let s = c.to_sqe(9);
        assert_eq!(&s.0[..5], &[0x7F, 0x40, 9, 0, 0x01]);
        assert_eq!(&s.0[40..52], &[0, 0, 3, 0, 127, 0, 0, 0, 0x88, 0x13, 0, 0]);
        assert_eq!(s.sgl().length, 1024);
        assert_eq!(Connect::parse(&s), c);
        let d = ConnectData { hostid: [7; 16], cntlid: 0xFFFF, subnqn: "nqn.a:b".into(), hostnqn: "nqn.h:1".into() };
        let b = d.encode();
        assert_eq!(&b[16..18], &[0xFF, 0xFF]);
        assert_eq!(&b[256..263], b"nqn.a:b");
        assert_eq!(b[263], 0);
        assert_eq!(&b[512..519], b"nqn.h:1");
        assert_eq!(ConnectData::parse(&b), Some(d));
        assert_eq!(ConnectData::parse(&b[..1000]), None);
        assert_eq!(ipo_data(CD_HOSTNQN), 0x10200);
    }

    #[test]
    fn property_layout() {
        let s = Property::get_sqe(1, reg::CAP, true);
        assert_eq!(&s.0[..5], &[0x7F, 0x40, 1, 0, 0x04]);
        assert_eq!(s.0[40], 1);
        let s = Property::set_sqe(2, reg::CC, 0x460001);
        assert_eq!(&s.0[44..52], &[0x14, 0, 0, 0, 0x01, 0x00, 0x46, 0x00]);
        assert_eq!(Property::parse(&s), Property { size8: false, offset: 0x14, value: 0x460001 });
    }
}
