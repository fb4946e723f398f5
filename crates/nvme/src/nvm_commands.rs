//! The NVM command set's commands over a `Volume`, as the command table's
//! rows name them: each command's check (run before any data moves) and
//! its body (Read, Write, Flush, Compare, Write Zeroes, Dataset Management;
//! the reservation commands are `reservation.rs`'s), with what every one
//! of them gets and gives: the host it comes from ([`Host`]) and its
//! outcome ([`IoDone`]). Dispatch from the table is `nvm_io.rs`'s.

use crate::queue_entry::Sqe;
use crate::subsystem::{Namespace, Subsystem};
use crate::{Status, LBA_SHIFT};
use bw_block::BlockError;
use bw_reservation::Who;
use bytes::Bytes;

/// Outcome of one I/O command: status and, for reads, the data.
#[derive(Debug)]
pub struct IoDone {
    pub status: Status,
    pub data: Option<Bytes>,
}

impl IoDone {
    pub(crate) fn ok() -> IoDone {
        IoDone { status: Status::SUCCESS, data: None }
    }
    pub(crate) fn err(s: Status) -> IoDone {
        IoDone { status: s, data: None }
    }
}

/// Write protected namespace (generic status 0x20).
pub const NS_WRITE_PROTECTED: Status = Status(0x20);

/// The host a command comes from, as a reservation registrant.
#[derive(Debug, Clone)]
pub struct Host {
    pub hostid: [u8; 16],
    /// The host NQN of its Connect: which namespaces it sees.
    pub nqn: String,
    /// `Who::nvme(hostid)` and its id, made once per controller.
    pub who: Who,
    pub id: u64,
}

impl Host {
    pub fn new(hostid: [u8; 16], nqn: impl Into<String>) -> Host {
        let who = Who::nvme(&hostid);
        Host { hostid, nqn: nqn.into(), id: who.id(), who }
    }
}

/// Read, Write and Compare: transfer within MDTS and the namespace, SGL
/// length equal to the blocks addressed.
fn check_rw(ns: &Namespace, sqe: &Sqe, write: bool) -> Result<(), Status> {
    if (sqe.nlb() as u64) << LBA_SHIFT > crate::limits::MAX_TRANSFER as u64 {
        return Err(Status::INVALID_FIELD.dnr());
    }
    check_range(ns, sqe.slba(), sqe.nlb() as u64)?;
    if sqe.sgl().length as u64 != (sqe.nlb() as u64) << LBA_SHIFT {
        return Err(Status::SGL_INVALID_DATA.dnr());
    }
    if write && ns.read_only() {
        return Err(NS_WRITE_PROTECTED.dnr());
    }
    Ok(())
}

pub(crate) fn check_read(ns: &Namespace, sqe: &Sqe) -> Result<(), Status> {
    check_rw(ns, sqe, false)
}

pub(crate) fn check_write(ns: &Namespace, sqe: &Sqe) -> Result<(), Status> {
    check_rw(ns, sqe, true)
}

pub(crate) fn check_none(_: &Namespace, _: &Sqe) -> Result<(), Status> {
    Ok(())
}

pub(crate) fn check_write_zeroes(ns: &Namespace, sqe: &Sqe) -> Result<(), Status> {
    check_range(ns, sqe.slba(), sqe.nlb() as u64)?;
    if ns.read_only() {
        return Err(NS_WRITE_PROTECTED.dnr());
    }
    Ok(())
}

pub(crate) fn check_dsm(ns: &Namespace, sqe: &Sqe) -> Result<(), Status> {
    let nr = (sqe.cdw(10) & 0xFF) + 1;
    if sqe.sgl().length < nr * 16 {
        return Err(Status::SGL_INVALID_DATA.dnr());
    }
    if sqe.cdw(11) & 0x4 != 0 && ns.read_only() {
        return Err(NS_WRITE_PROTECTED.dnr());
    }
    Ok(())
}

fn check_range(ns: &Namespace, slba: u64, nlb: u64) -> Result<(), Status> {
    match slba.checked_add(nlb) {
        Some(end) if end <= ns.blocks() => Ok(()),
        _ => Err(Status::LBA_RANGE.dnr()),
    }
}

pub(crate) fn map_err(e: BlockError, write: bool) -> Status {
    match e {
        BlockError::OutOfRange { .. } => Status::LBA_RANGE.dnr(),
        BlockError::ReadOnly => NS_WRITE_PROTECTED.dnr(),
        // The backend did not answer in time (rbd: the cluster is away):
        // nothing is known to be wrong with the data, a retry may succeed.
        BlockError::Io(e) if e.kind() == std::io::ErrorKind::TimedOut => Status::COMMAND_INTERRUPTED,
        // A thin volume whose store is full (ENOSPC): Capacity Exceeded,
        // which hosts report as "no space" (Linux: ENOSPC), as nvmet's file
        // backend answers; a write fault would read as a medium error.
        BlockError::Io(e) if e.kind() == std::io::ErrorKind::StorageFull => Status::CAP_EXCEEDED.dnr(),
        BlockError::Io(_) if write => Status::WRITE_FAULT,
        BlockError::Io(_) => Status::READ_ERROR,
    }
}

/// The status for a failed read of a volume.
pub fn read_error(e: BlockError) -> Status {
    map_err(e, false)
}

/// The namespace and extent (byte offset, length) a checked command addresses.
fn extent<'a>(ns: Option<&'a Namespace>, sqe: &Sqe) -> Result<(&'a Namespace, u64, usize), IoDone> {
    let ns = ns.ok_or(IoDone::err(Status::INVALID_NS.dnr()))?;
    Ok((ns, sqe.slba() << LBA_SHIFT, (sqe.nlb() as usize) << LBA_SHIFT))
}

fn done(r: Result<(), BlockError>, write: bool) -> IoDone {
    match r {
        Ok(()) => IoDone::ok(),
        Err(e) => IoDone::err(map_err(e, write)),
    }
}

pub(crate) fn read(_: &Subsystem, ns: Option<&Namespace>, _: &Host, sqe: &Sqe, _: &[u8]) -> IoDone {
    let (ns, off, len) = match extent(ns, sqe) {
        Ok(x) => x,
        Err(d) => return d,
    };
    let mut buf = read_buffer(len);
    match ns.volume.read_at(&mut buf, off) {
        Ok(()) => IoDone { status: Status::SUCCESS, data: Some(Bytes::from(buf)) },
        Err(e) => IoDone::err(map_err(e, false)),
    }
}

pub(crate) fn write(_: &Subsystem, ns: Option<&Namespace>, _: &Host, sqe: &Sqe, data: &[u8]) -> IoDone {
    let (ns, off, len) = match extent(ns, sqe) {
        Ok(x) => x,
        Err(d) => return d,
    };
    if data.len() != len {
        return IoDone::err(Status::SGL_INVALID_DATA.dnr());
    }
    // Force Unit Access: the data must be durable before completion.
    let fua = sqe.fua();
    done(ns.volume.write_at(data, off).and_then(|()| if fua { ns.volume.flush() } else { Ok(()) }), true)
}

pub(crate) fn compare(_: &Subsystem, ns: Option<&Namespace>, _: &Host, sqe: &Sqe, data: &[u8]) -> IoDone {
    let (ns, off, len) = match extent(ns, sqe) {
        Ok(x) => x,
        Err(d) => return d,
    };
    if data.len() != len {
        return IoDone::err(Status::SGL_INVALID_DATA.dnr());
    }
    let mut buf = vec![0u8; len];
    match ns.volume.read_at(&mut buf, off) {
        Ok(()) if buf == data => IoDone::ok(),
        Ok(()) => IoDone::err(Status::COMPARE_FAILED.dnr()),
        Err(e) => IoDone::err(map_err(e, false)),
    }
}

pub(crate) fn write_zeroes(_: &Subsystem, ns: Option<&Namespace>, _: &Host, sqe: &Sqe, _: &[u8]) -> IoDone {
    match extent(ns, sqe) {
        Ok((ns, off, len)) => done(ns.volume.write_zeroes(off, len as u64), true),
        Err(d) => d,
    }
}

/// Flush one namespace, or all of them (NSID FFFFFFFFh).
pub(crate) fn flush(subsys: &Subsystem, ns: Option<&Namespace>, _: &Host, _: &Sqe, _: &[u8]) -> IoDone {
    match ns {
        Some(ns) => done(ns.volume.flush(), true),
        None => done(subsys.namespaces.iter().try_for_each(|n| n.volume.flush()), true),
    }
}

/// Dataset Management: only deallocate acts; every range is checked before
/// any is discarded.
pub(crate) fn dsm(_: &Subsystem, ns: Option<&Namespace>, _: &Host, sqe: &Sqe, data: &[u8]) -> IoDone {
    let Some(ns) = ns else { return IoDone::err(Status::INVALID_NS.dnr()) };
    let nr = (sqe.cdw(10) & 0xFF) as usize + 1;
    if data.len() < nr * 16 {
        return IoDone::err(Status::SGL_INVALID_DATA.dnr());
    }
    let ranges: Vec<(u64, u64)> = data
        .chunks_exact(dsm_range::LEN)
        .take(nr)
        .map(|r| (dsm_range::SLBA.get(r), dsm_range::NLB.get(r) as u64))
        .collect();
    for &(slba, nlb) in &ranges {
        if let Err(s) = check_range(ns, slba, nlb) {
            return IoDone::err(s);
        }
    }
    if sqe.cdw(11) & 0x4 != 0 {
        for (slba, nlb) in ranges {
            if let Err(e) = ns.volume.discard(slba << LBA_SHIFT, nlb << LBA_SHIFT) {
                return IoDone::err(map_err(e, true));
            }
        }
    }
    IoDone::ok()
}

/// A buffer for a read, zero-filled: `Volume::read_at` takes `&mut [u8]`,
/// which must never refer to uninitialized memory, whatever the backend
/// does with it. (Reads that can avoid this copy do: the transports send
/// large results from the page cache or into their send buffers.)
fn read_buffer(len: usize) -> Vec<u8> {
    vec![0; len]
}

/// One Dataset Management range (16 bytes; context attributes unused).
mod dsm_range {
    use bw_wire::{Field, Le};

    pub const LEN: usize = 16;
    pub const NLB: Field<Le<u32>> = Field::at(4);
    pub const SLBA: Field<Le<u64>> = Field::at(8);
}

/// Encode DSM ranges (context attributes 0) for a host.
pub fn dsm_ranges(ranges: &[(u64, u32)]) -> Vec<u8> {
    let mut b = vec![0u8; ranges.len() * 16];
    for (i, (slba, nlb)) in ranges.iter().enumerate() {
        let r = &mut b[i * dsm_range::LEN..];
        dsm_range::NLB.set(r, *nlb);
        dsm_range::SLBA.set(r, *slba);
    }
    b
}

