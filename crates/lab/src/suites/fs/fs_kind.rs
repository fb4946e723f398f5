//! The file-system factor of the fs suite (`--fs`, `--fsync`): which file
//! system each subject's volume gets, with which options, and whether the
//! workload's fsyncs reach it.

/// ext4 mount options for every subject: no background zeroing of inode
/// tables (mkfs leaves them to the kernel's lazyinit thread, which would
/// write to the volume during the measurements).
pub const EXT4_OPTIONS: &str = "noinit_itable";

/// `--fs` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FsKind {
    /// mkfs.ext4's defaults (mounted `noinit_itable`, see
    /// [`EXT4_OPTIONS`]): the lab's default.
    #[default]
    Ext4,
    /// ext4 as one would set it up for a workload (none of these risk data):
    /// inode tables and journal zeroed at mkfs (`lazy_itable_init=0`,
    /// `lazy_journal_init=0`) instead of by a kernel thread writing during
    /// the measurements; a journal of an eighth of the volume (at most 1 GiB)
    /// so metadata-heavy runs checkpoint less often; `noatime`, so reads
    /// write no inode updates.
    Ext4Tuned,
    /// mkfs.xfs's defaults.
    Xfs,
    /// btrfs: copy-on-write, checksummed data and metadata; the labelled
    /// stand-in for ZFS on a kernel without ZFS.
    Btrfs,
    /// btrfs mounted `nodatacow`: data overwritten in place (and so without
    /// data checksums), metadata still copy-on-write.
    BtrfsNodatacow,
}

pub const ALL: [FsKind; 5] = [FsKind::Ext4, FsKind::Ext4Tuned, FsKind::Xfs, FsKind::Btrfs, FsKind::BtrfsNodatacow];

impl FsKind {
    pub fn name(self) -> &'static str {
        match self {
            FsKind::Ext4 => "ext4",
            FsKind::Ext4Tuned => "ext4-tuned",
            FsKind::Xfs => "xfs",
            FsKind::Btrfs => "btrfs",
            FsKind::BtrfsNodatacow => "btrfs-nodatacow",
        }
    }

    /// The name a sample's factors record (empty: ext4, the default).
    pub fn factor(self) -> &'static str {
        if self == FsKind::Ext4 { "" } else { self.name() }
    }

    pub fn parse(s: &str) -> anyhow::Result<FsKind> {
        ALL.into_iter().find(|k| k.name() == s.trim()).ok_or_else(|| {
            anyhow::anyhow!("--fs {s:?}: expected one of {:?} (zfs needs a host with zfs and a pool: not on this machine)", ALL.map(|k| k.name()))
        })
    }

    /// The `blockwire mount --mkfs` type.
    pub fn mkfs_type(self) -> &'static str {
        match self {
            FsKind::Ext4 | FsKind::Ext4Tuned => "ext4",
            FsKind::Xfs => "xfs",
            FsKind::Btrfs | FsKind::BtrfsNodatacow => "btrfs",
        }
    }

    /// Options for mkfs beyond the type's own quiet/force flags, for a
    /// volume of `size` bytes.
    pub fn mkfs_options(self, size: u64) -> Vec<String> {
        match self {
            FsKind::Ext4Tuned => {
                let journal_mib = (size >> 20) / 8;
                vec!["-E".into(), "lazy_itable_init=0,lazy_journal_init=0".into(), "-J".into(), format!("size={}", journal_mib.clamp(4, 1024))]
            }
            _ => vec![],
        }
    }

    /// mkfs arguments (before the image's path) for a file server's export
    /// image holding a volume of `size` bytes: quiet, forced, without
    /// discard (nothing to discard in a new sparse file).
    pub fn image_mkfs_args(self, size: u64) -> Vec<String> {
        let mut a: Vec<String> = vec!["-q".into()];
        let extra = self.mkfs_options(size);
        match self.mkfs_type() {
            "ext4" => {
                a.push("-F".into());
                if extra.is_empty() {
                    a.extend(["-E".into(), "nodiscard".into()]);
                }
            }
            _ => a.extend(["-f".into(), "-K".into()]),
        }
        a.extend(extra);
        a
    }

    /// mount(8) options.
    pub fn mount_options(self) -> &'static str {
        match self {
            FsKind::Ext4 => EXT4_OPTIONS,
            FsKind::Ext4Tuned => "noatime,noinit_itable",
            FsKind::Xfs | FsKind::Btrfs => "defaults",
            FsKind::BtrfsNodatacow => "nodatacow",
        }
    }

    /// The program that makes it (for preflight).
    pub fn mkfs_program(self) -> &'static str {
        match self.mkfs_type() {
            "ext4" => "mkfs.ext4",
            "xfs" => "mkfs.xfs",
            _ => "mkfs.btrfs",
        }
    }

    /// The smallest volume it is measured on: mkfs.xfs refuses below 300
    /// MiB; btrfs keeps metadata twice, so below 256 MiB the IOgen file (up
    /// to half the volume) does not fit.
    pub fn min_size(self) -> u64 {
        match self.mkfs_type() {
            "btrfs" => 256 << 20,
            "xfs" => 300 << 20,
            _ => 8 << 20,
        }
    }
}

/// `--fsync` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fsync {
    #[default]
    Honour,
    /// fsync, fdatasync, sync, msync and O_SYNC/O_DSYNC made no-ops for the
    /// workload with eatmydata (an LD_PRELOAD library, so it reaches the
    /// workload programs: fio, PostMark, Bonnie++ and `blockwire flowop`
    /// alike): the analogue of ZFS `sync=disabled`. Data a crash would lose
    /// is not measured: the file system still writes back in the end.
    Ignore,
}

impl Fsync {
    pub fn name(self) -> &'static str {
        match self {
            Fsync::Honour => "honour",
            Fsync::Ignore => "ignore",
        }
    }

    pub fn factor(self) -> &'static str {
        if self == Fsync::Honour { "" } else { self.name() }
    }

    pub fn parse(s: &str) -> anyhow::Result<Fsync> {
        [Fsync::Honour, Fsync::Ignore].into_iter().find(|f| f.name() == s.trim()).ok_or_else(|| anyhow::anyhow!("--fsync {s:?}: expected honour or ignore"))
    }

    /// The program the workload runs under, if any.
    pub fn wrapper(self) -> Option<&'static str> {
        match self {
            Fsync::Honour => None,
            Fsync::Ignore => Some("eatmydata"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_options_and_sizes() {
        for k in ALL {
            assert_eq!(FsKind::parse(k.name()).unwrap(), k);
        }
        assert!(FsKind::parse("zfs").unwrap_err().to_string().contains("zfs needs a host"));
        assert_eq!(FsKind::Ext4.factor(), "");
        // A 1 GiB volume: a 128 MiB journal; a small one, at least 4 MiB.
        assert_eq!(FsKind::Ext4Tuned.mkfs_options(1 << 30)[3], "size=128");
        assert_eq!(FsKind::Ext4Tuned.mkfs_options(16 << 20)[3], "size=4");
        assert_eq!(FsKind::BtrfsNodatacow.mkfs_type(), "btrfs");
        assert_eq!(FsKind::BtrfsNodatacow.mount_options(), "nodatacow");
        assert_eq!(Fsync::parse("ignore").unwrap().wrapper(), Some("eatmydata"));
        assert!(Fsync::parse("sometimes").is_err());
    }
}
