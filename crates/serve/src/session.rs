//! What `session_list` reports about one iSCSI session or NVMe/TCP
//! controller, and the counters its connections keep (plain atomics: one
//! relaxed add per command, no lock).

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Read and write commands of one session, and their bytes.
#[derive(Debug, Default)]
pub struct SessionStats {
    reads: AtomicU64,
    writes: AtomicU64,
    read_bytes: AtomicU64,
    written_bytes: AtomicU64,
}

impl SessionStats {
    #[inline]
    pub fn count(&self, write: bool, bytes: u64) {
        let (ops, b) = if write { (&self.writes, &self.written_bytes) } else { (&self.reads, &self.read_bytes) };
        ops.fetch_add(1, Relaxed);
        b.fetch_add(bytes, Relaxed);
    }

    fn snapshot(&self) -> [u64; 4] {
        [&self.reads, &self.writes, &self.read_bytes, &self.written_bytes].map(|a| a.load(Relaxed))
    }

    /// The sum of several (one per queue of a controller, each written by
    /// its own thread, so no cache line is shared on the I/O path).
    pub fn sum<'a>(all: impl IntoIterator<Item = &'a SessionStats>) -> SessionStats {
        let t = SessionStats::default();
        for s in all {
            let [r, w, rb, wb] = s.snapshot();
            t.reads.fetch_add(r, Relaxed);
            t.writes.fetch_add(w, Relaxed);
            t.read_bytes.fetch_add(rb, Relaxed);
            t.written_bytes.fetch_add(wb, Relaxed);
        }
        t
    }
}

/// One row of `session_list`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct SessionInfo {
    /// `iscsi:N` or `nvme:CNTLID`: what `session_disconnect` takes.
    pub id: String,
    pub protocol: &'static str,
    pub initiator: String,
    pub peer: String,
    pub target: String,
    pub reads: u64,
    pub writes: u64,
    pub read_bytes: u64,
    pub written_bytes: u64,
    /// NVMe/TCP over TLS: the admin queue's cipher suite and who keeps
    /// its records ("TLS_AES_128_GCM_SHA256 ktls", "... user").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<String>,
}

impl SessionInfo {
    pub fn new(id: String, protocol: &'static str, initiator: &str, peer: String, target: String, stats: &SessionStats) -> SessionInfo {
        let [reads, writes, read_bytes, written_bytes] = stats.snapshot();
        SessionInfo { id, protocol, initiator: initiator.to_string(), peer, target, reads, writes, read_bytes, written_bytes, tls: None }
    }
}
