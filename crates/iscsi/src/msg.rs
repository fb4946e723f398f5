//! Typed views of every iSCSI PDU's header (RFC 7143 section 11). Each type
//! converts to and from a [`Bhs`]; data segments stay in [`crate::Pdu`].

use crate::pdu::{Bhs, Opcode, PduError};

/// ISID: initiator part of the session identifier (6 bytes).
pub type Isid = [u8; 6];

fn base(op: Opcode, immediate: bool, flags: u8) -> Bhs {
    let mut b = Bhs::default();
    b.0[0] = op as u8 | if immediate { 0x40 } else { 0 };
    b.0[1] = flags;
    b
}

fn isid(b: &Bhs) -> Isid {
    let mut i = [0u8; 6];
    i.copy_from_slice(&b.0[8..14]);
    i
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NopOut {
    pub immediate: bool,
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NopIn {
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScsiCommand {
    pub immediate: bool,
    pub final_: bool,
    pub read: bool,
    pub write: bool,
    pub attr: u8,
    pub lun: u64,
    pub itt: u32,
    pub edtl: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    pub cdb: [u8; 16],
}

/// Residual flags shared by SCSI Response and Data-In.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Residual {
    #[default]
    None,
    /// The target wanted to transfer more than the EDTL allowed.
    Overflow(u32),
    /// Less than the EDTL was transferred.
    Underflow(u32),
}

impl Residual {
    /// From the transferred amount versus the initiator's expectation.
    pub fn of(wanted: usize, expected: usize) -> Residual {
        if wanted > expected {
            Residual::Overflow((wanted - expected) as u32)
        } else if wanted < expected {
            Residual::Underflow((expected - wanted) as u32)
        } else {
            Residual::None
        }
    }
    fn flags(self) -> u8 {
        match self {
            Residual::None => 0,
            Residual::Overflow(_) => 0x04,
            Residual::Underflow(_) => 0x02,
        }
    }
    fn count(self) -> u32 {
        match self {
            Residual::None => 0,
            Residual::Overflow(n) | Residual::Underflow(n) => n,
        }
    }
    fn parse(flags: u8, count: u32) -> Residual {
        if flags & 0x04 != 0 {
            Residual::Overflow(count)
        } else if flags & 0x02 != 0 {
            Residual::Underflow(count)
        } else {
            Residual::None
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScsiResponse {
    /// 0 = command completed at target; 1 = target failure.
    pub response: u8,
    pub status: u8,
    pub itt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub exp_data_sn: u32,
    pub residual: Residual,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum TmfFunction {
    AbortTask = 1,
    AbortTaskSet = 2,
    ClearAca = 3,
    ClearTaskSet = 4,
    LunReset = 5,
    TargetWarmReset = 6,
    TargetColdReset = 7,
    TaskReassign = 8,
}

impl TmfFunction {
    pub fn from_u8(v: u8) -> Option<TmfFunction> {
        use TmfFunction::*;
        Some(match v {
            1 => AbortTask,
            2 => AbortTaskSet,
            3 => ClearAca,
            4 => ClearTaskSet,
            5 => LunReset,
            6 => TargetWarmReset,
            7 => TargetColdReset,
            8 => TaskReassign,
            _ => return None,
        })
    }
}

/// TMF response codes.
pub mod tmf_response {
    pub const FUNCTION_COMPLETE: u8 = 0;
    pub const TASK_DOES_NOT_EXIST: u8 = 1;
    pub const LUN_DOES_NOT_EXIST: u8 = 2;
    pub const TASK_STILL_ALLEGIANT: u8 = 3;
    pub const REASSIGNMENT_NOT_SUPPORTED: u8 = 4;
    pub const NOT_SUPPORTED: u8 = 5;
    pub const AUTHORIZATION_FAILED: u8 = 6;
    pub const REJECTED: u8 = 255;
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskMgmtRequest {
    pub immediate: bool,
    /// Raw function code (see [`TmfFunction`]).
    pub function: u8,
    pub lun: u64,
    pub itt: u32,
    pub referenced_task_tag: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    pub ref_cmd_sn: u32,
    pub exp_data_sn: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskMgmtResponse {
    pub response: u8,
    pub itt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
}

/// Login stages (CSG/NSG values).
pub mod stage {
    pub const SECURITY: u8 = 0;
    pub const OPERATIONAL: u8 = 1;
    pub const FULL_FEATURE: u8 = 3;
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoginRequest {
    pub transit: bool,
    pub continue_: bool,
    pub csg: u8,
    pub nsg: u8,
    pub version_max: u8,
    pub version_min: u8,
    pub isid: Isid,
    pub tsih: u16,
    pub itt: u32,
    pub cid: u16,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoginResponse {
    pub transit: bool,
    pub continue_: bool,
    pub csg: u8,
    pub nsg: u8,
    pub version_max: u8,
    pub version_active: u8,
    pub isid: Isid,
    pub tsih: u16,
    pub itt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub status_class: u8,
    pub status_detail: u8,
}

/// Login status (class << 8 | detail), RFC 7143 section 11.13.5.
pub mod login_status {
    pub const SUCCESS: u16 = 0x0000;
    pub const TARGET_MOVED_TEMPORARILY: u16 = 0x0101;
    pub const INITIATOR_ERROR: u16 = 0x0200;
    pub const AUTHENTICATION_FAILURE: u16 = 0x0201;
    pub const AUTHORIZATION_FAILURE: u16 = 0x0202;
    pub const NOT_FOUND: u16 = 0x0203;
    pub const TARGET_REMOVED: u16 = 0x0204;
    pub const UNSUPPORTED_VERSION: u16 = 0x0205;
    pub const TOO_MANY_CONNECTIONS: u16 = 0x0206;
    pub const MISSING_PARAMETER: u16 = 0x0207;
    pub const CANT_INCLUDE_IN_SESSION: u16 = 0x0208;
    pub const SESSION_TYPE_NOT_SUPPORTED: u16 = 0x0209;
    pub const SESSION_DOES_NOT_EXIST: u16 = 0x020A;
    pub const INVALID_DURING_LOGIN: u16 = 0x020B;
    pub const TARGET_ERROR: u16 = 0x0300;
    pub const SERVICE_UNAVAILABLE: u16 = 0x0301;
    pub const OUT_OF_RESOURCES: u16 = 0x0302;
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TextRequest {
    pub immediate: bool,
    pub final_: bool,
    pub continue_: bool,
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TextResponse {
    pub final_: bool,
    pub continue_: bool,
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DataOut {
    pub final_: bool,
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub exp_stat_sn: u32,
    pub data_sn: u32,
    pub buffer_offset: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DataIn {
    pub final_: bool,
    pub ack: bool,
    /// Status is carried in this PDU (S bit); then `status` and `residual` apply.
    pub has_status: bool,
    pub status: u8,
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub data_sn: u32,
    pub buffer_offset: u32,
    pub residual: Residual,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogoutRequest {
    pub immediate: bool,
    /// 0 close session, 1 close connection, 2 remove connection for recovery.
    pub reason: u8,
    pub itt: u32,
    pub cid: u16,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogoutResponse {
    /// 0 closed, 1 CID not found, 2 recovery not supported, 3 cleanup failed.
    pub response: u8,
    pub itt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub time2wait: u16,
    pub time2retain: u16,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnackRequest {
    pub snack_type: u8,
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub exp_stat_sn: u32,
    pub beg_run: u32,
    pub run_length: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct R2t {
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub r2t_sn: u32,
    pub buffer_offset: u32,
    pub desired_length: u32,
}

/// Async events (RFC 7143 section 11.9.1).
pub mod async_event {
    pub const SCSI_EVENT: u8 = 0;
    pub const LOGOUT_REQUESTED: u8 = 1;
    pub const DROP_CONNECTION: u8 = 2;
    pub const DROP_ALL_CONNECTIONS: u8 = 3;
    pub const NEGOTIATION_REQUESTED: u8 = 4;
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AsyncMessage {
    pub lun: u64,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub event: u8,
    pub vcode: u8,
    pub parameter1: u16,
    pub parameter2: u16,
    pub parameter3: u16,
}

/// Reject reasons (RFC 7143 section 11.17.1).
pub mod reject_reason {
    pub const DATA_DIGEST_ERROR: u8 = 0x02;
    pub const SNACK_REJECT: u8 = 0x03;
    pub const PROTOCOL_ERROR: u8 = 0x04;
    pub const COMMAND_NOT_SUPPORTED: u8 = 0x05;
    pub const IMMEDIATE_COMMAND_REJECT: u8 = 0x06;
    pub const TASK_IN_PROGRESS: u8 = 0x07;
    pub const INVALID_DATA_ACK: u8 = 0x08;
    pub const INVALID_PDU_FIELD: u8 = 0x09;
    pub const LONG_OP_REJECT: u8 = 0x0A;
    pub const NEGOTIATION_RESET: u8 = 0x0B;
    pub const WAITING_FOR_LOGOUT: u8 = 0x0C;
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reject {
    pub reason: u8,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub data_sn: u32,
}

/// Any PDU header, typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    NopOut(NopOut),
    ScsiCommand(ScsiCommand),
    TaskMgmtRequest(TaskMgmtRequest),
    LoginRequest(LoginRequest),
    TextRequest(TextRequest),
    DataOut(DataOut),
    LogoutRequest(LogoutRequest),
    SnackRequest(SnackRequest),
    NopIn(NopIn),
    ScsiResponse(ScsiResponse),
    TaskMgmtResponse(TaskMgmtResponse),
    LoginResponse(LoginResponse),
    TextResponse(TextResponse),
    DataIn(DataIn),
    LogoutResponse(LogoutResponse),
    R2t(R2t),
    AsyncMessage(AsyncMessage),
    Reject(Reject),
}

impl Message {
    pub fn decode(b: &Bhs) -> Result<Message, PduError> {
        let f = b.0[1];
        let fin = f & 0x80 != 0;
        let imm = b.immediate();
        Ok(match b.opcode()? {
            Opcode::NopOut => Message::NopOut(NopOut {
                immediate: imm,
                lun: b.u64(8),
                itt: b.u32(16),
                ttt: b.u32(20),
                cmd_sn: b.u32(24),
                exp_stat_sn: b.u32(28),
            }),
            Opcode::ScsiCommand => {
                let mut cdb = [0u8; 16];
                cdb.copy_from_slice(&b.0[32..48]);
                Message::ScsiCommand(ScsiCommand {
                    immediate: imm,
                    final_: fin,
                    read: f & 0x40 != 0,
                    write: f & 0x20 != 0,
                    attr: f & 0x07,
                    lun: b.u64(8),
                    itt: b.u32(16),
                    edtl: b.u32(20),
                    cmd_sn: b.u32(24),
                    exp_stat_sn: b.u32(28),
                    cdb,
                })
            }
            Opcode::TaskMgmtRequest => Message::TaskMgmtRequest(TaskMgmtRequest {
                immediate: imm,
                function: f & 0x7F,
                lun: b.u64(8),
                itt: b.u32(16),
                referenced_task_tag: b.u32(20),
                cmd_sn: b.u32(24),
                exp_stat_sn: b.u32(28),
                ref_cmd_sn: b.u32(32),
                exp_data_sn: b.u32(36),
            }),
            Opcode::LoginRequest => Message::LoginRequest(LoginRequest {
                transit: fin,
                continue_: f & 0x40 != 0,
                csg: (f >> 2) & 3,
                nsg: f & 3,
                version_max: b.u8(2),
                version_min: b.u8(3),
                isid: isid(b),
                tsih: b.u16(14),
                itt: b.u32(16),
                cid: b.u16(20),
                cmd_sn: b.u32(24),
                exp_stat_sn: b.u32(28),
            }),
            Opcode::TextRequest => Message::TextRequest(TextRequest {
                immediate: imm,
                final_: fin,
                continue_: f & 0x40 != 0,
                lun: b.u64(8),
                itt: b.u32(16),
                ttt: b.u32(20),
                cmd_sn: b.u32(24),
                exp_stat_sn: b.u32(28),
            }),
            Opcode::DataOut => Message::DataOut(DataOut {
                final_: fin,
                lun: b.u64(8),
                itt: b.u32(16),
                ttt: b.u32(20),
                exp_stat_sn: b.u32(28),
                data_sn: b.u32(36),
                buffer_offset: b.u32(40),
            }),
            Opcode::LogoutRequest => Message::LogoutRequest(LogoutRequest {
                immediate: imm,
                reason: f & 0x7F,
                itt: b.u32(16),
                cid: b.u16(20),
                cmd_sn: b.u32(24),
                exp_stat_sn: b.u32(28),
            }),
            Opcode::SnackRequest => Message::SnackRequest(SnackRequest {
                snack_type: f & 0x0F,
                lun: b.u64(8),
                itt: b.u32(16),
                ttt: b.u32(20),
                exp_stat_sn: b.u32(28),
                beg_run: b.u32(40),
                run_length: b.u32(44),
            }),
            Opcode::NopIn => Message::NopIn(NopIn {
                lun: b.u64(8),
                itt: b.u32(16),
                ttt: b.u32(20),
                stat_sn: b.u32(24),
                exp_cmd_sn: b.u32(28),
                max_cmd_sn: b.u32(32),
            }),
            Opcode::ScsiResponse => Message::ScsiResponse(ScsiResponse {
                response: b.u8(2),
                status: b.u8(3),
                itt: b.u32(16),
                stat_sn: b.u32(24),
                exp_cmd_sn: b.u32(28),
                max_cmd_sn: b.u32(32),
                exp_data_sn: b.u32(36),
                residual: Residual::parse(f, b.u32(44)),
            }),
            Opcode::TaskMgmtResponse => Message::TaskMgmtResponse(TaskMgmtResponse {
                response: b.u8(2),
                itt: b.u32(16),
                stat_sn: b.u32(24),
                exp_cmd_sn: b.u32(28),
                max_cmd_sn: b.u32(32),
            }),
            Opcode::LoginResponse => Message::LoginResponse(LoginResponse {
                transit: fin,
                continue_: f & 0x40 != 0,
                csg: (f >> 2) & 3,
                nsg: f & 3,
                version_max: b.u8(2),
                version_active: b.u8(3),
                isid: isid(b),
                tsih: b.u16(14),
                itt: b.u32(16),
                stat_sn: b.u32(24),
                exp_cmd_sn: b.u32(28),
                max_cmd_sn: b.u32(32),
                status_class: b.u8(36),
                status_detail: b.u8(37),
            }),
            Opcode::TextResponse => Message::TextResponse(TextResponse {
                final_: fin,
                continue_: f & 0x40 != 0,
                lun: b.u64(8),
                itt: b.u32(16),
                ttt: b.u32(20),
                stat_sn: b.u32(24),
                exp_cmd_sn: b.u32(28),
                max_cmd_sn: b.u32(32),
            }),
            Opcode::DataIn => {
                let has_status = f & 0x01 != 0;
                Message::DataIn(DataIn {
                    final_: fin,
                    ack: f & 0x40 != 0,
                    has_status,
                    status: b.u8(3),
                    lun: b.u64(8),
                    itt: b.u32(16),
                    ttt: b.u32(20),
                    stat_sn: b.u32(24),
                    exp_cmd_sn: b.u32(28),
                    max_cmd_sn: b.u32(32),
                    data_sn: b.u32(36),
                    buffer_offset: b.u32(40),
                    residual: if has_status { Residual::parse(f, b.u32(44)) } else { Residual::None },
                })
            }
            Opcode::LogoutResponse => Message::LogoutResponse(LogoutResponse {
                response: b.u8(2),
                itt: b.u32(16),
                stat_sn: b.u32(24),
                exp_cmd_sn: b.u32(28),
                max_cmd_sn: b.u32(32),
                time2wait: b.u16(40),
                time2retain: b.u16(42),
            }),
            Opcode::R2t => Message::R2t(R2t {
                lun: b.u64(8),
                itt: b.u32(16),
                ttt: b.u32(20),
                stat_sn: b.u32(24),
                exp_cmd_sn: b.u32(28),
                max_cmd_sn: b.u32(32),
                r2t_sn: b.u32(36),
                buffer_offset: b.u32(40),
                desired_length: b.u32(44),
            }),
            Opcode::AsyncMessage => Message::AsyncMessage(AsyncMessage {
                lun: b.u64(8),
                stat_sn: b.u32(24),
                exp_cmd_sn: b.u32(28),
                max_cmd_sn: b.u32(32),
                event: b.u8(36),
                vcode: b.u8(37),
                parameter1: b.u16(38),
                parameter2: b.u16(40),
                parameter3: b.u16(42),
            }),
            Opcode::Reject => Message::Reject(Reject {
                reason: b.u8(2),
                stat_sn: b.u32(24),
                exp_cmd_sn: b.u32(28),
                max_cmd_sn: b.u32(32),
                data_sn: b.u32(36),
            }),
        })
    }

    /// The header for this message; the data segment length is filled in
    /// when the PDU is encoded.
    pub fn encode(&self) -> Bhs {
        use Message as M;
        match self {
            M::NopOut(m) => {
                let mut b = base(Opcode::NopOut, m.immediate, 0x80);
                b.set_u64(8, m.lun);
                b.set_u32(16, m.itt);
                b.set_u32(20, m.ttt);
                b.set_u32(24, m.cmd_sn);
                b.set_u32(28, m.exp_stat_sn);
                b
            }
            M::ScsiCommand(m) => {
                let f = (m.final_ as u8) << 7 | (m.read as u8) << 6 | (m.write as u8) << 5 | (m.attr & 7);
                let mut b = base(Opcode::ScsiCommand, m.immediate, f);
                b.set_u64(8, m.lun);
                b.set_u32(16, m.itt);
                b.set_u32(20, m.edtl);
                b.set_u32(24, m.cmd_sn);
                b.set_u32(28, m.exp_stat_sn);
                b.0[32..48].copy_from_slice(&m.cdb);
                b
            }
            M::TaskMgmtRequest(m) => {
                let mut b = base(Opcode::TaskMgmtRequest, m.immediate, 0x80 | (m.function & 0x7F));
                b.set_u64(8, m.lun);
                b.set_u32(16, m.itt);
                b.set_u32(20, m.referenced_task_tag);
                b.set_u32(24, m.cmd_sn);
                b.set_u32(28, m.exp_stat_sn);
                b.set_u32(32, m.ref_cmd_sn);
                b.set_u32(36, m.exp_data_sn);
                b
            }
            M::LoginRequest(m) => {
                let f = (m.transit as u8) << 7 | (m.continue_ as u8) << 6 | (m.csg & 3) << 2 | (m.nsg & 3);
                let mut b = base(Opcode::LoginRequest, true, f);
                b.set_u8(2, m.version_max);
                b.set_u8(3, m.version_min);
                b.0[8..14].copy_from_slice(&m.isid);
                b.set_u16(14, m.tsih);
                b.set_u32(16, m.itt);
                b.set_u16(20, m.cid);
                b.set_u32(24, m.cmd_sn);
                b.set_u32(28, m.exp_stat_sn);
                b
            }
            M::TextRequest(m) => {
                let f = (m.final_ as u8) << 7 | (m.continue_ as u8) << 6;
                let mut b = base(Opcode::TextRequest, m.immediate, f);
                b.set_u64(8, m.lun);
                b.set_u32(16, m.itt);
                b.set_u32(20, m.ttt);
                b.set_u32(24, m.cmd_sn);
                b.set_u32(28, m.exp_stat_sn);
                b
            }
            M::DataOut(m) => {
                let mut b = base(Opcode::DataOut, false, (m.final_ as u8) << 7);
                b.set_u64(8, m.lun);
                b.set_u32(16, m.itt);
                b.set_u32(20, m.ttt);
                b.set_u32(28, m.exp_stat_sn);
                b.set_u32(36, m.data_sn);
                b.set_u32(40, m.buffer_offset);
                b
            }
            M::LogoutRequest(m) => {
                let mut b = base(Opcode::LogoutRequest, m.immediate, 0x80 | (m.reason & 0x7F));
                b.set_u32(16, m.itt);
                b.set_u16(20, m.cid);
                b.set_u32(24, m.cmd_sn);
                b.set_u32(28, m.exp_stat_sn);
                b
            }
            M::SnackRequest(m) => {
                let mut b = base(Opcode::SnackRequest, false, 0x80 | (m.snack_type & 0x0F));
                b.set_u64(8, m.lun);
                b.set_u32(16, m.itt);
                b.set_u32(20, m.ttt);
                b.set_u32(28, m.exp_stat_sn);
                b.set_u32(40, m.beg_run);
                b.set_u32(44, m.run_length);
                b
            }
            M::NopIn(m) => {
                let mut b = base(Opcode::NopIn, false, 0x80);
                b.set_u64(8, m.lun);
                b.set_u32(16, m.itt);
                b.set_u32(20, m.ttt);
                b.set_u32(24, m.stat_sn);
                b.set_u32(28, m.exp_cmd_sn);
                b.set_u32(32, m.max_cmd_sn);
                b
            }
            M::ScsiResponse(m) => {
                let mut b = base(Opcode::ScsiResponse, false, 0x80 | m.residual.flags());
                b.set_u8(2, m.response);
                b.set_u8(3, m.status);
                b.set_u32(16, m.itt);
                b.set_u32(24, m.stat_sn);
                b.set_u32(28, m.exp_cmd_sn);
                b.set_u32(32, m.max_cmd_sn);
                b.set_u32(36, m.exp_data_sn);
                b.set_u32(44, m.residual.count());
                b
            }
            M::TaskMgmtResponse(m) => {
                let mut b = base(Opcode::TaskMgmtResponse, false, 0x80);
                b.set_u8(2, m.response);
                b.set_u32(16, m.itt);
                b.set_u32(24, m.stat_sn);
                b.set_u32(28, m.exp_cmd_sn);
                b.set_u32(32, m.max_cmd_sn);
                b
            }
            M::LoginResponse(m) => {
                let f = (m.transit as u8) << 7 | (m.continue_ as u8) << 6 | (m.csg & 3) << 2 | (m.nsg & 3);
                let mut b = base(Opcode::LoginResponse, false, f);
                b.set_u8(2, m.version_max);
                b.set_u8(3, m.version_active);
                b.0[8..14].copy_from_slice(&m.isid);
                b.set_u16(14, m.tsih);
                b.set_u32(16, m.itt);
                b.set_u32(24, m.stat_sn);
                b.set_u32(28, m.exp_cmd_sn);
                b.set_u32(32, m.max_cmd_sn);
                b.set_u8(36, m.status_class);
                b.set_u8(37, m.status_detail);
                b
            }
            M::TextResponse(m) => {
                let f = (m.final_ as u8) << 7 | (m.continue_ as u8) << 6;
                let mut b = base(Opcode::TextResponse, false, f);
                b.set_u64(8, m.lun);
                b.set_u32(16, m.itt);
                b.set_u32(20, m.ttt);
                b.set_u32(24, m.stat_sn);
                b.set_u32(28, m.exp_cmd_sn);
                b.set_u32(32, m.max_cmd_sn);
                b
            }
            M::DataIn(m) => {
                let mut f = (m.final_ as u8) << 7 | (m.ack as u8) << 6;
                if m.has_status {
                    f |= 0x01 | m.residual.flags();
                }
                let mut b = base(Opcode::DataIn, false, f);
                if m.has_status {
                    b.set_u8(3, m.status);
                    b.set_u32(44, m.residual.count());
                }
                b.set_u64(8, m.lun);
                b.set_u32(16, m.itt);
                b.set_u32(20, m.ttt);
                b.set_u32(24, m.stat_sn);
                b.set_u32(28, m.exp_cmd_sn);
                b.set_u32(32, m.max_cmd_sn);
                b.set_u32(36, m.data_sn);
                b.set_u32(40, m.buffer_offset);
                b
            }
            M::LogoutResponse(m) => {
                let mut b = base(Opcode::LogoutResponse, false, 0x80);
                b.set_u8(2, m.response);
                b.set_u32(16, m.itt);
                b.set_u32(24, m.stat_sn);
                b.set_u32(28, m.exp_cmd_sn);
                b.set_u32(32, m.max_cmd_sn);
                b.set_u16(40, m.time2wait);
                b.set_u16(42, m.time2retain);
                b
            }
            M::R2t(m) => {
                let mut b = base(Opcode::R2t, false, 0x80);
                b.set_u64(8, m.lun);
                b.set_u32(16, m.itt);
                b.set_u32(20, m.ttt);
                b.set_u32(24, m.stat_sn);
                b.set_u32(28, m.exp_cmd_sn);
                b.set_u32(32, m.max_cmd_sn);
                b.set_u32(36, m.r2t_sn);
                b.set_u32(40, m.buffer_offset);
                b.set_u32(44, m.desired_length);
                b
            }
            M::AsyncMessage(m) => {
                let mut b = base(Opcode::AsyncMessage, false, 0x80);
                b.set_u64(8, m.lun);
                b.set_u32(16, crate::pdu::RESERVED_TAG);
                b.set_u32(24, m.stat_sn);
                b.set_u32(28, m.exp_cmd_sn);
                b.set_u32(32, m.max_cmd_sn);
                b.set_u8(36, m.event);
                b.set_u8(37, m.vcode);
                b.set_u16(38, m.parameter1);
                b.set_u16(40, m.parameter2);
                b.set_u16(42, m.parameter3);
                b
            }
            M::Reject(m) => {
                let mut b = base(Opcode::Reject, false, 0x80);
                b.set_u8(2, m.reason);
                b.set_u32(16, crate::pdu::RESERVED_TAG);
                b.set_u32(24, m.stat_sn);
                b.set_u32(28, m.exp_cmd_sn);
                b.set_u32(32, m.max_cmd_sn);
                b.set_u32(36, m.data_sn);
                b
            }
        }
    }
}
