//! One rtnetlink question the BPF datapath asks about a port: is it a veth
//! whose other end lives in another network namespace? (Then frames can go
//! straight into that end's ingress with `bpf_redirect_peer`.) Asked with
//! RTM_GETLINK on a NETLINK_ROUTE socket of the caller's namespace; sysfs
//! would answer for the namespace /sys was mounted in, not the thread's.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_LINK_NETNSID: u16 = 37;
const NLMSG_HDR: usize = 16;
const IFINFOMSG: usize = 16;

/// What the kernel says about one interface.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LinkFacts {
    /// `veth`, `vxlan`, ... (`None` for plain devices such as a NIC).
    pub kind: Option<String>,
    /// The link's other end is in another namespace (IFLA_LINK_NETNSID).
    pub peer_in_other_netns: bool,
}

impl LinkFacts {
    pub fn veth_to_other_netns(&self) -> bool {
        self.kind.as_deref() == Some("veth") && self.peer_in_other_netns
    }
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Route attributes in `b`: (type without the nested/byte-order bits, payload).
fn attrs(mut b: &[u8]) -> Vec<(u16, &[u8])> {
    let mut v = vec![];
    while b.len() >= 4 {
        let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
        let ty = u16::from_ne_bytes([b[2], b[3]]) & 0x3fff;
        if len < 4 || len > b.len() {
            break;
        }
        v.push((ty, &b[4..len]));
        b = &b[align4(len).min(b.len())..];
    }
    v
}

/// Parse an RTM_NEWLINK message body (after the netlink header).
pub fn parse_newlink(body: &[u8]) -> LinkFacts {
    let mut f = LinkFacts::default();
    let Some(rest) = body.get(IFINFOMSG..) else {
        return f;
    };
    for (ty, val) in attrs(rest) {
        match ty {
            IFLA_LINK_NETNSID => f.peer_in_other_netns = true,
            IFLA_LINKINFO => {
                for (t, v) in attrs(val) {
                    if t == IFLA_INFO_KIND {
                        let s = v.split(|c| *c == 0).next().unwrap_or(&[]);
                        f.kind = Some(String::from_utf8_lossy(s).into_owned());
                    }
                }
            }
            _ => {}
        }
    }
    f
}

/// Ask the kernel about interface `ifindex` in the current namespace.
pub fn link_facts(ifindex: u32) -> io::Result<LinkFacts> {
    // SAFETY: plain socket creation; the fd is owned right below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut req = [0u8; NLMSG_HDR + IFINFOMSG];
    let len = req.len() as u32;
    req[0..4].copy_from_slice(&len.to_ne_bytes());
    req[4..6].copy_from_slice(&RTM_GETLINK.to_ne_bytes());
    req[6..8].copy_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    req[8..12].copy_from_slice(&1u32.to_ne_bytes());
    // ifinfomsg: family AF_UNSPEC, index.
    req[NLMSG_HDR + 4..NLMSG_HDR + 8].copy_from_slice(&(ifindex as i32).to_ne_bytes());
    // SAFETY: sending our own buffer on our socket (to the kernel: a zeroed
    // sockaddr_nl with family AF_NETLINK).
    let sent = unsafe {
        let mut sa: libc::sockaddr_nl = std::mem::zeroed();
        sa.nl_family = libc::AF_NETLINK as u16;
        libc::sendto(
            fd.as_raw_fd(),
            req.as_ptr().cast(),
            req.len(),
            0,
            (&sa as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = vec![0u8; 32 * 1024];
    // SAFETY: receiving into our own buffer.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let msg = &buf[..n as usize];
    if msg.len() < NLMSG_HDR {
        return Err(io::Error::other("short netlink answer"));
    }
    let len = (u32::from_ne_bytes([msg[0], msg[1], msg[2], msg[3]]) as usize).min(msg.len());
    match u16::from_ne_bytes([msg[4], msg[5]]) {
        RTM_NEWLINK => Ok(parse_newlink(&msg[NLMSG_HDR..len])),
        NLMSG_ERROR if msg.len() >= NLMSG_HDR + 4 => {
            let e = i32::from_ne_bytes([msg[16], msg[17], msg[18], msg[19]]);
            Err(io::Error::from_raw_os_error(-e))
        }
        t => Err(io::Error::other(format!("unexpected netlink message {t}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(ty: u16, val: &[u8]) -> Vec<u8> {
        let mut v = ((4 + val.len()) as u16).to_ne_bytes().to_vec();
        v.extend_from_slice(&ty.to_ne_bytes());
        v.extend_from_slice(val);
        v.resize(align4(v.len()), 0);
        v
    }

    #[test]
    fn veth_with_a_peer_elsewhere() {
        let mut body = vec![0u8; IFINFOMSG];
        body.extend(attr(3, b"core\0"));
        body.extend(attr(
            IFLA_LINKINFO | 0x8000,
            &attr(IFLA_INFO_KIND, b"veth\0"),
        ));
        body.extend(attr(IFLA_LINK_NETNSID, &0i32.to_ne_bytes()));
        let f = parse_newlink(&body);
        assert_eq!(f.kind.as_deref(), Some("veth"));
        assert!(f.veth_to_other_netns());
        // Same namespace: no netnsid attribute.
        let mut body = vec![0u8; IFINFOMSG];
        body.extend(attr(IFLA_LINKINFO, &attr(IFLA_INFO_KIND, b"veth\0")));
        assert!(!parse_newlink(&body).veth_to_other_netns());
        // Truncated and garbage input: no panic, nothing claimed.
        assert_eq!(parse_newlink(&[1, 2, 3]), LinkFacts::default());
        assert_eq!(parse_newlink(&[0u8; IFINFOMSG + 3]), LinkFacts::default());
    }

    #[test]
    fn loopback_is_not_a_veth() {
        // Every namespace has lo at index 1.
        let f = link_facts(1).expect("RTM_GETLINK lo");
        assert!(!f.veth_to_other_netns(), "{f:?}");
    }
}
