//! Network drivers: AF_PACKET sockets with batched receive/send, and TCP
//! helpers ([`tcp`]: the congestion-control algorithm of a connection).
//!
//! [`PacketSocket`] is a raw Ethernet socket bound to one interface and one
//! EtherType. Frames move in batches ([`FrameBatch`]) with one
//! `recvmmsg`/`sendmmsg` syscall per batch; several sockets may join a
//! fanout group so the kernel spreads received frames over worker threads.
//! The socket can be made non-blocking and wrapped in `tokio::io::unix::AsyncFd`.

pub mod packet;
pub mod tcp;

pub use packet::{have_raw_socket_permission, interface_info, FanoutMode, FrameBatch, InterfaceInfo, PacketSocket};
