//! Requests that complete later: [`crate::BlockDevice::submit`].

use bytes::Bytes;
use std::io;

/// A read or write that owns its memory for as long as the backend works
/// on it, so it can be handed to a backend's own threads and come back.
#[derive(Debug)]
pub enum Request {
    /// Fill all of `buf` from byte `offset`; holes read back as zeroes.
    Read { offset: u64, buf: Vec<u8> },
    /// Write the pieces one after another from byte `offset`: the data in
    /// the pieces a transport received it in, never joined into one buffer.
    Write { offset: u64, data: Vec<Bytes> },
}

impl Request {
    pub fn offset(&self) -> u64 {
        match self {
            Request::Read { offset, .. } | Request::Write { offset, .. } => *offset,
        }
    }

    /// Bytes read or written.
    pub fn len(&self) -> u64 {
        match self {
            Request::Read { buf, .. } => buf.len() as u64,
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
