//! The accept loop both TCP front-ends (iSCSI, NVMe/TCP) share: admission
//! limits, one thread with a single-threaded runtime per logged-in
//! connection (or a task on the shared runtime), and shutdown.
//!
//! Every connection logs in as a task on the shared runtime, so a socket
//! that never logs in costs its descriptor and a little memory, no thread.
//! With [`Threading::ThreadPerConnection`] the front-end calls
//! [`Ticket::own_thread`] once the login is done: the connection's future,
//! with everything it owns, moves to a new thread and its socket is
//! registered with that thread's runtime.

use crate::limits::{Admission, Mover, Ticket};
use crate::Shutdown;
use bw_net::tcp::{self, CongestionPlan};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::JoinHandle;

/// The listen backlog asked for (the kernel caps it at net.core.somaxconn,
/// 4096 by default). With `TcpListener::bind`'s 128 (as `ss` showed it), a
/// burst of connects overflowed it while the accept loop started
/// connections, and every connect whose SYN was dropped waited a second for
/// the retransmit (27 of a 4,000-socket flood, a legitimate login among
/// them if it came then).
const LISTEN_BACKLOG: u32 = 4096;

/// A listening socket for a front-end, with [`LISTEN_BACKLOG`] and the
/// congestion control its connections start with (see [`CongestionPlan`]).
pub fn listen(addr: SocketAddr, congestion: &CongestionPlan) -> std::io::Result<TcpListener> {
    let s = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    s.set_reuseaddr(true)?;
    if let Some(cc) = congestion.on_listener(&s)? {
        log::debug!("listening on {addr} with TCP congestion control {cc}");
    }
    s.bind(addr)?;
    s.listen(LISTEN_BACKLOG)
}

/// Where connections run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threading {
    /// Each logged-in connection gets its own thread with a single-threaded
    /// runtime (it logs in on the shared runtime): the thread that waits
    /// for the socket also runs the command and writes the answer, so a
    /// request costs one wakeup and no cross-thread hand-offs. On the shared work-stealing runtime a connection's task
    /// and the I/O driver that wakes it can sit on different workers and
    /// move between them from run to run (this made NVMe/TCP 1 MiB reads
    /// swing by 2x between otherwise identical runs).
    ThreadPerConnection,
    /// Tasks on the shared runtime (for measuring the difference).
    SharedRuntime,
}

/// One admitted connection, handed to the front-end.
pub struct Accepted {
    /// Registered with the runtime the connection runs on.
    pub stream: TcpStream,
    pub peer: SocketAddr,
    /// The address the connection arrived on.
    pub local: Option<SocketAddr>,
    /// Holds the connection's place in the admission limits until dropped.
    pub ticket: Ticket,
    pub shutdown: Shutdown,
}

/// A front-end's accept side.
pub struct Acceptor {
    /// For log lines ("iSCSI", "NVMe/TCP").
    pub name: &'static str,
    /// Name of the per-connection threads ("iscsi-conn").
    pub thread_name: &'static str,
    pub admission: Arc<Admission>,
    pub threading: Threading,
    /// The congestion control of accepted connections (the listeners were
    /// made with the same plan).
    pub congestion: CongestionPlan,
}

impl Acceptor {
    /// Accept on every listener until shutdown, handing each admitted
    /// connection to `serve`. The returned task ends when every listener
    /// has stopped accepting; connections end on their own (they watch
    /// `shutdown` too).
    pub fn run<S, F>(
        self,
        listeners: Vec<TcpListener>,
        shutdown: Shutdown,
        serve: S,
    ) -> JoinHandle<()>
    where
        S: Fn(Accepted) -> F + Send + Sync + 'static,
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let this = Arc::new(self);
        let serve = Arc::new(serve);
        let loops: Vec<JoinHandle<()>> = listeners.into_iter().map(|l| this.accept_on(l, shutdown.clone(), serve.clone())).collect();
        tokio::spawn(async move {
            for l in loops {
                let _ = l.await;
            }
        })
    }

    /// Accept on one listener until `shutdown` (a listener added while
    /// serving gets its own, to be stopped alone).
    pub fn accept_on<S, F>(self: &Arc<Self>, l: TcpListener, shutdown: Shutdown, serve: Arc<S>) -> JoinHandle<()>
    where
        S: Fn(Accepted) -> F + Send + Sync + 'static,
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        tokio::spawn(self.clone().accept_loop(l, shutdown, serve))
    }

    async fn accept_loop<S, F>(
        self: Arc<Self>,
        l: TcpListener,
        mut shutdown: Shutdown,
        serve: Arc<S>,
    ) where
        S: Fn(Accepted) -> F + Send + Sync + 'static,
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        loop {
            tokio::select! {
                _ = shutdown.wait() => return,
                r = l.accept() => match r {
                    Ok((stream, peer)) => {
                        let ticket = match self.admission.admit(peer.ip()) {
                            Ok(t) => t,
                            Err(why) => {
                                log::warn!("{}: connection from {peer} refused: {why}", self.name);
                                continue;
                            }
                        };
                        let _ = stream.set_nodelay(true);
                        let local = stream.local_addr().ok();
                        let same_host = tcp::is_same_host(peer.ip(), local.map(|l| l.ip()));
                        match self.congestion.on_accepted(&stream, same_host) {
                            Ok(Some(cc)) => log::debug!("{}: {peer}: TCP congestion control {cc}", self.name),
                            Ok(None) => {}
                            Err(e) => log::warn!("{}: {peer}: {e}", self.name),
                        }
                        if let Err(e) = self.start(stream, peer, local, ticket, shutdown.clone(), serve.clone()) {
                            log::warn!("{}: cannot start the connection from {peer}: {e:#}", self.name);
                        }
                    }
                    Err(e) => {
                        log::warn!("{}: accept failed: {e}", self.name);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        }
    }

    fn start<S, F>(
        &self,
        stream: TcpStream,
        peer: SocketAddr,
        local: Option<SocketAddr>,
        mut ticket: Ticket,
        shutdown: Shutdown,
        serve: Arc<S>,
    ) -> anyhow::Result<()>
    where
        S: Fn(Accepted) -> F + Send + Sync + 'static,
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let name = self.name;
        let mover = match self.threading {
            Threading::SharedRuntime => None,
            Threading::ThreadPerConnection => Some(Mover::default()),
        };
        let asked = mover.as_ref().map(|m| m.asked.clone());
        ticket.mover = mover;
        let run = async move {
            if let Err(e) = serve(Accepted { stream, peer, local, ticket, shutdown }).await {
                log::info!("{name}: connection from {peer} ended: {e:#}");
            }
        };
        match asked {
            None => {
                tokio::spawn(run);
            }
            Some(asked) => {
                tokio::spawn(Movable { run: Some(Box::pin(run)), asked, name, thread_name: self.thread_name, peer });
            }
        }
        Ok(())
    }
}

impl Ticket {
    /// The login is done: with [`Threading::ThreadPerConnection`] continue
    /// on a thread of its own with a single-threaded runtime, the socket
    /// registered there. Nothing that belongs to the shared runtime (its
    /// timers, sockets) may be held across this call. Once per connection;
    /// later calls, and [`Threading::SharedRuntime`], change nothing.
    pub async fn own_thread(&mut self, stream: TcpStream) -> std::io::Result<TcpStream> {
        let Some(mover) = self.mover.take() else { return Ok(stream) };
        let stream = stream.into_std()?;
        MoveNow { asked: &mover.asked }.await;
        TcpStream::from_std(stream)
    }
}

/// Pending once, asking to be moved; ready when polled again (on the new
/// thread).
struct MoveNow<'a> {
    asked: &'a AtomicBool,
}

impl Future for MoveNow<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        if self.asked.swap(true, Ordering::AcqRel) {
            Poll::Ready(())
        } else {
            // No waker: `Movable` moves the future as soon as this returns.
            Poll::Pending
        }
    }
}

/// A connection's future on the shared runtime until it asks to move
/// ([`MoveNow`]); then it goes, as it is, to a new thread that runs it to
/// the end.
struct Movable {
    run: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    asked: Arc<AtomicBool>,
    name: &'static str,
    thread_name: &'static str,
    peer: SocketAddr,
}

impl Future for Movable {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(run) = self.run.as_mut() else { return Poll::Ready(()) };
        if run.as_mut().poll(cx).is_ready() {
            return Poll::Ready(());
        }
        if !self.asked.load(Ordering::Acquire) {
            return Poll::Pending;
        }
        let Some(run) = self.run.take() else { return Poll::Ready(()) };
        let (name, peer) = (self.name, self.peer);
        let started = tokio::runtime::Builder::new_current_thread().enable_all().build().and_then(|rt| {
            std::thread::Builder::new().name(self.thread_name.into()).spawn(move || rt.block_on(run))
        });
        if let Err(e) = started {
            // The future (and the connection with it) was dropped.
            log::warn!("{name}: no thread for the connection from {peer}: {e}");
        }
        Poll::Ready(())
    }
}
