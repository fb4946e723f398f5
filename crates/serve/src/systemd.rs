//! Tell systemd how the service is doing (sd_notify(3)): one datagram to
//! `$NOTIFY_SOCKET`, a path or, with a leading `@`, an abstract socket
//! name. Written out rather than taken from the `sd-notify` crate: the
//! protocol is this one send, and nothing else of libsystemd is needed.
//! Without `$NOTIFY_SOCKET` (not started by systemd) nothing is sent.

use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// Send `state` ("READY=1", "RELOADING=1", "STOPPING=1", "STATUS=...")
/// if systemd asked for notifications; failures are logged, not fatal.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    if let Err(e) = notify_to(&path.to_string_lossy(), state) {
        log::warn!("sd_notify {state:?} to {path:?} failed: {e}");
    }
}

/// Send `state` to the notification socket `path`.
pub fn notify_to(path: &str, state: &str) -> io::Result<()> {
    let addr = match path.strip_prefix('@') {
        Some(name) => SocketAddr::from_abstract_name(name.as_bytes())?,
        None => SocketAddr::from_pathname(path)?,
    };
    let sock = UnixDatagram::unbound()?;
    sock.send_to_addr(state.as_bytes(), &addr)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_one_datagram_to_a_path_or_an_abstract_name() {
        let dir = std::env::temp_dir().join(format!("bw-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify");
        let rx = UnixDatagram::bind(&path).unwrap();
        notify_to(path.to_str().unwrap(), "READY=1").unwrap();
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
        std::fs::remove_dir_all(&dir).unwrap();

        let name = format!("bw-notify-test-{}", std::process::id());
        let rx = UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap()).unwrap();
        notify_to(&format!("@{name}"), "STOPPING=1").unwrap();
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
    }
}
