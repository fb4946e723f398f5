//! What one connection still has to send, in order, for both TCP
//! front-ends: encoded PDUs in byte buffers and, between them, read
//! payloads that go straight from a volume's backing file to the socket
//! with sendfile(2) (no copy through user space). Small reads are read
//! straight into the byte buffer behind their PDU header
//! ([`Outbox::read_into`]), so their data is copied once, by the read,
//! or, from a memory-backed volume, left where they are: queued as a
//! region of the volume's mapped backing file ([`Outbox::push_mapped`])
//! that the send's own copy takes them from (`sendmsg` gathers headers
//! and payloads, so nothing is copied before the send).
//! Sending never blocks: [`Outbox::send`] writes what the socket takes and
//! leaves the rest for the next writable event; [`Outbox::drain`] waits.
//!
//! On an NVMe/TCP connection over TLS whose records are ours (not the
//! kernel's), what is queued goes through a [`Sealer`] on its way out:
//! each record is filled where it is sealed, several PDUs to a record (up
//! to 16 KiB), the byte buffers' headers copied in, file payloads read
//! into it with pread and mapped payloads copied from the mapping with
//! `MappedBytes::copy_into` (never a plain read of the mapping: a file
//! shrunk under it would raise SIGBUS; that copy fails like a system call
//! instead), then encrypted in place; only the records are written.

use crate::tuning::TlsSealing;
use bw_block::{MappedBytes, Volume};
use bw_tls::record::{ContentType, Sealer, HEADER_LEN, MAX_PLAINTEXT, TAG_LEN};
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use tokio::io::Interest;
use tokio::net::TcpStream;

/// Byte buffers larger than this are not kept for reuse (a 1 MiB read
/// copied behind its PDU headers fits).
const KEEP_CAPACITY: usize = (1 << 20) + (64 << 10);

/// Most bytes of byte buffers kept for reuse, all together.
const KEEP_BYTES: usize = 8 << 20;

/// Byte buffers kept for reuse (with mapped payloads a buffer holds the
/// headers between two of them, so a burst uses one per read).
const KEEP_BUFFERS: usize = 64;

/// At most this many pieces go to one `sendmsg` (a burst of 32 reads is 64:
/// a header and a payload each).
const MAX_IOV: usize = 64;

/// With user-space TLS: plaintext encrypted ahead of what the socket took
/// (the records stay in the cache between encryption and the write).
const SEAL_AHEAD: usize = 256 << 10;

enum Seg {
    Buf { data: Vec<u8>, pos: usize },
    /// `len` bytes of the file at `off`. The volume clone keeps the
    /// backend, and so `fd`, open until the bytes are sent.
    File { _vol: Volume, fd: RawFd, off: u64, left: usize },
    /// Bytes of a volume's mapped backing file, from `pos` on.
    Mapped { bytes: MappedBytes, pos: usize },
    /// A mapped payload behind its own short header (a data PDU's), `pos`
    /// counted from the header's start; without TLS only
    /// ([`Outbox::push_headed`]). The header's unsent bytes count in
    /// [`Outbox::buffered`] as a byte buffer's would.
    Headed { head: [u8; HEAD_MAX], hlen: u8, bytes: MappedBytes, pos: usize },
}

/// The longest header a [`Seg::Headed`] holds: an iSCSI Data-In's basic
/// header segment with its header digest (48 + 4 bytes; an NVMe/TCP
/// C2HData header with its digest is 28).
pub const HEAD_MAX: usize = 52;

/// A READ's payload when it is not copied into the send buffer: from the
/// page cache by sendfile, or from the volume's mapping gathered into
/// sendmsg. Both front-ends choose it with [`Payload::of`] and queue its
/// pieces with [`Outbox::push_payload`].
pub enum Payload {
    /// The volume's backing file, `off` where the read starts.
    File { vol: Volume, fd: RawFd, off: u64 },
    /// The read's bytes in the volume's mapped backing file.
    Mapped(MappedBytes),
}

impl Payload {
    /// How `len` bytes at `off` of `vol` go out without a copy into the
    /// buffer: sendfile where `zero_copy` (the front-end's dispatch chose
    /// it), else the mapping where `mapped` (the `mapped_reads` knob, and
    /// no data digest: that needs the bytes in user space). `Ok(None)`:
    /// copy them ([`Outbox::read_into`]).
    pub fn of(vol: &Volume, off: u64, len: usize, zero_copy: bool, mapped: bool) -> bw_block::Result<Option<Payload>> {
        if zero_copy {
            let fd = vol.zero_copy_read(off, len as u64)?;
            return Ok(fd.map(|fd| Payload::File { vol: vol.clone(), fd: fd.as_raw_fd(), off }));
        }
        if mapped {
            return Ok(vol.mapped_read(off, len as u64)?.map(Payload::Mapped));
        }
        Ok(None)
    }
}

#[derive(Default)]
pub struct Outbox {
    segs: VecDeque<Seg>,
    spares: Vec<Vec<u8>>,
    /// The capacity of `spares`, added up.
    spare_bytes: usize,
    /// Unsent bytes of the byte buffers other than the last segment (the
    /// one [`Outbox::buf_mut`] appends to): [`Outbox::buffered`] without a
    /// walk over every segment, which the driver asks before each PDU (with
    /// a burst of mapped reads queued, 64 segments each time).
    sealed: usize,
    /// User-space TLS: the records made so far and how much of them went.
    tls: Option<Tls>,
}

struct Tls {
    sealer: Sealer,
    records: Vec<u8>,
    sent: usize,
    /// The thread that seals part of a large mapped payload beside this
    /// one ([`Outbox::seal_split`]), started at the first such payload.
    helper: Option<SealHelper>,
    /// Records the helper is sealing: they go out after `records`, before
    /// anything sealed later.
    pending: Option<Pending>,
    /// A records buffer for the helper's next run.
    spare: Vec<u8>,
    /// Large mapped payloads are sealed on two threads ([`split_sealing`]).
    split: bool,
    /// A close_notify is to follow everything queued (sealed once the rest
    /// is, behind the helper's records if a run is out).
    close: bool,
    /// Tests: the helper waits for a word on this before each run.
    #[cfg(test)]
    gate: Option<Gate>,
}

/// Tests: what holds the helper before each run, and whether it ever
/// stopped waiting on its own (no word within a minute: someone waited
/// for it instead of letting it be woken).
#[cfg(test)]
struct Gate {
    go: std::sync::mpsc::Receiver<()>,
    gave_up: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// What the helper was given: its run's plaintext length (counted in
/// [`Outbox::buffered`]).
struct Pending {
    len: usize,
}

impl Tls {
    /// The helper's records, if it handed them back, behind `records`:
    /// taken as they are when nothing of `records` is left to send, else
    /// copied behind. Never waits: `Ok(false)` while the helper still
    /// seals (its wake, [`Outbox::sealed`], says when to try again), and
    /// nothing may be sealed then (it would go out before the helper's).
    fn collect(&mut self) -> io::Result<bool> {
        if self.pending.is_none() {
            return Ok(true);
        }
        let Some(h) = &self.helper else { unreachable!("records pending without a helper") };
        let Some(r) = h.try_take() else { return Ok(false) };
        self.pending = None;
        let mut theirs = r?;
        if self.sent == self.records.len() {
            self.records.clear();
            self.sent = 0;
            std::mem::swap(&mut self.records, &mut theirs);
        } else {
            self.records.extend_from_slice(&theirs);
        }
        theirs.clear();
        self.spare = theirs;
        Ok(true)
    }
}

/// A run of whole records of one mapped payload, sealed on the helper.
struct SealJob {
    sealer: Sealer,
    bytes: MappedBytes,
    out: Vec<u8>,
}

/// A thread of a connection's own that seals runs of records
/// ([`SealJob`]) handed to it, one at a time, and hands each back
/// sealed, then wakes the connection's driver through `wake` (the driver
/// goes on with other PDUs meanwhile: it never waits on the thread while
/// running on a runtime's worker). Dropped with the connection's outbox: it finishes the run it
/// has (at most [`SEAL_AHEAD`] of plaintext, well under a millisecond),
/// drops it, and ends; the drop waits for that, so no mapping or volume
/// outlives the connection.
struct SealHelper {
    jobs: Option<std::sync::mpsc::Sender<SealJob>>,
    done: std::sync::mpsc::Receiver<(Vec<u8>, io::Result<()>)>,
    /// Notified after each run handed back. A permit left by a run taken
    /// before anyone waited wakes the next wait early once: a wasted turn,
    /// never a lost wake.
    wake: std::sync::Arc<tokio::sync::Notify>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Alive while the thread runs (what the tests look at).
    #[cfg(test)]
    running: std::sync::Weak<()>,
}

impl SealHelper {
    fn start(#[cfg(test)] gate: Option<Gate>) -> io::Result<SealHelper> {
        let (jobs, rx) = std::sync::mpsc::channel::<SealJob>();
        let (tx, done) = std::sync::mpsc::channel();
        let wake = std::sync::Arc::new(tokio::sync::Notify::new());
        let woken = wake.clone();
        let running = std::sync::Arc::new(());
        #[cfg(test)]
        let weak = std::sync::Arc::downgrade(&running);
        let thread = std::thread::Builder::new().name("bw-tls-seal".into()).spawn(move || {
            let _running = running;
            // However the thread ends (a panic too), the driver is woken
            // to find the channel closed, not left waiting.
            let woken = WakeOnDrop(woken);
            for SealJob { mut sealer, bytes, mut out } in rx {
                #[cfg(test)]
                if let Some(g) = &gate {
                    if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = g.go.recv_timeout(std::time::Duration::from_secs(60)) {
                        g.gave_up.store(true, std::sync::atomic::Ordering::SeqCst);
                    }
                }
                let r = seal_mapped(&mut sealer, &bytes, &mut out);
                if tx.send((out, r)).is_err() {
                    return;
                }
                woken.0.notify_one();
            }
        })?;
        Ok(SealHelper {
            jobs: Some(jobs),
            done,
            wake,
            thread: Some(thread),
            #[cfg(test)]
            running: weak,
        })
    }

    /// The records of the run handed over last, if the thread is done
    /// with them (never waits).
    fn try_take(&self) -> Option<io::Result<Vec<u8>>> {
        match self.done.try_recv() {
            Ok((out, r)) => Some(r.map(|()| out)),
            Err(std::sync::mpsc::TryRecvError::Empty) => None,
            Err(std::sync::mpsc::TryRecvError::Disconnected) => Some(Err(io::Error::other("the TLS sealing thread ended"))),
        }
    }
}

/// Notifies its waiter when dropped.
struct WakeOnDrop(std::sync::Arc<tokio::sync::Notify>);

impl Drop for WakeOnDrop {
    fn drop(&mut self) {
        self.0.notify_one();
    }
}

impl Drop for SealHelper {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Whether large payloads of a connection sealing as `how` are sealed on
/// two threads: when asked to (`[tuning] tls_sealing`), and only where
/// there is a second CPU to run the helper.
fn split_sealing(how: TlsSealing) -> bool {
    static CPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    how == TlsSealing::Thread && *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get())) > 1
}

/// A mapped payload queued at a record's start with at least this many
/// bytes left is sealed on two threads ([`Outbox::seal_split`]); smaller
/// ones (4 KiB reads) never hand anything over.
const SPLIT_MIN: usize = 8 * MAX_PLAINTEXT;

/// `take` bytes of the mapping at `pos` appended to `out` with the
/// fault-safe copy; a file shrunk under the mapping is the volume's error
/// and the connection's (never SIGBUS).
fn copy_mapped(bytes: &MappedBytes, pos: usize, take: usize, out: &mut Vec<u8>) -> io::Result<()> {
    let copied = bytes.copy_into(pos, take, out).unwrap_or_else(|| Err(io::Error::other("no fault-safe copy from a mapping on this machine")));
    copied.map_err(|e| {
        bytes.volume().note_error();
        io::Error::other(format!("a volume's backing file shrank under its mapping (truncated by someone else?): {e}"))
    })
}

/// Records of `bytes` (whole records but the last) sealed by `sealer`,
/// appended to `out`: the fault-safe copy from the mapping, then the
/// cipher in place.
fn seal_mapped(sealer: &mut Sealer, bytes: &MappedBytes, out: &mut Vec<u8>) -> io::Result<()> {
    let mut pos = 0;
    while pos < bytes.len() {
        let take = (bytes.len() - pos).min(MAX_PLAINTEXT);
        out.reserve(HEADER_LEN + take + 1 + TAG_LEN);
        let record = Sealer::begin(out);
        if let Err(e) = copy_mapped(bytes, pos, take, out) {
            Sealer::abandon(out, record);
            return Err(e);
        }
        sealer.finish(ContentType::ApplicationData, out, record);
        pos += take;
    }
    Ok(())
}

/// Append `len` bytes of the file `fd` at `off` to `b`, read with pread
/// straight into its spare room (nothing zeroed first). On an error `b`
/// is as it was.
fn pread_append(b: &mut Vec<u8>, fd: RawFd, off: u64, len: usize) -> io::Result<()> {
    let start = b.len();
    b.reserve(len);
    let mut done = 0;
    while done < len {
        // SAFETY: `reserve` made room for `len` bytes after `start`;
        // pread writes at most `len - done` bytes from `start + done`.
        let n = unsafe { libc::pread(fd, b.as_mut_ptr().add(start + done).cast(), len - done, (off + done as u64) as libc::off_t) };
        match n {
            n if n > 0 => done += n as usize,
            0 => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "backing file ended before the volume's size")),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    // SAFETY: pread wrote all `len` bytes after `start`.
    unsafe { b.set_len(start + len) };
    Ok(())
}

impl Outbox {
    /// What is queued from now on goes out through `sealer`'s records,
    /// large mapped payloads sealed as `how` says.
    pub fn set_tls(&mut self, sealer: Sealer, how: TlsSealing) {
        self.tls = Some(Tls {
            sealer,
            records: Vec::new(),
            sent: 0,
            helper: None,
            pending: None,
            spare: Vec::new(),
            split: split_sealing(how),
            close: false,
            #[cfg(test)]
            gate: None,
        });
    }

    pub fn is_empty(&self) -> bool {
        self.segs.is_empty() && self.tls.as_ref().is_none_or(|t| t.sent == t.records.len() && t.pending.is_none() && !t.close)
    }

    /// Whether [`Outbox::send`] has something for the socket now: not
    /// when empty, nor while the next records are the helper's, still
    /// being sealed (then wait for [`Outbox::sealed`], not for the socket:
    /// a writable socket would wake the driver for nothing, again and
    /// again).
    pub fn can_send(&self) -> bool {
        !self.is_empty() && self.sealed().is_none()
    }

    /// While the next records to write are the helper's, still being
    /// sealed: a future that resolves when it hands some back (then
    /// [`Outbox::send`] goes on). Made afresh each time the driver waits;
    /// it may resolve early once (see `SealHelper::wake`).
    pub fn sealed(&self) -> Option<impl Future<Output = ()> + Send + 'static> {
        let t = self.tls.as_ref()?;
        if t.pending.is_none() || t.sent < t.records.len() {
            return None;
        }
        let wake = t.helper.as_ref()?.wake.clone();
        Some(async move { wake.notified().await })
    }

    /// Bytes held in memory waiting to be sent (file payloads not counted).
    pub fn buffered(&self) -> usize {
        let open = match self.segs.back() {
            Some(Seg::Buf { data, pos }) => data.len() - pos,
            _ => 0,
        };
        let records = self.tls.as_ref().map_or(0, |t| t.records.len() - t.sent + t.pending.as_ref().map_or(0, |p| p.len));
        records + self.sealed + open
    }

    /// A segment goes behind the last: a byte buffer there is sealed.
    fn push_seg(&mut self, s: Seg) {
        if let Some(Seg::Buf { data, pos }) = self.segs.back() {
            self.sealed += data.len() - pos;
        }
        self.segs.push_back(s);
    }

    /// With TLS: a close_notify alert after everything queued (the orderly
    /// end of what we send), sealed by [`Outbox::send`] once all before it is.
    pub fn close_notify(&mut self) {
        if let Some(t) = &mut self.tls {
            t.close = true;
        }
    }

    /// The buffer new PDUs are appended to (after everything queued).
    pub fn buf_mut(&mut self) -> &mut Vec<u8> {
        // With TLS a buffer already sealed in part takes no more: behind
        // it a new one starts, so that each is taken off, and kept for
        // reuse, once sealed (one growing without end was dropped, too
        // large to keep, and the next grew again by reallocation: copies
        // and page faults per large read).
        let sealing = self.tls.is_some() && matches!(self.segs.back(), Some(Seg::Buf { pos, .. }) if *pos > 0);
        if sealing || !matches!(self.segs.back(), Some(Seg::Buf { .. })) {
            let data = self.spares.pop().unwrap_or_default();
            self.spare_bytes -= data.capacity();
            self.push_seg(Seg::Buf { data, pos: 0 });
        }
        match self.segs.back_mut() {
            Some(Seg::Buf { data, .. }) => data,
            _ => unreachable!("a byte buffer was just pushed"),
        }
    }

    /// [`Payload::of`] for what this outbox sends. When it seals TLS
    /// records in user space every payload is copied into them, and a
    /// volume with a mapping is copied from it (one `rep movsb`, no system
    /// call) even where the read would go out with sendfile without TLS:
    /// with pread, each 16 KiB record cost a system call, page-cache
    /// lookups and an atime update, and a 1 MiB read over TLS cost the
    /// target 610-670 against 423-433 us of CPU
    /// (docs/notes/2026-11-26-nvme-tls-5.md).
    pub fn payload(&self, vol: &Volume, off: u64, len: usize, zero_copy: bool, mapped: bool) -> bw_block::Result<Option<Payload>> {
        Payload::of(vol, off, len, zero_copy && !(mapped && self.tls.is_some()), mapped)
    }

    /// Queue `len` bytes of `vol`'s backing file `fd` at `off`.
    /// Over user-space TLS the records are filled from the file with pread.
    pub fn push_file(&mut self, vol: Volume, fd: RawFd, off: u64, len: usize) {
        if len > 0 {
            self.push_seg(Seg::File { _vol: vol, fd, off, left: len });
        }
    }

    /// Queue `len` bytes of `p` from `at` (one PDU's share of a read).
    pub fn push_payload(&mut self, p: &Payload, at: usize, len: usize) {
        match p {
            Payload::File { vol, fd, off } => self.push_file(vol.clone(), *fd, off + at as u64, len),
            Payload::Mapped(m) => self.push_mapped(m.slice(at, len)),
        }
    }

    /// Queue bytes of a volume's mapped backing file
    /// ([`bw_block::Volume::mapped_read`]).
    /// Over user-space TLS they are copied into the records with
    /// [`MappedBytes::copy_into`] (the front-end queues them only where it
    /// can copy).
    pub fn push_mapped(&mut self, bytes: MappedBytes) {
        if !bytes.is_empty() {
            self.push_seg(Seg::Mapped { bytes, pos: 0 });
        }
    }

    /// Queue `head` (a data PDU's header) and then `len` bytes of `p` from
    /// `at`: as [`Outbox::buf_mut`]'s `extend_from_slice(head)` and
    /// [`Outbox::push_payload`], the same bytes in the same order. A
    /// mapped payload without TLS takes its header along in its own
    /// segment: no byte buffer started (taken from the spares, put back
    /// when sent) between two reads' payloads, ~150 instructions per
    /// mapped 4 KiB read (docs/notes/2026-11-27-h51z2-nvme-target.md).
    pub fn push_headed(&mut self, head: &[u8], p: &Payload, at: usize, len: usize) {
        match p {
            Payload::Mapped(m) if self.tls.is_none() && head.len() <= HEAD_MAX && len > 0 => {
                let mut h = [0u8; HEAD_MAX];
                h[..head.len()].copy_from_slice(head);
                self.push_seg(Seg::Headed { head: h, hlen: head.len() as u8, bytes: m.slice(at, len), pos: 0 });
                self.sealed += head.len();
            }
            _ => {
                self.buf_mut().extend_from_slice(head);
                self.push_payload(p, at, len);
            }
        }
    }

    /// Append `len` bytes of `vol` at `off` to the buffer (after what is
    /// queued); returns where they start in [`Outbox::buf_mut`]. On an
    /// error the buffer is as it was.
    pub fn read_into(&mut self, vol: &Volume, off: u64, len: usize) -> bw_block::Result<usize> {
        // A backend with a readable file (RAM, files) is read with pread
        // straight into the buffer's spare room: nothing to zero first
        // (under user-space TLS, where every read is copied, the memset was
        // a tenth of the target's CPU on 1 MiB reads).
        if let Some(fd) = vol.zero_copy_read(off, len as u64)? {
            let b = self.buf_mut();
            let start = b.len();
            if let Err(e) = pread_append(b, fd.as_raw_fd(), off, len) {
                vol.note_error();
                return Err(e.into());
            }
            return Ok(start);
        }
        let b = self.buf_mut();
        let start = b.len();
        // Zero-filled: `read_at` takes `&mut [u8]`, which must not refer to
        // uninitialized memory. The buffer is reused, so this is a memset
        // of memory already in cache, not a fresh allocation.
        b.resize(start + len, 0);
        match vol.read_at(&mut b[start..], off) {
            Ok(()) => Ok(start),
            Err(e) => {
                b.truncate(start);
                Err(e)
            }
        }
    }

    /// Send as much as the socket takes now. `Ok` both when everything went
    /// and when the socket is full; an error means the connection is broken.
    pub fn send(&mut self, sock: &TcpStream) -> io::Result<()> {
        if self.tls.is_some() {
            return self.send_records(sock);
        }
        let sfd = sock.as_raw_fd();
        while let Some(seg) = self.segs.front_mut() {
            let r = match seg {
                Seg::Buf { .. } | Seg::Mapped { .. } | Seg::Headed { .. } => self.send_gathered(sock),
                Seg::File { _vol, fd, off, left } => {
                    let r = sock.try_io(Interest::WRITABLE, || {
                        let mut o = *off as libc::off_t;
                        // SAFETY: both descriptors are open (the socket is
                        // borrowed, the file is kept open by `_vol`).
                        let n = unsafe { libc::sendfile(sfd, *fd, &mut o, *left) };
                        if n < 0 { Err(io::Error::last_os_error()) } else { Ok(n as usize) }
                    });
                    match r {
                        Ok(0) => {
                            _vol.note_error();
                            Err(io::Error::new(io::ErrorKind::UnexpectedEof, "backing file ended before the volume's size"))
                        }
                        Ok(n) => {
                            *off += n as u64;
                            *left -= n;
                            if *left == 0 {
                                self.pop_front();
                            }
                            Ok(())
                        }
                        Err(e) if !matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset) => {
                            // Not the socket's fault: the backing file failed.
                            _vol.note_error();
                            Err(e)
                        }
                        Err(e) => Err(e),
                    }
                }
            };
            match r {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// User-space TLS: encrypt what is queued, a window ahead, and write the records.
    fn send_records(&mut self, sock: &TcpStream) -> io::Result<()> {
        loop {
            let Some(t) = &mut self.tls else { return Ok(()) };
            while t.sent < t.records.len() {
                match sock.try_write(&t.records[t.sent..]) {
                    Ok(n) => t.sent += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            t.records.clear();
            t.sent = 0;
            // The helper's records next (usually sealed while ours were
            // written); then the next window is sealed behind them, and
            // handed in part to the helper again, before they are written.
            // Still sealing: nothing more now (what is queued goes behind
            // its records); its wake brings the driver back.
            if !t.collect()? {
                return Ok(());
            }
            if self.segs.is_empty() {
                if t.records.is_empty() {
                    if !t.close {
                        return Ok(());
                    }
                    t.close = false;
                    t.sealer.close_notify(&mut t.records);
                }
                continue;
            }
            self.seal(SEAL_AHEAD)?;
            if self.tls.as_ref().is_some_and(|t| t.records.is_empty() && t.pending.is_none()) {
                return Ok(());
            }
        }
    }

    /// Encrypt what is queued into records until about `limit` bytes of
    /// plaintext went in or nothing is left. A record is filled where it
    /// will be sealed ([`Sealer::begin`]): PDU headers (and reads copied
    /// into the buffer) are copied in, a payload is copied into it from
    /// the volume's mapping (small reads: no system call) or read into it
    /// with pread (file payloads, large reads), and the record is
    /// encrypted in place: a read's bytes are copied once in user space.
    /// A large mapped payload is sealed in part on a second thread
    /// ([`Outbox::seal_split`]). Records the helper still seals come
    /// first: while it seals, nothing is sealed here (what would be goes
    /// after its records).
    /// An error: a payload could not be read (the connection cannot go
    /// on, as when sendfile fails).
    fn seal(&mut self, limit: usize) -> io::Result<()> {
        let Some(mut t) = self.tls.take() else { return Ok(()) };
        let r = match t.collect() {
            Ok(true) => self.seal_into(&mut t, limit),
            other => other.map(|_| ()),
        };
        self.tls = Some(t);
        r
    }

    /// Seal the next `records` whole records of the mapped payload at the
    /// front on two threads: the first quarter here, the rest on the
    /// helper, each run with the sequence numbers it would have had
    /// sealed in order ([`Sealer::take_run`]). Ours are appended to
    /// `t.records`; the helper's follow them ([`Tls::collect`]).
    ///
    /// Why: over user-space TLS a 1 MiB read's cipher and copy (180 of
    /// the ~500 us of CPU per MiB that bound one connection's thread at
    /// MTU 9000) run beside the thread's sends instead of before them
    /// (docs/notes/2026-11-26-nvme-tls-9.md).
    fn seal_split(&mut self, t: &mut Tls, records: usize) -> io::Result<()> {
        let Some(Seg::Mapped { bytes, pos }) = self.segs.front_mut() else { unreachable!("a split starts at a mapped payload") };
        let ours = (records / 4).max(1);
        let mine = bytes.slice(*pos, ours * MAX_PLAINTEXT);
        let theirs = bytes.slice(*pos + ours * MAX_PLAINTEXT, (records - ours) * MAX_PLAINTEXT);
        *pos += records * MAX_PLAINTEXT;
        if *pos == bytes.len() {
            self.pop_front();
        }
        if t.helper.is_none() {
            t.helper = SealHelper::start(
                #[cfg(test)]
                t.gate.take(),
            )
            .ok();
        }
        let mut run = t.sealer.take_run(ours as u64);
        match &t.helper {
            Some(h) => {
                let job = SealJob { sealer: t.sealer.take_run((records - ours) as u64), bytes: theirs, out: std::mem::take(&mut t.spare) };
                if h.jobs.as_ref().is_some_and(|j| j.send(job).is_err()) {
                    return Err(io::Error::other("the TLS sealing thread ended"));
                }
                t.pending = Some(Pending { len: (records - ours) * MAX_PLAINTEXT });
                seal_mapped(&mut run, &mine, &mut t.records)
            }
            // No thread to be had: all of it here, in order.
            None => {
                seal_mapped(&mut run, &mine, &mut t.records)?;
                seal_mapped(&mut t.sealer, &theirs, &mut t.records)
            }
        }
    }

    fn seal_into(&mut self, t: &mut Tls, limit: usize) -> io::Result<()> {
        let mut sealed = 0;
        while sealed < limit {
            // Spent buffers off the front.
            while matches!(self.segs.front(), Some(Seg::Buf { data, pos }) if *pos == data.len()) {
                self.pop_front();
            }
            if self.segs.is_empty() {
                return Ok(());
            }
            if t.split {
                if let Some(Seg::Mapped { bytes, pos }) = self.segs.front() {
                    let left = bytes.len() - pos;
                    if left >= SPLIT_MIN {
                        let window = (limit - sealed).div_ceil(MAX_PLAINTEXT).max(SPLIT_MIN / MAX_PLAINTEXT);
                        // Anything sealed after this must wait for the
                        // helper's records: this window ends here.
                        return self.seal_split(t, (left / MAX_PLAINTEXT).min(window));
                    }
                }
            }
            t.records.reserve(HEADER_LEN + MAX_PLAINTEXT + 1 + TAG_LEN);
            let record = Sealer::begin(&mut t.records);
            let mut n = 0;
            while n < MAX_PLAINTEXT {
                let behind = self.segs.len() > 1;
                match self.segs.front_mut() {
                    Some(Seg::Buf { data, pos }) => {
                        let take = (data.len() - *pos).min(MAX_PLAINTEXT - n);
                        t.records.extend_from_slice(&data[*pos..*pos + take]);
                        *pos += take;
                        n += take;
                        if behind {
                            self.sealed -= take;
                        }
                        if *pos == data.len() {
                            self.pop_front();
                        }
                    }
                    Some(Seg::File { _vol, fd, off, left }) => {
                        let take = (*left).min(MAX_PLAINTEXT - n);
                        if let Err(e) = pread_append(&mut t.records, *fd, *off, take) {
                            _vol.note_error();
                            Sealer::abandon(&mut t.records, record);
                            return Err(e);
                        }
                        *off += take as u64;
                        *left -= take;
                        n += take;
                        if *left == 0 {
                            self.pop_front();
                        }
                    }
                    Some(Seg::Headed { .. }) => unreachable!("headed payloads are queued only without TLS"),
                    Some(Seg::Mapped { bytes, pos }) => {
                        let take = (bytes.len() - *pos).min(MAX_PLAINTEXT - n);
                        if let Err(e) = copy_mapped(bytes, *pos, take, &mut t.records) {
                            Sealer::abandon(&mut t.records, record);
                            return Err(e);
                        }
                        *pos += take;
                        n += take;
                        if *pos == bytes.len() {
                            self.pop_front();
                        }
                    }
                    None => break,
                }
            }
            // The next record's payload pages start on their way from
            // memory while this one is encrypted: copied cold, a 4 KiB
            // random read's copy waited on memory longer than its cipher
            // ran (0.6 against 0.43 us); with the hint the target's CPU per
            // read over TLS is 4.5% lower. Large sequential reads gain
            // nothing (the CPU's own prefetcher streams them);
            // docs/notes/2026-11-26-nvme-tls-7.md.
            self.prefetch_mapped(MAX_PLAINTEXT);
            t.sealer.finish(ContentType::ApplicationData, &mut t.records, record);
            sealed += n;
        }
        Ok(())
    }

    /// Prefetch the mapped payload bytes among the next `limit` bytes
    /// queued (see [`MappedBytes::prefetch`]: a hint, safe whatever became
    /// of the mapping). Byte buffers count towards `limit`; a file payload
    /// ends the look ahead (pread brings it).
    fn prefetch_mapped(&self, mut limit: usize) {
        for seg in &self.segs {
            if limit == 0 {
                return;
            }
            match seg {
                Seg::Buf { data, pos } => limit = limit.saturating_sub(data.len() - pos),
                Seg::Mapped { bytes, pos } => {
                    let take = (bytes.len() - pos).min(limit);
                    bytes.prefetch(*pos, take);
                    limit -= take;
                }
                Seg::File { .. } => return,
                Seg::Headed { .. } => unreachable!("headed payloads are queued only without TLS"),
            }
        }
    }

    /// Send everything, waiting for the socket as needed.
    pub async fn drain(&mut self, sock: &TcpStream) -> io::Result<()> {
        loop {
            self.send(sock)?;
            if self.is_empty() {
                return Ok(());
            }
            match self.sealed() {
                Some(w) => w.await,
                None => sock.writable().await?,
            }
        }
    }

    /// One `sendmsg` of the byte buffers and mapped payloads at the front
    /// (up to the next file payload), then the segments it sent are taken
    /// off.
    fn send_gathered(&mut self, sock: &TcpStream) -> io::Result<()> {
        let mut iov: [libc::iovec; MAX_IOV] = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; MAX_IOV];
        let mut n_iov = 0;
        let mut mapped = false;
        // Whether bytes stay queued behind what this call gathers.
        let mut more_after = false;
        for seg in self.segs.iter() {
            let v = match seg {
                Seg::Buf { data, pos } => libc::iovec { iov_base: data[*pos..].as_ptr() as *mut libc::c_void, iov_len: data.len() - pos },
                Seg::Mapped { bytes, pos } => bytes.iovec(*pos),
                Seg::Headed { head, hlen, bytes, pos } => {
                    // Both pieces in this call or neither.
                    if n_iov + 2 > MAX_IOV {
                        more_after = true;
                        break;
                    }
                    let h = *hlen as usize;
                    mapped = true;
                    if *pos < h {
                        iov[n_iov] = libc::iovec { iov_base: head[*pos..h].as_ptr() as *mut libc::c_void, iov_len: h - pos };
                        n_iov += 1;
                    }
                    iov[n_iov] = bytes.iovec(pos.saturating_sub(h));
                    n_iov += 1;
                    continue;
                }
                Seg::File { left, .. } => {
                    more_after = *left > 0;
                    break;
                }
            };
            if v.iov_len == 0 {
                continue;
            }
            if n_iov == MAX_IOV {
                more_after = true;
                break;
            }
            mapped |= matches!(seg, Seg::Mapped { .. });
            iov[n_iov] = v;
            n_iov += 1;
        }
        // Tell TCP more follows (a data PDU header before its file
        // payload, or pieces past MAX_IOV) so it does not push out a tiny
        // segment on its own; never when nothing follows, or the last
        // bytes would wait for TCP's cork timer (200 ms).
        let gathered: usize = iov[..n_iov].iter().map(|v| v.iov_len).sum();
        let flags = libc::MSG_NOSIGNAL | if more_after { libc::MSG_MORE } else { 0 };
        let sfd = sock.as_raw_fd();
        let r = if gathered == 0 {
            Ok(0)
        } else {
            sock.try_io(Interest::WRITABLE, || {
                // SAFETY: every iovec describes a live byte buffer of a
                // queued segment or a range of a mapping a queued segment
                // holds alive; the kernel only reads them.
                let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
                msg.msg_iov = iov.as_mut_ptr();
                msg.msg_iovlen = n_iov as _;
                let n = unsafe { libc::sendmsg(sfd, &msg, flags) };
                if n < 0 { Err(io::Error::last_os_error()) } else { Ok(n as usize) }
            })
        };
        let sent = match r {
            Ok(n) => n,
            Err(e) if mapped && e.raw_os_error() == Some(libc::EFAULT) => {
                // The kernel could not read a mapped payload: its file was
                // truncated under the mapping. The PDU stream cannot go on.
                for s in self.segs.iter() {
                    if let Seg::Mapped { bytes, .. } | Seg::Headed { bytes, .. } = s {
                        bytes.volume().note_error();
                        break;
                    }
                }
                return Err(io::Error::other("a volume's backing file shrank under its mapping (truncated by someone else?)"));
            }
            Err(e) => return Err(e),
        };
        self.take_off(sent);
        Ok(())
    }

    /// Take off the `sent` bytes that went, front first; empty buffers too.
    /// (Inlined: the second half of the send, split out only to be named.)
    #[inline(always)]
    fn take_off(&mut self, mut sent: usize) {
        let last = self.segs.len();
        for i in 0..last {
            let Some(seg) = self.segs.front_mut() else { break };
            // `counted`: its unsent bytes counted in `sealed` (they come
            // first in the segment).
            let (left, counted, pos) = match seg {
                Seg::Buf { data, pos } => {
                    let left = data.len() - *pos;
                    (left, if i + 1 < last { left } else { 0 }, pos)
                }
                Seg::Mapped { bytes, pos } => (bytes.len() - *pos, 0, pos),
                Seg::Headed { hlen, bytes, pos, .. } => {
                    let h = *hlen as usize;
                    (h + bytes.len() - *pos, h.saturating_sub(*pos), pos)
                }
                Seg::File { .. } => break,
            };
            let took = left.min(sent);
            self.sealed -= counted.min(took);
            if left <= sent {
                sent -= left;
                self.pop_front();
            } else {
                *pos += sent;
                break;
            }
        }
    }

    fn pop_front(&mut self) {
        if let Some(Seg::Buf { mut data, .. }) = self.segs.pop_front() {
            let cap = data.capacity();
            if cap <= KEEP_CAPACITY && self.spares.len() < KEEP_BUFFERS && self.spare_bytes + cap <= KEEP_BYTES {
                data.clear();
                self.spare_bytes += cap;
                self.spares.push(data);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bw_block::BackendSpec;
    use std::io::Read;

    /// Bytes queued on `sock` that TCP has not sent yet (SIOCOUTQNSD).
    fn unsent(sock: &TcpStream) -> i32 {
        const SIOCOUTQNSD: libc::c_ulong = 0x894B;
        let mut n: libc::c_int = 0;
        // SAFETY: an ioctl that writes one int.
        assert_eq!(unsafe { libc::ioctl(sock.as_raw_fd(), SIOCOUTQNSD, &mut n) }, 0);
        n
    }

    /// A RAM volume of `size` bytes, written whole with a pattern, and the pattern.
    fn patterned(size: u32) -> (Volume, Vec<u8>) {
        let vol = Volume::open("o", &BackendSpec::ram(size as u64)).unwrap();
        let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8 ^ (i >> 14) as u8).collect();
        vol.write_at(&data, 0).unwrap();
        (vol, data)
    }

    /// A connected socket, and a thread that reads all its peer gets.
    async fn read_to_end_beside() -> (TcpStream, std::thread::JoinHandle<Vec<u8>>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let sock = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (mut peer, _) = listener.accept().unwrap();
        let reader = std::thread::spawn(move || {
            let mut wire = Vec::new();
            peer.read_to_end(&mut wire).unwrap();
            wire
        });
        (sock, reader)
    }

    /// The content of every record of `wire`, opened in order, how many
    /// records, and how many bytes of `wire` they took.
    fn open_all(keys: &bw_tls::record::Keys, wire: &[u8]) -> (bytes::BytesMut, usize, usize) {
        let mut o = bw_tls::record::Opener::new(keys, false);
        let mut got = bytes::BytesMut::new();
        let (mut at, mut records) = (0, 0);
        while let Some((n, _)) = o.open(&wire[at..], &mut got).unwrap() {
            at += n;
            records += 1;
        }
        (got, records, at)
    }

    /// What waits in memory, counted as segments come and go, is what the
    /// segments hold (the driver stops reading at OUT_HIGH by it): byte
    /// buffers filled, sealed by payloads behind them, sent in pieces of
    /// every size across segment boundaries.
    #[test]
    fn buffered_counts_what_the_byte_buffers_hold() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let vol = Volume::open("o", &BackendSpec::ram(1 << 20)).unwrap();
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let sock = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
            let (mut peer, _) = listener.accept().unwrap();
            peer.set_nonblocking(true).unwrap();
            let naive = |o: &Outbox| -> usize {
                o.segs
                    .iter()
                    .map(|s| match s {
                        Seg::Buf { data, pos } => data.len() - pos,
                        Seg::Headed { hlen, pos, .. } => (*hlen as usize).saturating_sub(*pos),
                        _ => 0,
                    })
                    .sum()
            };
            let mut out = Outbox::default();
            let mut rng = 0x2545_f491_4f6c_dd1du64;
            let mut sink = vec![0u8; 1 << 20];
            for step in 0..3000 {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                match rng % 6 {
                    0 | 1 => out.buf_mut().extend(std::iter::repeat_n(7u8, (rng >> 8) as usize % 300)),
                    2 => out.push_mapped(vol.mapped_read(0, 1 + (rng >> 8) % 9000).unwrap().expect("ram is mapped")),
                    5 => {
                        let p = Payload::Mapped(vol.mapped_read(0, 9000).unwrap().expect("ram is mapped"));
                        out.push_headed(&[5u8; HEAD_MAX][..(rng >> 8) as usize % (HEAD_MAX + 1)], &p, 100, 1 + (rng >> 16) as usize % 8000);
                    }
                    3 => out.send(&sock).unwrap(),
                    _ => while matches!(std::io::Read::read(&mut peer, &mut sink), Ok(n) if n > 0) {},
                }
                assert_eq!(out.buffered(), naive(&out), "step {step}");
            }
        });
    }

    /// A copied read lands behind what the buffer held, whole, from the
    /// volume's file (pread into the spare room) or through `read_at`
    /// (a throttled volume), and a read past the end changes nothing.
    #[test]
    fn copied_reads_land_behind_the_headers() {
        let data: Vec<u8> = (0..3 * 65536u32).map(|i| (i % 253) as u8).collect();
        for limited in [false, true] {
            let vol = Volume::open("o", &BackendSpec::ram(1 << 20)).unwrap();
            if limited {
                vol.set_qos(bw_block::QosLimits { r_ios_per_sec: 1_000_000, ..Default::default() });
            }
            vol.write_at(&data, 4096).unwrap();
            let mut out = Outbox::default();
            out.buf_mut().extend_from_slice(&[9; 24]);
            let at = out.read_into(&vol, 4096 + 100, 2 * 65536 + 7).unwrap();
            assert_eq!(at, 24);
            let b = out.buf_mut();
            assert_eq!(&b[..24], &[9; 24]);
            assert!(b[24..] == data[100..100 + 2 * 65536 + 7], "limited {limited}");
            assert!(out.read_into(&vol, (1 << 20) - 10, 20).is_err());
            assert_eq!(out.buf_mut().len(), 24 + 2 * 65536 + 7);
        }
    }

    /// Headers and mapped payloads go out in order, whole, and the last of
    /// them is not held back for more (MSG_MORE would leave it to TCP's
    /// 200 ms cork timer: a 4 KiB read at queue depth 1 took 200 ms so).
    #[test]
    fn headers_and_mapped_payloads_go_out_in_order_and_nothing_waits() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let vol = Volume::open("o", &BackendSpec::ram(1 << 20)).unwrap();
            let data: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
            vol.write_at(&data, 4096).unwrap();
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let sock = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
            let (mut peer, _) = listener.accept().unwrap();
            let mut out = Outbox::default();
            let mut want = Vec::new();
            for (i, (off, len)) in [(4096u64, 4096usize), (8192, 512), (4096, 8192)].into_iter().enumerate() {
                let head = [i as u8 + 1; 24];
                out.buf_mut().extend_from_slice(&head);
                want.extend_from_slice(&head);
                out.push_mapped(vol.mapped_read(off, len as u64).unwrap().expect("ram is mapped"));
                want.extend_from_slice(&data[off as usize - 4096..][..len]);
            }
            // What a front-end leaves after its last payload: an empty buffer.
            out.buf_mut();
            out.drain(&sock).await.unwrap();
            assert!(out.is_empty());
            assert_eq!(unsent(&sock), 0, "the last bytes wait in the socket for more");
            let mut got = vec![0u8; want.len()];
            peer.read_exact(&mut got).unwrap();
            assert!(got == want, "the bytes on the wire are not the headers and payloads in order");
        });
    }

    /// Mapped reads queued with their headers (`push_headed`) go out as
    /// the headers and payloads in order, between other PDUs, sent in
    /// pieces that end anywhere (inside a header too) through a small
    /// socket buffer; each read is one segment, with no byte buffer
    /// started for its header (what the target's ~150 instructions per
    /// mapped read were); under TLS, a header too long for the segment or
    /// a file payload, they are queued as a buffer and a payload, as
    /// before.
    #[test]
    fn headed_payloads_go_out_in_order_one_segment_each() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (vol, data) = patterned(1 << 20);
            let (sock, reader) = read_to_end_beside().await;
            let small: libc::c_int = 4096;
            // SAFETY: an int-sized option on an open socket.
            let r = unsafe {
                libc::setsockopt(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_SNDBUF, &small as *const _ as *const libc::c_void, 4)
            };
            assert_eq!(r, 0);
            let mut out = Outbox::default();
            let mut want = Vec::new();
            let mut segs = 0;
            for i in 0..200usize {
                let (off, len) = ((i * 7919 % 200) as u64 * 4096, 1 + i * 977 % 12000);
                let p = out.payload(&vol, off, len, false, true).unwrap().expect("ram is mapped");
                let head: Vec<u8> = (0..[24, 28, 1, 0][i % 4]).map(|j| (i + j) as u8).collect();
                out.push_headed(&head, &p, 0, len);
                want.extend_from_slice(&head);
                want.extend_from_slice(&data[off as usize..][..len]);
                segs += 1;
                if i % 50 == 49 {
                    // Another PDU behind: a byte buffer.
                    out.buf_mut().extend_from_slice(&[0xee; 24]);
                    want.extend_from_slice(&[0xee; 24]);
                    segs += 1;
                }
                if i % 50 == 10 {
                    assert_eq!(out.segs.len(), segs, "a read is one segment");
                    assert!(out.spares.is_empty() && out.spare_bytes == 0, "no byte buffer taken for a header");
                    // Partly sent; `buffered` still what the headers hold.
                    out.send(&sock).unwrap();
                    segs = out.segs.len();
                }
            }
            out.drain(&sock).await.unwrap();
            assert!(out.is_empty() && out.buffered() == 0);
            drop(sock);
            let got = reader.join().unwrap();
            assert!(got.len() == want.len() && got == want, "the wire is not the headers and payloads in order");
        });
        // The other cases: a header and a payload segment, as before.
        let (vol, _) = patterned(1 << 20);
        let mapped = Payload::Mapped(vol.mapped_read(0, 8192).unwrap().unwrap());
        let mut out = Outbox::default();
        out.push_headed(&[1; HEAD_MAX + 1], &mapped, 0, 4096);
        assert!(matches!(out.segs.make_contiguous(), [Seg::Buf { .. }, Seg::Mapped { .. }]), "a long header");
        let file = out.payload(&vol, 0, 1 << 20, true, false).unwrap().unwrap();
        let mut out = Outbox::default();
        out.push_headed(&[1; 24], &file, 0, 1 << 20);
        assert!(matches!(out.segs.make_contiguous(), [Seg::Buf { .. }, Seg::File { .. }]), "a file payload");
        use bw_tls::record::Keys;
        let mut out = Outbox::default();
        out.set_tls(Sealer::new(&Keys::from_secret(bw_tls::Suite::Aes128GcmSha256, &[1u8; 32])), TlsSealing::Inline);
        out.push_headed(&[1; 24], &mapped, 0, 4096);
        assert!(matches!(out.segs.make_contiguous(), [Seg::Buf { .. }, Seg::Mapped { .. }]), "under TLS");
    }

    /// User-space TLS: a buffer sealed in part takes no more PDUs (it is
    /// taken off and kept for reuse once sealed, not grown without end),
    /// and what is queued is counted right throughout.
    #[test]
    fn tls_buffers_sealed_in_part_take_no_more() {
        use bw_tls::record::{Keys, Opener};
        use bw_tls::Suite;
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let keys = || Keys::from_secret(Suite::Aes128GcmSha256, &[6u8; 32]);
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let sock = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
            let (mut peer, _) = listener.accept().unwrap();
            let mut out = Outbox::default();
            out.set_tls(Sealer::new(&keys()), TlsSealing::Thread);
            // More than is sealed ahead at once, and than the socket takes:
            // the buffer stays, sealed in part.
            // (16 MiB: more than loopback's socket buffers hold.)
            let big: Vec<u8> = (0..64 * SEAL_AHEAD + 7).map(|j| (j % 251) as u8).collect();
            out.buf_mut().extend_from_slice(&big);
            out.send(&sock).unwrap();
            assert!(matches!(out.segs.front(), Some(Seg::Buf { pos, data }) if *pos > 0 && *pos < data.len()));
            let before = out.buffered();
            out.buf_mut().extend_from_slice(b"next pdu");
            // A new buffer behind the one sealed in part, and counted.
            assert_eq!(out.segs.len(), 2);
            assert_eq!(out.buffered(), before + 8);
            let reader = std::thread::spawn(move || {
                let mut wire = Vec::new();
                peer.read_to_end(&mut wire).unwrap();
                wire
            });
            out.drain(&sock).await.unwrap();
            assert!(out.is_empty() && out.buffered() == 0, "{} bytes left counted", out.buffered());
            drop(sock);
            let wire = reader.join().unwrap();
            let mut o = Opener::new(&keys(), false);
            let mut got = bytes::BytesMut::new();
            let mut at = 0;
            while let Some((n, _)) = o.open(&wire[at..], &mut got).unwrap() {
                at += n;
            }
            let mut want = big;
            want.extend_from_slice(b"next pdu");
            assert!(at == wire.len() && got[..] == want[..]);
        });
    }

    /// User-space TLS: reads queued as file or mapped payloads between PDU
    /// headers are read or copied into the records themselves and come out whole and in
    /// order, records full across the headers' and payloads' boundaries;
    /// a payload whose file cannot be read breaks the stream with an
    /// error (as sendfile's would) and sends nothing of its record.
    #[test]
    fn tls_payloads_are_read_into_the_records() {
        use bw_tls::record::Keys;
        use bw_tls::Suite;
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let keys = || Keys::from_secret(Suite::Aes128GcmSha256, &[4u8; 32]);
            let (vol, data) = patterned(4 << 20);
            let (sock, reader) = read_to_end_beside().await;
            let mut out = Outbox::default();
            out.set_tls(Sealer::new(&keys()), TlsSealing::Thread);
            let mut want = Vec::new();
            for (i, (off, len)) in [(0u64, 4096usize), (8192, 1 << 20), (100, 5), ((3 << 20) + 1, 70_000)].into_iter().enumerate() {
                let head = [i as u8 + 1; 24];
                out.buf_mut().extend_from_slice(&head);
                want.extend_from_slice(&head);
                // File payloads (pread) and mapped ones (copied) in turn.
                let p = Payload::of(&vol, off, len, i % 2 == 0, i % 2 == 1).unwrap().expect("a RAM volume has a file and a mapping");
                out.push_payload(&p, 0, len);
                want.extend_from_slice(&data[off as usize..][..len]);
            }
            out.buf_mut().extend_from_slice(b"last");
            want.extend_from_slice(b"last");
            out.drain(&sock).await.unwrap();
            assert!(out.is_empty() && out.buffered() == 0);
            // A payload past the file's end: an error, no record of it.
            out.buf_mut().extend_from_slice(&[9; 24]);
            let fd = vol.zero_copy_read(0, 1).unwrap().unwrap().as_raw_fd();
            out.push_file(vol.clone(), fd, 4 << 20, 10);
            assert!(out.send(&sock).is_err(), "a payload past the end of its file was sent");
            drop(sock);
            let wire = reader.join().unwrap();
            let (got, records, at) = open_all(&keys(), &wire);
            assert!(at == wire.len() && got[..] == want[..], "the records do not hold the headers and payloads in order");
            assert_eq!(records, want.len().div_ceil(MAX_PLAINTEXT), "records not filled across the pieces");
        });
    }

    /// User-space TLS: a large mapped read is sealed in part on the
    /// helper thread (`tls_sealing = "thread"`), or all on the
    /// connection's (`"inline"`: no helper ever starts), and either way its
    /// records come out in order with the sequence numbers the peer
    /// expects (it opens them one after the other), full, behind and
    /// before the PDUs around it; small reads never start the helper.
    #[test]
    fn large_mapped_reads_are_sealed_in_order_inline_or_on_two_threads() {
        for how in [TlsSealing::Thread, TlsSealing::Inline] {
            large_mapped_reads_sealed(how);
        }
    }

    fn large_mapped_reads_sealed(how: TlsSealing) {
        use bw_tls::record::Keys;
        use bw_tls::Suite;
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let keys = || Keys::from_secret(Suite::Aes128GcmSha256, &[3u8; 32]);
            let (vol, data) = patterned(8 << 20);
            let (sock, reader) = read_to_end_beside().await;
            let mut out = Outbox::default();
            out.set_tls(Sealer::new(&keys()), how);
            let mut want = Vec::new();
            for (i, (off, len)) in [(0u64, 4096usize), (4096, 1 << 20), (5 << 20, 3 << 20), (7, 200_001), (1 << 20, 4096)].into_iter().enumerate() {
                let head = [i as u8 + 1; 24];
                out.buf_mut().extend_from_slice(&head);
                want.extend_from_slice(&head);
                out.push_mapped(vol.mapped_read(off, len as u64).unwrap().expect("ram is mapped"));
                want.extend_from_slice(&data[off as usize..][..len]);
                if i == 0 {
                    out.drain(&sock).await.unwrap();
                    assert!(out.tls.as_ref().unwrap().helper.is_none(), "a 4 KiB read started the helper");
                }
            }
            out.buf_mut().extend_from_slice(b"last");
            want.extend_from_slice(b"last");
            out.drain(&sock).await.unwrap();
            assert!(out.is_empty() && out.buffered() == 0);
            let helper = out.tls.as_ref().unwrap().helper.is_some();
            assert_eq!(helper, how == TlsSealing::Thread, "{how:?}: a helper thread {}", if helper { "started" } else { "never started" });
            out.close_notify();
            out.drain(&sock).await.unwrap();
            drop(sock);
            let wire = reader.join().unwrap();
            let (got, records, at) = open_all(&keys(), &wire);
            assert_eq!(at, wire.len());
            assert!(got[..] == want[..], "the records do not hold the headers and payloads in order");
            // The 4 KiB read went out on its own; the rest in full records.
            assert_eq!(records, 1 + (want.len() - 4096 - 24).div_ceil(MAX_PLAINTEXT) + 1, "records not full");
        });
    }

    /// User-space TLS: while the helper seals part of a large read, a
    /// send never waits for it: it returns with the helper's run still out
    /// (the driver goes on taking PDUs, queued behind it), the driver's
    /// wake for it stays pending until the helper hands its records back,
    /// and then fires; the wire still has every record in sequence and the
    /// PDUs in order, the close_notify last. (Waiting for the helper in
    /// the send, as before, held the helper's gate until it gave up.)
    #[test]
    fn a_send_does_not_wait_for_the_sealing_thread() {
        use bw_tls::record::Keys;
        use bw_tls::Suite;
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        use std::task::{Context, Poll, Waker};
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let keys = || Keys::from_secret(Suite::Aes128GcmSha256, &[7u8; 32]);
            let (vol, data) = patterned(2 << 20);
            let (sock, reader) = read_to_end_beside().await;
            let mut out = Outbox::default();
            out.set_tls(Sealer::new(&keys()), TlsSealing::Thread);
            let (go, held) = std::sync::mpsc::channel();
            let gave_up = Arc::new(AtomicBool::new(false));
            out.tls.as_mut().unwrap().gate = Some(Gate { go: held, gave_up: gave_up.clone() });
            let mut want = Vec::new();
            out.buf_mut().extend_from_slice(&[1; 24]);
            want.extend_from_slice(&[1; 24]);
            out.push_mapped(vol.mapped_read(0, 1 << 20).unwrap().expect("ram is mapped"));
            want.extend_from_slice(&data[..1 << 20]);
            // Our share of the first window out; then only the helper's
            // records are next.
            while out.sealed().is_none() && !out.is_empty() {
                out.send(&sock).unwrap();
                if out.sealed().is_none() {
                    sock.writable().await.unwrap();
                }
            }
            assert!(out.sealed().is_some() && !gave_up.load(Ordering::SeqCst), "the send waited for the sealing thread");
            assert!(!out.can_send(), "a writable socket would wake the driver for nothing");
            // Other work meanwhile: a response queued and sent behind the
            // run goes nowhere yet, and the send comes back at once.
            out.buf_mut().extend_from_slice(b"a 4 KiB read's response");
            want.extend_from_slice(b"a 4 KiB read's response");
            out.send(&sock).unwrap();
            let mut wake = Box::pin(out.sealed().expect("still the helper's turn"));
            assert!(wake.as_mut().poll(&mut Context::from_waker(Waker::noop())) == Poll::Pending, "woken with nothing handed back");
            assert!(!gave_up.load(Ordering::SeqCst));
            // Let the helper go (each of its runs): its wake brings the rest.
            drop(go);
            wake.await;
            out.close_notify();
            out.drain(&sock).await.unwrap();
            assert!(out.is_empty() && out.buffered() == 0);
            drop(sock);
            let wire = reader.join().unwrap();
            let (got, _, at) = open_all(&keys(), &wire);
            assert_eq!(at, wire.len(), "records left unopened (the close_notify is not last?)");
            assert!(got[..] == want[..], "the records do not hold the PDUs in order");
        });
    }

    /// A connection that ends while the helper seals part of a read (its
    /// peer stopped reading) releases the helper and what it held (the
    /// mapping) when its outbox goes: nothing is left running.
    #[test]
    fn a_connection_ended_mid_read_ends_its_sealing_thread() {
        use bw_tls::record::Keys;
        use bw_tls::Suite;
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let vol = Volume::open("o", &BackendSpec::ram(16 << 20)).unwrap();
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let sock = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
            let (_peer, _) = listener.accept().unwrap();
            let mut out = Outbox::default();
            out.set_tls(Sealer::new(&Keys::from_secret(Suite::Aes128GcmSha256, &[2u8; 32])), TlsSealing::Thread);
            out.buf_mut().extend_from_slice(&[1; 24]);
            out.push_mapped(vol.mapped_read(0, 16 << 20).unwrap().expect("ram is mapped"));
            out.send(&sock).unwrap();
            let t = out.tls.as_ref().unwrap();
            assert!(t.pending.is_some(), "the socket filled with no run on the helper");
            let running = t.helper.as_ref().unwrap().running.clone();
            assert!(running.upgrade().is_some());
            drop(out);
            assert!(running.upgrade().is_none(), "the sealing thread outlived its connection's outbox");
        });
    }

    /// With user-space TLS a read that would go out with sendfile is
    /// copied into the records from the volume's mapping, not read with
    /// pread; without TLS, or without a mapping to use, it stays a file
    /// payload.
    #[test]
    fn tls_payloads_come_from_the_mapping() {
        use bw_tls::record::Keys;
        use bw_tls::Suite;
        let vol = Volume::open("o", &BackendSpec::ram(4 << 20)).unwrap();
        let mut out = Outbox::default();
        let kind = |o: &Outbox, mapped| match o.payload(&vol, 4096, 1 << 20, true, mapped).unwrap() {
            Some(Payload::File { .. }) => "file",
            Some(Payload::Mapped(_)) => "mapped",
            None => "copied",
        };
        assert_eq!((kind(&out, true), kind(&out, false)), ("file", "file"));
        out.set_tls(Sealer::new(&Keys::from_secret(Suite::Aes128GcmSha256, &[1u8; 32])), TlsSealing::Thread);
        assert_eq!((kind(&out, true), kind(&out, false)), ("mapped", "file"));
    }

    /// User-space TLS: PDUs of every size (past one record, across record
    /// boundaries) come out as records the peer opens to the same bytes,
    /// in order, then a close_notify; nothing is held back.
    #[test]
    fn queued_buffers_go_out_as_tls_records() {
        use bw_tls::record::{Keys, Opened, Opener};
        use bw_tls::Suite;
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let keys = || Keys::from_secret(Suite::Aes256GcmSha384, &[5u8; 48]);
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let sock = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
            let (mut peer, _) = listener.accept().unwrap();
            let mut out = Outbox::default();
            out.set_tls(Sealer::new(&keys()), TlsSealing::Thread);
            let mut want = Vec::new();
            for (i, len) in [24usize, 4096, 24, 70_000, 1, 16384].into_iter().enumerate() {
                let pdu: Vec<u8> = (0..len).map(|j| (i * 31 + j) as u8).collect();
                out.buf_mut().extend_from_slice(&pdu);
                want.extend_from_slice(&pdu);
                if i == 2 {
                    out.buf_mut();
                    out.send(&sock).unwrap();
                }
            }
            out.close_notify();
            out.drain(&sock).await.unwrap();
            assert!(out.is_empty() && out.buffered() == 0);
            assert_eq!(unsent(&sock), 0);
            drop(sock);
            let mut wire = Vec::new();
            peer.read_to_end(&mut wire).unwrap();
            let mut o = Opener::new(&keys(), false);
            let mut got = bytes::BytesMut::new();
            let mut at = 0;
            let mut closed = false;
            while let Some((n, what)) = o.open(&wire[at..], &mut got).unwrap() {
                at += n;
                closed = what == Opened::Closed;
            }
            assert!(closed && at == wire.len());
            assert!(got[..] == want[..], "the records do not hold the PDUs in order");
        });
    }
}
