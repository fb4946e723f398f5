//! Sending what a TCP initiator's queue encoded, for both (NVMe/TCP's
//! HostQueue, iSCSI's InitiatorSession): one socket write per burst of
//! commands, a large payload written from its own buffer after the bytes
//! queued before it.

use bw_tls::record::Sealer;
use bytes::Bytes;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::Notify;

/// What the send loop asks of its queue.
pub(crate) trait Transmit {
    /// Woken when the queue has something to send.
    fn wake(&self) -> &Notify;
    /// Under the queue's lock: whether the queue has ended, and its
    /// `poll_transmit` (bytes appended to `out`, then the next large
    /// payload if any).
    fn poll(&self, out: &mut Vec<u8>) -> (bool, Option<Bytes>);
    /// The connection failed: fail every command with `why`.
    fn fail_all(&self, why: &str);
}

/// Send what the queue encodes until it ends or the socket fails. Woken
/// when there is something, it first lets the other ready tasks (callers
/// woken by the completions just read) submit, so that one send carries a
/// whole burst of commands: the scheduler would otherwise run this task
/// right after each submit. With `sealer` (NVMe/TCP over user-space TLS)
/// the bytes go out as TLS records.
pub(crate) async fn send_loop(mut wr: OwnedWriteHalf, q: &impl Transmit, mut sealer: Option<Sealer>) {
    let mut batch: Vec<u8> = Vec::with_capacity(64 * 1024);
    // With TLS: the records of a burst, kept from burst to burst (a fresh
    // buffer each time cost an allocation and its page faults per write).
    let mut records: Vec<u8> = Vec::new();
    loop {
        q.wake().notified().await;
        tokio::task::yield_now().await;
        loop {
            let (dead, big) = q.poll(&mut batch);
            if dead {
                let _ = wr.shutdown().await;
                return;
            }
            let sent = match sealer.as_mut() {
                // The burst's headers and the large payload behind them go
                // out as one run of records, in one write.
                Some(s) => {
                    s.seal_run(&[&batch, big.as_deref().unwrap_or_default()], &mut records);
                    let r = wr.write_all(&records).await;
                    records.clear();
                    r
                }
                None => {
                    let mut r = if batch.is_empty() { Ok(()) } else { wr.write_all(&batch).await };
                    if let (Ok(()), Some(b)) = (&r, &big) {
                        r = wr.write_all(b).await;
                    }
                    r
                }
            };
            if sent.is_err() {
                return q.fail_all("send failed");
            }
            batch.clear();
            if big.is_none() {
                break;
            }
        }
        if batch.capacity() > 1 << 20 {
            batch = Vec::with_capacity(64 * 1024);
        }
        if records.capacity() > 4 << 20 {
            records = Vec::new();
        }
    }
}

/// Write `data`, through the user-space record layer when there is one.
pub(crate) async fn send(wr: &mut OwnedWriteHalf, sealer: Option<&mut Sealer>, data: &[u8]) -> std::io::Result<()> {
    match sealer {
        None => wr.write_all(data).await,
        Some(s) => {
            let mut out = Vec::with_capacity(data.len() + data.len() / 512 + 64);
            s.seal_all(data, &mut out);
            wr.write_all(&out).await
        }
    }
}
