//! The PDU reader both TCP front-ends share: a receive buffer that a
//! protocol's decoder takes whole PDUs off, filled from the socket so that
//! a PDU's data lands in one piece without being copied.
//!
//! iSCSI and NVMe/TCP frame alike: a fixed header whose length field gives
//! the whole PDU's length. [`Framing`] is that much of each protocol;
//! decoding stays in the protocol crates. What the reader adds is the
//! buffer policy:
//! - once a partial PDU's header is in, room for exactly the rest of it is
//!   reserved, bounded by the protocol's largest PDU (a header claiming
//!   4 GiB allocates nothing: the decoder refuses it);
//! - a large PDU is read to its end and no further, so the next PDU starts
//!   a read of its own and growing the buffer never copies a partial large
//!   PDU (its data is handed on without copying and may still pin the old
//!   buffer);
//! - otherwise the buffer grows by a chunk when little room is left, so
//!   many small PDUs arrive in one read.

use bytes::{BufMut, BytesMut};
use std::io;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::TcpStream;

/// A protocol's framing, as far as the reader needs it.
pub trait Framing {
    /// Bytes at the front of a PDU that say its length.
    fn header_len(&self) -> usize;
    /// Length on the wire of the PDU whose header starts `header` (which
    /// holds at least [`Framing::header_len`] bytes).
    fn pdu_len(&self, header: &[u8]) -> usize;
    /// Largest PDU the decoder accepts; the reader never reserves more.
    fn max_pdu(&self) -> usize;
    /// How the buffer grows between PDUs.
    fn growth(&self) -> Growth;
}

/// Buffer growth between PDUs (see the module comment).
#[derive(Debug, Clone, Copy)]
pub struct Growth {
    /// Grow when less than this much room is left (1: only when full).
    pub low_water: usize,
    /// By this much.
    pub chunk: usize,
    /// PDUs at least this long are read to their end and no further.
    pub large_pdu: usize,
}

/// The receive side of one connection.
pub struct FrameReader {
    buf: BytesMut,
    /// The buffer's size as made: the room a read is offered again once
    /// the PDUs before it are gone (see [`FrameReader::prepare`]).
    size: usize,
    /// NVMe/TCP over TLS with the records ours: what the socket holds is
    /// records, opened into `buf` (at most one record's worth read per fill).
    tls: Option<bw_tls::secure::RecordReader>,
    spare: SpareReads,
}

impl FrameReader {
    pub fn with_capacity(n: usize) -> Self {
        FrameReader {
            buf: BytesMut::with_capacity(n),
            size: n,
            tls: None,
            spare: SpareReads::default(),
        }
    }

    /// From now on the socket's bytes are TLS records `r` opens.
    pub fn set_tls(&mut self, r: bw_tls::secure::RecordReader) {
        self.tls = Some(r);
    }

    /// The received bytes, for the protocol's decoder to take PDUs off.
    pub fn buf(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// The bytes received and not yet decoded (e.g. a malformed header to
    /// quote in an error).
    pub fn pending(&self) -> &[u8] {
        &self.buf
    }

    /// Make room for the next read; returns how many bytes it may read
    /// (`None`: as many as fit). Reserves at most once, so a partial PDU is
    /// copied at most once.
    pub fn prepare(&mut self, f: &impl Framing) -> Option<usize> {
        let g = f.growth();
        let have = self.buf.len();
        let mut want = 0;
        if have >= f.header_len() {
            let total = f.pdu_len(&self.buf[..f.header_len()]).min(f.max_pdu());
            if total > have {
                want = total - have;
                if total >= g.large_pdu {
                    self.buf.reserve(want);
                    return Some(want);
                }
            }
        }
        // A burst of small PDUs in one read: the room a read is offered is
        // what is left of the buffer past the PDUs already taken, and
        // without this a QD32 burst of 4 KiB writes (133 KiB) landed in two
        // reads about every other time (the second capped at the 123 KiB
        // left of 256 KiB), its answers went out in two sends and the
        // host's next burst came split too (measured: half the target's
        // reads filled their room; docs/notes/2026-11-27-h51j-writes.md).
        // So once the PDUs before the partial one are gone, the buffer is
        // taken back from its start, copying only the partial PDU (at
        // most a quarter of the buffer): never an allocation, and nothing
        // happens while earlier PDUs' payloads still hold the buffer.
        if have <= self.size / 4 && self.buf.capacity() - have < self.size - self.size / 4 {
            let _ = self.buf.try_reclaim(self.size - have);
        }
        if self.buf.capacity() - have < g.low_water.max(1) {
            want = want.max(g.chunk);
        }
        self.buf.reserve(want);
        None
    }

    /// One read from `rd` after [`FrameReader::prepare`]; 0 at end of stream.
    pub async fn fill<R: AsyncRead + Unpin>(
        &mut self,
        rd: &mut R,
        f: &impl Framing,
    ) -> io::Result<usize> {
        match self.prepare(f) {
            Some(n) => rd.take(n as u64).read_buf(&mut self.buf).await,
            None => rd.read_buf(&mut self.buf).await,
        }
    }

    /// [`FrameReader::fill`] without waiting: `WouldBlock` when the socket
    /// has nothing.
    pub fn try_fill(&mut self, stream: &TcpStream, f: &impl Framing) -> io::Result<usize> {
        if let Some(r) = &mut self.tls {
            // The records' content lands in whole records; the decoder
            // bounds PDUs as without TLS.
            return r.fill(stream, &mut self.buf);
        }
        let keep = self.spare.keep_after_short_read();
        let r = match self.prepare(f) {
            Some(n) => read_draining(stream, &mut (&mut self.buf).limit(n), keep),
            None => read_draining(stream, &mut self.buf, keep),
        };
        self.spare.saw(&r, keep);
        r.map(|(n, _)| n)
    }

    /// Read until `decode` takes one PDU off the buffer; `Ok(None)` at a
    /// clean end of stream (no partial PDU left).
    pub async fn next<R, F, T, E>(
        &mut self,
        rd: &mut R,
        f: &F,
        mut decode: impl FnMut(&mut BytesMut) -> Result<Option<T>, E>,
    ) -> Result<Option<T>, ReadError<E>>
    where
        R: AsyncRead + Unpin,
        F: Framing,
    {
        loop {
            if let Some(p) = decode(&mut self.buf).map_err(ReadError::Pdu)? {
                return Ok(Some(p));
            }
            if self.fill(rd, f).await? == 0 {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Err(ReadError::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed inside a PDU",
                )));
            }
        }
    }
}

/// One read that cannot block, into `buf`'s room: the bytes read, and
/// whether the read was short (it emptied the socket). After a short read,
/// unless `keep`, tokio's readiness is cleared as it saw it before the read
/// (`bw_net::tcp_read`): the next read waits for the socket's next edge
/// instead of trying the socket again.
fn read_draining(stream: &TcpStream, buf: &mut impl BufMut, keep: bool) -> io::Result<(usize, bool)> {
    let room = buf.chunk_mut().len();
    bw_net::tcp_read::read_clearing_if_short(stream, room, keep, || stream.try_read_buf(buf))
}

/// Whether the socket is read once more after a read that emptied it
/// (a spare read), learnt per connection. A spare read finds data when
/// the host sent more while the batch was handled, and otherwise costs a
/// recv that fails with EAGAIN; without it, the driver waits for tokio's
/// next readiness event, an epoll_wait (plus a task wake) even when data
/// is already there. Counted over 200k 4 KiB I/Os at QD32, MTU 9000
/// (docs/notes/2026-11-26-floor-5.md): NVMe/TCP reads made 4,785 failing
/// spare reads in 7,028 batches (32% found data), so skipping them saved
/// 4.5k syscalls; writes, whose batches take longer to handle, found data
/// ~80% of the time, and skipping them cost 1.9k more syscalls than it
/// saved. So: spare reads while they have been paying, and a probe every
/// [`SpareReads::PROBE_EVERY`] short reads otherwise.
#[derive(Debug, Default)]
struct SpareReads {
    /// Saturating count of the last probes that found data (0..=3).
    hits: u8,
    /// Short reads so far (wrapping), for the periodic probe.
    shorts: u8,
    /// The last read was short and readiness was kept: this read is a probe.
    probing: bool,
}

impl SpareReads {
    const PROBE_EVERY: u8 = 8;

    /// Whether a short read now should keep readiness (the next read is
    /// then a spare read, whose outcome [`SpareReads::saw`] counts).
    fn keep_after_short_read(&self) -> bool {
        self.hits >= 2 || self.shorts.wrapping_add(1).is_multiple_of(Self::PROBE_EVERY)
    }

    /// A read's outcome; `kept`: what [`SpareReads::keep_after_short_read`]
    /// said before it.
    fn saw(&mut self, r: &io::Result<(usize, bool)>, kept: bool) {
        if std::mem::take(&mut self.probing) {
            match r {
                Ok((n, _)) if *n > 0 => self.hits = (self.hits + 1).min(3),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.hits = self.hits.saturating_sub(1),
                _ => {}
            }
        }
        if let Ok((_, true)) = r {
            self.shorts = self.shorts.wrapping_add(1);
            self.probing = kept;
        }
    }
}

/// Why [`FrameReader::next`] returned no PDU.
#[derive(Debug, thiserror::Error)]
pub enum ReadError<E> {
    #[error(transparent)]
    Io(#[from] io::Error),
    /// The decoder refused what arrived.
    #[error("{0}")]
    Pdu(E),
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::Interest;

    /// Toy framing: 4-byte header = big-endian total length.
    struct Len4;
    impl Framing for Len4 {
        fn header_len(&self) -> usize {
            4
        }
        fn pdu_len(&self, h: &[u8]) -> usize {
            u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize
        }
        fn max_pdu(&self) -> usize {
            1 << 20
        }
        fn growth(&self) -> Growth {
            Growth {
                low_water: 16,
                chunk: 64,
                large_pdu: 100,
            }
        }
    }

    fn decode(buf: &mut BytesMut) -> Result<Option<BytesMut>, &'static str> {
        if buf.len() < 4 {
            return Ok(None);
        }
        let n = Len4.pdu_len(buf);
        if n < 4 || n > Len4.max_pdu() {
            return Err("bad length");
        }
        Ok((buf.len() >= n).then(|| buf.split_to(n)))
    }

    fn pdu(n: usize, fill: u8) -> Vec<u8> {
        let mut v = (n as u32).to_be_bytes().to_vec();
        v.resize(n, fill);
        v
    }

    #[tokio::test]
    async fn pdus_come_whole_and_large_ones_are_read_to_their_end() {
        let mut wire = Vec::new();
        for (n, f) in [(10, 1), (300, 2), (8, 3), (5000, 4), (6, 5)] {
            wire.extend(pdu(n, f));
        }
        let mut rd = &wire[..];
        let mut r = FrameReader::with_capacity(32);
        let mut got = Vec::new();
        while let Some(p) = r.next(&mut rd, &Len4, decode).await.unwrap() {
            // A large PDU is read to its end and no further: nothing of the
            // next PDU came with its tail.
            if p.len() >= 100 {
                assert!(
                    r.pending().is_empty(),
                    "{} bytes read past a large PDU",
                    r.pending().len()
                );
            }
            got.push((p.len(), p[p.len() - 1]));
        }
        assert_eq!(got, vec![(10, 1), (300, 2), (8, 3), (5000, 4), (6, 5)]);
    }

    #[tokio::test]
    async fn a_huge_length_allocates_no_more_than_the_largest_pdu() {
        let mut wire = (u32::MAX).to_be_bytes().to_vec();
        wire.extend([0u8; 100]);
        let mut r = FrameReader::with_capacity(16);
        r.buf().extend_from_slice(&wire[..8]);
        r.prepare(&Len4);
        assert!(
            r.buf.capacity() <= Len4.max_pdu() + 64,
            "reserved {}",
            r.buf.capacity()
        );
        let mut rd = &wire[8..];
        assert!(matches!(
            r.next(&mut rd, &Len4, decode).await,
            Err(ReadError::Pdu("bad length"))
        ));
    }

    /// A read that emptied the socket leaves tokio knowing it: the next
    /// read waits for the socket's next edge instead of calling recv to be
    /// told EAGAIN (floor-4's spare read), and bytes that come later are
    /// read all the same.
    #[tokio::test]
    async fn a_short_read_waits_for_more_instead_of_reading_again() {
        use tokio::io::AsyncWriteExt;
        let (mut peer, stream) = connected().await;
        let readable = || readable(&stream);
        let mut r = FrameReader::with_capacity(4096);
        peer.write_all(&pdu(10, 1)).await.unwrap();
        readable().await;
        assert_eq!(r.try_fill(&stream, &Len4).unwrap(), 10);
        assert!(!would_read_again(&stream), "the socket would be read again though the last read emptied it");
        let e = r.try_fill(&stream, &Len4).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        peer.write_all(&pdu(20, 2)).await.unwrap();
        readable().await;
        assert_eq!(r.try_fill(&stream, &Len4).unwrap(), 20);
        assert_eq!(r.pending().len(), 30);
        drop(peer);
        readable().await;
        assert_eq!(r.try_fill(&stream, &Len4).unwrap(), 0, "the end of the stream is seen");
    }

    /// Both ends of a loopback connection: (the peer, ours).
    async fn connected() -> (TcpStream, TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let peer = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        (peer, l.accept().await.unwrap().0)
    }

    /// Wait for tokio to see the socket readable. (The bound only turns a
    /// hang into a failure; nothing is timed.)
    async fn readable(stream: &TcpStream) {
        tokio::time::timeout(std::time::Duration::from_secs(120), stream.readable())
            .await
            .expect("the socket's next bytes were never seen")
            .unwrap()
    }

    /// Whether tokio would try the socket on the next read (readiness
    /// kept). Asking clears it if so.
    fn would_read_again(stream: &TcpStream) -> bool {
        let mut tried = false;
        let _ = stream.try_io(Interest::READABLE, || {
            tried = true;
            Err::<(), _>(io::ErrorKind::WouldBlock.into())
        });
        tried
    }

    /// Spare reads are learnt per connection: a host that keeps sending
    /// while the batch is handled gets them (a recv that finds data costs
    /// less than a wait for the next event); one that does not gets only
    /// the periodic probe.
    #[tokio::test]
    async fn spare_reads_are_kept_while_they_find_data() {
        use tokio::io::AsyncWriteExt;
        let (mut peer, stream) = connected().await;
        let readable = || readable(&stream);
        let mut r = FrameReader::with_capacity(1 << 20);
        // A host that sends nothing between batches: at most the probes.
        let mut kept = 0;
        for _ in 0..32 {
            peer.write_all(&pdu(10, 1)).await.unwrap();
            readable().await;
            assert_eq!(r.try_fill(&stream, &Len4).unwrap(), 10);
            if would_read_again(&stream) {
                kept += 1;
                // The probe finds nothing.
                assert_eq!(r.try_fill(&stream, &Len4).unwrap_err().kind(), io::ErrorKind::WouldBlock);
            }
        }
        assert_eq!(kept, 32 / SpareReads::PROBE_EVERY as usize, "spare reads that never found data were kept");
        // A host that has sent more by the time the batch is handled.
        peer.write_all(&pdu(10, 2)).await.unwrap();
        for _ in 0..32 {
            readable().await;
            assert_eq!(r.try_fill(&stream, &Len4).unwrap(), 10);
            peer.write_all(&pdu(10, 2)).await.unwrap();
            if let Ok(n) = r.try_fill(&stream, &Len4) {
                assert_eq!(n, 10, "the spare read found the next PDU");
                peer.write_all(&pdu(10, 2)).await.unwrap();
            }
        }
        readable().await;
        assert_eq!(r.try_fill(&stream, &Len4).unwrap(), 10);
        assert!(would_read_again(&stream), "spare reads that found data were dropped");
    }

    #[tokio::test]
    async fn a_burst_lands_in_one_read_once_the_pdus_before_it_are_gone() {
        let mut r = FrameReader::with_capacity(4096);
        let burst = |fill| (0..40).flat_map(|_| pdu(90, fill)).collect::<Vec<u8>>();
        let mut wire = burst(1);
        // (PDUs under Len4's large_pdu: small ones, many to a read.)
        let next = pdu(90, 2);
        wire.extend_from_slice(&next[..10]);
        let mut rd = &wire[..];
        assert_eq!(r.fill(&mut rd, &Len4).await.unwrap(), 3610);
        let mut taken = Vec::new();
        while let Some(p) = decode(r.buf()).unwrap() {
            taken.push(p);
        }
        assert_eq!(taken.len(), 40);
        // While the PDUs taken still hold the buffer, nothing is copied or
        // allocated: the room is what was left.
        r.prepare(&Len4);
        assert_eq!(r.buf().capacity() - r.buf().len(), 4096 - 3610);
        drop(taken);
        // Then the next burst (the partial PDU's rest and 40 more) comes in one
        // read, not in the 486 bytes left at the buffer's end.
        let mut wire = next[10..].to_vec();
        wire.extend(burst(3));
        let mut rd = &wire[..];
        assert_eq!(r.fill(&mut rd, &Len4).await.unwrap(), 80 + 3600);
        let (mut n, later) = (0, pdu(90, 3));
        while let Some(p) = decode(r.buf()).unwrap() {
            assert_eq!(&p[..], if n == 0 { &next[..] } else { &later[..] });
            n += 1;
        }
        assert_eq!((n, r.pending().len()), (41, 0));
    }

    #[tokio::test]
    async fn end_of_stream_inside_a_pdu_is_an_error() {
        let wire = pdu(50, 9);
        let mut rd = &wire[..20];
        let mut r = FrameReader::with_capacity(64);
        let e = r.next(&mut rd, &Len4, decode).await.unwrap_err();
        assert!(matches!(e, ReadError::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof));
        let mut empty: &[u8] = &[];
        assert!(FrameReader::with_capacity(8)
            .next(&mut empty, &Len4, decode)
            .await
            .unwrap()
            .is_none());
    }
}
