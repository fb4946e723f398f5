//! Sending what a TCP initiator's queue encoded, for both (NVMe/TCP's
//! HostQueue, iSCSI's InitiatorSession): one socket write per burst of
//! commands, the payloads a queue kept by reference (instead of copying
//! them into its send buffer) gathered with the headers around them in
//! the same write.

use bw_tls::record::Sealer;
use bytes::Bytes;
use std::io::IoSlice;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::Notify;

/// Wakes the send loop when its queue has something to send, once per
/// burst: a `notify_one` per submitted command cost ~20 client
/// instructions of a 4 KiB QD32 I/O (docs/notes/2026-11-27-h51w-client.md),
/// and every wake after the first of a burst is one the loop does not
/// need, since its next `poll` takes all that was queued before it.
#[derive(Default)]
pub(crate) struct SendWake {
    notify: Notify,
    /// Woken and not yet polled: set by the first wake of a burst, cleared
    /// by the loop before it polls (before, not after: a command queued
    /// between the poll and the clearing would wake nobody).
    pending: AtomicBool,
}

impl SendWake {
    /// Called after queueing something to send (under the queue's lock).
    pub(crate) fn wake(&self) {
        if !self.pending.swap(true, Ordering::AcqRel) {
            self.notify.notify_one();
        }
    }

    /// The send loop: wait until woken.
    async fn woken(&self) {
        self.notify.notified().await
    }

    /// The send loop, about to poll its queue: what is queued from now on
    /// wakes it again.
    fn polling(&self) {
        self.pending.store(false, Ordering::Release);
    }
}

/// What the send loop asks of its queue.
pub(crate) trait Transmit {
    /// Woken when the queue has something to send.
    fn wake(&self) -> &SendWake;
    /// Under the queue's lock: whether the queue has ended; and everything
    /// it has to send: bytes appended to `out`, payloads to send from
    /// where they are appended to `refs`, each with the length of `out` it
    /// follows.
    fn poll(&self, out: &mut Vec<u8>, refs: &mut Vec<(usize, Bytes)>) -> bool;
    /// The connection failed: fail every command with `why`.
    fn fail_all(&self, why: &str);
}

/// Send what the queue encodes until it ends or the socket fails. Woken
/// when there is something, it first lets the other ready tasks (callers
/// woken by the completions just read) submit, so that one send carries a
/// whole burst of commands: the scheduler would otherwise run this task
/// right after each submit (a task woken by a running one goes to tokio's
/// LIFO slot). With `sealer` (NVMe/TCP over user-space TLS) the bytes go
/// out as TLS records.
pub(crate) async fn send_loop(mut wr: OwnedWriteHalf, q: &impl Transmit, mut sealer: Option<Sealer>) {
    let mut batch: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut refs: Vec<(usize, Bytes)> = Vec::new();
    // With TLS: the records of a burst, kept from burst to burst (a fresh
    // buffer each time cost an allocation and its page faults per write).
    let mut records: Vec<u8> = Vec::new();
    loop {
        q.wake().woken().await;
        behind_ready_tasks().await;
        q.wake().polling();
        if q.poll(&mut batch, &mut refs) {
            let _ = wr.shutdown().await;
            return;
        }
        let sent = match sealer.as_mut() {
            // The burst's headers and payloads go out as one run of
            // records, in one write.
            Some(s) => {
                let run: Vec<&[u8]> = gathered(&batch, &refs).collect();
                s.seal_run(&run, &mut records);
                let r = wr.write_all(&records).await;
                records.clear();
                r
            }
            None => write_gathered(&mut wr, &batch, &refs).await,
        };
        if sent.is_err() {
            return q.fail_all("send failed");
        }
        batch.clear();
        // The payloads go back to their owners (or are freed) once sent.
        refs.clear();
        if batch.capacity() > 1 << 20 {
            batch = Vec::with_capacity(64 * 1024);
        }
        if records.capacity() > 4 << 20 {
            records = Vec::new();
        }
    }
}

/// Let every task that is ready now run first: this task is queued again
/// at the back of the runtime's run queue, behind them. Not
/// `tokio::task::yield_now`: that defers the task until the worker has
/// polled its I/O driver, one extra `epoll_wait` (with a zero timeout)
/// per burst, the client's second of two per batch of answers
/// (docs/notes/2026-11-26-floor-6.md). A task that wakes itself while it
/// runs is rescheduled as a yield, at the back of the queue, with no
/// driver poll in between.
async fn behind_ready_tasks() {
    let mut queued = false;
    std::future::poll_fn(|cx| {
        if queued {
            return std::task::Poll::Ready(());
        }
        queued = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    })
    .await
}

/// What a queue handed over, in the order it goes on the wire: `bytes` cut
/// where each of `refs` goes in; no empty pieces.
fn gathered<'a>(bytes: &'a [u8], refs: &'a [(usize, Bytes)]) -> impl Iterator<Item = &'a [u8]> {
    let starts = std::iter::once(0).chain(refs.iter().map(|r| r.0));
    let tail = &bytes[refs.last().map_or(0, |r| r.0)..];
    starts
        .zip(refs)
        .flat_map(move |(start, (end, b))| [&bytes[start..*end], &b[..]])
        .chain(std::iter::once(tail))
        .filter(|s| !s.is_empty())
}

/// Write all of it with as few writev calls as the socket allows (one
/// per burst when the socket has room; the kernel takes up to IOV_MAX
/// pieces per call, and std asks for no more).
async fn write_gathered(wr: &mut OwnedWriteHalf, bytes: &[u8], refs: &[(usize, Bytes)]) -> std::io::Result<()> {
    if refs.is_empty() {
        return if bytes.is_empty() { Ok(()) } else { wr.write_all(bytes).await };
    }
    // (A plain loop: the iterator chain of `gathered` cost ~50
    // instructions per 4 KiB write here, by callgrind.)
    let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(2 * refs.len() + 1);
    let mut at = 0;
    for (end, b) in refs {
        if at < *end {
            slices.push(IoSlice::new(&bytes[at..*end]));
        }
        slices.push(IoSlice::new(b));
        at = *end;
    }
    if at < bytes.len() {
        slices.push(IoSlice::new(&bytes[at..]));
    }
    let mut left = &mut slices[..];
    while !left.is_empty() {
        let n = wr.write_vectored(left).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut left, n);
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gathered_puts_each_payload_where_it_goes() {
        let bytes = b"aabbbc";
        let refs = [(0, Bytes::from_static(b"X")), (2, Bytes::from_static(b"YY")), (2, Bytes::from_static(b"Z")), (6, Bytes::from_static(b"W"))];
        let all: Vec<u8> = gathered(bytes, &refs).flatten().copied().collect();
        assert_eq!(all, b"XaaYYZbbbcW");
        assert!(gathered(b"", &[]).next().is_none());
        assert_eq!(gathered(b"abc", &[]).collect::<Vec<_>>(), [&b"abc"[..]]);
    }

    /// The send loop is woken once per burst: the wakes after the first
    /// (before the loop polls) leave no second wake-up behind them, and
    /// once the loop polls, the next command wakes it again.
    #[test]
    fn the_sender_is_woken_once_per_burst() {
        use std::future::Future;
        use std::task::{Context, Waker};
        let mut cx = Context::from_waker(Waker::noop());
        let w = SendWake::default();
        let mut first = std::pin::pin!(w.woken());
        assert!(first.as_mut().poll(&mut cx).is_pending());
        for _ in 0..3 {
            w.wake();
        }
        assert!(first.as_mut().poll(&mut cx).is_ready());
        let mut second = std::pin::pin!(w.woken());
        assert!(second.as_mut().poll(&mut cx).is_pending(), "a burst's later wakes woke the loop again");
        w.polling();
        w.wake();
        assert!(second.as_mut().poll(&mut cx).is_ready(), "a command queued after the poll woke nobody");
    }
}
