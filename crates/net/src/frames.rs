//! The datapath of a raw-frame protocol (AoE): AF_XDP sockets where they
//! work, AF_PACKET sockets otherwise (plain, or with PACKET_MMAP rings when
//! asked for), behind one type.

use crate::packet::{FrameBatch, InterfaceInfo, PacketSocket};
use crate::ring::RingSocket;
use crate::xdp::{self, XdpFilter, XdpSocket};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

/// Which sockets move the frames. In configuration files and on the
/// command line: "auto", "xdp", "mmap" or "packet".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Datapath {
    /// AF_XDP if it can be set up on the interface, else AF_PACKET. The
    /// default: AoE's XDP program takes only the frames of the shelf.slot
    /// pairs this process serves or talks to and passes the rest, broadcast
    /// queries included, so vblade or another blockwire on the interface
    /// keeps seeing its own (a second program cannot attach there: that
    /// process falls back to AF_PACKET).
    #[default]
    Auto,
    /// AF_XDP or fail.
    Xdp,
    /// AF_PACKET with PACKET_MMAP rings (TPACKET_V2 receive and transmit
    /// rings, qdisc bypassed): frames read and built in the rings, one
    /// syscall per batch sent. Sees every frame of the EtherType, as plain
    /// AF_PACKET does. On veth its frame-pair ceiling measured above
    /// AF_XDP's copy mode (docs/notes/2026-11-24-aoe-ceiling.md).
    Mmap,
    /// AF_PACKET.
    Packet,
}

impl std::str::FromStr for Datapath {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Datapath::Auto),
            "xdp" => Ok(Datapath::Xdp),
            "mmap" => Ok(Datapath::Mmap),
            "packet" => Ok(Datapath::Packet),
            _ => Err(format!("{s:?}: expected auto, xdp, mmap or packet")),
        }
    }
}

impl std::fmt::Display for Datapath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Datapath::Auto => "auto",
            Datapath::Xdp => "xdp",
            Datapath::Mmap => "mmap",
            Datapath::Packet => "packet",
        })
    }
}

/// What [`choose`] settled on.
pub enum Chosen {
    /// AF_XDP: one socket per receive queue, the program attached.
    Xdp(Vec<XdpSocket>),
    /// AF_PACKET, for the caller to open as it needs; `why`: the reason
    /// AF_XDP was not used when `auto` asked for it.
    Packet { why: Option<String> },
    /// AF_PACKET with rings ([`RingSocket`]), for the caller to open.
    Mmap,
}

/// Set up AF_XDP on `iface` for frames of `ethertype` passing `filter` if
/// `want` asks for it; `auto` falls back to AF_PACKET, saying why.
pub fn choose(iface: &str, ethertype: u16, want: Datapath, filter: XdpFilter) -> io::Result<Chosen> {
    match want {
        Datapath::Packet => Ok(Chosen::Packet { why: None }),
        Datapath::Mmap => Ok(Chosen::Mmap),
        Datapath::Xdp => xdp::open(iface, ethertype, filter).map(Chosen::Xdp),
        Datapath::Auto => Ok(match xdp::open(iface, ethertype, filter) {
            Ok(s) => Chosen::Xdp(s),
            Err(e) => Chosen::Packet { why: Some(e.to_string()) },
        }),
    }
}

/// A socket of any kind, with the [`PacketSocket`] methods the
/// protocols use.
#[derive(Debug)]
pub enum FrameSocket {
    Packet(PacketSocket),
    Mmap(Box<RingSocket>),
    Xdp(Box<XdpSocket>),
}

macro_rules! both {
    ($self:ident, $s:ident => $e:expr) => {
        match $self {
            FrameSocket::Packet($s) => $e,
            FrameSocket::Mmap($s) => $e,
            FrameSocket::Xdp($s) => $e,
        }
    };
}

impl FrameSocket {
    /// "xdp", "mmap" or "packet", as [`Datapath`] spells them.
    pub fn datapath(&self) -> Datapath {
        match self {
            FrameSocket::Packet(_) => Datapath::Packet,
            FrameSocket::Mmap(_) => Datapath::Mmap,
            FrameSocket::Xdp(_) => Datapath::Xdp,
        }
    }
    /// For logs: the socket family and, for AF_XDP, its modes.
    pub fn describe(&self) -> String {
        match self {
            FrameSocket::Packet(_) => "AF_PACKET".into(),
            FrameSocket::Mmap(_) => "AF_PACKET with PACKET_MMAP rings (TPACKET_V2, qdisc bypass)".into(),
            FrameSocket::Xdp(s) => format!(
                "AF_XDP ({}, {} XDP)",
                if s.zero_copy() { "zero-copy" } else { "copy mode" },
                if s.native() { "native" } else { "generic" }
            ),
        }
    }
    pub fn info(&self) -> &InterfaceInfo {
        both!(self, s => s.info())
    }
    pub fn mac(&self) -> [u8; 6] {
        both!(self, s => s.mac())
    }
    pub fn mtu(&self) -> usize {
        both!(self, s => s.mtu())
    }
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        both!(self, s => s.set_nonblocking(on))
    }
    pub fn set_recv_timeout(&self, t: Duration) -> io::Result<()> {
        both!(self, s => s.set_recv_timeout(t))
    }
    pub fn take_statistics(&self) -> io::Result<(u64, u64)> {
        both!(self, s => s.take_statistics())
    }
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        both!(self, s => s.send(frame))
    }
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        both!(self, s => s.recv(buf))
    }
    pub fn recv_batch(&self, batch: &mut FrameBatch) -> io::Result<usize> {
        both!(self, s => s.recv_batch(batch))
    }
    pub fn send_batch(&self, batch: &mut FrameBatch, count: usize) -> io::Result<usize> {
        both!(self, s => s.send_batch(batch, count))
    }
    /// Build frames and send them: `build` writes one into the buffer it
    /// gets and returns its length, or None when there are no more. AF_XDP
    /// and the rings build them straight in their transmit slots (buffers
    /// of the MTU plus 18 bytes, or more); AF_PACKET in the slots of
    /// `batch`, sent whenever it is full and at the end. Returns how many
    /// were sent.
    pub fn send_built(&self, batch: &mut FrameBatch, mut build: impl FnMut(&mut [u8]) -> Option<usize>) -> io::Result<usize> {
        let s = match self {
            FrameSocket::Xdp(s) => return s.send_built(build),
            FrameSocket::Mmap(s) => return s.send_built(build),
            FrameSocket::Packet(s) => s,
        };
        let mut sent = 0;
        loop {
            let mut n = 0;
            let mut more = true;
            while more && n < batch.capacity() {
                match build(batch.slot_mut(n)) {
                    Some(len) => {
                        batch.set_len(n, len);
                        n += 1;
                    }
                    None => more = false,
                }
            }
            if n > 0 {
                sent += s.send_batch(batch, n)?;
            }
            if !more {
                return Ok(sent);
            }
        }
    }
}

impl AsRawFd for FrameSocket {
    fn as_raw_fd(&self) -> RawFd {
        both!(self, s => s.as_raw_fd())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datapath_names_round_trip() {
        for d in [Datapath::Auto, Datapath::Xdp, Datapath::Mmap, Datapath::Packet] {
            assert_eq!(d.to_string().parse::<Datapath>(), Ok(d));
        }
        assert!("af_xdp".parse::<Datapath>().is_err());
    }
}
