//! One NVMe over Fabrics queue in serve, whichever transport carries it:
//! the transport's protocol state machine (NVMe/TCP's `TargetQueue`,
//! NVMe/RDMA's `RdmaQueue`, both around `bw_nvme::fabric_queue`), its
//! place in a controller ([`Link`]), and the work every transport does
//! alike with what the state machine hands out ([`Action`]): Connect and
//! the login's bookkeeping (admission ticket, queue ID, controller
//! teardown), DH-HMAC-CHAP's fresh randomness, admin commands,
//! asynchronous events, and an I/O command's resolution, accounting and
//! completion.
//!
//! A transport ([`Transport`]) supplies only its I/O: where completions
//! and result data go (TCP: PDUs appended to the connection's send
//! buffer; RDMA: WRITEs and SENDs to post) and where a resolved I/O
//! command runs (TCP: on the connection's task, the blocking pool or the
//! backend's thread, a read's data gathered behind its PDU headers; RDMA:
//! on the queue's thread). Bytes in, bytes out and the socket or queue
//! pair stay with the transport (`tcp.rs`, `rdma.rs`), so a layer under
//! one transport's I/O (TLS records under NVMe/TCP) changes nothing here.

use super::link::Link;
use crate::limits::Ticket;
use crate::metrics::IoTimer;
use bw_nvme::auth::Entropy;
use bw_nvme::fabric_queue::{Action, Connected};
use bw_nvme::fabrics::{Connect, ConnectData};
use bw_nvme::nvm_io::{self as io, Host, IoDone, Resolved};
use bw_nvme::queue_entry::Sqe;
use bw_nvme::{Status, Subsystem};
use bytes::Bytes;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::watch;

/// What a transport supplies to [`Queue`]: its queue state machine's
/// calls, each with the transport's own output (send buffer, posts).
pub trait Transport: Sized {
    /// Why the transport's queue closes (its framing's errors and the
    /// fabric core's).
    type Error: std::error::Error + Send + Sync + 'static;
    /// Controllers whose admin queue is on this transport take keyed SGL
    /// data blocks (host memory named by address and key: RDMA's), which
    /// Identify Controller reports.
    const KEYED_SGLS: bool;
    /// Queue ID (0 before the Connect, unless the transport set it up).
    fn qid(&self) -> u16;
    /// Where the host reached us, for the discovery log of a wildcard
    /// listener; `None` where the transport does not know.
    fn local(&self) -> Option<SocketAddr>;
    /// The host's address, for `session_list`.
    fn peer(&self) -> Option<SocketAddr>;
    /// The TLS session the queue runs over (NVMe/TCP with a PSK): a
    /// Connect must be its PSK identity's host's, to its subsystem.
    fn tls(&self) -> Option<&super::tls::Secured> {
        None
    }
    /// See `FabricQueue::connected`.
    fn connected(&mut self, cid: u16, c: Connected, now: Instant);
    /// See `FabricQueue::connect_refused`.
    fn connect_refused(&mut self, cid: u16, status: Status, result: u64);
    /// See `FabricQueue::auth_send`.
    fn auth_send(&mut self, sqe: &Sqe, data: &[u8], entropy: Entropy) -> Option<Action<Self::Error>>;
    /// A command is over: its result data, if any, and its completion go
    /// to the host.
    fn complete(&mut self, cid: u16, status: Status, result: u64, data: Option<Bytes>);
    /// Run an I/O command [`Queue`] resolved and started the clock of; it
    /// ends in [`Queue::finished`] (here or, for a command run elsewhere,
    /// when its result comes back).
    fn run(q: &mut Queue<Self>, io: Io);
}

/// An I/O command resolved against its controller's subsystem as it is
/// now (row, namespace, extent: once), for [`Transport::run`].
pub struct Io {
    pub sqe: Sqe,
    pub data: Bytes,
    pub sub: Arc<Subsystem>,
    pub host: Arc<Host>,
    pub r: Resolved,
    /// A read's or write's timer, from [`Queue::now`].
    pub timer: Option<IoTimer>,
}

/// A command that finished, here or elsewhere (the blocking pool, a
/// backend's own thread).
pub struct Finished {
    pub cid: u16,
    pub done: IoDone,
    /// A read or write, counted when it completes.
    pub io: Option<IoTimer>,
}

/// One queue (one TCP connection, one RDMA queue pair): see the module
/// comment.
pub struct Queue<T: Transport> {
    pub link: Link,
    /// The transport's queue state machine and I/O.
    pub t: T,
    /// When the transport took the work being handled: I/O timers start
    /// there (one clock read per batch of commands on TCP).
    pub now: Instant,
    /// The controller's teardown, from Connect on.
    kill: Option<watch::Receiver<bool>>,
    /// This connection's place in its front-end's admission limits,
    /// among the logins pending until the queue's login is over.
    pub ticket: Ticket,
}

impl<T: Transport> Queue<T> {
    pub fn new(link: Link, t: T, ticket: Ticket) -> Queue<T> {
        Queue { link, t, now: Instant::now(), kill: None, ticket }
    }

    /// The controller was torn down: the queue must close.
    pub fn killed(&self) -> bool {
        self.kill.as_ref().is_some_and(torn_down)
    }

    /// What becomes true when the controller is torn down (`None` before
    /// Connect: nothing to wait for).
    pub fn kill_signal(&self) -> Option<watch::Receiver<bool>> {
        self.kill.clone()
    }

    /// Carry out what the queue's state machine asks for; `Some` ends the
    /// queue (the transport sends what was queued first).
    pub fn act(&mut self, a: Action<T::Error>) -> Option<anyhow::Result<()>> {
        match a {
            Action::Close(None) => return Some(Ok(())),
            // A failed authentication ends this queue alone: whoever failed
            // may not be the host that owns the controller. (An admin
            // queue's controller goes with it, at teardown.)
            Action::Close(Some(e)) => {
                self.link.closing_with_error();
                return Some(Err(e.into()));
            }
            Action::Authenticated => return self.log_in().err().map(Err),
            Action::AuthSend { sqe, data } => return self.auth_send(sqe, data),
            Action::Connect { cid, connect, data } => self.connect(cid, connect, data),
            Action::Admin { sqe, data } => {
                if let Some(c) = self.link.admin(&sqe, &data) {
                    self.complete_cmd(c.cid, c.status, c.result, c.data);
                }
            }
            Action::Io { sqe, data } => self.io(sqe, data),
        }
        None
    }

    #[inline]
    pub fn complete_cmd(&mut self, cid: u16, status: Status, result: u64, data: Option<Bytes>) {
        self.t.complete(cid, status, result, data);
    }

    /// The one place a read or write ends, wherever it ran (a transport's
    /// own read path reports to the link and completes on its own).
    pub fn finished(&mut self, f: Finished) {
        self.link.io_done(f.io, f.done.status == Status::SUCCESS);
        self.complete_cmd(f.cid, f.done.status, 0, f.done.data);
    }

    /// Complete the AERs a live change answered (admin queue).
    pub fn send_events(&mut self) {
        for c in self.link.events(self.t.qid()) {
            self.complete_cmd(c.cid, c.status, c.result, c.data);
        }
    }

    /// Teardown: an admin queue takes its controller with it.
    pub fn close(&mut self) {
        self.link.close(self.t.qid());
    }

    fn connect(&mut self, cid: u16, c: Connect, d: ConnectData) {
        if let Err(why) = self.t.tls().map_or(Ok(()), |t| t.check_connect(&d.hostnqn, &d.subnqn)) {
            log::warn!("{}: {}: {why}: refused", self.link.transport, self.link.peer);
            crate::metrics::global().tls_refused();
            return self.t.connect_refused(cid, Status::CONNECT_INVALID_HOST, bw_nvme::fabrics::ipo_data(bw_nvme::fabrics::CD_HOSTNQN));
        }
        match self.link.connect(&c, &d, self.t.local(), self.t.peer()) {
            Ok(done) => {
                if let Some(e) = &self.link.ctrl {
                    if c.qid == 0 && T::KEYED_SGLS {
                        e.ctrl.lock().unwrap_or_else(|p| p.into_inner()).set_keyed_sgls(true);
                    }
                    if let (0, Some(t)) = (c.qid, self.t.tls()) {
                        // `session_list` says the admin queue's.
                        let _ = e.tls.set(t.describe());
                    }
                    self.kill = Some(kill_watch(e.killed()));
                }
                if self.link.logged_in {
                    self.ticket.logged_in();
                }
                self.t.connected(cid, done, Instant::now());
            }
            Err(r) => self.t.connect_refused(cid, r.status, r.result),
        }
    }

    /// The host has authenticated: the queue's login is over.
    fn log_in(&mut self) -> anyhow::Result<()> {
        self.link.log_in(self.t.qid()).map_err(anyhow::Error::msg)?;
        self.ticket.logged_in();
        Ok(())
    }

    /// Auth Send: the queue's DH-HMAC-CHAP step with fresh randomness.
    fn auth_send(&mut self, sqe: Sqe, data: Bytes) -> Option<anyhow::Result<()>> {
        match Entropy::from_os(&self.link.fabric.host_keys.seq) {
            Ok(e) => {
                let a = self.t.auth_send(&sqe, &data, e)?;
                self.act(a)
            }
            Err(e) => {
                log::error!("{}: {}: no random numbers from the OS: {e}", self.link.transport, self.link.peer);
                self.complete_cmd(sqe.cid(), Status::INTERNAL, 0, None);
                None
            }
        }
    }

    /// An I/O command: resolved once (row, namespace, extent), counted,
    /// then run where the transport runs it. (`#[inline]`, as the
    /// transports' `run`: one function from the action to the send buffer,
    /// as before the wrapper, instead of the command moved between three.)
    #[inline]
    fn io(&mut self, sqe: Sqe, data: Bytes) {
        let cid = sqe.cid();
        let (Some(sub), Some(host)) = (self.link.subsystem().cloned(), self.link.ctrl.as_ref().map(|e| e.host.clone())) else {
            return self.complete_cmd(cid, Status::INVALID_OPCODE.dnr(), 0, None);
        };
        match io::resolve(&sub, &host, &sqe) {
            Ok(r) => {
                let timer = self.link.io_started(&sqe, r.namespace(&sub).map(|n| &n.volume), self.now);
                T::run(self, Io { sqe, data, sub, host, r, timer });
            }
            Err(status) => {
                // Counted as the volume's failed I/O where there is one.
                let timer = self.link.io_started(&sqe, sub.namespace(sqe.nsid()).map(|n| &n.volume), self.now);
                self.finished(Finished { cid, done: IoDone { status, data: None }, io: timer });
            }
        }
    }
}

/// A queue's receiver of its controller's teardown flag, for [`torn_down`]:
/// a flag already set when the queue subscribed counts as a change.
fn kill_watch(mut k: watch::Receiver<bool>) -> watch::Receiver<bool> {
    if *k.borrow() {
        k.mark_changed();
    }
    k
}

/// Whether the flag of [`kill_watch`] is set. Asked per PDU: the watch's
/// version is read first, without the lock its value is behind, and the
/// value only once the version changed (or the sender is gone): 12-25
/// instructions per PDU less (docs/notes/2026-11-27-h51t-nvme-target.md).
fn torn_down(k: &watch::Receiver<bool>) -> bool {
    k.has_changed().unwrap_or(true) && *k.borrow()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The teardown flag is seen whenever it was set: before or after the
    /// queue subscribed, and with its sender gone; never when unset.
    #[test]
    fn the_teardown_flag_is_seen_whenever_it_was_set() {
        let (tx, rx) = watch::channel(false);
        let k = kill_watch(rx);
        assert!(!torn_down(&k));
        tx.send_replace(true);
        assert!(torn_down(&k), "set after subscribing");
        assert!(torn_down(&k), "and still");
        let late = kill_watch(tx.subscribe());
        assert!(torn_down(&late), "set before subscribing");
        drop(tx);
        assert!(torn_down(&k) && torn_down(&late), "sender gone");
        let (tx, rx) = watch::channel(false);
        let k = kill_watch(rx);
        tx.send_replace(false);
        assert!(!torn_down(&k), "a change to false");
        drop(tx);
        assert!(!torn_down(&k), "gone, never set");
    }
}
