//! One read of a tokio TCP socket that cannot block, and what it tells
//! tokio about the socket's readiness: the one place both the targets'
//! connection driver (`bw_serve::framing`) and the initiators' placed
//! reads (`bw_initiator::placed`) make it.
//!
//! Why it matters: `try_read`/`try_read_buf` leave tokio's read readiness
//! set until a read fails, so the read after a batch that emptied the
//! socket is a system call that fails with EAGAIN (one per wake at 4 KiB
//! QD32). tokio's own `poll_read` clears the readiness after a short read
//! instead, and so does [`read_clearing_if_short`]. How it clears decides
//! whether bytes can be lost: clearing with a second `try_io` after the
//! read (the initiators until 2026-11-29) also clears an event the
//! runtime's I/O driver took in, on another worker, for bytes that arrived
//! between the two, and the reader then waits for readiness with those
//! bytes in its receive queue (docs/notes/2026-11-29-lost-read-edge.md).
//! Running the read inside the one `try_io` and answering a short read
//! with WouldBlock clears only the event seen before the read: a later
//! arrival has a later tick and survives the clear.

use std::io;
use tokio::io::Interest;
use tokio::net::TcpStream;

/// One read that cannot block: `read` (a system call into `room` bytes of
/// buffers) on `stream`. Returns the bytes it brought and whether it was
/// short (`0 < n < room`: it emptied the socket's receive queue). After a
/// short read, unless `keep_readiness`, the socket's read readiness is
/// cleared as tokio saw it before the read (see the module's comment), so
/// that the next wait is for the socket's next edge; with
/// `keep_readiness`, the next read tries the socket again (a spare read,
/// which pays when more arrived meanwhile). A read that fails with
/// WouldBlock clears the readiness too, as any `try_io` does.
pub fn read_clearing_if_short(
    stream: &TcpStream,
    room: usize,
    keep_readiness: bool,
    read: impl FnOnce() -> io::Result<usize>,
) -> io::Result<(usize, bool)> {
    let mut short_read = None;
    let r = stream.try_io(Interest::READABLE, || {
        let n = read()?;
        let short = 0 < n && n < room;
        if short && !keep_readiness {
            short_read = Some(n);
            // Not an error: the bytes are kept in `short_read`; WouldBlock
            // only makes tokio clear the readiness it saw.
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok((n, short))
    });
    match short_read {
        Some(n) => Ok((n, true)),
        None => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::time::Duration;
    use tokio::io::unix::AsyncFd;

    /// A loopback connection: the peer's end (blocking) and ours (tokio's).
    fn connected() -> (std::net::TcpStream, TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (ours, _) = l.accept().unwrap();
        ours.set_nonblocking(true).unwrap();
        (peer, TcpStream::from_std(ours).unwrap())
    }

    /// A plain `read(2)` into `b`, as the callers' system calls are.
    fn read_into(fd: i32, b: &mut [u8]) -> io::Result<usize> {
        // SAFETY: a writable buffer of its length.
        let n = unsafe { libc::read(fd, b.as_mut_ptr().cast(), b.len()) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    /// Whether tokio still holds the socket readable (a `try_io` runs its
    /// closure only then).
    fn readiness_kept(s: &TcpStream) -> bool {
        let mut tried = false;
        let _ = s.try_io(Interest::READABLE, || {
            tried = true;
            Ok(())
        });
        tried
    }

    /// Bytes that arrive while a short read runs, and that the runtime's
    /// I/O driver (on a worker thread) takes in before the read's
    /// readiness is cleared, still wake the next wait for readiness. The
    /// read here waits, after its system call, until the driver has seen
    /// the new bytes (through a second registration of the same socket,
    /// woken by the same arrival): then clearing the readiness as it was
    /// after the read would lose the event, and the wait below would
    /// never end. Nothing is timed: the bound only turns a hang into a
    /// failure. (It failed 3 runs in 3 with the clearing of before
    /// 2026-11-29.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bytes_that_arrive_during_a_short_read_are_not_lost() {
        let (mut peer, ours) = connected();
        // The same socket, registered a second time (a duplicate
        // descriptor) to see when the driver takes in an arrival.
        // SAFETY: the descriptor is open and owned by the OwnedFd, which
        // the AsyncFd owns until it is dropped.
        let watch = unsafe { AsyncFd::register(OwnedFd::from_raw_fd(libc::dup(ours.as_raw_fd()))) }.unwrap_or_else(|e| panic!("{e}"));
        peer.write_all(&[1; 100]).unwrap();
        ours.readable().await.unwrap();
        watch.readable().await.unwrap().clear_ready();
        let (seen_tx, seen_rx) = std::sync::mpsc::channel();
        let seen = tokio::spawn(async move {
            watch.readable().await.unwrap().retain_ready();
            seen_tx.send(()).unwrap();
            watch
        });
        let fd = ours.as_raw_fd();
        let mut b = [0u8; 4096];
        let got = read_clearing_if_short(&ours, b.len(), false, || {
            let n = read_into(fd, &mut b);
            peer.write_all(&[2; 50]).unwrap();
            seen_rx.recv_timeout(Duration::from_secs(120)).expect("the driver never took in the arrival");
            n
        })
        .unwrap();
        assert_eq!(got, (100, true));
        drop(seen.await.unwrap());
        tokio::time::timeout(Duration::from_secs(120), ours.readable()).await.expect("the bytes that came during the read were never seen").unwrap();
        assert_eq!(ours.try_read(&mut b).unwrap(), 50);
    }

    /// A short read with nothing arriving after it clears the readiness
    /// (the next attempt waits instead of making a system call), unless
    /// asked to keep it; a read that fills its room keeps it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_short_read_clears_the_readiness_unless_kept() {
        let (mut peer, ours) = connected();
        let fd = ours.as_raw_fd();
        let mut b = [0u8; 4096];
        peer.write_all(&[1; 100]).unwrap();
        ours.readable().await.unwrap();
        assert_eq!(read_clearing_if_short(&ours, b.len(), false, || read_into(fd, &mut b)).unwrap(), (100, true));
        assert!(!readiness_kept(&ours), "the readiness was kept after a short read");

        peer.write_all(&[2; 100]).unwrap();
        ours.readable().await.unwrap();
        assert_eq!(read_clearing_if_short(&ours, b.len(), true, || read_into(fd, &mut b)).unwrap(), (100, true));
        assert!(readiness_kept(&ours), "the readiness was cleared though asked to be kept");
        // The spare read finds the socket empty: WouldBlock, and cleared.
        let e = read_clearing_if_short(&ours, b.len(), true, || read_into(fd, &mut b)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        assert!(!readiness_kept(&ours), "a read that found nothing kept the readiness");

        peer.write_all(&[3; 8]).unwrap();
        ours.readable().await.unwrap();
        assert_eq!(read_clearing_if_short(&ours, 8, false, || read_into(fd, &mut b[..8])).unwrap(), (8, false));
        assert!(readiness_kept(&ours), "a read that filled its room cleared the readiness");
    }

    /// The end of the stream is a read of 0 bytes, not short.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_end_of_the_stream_reads_zero() {
        let (peer, ours) = connected();
        drop(peer);
        ours.readable().await.unwrap();
        let fd = ours.as_raw_fd();
        let mut b = [0u8; 64];
        assert_eq!(read_clearing_if_short(&ours, b.len(), false, || read_into(fd, &mut b)).unwrap(), (0, false));
    }
}
