//! The control methods over HTTP (`serve --rpc-http ADDR`), as SPDK's
//! `rpc_http_proxy` offers them and OpenStack Cinder's SPDK driver calls
//! them: a JSON-RPC request POSTed as the body, the response as the
//! answer's body. This is a way into the SAN's control plane, so:
//! HTTP basic authentication with credentials read from a file only its
//! owner can read (serve refuses to start otherwise), compared in
//! constant time, 401 for anything else; bounded headers, body and
//! connections, each with a time limit; and every change logged with the
//! caller's address.

use crate::jsonrpc;
use crate::live::Live;
use anyhow::Context;
use base64::Engine;
use sha2::{Digest, Sha256};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use subtle::ConstantTimeEq;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Longest request head (request line and headers).
const MAX_HEAD: usize = 16 * 1024;
/// Longest body: a JSON-RPC request (the control socket's limit).
const MAX_BODY: usize = jsonrpc::MAX_REQUEST;
/// Connections served at once; more are answered 503 and closed.
const MAX_CONNECTIONS: usize = 16;
/// From accept to the whole request read.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The `user:password` the endpoint accepts, kept as its SHA-256 so
/// every comparison is of 32 bytes, whatever was sent.
pub struct Credentials([u8; 32]);

impl Credentials {
    /// Read `USER:PASSWORD` (one line) from `path`, which must be a
    /// regular file (not a link) owned by the user serve runs as, that
    /// neither group nor others may read or write.
    pub fn from_file(path: &Path) -> anyhow::Result<Credentials> {
        use std::io::Read;
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
        let shown = path.display();
        // Not through a link (whoever may write its directory could point
        // it at a file of theirs), and read from the file checked, not
        // from whatever is at the path afterwards.
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP) => anyhow::anyhow!("--rpc-http-credentials {shown}: is a symbolic link; name the file itself"),
                _ => anyhow::Error::new(e).context(format!("--rpc-http-credentials {shown}")),
            })?;
        let meta = file.metadata()?;
        let mode = meta.permissions().mode() & 0o777;
        if !meta.is_file() || mode & 0o077 != 0 {
            anyhow::bail!("--rpc-http-credentials {shown}: must be a regular file of mode 600 (it is {mode:03o}): chmod 600 {shown}");
        }
        // Another user who owns it reads (and may change) the credentials.
        // SAFETY: geteuid cannot fail.
        let me = unsafe { libc::geteuid() };
        if meta.uid() != me {
            let whom = if me == 0 { "root".to_string() } else { format!("uid {me}, which serve runs as") };
            anyhow::bail!("--rpc-http-credentials {shown}: must be owned by {whom} (it is owned by uid {}): chown {me} {shown}", meta.uid());
        }
        let mut text = zeroize::Zeroizing::new(String::new());
        file.read_to_string(&mut text)?;
        let line = text.lines().next().unwrap_or("").trim_end();
        match line.split_once(':') {
            Some((u, p)) if !u.is_empty() && !p.is_empty() => Ok(Credentials::new(line)),
            _ => anyhow::bail!("--rpc-http-credentials {}: expected one line USER:PASSWORD", path.display()),
        }
    }

    fn new(user_colon_password: &str) -> Credentials {
        Credentials(Sha256::digest(user_colon_password.as_bytes()).into())
    }

    /// Whether an `Authorization` header value carries these credentials.
    pub fn admit(&self, authorization: Option<&str>) -> bool {
        let Some(b64) = authorization.and_then(|a| a.strip_prefix("Basic ")) else {
            return false;
        };
        let Ok(given) = base64::engine::general_purpose::STANDARD.decode(b64.trim()) else {
            return false;
        };
        let given: [u8; 32] = Sha256::digest(&given).into();
        given.ct_eq(&self.0).into()
    }
}

/// A request head, parsed.
#[derive(Debug, PartialEq)]
pub struct Head {
    pub method: String,
    pub content_length: Option<usize>,
    pub chunked: bool,
    pub authorization: Option<String>,
}

/// Where the head ends (after its blank line), if it has.
pub fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4)
}

/// Parse a request head; `Err` is the status to answer.
pub fn parse_head(head: &[u8]) -> Result<Head, &'static str> {
    let text = std::str::from_utf8(head).map_err(|_| "400 Bad Request")?;
    let mut lines = text.split("\r\n");
    let method = lines.next().and_then(|l| l.split(' ').next()).filter(|m| !m.is_empty()).ok_or("400 Bad Request")?;
    let mut h = Head { method: method.to_string(), content_length: None, chunked: false, authorization: None };
    for l in lines.filter(|l| !l.is_empty()) {
        let (k, v) = l.split_once(':').ok_or("400 Bad Request")?;
        let v = v.trim();
        match k.trim().to_ascii_lowercase().as_str() {
            "content-length" => h.content_length = Some(v.parse().map_err(|_| "400 Bad Request")?),
            "transfer-encoding" => h.chunked = true,
            "authorization" => h.authorization = Some(v.to_string()),
            _ => {}
        }
    }
    Ok(h)
}

/// Serve until `shutdown`.
pub async fn serve(listener: tokio::net::TcpListener, live: Arc<Live>, creds: Arc<Credentials>, mut shutdown: bw_serve::Shutdown) -> anyhow::Result<()> {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (mut s, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    log::warn!("rpc-http: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = shutdown.wait() => return Ok(()),
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            log::warn!("rpc-http: {peer}: {MAX_CONNECTIONS} connections under way; answered 503");
            tokio::spawn(async move {
                let _ = s.write_all(&reply("503 Service Unavailable", "text/plain", b"busy\n")).await;
                close_after_answer(&mut s).await;
            });
            continue;
        };
        let (live, creds) = (live.clone(), creds.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let answer = answer(&mut s, peer, &live, &creds).await;
            let _ = s.write_all(&answer).await;
            close_after_answer(&mut s).await;
        });
    }
}

/// How long a connection is drained after its answer (below).
const DRAIN_TIME: Duration = Duration::from_secs(2);

/// Close a connection without losing its answer: a socket closed with
/// input still unread (the body of a request refused at its head: 401,
/// 413, 503) sends a reset, and the client's read of the answer then fails
/// with "connection reset" instead of showing the status. Half-close, then
/// read and drop what the client still sends until it closes, bounded in
/// bytes and time.
async fn close_after_answer(s: &mut tokio::net::TcpStream) {
    let _ = s.shutdown().await;
    let mut chunk = [0u8; 8192];
    let mut left = MAX_HEAD + MAX_BODY;
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        while left > 0 {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
}

fn reply(status: &str, kind: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!("HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n", body.len());
    if status.starts_with("401") {
        r.push_str("WWW-Authenticate: Basic realm=\"blockwire\"\r\n");
    }
    r.push_str("\r\n");
    let mut r = r.into_bytes();
    r.extend_from_slice(body);
    r
}

fn status(s: &str) -> Vec<u8> {
    reply(s, "text/plain", format!("{s}\n").as_bytes())
}

/// Read one request and answer it (one request per connection).
async fn answer(s: &mut tokio::net::TcpStream, peer: SocketAddr, live: &Arc<Live>, creds: &Credentials) -> Vec<u8> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 8192];
    let read = async {
        let end = loop {
            if let Some(e) = head_end(&buf) {
                break e;
            }
            if buf.len() > MAX_HEAD {
                return Err("431 Request Header Fields Too Large");
            }
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return Err(""),
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = parse_head(&buf[..end])?;
        // Credentials before anything else is looked at.
        if !creds.admit(head.authorization.as_deref()) {
            return Err("401 Unauthorized");
        }
        if head.method != "POST" {
            return Err("405 Method Not Allowed");
        }
        if head.chunked {
            return Err("411 Length Required");
        }
        let len = head.content_length.ok_or("411 Length Required")?;
        if len > MAX_BODY {
            return Err("413 Content Too Large");
        }
        let mut body = buf.split_off(end);
        while body.len() < len {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return Err(""),
                Ok(n) => body.extend_from_slice(&chunk[..n]),
            }
        }
        body.truncate(len);
        Ok(body)
    };
    let body = match tokio::time::timeout(READ_TIMEOUT, read).await {
        Ok(Ok(b)) => b,
        Ok(Err("")) => return vec![],
        Ok(Err(st)) => {
            if st.starts_with("401") {
                log::warn!("rpc-http: {peer}: refused (no or wrong credentials)");
            }
            return status(st);
        }
        Err(_) => return status("408 Request Timeout"),
    };
    let l = live.clone();
    let out = tokio::task::spawn_blocking(move || {
        let before = l.generation();
        let text = String::from_utf8_lossy(&body);
        let answer = jsonrpc::handle_line(&l, &text);
        if l.generation() != before {
            log::info!("rpc-http: change by {peer}: {} -> {}", text.trim(), answer.as_deref().unwrap_or("(notification)"));
        }
        answer
    })
    .await;
    match out {
        Ok(Some(json)) => reply("200 OK", "application/json", json.as_bytes()),
        Ok(None) => reply("200 OK", "application/json", b""),
        Err(_) => status("500 Internal Server Error"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_right_credentials_are_admitted() {
        let c = Credentials::new("cinder:s3cret");
        let b = |s: &str| format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(s));
        assert!(c.admit(Some(&b("cinder:s3cret"))));
        for bad in [b("cinder:s3cre"), b("cinder:s3cret "), b(""), "Basic !!!".into(), "Bearer x".into()] {
            assert!(!c.admit(Some(&bad)), "{bad}");
        }
        assert!(!c.admit(None));
    }

    #[test]
    fn heads_parse_or_say_why_not() {
        let h = parse_head(b"POST / HTTP/1.1\r\nHost: x\r\ncontent-length: 12\r\nAuthorization: Basic eA==\r\n\r\n").unwrap();
        assert_eq!((h.method.as_str(), h.content_length, h.authorization.as_deref(), h.chunked), ("POST", Some(12), Some("Basic eA=="), false));
        assert_eq!(parse_head(b"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n"), Err("400 Bad Request"));
        assert_eq!(parse_head(b"POST / HTTP/1.1\r\nno colon\r\n\r\n"), Err("400 Bad Request"));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\nbody"), Some(18));
    }

    #[test]
    fn credentials_files_must_be_private() {
        use std::os::unix::fs::PermissionsExt;
        let p = std::env::temp_dir().join(format!("bw-rpc-creds-{}", std::process::id()));
        std::fs::write(&p, "cinder:s3cret\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(Credentials::from_file(&p).err().unwrap().to_string().contains("mode 600"));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(Credentials::from_file(&p).unwrap().admit(Some(&format!("Basic {}", base64::engine::general_purpose::STANDARD.encode("cinder:s3cret")))));
        let link = p.with_extension("link");
        std::os::unix::fs::symlink(&p, &link).unwrap();
        assert!(Credentials::from_file(&link).err().unwrap().to_string().contains("symbolic link"));
        std::fs::remove_file(&link).unwrap();
        if unsafe { libc::geteuid() } == 0 {
            std::os::unix::fs::chown(&p, Some(65534), None).unwrap();
            assert!(Credentials::from_file(&p).err().unwrap().to_string().contains("owned by root (it is owned by uid 65534)"));
            std::os::unix::fs::chown(&p, Some(0), None).unwrap();
        }
        std::fs::write(&p, "no-colon\n").unwrap();
        assert!(Credentials::from_file(&p).is_err());
        std::fs::remove_file(&p).unwrap();
    }
}
