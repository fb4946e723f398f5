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

/// What one attempt to read more of a payload into place did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Filled {
    /// Some of the payload went into place; `left` bytes of it are still to come.
    Placed { left: usize },
    /// Nothing went into place: the socket must first hold `need` more
    /// bytes (at least) than it does now. Counted when the attempt ends:
    /// through the TLS record layer an attempt can take bytes off the
    /// socket (part of a record, held) and place nothing, so what was
    /// left before it overstates what is still to come on the wire.
    Waiting { need: usize },
    /// The peer closed the connection.
    Closed,
}

impl Filled {
    /// The outcome of one read attempt `r` (bytes placed, or an error)
    /// after which the payload has `left` bytes to come, `held` of them
    /// already taken off the socket and held (part of a TLS record; 0 for
    /// a plain socket read, which takes nothing when it would block).
    pub(crate) fn after(r: std::io::Result<usize>, left: usize, held: usize) -> std::io::Result<Filled> {
        match r {
            Ok(0) => Ok(Filled::Closed),
            Ok(_) => Ok(Filled::Placed { left }),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(Filled::Waiting { need: left.saturating_sub(held) }),
            Err(e) => Err(e),
        }
    }
}

/// Read the `left` bytes still to come of a payload: `fill` reads what the
/// socket holds into place (with `OwnedReadHalf::try_read`, under the
/// session's lock, so that a caller giving up takes its buffer back under
/// the same lock) and says what it did.
///
/// With [`Wakeups::LowWater`] the socket is told to wake us only once it
/// holds what `fill` last said it needs: never more than will come, or
/// the read waits for bytes the target will never send (until the
/// command's timeout; docs/notes/2026-11-26-tls-lowat.md).
pub(crate) async fn recv(
    rd: &OwnedReadHalf,
    mut left: usize,
    wakeups: Wakeups,
    mut fill: impl FnMut() -> std::io::Result<Filled>,
) -> Result<(), String> {
    let mut lowat = 1;
    while left > 0 {
        rd.readable().await.map_err(|e| format!("receive failed: {e}"))?;
        match fill() {
            Ok(Filled::Placed { left: l }) => left = l,
            Ok(Filled::Closed) => return Err("target closed the connection".into()),
            Ok(Filled::Waiting { need }) => {
                if let Wakeups::LowWater(max) = wakeups {
                    let want = need.min(max).max(1);
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
