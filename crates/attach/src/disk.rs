//! Running a request's volume I/O ([`crate::fs::Io`]) on the initiator:
//! byte ranges widened to whole blocks, partial-block writes as
//! read-modify-write, errors as errnos.

use bw_initiator::{BlockClient, ClientError};
use std::sync::Arc;
use tokio::sync::RwLock;

pub struct Disk {
    pub client: Arc<dyn BlockClient>,
    block: u64,
    /// Aligned writes share this lock; a read-modify-write of a partial
    /// block holds it alone, so it never undoes a concurrent write to the
    /// other part of that block.
    rmw: RwLock<()>,
}

/// The errno a failed request answers with.
pub fn errno(e: &ClientError) -> i32 {
    match e {
        ClientError::OutOfRange { .. } => libc::EINVAL,
        ClientError::Unsupported(_) => libc::EOPNOTSUPP,
        _ => libc::EIO,
    }
}

impl Disk {
    pub fn new(client: Arc<dyn BlockClient>) -> Disk {
        Disk {
            block: client.block_size() as u64,
            client,
            rmw: RwLock::new(()),
        }
    }

    /// Fill `buf` from `offset` (already clamped to the volume), widening to
    /// whole blocks when the range is not aligned.
    pub async fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ClientError> {
        let bs = self.block;
        let start = offset / bs * bs;
        let end = (offset + buf.len() as u64).div_ceil(bs) * bs;
        if start == offset && end == offset + buf.len() as u64 {
            return self.client.read(offset, buf).await;
        }
        let mut wide = vec![0u8; (end - start) as usize];
        self.client.read(start, &mut wide).await?;
        let skip = (offset - start) as usize;
        buf.copy_from_slice(&wide[skip..skip + buf.len()]);
        Ok(())
    }

    pub async fn write(&self, offset: u64, data: &[u8]) -> Result<(), ClientError> {
        let bs = self.block;
        let end = offset + data.len() as u64;
        if offset.is_multiple_of(bs) && end.is_multiple_of(bs) {
            let _shared = self.rmw.read().await;
            return self.client.write(offset, data).await;
        }
        let _alone = self.rmw.write().await;
        let start = offset / bs * bs;
        let wide_end = end.div_ceil(bs) * bs;
        let mut buf = vec![0u8; (wide_end - start) as usize];
        // Only the first and last blocks hold bytes we must keep.
        self.client.read(start, &mut buf[..bs as usize]).await?;
        if wide_end - bs > start {
            let tail = (wide_end - bs - start) as usize;
            self.client.read(wide_end - bs, &mut buf[tail..]).await?;
        }
        let at = (offset - start) as usize;
        buf[at..at + data.len()].copy_from_slice(data);
        self.client.write(start, &buf).await
    }

    /// [`Disk::write`] of a buffer the client may keep instead of copying.
    pub async fn write_owned(&self, offset: u64, data: bytes::Bytes) -> Result<(), ClientError> {
        let end = offset + data.len() as u64;
        if !offset.is_multiple_of(self.block) || !end.is_multiple_of(self.block) {
            return self.write(offset, &data).await;
        }
        let _shared = self.rmw.read().await;
        self.client.write_owned(offset, data).await
    }

    pub async fn flush(&self) -> Result<(), ClientError> {
        self.client.flush().await
    }

    pub async fn discard(&self, offset: u64, len: u64) -> Result<(), ClientError> {
        // Ordered like an aligned write against read-modify-writes.
        let _shared = self.rmw.read().await;
        self.client.discard(offset, len).await
    }
}

/// [`crate::fs::Io`] without the borrow: a write's data is named by its place
/// in the request buffer, so the buffer itself can move into the task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Job {
    Read {
        offset: u64,
        len: usize,
    },
    Write {
        offset: u64,
        data: std::ops::Range<usize>,
    },
    Flush,
    Discard {
        offset: u64,
        len: u64,
    },
}

impl Job {
    /// `io` as a job on `buf`, the buffer its borrowed data lives in.
    pub fn new(io: &crate::fs::Io<'_>, buf: &[u8]) -> Job {
        use crate::fs::Io;
        match *io {
            Io::Read { offset, len } => Job::Read { offset, len },
            Io::Write { offset, data } => {
                let at = data.as_ptr() as usize - buf.as_ptr() as usize;
                Job::Write {
                    offset,
                    data: at..at + data.len(),
                }
            }
            Io::Flush => Job::Flush,
            Io::Discard { offset, len } => Job::Discard { offset, len },
        }
    }
}

/// How a job ended, i.e. what the answer carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Done {
    /// The first n bytes of the buffer (a read).
    Data(usize),
    /// fuse_write_out with this size.
    Written(u32),
    Empty,
    /// A positive errno.
    Failed(i32),
}

impl Disk {
    /// Run a write `job` whose request buffer is handed over as `buf`, for
    /// the client to send from without copying it.
    pub async fn run_owned(&self, job: &Job, buf: bytes::Bytes) -> Done {
        match job {
            Job::Write { offset, data } => {
                let r = self.write_owned(*offset, buf.slice(data.clone())).await;
                self.done(job, r.map(|()| Done::Written(data.len() as u32)))
            }
            _ => Done::Failed(libc::EINVAL),
        }
    }

    /// Run `job`; a read lands in `buf[..len]`, a write's data comes from `buf`.
    pub async fn run(&self, job: &Job, buf: &mut [u8]) -> Done {
        let r = match job {
            Job::Read { offset, len } => self
                .read(*offset, &mut buf[..*len])
                .await
                .map(|()| Done::Data(*len)),
            Job::Write { offset, data } => self
                .write(*offset, &buf[data.clone()])
                .await
                .map(|()| Done::Written(data.len() as u32)),
            Job::Flush => self.flush().await.map(|()| Done::Empty),
            Job::Discard { offset, len } => self.discard(*offset, *len).await.map(|()| Done::Empty),
        };
        self.done(job, r)
    }

    fn done(&self, job: &Job, r: Result<Done, ClientError>) -> Done {
        r.unwrap_or_else(|e| {
            // A discard the target cannot do is an answer, not a failure.
            if matches!(e, ClientError::Unsupported(_)) {
                log::debug!("{job:?}: {e}");
            } else {
                log::warn!("{job:?}: {e}");
            }
            Done::Failed(errno(&e))
        })
    }
}
