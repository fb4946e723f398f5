//! The control socket: JSON-RPC 2.0 (crate::jsonrpc) over a Unix stream
//! socket, for root only. Protocol and methods: docs/control.md.

use crate::jsonrpc::{error_response, handle_value, parse_error, Frame, Framer};
use crate::live::Live;
use crate::rpc::{code, RpcError};
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Where the socket is when `--control` is not given.
pub const DEFAULT_PATH: &str = "/run/blockwire/control.sock";

/// The bound control socket; removed when dropped if it is still ours.
pub struct ControlSocket {
    listener: tokio::net::UnixListener,
    path: PathBuf,
    ino: u64,
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.ino) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Bind the socket at `path` (mode 600). A server answering there is an
/// error when `explicit` (`--control PATH`), else (the default path) a
/// warning and no socket: another server on this machine owns it. A
/// socket nobody answers on is stale and replaced; anything else at the
/// path is an error.
pub fn bind(path: &Path, explicit: bool) -> anyhow::Result<Option<ControlSocket>> {
    // Only in a directory only root may write (made 700 if missing): in
    // another, whoever may write it could put a link at the lock and have
    // root create or empty the file it points to, or replace the socket.
    let name = path.file_name().ok_or_else(|| anyhow::anyhow!("control socket {}: names no file", path.display()))?;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let dir = bw_rootdir::RootDir::create(dir)
        .map_err(|e| anyhow::anyhow!("control socket {}: {e}; give a --control PATH in a directory only root may write", path.display()))?;
    // Servers starting at the same moment take turns: otherwise one can
    // find the other's socket bound but not yet listening, remove it as
    // stale, and leave the other failing on a path that is gone.
    let mut lock_name = name.to_owned();
    lock_name.push(".lock");
    let lock = dir.open_lock(&lock_name).map_err(|e| anyhow::anyhow!("control socket lock: {e}"))?;
    // SAFETY: flock on a descriptor this function owns; released when
    // `lock` is closed at the end of the function.
    if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) } != 0 {
        let e = std::io::Error::last_os_error();
        anyhow::bail!("control socket lock {}: {e}", dir.join(&lock_name).display());
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            anyhow::bail!("control socket {}: the path exists and is not a socket", path.display());
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            if explicit {
                anyhow::bail!("control socket {}: another blockwire server answers there (give another --control PATH)", path.display());
            }
            log::warn!("control socket {}: another server answers there; this one runs without a control socket", path.display());
            return Ok(None);
        }
        log::info!("control socket {}: removing a stale socket", path.display());
        dir.remove(name)?;
    }
    let listener = match tokio::net::UnixListener::bind(path) {
        Ok(l) => l,
        // Another server started at the same moment and bound it first.
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && !explicit => {
            log::warn!("control socket {}: taken by another server; this one runs without a control socket", path.display());
            return Ok(None);
        }
        Err(e) => anyhow::bail!("control socket {}: {e}", path.display()),
    };
    dir.set_mode(name, 0o600)?;
    let ino = std::fs::symlink_metadata(path)?.ino();
    log::info!("control socket on {}", path.display());
    Ok(Some(ControlSocket { listener, path: path.to_path_buf(), ino }))
}

impl ControlSocket {
    /// Serve clients until `shutdown`; each request runs on the blocking
    /// pool (opening a volume may wait for a disk).
    pub async fn run(self, live: Arc<Live>, mut shutdown: bw_serve::Shutdown) {
        loop {
            let stream = tokio::select! {
                r = self.listener.accept() => match r {
                    Ok((s, _)) => s,
                    Err(e) => {
                        log::warn!("control socket: accept: {e}");
                        continue;
                    }
                },
                _ = shutdown.wait() => return,
            };
            tokio::spawn(client(stream, live.clone()));
        }
    }
}

async fn client(stream: tokio::net::UnixStream, live: Arc<Live>) {
    let uid = stream.peer_cred().map(|c| c.uid()).ok();
    let (mut rd, mut wr) = stream.into_split();
    if uid != Some(0) {
        log::warn!("control socket: refused a client with uid {uid:?} (root only)");
        let e = error_response(Value::Null, RpcError::new(code::PERMISSION_DENIED, "permission denied: the control socket is for root only"));
        let _ = wr.write_all(format!("{e}\n").as_bytes()).await;
        return;
    }
    let mut framer = Framer::default();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let reply = match framer.next_frame() {
            None => match rd.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    framer.push(&buf[..n]);
                    continue;
                }
            },
            Some(Frame::TooLong) => {
                let e = error_response(Value::Null, RpcError::new(code::INVALID_REQUEST, "invalid request: longer than 1 MiB"));
                let _ = wr.write_all(format!("{e}\n").as_bytes()).await;
                return;
            }
            Some(Frame::Garbage(e)) => Some(parse_error(e)),
            Some(Frame::Request(v)) => {
                let l = live.clone();
                match tokio::task::spawn_blocking(move || handle_value(&l, v)).await {
                    Ok(r) => r,
                    Err(e) => Some(error_response(Value::Null, RpcError::new(code::INTERNAL, format!("internal error: {e}"))).to_string()),
                }
            }
        };
        if let Some(r) = reply {
            if wr.write_all(format!("{r}\n").as_bytes()).await.is_err() {
                return;
            }
        }
    }
}

/// The client side (`blockwire ctl`): send `method` with `params` (JSON
/// text, passed as given, or none) and return the response object.
pub fn call(path: &Path, method: &str, params: Option<&str>) -> anyhow::Result<Value> {
    let mut s = std::os::unix::net::UnixStream::connect(path).map_err(|e| anyhow::anyhow!("control socket {}: {e} (is blockwire serve running? --control PATH)", path.display()))?;
    let method = serde_json::to_string(method)?;
    let line = match params {
        Some(p) => format!("{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":{method},\"params\":{p}}}\n"),
        None => format!("{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":{method}}}\n"),
    };
    // A refused client (not root) is answered and closed before its
    // request is read: the answer is there even if the write failed.
    let sent = s.write_all(line.as_bytes());
    let mut reply = String::new();
    BufReader::new(s).read_line(&mut reply)?;
    if reply.is_empty() {
        sent?;
        anyhow::bail!("the server closed the connection without an answer");
    }
    Ok(serde_json::from_str(&reply)?)
}
