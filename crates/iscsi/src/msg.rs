//! Typed views of every iSCSI PDU's header (RFC 7143 section 11). Each type
//! converts to and from a [`Bhs`]; data segments stay in [`crate::Pdu`].

use crate::pdu::field::*;
use crate::pdu::{Bhs, Opcode, PduError};
use num_enum::TryFromPrimitive;

/// ISID: initiator part of the session identifier (6 bytes).
pub type Isid = [u8; 6];

/// A header with the opcode, the I bit and the F bit (or T bit) set.
fn base(op: Opcode, immediate: bool, final_: bool) -> Bhs {
    let mut b = Bhs::default();
    b.set_bits(OPCODE, op as u8);
    b.set_flag(IMMEDIATE, immediate);
    b.set_flag(FINAL, final_);
    b
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
    /// The O/U flags and residual count of a SCSI Response or a Data-In
    /// with status.
    fn read(b: &Bhs) -> Residual {
        let count = b.get(RESIDUAL_COUNT);
        if b.flag(RESIDUAL_OVERFLOW) {
            Residual::Overflow(count)
        } else if b.flag(RESIDUAL_UNDERFLOW) {
            Residual::Underflow(count)
        } else {
            Residual::None
        }
    }
    fn write(self, b: &mut Bhs) {
        let (o, u, count) = match self {
            Residual::None => (false, false, 0),
            Residual::Overflow(n) => (true, false, n),
            Residual::Underflow(n) => (false, true, n),
        };
        b.set_flag(RESIDUAL_OVERFLOW, o);
        b.set_flag(RESIDUAL_UNDERFLOW, u);
        b.set(RESIDUAL_COUNT, count);
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, TryFromPrimitive)]
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
        Ok(match b.opcode()? {
            Opcode::NopOut => Message::NopOut(NopOut::read(b)),
            Opcode::ScsiCommand => Message::ScsiCommand(ScsiCommand::read(b)),
            Opcode::TaskMgmtRequest => Message::TaskMgmtRequest(TaskMgmtRequest::read(b)),
            Opcode::LoginRequest => Message::LoginRequest(LoginRequest::read(b)),
            Opcode::TextRequest => Message::TextRequest(TextRequest::read(b)),
            Opcode::DataOut => Message::DataOut(DataOut::read(b)),
            Opcode::LogoutRequest => Message::LogoutRequest(LogoutRequest::read(b)),
            Opcode::SnackRequest => Message::SnackRequest(SnackRequest::read(b)),
            Opcode::NopIn => Message::NopIn(NopIn::read(b)),
            Opcode::ScsiResponse => Message::ScsiResponse(ScsiResponse::read(b)),
            Opcode::TaskMgmtResponse => Message::TaskMgmtResponse(TaskMgmtResponse::read(b)),
            Opcode::LoginResponse => Message::LoginResponse(LoginResponse::read(b)),
            Opcode::TextResponse => Message::TextResponse(TextResponse::read(b)),
            Opcode::DataIn => Message::DataIn(DataIn::read(b)),
            Opcode::LogoutResponse => Message::LogoutResponse(LogoutResponse::read(b)),
            Opcode::R2t => Message::R2t(R2t::read(b)),
            Opcode::AsyncMessage => Message::AsyncMessage(AsyncMessage::read(b)),
            Opcode::Reject => Message::Reject(Reject::read(b)),
        })
    }

    /// The header for this message; the data segment length is filled in
    /// when the PDU is encoded.
    pub fn encode(&self) -> Bhs {
        match self {
            Message::NopOut(m) => m.write(),
            Message::ScsiCommand(m) => m.write(),
            Message::TaskMgmtRequest(m) => m.write(),
            Message::LoginRequest(m) => m.write(),
            Message::TextRequest(m) => m.write(),
            Message::DataOut(m) => m.write(),
            Message::LogoutRequest(m) => m.write(),
            Message::SnackRequest(m) => m.write(),
            Message::NopIn(m) => m.write(),
            Message::ScsiResponse(m) => m.write(),
            Message::TaskMgmtResponse(m) => m.write(),
            Message::LoginResponse(m) => m.write(),
            Message::TextResponse(m) => m.write(),
            Message::DataIn(m) => m.write(),
            Message::LogoutResponse(m) => m.write(),
            Message::R2t(m) => m.write(),
            Message::AsyncMessage(m) => m.write(),
            Message::Reject(m) => m.write(),
        }
    }
}

/// One message type's fields in the BHS: reading them and writing them
/// side by side, so a field read at one offset is written at the same.
trait Header: Sized {
    fn read(b: &Bhs) -> Self;
    fn write(&self) -> Bhs;
}

/// A field of the BHS of any shape (bytes, bits, a flag), read and written
/// the same way, so that [`header!`] can take one list of them.
trait HeaderField: Copy {
    type Value;
    fn read(self, b: &Bhs) -> Self::Value;
    fn write(self, b: &mut Bhs, v: Self::Value);
}

impl<C: bw_wire::Codec> HeaderField for bw_wire::Field<C> {
    type Value = C::Value;
    fn read(self, b: &Bhs) -> C::Value {
        b.get(self)
    }
    fn write(self, b: &mut Bhs, v: C::Value) {
        b.set(self, v)
    }
}

impl HeaderField for bw_wire::Bits {
    type Value = u8;
    fn read(self, b: &Bhs) -> u8 {
        b.bits(self)
    }
    fn write(self, b: &mut Bhs, v: u8) {
        b.set_bits(self, v)
    }
}

impl HeaderField for bw_wire::Flag {
    type Value = bool;
    fn read(self, b: &Bhs) -> bool {
        b.flag(self)
    }
    fn write(self, b: &mut Bhs, v: bool) {
        b.set_flag(self, v)
    }
}

/// [`Header`] for a message type from one list of its fields, each with the
/// BHS field it lives in: the list drives both directions, so a field cannot
/// be read at one place and written at another. `i` and `f` are the I and F
/// bits `base` writes (a field in the list that lives there overrides them);
/// `fixed` fields are written with a constant and not read (RFC 7143 gives
/// them one value in this message).
macro_rules! header {
    ($ty:ident, i: $i:expr, f: $f:expr, { $($name:ident: $def:ident),* $(,)? }
     $(fixed { $($fdef:ident: $fval:expr),* $(,)? })?) => {
        impl Header for $ty {
            fn read(b: &Bhs) -> $ty {
                $ty { $($name: HeaderField::read($def, b)),* }
            }
            fn write(&self) -> Bhs {
                let mut b = base(Opcode::$ty, $i, $f);
                $(HeaderField::write($def, &mut b, self.$name);)*
                $($(HeaderField::write($fdef, &mut b, $fval);)*)?
                b
            }
        }
    };
}

header! { NopOut, i: false, f: true, {
    immediate: IMMEDIATE,
    lun: LUN,
    itt: ITT,
    ttt: TTT,
    cmd_sn: CMD_SN,
    exp_stat_sn: EXP_STAT_SN,
} }

header! { ScsiCommand, i: false, f: true, {
    immediate: IMMEDIATE,
    final_: FINAL,
    read: READ,
    write: WRITE,
    attr: ATTR,
    lun: LUN,
    itt: ITT,
    edtl: EDTL,
    cmd_sn: CMD_SN,
    exp_stat_sn: EXP_STAT_SN,
    cdb: CDB,
} }

header! { TaskMgmtRequest, i: false, f: true, {
    immediate: IMMEDIATE,
    function: TMF_FUNCTION,
    lun: LUN,
    itt: ITT,
    referenced_task_tag: REFERENCED_TASK_TAG,
    cmd_sn: CMD_SN,
    exp_stat_sn: EXP_STAT_SN,
    ref_cmd_sn: REF_CMD_SN,
    exp_data_sn: EXP_DATA_SN,
} }

header! { LoginRequest, i: true, f: true, {
    transit: TRANSIT,
    continue_: CONTINUE,
    csg: CSG,
    nsg: NSG,
    version_max: VERSION_MAX,
    version_min: VERSION_MIN,
    isid: ISID,
    tsih: TSIH,
    itt: ITT,
    cid: CID,
    cmd_sn: CMD_SN,
    exp_stat_sn: EXP_STAT_SN,
} }

header! { TextRequest, i: false, f: true, {
    immediate: IMMEDIATE,
    final_: FINAL,
    continue_: CONTINUE,
    lun: LUN,
    itt: ITT,
    ttt: TTT,
    cmd_sn: CMD_SN,
    exp_stat_sn: EXP_STAT_SN,
} }

header! { DataOut, i: false, f: true, {
    final_: FINAL,
    lun: LUN,
    itt: ITT,
    ttt: TTT,
    exp_stat_sn: EXP_STAT_SN,
    data_sn: DATA_SN,
    buffer_offset: BUFFER_OFFSET,
} }

header! { LogoutRequest, i: false, f: true, {
    immediate: IMMEDIATE,
    reason: LOGOUT_REASON,
    itt: ITT,
    cid: CID,
    cmd_sn: CMD_SN,
    exp_stat_sn: EXP_STAT_SN,
} }

header! { SnackRequest, i: false, f: true, {
    snack_type: SNACK_TYPE,
    lun: LUN,
    itt: ITT,
    ttt: TTT,
    exp_stat_sn: EXP_STAT_SN,
    beg_run: BEG_RUN,
    run_length: RUN_LENGTH,
} }

header! { NopIn, i: false, f: true, {
    lun: LUN,
    itt: ITT,
    ttt: TTT,
    stat_sn: STAT_SN,
    exp_cmd_sn: EXP_CMD_SN,
    max_cmd_sn: MAX_CMD_SN,
} }

impl Header for ScsiResponse {
    fn read(b: &Bhs) -> ScsiResponse {
        ScsiResponse {
            response: b.get(RESPONSE),
            status: b.get(STATUS),
            itt: b.get(ITT),
            stat_sn: b.get(STAT_SN),
            exp_cmd_sn: b.get(EXP_CMD_SN),
            max_cmd_sn: b.get(MAX_CMD_SN),
            exp_data_sn: b.get(EXP_DATA_SN),
            residual: Residual::read(b),
        }
    }
    fn write(&self) -> Bhs {
        let mut b = base(Opcode::ScsiResponse, false, true);
        b.set(RESPONSE, self.response);
        b.set(STATUS, self.status);
        b.set(ITT, self.itt);
        b.set(STAT_SN, self.stat_sn);
        b.set(EXP_CMD_SN, self.exp_cmd_sn);
        b.set(MAX_CMD_SN, self.max_cmd_sn);
        b.set(EXP_DATA_SN, self.exp_data_sn);
        self.residual.write(&mut b);
        b
    }
}

header! { TaskMgmtResponse, i: false, f: true, {
    response: RESPONSE,
    itt: ITT,
    stat_sn: STAT_SN,
    exp_cmd_sn: EXP_CMD_SN,
    max_cmd_sn: MAX_CMD_SN,
} }

header! { LoginResponse, i: false, f: true, {
    transit: TRANSIT,
    continue_: CONTINUE,
    csg: CSG,
    nsg: NSG,
    version_max: VERSION_MAX,
    version_active: VERSION_ACTIVE,
    isid: ISID,
    tsih: TSIH,
    itt: ITT,
    stat_sn: STAT_SN,
    exp_cmd_sn: EXP_CMD_SN,
    max_cmd_sn: MAX_CMD_SN,
    status_class: STATUS_CLASS,
    status_detail: STATUS_DETAIL,
} }

header! { TextResponse, i: false, f: true, {
    final_: FINAL,
    continue_: CONTINUE,
    lun: LUN,
    itt: ITT,
    ttt: TTT,
    stat_sn: STAT_SN,
    exp_cmd_sn: EXP_CMD_SN,
    max_cmd_sn: MAX_CMD_SN,
} }

impl DataIn {
    /// A BHS already known to be a Data-In's, read without going through
    /// [`Message`] (the initiator's per-read path).
    pub fn from_bhs(b: &Bhs) -> DataIn {
        <DataIn as Header>::read(b)
    }
}

impl Header for DataIn {
    fn read(b: &Bhs) -> DataIn {
        let has_status = b.flag(STATUS_PRESENT);
        DataIn {
            final_: b.flag(FINAL),
            ack: b.flag(ACKNOWLEDGE),
            has_status,
            // Reserved unless the S bit is set (RFC 7143 11.7.4).
            status: if has_status { b.get(STATUS) } else { 0 },
            lun: b.get(LUN),
            itt: b.get(ITT),
            ttt: b.get(TTT),
            stat_sn: b.get(STAT_SN),
            exp_cmd_sn: b.get(EXP_CMD_SN),
            max_cmd_sn: b.get(MAX_CMD_SN),
            data_sn: b.get(DATA_SN),
            buffer_offset: b.get(BUFFER_OFFSET),
            residual: if has_status { Residual::read(b) } else { Residual::None },
        }
    }
    fn write(&self) -> Bhs {
        let mut b = base(Opcode::DataIn, false, self.final_);
        b.set_flag(ACKNOWLEDGE, self.ack);
        if self.has_status {
            b.set_flag(STATUS_PRESENT, true);
            b.set(STATUS, self.status);
            self.residual.write(&mut b);
        }
        b.set(LUN, self.lun);
        b.set(ITT, self.itt);
        b.set(TTT, self.ttt);
        b.set(STAT_SN, self.stat_sn);
        b.set(EXP_CMD_SN, self.exp_cmd_sn);
        b.set(MAX_CMD_SN, self.max_cmd_sn);
        b.set(DATA_SN, self.data_sn);
        b.set(BUFFER_OFFSET, self.buffer_offset);
        b
    }
}

header! { LogoutResponse, i: false, f: true, {
    response: RESPONSE,
    itt: ITT,
    stat_sn: STAT_SN,
    exp_cmd_sn: EXP_CMD_SN,
    max_cmd_sn: MAX_CMD_SN,
    time2wait: TIME2WAIT,
    time2retain: TIME2RETAIN,
} }

header! { R2t, i: false, f: true, {
    lun: LUN,
    itt: ITT,
    ttt: TTT,
    stat_sn: STAT_SN,
    exp_cmd_sn: EXP_CMD_SN,
    max_cmd_sn: MAX_CMD_SN,
    r2t_sn: R2T_SN,
    buffer_offset: BUFFER_OFFSET,
    desired_length: DESIRED_LENGTH,
} }

header! { AsyncMessage, i: false, f: true, {
    lun: LUN,
    stat_sn: STAT_SN,
    exp_cmd_sn: EXP_CMD_SN,
    max_cmd_sn: MAX_CMD_SN,
    event: ASYNC_EVENT,
    vcode: ASYNC_VCODE,
    parameter1: PARAMETER1,
    parameter2: PARAMETER2,
    parameter3: PARAMETER3,
} fixed { ITT: crate::pdu::RESERVED_TAG } }

header! { Reject, i: false, f: true, {
    reason: REJECT_REASON,
    stat_sn: STAT_SN,
    exp_cmd_sn: EXP_CMD_SN,
    max_cmd_sn: MAX_CMD_SN,
    data_sn: DATA_SN,
} fixed { ITT: crate::pdu::RESERVED_TAG } }
