//! The file system itself, without any I/O: a root directory holding one
//! regular file whose bytes are the remote volume. A request goes in (the
//! same parsed form whichever transport brought it), a [`Step`] comes out:
//! an answer to send now, or volume I/O to run first (see `disk.rs`).

use crate::abi::{self, op, InHeader};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use zerocopy::{FromBytes, IntoBytes};

pub const ROOT: u64 = 1;
pub const DISK: u64 = 2;
/// Attributes never change behind the kernel's back, so it may cache them.
const TTL: Duration = Duration::from_secs(3600);
/// Largest READ/WRITE the kernel may send (FUSE_MAX_PAGES lets it exceed 128 KiB).
pub const MAX_REQUEST: u32 = 1 << 20;

/// One request as the kernel sent it: the in header, the op's fixed header
/// and what follows it (a name, a write's data).
#[derive(Debug)]
pub struct Request<'a> {
    pub header: InHeader,
    pub op: &'a [u8],
    pub payload: &'a [u8],
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseError {
    #[error("request of {0} bytes is shorter than its header")]
    Short(usize),
    #[error("request says {said} bytes, {got} arrived")]
    Length { said: u32, got: usize },
}

impl<'a> Request<'a> {
    /// A request read from /dev/fuse: in header, op header, payload, back to back.
    pub fn parse(buf: &'a [u8]) -> Result<Request<'a>, ParseError> {
        let (header, rest) =
            InHeader::read_from_prefix(buf).map_err(|_| ParseError::Short(buf.len()))?;
        if header.len as usize != buf.len() {
            return Err(ParseError::Length {
                said: header.len,
                got: buf.len(),
            });
        }
        let n = abi::op_header_len(header.opcode).min(rest.len());
        Ok(Request {
            header,
            op: &rest[..n],
            payload: &rest[n..],
        })
    }

    /// A request delivered into a ring entry: the in header and op header in
    /// the header buffer, the payload in the payload buffer.
    pub fn from_ring(
        h: &'a abi::UringReqHeader,
        payload: &'a [u8],
    ) -> Result<Request<'a>, ParseError> {
        let (header, _) =
            InHeader::read_from_prefix(&h.in_out[..]).map_err(|_| ParseError::Short(0))?;
        let n = abi::op_header_len(header.opcode);
        Ok(Request {
            header,
            op: &h.op_in[..n],
            payload,
        })
    }
}

/// Volume I/O a request needs before it can be answered.
#[derive(Debug, PartialEq, Eq)]
pub enum Io<'a> {
    /// Answer with exactly `len` bytes read at `offset` (already clamped to the volume).
    Read { offset: u64, len: usize },
    /// Answer with fuse_write_out { size: data.len() }.
    Write { offset: u64, data: &'a [u8] },
    /// fsync/fdatasync: the protocol's flush.
    Flush,
    /// Punch a hole: whole blocks `[offset, offset+len)`.
    Discard { offset: u64, len: u64 },
}

#[derive(Debug, PartialEq, Eq)]
pub enum Step<'a> {
    /// Answer now: `error` is 0 or a positive errno; `body` follows the out header.
    Reply {
        error: i32,
        body: Vec<u8>,
    },
    Io(Io<'a>),
    /// Nothing to answer (FORGET, INTERRUPT).
    Silent,
    /// Answer with success, then stop serving (DESTROY).
    Destroy,
}

fn ok(body: Vec<u8>) -> Step<'static> {
    Step::Reply { error: 0, body }
}

fn err(errno: i32) -> Step<'static> {
    Step::Reply {
        error: errno,
        body: Vec::new(),
    }
}

/// The one-file file system.
#[derive(Debug, Clone)]
pub struct VolumeFs {
    pub name: String,
    pub readonly: bool,
    pub size: u64,
    pub block: u64,
    pub started: SystemTime,
}

impl VolumeFs {
    pub fn new(name: String, readonly: bool, size: u64, block: u64) -> VolumeFs {
        VolumeFs {
            name,
            readonly,
            size,
            block,
            started: SystemTime::now(),
        }
    }

    fn attr(&self, ino: u64) -> abi::Attr {
        let t = self.started.duration_since(UNIX_EPOCH).unwrap_or_default();
        let (mode, size, nlink) = if ino == ROOT {
            (abi::S_IFDIR | 0o755, 0, 2)
        } else {
            (
                abi::S_IFREG | if self.readonly { 0o400 } else { 0o600 },
                self.size,
                1,
            )
        };
        abi::Attr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: t.as_secs(),
            mtime: t.as_secs(),
            ctime: t.as_secs(),
            atimensec: t.subsec_nanos(),
            mtimensec: t.subsec_nanos(),
            ctimensec: t.subsec_nanos(),
            mode,
            nlink,
            blksize: self.block.max(4096) as u32,
            ..Default::default()
        }
    }

    fn attr_out(&self, ino: u64) -> Step<'static> {
        let out = abi::AttrOut {
            attr_valid: TTL.as_secs(),
            attr: self.attr(ino),
            ..Default::default()
        };
        ok(out.as_bytes().to_vec())
    }

    /// What to do with one request.
    pub fn handle<'a>(&self, req: &Request<'a>) -> Step<'a> {
        let ino = req.header.nodeid;
        match req.header.opcode {
            op::LOOKUP => self.lookup(ino, req.payload),
            op::FORGET | op::BATCH_FORGET | op::INTERRUPT => Step::Silent,
            op::GETATTR if ino == ROOT || ino == DISK => self.attr_out(ino),
            op::GETATTR => err(libc::ENOENT),
            op::SETATTR => self.setattr(ino, req.op),
            op::OPEN => self.open(ino, req.op),
            op::READ => self.read(ino, req.op),
            op::WRITE => self.write(ino, req.op, req.payload),
            op::STATFS => self.statfs(),
            // close(): nothing is buffered here; durability is fsync's job.
            op::RELEASE | op::RELEASEDIR | op::FLUSH | op::FSYNCDIR => ok(Vec::new()),
            op::FSYNC => Step::Io(Io::Flush),
            op::OPENDIR if ino == ROOT => ok(abi::OpenOut::default().as_bytes().to_vec()),
            op::OPENDIR => err(libc::ENOTDIR),
            op::READDIR => {
                let Ok(r) = abi::ReadIn::read_from_bytes(req.op) else {
                    return err(libc::EINVAL);
                };
                if ino != ROOT {
                    return err(libc::ENOTDIR);
                }
                ok(self.readdir(r.offset, r.size as usize))
            }
            op::FALLOCATE => {
                let Ok(f) = abi::FallocateIn::read_from_bytes(req.op) else {
                    return err(libc::EINVAL);
                };
                self.fallocate(f.offset, f.length, f.mode as i32)
            }
            // The directory holds exactly one file.
            op::MKNOD
            | op::MKDIR
            | op::UNLINK
            | op::RMDIR
            | op::RENAME
            | op::LINK
            | op::SYMLINK
            | op::CREATE
            | op::RENAME2
            | op::TMPFILE
            | op::SETXATTR
            | op::REMOVEXATTR => err(libc::EPERM),
            op::DESTROY => Step::Destroy,
            // INIT is answered by fuser before the request loop starts; any
            // other op (xattrs, locks, lseek, statx, ...) the kernel then
            // handles itself or reports as unsupported.
            _ => err(libc::ENOSYS),
        }
    }

    /// LOOKUP of `payload`'s name in directory `ino`: only the one file.
    fn lookup(&self, ino: u64, payload: &[u8]) -> Step<'static> {
        // The name is NUL-terminated.
        let name = payload.split(|&b| b == 0).next().unwrap_or_default();
        if ino == ROOT && name == self.name.as_bytes() {
            let out = abi::EntryOut {
                nodeid: DISK,
                entry_valid: TTL.as_secs(),
                attr_valid: TTL.as_secs(),
                attr: self.attr(DISK),
                ..Default::default()
            };
            ok(out.as_bytes().to_vec())
        } else {
            err(libc::ENOENT)
        }
    }

    fn setattr(&self, ino: u64, op_in: &[u8]) -> Step<'static> {
        let Ok(s) = abi::SetattrIn::read_from_bytes(op_in) else {
            return err(libc::EINVAL);
        };
        // The volume's size is the target's: O_TRUNC or ftruncate to
        // another size would silently not happen, so refuse them.
        // Times and modes are accepted and forgotten.
        if ino == DISK && s.valid & abi::FATTR_SIZE != 0 && s.size != self.size {
            err(libc::EPERM)
        } else if ino == ROOT || ino == DISK {
            self.attr_out(ino)
        } else {
            err(libc::ENOENT)
        }
    }

    fn open(&self, ino: u64, op_in: &[u8]) -> Step<'static> {
        let Ok(o) = abi::OpenIn::read_from_bytes(op_in) else {
            return err(libc::EINVAL);
        };
        if ino != DISK {
            return err(libc::EISDIR);
        }
        if self.readonly && (o.flags as i32 & libc::O_ACCMODE) != libc::O_RDONLY {
            return err(libc::EROFS);
        }
        let out = abi::OpenOut {
            fh: 0,
            open_flags: abi::FOPEN_PARALLEL_DIRECT_WRITES,
            backing_id: 0,
        };
        ok(out.as_bytes().to_vec())
    }

    /// READ: the part of the request inside the volume, from the target.
    fn read(&self, ino: u64, op_in: &[u8]) -> Step<'static> {
        let Ok(r) = abi::ReadIn::read_from_bytes(op_in) else {
            return err(libc::EINVAL);
        };
        if ino != DISK {
            return err(libc::EISDIR);
        }
        let len = (r.size as u64).min(self.size.saturating_sub(r.offset)) as usize;
        if len == 0 {
            return ok(Vec::new());
        }
        Step::Io(Io::Read {
            offset: r.offset,
            len,
        })
    }

    /// WRITE of `payload`: the part inside the volume, to the target.
    fn write<'a>(&self, ino: u64, op_in: &[u8], payload: &'a [u8]) -> Step<'a> {
        let Ok(w) = abi::WriteIn::read_from_bytes(op_in) else {
            return err(libc::EINVAL);
        };
        if ino != DISK {
            return err(libc::EISDIR);
        }
        if self.readonly {
            return err(libc::EROFS);
        }
        if w.size as usize != payload.len() {
            return err(libc::EINVAL);
        }
        if w.offset >= self.size {
            return err(libc::ENOSPC);
        }
        let len = (payload.len() as u64).min(self.size - w.offset) as usize;
        Step::Io(Io::Write {
            offset: w.offset,
            data: &payload[..len],
        })
    }

    fn statfs(&self) -> Step<'static> {
        let bs = self.block.max(512);
        let out = abi::StatfsOut {
            blocks: self.size / bs,
            files: 2,
            bsize: bs as u32,
            namelen: 255,
            frsize: bs as u32,
            ..Default::default()
        };
        ok(out.as_bytes().to_vec())
    }

    fn readdir(&self, offset: u64, max: usize) -> Vec<u8> {
        let entries = [
            (ROOT, abi::DT_DIR, "."),
            (ROOT, abi::DT_DIR, ".."),
            (DISK, abi::DT_REG, self.name.as_str()),
        ];
        let mut out = Vec::new();
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            let d = abi::Dirent {
                ino: *ino,
                off: i as u64 + 1,
                namelen: name.len() as u32,
                kind: *kind,
            };
            let len = (std::mem::size_of::<abi::Dirent>() + name.len()).next_multiple_of(8);
            if out.len() + len > max {
                break;
            }
            out.extend_from_slice(d.as_bytes());
            out.extend_from_slice(name.as_bytes());
            out.resize(out.len().next_multiple_of(8), 0);
        }
        out
    }

    fn fallocate(&self, offset: u64, length: u64, mode: i32) -> Step<'static> {
        let end = offset.saturating_add(length);
        if mode == 0 || mode == libc::FALLOC_FL_KEEP_SIZE {
            // Every byte of the volume already exists.
            return if end <= self.size {
                ok(Vec::new())
            } else {
                err(libc::EFBIG)
            };
        }
        if mode != libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE {
            return err(libc::EOPNOTSUPP);
        }
        if self.readonly {
            return err(libc::EROFS);
        }
        // Discard whole blocks only: partial blocks at the ends keep their
        // data (a hole may read back as anything the target chooses, so
        // leaving bytes is within what punching promises here).
        let start = offset.div_ceil(self.block) * self.block;
        let stop = end.min(self.size) / self.block * self.block;
        if stop <= start {
            return ok(Vec::new());
        }
        Step::Io(Io::Discard {
            offset: start,
            len: stop - start,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fs() -> VolumeFs {
        VolumeFs::new("disk".into(), false, 1 << 20, 512)
    }

    /// A /dev/fuse request: header, op header, payload.
    fn req(opcode: u32, nodeid: u64, op_hdr: &[u8], payload: &[u8]) -> Vec<u8> {
        let len = 40 + op_hdr.len() + payload.len();
        let h = InHeader {
            len: len as u32,
            opcode,
            unique: 7,
            nodeid,
            ..Default::default()
        };
        [h.as_bytes(), op_hdr, payload].concat()
    }

    fn step(fs: &VolumeFs, buf: &[u8]) -> String {
        format!("{:?}", fs.handle(&Request::parse(buf).unwrap()))
    }

    #[test]
    fn lookup_finds_only_the_disk() {
        let f = fs();
        let b = req(op::LOOKUP, ROOT, &[], b"disk\0");
        let Step::Reply { error: 0, body } = f.handle(&Request::parse(&b).unwrap()) else {
            panic!()
        };
        let e = abi::EntryOut::read_from_bytes(&body).unwrap();
        assert_eq!(
            (e.nodeid, e.attr.size, e.attr.mode),
            (DISK, 1 << 20, abi::S_IFREG | 0o600)
        );
        let b = req(op::LOOKUP, ROOT, &[], b"other\0");
        assert_eq!(f.handle(&Request::parse(&b).unwrap()), err(libc::ENOENT));
    }

    #[test]
    fn read_is_clamped_to_the_volume() {
        let f = fs();
        let r = abi::ReadIn {
            offset: (1 << 20) - 512,
            size: 4096,
            ..Default::default()
        };
        let b = req(op::READ, DISK, r.as_bytes(), &[]);
        assert_eq!(
            f.handle(&Request::parse(&b).unwrap()),
            Step::Io(Io::Read {
                offset: (1 << 20) - 512,
                len: 512
            })
        );
        let r = abi::ReadIn {
            offset: 1 << 20,
            size: 4096,
            ..Default::default()
        };
        let b = req(op::READ, DISK, r.as_bytes(), &[]);
        assert_eq!(f.handle(&Request::parse(&b).unwrap()), ok(Vec::new()));
    }

    #[test]
    fn write_payload_is_borrowed_and_checked() {
        let f = fs();
        let data = [9u8; 1024];
        let w = abi::WriteIn {
            offset: 4096,
            size: 1024,
            ..Default::default()
        };
        let b = req(op::WRITE, DISK, w.as_bytes(), &data);
        assert_eq!(
            f.handle(&Request::parse(&b).unwrap()),
            Step::Io(Io::Write {
                offset: 4096,
                data: &data
            })
        );
        // A size that disagrees with the payload is refused, not trusted.
        let w = abi::WriteIn {
            offset: 4096,
            size: 4096,
            ..Default::default()
        };
        let b = req(op::WRITE, DISK, w.as_bytes(), &data);
        assert_eq!(f.handle(&Request::parse(&b).unwrap()), err(libc::EINVAL));
        let ro = VolumeFs {
            readonly: true,
            ..fs()
        };
        let w = abi::WriteIn {
            offset: 0,
            size: 1024,
            ..Default::default()
        };
        let b = req(op::WRITE, DISK, w.as_bytes(), &data);
        assert_eq!(ro.handle(&Request::parse(&b).unwrap()), err(libc::EROFS));
    }

    #[test]
    fn punch_hole_discards_whole_blocks_only() {
        let f = fs();
        let mode = (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE) as u32;
        let a = abi::FallocateIn {
            offset: 100,
            length: 2000,
            mode,
            ..Default::default()
        };
        let b = req(op::FALLOCATE, DISK, a.as_bytes(), &[]);
        assert_eq!(
            f.handle(&Request::parse(&b).unwrap()),
            Step::Io(Io::Discard {
                offset: 512,
                len: 1536
            })
        );
        let a = abi::FallocateIn {
            offset: 0,
            length: 4096,
            mode: libc::FALLOC_FL_COLLAPSE_RANGE as u32,
            ..Default::default()
        };
        let b = req(op::FALLOCATE, DISK, a.as_bytes(), &[]);
        assert_eq!(
            f.handle(&Request::parse(&b).unwrap()),
            err(libc::EOPNOTSUPP)
        );
    }

    #[test]
    fn truncate_to_another_size_is_refused() {
        let f = fs();
        let s = abi::SetattrIn {
            valid: abi::FATTR_SIZE,
            size: 0,
            ..Default::default()
        };
        let b = req(op::SETATTR, DISK, s.as_bytes(), &[]);
        assert_eq!(f.handle(&Request::parse(&b).unwrap()), err(libc::EPERM));
        let s = abi::SetattrIn {
            valid: abi::FATTR_SIZE,
            size: 1 << 20,
            ..Default::default()
        };
        let b = req(op::SETATTR, DISK, s.as_bytes(), &[]);
        assert!(step(&f, &b).starts_with("Reply { error: 0"));
    }

    #[test]
    fn readdir_lists_the_file_and_resumes_at_offset() {
        let f = fs();
        let r = abi::ReadIn {
            size: 4096,
            ..Default::default()
        };
        let Step::Reply { body, .. } =
            f.handle(&Request::parse(&req(op::READDIR, ROOT, r.as_bytes(), &[])).unwrap())
        else {
            panic!()
        };
        assert_eq!(body.len(), 3 * 32);
        assert_eq!(&body[64 + 24..64 + 28], b"disk");
        let r = abi::ReadIn {
            offset: 2,
            size: 4096,
            ..Default::default()
        };
        let Step::Reply { body, .. } =
            f.handle(&Request::parse(&req(op::READDIR, ROOT, r.as_bytes(), &[])).unwrap())
        else {
            panic!()
        };
        assert_eq!(body.len(), 32);
    }

    #[test]
    fn malformed_requests_are_refused_not_trusted() {
        let f = fs();
        assert_eq!(
            Request::parse(&[0u8; 10]).unwrap_err(),
            ParseError::Short(10)
        );
        let mut b = req(op::GETATTR, DISK, &[0u8; 16], &[]);
        b[0] = 200; // claims more than arrived
        assert!(matches!(Request::parse(&b), Err(ParseError::Length { .. })));
        // A READ without its fuse_read_in.
        let b = req(op::READ, DISK, &[], &[]);
        assert_eq!(f.handle(&Request::parse(&b).unwrap()), err(libc::EINVAL));
        assert_eq!(
            f.handle(&Request::parse(&req(9999, DISK, &[], &[])).unwrap()),
            err(libc::ENOSYS)
        );
    }
}
