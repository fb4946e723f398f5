//! Network drivers: AF_PACKET and AF_XDP sockets with batched receive/send,
//! and TCP helpers ([`tcp`]: the congestion-control algorithm of a connection;
//! [`tcp_read`]: a read of a tokio socket that keeps its readiness right).
//!
//! [`PacketSocket`] is a raw Ethernet socket bound to one interface and one
//! EtherType. Frames move in batches ([`FrameBatch`]) with one
//! `recvmmsg`/`sendmmsg` syscall per batch; several sockets may join a
//! fanout group so the kernel spreads received frames over worker threads.
//! The socket can be made non-blocking and wrapped in `tokio::io::unix::AsyncFd`.
//!
//! [`xdp::XdpSocket`] moves the same batches through AF_XDP rings, one
//! socket per receive queue, with an XDP program steering the EtherType's
//! frames to it; [`frames`] picks one kind or the other ([`Datapath`]) and
//! wraps both in [`FrameSocket`].

pub mod frames;
pub mod packet;
pub mod ring;
pub mod tcp;
pub mod tcp_read;
pub mod xdp;

pub use frames::{Datapath, FrameSocket};
pub use packet::{have_raw_socket_permission, interface_info, FanoutMode, FrameBatch, InterfaceInfo, PacketSocket};
pub use ring::RingSocket;
pub use xdp::{XdpFilter, XdpKeys, XdpSocket};
