//! The FUSE kernel wire format this file system speaks (linux/fuse.h, ABI
//! 7.42): the messages of the ops a one-file file system answers, and the
//! FUSE-over-io_uring ring entry layout. Everything else is ENOSYS.
//!
//! fuser (which mounts and answers INIT) keeps its own copy private, so the
//! request loop needs these; they are the kernel's layouts, checked against
//! the header sizes in the tests below.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Opcodes (enum fuse_opcode).
pub mod op {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const DESTROY: u32 = 38;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
    pub const RENAME2: u32 = 45;
    pub const TMPFILE: u32 = 51;
    pub const SYMLINK: u32 = 6;
}

/// FATTR_SIZE in fuse_setattr_in.valid.
pub const FATTR_SIZE: u32 = 1 << 3;
/// fuse_open_out.open_flags: several direct writes to the file at once.
pub const FOPEN_PARALLEL_DIRECT_WRITES: u32 = 1 << 6;
/// S_IFDIR / S_IFREG in fuse_attr.mode, DT_* in fuse_dirent.type.
pub const S_IFDIR: u32 = 0o040000;
pub const S_IFREG: u32 = 0o100000;
pub const DT_DIR: u32 = 4;
pub const DT_REG: u32 = 8;

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct InHeader {
    pub len: u32,
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    pub total_extlen: u16,
    pub padding: u16,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct OutHeader {
    pub len: u32,
    pub error: i32,
    pub unique: u64,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub atime: u64,
    pub mtime: u64,
    pub ctime: u64,
    pub atimensec: u32,
    pub mtimensec: u32,
    pub ctimensec: u32,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
    pub flags: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct EntryOut {
    pub nodeid: u64,
    pub generation: u64,
    pub entry_valid: u64,
    pub attr_valid: u64,
    pub entry_valid_nsec: u32,
    pub attr_valid_nsec: u32,
    pub attr: Attr,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct AttrOut {
    pub attr_valid: u64,
    pub attr_valid_nsec: u32,
    pub dummy: u32,
    pub attr: Attr,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct SetattrIn {
    pub valid: u32,
    pub padding: u32,
    pub fh: u64,
    pub size: u64,
    pub lock_owner: u64,
    pub atime: u64,
    pub mtime: u64,
    pub ctime: u64,
    pub atimensec: u32,
    pub mtimensec: u32,
    pub ctimensec: u32,
    pub mode: u32,
    pub unused4: u32,
    pub uid: u32,
    pub gid: u32,
    pub unused5: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct OpenIn {
    pub flags: u32,
    pub open_flags: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct OpenOut {
    pub fh: u64,
    pub open_flags: u32,
    pub backing_id: i32,
}

/// fuse_read_in; READDIR uses the same message.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct ReadIn {
    pub fh: u64,
    pub offset: u64,
    pub size: u32,
    pub read_flags: u32,
    pub lock_owner: u64,
    pub flags: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct WriteIn {
    pub fh: u64,
    pub offset: u64,
    pub size: u32,
    pub write_flags: u32,
    pub lock_owner: u64,
    pub flags: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct WriteOut {
    pub size: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct FallocateIn {
    pub fh: u64,
    pub offset: u64,
    pub length: u64,
    pub mode: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct StatfsOut {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
    pub padding: u32,
    pub spare: [u32; 6],
}

/// fuse_dirent without its name (which follows, padded to 8 bytes).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct Dirent {
    pub ino: u64,
    pub off: u64,
    pub namelen: u32,
    pub kind: u32,
}

/// The fixed part of each op's request: the bytes after the in header that
/// are not payload (a name, a write's data). With io_uring the kernel puts
/// exactly this part in `op_in` and the rest in the payload buffer.
pub fn op_header_len(opcode: u32) -> usize {
    use std::mem::size_of;
    match opcode {
        op::SETATTR => size_of::<SetattrIn>(),
        op::OPEN | op::OPENDIR => size_of::<OpenIn>(),
        op::READ | op::READDIR => size_of::<ReadIn>(),
        op::WRITE => size_of::<WriteIn>(),
        op::FALLOCATE => size_of::<FallocateIn>(),
        // fuse_getattr_in, fuse_release_in, fuse_fsync_in, fuse_flush_in:
        // nothing in them matters to a one-file file system.
        _ => 0,
    }
}

// ---- FUSE over io_uring (ABI 7.42) ----

/// Bytes reserved for the in/out header and for the op header in a ring
/// entry's header buffer.
pub const URING_IN_OUT_HEADER_SZ: usize = 128;
pub const URING_OP_IN_OUT_SZ: usize = 128;
/// io_uring command opcodes (enum fuse_uring_cmd).
pub const URING_CMD_REGISTER: u32 = 1;
pub const URING_CMD_COMMIT_AND_FETCH: u32 = 2;

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct UringEntInOut {
    pub flags: u64,
    /// The id to commit the reply under (the request's unique).
    pub commit_id: u64,
    /// Bytes in the payload buffer, in either direction.
    pub payload_sz: u32,
    pub padding: u32,
    pub reserved: u64,
}

/// Header buffer of one ring entry (iov[0] of a REGISTER).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct UringReqHeader {
    /// fuse_in_header when a request arrives, fuse_out_header for the reply.
    pub in_out: [u8; URING_IN_OUT_HEADER_SZ],
    /// The op header (see [`op_header_len`]).
    pub op_in: [u8; URING_OP_IN_OUT_SZ],
    pub ring_ent_in_out: UringEntInOut,
}

/// The command in the 80-byte area of an SQE128.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct UringCmdReq {
    pub flags: u64,
    pub commit_id: u64,
    pub qid: u16,
    pub padding: [u8; 6],
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::size_of;

    #[test]
    fn sizes_match_linux_fuse_h() {
        assert_eq!(size_of::<InHeader>(), 40);
        assert_eq!(size_of::<OutHeader>(), 16);
        assert_eq!(size_of::<Attr>(), 88);
        assert_eq!(size_of::<EntryOut>(), 128);
        assert_eq!(size_of::<AttrOut>(), 104);
        assert_eq!(size_of::<SetattrIn>(), 88);
        assert_eq!(size_of::<OpenOut>(), 16);
        assert_eq!(size_of::<ReadIn>(), 40);
        assert_eq!(size_of::<WriteIn>(), 40);
        assert_eq!(size_of::<FallocateIn>(), 32);
        assert_eq!(size_of::<StatfsOut>(), 80);
        assert_eq!(size_of::<Dirent>(), 24);
        assert_eq!(size_of::<UringEntInOut>(), 32);
        assert_eq!(size_of::<UringReqHeader>(), 288);
        assert_eq!(size_of::<UringCmdReq>(), 24);
    }
}
