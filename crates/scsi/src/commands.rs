//! The command table, as tgt's `sbc.c` has one: one row per supported
//! (operation code, service action) saying everything the rest of the
//! target, and the transports, need to know about a command.
//!
//! Adding a command is one row in [`COMMANDS`] and one handler function;
//! everything else reads the row: the dispatcher ([`Handler`], and
//! [`Handler::AnyLun`] for the commands that answer for an unmapped LUN),
//! REPORT SUPPORTED OPERATION CODES and its usage data (`opcodes.rs`),
//! reservation conflicts ([`Conflict`]), ALUA access ([`AluaAccess`]), the
//! data-out a transport solicits and whether an excess is an error
//! ([`Transfer`], through [`crate::Plan`]), where the transport runs it
//! ([`Execution`]), the plain READs a transport may move itself
//! ([`Command::reads_medium`]) and the allocation-length truncation
//! ([`Transfer::In`], applied once by the dispatcher).
//!
//! The CDB length is the usage data's length; the unit tests check it
//! against the group code, and that the table is sorted and unique.

use crate::block_io::{self, BLOCK};
use crate::cdb::{cdb_len, field, op};
use crate::sense::Sense;
use crate::{alua, inquiry, log, mode, opcodes, Fail, Lun, ScsiTarget};
// A row's reservation and ALUA classes, defined where they are checked.
pub use crate::alua::AluaAccess;
pub use crate::reservation::Conflict;

/// How to find a byte count in a CDB.
#[derive(Debug, Clone, Copy)]
pub enum Len {
    /// The transfer length in logical blocks (READ/WRITE/VERIFY layouts of
    /// every group), times the block size.
    Blocks,
    /// One logical block.
    OneBlock,
    /// A constant number of bytes.
    Fixed(usize),
    /// The byte at this offset.
    Byte(usize),
    /// The big-endian 16-bit field at this offset.
    Be16(usize),
    /// The big-endian 32-bit field at this offset.
    Be32(usize),
    /// Something only a function can tell (`None`: no data).
    Other(fn(&[u8]) -> Option<usize>),
}

impl Len {
    /// The byte count `cdb` asks for (the CDB is at least as long as the
    /// row's; see [`Command::cdb_len`]).
    pub fn of(self, cdb: &[u8]) -> Option<usize> {
        Some(match self {
            Len::Blocks => (block_io::lba_and_len(cdb).1 as usize).saturating_mul(BLOCK),
            Len::OneBlock => BLOCK,
            Len::Fixed(n) => n,
            Len::Byte(at) => *cdb.get(at)? as usize,
            Len::Be16(at) => u16::from_be_bytes([*cdb.get(at)?, *cdb.get(at + 1)?]) as usize,
            Len::Be32(at) => u32::from_be_bytes(cdb.get(at..at + 4)?.try_into().ok()?) as usize,
            Len::Other(f) => return f(cdb),
        })
    }
}

/// Data direction and amount.
#[derive(Debug, Clone, Copy)]
pub enum Transfer {
    None,
    /// Data-in of at most this many bytes (the allocation length): the
    /// answer is cut to it.
    In(Len),
    /// Data-out of this many bytes; a transport that sends more has the
    /// excess cut off (and reports an overflow residual).
    Out(Len),
    /// Data-out of this many bytes where more is an invalid request rather
    /// than something to cut (WRITE SAME, COMPARE AND WRITE).
    OutNoExcess(Len),
}

impl Transfer {
    /// The data-out byte count `cdb` asks for; `None` if it sends none.
    pub fn data_out(self, cdb: &[u8]) -> Option<usize> {
        match self {
            Transfer::Out(l) | Transfer::OutNoExcess(l) => l.of(cdb),
            _ => None,
        }
    }
}

/// Where a transport should run the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Execution {
    /// Never waits for the backend (state and identification): run it on
    /// the connection's thread.
    Inline,
    /// Moves data through the backend's page cache: inline while small,
    /// on a blocking pool when large.
    InlineIfSmall,
    /// May wait for the device (flush, verify, unmap, ...): blocking pool.
    Pool,
}

/// The arguments every handler gets.
pub(crate) struct Call<'a> {
    pub target: &'a ScsiTarget,
    pub nexus: crate::NexusId,
    pub cdb: &'a [u8],
    /// The data-out, in the pieces the transport received it in.
    pub data_out: &'a [&'a [u8]],
}

impl Call<'_> {
    /// The initiator port this nexus stands for.
    pub fn who(&self) -> u64 {
        self.target.identity(self.nexus)
    }

    /// The data-out in one buffer (copied only if it came in pieces).
    pub fn joined(&self) -> std::borrow::Cow<'_, [u8]> {
        match self.data_out {
            [] => (&[][..]).into(),
            [one] => (*one).into(),
            many => many.concat().into(),
        }
    }
}

type DataIn<'a> = &'a mut Vec<u8>;

/// What runs a command.
#[derive(Clone, Copy)]
pub(crate) enum Handler {
    /// Needs a mapped LUN.
    Lun(fn(&Call<'_>, &Lun, DataIn<'_>) -> Result<(), Fail>),
    /// Also answers for a LUN that is not mapped (INQUIRY, REPORT LUNS,
    /// REQUEST SENSE: SPC-4 requires them to work there), and handles unit
    /// attentions itself.
    AnyLun(fn(&Call<'_>, Option<&Lun>, DataIn<'_>) -> Result<(), Fail>),
}

/// One supported command.
pub struct Command {
    pub opcode: u8,
    /// For opcodes that carry one (CDB byte 1, bits 4..0).
    pub service_action: Option<u8>,
    pub name: &'static str,
    /// The CDB usage data REPORT SUPPORTED OPERATION CODES returns: which
    /// bits of each CDB byte this target looks at (the control byte's NACA
    /// and LINK are checked, and refused, hence 0x05). Its length is the
    /// CDB length.
    pub usage: &'static [u8],
    pub transfer: Transfer,
    pub conflict: Conflict,
    pub alua: AluaAccess,
    pub execution: Execution,
    pub(crate) handler: Handler,
}

impl Command {
    pub fn cdb_len(&self) -> usize {
        self.usage.len()
    }

    /// A plain READ of the medium (the zero-copy candidates).
    pub fn reads_medium(&self) -> bool {
        matches!(self.transfer, Transfer::In(Len::Blocks))
    }

    /// Whether the handler deals with unit attentions itself (and runs
    /// for LUNs that are not mapped).
    pub(crate) fn any_lun(&self) -> bool {
        matches!(self.handler, Handler::AnyLun(_))
    }
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Command")
            .field("opcode", &self.opcode)
            .field("service_action", &self.service_action)
            .field("name", &self.name)
            .finish()
    }
}

// Row builders, so each row reads as one line of the table.
#[allow(clippy::too_many_arguments)]
const fn cmd(
    opcode: u8,
    name: &'static str,
    usage: &'static [u8],
    transfer: Transfer,
    conflict: Conflict,
    alua: AluaAccess,
    execution: Execution,
    handler: Handler,
) -> Command {
    Command {
        opcode,
        service_action: None,
        name,
        usage,
        transfer,
        conflict,
        alua,
        execution,
        handler,
    }
}
/// [`cmd`] for an opcode with service actions.
#[allow(clippy::too_many_arguments)]
const fn sa_cmd(
    opcode: u8,
    sa: u8,
    name: &'static str,
    usage: &'static [u8],
    transfer: Transfer,
    conflict: Conflict,
    alua: AluaAccess,
    execution: Execution,
    handler: Handler,
) -> Command {
    Command {
        service_action: Some(sa),
        ..cmd(
            opcode, name, usage, transfer, conflict, alua, execution, handler,
        )
    }
}

use AluaAccess::{ActiveOnly, Always, UpToStandby};
use Conflict::{Never, Own, Read, Write};
use Execution::{Inline, InlineIfSmall, Pool};
use Handler::{AnyLun, Lun as OnLun};
use Transfer::{In, None as NoData, Out, OutNoExcess};

/// Every supported command, in ascending (opcode, service action) order
/// (the order REPORT SUPPORTED OPERATION CODES lists them in).
pub static COMMANDS: &[Command] = TABLE;

#[rustfmt::skip]
const TABLE: &[Command] = &[
    cmd(op::TEST_UNIT_READY, "TEST UNIT READY", &[0x00, 0, 0, 0, 0, 0x05], NoData, Read, ActiveOnly, Inline, OnLun(test_unit_ready)),
    cmd(op::REQUEST_SENSE, "REQUEST SENSE", &[0x03, 0x01, 0, 0, 0xff, 0x05], In(Len::Byte(4)), Never, Always, Inline, AnyLun(request_sense)),
    cmd(op::READ_6, "READ(6)", &[0x08, 0x1f, 0xff, 0xff, 0xff, 0x05], In(Len::Blocks), Read, ActiveOnly, InlineIfSmall, OnLun(read)),
    cmd(op::WRITE_6, "WRITE(6)", &[0x0a, 0x1f, 0xff, 0xff, 0xff, 0x05], Out(Len::Blocks), Write, ActiveOnly, InlineIfSmall, OnLun(write)),
    cmd(op::INQUIRY, "INQUIRY", &[0x12, 0x01, 0xff, 0xff, 0xff, 0x05], In(Len::Be16(3)), Never, Always, Inline, AnyLun(inquiry)),
    cmd(op::MODE_SELECT_6, "MODE SELECT(6)", &[0x15, 0x11, 0, 0, 0xff, 0x05], Out(Len::Byte(4)), Write, Always, Inline, OnLun(mode_select)),
    cmd(op::RESERVE_6, "RESERVE(6)", &[0x16, 0, 0, 0, 0, 0x05], NoData, Own, ActiveOnly, Pool, OnLun(reserve_6)),
    cmd(op::RELEASE_6, "RELEASE(6)", &[0x17, 0, 0, 0, 0, 0x05], NoData, Own, ActiveOnly, Inline, OnLun(release_6)),
    cmd(op::MODE_SENSE_6, "MODE SENSE(6)", &[0x1a, 0x08, 0xff, 0xff, 0xff, 0x05], In(Len::Byte(4)), Read, Always, Inline, OnLun(mode_sense)),
    cmd(op::START_STOP_UNIT, "START STOP UNIT", &[0x1b, 0x01, 0, 0x0f, 0xf7, 0x05], NoData, Write, ActiveOnly, Inline, OnLun(start_stop_unit)),
    cmd(op::PREVENT_ALLOW, "PREVENT ALLOW MEDIUM REMOVAL", &[0x1e, 0, 0, 0, 0x03, 0x05], NoData, Conflict::ByCdb(prevent_conflict), ActiveOnly, Inline, OnLun(prevent_allow)),
    cmd(op::READ_CAPACITY_10, "READ CAPACITY(10)", &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0x05], In(Len::Fixed(8)), Never, ActiveOnly, Inline, OnLun(read_capacity_10)),
    cmd(op::READ_10, "READ(10)", &[0x28, 0x18, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0x05], In(Len::Blocks), Read, ActiveOnly, InlineIfSmall, OnLun(read)),
    cmd(op::WRITE_10, "WRITE(10)", &[0x2a, 0x18, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0x05], Out(Len::Blocks), Write, ActiveOnly, InlineIfSmall, OnLun(write)),
    cmd(op::WRITE_VERIFY_10, "WRITE AND VERIFY(10)", &[0x2e, 0x12, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0x05], Out(Len::Blocks), Write, ActiveOnly, Pool, OnLun(write_and_verify)),
    cmd(op::VERIFY_10, "VERIFY(10)", &[0x2f, 0x16, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0x05], Out(Len::Other(verify_data_len)), Read, ActiveOnly, Pool, OnLun(verify)),
    cmd(op::PRE_FETCH_10, "PRE-FETCH(10)", &[0x34, 0x02, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0x05], NoData, Read, ActiveOnly, Inline, OnLun(pre_fetch)),
    cmd(op::SYNC_CACHE_10, "SYNCHRONIZE CACHE(10)", &[0x35, 0x02, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0x05], NoData, Write, ActiveOnly, Pool, OnLun(synchronize_cache)),
    cmd(op::WRITE_SAME_10, "WRITE SAME(10)", &[0x41, 0x08, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0x05], OutNoExcess(Len::OneBlock), Write, ActiveOnly, Pool, OnLun(write_same)),
    cmd(op::UNMAP, "UNMAP", &[0x42, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0x05], Out(Len::Be16(7)), Write, ActiveOnly, Pool, OnLun(unmap)),
    cmd(op::LOG_SENSE, "LOG SENSE", &[0x4d, 0x01, 0xff, 0xff, 0, 0xff, 0xff, 0xff, 0xff, 0x05], In(Len::Be16(7)), Write, Always, Inline, OnLun(log_sense)),
    cmd(op::MODE_SELECT_10, "MODE SELECT(10)", &[0x55, 0x11, 0, 0, 0, 0, 0, 0xff, 0xff, 0x05], Out(Len::Be16(7)), Write, Always, Inline, OnLun(mode_select)),
    cmd(op::MODE_SENSE_10, "MODE SENSE(10)", &[0x5a, 0x18, 0xff, 0xff, 0, 0, 0, 0xff, 0xff, 0x05], In(Len::Be16(7)), Read, Always, Inline, OnLun(mode_sense)),
    sa_cmd(op::PR_IN, 0x00, "PERSISTENT RESERVE IN / READ KEYS", &[0x5e, 0x00, 0, 0, 0, 0, 0, 0xff, 0xff, 0x05], In(Len::Be16(7)), Own, UpToStandby, Pool, OnLun(pr_in)),
    sa_cmd(op::PR_IN, 0x01, "PERSISTENT RESERVE IN / READ RESERVATION", &[0x5e, 0x01, 0, 0, 0, 0, 0, 0xff, 0xff, 0x05], In(Len::Be16(7)), Own, UpToStandby, Pool, OnLun(pr_in)),
    sa_cmd(op::PR_IN, 0x02, "PERSISTENT RESERVE IN / REPORT CAPABILITIES", &[0x5e, 0x02, 0, 0, 0, 0, 0, 0xff, 0xff, 0x05], In(Len::Be16(7)), Own, UpToStandby, Pool, OnLun(pr_in)),
    sa_cmd(op::PR_IN, 0x03, "PERSISTENT RESERVE IN / READ FULL STATUS", &[0x5e, 0x03, 0, 0, 0, 0, 0, 0xff, 0xff, 0x05], In(Len::Be16(7)), Own, UpToStandby, Pool, OnLun(pr_in)),
    sa_cmd(op::PR_OUT, 0x00, "PERSISTENT RESERVE OUT / REGISTER", &[0x5f, 0x00, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x05], Out(Len::Be32(5)), Own, UpToStandby, Pool, OnLun(pr_out)),
    sa_cmd(op::PR_OUT, 0x01, "PERSISTENT RESERVE OUT / RESERVE", &[0x5f, 0x01, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x05], Out(Len::Be32(5)), Own, UpToStandby, Pool, OnLun(pr_out)),
    sa_cmd(op::PR_OUT, 0x02, "PERSISTENT RESERVE OUT / RELEASE", &[0x5f, 0x02, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x05], Out(Len::Be32(5)), Own, UpToStandby, Pool, OnLun(pr_out)),
    sa_cmd(op::PR_OUT, 0x03, "PERSISTENT RESERVE OUT / CLEAR", &[0x5f, 0x03, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x05], Out(Len::Be32(5)), Own, UpToStandby, Pool, OnLun(pr_out)),
    sa_cmd(op::PR_OUT, 0x04, "PERSISTENT RESERVE OUT / PREEMPT", &[0x5f, 0x04, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x05], Out(Len::Be32(5)), Own, UpToStandby, Pool, OnLun(pr_out)),
    sa_cmd(op::PR_OUT, 0x06, "PERSISTENT RESERVE OUT / REGISTER AND IGNORE EXISTING KEY", &[0x5f, 0x06, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x05], Out(Len::Be32(5)), Own, UpToStandby, Pool, OnLun(pr_out)),
    cmd(op::READ_16, "READ(16)", &[0x88, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x05], In(Len::Blocks), Read, ActiveOnly, InlineIfSmall, OnLun(read)),
    cmd(op::COMPARE_AND_WRITE, "COMPARE AND WRITE", &[0x89, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0xff, 0, 0x05], OutNoExcess(Len::Other(compare_and_write_len)), Write, ActiveOnly, Pool, OnLun(compare_and_write)),
    cmd(op::WRITE_16, "WRITE(16)", &[0x8a, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x05], Out(Len::Blocks), Write, ActiveOnly, InlineIfSmall, OnLun(write)),
    cmd(op::WRITE_VERIFY_16, "WRITE AND VERIFY(16)", &[0x8e, 0x12, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x05], Out(Len::Blocks), Write, ActiveOnly, Pool, OnLun(write_and_verify)),
    cmd(op::VERIFY_16, "VERIFY(16)", &[0x8f, 0x16, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x05], Out(Len::Other(verify_data_len)), Read, ActiveOnly, Pool, OnLun(verify)),
    cmd(op::PRE_FETCH_16, "PRE-FETCH(16)", &[0x90, 0x02, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x05], NoData, Read, ActiveOnly, Inline, OnLun(pre_fetch)),
    cmd(op::SYNC_CACHE_16, "SYNCHRONIZE CACHE(16)", &[0x91, 0x02, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x05], NoData, Write, ActiveOnly, Pool, OnLun(synchronize_cache)),
    cmd(op::WRITE_SAME_16, "WRITE SAME(16)", &[0x93, 0x09, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x05], OutNoExcess(Len::Other(write_same_16_len)), Write, ActiveOnly, Pool, OnLun(write_same)),
    sa_cmd(op::SERVICE_ACTION_IN_16, op::SAI_READ_CAPACITY_16, "READ CAPACITY(16)", &[0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x05], In(Len::Be32(10)), Never, ActiveOnly, Inline, OnLun(read_capacity_16)),
    sa_cmd(op::SERVICE_ACTION_IN_16, op::SAI_GET_LBA_STATUS, "GET LBA STATUS", &[0x9e, 0x12, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x07, 0x05], In(Len::Be32(10)), Write, ActiveOnly, Pool, OnLun(get_lba_status)),
    cmd(op::REPORT_LUNS, "REPORT LUNS", &[0xa0, 0, 0xff, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x05], In(Len::Be32(6)), Never, Always, Inline, AnyLun(report_luns)),
    sa_cmd(op::MAINTENANCE_IN, op::MI_REPORT_TARGET_PORT_GROUPS, "REPORT TARGET PORT GROUPS", &[0xa3, 0xea, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x05], In(Len::Be32(6)), Write, Always, Inline, OnLun(report_target_port_groups)),
    sa_cmd(op::MAINTENANCE_IN, op::MI_REPORT_SUPPORTED_OPCODES, "REPORT SUPPORTED OPERATION CODES", &[0xa3, 0x0c, 0x87, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x05], In(Len::Be32(6)), Never, Always, Inline, OnLun(report_supported_opcodes)),
    sa_cmd(op::MAINTENANCE_IN, op::MI_REPORT_SUPPORTED_TMF, "REPORT SUPPORTED TASK MANAGEMENT FUNCTIONS", &[0xa3, 0x0d, 0x80, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x05], In(Len::Be32(6)), Never, Always, Inline, OnLun(report_supported_tmf)),
    cmd(op::READ_12, "READ(12)", &[0xa8, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x05], In(Len::Blocks), Read, ActiveOnly, InlineIfSmall, OnLun(read)),
    cmd(op::WRITE_12, "WRITE(12)", &[0xaa, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x05], Out(Len::Blocks), Write, ActiveOnly, InlineIfSmall, OnLun(write)),
    cmd(op::WRITE_VERIFY_12, "WRITE AND VERIFY(12)", &[0xae, 0x12, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x05], Out(Len::Blocks), Write, ActiveOnly, Pool, OnLun(write_and_verify)),
    cmd(op::VERIFY_12, "VERIFY(12)", &[0xaf, 0x16, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x05], Out(Len::Other(verify_data_len)), Read, ActiveOnly, Pool, OnLun(verify)),
];

/// What the table says about a CDB.
#[derive(Debug, Clone, Copy)]
pub enum Lookup {
    Found(&'static Command),
    /// The opcode is supported but not with this service action: the
    /// command fails with INVALID FIELD IN CDB after the checks every
    /// command gets, with the classes of `like` (a row of the same opcode).
    UnknownServiceAction {
        like: &'static Command,
    },
    UnknownOpcode,
}

/// Index of the first row of each opcode (`u8::MAX`: none), built at
/// compile time so a lookup costs one load plus a scan of that opcode's
/// service actions.
static FIRST_ROW: [u8; 256] = {
    assert!(TABLE.len() < u8::MAX as usize);
    let mut first = [u8::MAX; 256];
    let mut i = TABLE.len();
    while i > 0 {
        i -= 1;
        first[TABLE[i].opcode as usize] = i as u8;
    }
    first
};

/// The row for `cdb` (empty CDB: unknown).
pub fn lookup(cdb: &[u8]) -> Lookup {
    let Some(&opcode) = cdb.first() else {
        return Lookup::UnknownOpcode;
    };
    let first = FIRST_ROW[opcode as usize];
    if first == u8::MAX {
        return Lookup::UnknownOpcode;
    }
    let first = &COMMANDS[first as usize];
    if first.service_action.is_none() {
        return Lookup::Found(first);
    }
    let sa = field::SERVICE_ACTION.try_get(cdb);
    match COMMANDS
        .iter()
        .skip_while(|c| c.opcode != opcode)
        .take_while(|c| c.opcode == opcode)
        .find(|c| Some(c.service_action) == Some(sa))
    {
        Some(c) => Lookup::Found(c),
        None => Lookup::UnknownServiceAction { like: first },
    }
}

/// The row for `cdb`, if the command is supported.
pub fn command(cdb: &[u8]) -> Option<&'static Command> {
    match lookup(cdb) {
        Lookup::Found(c) => Some(c),
        _ => None,
    }
}

/// Whether `opcode` is one whose commands are told apart by a service action.
pub fn has_service_actions(opcode: u8) -> bool {
    let first = FIRST_ROW[opcode as usize];
    first != u8::MAX && COMMANDS[first as usize].service_action.is_some()
}

/// The class used for an unknown service action: conservative (it
/// conflicts) unless every service action of the opcode checks itself.
pub(crate) fn unknown_service_action_conflict(opcode: u8) -> Conflict {
    if COMMANDS
        .iter()
        .filter(|c| c.opcode == opcode)
        .all(|c| matches!(c.conflict, Own))
    {
        Own
    } else {
        Write
    }
}

/// The CDB length of an opcode we do not know: from its group code.
pub(crate) fn group_cdb_len(opcode: u8) -> usize {
    cdb_len(opcode)
}

// ---- data lengths only a function can tell ----

/// VERIFY: BYTCHK 01b sends the blocks to compare, 11b one block to compare
/// against each, 00b nothing.
fn verify_data_len(cdb: &[u8]) -> Option<usize> {
    match field::BYTCHK.get(cdb) {
        0b01 => Len::Blocks.of(cdb),
        0b11 => Some(BLOCK),
        _ => None,
    }
}

/// COMPARE AND WRITE: the blocks to compare, then the blocks to write.
fn compare_and_write_len(cdb: &[u8]) -> Option<usize> {
    Some(2 * field::COMPARE_AND_WRITE_BLOCKS.get(cdb) as usize * BLOCK)
}

/// WRITE SAME(16) with NDOB sends no data.
fn write_same_16_len(cdb: &[u8]) -> Option<usize> {
    (!field::WRITE_SAME_NDOB.get(cdb)).then_some(BLOCK)
}

/// PREVENT ALLOW MEDIUM REMOVAL: allowing removal never conflicts.
fn prevent_conflict(cdb: &[u8]) -> Conflict {
    if field::PREVENT.get(cdb) == 0 {
        Never
    } else {
        Write
    }
}

// ---- handlers ----

fn test_unit_ready(_: &Call<'_>, _: &Lun, _: DataIn<'_>) -> Result<(), Fail> {
    Ok(())
}

fn request_sense(c: &Call<'_>, l: Option<&Lun>, out: DataIn<'_>) -> Result<(), Fail> {
    let pending = match l {
        Some(l) => l.ua.take(c.who()).unwrap_or(Sense::NO_SENSE),
        None => Sense::LUN_NOT_SUPPORTED,
    };
    if field::REQUEST_SENSE_DESC.get(c.cdb) {
        return Err(Sense::invalid_in_cdb(field::REQUEST_SENSE_DESC).into()); // descriptor format not supported
    }
    out.extend_from_slice(&pending.to_fixed());
    Ok(())
}

fn inquiry(c: &Call<'_>, l: Option<&Lun>, out: DataIn<'_>) -> Result<(), Fail> {
    Ok(inquiry::inquiry(l, c.cdb, out)?)
}

fn report_luns(c: &Call<'_>, _: Option<&Lun>, out: DataIn<'_>) -> Result<(), Fail> {
    Ok(c.target.report_luns(c.cdb, out)?)
}

fn read(c: &Call<'_>, l: &Lun, out: DataIn<'_>) -> Result<(), Fail> {
    Ok(l.read(c.cdb, out)?)
}

fn write(c: &Call<'_>, l: &Lun, _: DataIn<'_>) -> Result<(), Fail> {
    Ok(l.write_pieces(c.cdb, c.data_out, false)?)
}

fn write_and_verify(c: &Call<'_>, l: &Lun, _: DataIn<'_>) -> Result<(), Fail> {
    Ok(l.write_pieces(c.cdb, c.data_out, true)?)
}

fn verify(c: &Call<'_>, l: &Lun, _: DataIn<'_>) -> Result<(), Fail> {
    Ok(l.verify(c.cdb, &c.joined())?)
}

fn write_same(c: &Call<'_>, l: &Lun, _: DataIn<'_>) -> Result<(), Fail> {
    Ok(l.write_same(c.cdb, &c.joined())?)
}

fn unmap(c: &Call<'_>, l: &Lun, _: DataIn<'_>) -> Result<(), Fail> {
    Ok(l.unmap(c.cdb, &c.joined())?)
}

fn compare_and_write(c: &Call<'_>, l: &Lun, _: DataIn<'_>) -> Result<(), Fail> {
    Ok(l.compare_and_write(c.cdb, &c.joined())?)
}

fn pre_fetch(c: &Call<'_>, l: &Lun, _: DataIn<'_>) -> Result<(), Fail> {
    Ok(l.pre_fetch(c.cdb)?)
}

fn synchronize_cache(c: &Call<'_>, l: &Lun, _: DataIn<'_>) -> Result<(), Fail> {
    Ok(l.synchronize_cache(c.cdb)?)
}

fn read_capacity_10(c: &Call<'_>, l: &Lun, out: DataIn<'_>) -> Result<(), Fail> {
    Ok(l.read_capacity_10(c.cdb, out)?)
}

fn read_capacity_16(c: &Call<'_>, l: &Lun, out: DataIn<'_>) -> Result<(), Fail> {
    Ok(l.read_capacity_16(c.cdb, out)?)
}

fn get_lba_status(c: &Call<'_>, l: &Lun, out: DataIn<'_>) -> Result<(), Fail> {
    Ok(l.get_lba_status(c.cdb, out)?)
}

fn log_sense(c: &Call<'_>, _: &Lun, out: DataIn<'_>) -> Result<(), Fail> {
    Ok(log::log_sense(c.cdb, out)?)
}

fn mode_sense(c: &Call<'_>, l: &Lun, out: DataIn<'_>) -> Result<(), Fail> {
    Ok(mode::mode_sense(
        l,
        c.cdb,
        field::OPERATION_CODE.get(c.cdb) == op::MODE_SENSE_10,
        out,
    )?)
}

fn mode_select(c: &Call<'_>, l: &Lun, _: DataIn<'_>) -> Result<(), Fail> {
    Ok(mode::mode_select(
        l,
        c.cdb,
        field::OPERATION_CODE.get(c.cdb) == op::MODE_SELECT_10,
        &c.joined(),
    )?)
}

/// START STOP UNIT on a non-removable disk that is always ready: power
/// conditions and START/LOEJ are accepted and change nothing.
fn start_stop_unit(c: &Call<'_>, _: &Lun, _: DataIn<'_>) -> Result<(), Fail> {
    let power_condition = field::START_STOP_POWER_CONDITION.get(c.cdb);
    if !matches!(power_condition, 0x0..=0x3 | 0x5 | 0x7 | 0xa | 0xb) {
        return Err(Sense::invalid_in_cdb(field::START_STOP_POWER_CONDITION).into());
    }
    Ok(())
}

/// Not removable: PREVENT 0 and 1 are accepted and change nothing.
fn prevent_allow(c: &Call<'_>, _: &Lun, _: DataIn<'_>) -> Result<(), Fail> {
    if field::PREVENT.get(c.cdb) > 1 {
        return Err(Sense::invalid_in_cdb(field::PREVENT).into());
    }
    Ok(())
}

fn reserve_6(c: &Call<'_>, l: &Lun, _: DataIn<'_>) -> Result<(), Fail> {
    if field::RESERVE_6_EXTENT.get(c.cdb) {
        return Err(Sense::invalid_in_cdb(field::RESERVE_6_EXTENT).into()); // extents: obsolete
    }
    Ok(l.res.reserve6(c.who())?)
}

fn release_6(c: &Call<'_>, l: &Lun, _: DataIn<'_>) -> Result<(), Fail> {
    Ok(l.res.release6(c.who())?)
}

fn pr_in(c: &Call<'_>, l: &Lun, out: DataIn<'_>) -> Result<(), Fail> {
    Ok(l.res.pr_in(c.cdb, out)?)
}

fn pr_out(c: &Call<'_>, l: &Lun, _: DataIn<'_>) -> Result<(), Fail> {
    l.res.pr_out(c.who(), &c.target.pr_who(c.nexus, l), c.cdb, &c.joined())?;
    c.target.registrations_changed();
    Ok(())
}

fn report_target_port_groups(c: &Call<'_>, l: &Lun, out: DataIn<'_>) -> Result<(), Fail> {
    Ok(alua::report_target_port_groups(
        c.target.port_group(l),
        c.cdb,
        out,
    )?)
}

/// REPORT SUPPORTED OPERATION CODES: this table's rows.
fn report_supported_opcodes(c: &Call<'_>, _: &Lun, out: DataIn<'_>) -> Result<(), Fail> {
    let supported = COMMANDS.iter().map(|r| opcodes::Supported { opcode: r.opcode, service_action: r.service_action, usage: r.usage });
    Ok(opcodes::report_supported_opcodes(c.cdb, supported, out)?)
}

fn report_supported_tmf(c: &Call<'_>, _: &Lun, out: DataIn<'_>) -> Result<(), Fail> {
    Ok(opcodes::report_supported_tmf(c.cdb, out)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_sorted_and_unique() {
        for w in COMMANDS.windows(2) {
            assert!(
                (w[0].opcode, w[0].service_action) < (w[1].opcode, w[1].service_action),
                "{} before {}",
                w[0].name,
                w[1].name
            );
        }
    }

    #[test]
    fn every_row_has_the_cdb_length_of_its_group_code() {
        for c in COMMANDS {
            assert_eq!(
                c.cdb_len(),
                cdb_len(c.opcode),
                "{}: usage data length",
                c.name
            );
            assert_eq!(
                c.usage[0], c.opcode,
                "{}: usage byte 0 is the opcode",
                c.name
            );
            assert_eq!(
                c.usage[c.cdb_len() - 1],
                0x05,
                "{}: control byte NACA and LINK",
                c.name
            );
            match c.service_action {
                Some(sa) => assert_eq!(
                    c.usage[1] & 0x1f,
                    sa,
                    "{}: usage byte 1 carries the service action",
                    c.name
                ),
                None => assert!(!has_service_actions(c.opcode)),
            }
        }
    }

    #[test]
    fn rows_of_one_opcode_share_what_the_opcode_decides() {
        // The CDB length and ALUA access depend on the opcode alone; an
        // unknown service action borrows them from the first row.
        for c in COMMANDS {
            let first = &COMMANDS[FIRST_ROW[c.opcode as usize] as usize];
            assert_eq!(first.opcode, c.opcode);
            assert_eq!(c.alua, first.alua, "{}", c.name);
            assert_eq!(c.cdb_len(), first.cdb_len(), "{}", c.name);
        }
    }

    /// The ALUA classes `alua.rs`'s test takes for these commands.
    #[test]
    fn alua_classes_of_read_pr_in_and_rtpg() {
        let class = |cdb: &[u8]| command(cdb).unwrap().alua;
        assert_eq!(class(&[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0]), AluaAccess::ActiveOnly);
        assert_eq!(class(&[0x5e, 0, 0, 0, 0, 0, 0, 0, 8, 0]), AluaAccess::UpToStandby);
        assert_eq!(class(&[0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]), AluaAccess::Always);
    }

    #[test]
    fn lookup_finds_each_row_and_refuses_the_rest() {
        for c in COMMANDS {
            let mut cdb = c.usage.to_vec();
            cdb.iter_mut().skip(2).for_each(|b| *b = 0);
            match lookup(&cdb) {
                Lookup::Found(r) => assert!(std::ptr::eq(r, c), "{} found {}", c.name, r.name),
                other => panic!("{}: {other:?}", c.name),
            }
        }
        assert!(matches!(
            lookup(&[0x9e, 0x1f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
            Lookup::UnknownServiceAction { .. }
        ));
        assert!(matches!(
            lookup(&[0x04, 0, 0, 0, 0, 0]),
            Lookup::UnknownOpcode
        )); // FORMAT UNIT
        assert!(matches!(lookup(&[]), Lookup::UnknownOpcode));
    }

    #[test]
    fn data_directions_follow_the_command() {
        let wr10 = [op::WRITE_10, 0, 0, 0, 0, 0, 0, 0, 8, 0];
        assert_eq!(
            command(&wr10).unwrap().transfer.data_out(&wr10),
            Some(8 * BLOCK)
        );
        let rd10 = [op::READ_10, 0, 0, 0, 0, 0, 0, 0, 8, 0];
        assert!(command(&rd10).unwrap().reads_medium());
        assert_eq!(command(&rd10).unwrap().transfer.data_out(&rd10), None);
        let mut caw = [0u8; 16];
        caw[0] = op::COMPARE_AND_WRITE;
        caw[13] = 3;
        assert!(matches!(
            command(&caw).unwrap().transfer,
            Transfer::OutNoExcess(_)
        ));
        assert_eq!(
            command(&caw).unwrap().transfer.data_out(&caw),
            Some(6 * BLOCK)
        );
        // Only the READs read the medium; only READ and WRITE are cheap
        // enough to run inline when small.
        for c in COMMANDS {
            assert_eq!(c.reads_medium(), c.name.starts_with("READ("), "{}", c.name);
            let plain_rw = c.name.starts_with("READ(") || c.name.starts_with("WRITE(");
            assert_eq!(c.execution == InlineIfSmall, plain_rw, "{}", c.name);
        }
    }
}
