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
use base64::Engine;
use sha2::{Digest, Sha256};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use subtle::ConstantTimeEq;

/// The endpoint's bounds (bw_http, whose hyper parses the heads): a
/// peer holds at most 4 unauthenticated connections, an unfinished head
/// goes after 5 s and the oldest pending connection makes room for a new
/// one, so idle connections from one address or many keep no client out;
/// a client whose head carries the credentials moves to one of 8 slots
/// of its own. Bodies are JSON-RPC requests (the control socket's limit).
const LIMITS: bw_http::Limits = bw_http::Limits {
    admission: bw_http::AdmissionLimits { pending: 16, per_peer: 4, authenticated: 8 },
    max_head: 16 * 1024,
    max_body: jsonrpc::MAX_REQUEST,
    head_timeout: Duration::from_secs(5),
    body_timeout: Duration::from_secs(10),
    send_timeout: Duration::from_secs(10),
};

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

/// The control methods, one JSON-RPC request per POST, for callers with
/// the credentials.
struct Methods {
    live: Arc<Live>,
    creds: Arc<Credentials>,
    /// One line per peer and interval for refusals (a password guesser
    /// must not fill the journal).
    refusals: bw_http::LogThrottle,
}

impl bw_http::Endpoint for Methods {
    fn name(&self) -> &'static str {
        "rpc-http"
    }

    fn check(&self, head: &bw_http::Head, peer: SocketAddr) -> bw_http::Verdict {
        // Credentials before anything else is looked at.
        let authorization = head.headers.get("authorization").and_then(|v| v.to_str().ok());
        if !self.creds.admit(authorization) {
            self.refusals.warn(peer.ip(), format_args!("rpc-http: {peer}: refused (no or wrong credentials)"));
            return bw_http::Verdict::Refused(bw_http::Answer::status(401).with_header("WWW-Authenticate", "Basic realm=\"blockwire\""));
        }
        if head.method.as_str() != "POST" {
            return bw_http::Verdict::Refused(bw_http::Answer::status(405));
        }
        bw_http::Verdict::Authenticated
    }

    fn answer(&self, _: &bw_http::Head, body: bytes::Bytes, peer: SocketAddr) -> bw_http::Answer {
        let before = self.live.generation();
        let text = String::from_utf8_lossy(&body);
        let answer = jsonrpc::handle_line(&self.live, &text);
        if self.live.generation() != before {
            log::info!("rpc-http: change by {peer}: {} -> {}", text.trim(), answer.as_deref().unwrap_or("(notification)"));
        }
        bw_http::Answer::new(200, "application/json", answer.unwrap_or_default())
    }
}

/// Serve until `shutdown`.
pub async fn serve(listener: tokio::net::TcpListener, live: Arc<Live>, creds: Arc<Credentials>, mut shutdown: bw_serve::Shutdown) -> anyhow::Result<()> {
    bw_http::serve(listener, Arc::new(Methods { live, creds, refusals: bw_http::LogThrottle::new(std::time::Duration::from_secs(10)) }), LIMITS, async move { shutdown.wait().await }).await;
    Ok(())
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
