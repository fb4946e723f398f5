//! RDMA reliable connections over rdma-core (libibverbs and librdmacm):
//! the connection manager (listen, connect request, accept/reject with
//! private data, disconnect), one queue pair with its completion queue, and
//! registered buffers that SEND/RECV and RDMA READ/WRITE work on.
//!
//! Every rdma-core structure is read and written in `src/shim.c` (the post
//! and poll verbs are static inline functions there, so they cannot be
//! linked from Rust); this side holds opaque pointers, owns them, and
//! checks every buffer range before it reaches the device. A [`Queue`] is
//! used by one thread at a time; it waits on its completion channel and its
//! own connection-manager channel with [`Queue::wait`].
//!
//! No RDMA device, no connection: on a machine without one (or without
//! rdma-core's provider for it) [`Listener::bind`] and [`Queue::resolve`]
//! fail with the error librdmacm gives (usually ENODEV or EADDRNOTAVAIL).

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::io;
use std::time::{Duration, Instant};

const PDATA_MAX: usize = 196;

#[repr(C)]
struct RawEvent {
    event: i32,
    status: i32,
    id: *mut c_void,
    listen_id: *mut c_void,
    responder_resources: u8,
    initiator_depth: u8,
    private_data_len: u8,
    private_data: [u8; PDATA_MAX],
}

/// One work completion.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Wc {
    pub wr_id: u64,
    /// `IBV_WC_SUCCESS` (0) or the error.
    pub status: u32,
    pub opcode: u32,
    pub byte_len: u32,
    with_invalidate: u32,
}

/// Work completion opcodes (`enum ibv_wc_opcode`).
pub mod wc_opcode {
    pub const SEND: u32 = 0;
    pub const RDMA_WRITE: u32 = 1;
    pub const RDMA_READ: u32 = 2;
    pub const RECV: u32 = 128;
}

impl Wc {
    pub fn ok(&self) -> bool {
        self.status == 0
    }
    /// The peer's SEND carried an invalidate of one of our keys.
    pub fn with_invalidate(&self) -> bool {
        self.with_invalidate != 0
    }
    /// `ibv_wc_status_str`, for logs.
    pub fn status_str(&self) -> String {
        // SAFETY: returns a static string for any value.
        unsafe { CStr::from_ptr(bw_wc_status_str(self.status as c_int)) }.to_string_lossy().into_owned()
    }
}

#[allow(non_camel_case_types)]
type id_t = *mut c_void;

extern "C" {
    fn bw_channel_create(out: *mut *mut c_void) -> c_int;
    fn bw_channel_destroy(ch: *mut c_void);
    fn bw_channel_fd(ch: *mut c_void) -> c_int;
    fn bw_get_event(ch: *mut c_void, out: *mut RawEvent) -> c_int;
    fn bw_listen(ch: *mut c_void, ip: *const c_char, port: u16, backlog: c_int, out: *mut id_t, bound: *mut u16) -> c_int;
    fn bw_create_id(ch: *mut c_void, out: *mut id_t) -> c_int;
    fn bw_resolve_addr(id: id_t, ip: *const c_char, port: u16, timeout_ms: c_int) -> c_int;
    fn bw_resolve_route(id: id_t, timeout_ms: c_int) -> c_int;
    fn bw_migrate_id(id: id_t, ch: *mut c_void) -> c_int;
    fn bw_destroy_id(id: id_t);
    fn bw_peer_addr(id: id_t, buf: *mut c_char, len: c_int) -> c_int;
    fn bw_queue_create(id: id_t, send_wr: u32, recv_wr: u32, out: *mut *mut c_void) -> c_int;
    fn bw_queue_destroy_qp(q: *mut c_void);
    fn bw_queue_free(q: *mut c_void);
    fn bw_accept(q: *mut c_void, pdata: *const c_void, len: u8, responder: u8, initiator: u8) -> c_int;
    fn bw_connect(q: *mut c_void, pdata: *const c_void, len: u8, responder: u8, initiator: u8) -> c_int;
    fn bw_reject(id: id_t, pdata: *const c_void, len: u8) -> c_int;
    fn bw_disconnect(id: id_t) -> c_int;
    fn bw_reg_mr(q: *mut c_void, addr: *mut c_void, len: usize, access: c_int, out: *mut *mut c_void, lkey: *mut u32, rkey: *mut u32) -> c_int;
    fn bw_dereg_mr(mr: *mut c_void);
    fn bw_post_recv(q: *mut c_void, wr_id: u64, addr: *mut c_void, len: u32, lkey: u32) -> c_int;
    fn bw_post_send(q: *mut c_void, kind: c_int, wr_id: u64, addr: *mut c_void, len: u32, lkey: u32, raddr: u64, rkey: u32, signaled: c_int) -> c_int;
    fn bw_poll(q: *mut c_void, out: *mut Wc, n: c_int) -> c_int;
    fn bw_rearm(q: *mut c_void) -> c_int;
    fn bw_cq_fd(q: *mut c_void) -> c_int;
    fn bw_event_str(event: c_int) -> *const c_char;
    fn bw_wc_status_str(status: c_int) -> *const c_char;
}

fn check(r: c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::from_raw_os_error(-r))
    } else {
        Ok(())
    }
}

fn cstring(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "address with a NUL byte"))
}

fn pdata_len(p: &[u8]) -> io::Result<u8> {
    u8::try_from(p.len()).ok().filter(|&n| n as usize <= PDATA_MAX).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "private data too long"))
}

/// Wait until one of `fds` is readable or `timeout` passes.
fn poll_fds(fds: &[c_int], timeout: Duration) -> io::Result<()> {
    let mut p: Vec<libc::pollfd> = fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
    let ms = timeout.as_millis().min(i32::MAX as u128) as c_int;
    // SAFETY: a valid array of pollfd of the length given.
    let r = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}

/// Connection-manager events (`enum rdma_cm_event_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    AddrResolved,
    AddrError,
    RouteResolved,
    RouteError,
    ConnectRequest,
    ConnectResponse,
    ConnectError,
    Unreachable,
    Rejected,
    Established,
    Disconnected,
    DeviceRemoval,
    TimewaitExit,
    Other(i32),
}

impl EventKind {
    fn from_raw(v: i32) -> EventKind {
        match v {
            0 => EventKind::AddrResolved,
            1 => EventKind::AddrError,
            2 => EventKind::RouteResolved,
            3 => EventKind::RouteError,
            4 => EventKind::ConnectRequest,
            5 => EventKind::ConnectResponse,
            6 => EventKind::ConnectError,
            7 => EventKind::Unreachable,
            8 => EventKind::Rejected,
            9 => EventKind::Established,
            10 => EventKind::Disconnected,
            11 => EventKind::DeviceRemoval,
            15 => EventKind::TimewaitExit,
            v => EventKind::Other(v),
        }
    }
}

/// One connection-manager event, copied out of librdmacm and acknowledged.
#[derive(Debug)]
pub struct CmEvent {
    pub kind: EventKind,
    pub status: i32,
    /// The connection's private data (request, accept or reject).
    pub private_data: Vec<u8>,
    /// What the peer offers: RDMA READs it answers at once, and issues.
    pub responder_resources: u8,
    pub initiator_depth: u8,
    raw: i32,
    id: id_t,
}

impl CmEvent {
    /// librdmacm's name of the event.
    pub fn name(&self) -> String {
        // SAFETY: returns a static string for any value.
        unsafe { CStr::from_ptr(bw_event_str(self.raw)) }.to_string_lossy().into_owned()
    }
}

/// A connection-manager event channel (non-blocking; wait on its fd).
struct Channel(*mut c_void);

impl Channel {
    fn new() -> io::Result<Channel> {
        let mut p = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check(unsafe { bw_channel_create(&mut p) })?;
        Ok(Channel(p))
    }
    fn fd(&self) -> c_int {
        // SAFETY: a live channel.
        unsafe { bw_channel_fd(self.0) }
    }
    /// The next event, if one is waiting.
    fn event(&self) -> io::Result<Option<CmEvent>> {
        // SAFETY: RawEvent is plain data; zeroed is a valid value.
        let mut raw: RawEvent = unsafe { std::mem::zeroed() };
        // SAFETY: a live channel and an out-struct of the layout shim.c uses.
        match check(unsafe { bw_get_event(self.0, &mut raw) }) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) => return Err(e),
        }
        Ok(Some(CmEvent {
            kind: EventKind::from_raw(raw.event),
            status: raw.status,
            private_data: raw.private_data[..raw.private_data_len as usize].to_vec(),
            responder_resources: raw.responder_resources,
            initiator_depth: raw.initiator_depth,
            raw: raw.event,
            id: raw.id,
        }))
    }
    /// Wait up to `timeout` for an event.
    fn wait_event(&self, timeout: Duration) -> io::Result<Option<CmEvent>> {
        let end = Instant::now() + timeout;
        loop {
            if let Some(e) = self.event()? {
                return Ok(Some(e));
            }
            let now = Instant::now();
            if now >= end {
                return Ok(None);
            }
            poll_fds(&[self.fd()], end - now)?;
        }
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: every id on the channel is destroyed before it (field order).
        unsafe { bw_channel_destroy(self.0) }
    }
}

/// An `rdma_cm_id` we own.
struct CmId(id_t);

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: owned, its queue pair destroyed before (field order).
        unsafe { bw_destroy_id(self.0) }
    }
}

fn peer_of(id: id_t) -> String {
    let mut buf = [0 as c_char; 64];
    // SAFETY: a live id and a buffer of the length given.
    if unsafe { bw_peer_addr(id, buf.as_mut_ptr(), buf.len() as c_int) } < 0 {
        return "?".into();
    }
    // SAFETY: inet_ntop wrote a NUL-terminated string.
    unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
}

/// A listening id: connect requests come out of [`Listener::request`].
pub struct Listener {
    id: CmId,
    channel: Channel,
    port: u16,
}

// SAFETY: the id and channel are only touched through &mut self or by the
// thread holding the listener; librdmacm calls are thread-safe.
unsafe impl Send for Listener {}

impl Listener {
    /// Listen on `ip` (an address of an RDMA device's netdev, or 0.0.0.0)
    /// and `port` (0: any).
    pub fn bind(ip: &str, port: u16, backlog: i32) -> io::Result<Listener> {
        let channel = Channel::new()?;
        let ip = cstring(ip)?;
        let mut id = std::ptr::null_mut();
        let mut bound = 0u16;
        // SAFETY: a live channel, a C string and out-pointers to locals.
        check(unsafe { bw_listen(channel.0, ip.as_ptr(), port, backlog, &mut id, &mut bound) })?;
        Ok(Listener { id: CmId(id), channel, port: bound })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Wait up to `timeout` for a connect request.
    pub fn request(&mut self, timeout: Duration) -> io::Result<Option<Request>> {
        let Some(ev) = self.channel.wait_event(timeout)? else {
            return Ok(None);
        };
        if ev.kind != EventKind::ConnectRequest || ev.id.is_null() || ev.id == self.id.0 {
            return Ok(None);
        }
        Ok(Some(Request { id: Some(CmId(ev.id)), peer: peer_of(ev.id), private_data: ev.private_data, responder_resources: ev.responder_resources, initiator_depth: ev.initiator_depth }))
    }
}

/// A connect request: accept it (through [`Request::into_queue`] and
/// [`Queue::accept`]) or [`Request::reject`] it.
pub struct Request {
    id: Option<CmId>,
    pub peer: String,
    pub private_data: Vec<u8>,
    pub responder_resources: u8,
    pub initiator_depth: u8,
}

// SAFETY: see Listener.
unsafe impl Send for Request {}

impl Request {
    pub fn reject(mut self, private_data: &[u8]) -> io::Result<()> {
        let n = pdata_len(private_data)?;
        let id = self.id.take().expect("request id");
        // SAFETY: a live id and a buffer of the length given.
        let r = check(unsafe { bw_reject(id.0, private_data.as_ptr().cast(), n) });
        drop(id);
        r
    }

    /// A queue pair for this connection, with `send_wr` sends and `recv_wr`
    /// receives outstanding at most; its events move to a channel of its own.
    pub fn into_queue(mut self, send_wr: u32, recv_wr: u32) -> io::Result<Queue> {
        let id = self.id.take().expect("request id");
        let channel = Channel::new()?;
        // SAFETY: a live id and channel.
        if let Err(e) = check(unsafe { bw_migrate_id(id.0, channel.0) }) {
            drop(id);
            return Err(e);
        }
        Queue::create(id, channel, send_wr, recv_wr, self.peer.clone())
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            // Neither accepted nor rejected: say no before the id goes.
            // SAFETY: a live id.
            unsafe { bw_reject(id.0, std::ptr::null(), 0) };
        }
    }
}

/// The peer's memory: an address in its registration, and the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remote {
    pub addr: u64,
    pub key: u32,
}

/// A registered buffer, by its index in its queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufId(usize);

enum Mem {
    /// Ours, zeroed at registration; the device may write it.
    Owned(Box<[u8]>),
    /// Someone's bytes the device only reads (a SEND or RDMA WRITE source).
    Shared(bytes::Bytes),
}

impl Mem {
    fn bytes(&self) -> &[u8] {
        match self {
            Mem::Owned(b) => b,
            Mem::Shared(b) => b,
        }
    }
}

struct Region {
    mem: Mem,
    mr: *mut c_void,
    lkey: u32,
    rkey: u32,
}

/// Failure to connect: refused with the peer's private data, or another error.
#[derive(Debug)]
pub enum ConnectError {
    Rejected(Vec<u8>),
    Io(io::Error),
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::Rejected(p) => write!(f, "connection rejected (private data {p:02x?})"),
            ConnectError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ConnectError {}

impl From<io::Error> for ConnectError {
    fn from(e: io::Error) -> Self {
        ConnectError::Io(e)
    }
}

/// One reliable connection: queue pair, completion queue and channel,
/// registered buffers, and the connection's own CM event channel.
pub struct Queue {
    // Torn down in this order (Drop): queue pair, buffers, the rest of the
    // queue, id, channel.
    regions: Vec<Option<Region>>,
    free: Vec<usize>,
    q: *mut c_void,
    id: CmId,
    channel: Channel,
    peer: String,
}

// SAFETY: one thread uses a queue at a time (&mut self everywhere that
// posts or polls); the verbs are thread-safe anyway.
unsafe impl Send for Queue {}

impl Queue {
    fn create(id: CmId, channel: Channel, send_wr: u32, recv_wr: u32, peer: String) -> io::Result<Queue> {
        let mut q = std::ptr::null_mut();
        // SAFETY: a live id (with its device, after a connect request or a resolved route).
        if let Err(e) = check(unsafe { bw_queue_create(id.0, send_wr, recv_wr, &mut q) }) {
            // The id goes before its channel.
            drop(id);
            drop(channel);
            return Err(e);
        }
        Ok(Queue { regions: Vec::new(), free: Vec::new(), q, id, channel, peer })
    }

    /// Client side: resolve `ip`:`port` to a device and route and make the
    /// queue pair; register buffers and post receives, then [`Queue::connect`].
    pub fn resolve(ip: &str, port: u16, send_wr: u32, recv_wr: u32, timeout: Duration) -> io::Result<Queue> {
        let channel = Channel::new()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: a live channel and an out-pointer.
        check(unsafe { bw_create_id(channel.0, &mut raw) })?;
        let id = CmId(raw);
        let cip = cstring(ip)?;
        let ms = timeout.as_millis().min(i32::MAX as u128) as c_int;
        // SAFETY: a live id and a C string.
        check(unsafe { bw_resolve_addr(id.0, cip.as_ptr(), port, ms) })?;
        expect_event(&channel, EventKind::AddrResolved, timeout)?;
        // SAFETY: a live id with its address resolved.
        check(unsafe { bw_resolve_route(id.0, ms) })?;
        expect_event(&channel, EventKind::RouteResolved, timeout)?;
        Queue::create(id, channel, send_wr, recv_wr, ip.to_string())
    }

    /// Client side: connect with `private_data`; the peer's accept private data.
    pub fn connect(&mut self, private_data: &[u8], responder: u8, initiator: u8, timeout: Duration) -> Result<Vec<u8>, ConnectError> {
        let n = pdata_len(private_data)?;
        // SAFETY: a live queue and a buffer of the length given.
        check(unsafe { bw_connect(self.q, private_data.as_ptr().cast(), n, responder, initiator) })?;
        let ev = self.channel.wait_event(timeout)?.ok_or_else(|| io::Error::new(io::ErrorKind::TimedOut, "no answer to the connect"))?;
        match ev.kind {
            EventKind::Established => Ok(ev.private_data),
            EventKind::Rejected => Err(ConnectError::Rejected(ev.private_data)),
            _ => Err(io::Error::other(format!("connect: {} (status {})", ev.name(), ev.status)).into()),
        }
    }

    /// Server side: accept with `private_data`.
    pub fn accept(&mut self, private_data: &[u8], responder: u8, initiator: u8) -> io::Result<()> {
        let n = pdata_len(private_data)?;
        // SAFETY: a live queue and a buffer of the length given.
        check(unsafe { bw_accept(self.q, private_data.as_ptr().cast(), n, responder, initiator) })
    }

    pub fn disconnect(&mut self) {
        // SAFETY: a live id; failing (not connected) is harmless.
        unsafe { bw_disconnect(self.id.0) };
    }

    pub fn peer(&self) -> &str {
        &self.peer
    }

    fn add(&mut self, mem: Mem, access: c_int) -> io::Result<BufId> {
        let (mut mr, mut lkey, mut rkey) = (std::ptr::null_mut(), 0, 0);
        let b = mem.bytes();
        // Shared (immutable) bytes are registered without write access
        // (local or remote), so handing them over as *mut is sound.
        let (p, n) = (b.as_ptr() as *mut c_void, b.len());
        // SAFETY: the memory lives in `regions` until it is deregistered.
        check(unsafe { bw_reg_mr(self.q, p, n, access, &mut mr, &mut lkey, &mut rkey) })?;
        let r = Some(Region { mem, mr, lkey, rkey });
        Ok(BufId(match self.free.pop() {
            Some(i) => {
                self.regions[i] = r;
                i
            }
            None => {
                self.regions.push(r);
                self.regions.len() - 1
            }
        }))
    }

    /// Register `len` zeroed bytes the device may write (RECV, RDMA READ);
    /// `remote`: the peer may read and write them too.
    pub fn register(&mut self, len: usize, remote: bool) -> io::Result<BufId> {
        let mem = Mem::Owned(vec![0u8; len.max(1)].into_boxed_slice());
        self.add(mem, if remote { 1 | 2 | 4 } else { 1 })
    }

    /// Register `data` as the source of a SEND or RDMA WRITE; `remote`:
    /// the peer may RDMA READ it too (never write it).
    pub fn register_bytes(&mut self, data: bytes::Bytes, remote: bool) -> io::Result<BufId> {
        self.add(Mem::Shared(data), if remote { 2 } else { 0 })
    }

    /// Deregister `b`: its bytes, if they were ours ([`Queue::register`]).
    /// Only once no work request uses it.
    pub fn release(&mut self, b: BufId) -> Option<Vec<u8>> {
        let r = self.regions.get_mut(b.0)?.take()?;
        // SAFETY: registered on this queue's protection domain.
        unsafe { bw_dereg_mr(r.mr) };
        self.free.push(b.0);
        match r.mem {
            Mem::Owned(m) => Some(m.into_vec()),
            Mem::Shared(_) => None,
        }
    }

    fn region(&self, b: BufId) -> io::Result<&Region> {
        self.regions.get(b.0).and_then(|r| r.as_ref()).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no such buffer"))
    }

    pub fn buf(&self, b: BufId) -> &[u8] {
        self.region(b).map_or(&[], |r| r.mem.bytes())
    }
    /// A buffer of ours to fill (None for registered bytes, which are read-only).
    pub fn buf_mut(&mut self, b: BufId) -> Option<&mut [u8]> {
        match self.regions.get_mut(b.0)?.as_mut()?.mem {
            Mem::Owned(ref mut m) => Some(m),
            Mem::Shared(_) => None,
        }
    }
    /// The address and key a peer uses to reach `b` (remote access).
    pub fn remote_key(&self, b: BufId) -> io::Result<(u64, u32)> {
        let r = self.region(b)?;
        Ok((r.mem.bytes().as_ptr() as u64, r.rkey))
    }

    fn slice(&self, b: BufId, off: usize, len: usize) -> io::Result<(*mut c_void, u32, u32)> {
        let r = self.region(b)?;
        let mem = r.mem.bytes();
        if off.checked_add(len).is_none_or(|end| end > mem.len()) || len > u32::MAX as usize {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "range outside the buffer"));
        }
        // Only a registration with write access lets the device write here.
        Ok((mem.as_ptr().wrapping_add(off) as *mut c_void, len as u32, r.lkey))
    }

    pub fn post_recv(&mut self, wr_id: u64, b: BufId, off: usize, len: usize) -> io::Result<()> {
        let (p, n, lkey) = self.slice(b, off, len)?;
        // SAFETY: a checked range of a registered buffer.
        check(unsafe { bw_post_recv(self.q, wr_id, p, n, lkey) })
    }

    /// SEND `len` bytes at `off` of `b`; `invalidate`: the peer's key to
    /// invalidate with it (SEND with Invalidate).
    pub fn post_send(&mut self, wr_id: u64, b: BufId, off: usize, len: usize, invalidate: Option<u32>, signaled: bool) -> io::Result<()> {
        let (p, n, lkey) = self.slice(b, off, len)?;
        let (kind, rkey) = match invalidate {
            Some(k) => (1, k),
            None => (0, 0),
        };
        // SAFETY: a checked range of a registered buffer.
        check(unsafe { bw_post_send(self.q, kind, wr_id, p, n, lkey, 0, rkey, signaled as c_int) })
    }

    /// RDMA WRITE `len` bytes at `off` of `b` to the peer's memory `to`.
    pub fn post_write(&mut self, wr_id: u64, b: BufId, off: usize, len: usize, to: Remote, signaled: bool) -> io::Result<()> {
        let (p, n, lkey) = self.slice(b, off, len)?;
        // SAFETY: a checked range of a registered buffer.
        check(unsafe { bw_post_send(self.q, 2, wr_id, p, n, lkey, to.addr, to.key, signaled as c_int) })
    }

    /// RDMA READ `len` bytes from the peer's memory `from` into `off` of `b`
    /// (always signaled: the data is there when it completes).
    pub fn post_read(&mut self, wr_id: u64, b: BufId, off: usize, len: usize, from: Remote) -> io::Result<()> {
        let (p, n, lkey) = self.slice(b, off, len)?;
        // SAFETY: a checked range of a registered buffer.
        check(unsafe { bw_post_send(self.q, 3, wr_id, p, n, lkey, from.addr, from.key, 1) })
    }

    /// Completions into `out`; how many.
    pub fn poll(&mut self, out: &mut [Wc]) -> io::Result<usize> {
        // SAFETY: a live queue and an out-array of at least the length given.
        let n = unsafe { bw_poll(self.q, out.as_mut_ptr(), out.len().min(16) as c_int) };
        check(n)?;
        Ok(n as usize)
    }

    /// Ask to be woken for the next completion: poll again after this
    /// before waiting, or a completion that came in between is missed.
    pub fn rearm(&mut self) -> io::Result<()> {
        // SAFETY: a live queue.
        check(unsafe { bw_rearm(self.q) })
    }

    /// The next connection-manager event of this connection, if any.
    pub fn cm_event(&mut self) -> io::Result<Option<CmEvent>> {
        self.channel.event()
    }

    /// Sleep until a completion or CM event may be there, or `timeout`.
    pub fn wait(&self, timeout: Duration) -> io::Result<()> {
        self.wait_also(None, timeout)
    }

    /// [`Queue::wait`], waking for `extra` readable too (an eventfd others
    /// signal, say).
    pub fn wait_also(&self, extra: Option<c_int>, timeout: Duration) -> io::Result<()> {
        // SAFETY: a live queue.
        let cq = unsafe { bw_cq_fd(self.q) };
        let mut fds = vec![cq, self.channel.fd()];
        fds.extend(extra);
        poll_fds(&fds, timeout)
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        // SAFETY: live; after this no work request reaches the buffers.
        unsafe { bw_queue_destroy_qp(self.q) };
        for r in self.regions.drain(..).flatten() {
            // SAFETY: registered on this queue's protection domain.
            unsafe { bw_dereg_mr(r.mr) };
        }
        // SAFETY: live, its queue pair and buffers gone; the id and
        // channel go after it (field order).
        unsafe { bw_queue_free(self.q) };
    }
}

fn expect_event(ch: &Channel, want: EventKind, timeout: Duration) -> io::Result<()> {
    match ch.wait_event(timeout)? {
        Some(e) if e.kind == want => Ok(()),
        Some(e) => Err(io::Error::other(format!("{} (status {}) instead of {want:?}", e.name(), e.status))),
        None => Err(io::Error::new(io::ErrorKind::TimedOut, format!("no {want:?} in time"))),
    }
}
