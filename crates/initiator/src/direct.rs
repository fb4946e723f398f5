//! Reading a large payload from a TCP socket straight into its caller's
//! buffer, for both TCP initiators (NVMe/TCP's C2HData, iSCSI's Data-In):
//! the session fills the buffer under its lock, this waits for the socket
//! and, while much is left, asks it not to wake us for every segment.

use std::os::fd::AsRawFd;
use tokio::net::tcp::OwnedReadHalf;

/// How long a read waits for the socket to hold more of a payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wakeups {
    /// Take what is there each time the socket has anything.
    Eager,
    /// Sleep until this much of what is left (at most) is there
    /// (`SO_RCVLOWAT`): fewer wakeups, each a larger copy.
    LowWater(usize),
}

fn set_rcvlowat(rd: &OwnedReadHalf, n: usize) {
    let v = n as libc::c_int;
    // SAFETY: a valid fd and a c_int option value of the right size.
    unsafe {
        libc::setsockopt(
            rd.as_ref().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            &v as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// Read the `left` bytes still to come of a payload: `fill` reads what the
/// socket holds into place (with `OwnedReadHalf::try_read`, under the
/// session's lock, so that a caller giving up takes its buffer back under
/// the same lock) and says how many bytes it read and how many are left.
pub(crate) async fn recv(
    rd: &OwnedReadHalf,
    mut left: usize,
    wakeups: Wakeups,
    mut fill: impl FnMut() -> std::io::Result<(usize, usize)>,
) -> Result<(), String> {
    let mut lowat = 1;
    while left > 0 {
        rd.readable().await.map_err(|e| format!("receive failed: {e}"))?;
        match fill() {
            Ok((0, _)) => return Err("target closed the connection".into()),
            Ok((_, l)) => left = l,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if let Wakeups::LowWater(max) = wakeups {
                    let want = left.min(max).max(1);
                    if want != lowat {
                        set_rcvlowat(rd, want);
                        lowat = want;
                    }
                }
            }
            Err(e) => return Err(format!("receive failed: {e}")),
        }
    }
    if lowat != 1 {
        set_rcvlowat(rd, 1);
    }
    Ok(())
}
