//! What one connection still has to send, in order, for both TCP
//! front-ends: encoded PDUs in byte buffers and, between them, read
//! payloads that go straight from a volume's backing file to the socket
//! with sendfile(2) (no copy through user space). Small reads are read
//! straight into the byte buffer behind their PDU header
//! ([`Outbox::read_into`]), so their data is copied once, by the read.
//! Sending never blocks: [`Outbox::send`] writes what the socket takes and
//! leaves the rest for the next writable event; [`Outbox::drain`] waits.

use bw_block::Volume;
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use tokio::io::Interest;
use tokio::net::TcpStream;

/// Byte buffers larger than this are not kept for reuse.
const KEEP_CAPACITY: usize = 1 << 20;

enum Seg {
    Buf { data: Vec<u8>, pos: usize },
    /// `len` bytes of the file at `off`. The volume clone keeps the
    /// backend, and so `fd`, open until the bytes are sent.
    File { _vol: Volume, fd: RawFd, off: u64, left: usize },
}

#[derive(Default)]
pub struct Outbox {
    segs: VecDeque<Seg>,
    spare: Vec<u8>,
}

impl Outbox {
    pub fn is_empty(&self) -> bool {
        self.segs.is_empty()
    }

    /// Bytes held in memory waiting to be sent (file payloads not counted).
    pub fn buffered(&self) -> usize {
        self.segs
            .iter()
            .map(|s| match s {
                Seg::Buf { data, pos } => data.len() - pos,
                Seg::File { .. } => 0,
            })
            .sum()
    }

    /// The buffer new PDUs are appended to (after everything queued).
    pub fn buf_mut(&mut self) -> &mut Vec<u8> {
        if !matches!(self.segs.back(), Some(Seg::Buf { .. })) {
            let data = std::mem::take(&mut self.spare);
            self.segs.push_back(Seg::Buf { data, pos: 0 });
        }
        match self.segs.back_mut() {
            Some(Seg::Buf { data, .. }) => data,
            _ => unreachable!("a byte buffer was just pushed"),
        }
    }

    /// Queue `len` bytes of `vol`'s backing file `fd` at `off`.
    pub fn push_file(&mut self, vol: Volume, fd: RawFd, off: u64, len: usize) {
        if len > 0 {
            self.segs.push_back(Seg::File { _vol: vol, fd, off, left: len });
        }
    }

    /// Append `len` bytes of `vol` at `off` to the buffer (after what is
    /// queued); returns where they start in [`Outbox::buf_mut`]. On an
    /// error the buffer is as it was.
    pub fn read_into(&mut self, vol: &Volume, off: u64, len: usize) -> bw_block::Result<usize> {
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
        let sfd = sock.as_raw_fd();
        loop {
            // Tell TCP more follows (a data PDU header before its payload)
            // so it does not push out a tiny segment on its own.
            let more = self.segs.len() > 1;
            let Some(seg) = self.segs.front_mut() else { break };
            let r = match seg {
                Seg::Buf { data, pos } => {
                    if *pos == data.len() {
                        self.pop_front();
                        continue;
                    }
                    let chunk = &data[*pos..];
                    let flags = libc::MSG_NOSIGNAL | if more { libc::MSG_MORE } else { 0 };
                    sock.try_io(Interest::WRITABLE, || {
                        // SAFETY: the pointer and length describe a live slice.
                        let n = unsafe { libc::send(sfd, chunk.as_ptr().cast(), chunk.len(), flags) };
                        if n < 0 { Err(io::Error::last_os_error()) } else { Ok(n as usize) }
                    })
                    .map(|n| *pos += n)
                }
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

    /// Send everything, waiting for the socket as needed.
    pub async fn drain(&mut self, sock: &TcpStream) -> io::Result<()> {
        loop {
            self.send(sock)?;
            if self.is_empty() {
                return Ok(());
            }
            sock.writable().await?;
        }
    }

    fn pop_front(&mut self) {
        if let Some(Seg::Buf { mut data, .. }) = self.segs.pop_front() {
            if data.capacity() <= KEEP_CAPACITY && data.capacity() > self.spare.capacity() {
                data.clear();
                self.spare = data;
            }
        }
    }
}
