//! What a transport asks about one command before it runs it, answered
//! from one lookup of the command table: where to run it
//! ([`Plan::execution`]), how much data-out to solicit
//! ([`Plan::data_out_len`]), whether it is a plain READ whose data the
//! transport moves itself ([`Plan::read`]) or a plain READ or WRITE it
//! submits itself ([`Plan::io`]), and otherwise running it
//! ([`Plan::execute`]); and running one command ([`ScsiTarget::execute`]:
//! the checks every command gets, then its handler, from its row).

use crate::cdb::{field, naca_or_link, op};
use crate::alua;
use crate::cdb::truncate_to;
use crate::commands::{self, Call, Execution, Handler, Lookup, Transfer};
use crate::sense::Sense;
use crate::{Fail, Lun, LunCache, NexusId, ScsiOutcome, ScsiTarget};
use bw_block::Volume;

/// One command as the table and the LUN see it (see the module comment).
pub struct Plan<'a> {
    target: &'a ScsiTarget,
    /// Held for the command's life: a LUN removed meanwhile finishes it.
    lun: Option<std::sync::Arc<Lun>>,
    cdb: &'a [u8],
    found: Lookup,
}

/// What [`Plan::read`] decided.
#[derive(Debug)]
pub enum ReadPlan {
    /// Every check has passed: the data-in is `len` bytes of `volume` at
    /// byte `offset`, with GOOD status. The transport reads it
    /// ([`Volume::read_at`], counted there) or sends it from the page
    /// cache ([`Volume::zero_copy_read`], counted there).
    Range {
        volume: Volume,
        offset: u64,
        len: usize,
    },
    /// The command failed its checks: complete it with this outcome.
    Done(ScsiOutcome),
    /// Not a plain READ (another command, nothing to read, a pending unit
    /// attention, reservation or ALUA refusal): nothing was done; run it
    /// with [`Plan::execute`].
    Buffered,
}

/// What [`Plan::io`] decided.
#[derive(Debug)]
pub enum IoPlan {
    /// Every check has passed and the command is counted: start `request`
    /// on `volume` ([`Volume::submit`]) and complete the command with
    /// [`io_outcome`] of its result (a read's data is the request's buffer).
    Submit {
        volume: Volume,
        request: bw_block::Request,
    },
    /// The command failed its checks: complete it with this outcome.
    Done(ScsiOutcome),
    /// Not a plain READ or WRITE (or a unit attention, reservation or ALUA
    /// state is pending, or the write needs a flush after it): nothing was
    /// done; run it with [`Plan::execute`].
    Buffered,
}

/// The outcome of a command [`Plan::io`] started, from its request's result.
pub fn io_outcome(r: &Result<(), bw_block::BlockError>, write: bool) -> ScsiOutcome {
    match r {
        Ok(()) => ScsiOutcome::GOOD,
        Err(e) => ScsiOutcome::check(crate::block_io::io_sense(e, write)),
    }
}

/// A [`Plan`] without its borrows ([`Plan::detach`]), to take to another
/// thread together with the target and the CDB it was made from, where
/// [`Planned::attach`] makes it a plan again without looking the command
/// or the LUN up a second time.
pub struct Planned {
    lun: Option<std::sync::Arc<Lun>>,
    found: Lookup,
}

impl Planned {
    /// The plan again, over the same `target` and `cdb` it was made from.
    pub fn attach<'a>(self, target: &'a ScsiTarget, cdb: &'a [u8]) -> Plan<'a> {
        Plan { target, lun: self.lun, cdb, found: self.found }
    }
}

impl ScsiTarget {
    /// Look `cdb` up once, for `lun`; ask the plan the rest.
    pub fn plan<'a>(&'a self, lun: u64, cdb: &'a [u8]) -> Plan<'a> {
        Plan {
            target: self,
            lun: self.lun(lun),
            cdb,
            found: commands::lookup(cdb),
        }
    }

    /// [`ScsiTarget::plan`] with the LUN looked up through a connection's
    /// `cache` (see [`LunCache`]): the same plan, one table load fewer per
    /// command while the connection keeps using one LUN.
    pub fn plan_cached<'a>(&'a self, cache: &mut LunCache, lun: u64, cdb: &'a [u8]) -> Plan<'a> {
        Plan {
            target: self,
            lun: self.lun_cached(cache, lun),
            cdb,
            found: commands::lookup(cdb),
        }
    }
}

impl<'a> Plan<'a> {
    /// What the plan found, without its borrows (see [`Planned`]).
    pub fn detach(self) -> Planned {
        Planned { lun: self.lun, found: self.found }
    }

    /// The command's row, if supported and the CDB is long enough for it.
    fn row(&self) -> Option<&'static commands::Command> {
        match self.found {
            Lookup::Found(c) if self.cdb.len() >= c.cdb_len() => Some(c),
            _ => None,
        }
    }

    /// Where the transport should run the command (see [`Execution`]);
    /// unknown commands fail at once, so inline.
    pub fn execution(&self) -> Execution {
        match self.found {
            Lookup::Found(c) => c.execution,
            _ => Execution::Inline,
        }
    }

    /// How many data-out bytes the CDB transfers (so the transport can
    /// solicit them), or `None` if it is not a data-out command (or the CDB
    /// is too short to tell).
    pub fn data_out_len(&self) -> Option<usize> {
        self.row()?.transfer.data_out(self.cdb)
    }

    /// What backs the LUN (the transport decides from it where to run
    /// commands), or `None` if no such LUN.
    pub fn device(&self) -> Option<&bw_block::DeviceInfo> {
        self.lun.as_deref().map(|l| l.volume.info())
    }

    /// The LUN's volume, or `None` if no such LUN.
    pub fn volume(&self) -> Option<&Volume> {
        self.lun.as_deref().map(|l| &l.volume)
    }

    /// The LUN, when the command is the plain fast case: a supported row
    /// with a full CDB, no NACA/LINK, and no unit attention, reservation or
    /// ALUA refusal that the general path must report.
    fn plain(&self) -> Option<(&'static commands::Command, &Lun)> {
        let c = self.row()?;
        if naca_or_link(self.cdb, c.cdb_len()) {
            return None;
        }
        let l = self.lun.as_deref()?;
        if l.ua.active() || l.res.held() || self.target.alua_state(l).refusal().is_some() {
            return None;
        }
        Some((c, l))
    }

    /// For a READ: check it and return the byte range the transport reads
    /// or sends itself; anything that is not the plain fast case comes back
    /// as [`ReadPlan::Buffered`] with no side effect.
    pub fn read(&self) -> ReadPlan {
        let Some((c, l)) = self.plain() else {
            return ReadPlan::Buffered;
        };
        if !c.reads_medium() {
            return ReadPlan::Buffered;
        }
        match l.read_range(self.cdb) {
            Ok((_, 0)) => ReadPlan::Buffered,
            Ok((offset, len)) => ReadPlan::Range {
                volume: l.volume.clone(),
                offset,
                len,
            },
            Err(s) => ReadPlan::Done(ScsiOutcome::check(s)),
        }
    }

    /// For a plain READ or WRITE: check it and return the one request that
    /// carries it out, for a transport that starts requests itself and
    /// completes them later ([`bw_block::DeviceInfo::async_submit`]
    /// backends). A WRITE's request takes the whole blocks of `data_out`
    /// the CDB transfers, as [`Plan::execute`] would write. Anything that
    /// is not the plain fast case comes back as [`IoPlan::Buffered`] with no
    /// side effect.
    pub fn io(&self, data_out: &[bytes::Bytes]) -> IoPlan {
        let Some((c, l)) = self.plain() else {
            return IoPlan::Buffered;
        };
        let write = matches!(
            field::OPERATION_CODE.get(self.cdb),
            op::WRITE_6 | op::WRITE_10 | op::WRITE_12 | op::WRITE_16
        );
        if !write && !c.reads_medium() {
            return IoPlan::Buffered;
        }
        let r = if write {
            l.write_request(self.cdb, data_out)
        } else {
            l.read_request(self.cdb)
        };
        match r {
            Ok(Some(request)) => IoPlan::Submit {
                volume: l.volume.clone(),
                request,
            },
            Ok(None) => IoPlan::Buffered,
            Err(s) => IoPlan::Done(ScsiOutcome::check(s)),
        }
    }

    /// For a plain WRITE (6/10/12/16) run on the caller's thread: check it
    /// and write the whole blocks of `data_out` the CDB transfers, as
    /// [`Plan::execute`] would, but without the general path's checks for
    /// every command and its slices of the pieces (~250 instructions of a
    /// 4 KiB write: docs/notes/2026-11-27-h51y-iscsi-writes.md). The
    /// outcome and the data-out length the CDB transfers (for the
    /// residual); `None`: not the plain case (another command, a pending
    /// unit attention, reservation or ALUA refusal), nothing was done: run
    /// it with [`Plan::execute`].
    pub fn write<P: AsRef<[u8]>>(&self, data_out: &[P]) -> Option<(ScsiOutcome, usize)> {
        let (_, l) = self.plain()?;
        let write = matches!(
            field::OPERATION_CODE.get(self.cdb),
            op::WRITE_6 | op::WRITE_10 | op::WRITE_12 | op::WRITE_16
        );
        if !write {
            return None;
        }
        // The rows' `Out(Len::Blocks)`, without the table's indirection.
        let wanted = (crate::block_io::lba_and_len(self.cdb).1 as usize).saturating_mul(crate::block_io::BLOCK);
        let r = l.write_pieces(self.cdb, data_out, false).map_err(Fail::from);
        Some((ScsiOutcome::from_result(r), wanted))
    }

    /// Execute the command as a transport receives it (SAM-5 Execute
    /// Command): `data_out` in the pieces that arrived, `buffer_size` the
    /// data-out length the initiator announced (iSCSI's expected data
    /// transfer length). Data beyond what the CDB transfers is cut off,
    /// except for the commands whose row says an excess is an invalid
    /// request ([`commands::Transfer::OutNoExcess`]). Also returns the
    /// data-out length the CDB transfers, for the transport's residuals
    /// (`None`: not a data-out command).
    pub fn execute(
        &self,
        nexus: NexusId,
        data_out: &[&[u8]],
        buffer_size: usize,
        data_in: &mut Vec<u8>,
    ) -> (ScsiOutcome, Option<usize>) {
        let row = self.row();
        let Some(wanted) = self.data_out_len() else {
            return (self.run(nexus, &[], data_in), None);
        };
        if matches!(row.map(|c| c.transfer), Some(Transfer::OutNoExcess(_))) && buffer_size > wanted
        {
            data_in.clear();
            return (
                ScsiOutcome::check(Sense::INVALID_FIELD_IN_CDB),
                Some(wanted),
            );
        }
        // The pieces received, cut to what the CDB transfers.
        let mut pieces: smallvec::SmallVec<[&[u8]; 4]> = smallvec::SmallVec::with_capacity(data_out.len());
        let mut left = wanted;
        for p in data_out {
            let k = p.len().min(left);
            if k > 0 {
                pieces.push(&p[..k]);
            }
            left -= k;
        }
        (self.run(nexus, &pieces, data_in), Some(wanted))
    }

    /// Run the command with `data_out` as given; `data_in` is cleared on
    /// failure.
    pub(crate) fn run(
        &self,
        nexus: NexusId,
        data_out: &[&[u8]],
        data_in: &mut Vec<u8>,
    ) -> ScsiOutcome {
        let r = self
            .target
            .run(nexus, self.lun.as_deref(), self.found, self.cdb, data_out, data_in);
        if r.is_err() {
            data_in.clear();
        }
        ScsiOutcome::from_result(r)
    }
}

/// Running commands: what reads the command table sits above the handlers
/// it names (and the target and LUN state they use, in lib.rs).
impl ScsiTarget {
    /// Execute one command.
    ///
    /// `data_out` is the data the initiator sent; it may be shorter or longer
    /// than the CDB asks for (WRITE writes the whole blocks received and
    /// ignores excess; parameter lists that are cut short fail). `data_in` is
    /// cleared and filled with the data the command returns, already cut to
    /// the CDB's allocation length; the transport truncates it further to the
    /// expected transfer length and computes residuals.
    pub fn execute(&self, nexus: NexusId, lun: u64, cdb: &[u8], data_out: &[u8], data_in: &mut Vec<u8>) -> ScsiOutcome {
        self.execute_pieces(nexus, lun, cdb, &[data_out], data_in)
    }

    /// [`ScsiTarget::execute`] with the data-out in consecutive pieces, as
    /// a transport receives it: plain WRITEs write each piece where it
    /// lands; other commands get the pieces joined into one buffer.
    pub fn execute_pieces(&self, nexus: NexusId, lun: u64, cdb: &[u8], data_out: &[&[u8]], data_in: &mut Vec<u8>) -> ScsiOutcome {
        self.plan(lun, cdb).run(nexus, data_out, data_in)
    }

    /// Run one command through the checks every command gets, in SAM-5 /
    /// SPC-4 order, then its handler; everything command specific comes
    /// from its row in [`commands::COMMANDS`].
    fn run(&self, nexus: NexusId, lun: Option<&Lun>, found: Lookup, cdb: &[u8], data_out: &[&[u8]], out: &mut Vec<u8>) -> Result<(), Fail> {
        let Some(&opcode) = cdb.first() else { return Err(Sense::INVALID_OPCODE.into()) };
        let row = match found {
            Lookup::Found(c) | Lookup::UnknownServiceAction { like: c } => Some(c),
            Lookup::UnknownOpcode => None,
        };
        let len = row.map_or(commands::group_cdb_len(opcode), |c| c.cdb_len());
        if cdb.len() < len {
            return Err(Sense::invalid_in_cdb(field::OPERATION_CODE).into());
        }
        out.clear();
        let call = Call { target: self, nexus, cdb, data_out };
        let Some(l) = lun else {
            // Only INQUIRY, REPORT LUNS and REQUEST SENSE answer for a LUN
            // that is not mapped.
            return match found {
                Lookup::Found(c @ commands::Command { handler: Handler::AnyLun(h), .. }) => {
                    h(&call, None, out)?;
                    truncate_data_in(c, cdb, out);
                    Ok(())
                }
                _ => Err(Sense::LUN_NOT_SUPPORTED.into()),
            };
        };
        alua::permits(self.alua_state(l), row.map_or(commands::AluaAccess::ActiveOnly, |c| c.alua))?;
        let Some(row) = row else { return Err(Sense::INVALID_OPCODE.into()) };
        if naca_or_link(cdb, len) {
            return Err(Sense::invalid_cdb_field(len as u16 - 1, None).into());
        }
        // Unit attentions and reservations: one atomic load each unless
        // something is pending.
        if l.ua.active() || l.res.held() {
            let who = self.identity(nexus);
            if !row.any_lun() {
                if let Some(s) = l.ua.take(who) {
                    return Err(s.into());
                }
            }
            let conflict = match found {
                Lookup::Found(c) => c.conflict.of(cdb),
                _ => commands::unknown_service_action_conflict(opcode),
            };
            l.res.check(who, &self.pr_who(nexus, l), conflict)?;
        }
        let Lookup::Found(row) = found else { return Err(Sense::invalid_in_cdb(field::SERVICE_ACTION).into()) };
        match row.handler {
            Handler::Lun(h) => h(&call, l, out)?,
            Handler::AnyLun(h) => h(&call, Some(l), out)?,
        }
        truncate_data_in(row, cdb, out);
        Ok(())
    }
}

/// Cut a data-in answer to the allocation length its row names.
fn truncate_data_in(c: &commands::Command, cdb: &[u8], out: &mut Vec<u8>) {
    if let Transfer::In(len) = c.transfer {
        if let Some(n) = len.of(cdb) {
            truncate_to(out, n);
        }
    }
}
