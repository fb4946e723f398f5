//! The TLS 1.3 handshake with an external PSK, through OpenSSL, without
//! sockets: the caller feeds received bytes in ([`Handshake::feed`]) and
//! sends what [`Handshake::take_output`] gives, until the handshake is
//! [`Established`]: the suite, the PSK identity and the traffic keys of
//! both directions (read off OpenSSL's key log, which is how a library
//! hands them to a record layer of its own — ours or the kernel's).
//!
//! Only whole records reach OpenSSL, one at a time, and only while the
//! handshake runs, so the bytes after the client's Finished (a host's
//! ICReq, already protected) stay with the caller for the record layer.
//! Before OpenSSL sees a record the framing is checked here (type,
//! version, length), and at most [`HANDSHAKE_LIMIT`] bytes are taken in
//! all: a peer that has proven nothing holds no more than that.
//!
//! The server side finds the PSK through [`PskStore`]: the identity the
//! ClientHello names may have more than one candidate key (NVMe's two
//! derivations of one configured PSK, bw_nvme::tls_psk::Derivation); when
//! the first one's binder does not verify, the same ClientHello is tried
//! against the next before anything was sent, and the one that verified
//! is reported ([`Established::note`]).
//!
//! The hash a PSK is used with is the one its binder was made with, read
//! off the ClientHello before OpenSSL picks a suite ([`binder_hash`]): NVMe
//! says a PSK identity's hash (`NVMe0R02`: SHA-384), but Linux hosts whose
//! tlshd (ktls-utils 1.0, Debian 13) allocates GnuTLS's PSK credentials
//! without a hash bind every PSK with SHA-256 while offering only the
//! SHA-384 PSK's suites plus TLS_CHACHA20_POLY1305_SHA256 (captured:
//! binder 32 bytes, suites 0x1302 0x1303); GnuTLS then accepts only a suite
//! of the binder's hash. So a SHA-256 binder gets the SHA-256 suites
//! (AES-128-GCM first, ChaCha20-Poly1305 when that is all the host offers)
//! and a SHA-384 one TLS_AES_256_GCM_SHA384, whatever the identity says.

use crate::record::{self, alert_name, ContentType, Header, Keys};
use crate::Suite;
use bw_nvme::tls_psk::{ConfiguredPsk, Derivation, Identity, PskError, PskHash, TlsPsk};
use foreign_types::ForeignTypeRef;
use openssl::ex_data::Index;
use openssl::ssl::{ClientHelloResponse, ErrorCode, Ssl, SslAlert, SslContext, SslContextBuilder, SslMethod, SslOptions, SslRef, SslStream, SslVersion};
use std::io::{self, Read, Write};
use std::sync::{Arc, Mutex, OnceLock};
use zeroize::Zeroizing;

/// Most bytes a peer may send before the handshake is over (a PSK
/// handshake is under 2 KiB each way).
pub const HANDSHAKE_LIMIT: usize = 64 << 10;

/// A key a server may use for an identity, and what it is (for the log:
/// which derivation of which configured key). Debug shows no key.
#[derive(Debug)]
pub struct Candidate {
    pub psk: TlsPsk,
    pub note: String,
}

/// The PSKs a server accepts.
pub trait PskStore: Send + Sync {
    /// The `attempt`-th candidate key (from 0) for `identity` as a
    /// ClientHello names it: `Ok(None)` when there is none (or no more),
    /// `Err` with the reason when the identity is refused outright.
    fn lookup(&self, identity: &str, attempt: usize) -> Result<Option<Candidate>, String>;
}

/// One configured PSK, in each of its derivations, for the hosts it is
/// given for (every host when `hosts` is empty): a server's store with no
/// configuration file behind it, as tests, the fuzz targets and tools need
/// (the target's store is `bw_serve`'s `TlsKeys`). The note names the
/// derivation.
pub struct OneKey {
    pub key: ConfiguredPsk,
    pub hosts: Vec<String>,
}

impl OneKey {
    /// The key of interchange text `key`, for every host.
    pub fn any_host(key: &str) -> Result<OneKey, PskError> {
        Ok(OneKey { key: ConfiguredPsk::parse(key)?, hosts: Vec::new() })
    }
}

impl PskStore for OneKey {
    fn lookup(&self, identity: &str, attempt: usize) -> Result<Option<Candidate>, String> {
        let id = Identity::parse(identity).map_err(|e| e.to_string())?;
        if !self.hosts.is_empty() && !self.hosts.contains(&id.hostnqn) {
            return Ok(None);
        }
        Ok(Derivation::ALL.iter().filter_map(|&d| self.key.tls_psk(d, &id).map(|psk| Candidate { psk, note: format!("{d:?}") })).nth(attempt))
    }
}

/// How a client binds its PSK: the hash of its binder, and so the suites
/// it can offer (TLS 1.3 uses a PSK only with suites of its binder's hash).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Binding {
    /// TP 8011's: with the PSK's own hash, offering that hash's suite
    /// (SHA-256: TLS_AES_128_GCM_SHA256; SHA-384: TLS_AES_256_GCM_SHA384).
    /// Our target and SPDK take it.
    Specified,
    /// A SHA-384 PSK's 48 bytes bound with SHA-256, offering
    /// TLS_AES_128_GCM_SHA256 and TLS_CHACHA20_POLY1305_SHA256: what Linux
    /// nvmet takes, whose handshakes tlshd 1.0 makes with GnuTLS PSK
    /// credentials allocated without a hash (SHA-256 binders only; two
    /// tlshd ends agree on ChaCha20-Poly1305). The same as
    /// [`Binding::Specified`] for a SHA-256 PSK.
    Sha256,
}

impl Binding {
    /// The bindings worth trying for a PSK of `hash`, the specification's first.
    pub fn candidates(hash: PskHash) -> &'static [Binding] {
        match hash {
            PskHash::Sha256 => &[Binding::Specified],
            PskHash::Sha384 => &[Binding::Specified, Binding::Sha256],
        }
    }
    /// The binder's hash for a PSK of `hash`.
    pub fn hash(self, hash: PskHash) -> PskHash {
        match self {
            Binding::Specified => hash,
            Binding::Sha256 => PskHash::Sha256,
        }
    }
    /// The suites a client offers for a PSK of `hash`, in its preference.
    pub fn suites(self, hash: PskHash) -> &'static [Suite] {
        match self.hash(hash) {
            PskHash::Sha256 if hash == PskHash::Sha384 => &[Suite::Aes128GcmSha256, Suite::Chacha20Poly1305Sha256],
            PskHash::Sha256 => &[Suite::Aes128GcmSha256],
            PskHash::Sha384 => &[Suite::Aes256GcmSha384],
        }
    }
    /// For logs and descriptions: how a PSK of `hash` was bound.
    pub fn describe(self, hash: PskHash) -> String {
        match self {
            Binding::Sha256 if hash != PskHash::Sha256 => format!("{} PSK bound with SHA-256 as tlshd 1.0 does", hash.name()),
            _ => format!("{} PSK bound with {} as TP 8011 says", hash.name(), hash.name()),
        }
    }
}


/// Why a handshake failed; the connection ends.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("{0}")]
    Record(#[from] record::RecordError),
    #[error("a {0:?} record where the TLS handshake expects a handshake record")]
    Unexpected(ContentType),
    #[error("the TLS handshake went past {HANDSHAKE_LIMIT} bytes")]
    TooLarge,
    #[error("the ClientHello offered no pre-shared key: NVMe/TCP's TLS needs a PSK identity (Linux: nvme connect --tls with the key in the .nvme keyring)")]
    NoPsk,
    #[error("PSK identity {identity:?} refused: {why}")]
    Refused { identity: String, why: String },
    #[error("the TLS handshake for PSK identity {identity:?} failed: the peer's key is not the one configured for it (the PSK binder does not verify){tried}")]
    WrongKey { identity: String, tried: String },
    #[error("the peer ended the TLS handshake with alert {desc} ({})", alert_name(*.desc))]
    PeerAlert { desc: u8 },
    #[error("the TLS handshake failed: {0}")]
    Tls(String),
}

/// The traffic keys and what was agreed.
pub struct Established {
    pub suite: Suite,
    /// The PSK identity.
    pub identity: String,
    /// The server's note on the key that verified (see [`Candidate::note`]).
    pub note: Option<String>,
    /// What we send.
    pub tx: Keys,
    /// What we receive.
    pub rx: Keys,
}

impl std::fmt::Debug for Established {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Established({}, {:?})", self.suite, self.identity)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Client,
    Server,
}

/// What the callbacks learn during one connection's handshake.
#[derive(Default)]
struct State {
    store: Option<Arc<dyn PskStore>>,
    attempt: usize,
    /// The identity the ClientHello offered (server), or ours (client).
    identity: Option<Vec<u8>>,
    refused: Option<String>,
    note: Option<String>,
    notes: Vec<String>,
    /// The client's key.
    psk: Option<TlsPsk>,
    /// The hash the (first) binder is made with: the server reads it off
    /// the ClientHello, a client binds with it.
    binder_hash: Option<PskHash>,
    client_secret: Option<Zeroizing<Vec<u8>>>,
    server_secret: Option<Zeroizing<Vec<u8>>>,
}

fn index() -> Index<Ssl, Mutex<State>> {
    static I: OnceLock<Index<Ssl, Mutex<State>>> = OnceLock::new();
    *I.get_or_init(|| Ssl::new_ex_index().expect("an OpenSSL ex_data index"))
}

fn state(ssl: &SslRef) -> std::sync::MutexGuard<'_, State> {
    ssl.ex_data(index()).expect("every handshake's Ssl has its state").lock().unwrap_or_else(|p| p.into_inner())
}

/// OpenSSL's external-PSK session callbacks (1.1.1 on), which the openssl
/// crate does not wrap; libssl is linked through openssl-sys.
mod ffi {
    use libc::{c_int, c_uchar, size_t};
    use openssl_sys::{EVP_MD, SSL, SSL_CIPHER, SSL_CTX, SSL_SESSION};
    pub type FindSession = unsafe extern "C" fn(*mut SSL, *const c_uchar, size_t, *mut *mut SSL_SESSION) -> c_int;
    pub type UseSession = unsafe extern "C" fn(*mut SSL, *const EVP_MD, *mut *const c_uchar, *mut size_t, *mut *mut SSL_SESSION) -> c_int;
    extern "C" {
        pub fn SSL_CTX_set_psk_find_session_callback(ctx: *mut SSL_CTX, cb: Option<FindSession>);
        pub fn SSL_CTX_set_psk_use_session_callback(ctx: *mut SSL_CTX, cb: Option<UseSession>);
        pub fn SSL_SESSION_new() -> *mut SSL_SESSION;
        pub fn SSL_SESSION_set1_master_key(s: *mut SSL_SESSION, key: *const c_uchar, len: size_t) -> c_int;
        pub fn SSL_SESSION_set_cipher(s: *mut SSL_SESSION, cipher: *const SSL_CIPHER) -> c_int;
        pub fn SSL_SESSION_set_protocol_version(s: *mut SSL_SESSION, version: c_int) -> c_int;
        pub fn SSL_CIPHER_find(ssl: *mut SSL, code: *const c_uchar) -> *const SSL_CIPHER;
        pub fn SSL_SESSION_get0_cipher(s: *const SSL_SESSION) -> *const SSL_CIPHER;
        pub fn SSL_client_hello_get0_ext(s: *mut SSL, ext: libc::c_uint, out: *mut *const c_uchar, outlen: *mut size_t) -> c_int;
    }
}

/// A TLS 1.3 session carrying `psk` as its resumption secret, to be used
/// with `hash`: how OpenSSL takes an external PSK (the session's suite
/// says the hash). Null on failure.
///
/// # Safety
/// `ssl` is a live SSL.
unsafe fn psk_session(ssl: *mut openssl_sys::SSL, psk: &TlsPsk, hash: PskHash) -> *mut openssl_sys::SSL_SESSION {
    let cipher = ffi::SSL_CIPHER_find(ssl, Suite::of(hash).code().as_ptr());
    if cipher.is_null() {
        return std::ptr::null_mut();
    }
    let s = ffi::SSL_SESSION_new();
    if s.is_null() {
        return s;
    }
    let key = psk.key();
    if ffi::SSL_SESSION_set1_master_key(s, key.as_ptr(), key.len()) != 1
        || ffi::SSL_SESSION_set_cipher(s, cipher) != 1
        || ffi::SSL_SESSION_set_protocol_version(s, openssl_sys::TLS1_3_VERSION) != 1
    {
        openssl_sys::SSL_SESSION_free(s);
        return std::ptr::null_mut();
    }
    s
}

/// Server: the ClientHello named `identity`; find its key.
unsafe extern "C" fn find_session(
    ssl: *mut openssl_sys::SSL,
    identity: *const libc::c_uchar,
    len: libc::size_t,
    sess: *mut *mut openssl_sys::SSL_SESSION,
) -> libc::c_int {
    *sess = std::ptr::null_mut();
    let found = std::panic::catch_unwind(|| {
        // SAFETY: OpenSSL passes the live SSL and the identity's bytes.
        let ssl_ref = unsafe { SslRef::from_ptr(ssl) };
        let id = unsafe { std::slice::from_raw_parts(identity, len) }.to_vec();
        let mut st = state(ssl_ref);
        st.identity = Some(id.clone());
        let Ok(text) = std::str::from_utf8(&id) else {
            st.refused = Some("the identity is not UTF-8 text".into());
            return None;
        };
        let store = st.store.clone()?;
        match store.lookup(text, st.attempt) {
            Ok(Some(c)) => {
                let hash = st.binder_hash.unwrap_or(c.psk.hash);
                let note = if hash == c.psk.hash {
                    c.note
                } else {
                    format!("{}; bound with {}, not the identity's {}: a Linux host's tlshd 1.0", c.note, hash.name(), c.psk.hash.name())
                };
                st.note = Some(note.clone());
                st.notes.push(note);
                Some((c.psk, hash))
            }
            Ok(None) => {
                st.refused = Some("no key is configured for it".into());
                None
            }
            Err(why) => {
                st.refused = Some(why);
                None
            }
        }
    });
    match found {
        // SAFETY: the live SSL OpenSSL passed.
        Ok(Some((psk, hash))) => {
            let s = unsafe { psk_session(ssl, &psk, hash) };
            *sess = s;
            (!s.is_null()) as libc::c_int
        }
        _ => 0,
    }
}

/// Client: offer our identity and key (again after a HelloRetryRequest,
/// when `md` is the negotiated suite's hash).
unsafe extern "C" fn use_session(
    ssl: *mut openssl_sys::SSL,
    md: *const openssl_sys::EVP_MD,
    id: *mut *const libc::c_uchar,
    idlen: *mut libc::size_t,
    sess: *mut *mut openssl_sys::SSL_SESSION,
) -> libc::c_int {
    *sess = std::ptr::null_mut();
    // SAFETY: OpenSSL passes the live SSL.
    let ssl_ref = SslRef::from_ptr(ssl);
    let st = state(ssl_ref);
    let (Some(identity), Some(psk)) = (&st.identity, &st.psk) else { return 0 };
    let s = psk_session(ssl, psk, st.binder_hash.unwrap_or(psk.hash));
    if s.is_null() {
        return 0;
    }
    if !md.is_null() {
        let cipher = ffi::SSL_SESSION_get0_cipher(s);
        if openssl_sys::SSL_CIPHER_get_handshake_digest(cipher) != md {
            // The server chose a suite of another hash: no PSK fits it.
            openssl_sys::SSL_SESSION_free(s);
            return 1;
        }
    }
    // The identity stays in the state (not moved) until the Ssl is freed.
    *id = identity.as_ptr();
    *idlen = identity.len();
    *sess = s;
    1
}

/// The TLS extension that carries PSK identities and binders (RFC 8446 4.2.11).
const PRE_SHARED_KEY: libc::c_uint = 41;

/// The hash of the first binder in a pre_shared_key extension's body (by
/// its length: 32 bytes SHA-256, 48 SHA-384); None when the body is
/// malformed or the length is neither (OpenSSL then refuses it).
pub fn binder_hash(ext: &[u8]) -> Option<PskHash> {
    let ids = u16::from_be_bytes(ext.get(..2)?.try_into().ok()?) as usize;
    let binders = ext.get(2 + ids..)?;
    let _all = u16::from_be_bytes(binders.get(..2)?.try_into().ok()?);
    match binders.get(2)? {
        32 => Some(PskHash::Sha256),
        48 => Some(PskHash::Sha384),
        _ => None,
    }
}

/// Server, before OpenSSL picks a suite: the suites of the binder's hash
/// (see the module's notes), ours in preference.
fn client_hello(ssl: &mut SslRef, _alert: &mut SslAlert) -> Result<ClientHelloResponse, openssl::error::ErrorStack> {
    let mut p: *const libc::c_uchar = std::ptr::null();
    let mut n: libc::size_t = 0;
    // SAFETY: a live SSL inside its ClientHello callback; OpenSSL points
    // `p` at the extension's `n` bytes, valid for the callback.
    let ext = unsafe {
        (ffi::SSL_client_hello_get0_ext(ssl.as_ptr(), PRE_SHARED_KEY, &mut p, &mut n) == 1 && !p.is_null()).then(|| std::slice::from_raw_parts(p, n))
    };
    let Some(hash) = ext.and_then(binder_hash) else { return Ok(ClientHelloResponse::SUCCESS) };
    state(ssl).binder_hash = Some(hash);
    let suites = match hash {
        PskHash::Sha256 => "TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256",
        PskHash::Sha384 => "TLS_AES_256_GCM_SHA384",
    };
    ssl.set_ciphersuites(suites)?;
    Ok(ClientHelloResponse::SUCCESS)
}

/// Record the application traffic secrets as OpenSSL derives them.
fn keylog(ssl: &SslRef, line: &str) {
    let mut parts = line.split(' ');
    let (Some(label), Some(_random), Some(secret)) = (parts.next(), parts.next(), parts.next()) else { return };
    let Some(bytes) = unhex(secret) else { return };
    let mut st = state(ssl);
    match label {
        "CLIENT_TRAFFIC_SECRET_0" => st.client_secret = Some(bytes),
        "SERVER_TRAFFIC_SECRET_0" => st.server_secret = Some(bytes),
        _ => {}
    }
}

fn unhex(s: &str) -> Option<Zeroizing<Vec<u8>>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let mut v = Zeroizing::new(Vec::with_capacity(s.len() / 2));
    for i in (0..s.len()).step_by(2) {
        v.push(u8::from_str_radix(s.get(i..i + 2)?, 16).ok()?);
    }
    Some(v)
}

fn context(role: Role) -> &'static SslContext {
    static SERVER: OnceLock<SslContext> = OnceLock::new();
    static CLIENT: OnceLock<SslContext> = OnceLock::new();
    let (cell, method) = match role {
        Role::Server => (&SERVER, SslMethod::tls_server()),
        Role::Client => (&CLIENT, SslMethod::tls_client()),
    };
    cell.get_or_init(|| {
        let mut b = SslContextBuilder::new(method).expect("an OpenSSL context");
        b.set_min_proto_version(Some(SslVersion::TLS1_3)).expect("TLS 1.3");
        b.set_max_proto_version(Some(SslVersion::TLS1_3)).expect("TLS 1.3");
        b.set_ciphersuites("TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384").expect("the two NVMe/TCP suites");
        // No resumption: a ticket would be a post-handshake message, which
        // neither kTLS on Linux's NVMe/TCP host nor our record layer takes.
        b.set_num_tickets(0).expect("no tickets");
        b.set_options(SslOptions::NO_TICKET);
        b.set_keylog_callback(keylog);
        if role == Role::Server {
            // Our order among the suites of the binder's hash: AES-GCM
            // before ChaCha20-Poly1305 (see client_hello).
            b.set_options(SslOptions::CIPHER_SERVER_PREFERENCE);
            b.set_client_hello_callback(client_hello);
        }
        // SAFETY: a live context being built; callbacks with the signatures
        // OpenSSL declares.
        unsafe {
            match role {
                Role::Server => ffi::SSL_CTX_set_psk_find_session_callback(b.as_ptr(), Some(find_session)),
                Role::Client => ffi::SSL_CTX_set_psk_use_session_callback(b.as_ptr(), Some(use_session)),
            }
        }
        b.build()
    })
}

/// OpenSSL reads the records we were given and writes into `output`.
#[derive(Default)]
struct Pipe {
    input: Vec<u8>,
    pos: usize,
    output: Vec<u8>,
}

impl Read for Pipe {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.pos == self.input.len() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = buf.len().min(self.input.len() - self.pos);
        buf[..n].copy_from_slice(&self.input[self.pos..self.pos + n]);
        self.pos += n;
        if self.pos == self.input.len() {
            self.input.clear();
            self.pos = 0;
        }
        Ok(n)
    }
}

impl Write for Pipe {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.output.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// One connection's handshake.
pub struct Handshake {
    role: Role,
    stream: SslStream<Pipe>,
    /// Bytes taken from the peer so far.
    taken: usize,
    /// Server: the records taken while nothing was sent yet, to replay
    /// against the next candidate key.
    replay: Vec<u8>,
    sent: bool,
    /// The last plaintext alert the peer sent.
    peer_alert: Option<u8>,
    done: bool,
}

impl Handshake {
    /// A server's handshake, its keys from `store`.
    pub fn server(store: Arc<dyn PskStore>) -> Result<Handshake, HandshakeError> {
        Handshake::server_attempt(store, 0)
    }

    fn server_attempt(store: Arc<dyn PskStore>, attempt: usize) -> Result<Handshake, HandshakeError> {
        let st = State { store: Some(store), attempt, ..State::default() };
        Handshake::new(Role::Server, st, &[])
    }

    /// A client's handshake offering `psk` as `identity`, bound as TP 8011
    /// says; its ClientHello is ready in [`Handshake::take_output`].
    pub fn client(identity: &str, psk: TlsPsk) -> Result<Handshake, HandshakeError> {
        Handshake::client_bound(identity, psk, Binding::Specified)
    }

    /// A client's handshake offering `psk` as `identity`, bound as `binding`
    /// says (with the suites it allows).
    pub fn client_bound(identity: &str, psk: TlsPsk, binding: Binding) -> Result<Handshake, HandshakeError> {
        let hash = psk.hash;
        Handshake::client_offering(identity, psk, binding.hash(hash), binding.suites(hash))
    }

    /// A client binding `psk` with `bind` and offering `suites`: ours
    /// binds with the PSK's hash and offers its one suite; tlshd 1.0 binds
    /// with SHA-256 and offers the suites of the PSK's hash (the tests
    /// play it).
    fn client_offering(identity: &str, psk: TlsPsk, bind: PskHash, suites: &[Suite]) -> Result<Handshake, HandshakeError> {
        let st = State { identity: Some(identity.as_bytes().to_vec()), psk: Some(psk), binder_hash: Some(bind), ..State::default() };
        let mut h = Handshake::new(Role::Client, st, suites)?;
        h.step()?;
        Ok(h)
    }

    fn new(role: Role, st: State, suites: &[Suite]) -> Result<Handshake, HandshakeError> {
        let tls = |e: openssl::error::ErrorStack| HandshakeError::Tls(e.to_string());
        let mut ssl = Ssl::new(context(role)).map_err(tls)?;
        ssl.set_ex_data(index(), Mutex::new(st));
        if !suites.is_empty() {
            // A client offers only the suites its PSK is for.
            ssl.set_ciphersuites(&suites.iter().map(|s| s.name()).collect::<Vec<_>>().join(":")).map_err(tls)?;
        }
        match role {
            Role::Server => ssl.set_accept_state(),
            Role::Client => ssl.set_connect_state(),
        }
        let stream = SslStream::new(ssl, Pipe::default()).map_err(tls)?;
        Ok(Handshake { role, stream, taken: 0, replay: Vec::new(), sent: false, peer_alert: None, done: false })
    }

    /// What to send now (the caller sends all of it, in order).
    pub fn take_output(&mut self) -> Vec<u8> {
        let out = std::mem::take(&mut self.stream.get_mut().output);
        self.sent |= !out.is_empty();
        out
    }

    /// Take whole records from the front of `input` while the handshake
    /// runs. Returns how many bytes were taken (a partial record at the
    /// end, and anything after the handshake's last record, are left) and
    /// the keys once it is over. After an error, [`Handshake::take_output`]
    /// may hold an alert for the peer.
    pub fn feed(&mut self, input: &[u8]) -> Result<(usize, Option<Established>), HandshakeError> {
        let mut at = 0;
        while !self.done {
            let Some(h) = Header::parse(&input[at..])? else { break };
            if input.len() - at < h.total() {
                break;
            }
            let first = self.taken == 0;
            match h.kind {
                ContentType::Handshake => {}
                // The first record of either side is its hello (or a
                // refusal).
                ContentType::Alert => {}
                k if first => return Err(HandshakeError::Unexpected(k)),
                ContentType::ChangeCipherSpec | ContentType::ApplicationData => {}
            }
            if h.kind == ContentType::Alert && h.len == 2 {
                self.peer_alert = Some(input[at + record::HEADER_LEN + 1]);
            }
            self.taken += h.total();
            if self.taken > HANDSHAKE_LIMIT {
                return Err(HandshakeError::TooLarge);
            }
            let rec = &input[at..at + h.total()];
            at += h.total();
            if self.role == Role::Server && !self.sent {
                self.replay.extend_from_slice(rec);
            }
            self.stream.get_mut().input.extend_from_slice(rec);
            if let Err(e) = self.step() {
                match self.retry() {
                    None => return Err(e),
                    Some(r) => r?,
                }
            }
        }
        if !self.done {
            return Ok((at, None));
        }
        Ok((at, Some(self.established()?)))
    }

    /// Drive OpenSSL with what it has.
    fn step(&mut self) -> Result<(), HandshakeError> {
        match self.stream.do_handshake() {
            Ok(()) => {
                self.done = true;
                Ok(())
            }
            Err(e) if e.code() == ErrorCode::WANT_READ => Ok(()),
            Err(e) => Err(self.diagnose(e)),
        }
    }

    /// Server: the key tried did not verify and nothing was sent yet: the
    /// same ClientHello against the next candidate. None when there is no
    /// next one (the first failure stands); else how the replay went.
    fn retry(&mut self) -> Option<Result<(), HandshakeError>> {
        if self.role != Role::Server || self.sent {
            return None;
        }
        let (store, attempt, identity, notes) = {
            let st = state(self.stream.ssl());
            st.note.as_ref()?;
            (st.store.clone()?, st.attempt, st.identity.clone()?, st.notes.clone())
        };
        let text = std::str::from_utf8(&identity).ok()?;
        if !matches!(store.lookup(text, attempt + 1), Ok(Some(_))) {
            return None;
        }
        let mut next = match Handshake::server_attempt(store, attempt + 1) {
            Ok(n) => n,
            Err(e) => return Some(Err(e)),
        };
        state(next.stream.ssl()).notes = notes;
        let replay = std::mem::take(&mut self.replay);
        let (taken, alert) = (self.taken, self.peer_alert);
        let r = next.feed(&replay);
        // The replay counted again what was taken once.
        next.taken = taken;
        next.peer_alert = alert;
        next.replay = replay;
        *self = next;
        Some(r.map(|_| ()))
    }

    fn diagnose(&mut self, e: openssl::ssl::Error) -> HandshakeError {
        let st = state(self.stream.ssl());
        let ids = |b: &Vec<u8>| String::from_utf8_lossy(b).into_owned();
        let reasons = e.ssl_error().map(|s| s.errors().iter().filter_map(|x| x.reason()).collect::<Vec<_>>().join("; ")).unwrap_or_default();
        if self.role == Role::Server {
            if let Some(id) = &st.identity {
                if let Some(why) = &st.refused {
                    return HandshakeError::Refused { identity: ids(id), why: why.clone() };
                }
                if reasons.contains("binder") {
                    let tried = if st.notes.is_empty() { String::new() } else { format!("; tried: {}", st.notes.join(", ")) };
                    return HandshakeError::WrongKey { identity: ids(id), tried };
                }
            } else if ["signature algorithm", "shared cipher", "certificate"].iter().any(|r| reasons.contains(r)) {
                // A ClientHello OpenSSL read whole, with no PSK in it: it
                // looked for a certificate to authenticate with instead.
                return HandshakeError::NoPsk;
            }
        }
        if let Some(desc) = self.peer_alert {
            return HandshakeError::PeerAlert { desc };
        }
        HandshakeError::Tls(if reasons.is_empty() { e.to_string() } else { reasons })
    }

    fn established(&mut self) -> Result<Established, HandshakeError> {
        let ssl = self.stream.ssl();
        let suite = ssl.current_cipher().and_then(|c| Suite::from_code(c.protocol_id())).ok_or_else(|| HandshakeError::Tls("a cipher suite other than NVMe/TCP's two".into()))?;
        let mut st = state(ssl);
        let (Some(c), Some(s)) = (st.client_secret.take(), st.server_secret.take()) else {
            return Err(HandshakeError::Tls("OpenSSL did not log the traffic secrets".into()));
        };
        let identity = String::from_utf8_lossy(st.identity.as_deref().unwrap_or_default()).into_owned();
        let (tx, rx) = match self.role {
            Role::Server => (s, c),
            Role::Client => (c, s),
        };
        Ok(Established { suite, identity, note: st.note.clone(), tx: Keys::from_secret(suite, &tx), rx: Keys::from_secret(suite, &rx) })
    }
}

#[cfg(test)]
mod tests;
