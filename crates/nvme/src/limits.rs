//! What a controller of this target lets a host do: queue sizes, I/O
//! queues, in-capsule data and the largest transfer. Identify reports
//! them, Connect and every command's checks enforce them, and the queues
//! of both transports size their buffers by them.

/// Maximum queue entries (CAP.MQES + 1) and MAXCMD.
pub const MAX_QUEUE_ENTRIES: u16 = 1024;
/// I/O queues one controller may have.
pub const MAX_IO_QUEUES: u16 = 64;
/// In-capsule data the target accepts on I/O queues, bytes.
pub const INCAPSULE_DATA: u32 = 16384;
/// MDTS: 2^8 pages of 4 KiB = 1 MiB per command.
pub const MDTS: u8 = 8;
/// Largest data transfer of one command in bytes (MDTS in bytes).
pub const MAX_TRANSFER: u32 = 4096 << MDTS;
