//! Requests that complete later: [`crate::BlockDevice::submit`].

use bytes::Bytes;
use std::io;

/// A read or write that owns its memory for as long as the backend works
/// on it, so it can be handed to a backend's own threads and come back.
#[derive(Debug)]
pub enum Request {
    /// Read `len` bytes from byte `offset` into `buf`. Submitted empty
    /// (only its capacity is used, so no time goes into zeroing memory the
    /// read overwrites: that was 5% of a gateway's CPU at 1 MiB); holds
    /// the `len` bytes once the read succeeded. Holes read back as zeroes.
    Read { offset: u64, len: usize, buf: Vec<u8> },
    /// Write the pieces one after another from byte `offset`: the data in
    /// the pieces a transport received it in, never joined into one buffer.
    Write { offset: u64, data: Vec<Bytes> },
}

impl Request {
    /// A read of `len` bytes at `offset`, into a new buffer.
    pub fn read(offset: u64, len: usize) -> Request {
        Request::Read { offset, len, buf: Vec::with_capacity(len) }
    }

    pub fn offset(&self) -> u64 {
        match self {
            Request::Read { offset, .. } | Request::Write { offset, .. } => *offset,
        }
    }

    /// Bytes read or written.
    pub fn len(&self) -> u64 {
        match self {
            Request::Read { len, .. } => *len as u64,
            Request::Write { data, .. } => data.iter().map(|b| b.len() as u64).sum(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn is_write(&self) -> bool {
        matches!(self, Request::Write { .. })
    }

    /// A read's buffer (with the data, once completed); empty for a write.
    pub fn into_buf(self) -> Vec<u8> {
        match self {
            Request::Read { buf, .. } => buf,
            Request::Write { .. } => Vec::new(),
        }
    }
}

/// What a backend calls when a submitted request has ended: the request
/// back, and its result.
pub type OnDone = Box<dyn FnOnce(Request, io::Result<()>) + Send>;

/// Write `data`'s pieces one after another from `offset` with `write`.
pub(crate) fn write_pieces(data: &[Bytes], offset: u64, mut write: impl FnMut(&[u8], u64) -> io::Result<()>) -> io::Result<()> {
    let mut at = offset;
    for piece in data {
        if !piece.is_empty() {
            write(piece, at)?;
        }
        at += piece.len() as u64;
    }
    Ok(())
}
