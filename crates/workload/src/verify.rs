//! `blockwire verify`: write the pattern over a range, flush, read it back and
//! compare. Several chunks are in flight at once so the check also exercises
//! the client's and target's concurrency.

use crate::pattern;
use bw_initiator::{BlockClient, ClientError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

#[derive(Debug, Clone)]
pub struct VerifyParams {
    pub offset: u64,
    pub size: u64,
    pub seed: u64,
    /// Bytes per request.
    pub chunk: usize,
    /// Requests in flight.
    pub concurrency: usize,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct VerifyReport {
    pub offset: u64,
    pub size: u64,
    pub write_s: f64,
    pub read_s: f64,
}

#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("invalid range: {0}")]
    Range(String),
    #[error("{phase} at offset {offset} failed")]
    Io { phase: &'static str, offset: u64, source: ClientError },
    #[error("data mismatch at byte offset {offset} (sector {}): expected 0x{expected:02x}, found 0x{found:02x}", offset / 512)]
    Mismatch { offset: u64, expected: u8, found: u8 },
}

pub async fn verify(client: Arc<dyn BlockClient>, p: &VerifyParams) -> Result<VerifyReport, VerifyError> {
    let bs = client.block_size() as u64;
    let dev = client.size_bytes();
    if !p.offset.is_multiple_of(bs) || !p.size.is_multiple_of(bs) || p.size == 0 {
        return Err(VerifyError::Range(format!("offset and size must be non-zero multiples of {bs} bytes")));
    }
    if p.offset.checked_add(p.size).is_none_or(|end| end > dev) {
        return Err(VerifyError::Range(format!(
            "offset {} + size {} is past the end of the device ({dev} bytes)",
            p.offset, p.size
        )));
    }
    let chunk = (p.chunk as u64 / bs * bs).max(bs);
    let t0 = Instant::now();
    run_phase(&client, p, chunk, Phase::Write).await?;
    client.flush().await.map_err(|source| VerifyError::Io { phase: "flush", offset: 0, source })?;
    let write_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    run_phase(&client, p, chunk, Phase::Read).await?;
    Ok(VerifyReport { offset: p.offset, size: p.size, write_s, read_s: t1.elapsed().as_secs_f64() })
}

#[derive(Clone, Copy, PartialEq)]
enum Phase {
    Write,
    Read,
}

async fn run_phase(client: &Arc<dyn BlockClient>, p: &VerifyParams, chunk: u64, phase: Phase) -> Result<(), VerifyError> {
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..p.concurrency.max(1) {
        let (client, next, p) = (client.clone(), next.clone(), p.clone());
        tasks.spawn(async move {
            let mut buf = vec![0u8; chunk as usize];
            loop {
                let rel = next.fetch_add(chunk, Ordering::Relaxed);
                if rel >= p.size {
                    return Ok(());
                }
                let off = p.offset + rel;
                let len = chunk.min(p.size - rel) as usize;
                let b = &mut buf[..len];
                match phase {
                    Phase::Write => {
                        pattern::fill(b, off, p.seed);
                        client.write(off, b).await.map_err(|source| VerifyError::Io { phase: "write", offset: off, source })?;
                    }
                    Phase::Read => {
                        b.fill(0);
                        client.read(off, b).await.map_err(|source| VerifyError::Io { phase: "read", offset: off, source })?;
                        if let Some((offset, expected, found)) = pattern::check(b, off, p.seed) {
                            return Err(VerifyError::Mismatch { offset, expected, found });
                        }
                    }
                }
            }
        });
    }
    // Report the lowest bad offset when several chunks fail.
    let mut first: Option<VerifyError> = None;
    while let Some(r) = tasks.join_next().await {
        let r = r.unwrap_or_else(|e| Err(VerifyError::Range(format!("worker panicked: {e}"))));
        if let Err(e) = r {
            let better = match (&first, &e) {
                (None, _) => true,
                (Some(VerifyError::Mismatch { offset: a, .. }), VerifyError::Mismatch { offset: b, .. }) => b < a,
                (Some(VerifyError::Mismatch { .. }), _) => false,
                (Some(_), VerifyError::Mismatch { .. }) => true,
                _ => false,
            };
            if better {
                first = Some(e);
            }
            // Stop the rest quickly: no new chunks get picked.
            next.store(u64::MAX / 2, Ordering::Relaxed);
        }
    }
    first.map_or(Ok(()), Err)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use async_trait::async_trait;
    use std::sync::Mutex;

    /// An in-memory client; `corrupt_at` flips a byte on read to test detection.
    pub struct MemClient {
        pub data: Mutex<Vec<u8>>,
        pub corrupt_at: Option<u64>,
    }

    impl MemClient {
        fn read_mem(&self, offset: u64, buf: &mut [u8]) -> bw_initiator::Result<()> {
            bw_initiator::check_range(self, offset, buf.len())?;
            let d = self.data.lock().unwrap();
            buf.copy_from_slice(&d[offset as usize..offset as usize + buf.len()]);
            if let Some(c) = self.corrupt_at {
                if c >= offset && c < offset + buf.len() as u64 {
                    buf[(c - offset) as usize] ^= 1;
                }
            }
            Ok(())
        }
        fn write_mem(&self, offset: u64, data: &[u8]) -> bw_initiator::Result<()> {
            bw_initiator::check_range(self, offset, data.len())?;
            self.data.lock().unwrap()[offset as usize..offset as usize + data.len()].copy_from_slice(data);
            Ok(())
        }
    }

    impl bw_initiator::HeldIo for MemClient {
        async fn read_held(&self, offset: u64, buf: &mut [u8]) -> bw_initiator::Result<()> {
            self.read_mem(offset, buf)
        }
        async fn write_owned_held(&self, offset: u64, data: bytes::Bytes) -> bw_initiator::Result<()> {
            self.write_mem(offset, &data)
        }
    }

    #[async_trait]
    impl BlockClient for MemClient {
        fn describe(&self) -> String {
            "mem".into()
        }
        fn size_bytes(&self) -> u64 {
            self.data.lock().unwrap().len() as u64
        }
        async fn read(&self, offset: u64, buf: &mut [u8]) -> bw_initiator::Result<()> {
            self.read_mem(offset, buf)
        }
        async fn write(&self, offset: u64, data: &[u8]) -> bw_initiator::Result<()> {
            self.write_mem(offset, data)
        }
        async fn flush(&self) -> bw_initiator::Result<()> {
            Ok(())
        }
        async fn close(&self) -> bw_initiator::Result<()> {
            Ok(())
        }
    }

    pub fn mem(size: usize, corrupt_at: Option<u64>) -> Arc<dyn BlockClient> {
        mem_typed(size, corrupt_at)
    }

    pub fn mem_typed(size: usize, corrupt_at: Option<u64>) -> Arc<MemClient> {
        Arc::new(MemClient { data: Mutex::new(vec![0; size]), corrupt_at })
    }

    fn params(size: u64) -> VerifyParams {
        VerifyParams { offset: 4096, size, seed: 1, chunk: 64 << 10, concurrency: 4 }
    }

    #[tokio::test]
    async fn passes_on_a_good_device() {
        verify(mem(4 << 20, None), &params(3 << 20)).await.unwrap();
    }

    #[tokio::test]
    async fn names_the_first_bad_offset() {
        let e = verify(mem(4 << 20, Some(1_000_003)), &params(3 << 20)).await.unwrap_err();
        assert!(matches!(e, VerifyError::Mismatch { offset: 1_000_003, .. }), "{e}");
    }

    #[tokio::test]
    async fn rejects_ranges_past_the_end() {
        assert!(matches!(verify(mem(1 << 20, None), &params(1 << 20)).await, Err(VerifyError::Range(_))));
    }
}
