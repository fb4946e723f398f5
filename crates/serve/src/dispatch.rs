//! Where a TCP front-end (iSCSI, NVMe/TCP) runs a command: one rule for
//! both. The protocol crate says what the command does ([`Work`]: the SCSI
//! command table's `execution`, NVMe's `sleeps` and FUA); the volume says
//! what its I/O costs ([`bw_block::DeviceInfo`]); this decides.
//!
//! - Commands that never wait for a device run on the connection's task.
//! - Commands that may wait whatever backs them (flushes, FUA writes,
//!   verifies, unmaps) run on the blocking pool.
//! - Reads and writes go to a volume that completes requests on its own
//!   threads (rbd: `async_submit`) as submitted requests; on a volume whose
//!   I/O may wait for a device (`io_may_block`: O_DIRECT, O_DSYNC, block
//!   devices) or the network (`remote`) to the pool; otherwise they are a
//!   copy to or from the page cache and run on the task, unless they copy
//!   more than the front-end's `inline_max` (reads sent with sendfile copy
//!   nothing).

use bw_block::DeviceInfo;

/// What the protocol says about a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// Never waits for a device (state, identification, or a command that
    /// fails its checks at once).
    Instant,
    /// Moves `len` bytes to or from the volume; `zero_copy`: a read the
    /// front-end sends from the page cache with sendfile (see
    /// [`zero_copy`]).
    Data { len: usize, zero_copy: bool },
    /// May wait for the device whatever backs the volume.
    Waits,
}

/// Where the command runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// On the connection's task.
    Inline,
    /// As a request submitted to the volume, completed by its threads
    /// (a command that is not a plain read or write runs on the pool).
    Submit,
    /// On the blocking pool; the result comes back over a channel.
    Pool,
}

/// The rule (see the module comment). `device`: what backs the command's
/// volume (`None`: no such LUN or namespace, the command fails at once);
/// `limited`: the volume has QoS limits (`bw_block::Volume::limited`),
/// whose reads and writes are submitted: the volume holds them back on
/// its timer, never on the connection's task.
pub fn place(work: Work, device: Option<&DeviceInfo>, limited: bool, inline_max: usize) -> Place {
    match work {
        Work::Instant => Place::Inline,
        Work::Waits => Place::Pool,
        Work::Data { len, zero_copy } => match device {
            None => Place::Inline,
            Some(d) if d.async_submit || limited => Place::Submit,
            Some(d) if d.io_may_block() || d.remote => Place::Pool,
            Some(_) if !zero_copy && len > inline_max => Place::Pool,
            Some(_) => Place::Inline,
        },
    }
}

/// Whether a read of `len` bytes is sent with sendfile from the page cache:
/// at least `zero_copy_min` bytes (`[tuning] zero_copy_min`; shorter ones
/// are cheaper to copy, and many share one socket write), no data digest
/// to compute over the bytes, and a volume whose reads never wait for a
/// device (only those hand out a descriptor).
pub fn zero_copy(
    len: usize,
    zero_copy_min: usize,
    data_digest: bool,
    device: Option<&DeviceInfo>,
) -> bool {
    !data_digest && len >= zero_copy_min && device.is_some_and(|d| d.memory_backed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bw_block::{BackendSpec, Volume};

    #[test]
    fn the_rule() {
        let ram = Volume::open("r", &BackendSpec::ram(1 << 20)).unwrap();
        let ram = ram.info();
        let mut direct = ram.clone();
        direct.direct = true;
        direct.memory_backed = false;
        let mut remote = ram.clone();
        remote.remote = true;
        let mut submit = remote.clone();
        submit.async_submit = true;
        let data = |len| Work::Data {
            len,
            zero_copy: false,
        };
        assert_eq!(place(Work::Instant, Some(&direct), false, 0), Place::Inline);
        assert_eq!(place(Work::Waits, Some(ram), false, usize::MAX), Place::Pool);
        assert_eq!(place(data(4096), Some(ram), false, 65536), Place::Inline);
        assert_eq!(place(data(1 << 20), Some(ram), false, 65536), Place::Pool);
        assert_eq!(
            place(
                Work::Data {
                    len: 1 << 20,
                    zero_copy: true
                },
                Some(ram),
                false,
                65536
            ),
            Place::Inline
        );
        // A limited volume's reads and writes, zero-copy or not.
        assert_eq!(place(data(4096), Some(ram), true, 65536), Place::Submit);
        assert_eq!(place(Work::Data { len: 1 << 20, zero_copy: true }, Some(ram), true, 65536), Place::Submit);
        assert_eq!(place(Work::Waits, Some(ram), true, 65536), Place::Pool);
        // The block crate's io_may_block is honoured by every front-end.
        assert_eq!(place(data(4096), Some(&direct), false, 65536), Place::Pool);
        assert_eq!(place(data(4096), Some(&remote), false, 65536), Place::Pool);
        assert_eq!(place(data(4096), Some(&submit), false, 65536), Place::Submit);
        assert_eq!(place(data(4096), None, false, 0), Place::Inline);
        assert!(zero_copy(32768, 32768, false, Some(ram)));
        assert!(!zero_copy(32768, 32768, true, Some(ram)));
        assert!(!zero_copy(4096, 32768, false, Some(ram)));
        assert!(!zero_copy(32768, 32768, false, Some(&direct)));
    }
}
