//! The NVM command set's entry points: an I/O command is checked and
//! resolved against the command table ([`precheck`], [`resolve`]), then
//! run ([`execute`]) or, a Read or Write, planned as one request
//! ([`plan`]). [`execute`] makes blocking calls: the caller picks the
//! thread. [`plan`] instead turns a Read or Write into one request for
//! `Volume::submit`, for volumes that complete requests on their own
//! threads (rbd). The commands themselves (Read, Write, Flush, Compare,
//! Write Zeroes, Dataset Management, the reservation commands) are the
//! table's rows: `nvm_commands.rs`, `reservation.rs`.

use crate::queue_entry::{nvm, Sqe};
use crate::command_table::{self, Command, Handler, NsUse, QueueKind};
use crate::subsystem::{Namespace, Subsystem};
// What the commands get and give, for callers of `execute` and `plan`.
pub use crate::nvm_commands::{dsm_ranges, read_error, Host, IoDone};
use crate::nvm_commands::map_err;
use crate::{Status, LBA_SHIFT};
use bw_block::BlockError;
use bytes::Bytes;

/// Bytes of data the host will send with this command (writes, compare,
/// DSM range list) or expects back (reads), from its SGL.
#[inline]
pub fn transfer_len(sqe: &Sqe) -> u32 {
    sqe.sgl().length
}

/// Cheap checks that need no I/O, done before any data is moved: opcode,
/// namespace, LBA range, transfer length. The target runs them before it
/// sends an R2T so a bad write fails without its data crossing the wire.
/// A namespace host `hostnqn` may not see is an inactive NSID.
/// (Reservations are checked when the command runs.)
pub fn precheck(subsys: &Subsystem, hostnqn: &str, sqe: &Sqe) -> Result<(), Status> {
    checked(subsys, hostnqn, sqe).map(|_| ())
}

/// An I/O command after its checks, resolved once: its command table row,
/// its namespace (by index into the subsystem's, so that the value can go
/// with the subsystem to another thread) and the extent it addresses. The
/// front-ends decide from it where the command runs, and run it with
/// [`execute_resolved`], [`plan_resolved`] or [`Resolved::read_extent`]
/// without looking anything up again.
#[derive(Debug, Clone, Copy)]
pub struct Resolved {
    pub row: &'static Command,
    /// Index into `Subsystem::namespaces`; `None` only for a Flush of all
    /// namespaces.
    ns: Option<usize>,
    /// Byte offset and length the command addresses (SLBA and NLB; the
    /// commands that address no range ignore them).
    pub offset: u64,
    pub len: usize,
}

impl Resolved {
    /// The command's namespace in `subsys` (the subsystem it was resolved in).
    pub fn namespace<'a>(&self, subsys: &'a Subsystem) -> Option<&'a Namespace> {
        self.ns.and_then(|i| subsys.namespaces.get(i))
    }

    /// A Read's volume and extent, for front-ends that move the bytes
    /// themselves (straight into a send buffer, or with sendfile).
    pub fn read_extent<'a>(&self, subsys: &'a Subsystem) -> Option<(&'a bw_block::Volume, u64, usize)> {
        if self.row.opcode != nvm::READ {
            return None;
        }
        self.namespace(subsys).map(|ns| (&ns.volume, self.offset, self.len))
    }
}

/// The command's row, namespace and extent, after [`precheck`]'s checks and
/// the reservation check for `host`. As in Linux nvmet, the namespace is
/// checked before the opcode.
pub fn resolve(subsys: &Subsystem, host: &Host, sqe: &Sqe) -> Result<Resolved, Status> {
    let r = checked(subsys, &host.nqn, sqe)?;
    if let Some(access) = r.row.access {
        // A reservation on any namespace a broadcast Flush reaches counts.
        let refused = match r.namespace(subsys) {
            Some(ns) => !ns.volume.reservations().allows(host.id, access),
            None => subsys.namespaces.iter().filter(|n| n.visible_to(&host.nqn)).any(|n| !n.volume.reservations().allows(host.id, access)),
        };
        if refused {
            return Err(Status::RESERVATION_CONFLICT.dnr());
        }
    }
    Ok(r)
}

fn checked(subsys: &Subsystem, hostnqn: &str, sqe: &Sqe) -> Result<Resolved, Status> {
    let row = command_table::lookup(QueueKind::Io, sqe.opcode());
    let (offset, len) = (sqe.slba() << LBA_SHIFT, (sqe.nlb() as usize) << LBA_SHIFT);
    if let Some(r) = row.filter(|r| r.ns == NsUse::ActiveOrAll && sqe.nsid() == 0xFFFF_FFFF) {
        return Ok(Resolved { row: r, ns: None, offset, len });
    }
    // A namespace the host may not see is inactive for it, as one never
    // added: Invalid Namespace or Format (NVMe base 2.0, 3.2.1.4; Linux
    // nvmet and SPDK answer the same).
    let i = subsys.namespaces.iter().position(|n| n.nsid == sqe.nsid() && n.visible_to(hostnqn)).ok_or(Status::INVALID_NS.dnr())?;
    let ns = &subsys.namespaces[i];
    if let Some(s) = subsys.ana.state_of(ns.ana_group).io_status() {
        return Err(s);
    }
    let row = row.ok_or(Status::INVALID_OPCODE.dnr())?;
    if let Handler::Io { check, .. } = row.handler {
        check(ns, sqe)?;
    }
    Ok(Resolved { row, ns: Some(i), offset, len })
}

/// What [`plan`] decided for a command.
#[derive(Debug)]
pub enum Plan {
    /// Every check has passed: start `request` on `volume`
    /// (`Volume::submit`) and complete the command with [`submitted`] of
    /// its result.
    Submit { volume: bw_block::Volume, request: bw_block::Request },
    /// The command failed its checks.
    Done(Status),
    /// Not a plain Read or Write (or a FUA write that needs a flush after
    /// it): run it with [`execute`].
    Execute,
}

/// A Read or Write as the one request that carries it out, for front-ends
/// that start requests and complete them later (volumes with
/// `DeviceInfo::async_submit`). The checks are [`execute`]'s.
pub fn plan(subsys: &Subsystem, host: &Host, sqe: &Sqe, data: &Bytes) -> Plan {
    match resolve(subsys, host, sqe) {
        Ok(r) => plan_resolved(subsys, &r, sqe, data),
        Err(s) if matches!(sqe.opcode(), nvm::READ | nvm::WRITE) => Plan::Done(s),
        Err(_) => Plan::Execute,
    }
}

/// [`plan`] of a command [`resolve`]d already.
pub fn plan_resolved(subsys: &Subsystem, r: &Resolved, sqe: &Sqe, data: &Bytes) -> Plan {
    let op = r.row.opcode;
    if op != nvm::READ && op != nvm::WRITE {
        return Plan::Execute;
    }
    let Some(ns) = r.namespace(subsys) else {
        return Plan::Done(Status::INVALID_NS.dnr());
    };
    let (offset, len) = (r.offset, r.len);
    let request = if op == nvm::READ {
        bw_block::Request::read(offset, len)
    } else {
        if data.len() != len {
            return Plan::Done(Status::SGL_INVALID_DATA.dnr());
        }
        // Force Unit Access needs nothing more where every write is
        // durable when acknowledged; elsewhere a flush follows (execute).
        let fua = sqe.fua();
        if fua && ns.volume.info().durability != bw_block::Durability::WriteThrough {
            return Plan::Execute;
        }
        bw_block::Request::Write { offset, data: vec![data.clone()] }
    };
    Plan::Submit { volume: ns.volume.clone(), request }
}

/// The outcome of a command [`plan`] started, from its request's result.
pub fn submitted(req: bw_block::Request, r: Result<(), BlockError>) -> IoDone {
    match r {
        Ok(()) if req.is_write() => IoDone::ok(),
        Ok(()) => IoDone { status: Status::SUCCESS, data: Some(Bytes::from(req.into_buf())) },
        Err(e) => IoDone::err(map_err(e, req.is_write())),
    }
}

/// Run one I/O command. `data` is what the host sent (writes, compare, DSM).
pub fn execute(subsys: &Subsystem, host: &Host, sqe: &Sqe, data: &[u8]) -> IoDone {
    match resolve(subsys, host, sqe) {
        Ok(r) => execute_resolved(subsys, &r, host, sqe, data),
        Err(s) => IoDone::err(s),
    }
}

/// [`execute`] a command [`resolve`]d already (in this `subsys`).
pub fn execute_resolved(subsys: &Subsystem, r: &Resolved, host: &Host, sqe: &Sqe, data: &[u8]) -> IoDone {
    match r.row.handler {
        Handler::Io { run, .. } => run(subsys, r.namespace(subsys), host, sqe, data),
        _ => IoDone::err(Status::INVALID_OPCODE.dnr()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nvm_commands::NS_WRITE_PROTECTED;
    use crate::queue_entry::{sgl, Sgl};
    use bw_block::{BackendSpec, Volume};

    fn subsys() -> Subsystem {
        let v = Volume::open("v", &BackendSpec::ram(64 * 512)).unwrap();
        let ro = Volume::open("ro", &BackendSpec::parse("ram:4k,readonly").unwrap()).unwrap();
        Subsystem {
            nqn: "nqn.t:s".into(),
            serial: "s".into(),
            model: "m".into(),
            namespaces: vec![Namespace::new("nqn.t:s", 1, v, false), Namespace::new("nqn.t:s", 2, ro, false)],
            allowed_hosts: vec![],
            ana: Default::default(),
        }
    }

    fn h() -> Host {
        Host::new([7; 16], "nqn.t:h")
    }

    fn rw(op: u8, nsid: u32, slba: u64, blocks: u32) -> Sqe {
        let mut s = Sqe::new(op, 1, nsid);
        s.set_rw(slba, blocks);
        s.set_sgl(Sgl { addr: 0, length: blocks * 512, kind: sgl::TRANSPORT });
        s
    }

    #[test]
    fn inaccessible_ana_path_refuses_io_for_another_path() {
        let s = subsys();
        s.ana.set_state(crate::ana::AnaState::Inaccessible);
        let st = execute(&s, &h(), &rw(nvm::READ, 1, 0, 1), &[]).status;
        assert_eq!(st, Status::ANA_INACCESSIBLE);
        assert_eq!(st.0 & Status::DNR, 0, "the host must be free to retry on another path");
        s.ana.set_state(crate::ana::AnaState::NonOptimized);
        assert_eq!(execute(&s, &h(), &rw(nvm::READ, 1, 0, 1), &[]).status, Status::SUCCESS);
    }

    /// plan: the one request a Read or Write needs, after execute's checks;
    /// submitted gives execute's outcome.
    #[test]
    fn plan_submits_reads_and_writes_with_executes_checks() {
        let s = subsys();
        let data = Bytes::from(vec![0x3Cu8; 1024]);
        let run = |p: Plan| {
            let Plan::Submit { volume, request } = p else { panic!("not submitted: {p:?}") };
            let (tx, rx) = std::sync::mpsc::channel();
            volume.submit(request, move |req, r| tx.send(submitted(req, r)).unwrap());
            rx.recv().unwrap()
        };
        assert_eq!(run(plan(&s, &h(), &rw(nvm::WRITE, 1, 6, 2), &data)).status, Status::SUCCESS);
        let d = run(plan(&s, &h(), &rw(nvm::READ, 1, 6, 2), &Bytes::new()));
        assert_eq!((d.status, d.data), (Status::SUCCESS, Some(data.clone())));
        assert_eq!(execute(&s, &h(), &rw(nvm::READ, 1, 6, 2), &[]).data, Some(data.clone()));
        // FUA on a volatile (RAM) volume: a flush follows, so execute runs it.
        let mut fua = rw(nvm::WRITE, 1, 6, 2);
        fua.set_fua(true);
        assert!(matches!(plan(&s, &h(), &fua, &data), Plan::Execute));
        assert!(matches!(plan(&s, &h(), &Sqe::new(nvm::FLUSH, 1, 1), &Bytes::new()), Plan::Execute));
        let done = |p: Plan| match p {
            Plan::Done(st) => st,
            p => panic!("not refused: {p:?}"),
        };
        assert_eq!(done(plan(&s, &h(), &rw(nvm::READ, 1, 63, 2), &Bytes::new())), Status::LBA_RANGE.dnr());
        assert_eq!(done(plan(&s, &h(), &rw(nvm::WRITE, 1, 0, 2), &data.slice(..512))), Status::SGL_INVALID_DATA.dnr());
        assert_eq!(done(plan(&s, &h(), &rw(nvm::WRITE, 2, 0, 2), &data)), NS_WRITE_PROTECTED.dnr());
        assert_eq!(done(plan(&s, &h(), &rw(nvm::READ, 9, 0, 1), &Bytes::new())), Status::INVALID_NS.dnr());
        s.ana.set_state(crate::ana::AnaState::Inaccessible);
        assert_eq!(done(plan(&s, &h(), &rw(nvm::READ, 1, 0, 1), &Bytes::new())), Status::ANA_INACCESSIBLE);
    }

    /// resolve: one lookup of the row and the namespace, carried with the
    /// extent; the resolved paths give the unresolved ones' outcomes.
    #[test]
    fn resolved_once_carries_row_namespace_and_extent() {
        let s = subsys();
        let data = vec![0x7Eu8; 1024];
        let w = rw(nvm::WRITE, 1, 6, 2);
        let r = resolve(&s, &h(), &w).unwrap();
        assert_eq!((r.row.opcode, r.namespace(&s).map(|n| n.nsid), r.offset, r.len), (nvm::WRITE, Some(1), 6 * 512, 1024));
        assert!(r.read_extent(&s).is_none(), "a write has no read extent");
        assert_eq!(execute_resolved(&s, &r, &h(), &w, &data).status, Status::SUCCESS);
        let rd = rw(nvm::READ, 1, 6, 2);
        let r = resolve(&s, &h(), &rd).unwrap();
        let (v, off, len) = r.read_extent(&s).unwrap();
        assert_eq!((v.name(), off, len), ("v", 6 * 512, 1024));
        assert_eq!(execute_resolved(&s, &r, &h(), &rd, &[]).data.unwrap()[..], data[..]);
        // The second namespace: the index is its own, not the first's.
        let r = resolve(&s, &h(), &rw(nvm::READ, 2, 0, 1)).unwrap();
        assert_eq!(r.namespace(&s).map(|n| n.nsid), Some(2));
        assert!(matches!(plan_resolved(&s, &r, &rw(nvm::READ, 2, 0, 1), &Bytes::new()), Plan::Submit { .. }));
        // Flush of all namespaces: no namespace, and execute flushes them all.
        let mut fl = Sqe::new(nvm::FLUSH, 1, 0xFFFF_FFFF);
        fl.set_sgl(Sgl { addr: 0, length: 0, kind: sgl::TRANSPORT });
        let r = resolve(&s, &h(), &fl).unwrap();
        assert!(r.namespace(&s).is_none());
        assert_eq!(execute_resolved(&s, &r, &h(), &fl, &[]).status, Status::SUCCESS);
        assert_eq!(resolve(&s, &h(), &rw(nvm::READ, 1, 63, 2)).unwrap_err(), Status::LBA_RANGE.dnr());
    }

    #[test]
    fn write_read_compare_zeroes_discard() {
        let s = subsys();
        let data = vec![0x5Au8; 1024];
        assert_eq!(execute(&s, &h(), &rw(nvm::WRITE, 1, 4, 2), &data).status, Status::SUCCESS);
        let r = execute(&s, &h(), &rw(nvm::READ, 1, 4, 2), &[]);
        assert_eq!(r.data.unwrap()[..], data[..]);
        assert_eq!(execute(&s, &h(), &rw(nvm::COMPARE, 1, 4, 2), &data).status, Status::SUCCESS);
        assert_eq!(execute(&s, &h(), &rw(nvm::COMPARE, 1, 4, 2), &[0u8; 1024]).status, Status::COMPARE_FAILED.dnr());
        let mut wz = rw(nvm::WRITE_ZEROES, 1, 4, 1);
        wz.set_sgl(Sgl { addr: 0, length: 0, kind: sgl::TRANSPORT });
        assert_eq!(execute(&s, &h(), &wz, &[]).status, Status::SUCCESS);
        let r = execute(&s, &h(), &rw(nvm::READ, 1, 4, 2), &[]).data.unwrap();
        assert!(r[..512].iter().all(|&b| b == 0) && r[512..].iter().all(|&b| b == 0x5A));
        let mut dsm = Sqe::new(nvm::DSM, 1, 1);
        dsm.set_dsm(1, true);
        dsm.set_sgl(Sgl { addr: 0, length: 16, kind: sgl::INCAPSULE });
        assert_eq!(execute(&s, &h(), &dsm, &dsm_ranges(&[(5, 1)])).status, Status::SUCCESS);
        let r = execute(&s, &h(), &rw(nvm::READ, 1, 5, 1), &[]).data.unwrap();
        assert!(r.iter().all(|&b| b == 0));
        assert_eq!(execute(&s, &h(), &dsm, &dsm_ranges(&[(63, 2)])).status, Status::LBA_RANGE.dnr());
        let mut fl = Sqe::new(nvm::FLUSH, 1, 0xFFFF_FFFF);
        fl.set_sgl(Sgl { addr: 0, length: 0, kind: sgl::TRANSPORT });
        assert_eq!(execute(&s, &h(), &fl, &[]).status, Status::SUCCESS);
    }

    #[test]
    fn error_statuses() {
        let s = subsys();
        assert_eq!(execute(&s, &h(), &rw(nvm::READ, 1, 63, 2), &[]).status, Status::LBA_RANGE.dnr());
        assert_eq!(execute(&s, &h(), &rw(nvm::READ, 1, u64::MAX, 2), &[]).status, Status::LBA_RANGE.dnr());
        assert_eq!(execute(&s, &h(), &rw(nvm::READ, 9, 0, 1), &[]).status, Status::INVALID_NS.dnr());
        assert_eq!(execute(&s, &h(), &rw(0x7E, 1, 0, 1), &[]).status, Status::INVALID_OPCODE.dnr());
        assert_eq!(execute(&s, &h(), &rw(nvm::WRITE, 2, 0, 1), &[0; 512]).status, NS_WRITE_PROTECTED.dnr());
        let mut bad = rw(nvm::READ, 1, 0, 2);
        bad.set_sgl(Sgl { addr: 0, length: 512, kind: sgl::TRANSPORT });
        assert_eq!(execute(&s, &h(), &bad, &[]).status, Status::SGL_INVALID_DATA.dnr());
        // Backend failures: a timeout may be retried (no DNR), EIO is a media error.
        let timeout = || BlockError::Io(std::io::Error::new(std::io::ErrorKind::TimedOut, "rbd: timed out"));
        assert_eq!((map_err(timeout(), true), map_err(timeout(), false)), (Status::COMMAND_INTERRUPTED, Status::COMMAND_INTERRUPTED));
        let eio = || BlockError::Io(std::io::Error::from_raw_os_error(5));
        assert_eq!((map_err(eio(), true), map_err(eio(), false)), (Status::WRITE_FAULT, Status::READ_ERROR));
        // A full store is out of capacity, not a medium error.
        let enospc = || BlockError::Io(std::io::Error::from_raw_os_error(28));
        assert_eq!(map_err(enospc(), true), Status::CAP_EXCEEDED.dnr());
    }
}
