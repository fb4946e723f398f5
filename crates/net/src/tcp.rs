//! TCP helpers shared by the TCP targets (`serve`) and initiators: which
//! congestion-control algorithm a connection runs.
//!
//! Why this matters on a connection to the same machine: BBR paces its
//! sends with a high-resolution timer when no `fq` qdisc does it (loopback
//! has none), so a 1 MiB answer leaves as about 16 timer-driven bursts, each
//! a timer interrupt and a softirq on the sender's CPU. On the 2-vCPU VM
//! this project is measured on (kernel 6.18, `net.ipv4.tcp_congestion_control
//! = bbr`), NVMe/TCP 1 MiB reads over loopback cost the target 250-790 µs of
//! CPU per read under BBR (1300-2700 MiB/s, a different speed every run)
//! and 97-125 µs under cubic (3000-3500 MiB/s, within 13%); our iSCSI
//! 1350-1770 against 2670-2750 MiB/s (docs/notes/2026-11-22-nvme-tcp-data-path.md). A same-host
//! connection has no bottleneck queue for pacing to protect, so
//! [`Congestion::Auto`] replaces a pacing algorithm there; connections to
//! other machines keep what the administrator chose.

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

/// The kernel's limit on an algorithm's name, NUL included (TCP_CA_NAME_MAX).
const NAME_MAX: usize = 16;

/// What a connection asks for, in the order tried, in place of an
/// algorithm that paces by timer: both are built into Debian's kernels and
/// allowed to unprivileged sockets by default.
const UNPACED: [&str; 2] = ["cubic", "reno"];

/// Which congestion-control algorithm our TCP connections use. In
/// configuration files: "auto", "system" or the algorithm's name.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Congestion {
    /// The system's default, except on a connection to this same machine
    /// (loopback, or our own address), where an algorithm that paces by
    /// timer (BBR) is replaced by cubic (or reno).
    #[default]
    Auto,
    /// The system's default (`net.ipv4.tcp_congestion_control`) everywhere.
    System,
    /// This algorithm on every connection. Without CAP_NET_ADMIN it must be
    /// in `net.ipv4.tcp_allowed_congestion_control`.
    Named(String),
}

impl std::str::FromStr for Congestion {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Congestion::Auto),
            "system" => Ok(Congestion::System),
            _ if !s.is_empty()
                && s.len() < NAME_MAX
                && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') =>
            {
                Ok(Congestion::Named(s.to_string()))
            }
            _ => Err(format!(
                "{s:?}: expected auto, system or an algorithm name such as cubic \
                 (see net.ipv4.tcp_available_congestion_control)"
            )),
        }
    }
}

impl std::fmt::Display for Congestion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Congestion::Auto => f.write_str("auto"),
            Congestion::System => f.write_str("system"),
            Congestion::Named(n) => f.write_str(n),
        }
    }
}

impl TryFrom<String> for Congestion {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<Congestion> for String {
    fn from(c: Congestion) -> String {
        c.to_string()
    }
}

/// Whether a peer at `peer` runs on this machine: a loopback address, or
/// the address the connection arrived on (or left from).
pub fn is_same_host(peer: IpAddr, local: Option<IpAddr>) -> bool {
    peer.is_loopback() || local == Some(peer)
}

/// Whether an algorithm paces its sends by timer when no qdisc does it for
/// it: BBR (mainline `bbr`; out-of-tree `bbr2`, `bbr3`).
pub fn paces_by_timer(algorithm: &str) -> bool {
    algorithm.starts_with("bbr")
}

/// The socket's congestion-control algorithm.
pub fn congestion(sock: impl AsFd) -> io::Result<String> {
    let mut name = [0u8; NAME_MAX];
    let mut len = name.len() as libc::socklen_t;
    // SAFETY: a valid fd and a buffer of `len` bytes the kernel fills.
    let r = unsafe {
        libc::getsockopt(
            sock.as_fd().as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_mut_ptr() as *mut libc::c_void,
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    let n = &name[..(len as usize).min(NAME_MAX)];
    let end = n.iter().position(|&b| b == 0).unwrap_or(n.len());
    Ok(String::from_utf8_lossy(&n[..end]).into_owned())
}

/// Switch the socket to `algorithm`.
pub fn set_congestion(sock: impl AsFd, algorithm: &str) -> io::Result<()> {
    // SAFETY: a valid fd and a buffer of the given length.
    let r = unsafe {
        libc::setsockopt(
            sock.as_fd().as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            algorithm.as_ptr() as *const libc::c_void,
            algorithm.len() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The system's default algorithm in this network namespace
/// (`net.ipv4.tcp_congestion_control`).
pub fn system_default() -> io::Result<String> {
    Ok(std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")?.trim().to_string())
}

/// The algorithms the kernel has, built in or loaded, as it prints them.
const AVAILABLE: &str = "/proc/sys/net/ipv4/tcp_available_congestion_control";

/// The algorithms the kernel has (net.ipv4.tcp_available_congestion_control), space-separated.
pub fn available() -> io::Result<String> {
    Ok(std::fs::read_to_string(AVAILABLE)?.trim().to_string())
}

/// What links within one machine (loopback, veth pairs between network
/// namespaces) should run instead of `default`: the first unpaced
/// algorithm the kernel has (`available`, as [`available`] gives it)
/// when `default` paces by timer; `None` to keep `default`.
pub fn unpaced_in_place_of(default: &str, available: &str) -> Option<&'static str> {
    if !paces_by_timer(default) {
        return None;
    }
    UNPACED.into_iter().find(|a| available.split_whitespace().any(|x| x == *a))
}

/// Whether `ip` is one of this machine's addresses: binding to it works
/// (without `net.ipv4.ip_nonlocal_bind`, only local addresses bind).
pub fn is_own_address(ip: IpAddr) -> bool {
    ip.is_loopback() || std::net::UdpSocket::bind((ip, 0)).is_ok()
}

/// Try `algorithms` in order; the first the kernel takes is returned.
fn set_first(sock: BorrowedFd<'_>, algorithms: &[&str]) -> io::Result<String> {
    let mut last = None;
    for &a in algorithms {
        match set_congestion(sock, a) {
            Ok(()) => return Ok(a.to_string()),
            Err(e) => last = Some(io::Error::new(e.kind(), format!("TCP congestion control {a}: {e}"))),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no congestion control to try")))
}

/// A [`Congestion`] policy with the system default it is applied against.
///
/// The algorithm has to be chosen *before* a connection is established:
/// BBR turns on the socket's internal pacing when it starts, and a later
/// switch to cubic leaves it on (the kernel keeps `sk_pacing_status`;
/// measured: a loopback target switched after accept still spent 160-375
/// µs per 1 MiB read, against 97-125 µs for sockets that never ran BBR).
/// So an initiator sets it on the socket before `connect`
/// ([`CongestionPlan::before_connect`]), and a target on the listening
/// socket, which accepted connections inherit
/// ([`CongestionPlan::on_listener`]); under [`Congestion::Auto`] a
/// connection from another machine then gets the system default back as
/// soon as it is accepted ([`CongestionPlan::on_accepted`]), before any
/// data moves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CongestionPlan {
    pub policy: Congestion,
    /// The system default; empty if it could not be read (Auto then
    /// changes nothing).
    pub default: String,
}

impl CongestionPlan {
    pub fn new(policy: Congestion) -> CongestionPlan {
        CongestionPlan { policy, default: system_default().unwrap_or_default() }
    }

    /// Auto, against a default that paces by timer.
    fn auto_replaces_default(&self) -> bool {
        self.policy == Congestion::Auto && paces_by_timer(&self.default)
    }

    /// On a socket about to connect to a peer that is (`same_host`) or is
    /// not on this machine. Returns the algorithm set, if any.
    pub fn before_connect(&self, sock: impl AsFd, same_host: bool) -> io::Result<Option<String>> {
        match &self.policy {
            Congestion::Named(n) => set_first(sock.as_fd(), &[n]).map(Some),
            _ if same_host && self.auto_replaces_default() => set_first(sock.as_fd(), &UNPACED).map(Some),
            _ => Ok(None),
        }
    }

    /// On a listening socket: what its connections start with, chosen as
    /// for a peer on this machine ([`CongestionPlan::on_accepted`] gives
    /// the others the default back).
    pub fn on_listener(&self, sock: impl AsFd) -> io::Result<Option<String>> {
        self.before_connect(sock, true)
    }

    /// On a connection just accepted from a listener prepared with
    /// [`CongestionPlan::on_listener`]: one from another machine gets the
    /// system default back under Auto.
    pub fn on_accepted(&self, sock: impl AsFd, same_host: bool) -> io::Result<Option<String>> {
        if same_host || !self.auto_replaces_default() {
            return Ok(None);
        }
        set_first(sock.as_fd(), &[&self.default]).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, TcpStream};

    #[test]
    fn parse_and_print() {
        for s in ["auto", "system", "cubic", "bbr", "dctcp", "h-tcp"] {
            assert_eq!(s.parse::<Congestion>().unwrap().to_string(), s);
        }
        assert_eq!("cubic".parse(), Ok(Congestion::Named("cubic".into())));
        for bad in ["", "cu bic", "../x", "a_name_too_long_x"] {
            assert!(bad.parse::<Congestion>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn unpaced_replacements() {
        assert_eq!(unpaced_in_place_of("bbr", "reno bbr cubic"), Some("cubic"));
        assert_eq!(unpaced_in_place_of("bbr3", "reno bbr3"), Some("reno"), "reno when cubic is not built");
        assert_eq!(unpaced_in_place_of("cubic", "reno bbr cubic"), None, "an unpaced default is kept");
        assert_eq!(unpaced_in_place_of("dctcp", "reno dctcp"), None);
        assert_eq!(unpaced_in_place_of("bbr", "bbr"), None, "nothing to take");
    }

    #[test]
    fn same_host() {
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let a = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
        let b = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2));
        assert!(is_same_host(lo, None));
        assert!(is_same_host(a, Some(a)));
        assert!(!is_same_host(a, Some(b)));
        assert!(!is_same_host(a, None));
        assert!(paces_by_timer("bbr") && !paces_by_timer("cubic") && !paces_by_timer("reno"));
    }

    fn plan(policy: &str, default: &str) -> CongestionPlan {
        CongestionPlan { policy: policy.parse().unwrap(), default: default.into() }
    }

    /// On the real kernel (reno is always built in; bbr where the kernel
    /// has it or root can load it): what each policy leaves on the sockets.
    #[test]
    fn plans_on_real_sockets() {
        let sock = || std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        // system: nothing is touched.
        let s = sock();
        let before = congestion(&s).unwrap();
        assert_eq!(plan("system", "bbr").before_connect(&s, true).unwrap(), None);
        assert_eq!(plan("system", "bbr").on_listener(&s).unwrap(), None);
        assert_eq!(congestion(&s).unwrap(), before);
        // a name: set everywhere, or a clear error.
        let s = sock();
        assert_eq!(plan("reno", "bbr").before_connect(&s, false).unwrap().as_deref(), Some("reno"));
        assert_eq!(congestion(&s).unwrap(), "reno");
        let err = plan("no-such-cc", "cubic").on_listener(&s).unwrap_err();
        assert!(err.to_string().contains("no-such-cc"), "{err}");
        assert_eq!(congestion(&s).unwrap(), "reno", "a failed switch keeps the old one");
        // auto against an unpaced default: nothing.
        let s = sock();
        let before = congestion(&s).unwrap();
        assert_eq!(plan("auto", "cubic").on_listener(&s).unwrap(), None);
        assert_eq!(plan("auto", "cubic").before_connect(&s, true).unwrap(), None);
        assert_eq!(plan("auto", "cubic").on_accepted(&s, false).unwrap(), None);
        assert_eq!(congestion(&s).unwrap(), before);
        // auto against BBR: unpaced to this machine, BBR back for others.
        let auto = plan("auto", "bbr");
        let s = sock();
        assert_eq!(auto.before_connect(&s, false).unwrap(), None, "another host keeps the default");
        let to = auto.before_connect(&s, true).unwrap();
        assert!(matches!(to.as_deref(), Some("cubic" | "reno")), "{to:?}");
        let l = sock();
        let to = auto.on_listener(&l).unwrap().unwrap();
        assert_eq!(congestion(&l).unwrap(), to);
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (a, _) = l.accept().unwrap();
        assert_eq!(congestion(&a).unwrap(), to, "accepted connections inherit the listener's");
        assert_eq!(auto.on_accepted(&a, true).unwrap(), None);
        if set_congestion(&c, "bbr").is_ok() {
            assert_eq!(auto.on_accepted(&a, false).unwrap().as_deref(), Some("bbr"));
            assert_eq!(congestion(&a).unwrap(), "bbr");
        }
    }

    #[test]
    fn own_addresses() {
        assert!(is_own_address(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        assert!(is_own_address(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2))));
        // TEST-NET-1 (RFC 5737) is never assigned here.
        assert!(!is_own_address(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 77))));
        assert!(!system_default().unwrap().is_empty());
    }
}
