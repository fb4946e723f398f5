//! The one connection driver of the TCP front-ends (iSCSI, NVMe/TCP): it
//! owns the socket and nothing of the protocol. A front-end's per-connection
//! state is a [`Session`] that never touches the socket: the driver hands it
//! the received bytes ([`Session::receive`], one PDU at a time), the results
//! of commands that ran elsewhere ([`Session::complete`]), the passing of
//! time ([`Session::poll_timeout`] / [`Session::handle_timeout`]) and
//! signals from outside the connection; the session queues what it has to
//! say in its [`Outbox`], which the driver sends.
//!
//! One backpressure policy for both protocols:
//! - PDUs already in the receive buffer are handled before the socket is
//!   read again (at high queue depth one read brings many commands);
//! - the answers so far are sent after every [`Knobs::commands_per_send`]
//!   commands taken from the buffer, when set, so that the host works on
//!   them while the target runs the rest (Linux's target has such a budget,
//!   NVMET_TCP_RECV_BUDGET). It is off by default: answering every 8 once
//!   won 183k -> 268k IOPS for NVMe/TCP 4 KiB reads at QD32 with host and
//!   target on separate CPUs (docs/notes/2026-11-22-nvme-tcp-data-path.md),
//!   but measured again on 2026-11-25 it bought nothing there and cost
//!   12-15% more target CPU per I/O, and on the lab's veth link 10-60% more
//!   for iSCSI (docs/notes/2026-11-25-nvme-datapath.md). Never when the host
//!   is on this machine and its packets were last processed on our CPU:
//!   there the two cannot overlap, and each early answer costs two context
//!   switches (297k IOPS answering whole bursts, 238k every 8);
//! - no new PDU is taken while [`OUT_HIGH`] bytes of answers wait in memory
//!   (a host that sends commands but does not read cannot make us buffer
//!   without bound); the socket is then only written;
//! - after [`READS_PER_YIELD`] socket reads in a row the task lets others
//!   on its runtime run.
//!
//! Sending never blocks the handling of PDUs: the driver writes what the
//! socket takes and waits for writability only when it has nothing else to
//! do; over user-space TLS it never waits for the outbox's sealing thread
//! either, which wakes it when its records are ready ([`Outbox::sealed`]).

use crate::framing::FrameReader;
use crate::outbox::Outbox;
use crate::Shutdown;
use bytes::BytesMut;
use std::future::Future;
use std::io;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// Stop taking new PDUs while this much reply data waits in memory.
pub const OUT_HIGH: usize = 4 << 20;
/// Socket reads in a row before the task lets others run.
pub const READS_PER_YIELD: u32 = 32;
/// How long a closing connection may take to send what it queued.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// The `[tuning]` knobs the TCP front-ends share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Knobs {
    /// Largest READ/WRITE copy run on the connection's task (bigger ones go
    /// to the blocking pool); reads sent with sendfile copy nothing.
    pub inline_max: usize,
    /// Smallest READ sent with sendfile from the page cache.
    pub zero_copy_min: usize,
    /// Shorter reads of memory-backed volumes sent from their mapping.
    pub mapped_reads: bool,
    /// Commands taken from the receive buffer before the answers so far are
    /// sent (usize::MAX: the whole buffer first).
    pub commands_per_send: usize,
    /// Where user-space TLS seals large reads (`[tuning] tls_sealing`).
    pub tls_sealing: crate::tuning::TlsSealing,
}

impl From<&crate::tuning::Tuning> for Knobs {
    fn from(t: &crate::tuning::Tuning) -> Knobs {
        Knobs {
            inline_max: t.inline_max,
            zero_copy_min: t.zero_copy_min,
            mapped_reads: t.mapped_reads,
            commands_per_send: t.commands_per_send(),
            tls_sealing: t.tls_sealing,
        }
    }
}

impl Default for Knobs {
    fn default() -> Knobs {
        Knobs::from(&crate::tuning::Tuning::default())
    }
}

/// What one call into a session did.
#[derive(Debug)]
pub enum Step {
    /// No whole PDU in the buffer.
    NeedMore,
    /// A PDU that carried no command (data, a NOP, a login step) was handled.
    Pdu,
    /// A command was taken (it counts towards `commands_per_send`).
    Command,
    /// Send what is queued, then end the connection.
    Close(anyhow::Result<()>),
    /// Give the connection back to the caller, which calls [`run`] again
    /// (NVMe/TCP: the login is over, the queue moves to its own thread).
    Return,
}

/// A front-end's per-connection state, without the socket.
pub trait Session {
    /// A command that finished off the connection's task (the blocking
    /// pool, a backend's own thread), sent back through the channel the
    /// driver waits on.
    type Done: Send + 'static;
    /// Something outside the connection that wants it (see [`Session::signal`]).
    type Signal;
    /// Where the session queues what it sends.
    fn outbox(&mut self) -> &mut Outbox;
    /// Append what the socket holds to `reader` without waiting, as the
    /// protocol's framing wants it; `Ok(0)` at the end of the stream.
    fn fill(&self, reader: &mut FrameReader, stream: &TcpStream) -> io::Result<usize>;
    /// Handle at most one PDU from the front of `buf`.
    fn receive(&mut self, buf: &mut BytesMut, now: Instant) -> Step;
    /// A command finished elsewhere.
    fn complete(&mut self, done: Self::Done);
    /// The next instant [`Session::handle_timeout`] must be called at.
    fn poll_timeout(&self) -> Option<Instant>;
    fn handle_timeout(&mut self, now: Instant) -> Step;
    /// Resolves when something outside the connection wants it (an event
    /// to send, the end of its controller or session). Made afresh each
    /// time the driver waits, so it must be cheap.
    fn signal(&self) -> impl Future<Output = Self::Signal> + Send + 'static;
    fn on_signal(&mut self, s: Self::Signal) -> Step;
    /// The target is shutting down: queue a last word if the protocol has one.
    fn on_shutdown(&mut self) {}
    /// What the outbox holds is about to be sent (a batch is over): a
    /// session that times its I/Os once per batch does it here.
    fn before_send(&mut self) {}
}

/// How [`run`] ended.
#[derive(Debug)]
pub enum Exit {
    /// The connection is over (the session's queued PDUs are still in its
    /// outbox: [`close`] sends them).
    Closed(anyhow::Result<()>),
    /// [`Step::Return`].
    Returned,
}

/// Whether the host's last packets were processed on the CPU this thread
/// runs on. For a host on this machine (loopback) that is the CPU the host
/// sent from (SO_INCOMING_CPU): the host shares our CPU.
fn host_on_our_cpu(stream: &TcpStream) -> bool {
    let mut cpu: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: a valid fd and an int-sized option value.
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_INCOMING_CPU,
            &mut cpu as *mut _ as *mut libc::c_void,
            &mut len,
        )
    };
    // SAFETY: no arguments.
    r == 0 && cpu >= 0 && cpu == unsafe { libc::sched_getcpu() }
}

/// Whether the peer of `stream` runs on this machine (see the module
/// comment: only such a host can share our CPU).
pub fn local_host(stream: &TcpStream) -> bool {
    match (stream.peer_addr(), stream.local_addr()) {
        (Ok(p), l) => bw_net::tcp::is_same_host(p.ip(), l.ok().map(|l| l.ip())),
        _ => false,
    }
}

/// Drive `s` over `stream` until the connection ends or the session asks
/// to be given back.
pub async fn run<S: Session>(
    stream: &TcpStream,
    reader: &mut FrameReader,
    s: &mut S,
    done_rx: &mut mpsc::UnboundedReceiver<S::Done>,
    shutdown: &mut Shutdown,
    knobs: &Knobs,
) -> Exit {
    let local_host = local_host(stream);
    let mut reads_in_a_row = 0;
    loop {
        let stalled = match receive_buffered(s, reader, stream, knobs, local_host) {
            Ok(stalled) => stalled,
            Err(exit) => return exit,
        };
        while let Ok(d) = done_rx.try_recv() {
            s.complete(d);
        }
        s.before_send();
        if let Err(e) = s.outbox().send(stream) {
            return Exit::Closed(Err(e.into()));
        }
        let reading = s.outbox().buffered() < OUT_HIGH;
        if reading && stalled {
            // Room again: the PDUs already buffered come first.
            continue;
        }
        if reading && reads_in_a_row < READS_PER_YIELD {
            match s.fill(reader, stream) {
                Ok(0) => return Exit::Closed(Ok(())),
                Ok(_) => {
                    reads_in_a_row += 1;
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Exit::Closed(Err(e.into())),
            }
        }
        if reads_in_a_row >= READS_PER_YIELD {
            reads_in_a_row = 0;
            tokio::task::yield_now().await;
            continue;
        }
        reads_in_a_row = 0;
        // With user-space TLS the next records may be a helper thread's,
        // still being sealed: then its wake, not the socket's writability,
        // brings the next send (and with no room to read, the socket is
        // not waited on at all).
        let sealed = s.outbox().sealed();
        let interest = match (reading, s.outbox().can_send()) {
            (true, false) => Some(Interest::READABLE),
            (true, true) => Some(Interest::READABLE | Interest::WRITABLE),
            (false, true) => Some(Interest::WRITABLE),
            (false, false) if sealed.is_none() => Some(Interest::WRITABLE),
            (false, false) => None,
        };
        let timeout = s.poll_timeout();
        let far = Instant::now() + Duration::from_secs(3600);
        let signal = s.signal();
        let sealing = sealed.is_some();
        let step = tokio::select! {
            r = stream.ready(interest.unwrap_or(Interest::WRITABLE)), if interest.is_some() => match r {
                Ok(_) => None,
                Err(e) => return Exit::Closed(Err(e.into())),
            },
            _ = async { if let Some(w) = sealed { w.await } }, if sealing => None,
            sig = signal => Some(s.on_signal(sig)),
            Some(d) = done_rx.recv() => {
                s.complete(d);
                None
            }
            _ = shutdown.wait() => {
                s.on_shutdown();
                return Exit::Closed(Ok(()));
            }
            _ = tokio::time::sleep_until(timeout.unwrap_or(far).into()), if timeout.is_some() => {
                Some(s.handle_timeout(Instant::now()))
            }
        };
        match step {
            Some(Step::Close(r)) => return Exit::Closed(r),
            Some(Step::Return) => return Exit::Returned,
            _ => {}
        }
    }
}

/// Handle the PDUs already buffered before touching the socket again, up
/// to the send budget. `Ok(stalled)`: true when the reply backlog or the
/// budget, not a lack of bytes, stopped it; `Err` ends the connection.
/// (Inlined: it is the hot loop's first half, split out only to be named.)
#[inline(always)]
fn receive_buffered<S: Session>(
    s: &mut S,
    reader: &mut FrameReader,
    stream: &TcpStream,
    knobs: &Knobs,
    local_host: bool,
) -> Result<bool, Exit> {
    let now = Instant::now();
    let mut commands = 0;
    let mut budget = knobs.commands_per_send.max(1);
    loop {
        if s.outbox().buffered() >= OUT_HIGH {
            return Ok(true);
        }
        if commands == budget {
            // A host sharing our CPU cannot work while we do: early
            // replies would only wake it to preempt us.
            if local_host && !reader.buf().is_empty() && host_on_our_cpu(stream) {
                budget = usize::MAX;
            } else {
                return Ok(true);
            }
        }
        match s.receive(reader.buf(), now) {
            Step::NeedMore => return Ok(false),
            Step::Pdu => {}
            Step::Command => commands += 1,
            Step::Close(r) => return Err(Exit::Closed(r)),
            Step::Return => return Err(Exit::Returned),
        }
    }
}

/// The end of a connection: send what is still queued (a last completion,
/// a TermReq or Reject, a logout request) within [`CLOSE_GRACE`], then
/// close our side.
pub async fn close(stream: TcpStream, out: &mut Outbox) {
    if tokio::time::timeout(CLOSE_GRACE, out.drain(&stream)).await.is_ok() {
        let mut s = stream;
        let _ = s.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `[tuning] tls_sealing` reaches the connections through the knobs.
    /// (Here, not in tuning.rs's tests: the driver imports tuning, and a
    /// test there naming the driver would close an import cycle.)
    #[test]
    fn the_knobs_carry_the_sealing_placement() {
        let t: crate::tuning::Tuning = toml::from_str("tls_sealing = \"thread\"").unwrap();
        assert_eq!(Knobs::from(&t).tls_sealing, crate::tuning::TlsSealing::Thread, "the connections get it");
        assert_eq!(Knobs::default().tls_sealing, crate::tuning::TlsSealing::Inline);
    }
}
