//! NVMe completion status, spelled as Linux does: `SCT << 8 | SC`, with the
//! Do Not Retry bit as 0x4000. On the wire the 15-bit value sits above the
//! phase bit ([`Status::wire`]).

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Status(pub u16);

impl Status {
    pub const SUCCESS: Status = Status(0x0);
    pub const INVALID_OPCODE: Status = Status(0x1);
    pub const INVALID_FIELD: Status = Status(0x2);
    pub const CMDID_CONFLICT: Status = Status(0x3);
    pub const DATA_XFER_ERROR: Status = Status(0x4);
    pub const INTERNAL: Status = Status(0x6);
    pub const ABORT_REQ: Status = Status(0x7);
    pub const INVALID_NS: Status = Status(0xB);
    pub const CMD_SEQ_ERROR: Status = Status(0xC);
    pub const SGL_INVALID_DATA: Status = Status(0xF);
    pub const SGL_INVALID_TYPE: Status = Status(0x11);
    pub const SGL_INVALID_OFFSET: Status = Status(0x16);
    /// The controller could not complete the command now; the host should
    /// retry it (base spec 2.0 Figure 102, 21h).
    /// The host's identifier is 128 bits; a report that asks for 64-bit
    /// ones gets this (generic 18h).
    pub const HOST_ID_INCONSISTENT: Status = Status(0x18);
    pub const COMMAND_INTERRUPTED: Status = Status(0x21);
    pub const TRANSIENT_TRANSPORT: Status = Status(0x22);
    pub const LBA_RANGE: Status = Status(0x80);
    pub const RESERVATION_CONFLICT: Status = Status(0x83);
    pub const CAP_EXCEEDED: Status = Status(0x81);
    pub const QID_INVALID: Status = Status(0x101);
    pub const ASYNC_LIMIT: Status = Status(0x105);
    pub const INVALID_LOG_PAGE: Status = Status(0x109);
    pub const FEATURE_NOT_SAVEABLE: Status = Status(0x10D);
    pub const FEATURE_NOT_CHANGEABLE: Status = Status(0x10E);
    pub const READ_ONLY: Status = Status(0x182);
    pub const CONNECT_FORMAT: Status = Status(0x180);
    pub const CONNECT_CTRL_BUSY: Status = Status(0x181);
    pub const CONNECT_INVALID_PARAM: Status = Status(0x182);
    pub const CONNECT_RESTART_DISC: Status = Status(0x183);
    pub const CONNECT_INVALID_HOST: Status = Status(0x184);
    /// In-band authentication must complete first (fabrics, SCT 1 SC 91h).
    pub const AUTH_REQUIRED: Status = Status(0x191);
    pub const WRITE_FAULT: Status = Status(0x280);
    pub const READ_ERROR: Status = Status(0x281);
    pub const COMPARE_FAILED: Status = Status(0x285);
    /// Path-related (status code type 3h): ANA states that refuse I/O.
    pub const ANA_PERSISTENT_LOSS: Status = Status(0x301);
    pub const ANA_INACCESSIBLE: Status = Status(0x302);
    pub const ANA_TRANSITION: Status = Status(0x303);
    pub const DNR: u16 = 0x4000;

    /// The same status with Do Not Retry set.
    pub const fn dnr(self) -> Status {
        Status(self.0 | Self::DNR)
    }
    pub fn is_success(self) -> bool {
        self.0 & 0x7FF == 0
    }
    /// Status code type (0 generic, 1 command specific, 2 media, 3 path).
    pub fn sct(self) -> u8 {
        ((self.0 >> 8) & 0x7) as u8
    }
    pub fn sc(self) -> u8 {
        self.0 as u8
    }
    pub fn wire(self, phase: bool) -> u16 {
        (self.0 << 1) | phase as u16
    }
    pub fn from_wire(v: u16) -> Status {
        Status(v >> 1)
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match Status(self.0 & 0x7FF) {
            Status::SUCCESS => "success",
            Status::INVALID_OPCODE => "invalid opcode",
            Status::INVALID_FIELD => "invalid field",
            Status::CMDID_CONFLICT => "command id conflict",
            Status::DATA_XFER_ERROR => "data transfer error",
            Status::INTERNAL => "internal error",
            Status::INVALID_NS => "invalid namespace",
            Status::CMD_SEQ_ERROR => "command sequence error",
            Status::SGL_INVALID_DATA => "data SGL length invalid",
            Status::COMMAND_INTERRUPTED => "command interrupted (retry)",
            Status::TRANSIENT_TRANSPORT => "transient transport error",
            Status::LBA_RANGE => "LBA out of range",
            Status::CAP_EXCEEDED => "capacity exceeded",
            Status::RESERVATION_CONFLICT => "reservation conflict",
            Status::HOST_ID_INCONSISTENT => "host identifier inconsistent format",
            Status::CONNECT_INVALID_PARAM => "connect: invalid parameters (or read-only namespace)",
            Status::CONNECT_INVALID_HOST => "connect: host not allowed",
            Status::CONNECT_FORMAT => "connect: incompatible format",
            Status::CONNECT_CTRL_BUSY => "connect: controller busy",
            Status::COMPARE_FAILED => "compare failure",
            Status::WRITE_FAULT => "write fault",
            Status::READ_ERROR => "unrecovered read error",
            _ => "status",
        };
        write!(f, "{name} (sct {} sc {:#04x}{})", self.sct(), self.sc(), if self.0 & Self::DNR != 0 { ", dnr" } else { "" })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn wire_form_shifts_above_phase() {
        assert_eq!(Status::LBA_RANGE.dnr().wire(false), (0x4080u16) << 1);
        assert_eq!(Status::from_wire(0x0109), Status(0x84));
        assert_eq!(Status::CONNECT_INVALID_HOST.sct(), 1);
        assert_eq!(Status::COMPARE_FAILED.sc(), 0x85);
    }
}
