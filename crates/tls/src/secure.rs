//! A TCP connection made secure: the handshake over a tokio socket
//! ([`handshake`]), then the record layer ([`establish`]): the kernel's
//! (kTLS: the socket then carries plaintext, and the connection's code
//! runs as before) or ours ([`UserRecords`]: the caller reads and writes
//! through it).

use crate::handshake::{Binding, Established, Handshake, HandshakeError, PskStore};
use crate::ktls::{self, Direction};
use crate::record::{Header, Opened, Opener, RecordError, Sealer, HEADER_LEN, MAX_CIPHERTEXT};
use crate::{RecordChoice, RecordLayer, Suite};
use bw_nvme::tls_psk::TlsPsk;
use bytes::{Buf, BufMut, BytesMut};
use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use tokio::net::TcpStream;

#[derive(Debug, thiserror::Error)]
pub enum SecureError {
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
    #[error("the peer closed the connection during the TLS handshake")]
    Closed,
    #[error("TLS: {0}")]
    Io(#[from] io::Error),
    #[error("kTLS was asked for and the kernel refused it ({0}; /proc/net/tls_stat is there when it has TLS)")]
    NoKtls(io::Error),
    #[error(transparent)]
    Record(#[from] RecordError),
}

/// A socket's read side, as the record layer reads it (a `TcpStream`, or
/// the read half of one split in two).
pub trait TryRead {
    fn try_read_into(&self, buf: &mut impl BufMut) -> io::Result<usize>;
}

impl TryRead for TcpStream {
    fn try_read_into(&self, buf: &mut impl BufMut) -> io::Result<usize> {
        self.try_read_buf(buf)
    }
}

impl TryRead for tokio::net::tcp::OwnedReadHalf {
    fn try_read_into(&self, buf: &mut impl BufMut) -> io::Result<usize> {
        self.try_read_buf(buf)
    }
}

/// The user-space record layer of one connection: what we send goes
/// through `sealer`, what we receive through `reader`.
pub struct UserRecords {
    pub sealer: Sealer,
    pub reader: RecordReader,
}

/// Most record bytes one [`RecordReader::fill`] reads (and holds): four
/// whole records. One record a read (as before) cost a `recv` and a pass
/// through the caller's decoder per 16 KiB; a 1 MiB read's records come
/// in a quarter of the reads.
pub const READ_WINDOW: usize = 4 * (HEADER_LEN + MAX_CIPHERTEXT);

/// The receiving half of the user-space record layer.
pub struct RecordReader {
    opener: Opener,
    /// Received bytes of a record not yet whole.
    pending: BytesMut,
    /// The peer sent close_notify.
    closed: bool,
}

impl RecordReader {
    /// Read what the socket has, without waiting, and append the content
    /// of every whole record to `plain`: the bytes added (0: the peer
    /// closed, by close_notify or the end of the stream), or `WouldBlock`
    /// when no whole record came. At most [`READ_WINDOW`] bytes of
    /// records are read and held at a time.
    ///
    /// The records are read straight into `plain`'s room and opened where
    /// they lie, each one's content moved onto the end of the one before
    /// by the decryption itself ([`Opener::open_within`]): the only copy
    /// is of a record that came in part, set aside until its rest comes.
    pub fn fill(&mut self, sock: &impl TryRead, plain: &mut BytesMut) -> io::Result<usize> {
        let start = plain.len();
        loop {
            if self.closed {
                return Ok(plain.len() - start);
            }
            let room = READ_WINDOW.saturating_sub(self.pending.len()).max(HEADER_LEN);
            let opened = plain.len();
            plain.reserve(self.pending.len() + room);
            plain.extend_from_slice(&self.pending);
            self.pending.clear();
            let r = sock.try_read_into(&mut (&mut *plain).limit(room));
            if !matches!(r, Ok(n) if n > 0) {
                // Nothing new: what was set aside goes back aside.
                self.pending.extend_from_slice(&plain[opened..]);
                plain.truncate(opened);
            }
            match r {
                Ok(0) => {
                    if !self.pending.is_empty() {
                        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the connection ended inside a TLS record"));
                    }
                    self.closed = true;
                    return Ok(plain.len() - start);
                }
                Ok(_) => {
                    let (content, unopened, closed) = open_in_place(&mut self.opener, plain, opened).map_err(io::Error::other)?;
                    self.closed = closed;
                    // A record not yet whole waits aside (at most one).
                    if !closed {
                        self.pending.extend_from_slice(&plain[unopened..]);
                    }
                    plain.truncate(content);
                    // One read's worth at a time: the caller bounds what it holds.
                    if plain.len() > start {
                        return Ok(plain.len() - start);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && plain.len() > start => return Ok(plain.len() - start),
                Err(e) => return Err(e),
            }
        }
    }

    /// Like [`RecordReader::fill`], for a payload whose place is known
    /// (a C2HData's in its command's buffer): records are read straight
    /// into `dst` and opened there, where their content belongs, so the
    /// payload is never copied in user space. A record that cannot lie
    /// whole in `dst` (the payload's last, shared with the next PDU's
    /// header) is opened into `spill` as `fill` does and its share copied
    /// into `dst`; what follows the payload stays in `spill`. The bytes
    /// written to `dst` (at most its length; 0: the peer closed), or
    /// `WouldBlock`.
    pub fn fill_direct(&mut self, sock: &impl TryRead, dst: &mut [u8], spill: &mut BytesMut) -> io::Result<usize> {
        let need = match Header::parse(&self.pending).map_err(io::Error::other)? {
            Some(h) => h.total(),
            None => HEADER_LEN + MAX_CIPHERTEXT,
        };
        if !spill.is_empty() || dst.len() < need.max(self.pending.len()) {
            if spill.is_empty() {
                self.fill(sock, spill)?;
            }
            let n = spill.len().min(dst.len());
            dst[..n].copy_from_slice(&spill[..n]);
            spill.advance(n);
            return Ok(n);
        }
        loop {
            if self.closed {
                return Ok(0);
            }
            let held = self.pending.len();
            dst[..held].copy_from_slice(&self.pending);
            self.pending.clear();
            let r = sock.try_read_into(&mut &mut dst[held..]);
            let got = match r {
                Ok(n) => held + n,
                Err(_) => held,
            };
            if let Ok(0) = r {
                self.pending.extend_from_slice(&dst[..held]);
                if held > 0 {
                    return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the connection ended inside a TLS record"));
                }
                self.closed = true;
                return Ok(0);
            }
            let (content, unopened, closed) = open_in_place(&mut self.opener, &mut dst[..got], 0).map_err(io::Error::other)?;
            self.closed = closed;
            if !closed {
                self.pending.extend_from_slice(&dst[unopened..got]);
            }
            match r {
                _ if content > 0 || closed => return Ok(content),
                Ok(_) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Ciphertext held for a record not yet whole (for a receive budget).
    pub fn pending(&self) -> usize {
        self.pending.len()
    }
}

impl UserRecords {
    /// [`RecordReader::fill`].
    pub fn fill(&mut self, sock: &impl TryRead, plain: &mut BytesMut) -> io::Result<usize> {
        self.reader.fill(sock, plain)
    }

    /// Encrypt `data` into records appended to `out`.
    pub fn seal(&mut self, data: &[u8], out: &mut Vec<u8>) {
        self.sealer.seal_all(data, out);
    }
}

/// Open every whole record at the front of `input` into `plain`; whether
/// a close_notify came.
fn open_records(opener: &mut Opener, input: &mut BytesMut, plain: &mut BytesMut) -> Result<bool, RecordError> {
    while let Some((n, what)) = opener.open(input, plain)? {
        input.advance(n);
        if what == Opened::Closed {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Open the whole records in `buf[from..]` where they lie, their
/// content gathered from `buf[from]` on: where the content ends and where
/// the first record not opened starts (`buf` is left as is past the
/// content), and whether a close_notify came (nothing after it is opened).
fn open_in_place(opener: &mut Opener, buf: &mut [u8], from: usize) -> Result<(usize, usize, bool), RecordError> {
    let (mut to, mut at) = (from, from);
    while let Some((n, what)) = opener.open_within(buf, to, at)? {
        at += n;
        match what {
            Opened::Data(len) => to += len,
            Opened::Ticket => {}
            Opened::Closed => return Ok((to, at, true)),
        }
    }
    Ok((to, at, false))
}

/// A connection after its handshake.
pub struct Secured {
    pub layer: RecordLayer,
    pub suite: Suite,
    pub identity: String,
    /// The server's note on the key that verified.
    pub note: Option<String>,
    /// With [`RecordLayer::User`]: what the connection reads and writes through.
    pub user: Option<UserRecords>,
    /// Application data that came with the handshake's last records, opened.
    pub plaintext: BytesMut,
}

impl std::fmt::Debug for Secured {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secured({}, {}, {:?})", self.layer, self.suite, self.identity)
    }
}

async fn send_all(stream: &TcpStream, mut b: &[u8]) -> io::Result<()> {
    while !b.is_empty() {
        stream.writable().await?;
        match stream.try_write(b) {
            Ok(n) => b = &b[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Read at least one byte more into `buf` (at most `max` in all).
async fn read_more(stream: &TcpStream, buf: &mut BytesMut, max: usize) -> Result<(), SecureError> {
    loop {
        stream.readable().await?;
        let room = max.saturating_sub(buf.len()).max(1);
        buf.reserve(room);
        match stream.try_read_buf(&mut (&mut *buf).limit(room)) {
            Ok(0) => return Err(SecureError::Closed),
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Run `hs` over `stream`, `received` holding what was read already; on
/// return it holds what came after the handshake. On failure what the
/// handshake had to say (an alert) is sent first.
pub async fn handshake(stream: &TcpStream, mut hs: Handshake, received: &mut BytesMut) -> Result<Established, SecureError> {
    loop {
        let fed = if received.is_empty() { Ok((0, None)) } else { hs.feed(received) };
        // What the handshake says goes out first, an alert on failure too.
        let out = hs.take_output();
        match fed {
            Ok((n, done)) => {
                send_all(stream, &out).await?;
                received.advance(n);
                if let Some(e) = done {
                    return Ok(e);
                }
            }
            Err(e) => {
                let _ = send_all(stream, &out).await;
                return Err(e.into());
            }
        }
        // At most one record beyond what the handshake took is held.
        read_more(stream, received, HEADER_LEN + MAX_CIPHERTEXT).await?;
    }
}

/// The server side: accept a handshake keyed by `store`, then set up the
/// record layer as `choice` says.
pub async fn accept(stream: &TcpStream, store: Arc<dyn PskStore>, mut received: BytesMut, choice: RecordChoice) -> Result<Secured, SecureError> {
    let est = handshake(stream, Handshake::server(store)?, &mut received).await?;
    establish(stream, est, received, choice, false).await
}

/// The client side: offer `psk` as `identity`, bound as TP 8011 says.
pub async fn connect(stream: &TcpStream, identity: &str, psk: TlsPsk, choice: RecordChoice) -> Result<Secured, SecureError> {
    connect_bound(stream, identity, psk, Binding::Specified, choice).await
}

/// [`connect`] with the PSK bound as `binding` says.
pub async fn connect_bound(stream: &TcpStream, identity: &str, psk: TlsPsk, binding: Binding, choice: RecordChoice) -> Result<Secured, SecureError> {
    let mut received = BytesMut::new();
    let est = handshake(stream, Handshake::client_bound(identity, psk, binding)?, &mut received).await?;
    establish(stream, est, received, choice, true).await
}

/// After the handshake: kTLS where `choice` allows and the kernel has it,
/// else the user-space layer. `leftover` is what came after the
/// handshake's last record; `client` drops the server's session tickets.
pub async fn establish(stream: &TcpStream, mut est: Established, mut leftover: BytesMut, choice: RecordChoice, client: bool) -> Result<Secured, SecureError> {
    let mut opener = Opener::new(&est.rx, client);
    let mut plaintext = BytesMut::new();
    let mut closed = open_records(&mut opener, &mut leftover, &mut plaintext)?;
    let fd = stream.as_raw_fd();
    let kernel = match choice {
        RecordChoice::User => false,
        RecordChoice::Kernel | RecordChoice::Auto => match ktls::attach(fd) {
            Ok(()) => true,
            Err(e) if choice == RecordChoice::Kernel => return Err(SecureError::NoKtls(e)),
            Err(e) => {
                log::debug!("tls: no kTLS here ({e}): the record layer runs in user space");
                false
            }
        },
    };
    let (layer, user) = if kernel {
        // The kernel must start at a record boundary: finish a record that
        // came in part, in user space.
        while !leftover.is_empty() {
            let need = match Header::parse(&leftover)? {
                Some(h) => h.total(),
                None => HEADER_LEN,
            };
            read_more(stream, &mut leftover, need).await?;
            closed |= open_records(&mut opener, &mut leftover, &mut plaintext)?;
        }
        est.rx.seq = opener.seq();
        ktls::set_keys(fd, Direction::Send, &est.tx)?;
        ktls::set_keys(fd, Direction::Receive, &est.rx)?;
        (RecordLayer::Kernel, None)
    } else {
        (RecordLayer::User, Some(UserRecords { sealer: Sealer::new(&est.tx), reader: RecordReader { opener, pending: leftover, closed } }))
    };
    if closed && kernel {
        return Err(SecureError::Closed);
    }
    Ok(Secured { layer, suite: est.suite, identity: est.identity, note: est.note, user, plaintext })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handshake::OneKey;
    use bw_nvme::tls_psk::{ConfiguredPsk, Derivation, IdentityVersion};

    const KEY: &str = "NVMeTLSkey-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";

    /// Over loopback, the client's first application data in the same
    /// write as its Finished: the server opens it with the handshake's
    /// leftovers; then both ways through the user-space layer, and a
    /// close_notify ends the stream.
    #[tokio::test]
    async fn user_space_records_over_a_socket() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let psk = ConfiguredPsk::parse(KEY).unwrap();
        let id = psk.identity(Derivation::Libnvme115, IdentityVersion::V1, "nqn.h", "nqn.s");
        let tls = psk.tls_psk(Derivation::Libnvme115, &id).unwrap();
        let server = tokio::spawn(async move {
            let (s, _) = l.accept().await.unwrap();
            let store = Arc::new(OneKey::any_host(KEY).unwrap());
            let mut sec = accept(&s, store, BytesMut::new(), RecordChoice::User).await.unwrap();
            let mut got = sec.plaintext.split();
            let u = sec.user.as_mut().unwrap();
            while got.len() < 100_000 {
                s.readable().await.unwrap();
                match u.fill(&s, &mut got) {
                    Ok(n) => assert!(n > 0),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => panic!("{e}"),
                }
            }
            let mut out = Vec::new();
            u.seal(&got[..10], &mut out);
            u.sealer.close_notify(&mut out);
            send_all(&s, &out).await.unwrap();
            got
        });
        let c = TcpStream::connect(addr).await.unwrap();
        let mut sec = connect(&c, &id.to_string(), tls, RecordChoice::User).await.unwrap();
        assert_eq!(sec.layer, RecordLayer::User);
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
        let u = sec.user.as_mut().unwrap();
        let mut out = Vec::new();
        u.seal(&data, &mut out);
        send_all(&c, &out).await.unwrap();
        let mut back = BytesMut::new();
        loop {
            c.readable().await.unwrap();
            match u.fill(&c, &mut back) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(&back[..], &data[..10]);
        assert_eq!(&server.await.unwrap()[..], &data[..]);
    }

    /// A connected pair over loopback (sender, receiver), keys from
    /// `seed`, and a record reader of them.
    async fn records_over_loopback(seed: u8) -> (TcpStream, TcpStream, crate::record::Keys, RecordReader) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        let keys = crate::record::Keys::from_secret(Suite::Aes128GcmSha256, &[seed; 32]);
        let r = RecordReader { opener: Opener::new(&keys, false), pending: BytesMut::new(), closed: false };
        (c, s, keys, r)
    }

    /// One fill takes the records waiting on the socket up to
    /// [`READ_WINDOW`] (four whole records), not one a read.
    #[tokio::test]
    async fn one_fill_opens_several_records() {
        let (c, s, keys, mut r) = records_over_loopback(9).await;
        let mut sealer = Sealer::new(&keys);
        let mut wire = Vec::new();
        sealer.seal_all(&vec![7u8; 6 * crate::record::MAX_PLAINTEXT], &mut wire);
        send_all(&c, &wire).await.unwrap();
        // Wait until all of it is there.
        while s.peek(&mut vec![0u8; wire.len()]).await.unwrap() < wire.len() {
            tokio::task::yield_now().await;
        }
        let mut plain = BytesMut::new();
        let n = r.fill(&s, &mut plain).unwrap();
        assert_eq!(n, 4 * crate::record::MAX_PLAINTEXT, "one fill opened {} records", n / crate::record::MAX_PLAINTEXT);
        assert!(r.pending() < HEADER_LEN + MAX_CIPHERTEXT);
    }

    /// A payload whose place is known is opened straight into it, the
    /// records wholly inside it where they lie, the one it shares with
    /// the next PDU through the spill buffer: the payload whole and in
    /// place, the next PDU's bytes left in the spill buffer, however the
    /// records arrive (here in pieces of every size).
    #[tokio::test]
    async fn a_payload_is_opened_in_its_place() {
        let (c, s, keys, mut r) = records_over_loopback(5).await;
        let payload: Vec<u8> = (0..200_000u32).map(|i| (i % 239) as u8).collect();
        let mut sealer = Sealer::new(&keys);
        let mut wire = Vec::new();
        sealer.seal_run(&[&[1; 24], &payload, &[2; 24]], &mut wire);
        let writer = tokio::spawn(async move {
            for (i, piece) in wire.chunks(7001).enumerate() {
                send_all(&c, piece).await.unwrap();
                if i % 3 == 0 {
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
            }
            c
        });
        let mut head = BytesMut::new();
        // The PDU header first, as the queue reads it.
        while head.len() < 24 {
            s.readable().await.unwrap();
            let _ = r.fill(&s, &mut head);
        }
        assert_eq!(&head[..24], &[1; 24]);
        head.advance(24);
        let mut dst = vec![0u8; payload.len()];
        let have = head.len().min(dst.len());
        dst[..have].copy_from_slice(&head.split_to(have));
        let mut spill = BytesMut::new();
        let (mut at, mut direct) = (have, 0);
        while at < dst.len() {
            s.readable().await.unwrap();
            match r.fill_direct(&s, &mut dst[at..], &mut spill) {
                Ok(n) => {
                    assert!(n > 0, "closed early");
                    at += n;
                    // Opened in place: the spill buffer never had room made.
                    direct += usize::from(spill.capacity() == 0);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
        }
        assert!(dst == payload, "the payload is not whole in its place");
        let _c = writer.await.unwrap();
        while spill.len() < 24 {
            s.readable().await.unwrap();
            let _ = r.fill(&s, &mut spill);
        }
        assert_eq!(&spill[..], &[2; 24], "the next PDU's bytes");
        assert!(direct > 0, "no record was opened in place");
    }

    /// kTLS as asked: the kernel's where it has TLS (the kernel VM), a
    /// clear refusal where it does not (this host's kernel has no tls.ko).
    #[tokio::test]
    async fn kernel_records_or_a_clear_refusal() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let psk = ConfiguredPsk::parse(KEY).unwrap();
        let id = psk.identity(Derivation::Rfc8446, IdentityVersion::V0, "nqn.h", "nqn.s");
        let tls = psk.tls_psk(Derivation::Rfc8446, &id).unwrap();
        let server = tokio::spawn(async move {
            let (s, _) = l.accept().await.unwrap();
            let store = Arc::new(OneKey::any_host(KEY).unwrap());
            let sec = accept(&s, store, BytesMut::new(), RecordChoice::User).await.unwrap();
            let mut got = sec.plaintext;
            let mut u = sec.user.unwrap();
            while got.len() < 5 {
                s.readable().await.unwrap();
                let _ = u.fill(&s, &mut got);
            }
            got
        });
        let c = TcpStream::connect(addr).await.unwrap();
        let has_ktls = std::path::Path::new("/proc/net/tls_stat").exists();
        match connect(&c, &id.to_string(), tls, RecordChoice::Kernel).await {
            Ok(sec) => {
                assert!(has_ktls);
                assert_eq!(sec.layer, RecordLayer::Kernel);
                // Plaintext in, records out: the kernel encrypts.
                send_all(&c, b"hello").await.unwrap();
                assert_eq!(&server.await.unwrap()[..], b"hello");
            }
            Err(e) => {
                assert!(!has_ktls, "{e}");
                assert!(matches!(e, SecureError::NoKtls(_)) && e.to_string().contains("kTLS"), "{e}");
                server.abort();
            }
        }
    }
}
