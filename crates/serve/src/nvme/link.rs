//! What a queue of either NVMe transport holds of its controller: Connect
//! (create or join a controller, authenticate or log in), the login's
//! bookkeeping (queue ID, metrics, stats), admin commands, asynchronous
//! events, I/O accounting, and teardown. The queue wrapper (`queue.rs`)
//! drives it from what the queue's state machine hands out.

use super::fabric::{CtrlEntry, Fabric, Refusal};
use crate::metrics::{self, IoTimer, Meter, Op};
use crate::session::SessionStats;
use bw_nvme::auth::ControllerAuth;
use bw_nvme::controller::{AdminOutcome, Completion};
use bw_nvme::fabrics::{self, Connect, ConnectData};
use bw_nvme::queue_entry::{nvm, Sqe};
use bw_nvme::fabric_queue::Connected;
use bw_nvme::Status;
use bytes::Bytes;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

/// One queue's place in its controller (see the module comment).
pub struct Link {
    pub fabric: Arc<Fabric>,
    /// For logs: "nvme" or "nvme-rdma", and the host's address.
    pub transport: &'static str,
    pub peer: String,
    pub ctrl: Option<Arc<CtrlEntry>>,
    /// This I/O queue holds its queue ID in `ctrl` (from its login on).
    holds_qid: bool,
    /// Connected and, where the host must, authenticated.
    pub logged_in: bool,
    /// This queue's reads and writes (also listed in its controller).
    stats: Arc<SessionStats>,
    meter: Meter,
    /// This queue's place in the target's session and connection counts.
    counted: Option<metrics::SessionGuard>,
    /// The subsystem as loaded by the first I/O command of the batch being
    /// handled, until [`Link::timed`] ends the batch (see
    /// [`Link::subsystem`]).
    batch_subsystem: Option<Arc<bw_nvme::Subsystem>>,
}

impl Link {
    pub fn new(fabric: Arc<Fabric>, transport: &'static str, peer: String) -> Link {
        Link {
            fabric,
            transport,
            peer,
            ctrl: None,
            holds_qid: false,
            logged_in: false,
            stats: Arc::default(),
            meter: Meter::new(metrics::Proto::Nvme),
            counted: None,
            batch_subsystem: None,
        }
    }

    /// Create (queue 0) or join a controller for a Connect the queue's
    /// checks let through. Without credentials to check, the queue logs in
    /// at once; otherwise when the host has authenticated.
    pub fn connect(&mut self, c: &Connect, d: &ConnectData, local: Option<SocketAddr>, peer: Option<SocketAddr>) -> Result<Connected, Refusal> {
        let r = if c.qid == 0 {
            self.fabric.connect_admin(c, d, local, peer)
        } else {
            self.fabric.connect_io(c, d)
        };
        let e = match r {
            Ok(e) => e,
            Err(r) => {
                if r.status == Status::CONNECT_INVALID_HOST.dnr() {
                    // Only a configured subsystem gets this far: a bounded label.
                    metrics::global().auth_failure(metrics::Proto::Nvme, &d.subnqn, &d.hostnqn);
                }
                log::info!("{}: {}: Connect (qid {}) refused: {}", self.transport, self.peer, c.qid, r.status);
                return Err(r);
            }
        };
        // With SQ flow control off, a successful read completes with its
        // last C2HData PDU (SUCCESS flag) and no response capsule.
        let sqflow = if c.cattr & fabrics::CATTR_DISABLE_SQFLOW != 0 { ", SQ flow control disabled" } else { "" };
        log::debug!("{}: {}: queue {} of controller {} connected (sqsize {}{sqflow})", self.transport, self.peer, c.qid, e.cntlid, c.sqsize);
        // Every queue of a controller whose host has a secret authenticates.
        let auth = e.auth.as_ref().and_then(|a| Some(ControllerAuth::new(a.clone(), &e.hostnqn, &e.subsys.as_ref()?.nqn())));
        let must_authenticate = auth.is_some();
        let done = Connected {
            result: e.cntlid as u64,
            keep_alive: e.keep_alive.clone(),
            subsystem: e.subsys.clone(),
            hostnqn: e.hostnqn.clone(),
            auth,
        };
        self.ctrl = Some(e);
        if !must_authenticate {
            if let Err(why) = self.log_in(c.qid) {
                log::info!("{}: {}: Connect (qid {}) refused: {why}", self.transport, self.peer, c.qid);
                self.ctrl = None;
                return Err(Refusal { status: Status::CONNECT_INVALID_PARAM.dnr(), result: fabrics::ipo_sqe(fabrics::CS_QID) });
            }
        }
        Ok(done)
    }

    /// The queue's login is over: the host is allowed and authenticated
    /// (or needs no credentials). An I/O queue takes its queue ID now.
    pub fn log_in(&mut self, qid: u16) -> Result<(), String> {
        let Some(e) = &self.ctrl else { return Ok(()) };
        if qid > 0 && !self.holds_qid {
            if !e.reserve_queue(qid) {
                return Err(format!("queue {qid} of controller {} is taken", e.cntlid));
            }
            self.holds_qid = true;
            e.stats.lock().unwrap_or_else(|p| p.into_inner()).push(self.stats.clone());
        }
        let kind = if e.is_discovery() { "discovery" } else { "controller" };
        log::debug!("{}: {}: queue {qid} of controller {} logged in ({kind})", self.transport, self.peer, e.cntlid);
        self.logged_in = true;
        let subnqn = e.subsys.as_ref().map_or_else(|| bw_nvme::DISCOVERY_NQN.to_string(), |s| s.nqn());
        self.counted = Some(metrics::global().login(metrics::Proto::Nvme, &subnqn, &e.hostnqn, qid == 0));
        Ok(())
    }

    /// The queue closes with an error: count a failed authentication (a
    /// host that never logged in on a controller that asks for one).
    pub fn closing_with_error(&self) {
        if let Some(c) = self.ctrl.as_ref().filter(|c| !self.logged_in && c.auth.is_some()) {
            let subnqn = c.subsys.as_ref().map(|s| s.nqn()).unwrap_or_default();
            metrics::global().auth_failure(metrics::Proto::Nvme, &subnqn, &c.hostnqn);
        }
    }

    /// Teardown: an admin queue takes its controller with it.
    pub fn close(&mut self, qid: u16) {
        self.timed();
        if let Some(e) = &self.ctrl {
            if qid == 0 {
                self.fabric.remove(e.cntlid, "admin queue closed");
            } else if self.holds_qid {
                e.release_queue(qid);
            }
        }
        self.counted = None;
    }

    /// Run an admin command on the controller; `None` when it completes
    /// later (an Asynchronous Event Request).
    pub fn admin(&self, sqe: &Sqe, data: &Bytes) -> Option<Completion> {
        let Some(e) = &self.ctrl else {
            return Some(Completion { cid: sqe.cid(), status: Status::CMD_SEQ_ERROR, result: 0, data: None });
        };
        match e.ctrl.lock().unwrap_or_else(|p| p.into_inner()).execute_admin(sqe, data, Instant::now()) {
            AdminOutcome::Complete(c) => Some(c),
            _ => None,
        }
    }

    /// The AERs a live change answered (admin queue).
    pub fn events(&self, qid: u16) -> Vec<Completion> {
        match self.ctrl.as_ref().filter(|_| qid == 0) {
            Some(e) => std::mem::take(&mut *e.events.lock().unwrap_or_else(|p| p.into_inner())),
            None => Vec::new(),
        }
    }

    /// The subsystem behind this queue's controller as it was when the
    /// transport's batch of commands (one receive, one poll of completions)
    /// came to its first I/O command; `None` for a discovery controller or
    /// before Connect. Live changes swap the subsystem; every command of a
    /// batch arrived before its load, so one taking effect during the batch
    /// is one taking effect after it. A load per command (arc-swap's debt
    /// list, ~75 instructions per 4 KiB I/O) became one per batch
    /// (docs/notes/2026-11-27-h51t-nvme-target.md); [`Link::timed`] drops it,
    /// so an idle queue holds no removed namespace's volume.
    pub fn subsystem(&mut self) -> Option<&Arc<bw_nvme::Subsystem>> {
        if self.batch_subsystem.is_none() {
            self.batch_subsystem = self.ctrl.as_ref().and_then(|e| e.subsys.as_ref()).map(|s| s.load_full());
        }
        self.batch_subsystem.as_ref()
    }

    /// Count an I/O command in the queue's stats and start its timer (reads
    /// and writes of a volume), which runs from `at`.
    pub fn io_started(&mut self, sqe: &Sqe, volume: Option<&bw_block::Volume>, at: Instant) -> Option<IoTimer> {
        let op = match sqe.opcode() {
            nvm::READ => Op::Read,
            nvm::WRITE => Op::Write,
            _ => return None,
        };
        let len = bw_nvme::nvm_io::transfer_len(sqe);
        self.stats.count(op == Op::Write, len as u64);
        volume.map(|v| self.meter.start_at(v.name(), op, len as usize, at))
    }

    /// A read or write ended: its answer is queued. It is timed and
    /// counted at the next [`Link::timed`], which the transport calls as
    /// it sends a batch of answers (one clock read per batch instead of
    /// one per command: 0.8-0.9% of the TCP target's samples at 4 KiB
    /// QD32, docs/notes/2026-11-26-floor-3.md).
    pub fn io_done(&mut self, timer: Option<IoTimer>, ok: bool) {
        if let Some(t) = timer {
            self.meter.done_later(t, ok);
        }
    }

    /// Time and count the reads and writes that ended since the last call;
    /// the transport's batch of commands is over.
    pub fn timed(&mut self) {
        self.meter.flush();
        self.batch_subsystem = None;
    }
}
