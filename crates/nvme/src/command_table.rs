//! Every admin and NVM I/O command this controller implements, one row
//! each (as tgt's `sbc.c` does for SCSI). A row says what the places that
//! handle a command need to know: which queue and controllers take it, its
//! data direction, how it uses the namespace ID, its entry in the Commands
//! Supported and Effects log, whether it may sleep in the kernel, and the
//! function that runs it. Dispatch ([`crate::Controller::execute_admin`],
//! [`crate::nvm_io::execute`]), the I/O prechecks the target runs before it asks
//! for write data, the effects log page and the target's choice of thread
//! all come from here: adding a command is one row and one function.
//!
//! Fabrics commands (Connect, Property Get/Set, Disconnect, authentication)
//! share the admin queue but are keyed by their own command type, not an
//! opcode, and are not listed in the effects log; they are not rows here.

use crate::queue_entry::{admin, nvm, Sqe};
use crate::controller::{AdminOutcome, Controller};
use crate::nvm_commands::{self, Host, IoDone};
use crate::reservation;
use bw_reservation::Access;
use crate::subsystem::{Namespace, Subsystem};
use crate::Status;

/// Which submission queue a command goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QueueKind {
    Admin,
    Io,
}

/// Data transfer direction, as the opcode's low two bits also encode it
/// (01b host to controller, 10b controller to host, 00b none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataDir {
    None,
    HostToCtrl,
    CtrlToHost,
}

/// How a command uses the namespace ID field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NsUse {
    /// Not used, or interpreted by the command itself (Identify, logs).
    Own,
    /// An active namespace.
    Active,
    /// An active namespace, or FFFFFFFFh for all of them (Flush).
    ActiveOrAll,
}

/// Commands Supported and Effects log entry bits (NVMe base 2.0, fig. 210).
pub mod effects {
    /// Command supported.
    pub const CSUPP: u32 = 1 << 0;
    /// May change logical block content.
    pub const LBCC: u32 = 1 << 1;
}

/// Runs an admin command on a controller.
pub type AdminFn = fn(&mut Controller, &Sqe, &[u8]) -> AdminOutcome;
/// Checks an I/O command against its namespace before any data moves.
pub type CheckFn = fn(&Namespace, &Sqe) -> Result<(), Status>;
/// Runs an I/O command whose checks passed (`ns` is None only for a
/// broadcast Flush) for `host`.
pub type IoFn = fn(&Subsystem, Option<&Namespace>, &Host, &Sqe, &[u8]) -> IoDone;

/// What runs the command.
#[derive(Clone, Copy)]
pub enum Handler {
    Admin(AdminFn),
    Io { check: CheckFn, run: IoFn },
}

/// One command.
#[derive(Clone, Copy)]
pub struct Command {
    pub queue: QueueKind,
    pub opcode: u8,
    pub name: &'static str,
    pub dir: DataDir,
    pub ns: NsUse,
    /// Admin commands: a discovery controller takes it too.
    pub discovery: bool,
    /// Its Commands Supported and Effects log entry.
    pub effects: u32,
    /// May sleep in the kernel whatever the backend (flushes, discards,
    /// zeroing, reservations): a target runs it off the connection's thread.
    pub sleeps: bool,
    /// What an I/O command does with the medium, for the reservation
    /// check (base 2.0, figure 512); `None`: never conflicts.
    pub access: Option<Access>,
    pub handler: Handler,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} {:#04x} {}", self.queue, self.opcode, self.name)
    }
}

const fn admin_row(
    opcode: u8,
    name: &'static str,
    dir: DataDir,
    discovery: bool,
    run: AdminFn,
) -> Command {
    Command {
        queue: QueueKind::Admin,
        opcode,
        name,
        dir,
        ns: NsUse::Own,
        discovery,
        effects: effects::CSUPP,
        sleeps: false,
        access: None,
        handler: Handler::Admin(run),
    }
}

#[allow(clippy::too_many_arguments)]
const fn io_row(
    opcode: u8,
    name: &'static str,
    dir: DataDir,
    ns: NsUse,
    effects: u32,
    sleeps: bool,
    access: Option<Access>,
    check: CheckFn,
    run: IoFn,
) -> Command {
    Command {
        queue: QueueKind::Io,
        opcode,
        name,
        dir,
        ns,
        discovery: false,
        effects,
        sleeps,
        access,
        handler: Handler::Io { check, run },
    }
}

use effects::{CSUPP, LBCC};
use DataDir::{CtrlToHost as C2H, HostToCtrl as H2C, None as NoData};

/// The table. A discovery controller takes what Linux nvmet's discovery
/// controller takes: logs, Identify, features, AER and Keep Alive.
pub static COMMANDS: &[Command] = &[
    admin_row(
        admin::GET_LOG_PAGE,
        "Get Log Page",
        C2H,
        true,
        get_log_page,
    ),
    admin_row(admin::IDENTIFY, "Identify", C2H, true, Controller::identify),
    admin_row(admin::ABORT, "Abort", NoData, false, Controller::abort),
    admin_row(
        admin::SET_FEATURES,
        "Set Features",
        H2C,
        true,
        Controller::set_features,
    ),
    admin_row(
        admin::GET_FEATURES,
        "Get Features",
        C2H,
        true,
        Controller::get_features,
    ),
    admin_row(
        admin::ASYNC_EVENT,
        "Asynchronous Event Request",
        NoData,
        true,
        Controller::async_event,
    ),
    admin_row(
        admin::KEEP_ALIVE,
        "Keep Alive",
        NoData,
        true,
        Controller::keep_alive_cmd,
    ),
    io_row(
        nvm::FLUSH,
        "Flush",
        NoData,
        NsUse::ActiveOrAll,
        CSUPP,
        true,
        Some(Access::Write),
        nvm_commands::check_none,
        nvm_commands::flush,
    ),
    io_row(
        nvm::WRITE,
        "Write",
        H2C,
        NsUse::Active,
        CSUPP | LBCC,
        false,
        Some(Access::Write),
        nvm_commands::check_write,
        nvm_commands::write,
    ),
    io_row(
        nvm::READ,
        "Read",
        C2H,
        NsUse::Active,
        CSUPP,
        false,
        Some(Access::Read),
        nvm_commands::check_read,
        nvm_commands::read,
    ),
    io_row(
        nvm::COMPARE,
        "Compare",
        H2C,
        NsUse::Active,
        CSUPP,
        false,
        Some(Access::Read),
        nvm_commands::check_read,
        nvm_commands::compare,
    ),
    io_row(
        nvm::WRITE_ZEROES,
        "Write Zeroes",
        NoData,
        NsUse::Active,
        CSUPP | LBCC,
        true,
        Some(Access::Write),
        nvm_commands::check_write_zeroes,
        nvm_commands::write_zeroes,
    ),
    io_row(
        nvm::DSM,
        "Dataset Management",
        H2C,
        NsUse::Active,
        CSUPP | LBCC,
        true,
        Some(Access::Write),
        nvm_commands::check_dsm,
        nvm_commands::dsm,
    ),
    io_row(
        nvm::RESV_REGISTER,
        "Reservation Register",
        H2C,
        NsUse::Active,
        CSUPP,
        true,
        None,
        nvm_commands::check_none,
        reservation::register,
    ),
    io_row(
        nvm::RESV_REPORT,
        "Reservation Report",
        C2H,
        NsUse::Active,
        CSUPP,
        true,
        None,
        nvm_commands::check_none,
        reservation::report,
    ),
    io_row(
        nvm::RESV_ACQUIRE,
        "Reservation Acquire",
        H2C,
        NsUse::Active,
        CSUPP,
        true,
        None,
        nvm_commands::check_none,
        reservation::acquire,
    ),
    io_row(
        nvm::RESV_RELEASE,
        "Reservation Release",
        H2C,
        NsUse::Active,
        CSUPP,
        true,
        None,
        nvm_commands::check_none,
        reservation::release,
    ),
];

/// Get Log Page, given the Commands Supported and Effects page this table
/// makes.
fn get_log_page(c: &mut Controller, sqe: &Sqe, _: &[u8]) -> AdminOutcome {
    c.get_log_page(sqe, effects_log)
}

/// The row for `opcode` on a `queue`, if we implement it.
pub fn lookup(queue: QueueKind, opcode: u8) -> Option<&'static Command> {
    COMMANDS
        .iter()
        .find(|c| c.queue == queue && c.opcode == opcode)
}

/// Commands Supported and Effects log page (4096 bytes): admin entries in
/// the first 256 dwords, I/O entries in the next 256.
pub fn effects_log() -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    for c in COMMANDS {
        let base = match c.queue {
            QueueKind::Admin => 0,
            QueueKind::Io => 1024,
        };
        bw_wire::Field::<bw_wire::Le<u32>>::at(base + c.opcode as usize * 4).set(&mut b, c.effects);
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn opcodes_are_unique_per_queue() {
        let mut seen = HashSet::new();
        for c in COMMANDS {
            assert!(seen.insert((c.queue, c.opcode)), "{c:?} listed twice");
        }
    }

    /// The opcode's low two bits are its data direction (NVMe base 2.0,
    /// 5.1 / 7.1): the transport relies on that for commands it does not
    /// know, so our rows must agree.
    #[test]
    fn direction_matches_opcode_bits() {
        for c in COMMANDS {
            let by_bits = match c.opcode & 3 {
                0 => DataDir::None,
                1 => DataDir::HostToCtrl,
                2 => DataDir::CtrlToHost,
                _ => unreachable!("no bidirectional commands"),
            };
            assert_eq!(c.dir, by_bits, "{c:?}");
            assert_eq!(
                Sqe::new(c.opcode, 0, 0).is_host_to_ctrl(),
                c.dir == DataDir::HostToCtrl,
                "{c:?}"
            );
        }
    }

    #[test]
    fn handlers_match_their_queue() {
        for c in COMMANDS {
            match (c.queue, c.handler) {
                (QueueKind::Admin, Handler::Admin(_)) => assert_eq!(c.ns, NsUse::Own, "{c:?}"),
                (QueueKind::Io, Handler::Io { .. }) => assert!(!c.discovery, "{c:?}"),
                _ => panic!("{c:?}: handler for the wrong queue"),
            }
            assert!(c.effects & effects::CSUPP != 0, "{c:?}");
        }
    }

    #[test]
    fn effects_log_comes_from_the_table() {
        let b = effects_log();
        let entry = |base: usize, op: u8| bw_wire::Field::<bw_wire::Le<u32>>::at(base + op as usize * 4).get(&b);
        for op in 0..=255u8 {
            let want = |q| lookup(q, op).map_or(0, |c| c.effects);
            assert_eq!(entry(0, op), want(QueueKind::Admin), "admin {op:#04x}");
            assert_eq!(entry(1024, op), want(QueueKind::Io), "io {op:#04x}");
        }
        assert_eq!(entry(1024, nvm::WRITE), CSUPP | LBCC);
        assert_eq!(entry(1024, nvm::READ), CSUPP);
        assert_eq!(entry(0, admin::KEEP_ALIVE), CSUPP);
        // Not implemented: not listed.
        assert_eq!(entry(0, admin::CREATE_SQ), 0);
        assert!(b[2048..].iter().all(|&x| x == 0));
    }

    #[test]
    fn only_flush_addresses_all_namespaces_and_sleepers_are_the_slow_ones() {
        for c in COMMANDS.iter().filter(|c| c.queue == QueueKind::Io) {
            assert_eq!(c.ns == NsUse::ActiveOrAll, c.opcode == nvm::FLUSH, "{c:?}");
            let slow = matches!(c.opcode, nvm::FLUSH | nvm::DSM | nvm::WRITE_ZEROES | nvm::RESV_REGISTER | nvm::RESV_REPORT | nvm::RESV_ACQUIRE | nvm::RESV_RELEASE);
            assert_eq!(c.sleeps, slow, "{c:?}");
        }
    }
}
