//! An NFSv3 client for one regular file used as a block volume, as qemu's
//! nfs driver and Proxmox's raw images on NFS storage use one: READ,
//! WRITE (UNSTABLE, COMMIT on flush; FILE_SYNC when every write must be
//! durable), many calls in flight on one connection, and a reconnect when
//! the server goes away and comes back.
//!
//! The wire format (XDR of RPC, portmapper, MOUNT and NFSv3) is
//! `nfs3_types`'; the RPC transport with calls matched by XID is
//! [`rpc`]. Why not libnfs or `nfs3_client`: see this crate's README.

mod error;
pub mod rpc;

pub use error::{Error, Result};

use nfs3_types::mount::{dirpath, mountres3, MOUNT_PROGRAM};
use nfs3_types::nfs3::{
    self as v3, diropargs3, nfs_fh3, stable_how, COMMIT3args, COMMIT3res, FSINFO3args, FSINFO3res, GETATTR3args, GETATTR3res,
    LOOKUP3args, LOOKUP3res, READ3args, READ3res, WRITE3args, WRITE3res, NFS_PROGRAM,
};
use nfs3_types::portmap::{mapping, PMAP_PROG};
use nfs3_types::rpc::{auth_unix, opaque_auth};
use nfs3_types::xdr_codec::Opaque;
use rpc::RpcConn;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The portmapper's well-known port, where the MOUNT service's port is asked.
pub const PORTMAP_PORT: u16 = 111;
/// NFS's registered port, used when the URL names none.
pub const NFS_PORT: u16 = 2049;

/// Where the file is and how to use it.
#[derive(Debug, Clone)]
pub struct FileSpec {
    pub host: String,
    /// The NFS service's port (the portmapper is always asked for MOUNT's).
    pub port: u16,
    /// The exported directory (`/export`), as MOUNT names it.
    pub export: String,
    /// The file under the export (`disk.img` or `vm/disk.img`).
    pub path: String,
    /// Every write FILE_SYNC (durable when acknowledged) instead of UNSTABLE + COMMIT.
    pub sync: bool,
}

/// An open file on an NFSv3 server. Every method takes `&self`; calls from
/// many tasks go out together on one connection.
pub struct NfsFile {
    spec: FileSpec,
    addr: SocketAddr,
    cred: opaque_auth<'static>,
    fh: nfs_fh3,
    size: u64,
    /// Largest READ and WRITE the server takes (FSINFO rtmax, wtmax).
    pub max_read: u32,
    pub max_write: u32,
    timeout: Duration,
    conn: tokio::sync::Mutex<Arc<RpcConn>>,
    /// The write verifier of the UNSTABLE writes since the last COMMIT, and
    /// whether it changed among them (the server restarted: those writes
    /// may be gone, and COMMIT must not claim them).
    unstable: Mutex<Unstable>,
}

#[derive(Default)]
struct Unstable {
    verf: Option<[u8; 8]>,
    changed: bool,
}

/// AUTH_UNIX with our effective uid and gid: the file is used as the
/// local user would use it (root for the lab and attach).
fn credential() -> opaque_auth<'static> {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    opaque_auth::auth_unix(&auth_unix { stamp: 0, machinename: Opaque::owned(host.trim().as_bytes().to_vec()), uid, gid, gids: vec![gid] })
}

async fn resolve(host: &str, port: u16) -> Result<SocketAddr> {
    tokio::net::lookup_host((host, port))
        .await?
        .next()
        .ok_or_else(|| Error::Invalid(format!("{host}: no address")))
}

fn check<T, E>(op: &'static str, r: v3::Nfs3Result<T, E>) -> Result<T> {
    match r {
        v3::Nfs3Result::Ok(v) => Ok(v),
        v3::Nfs3Result::Err((status, _)) => Err(Error::Nfs { op, status }),
    }
}

/// The export mounted: the NFS service's address, the credential, a
/// connection to it and the handle of the export's root.
struct Mounted {
    addr: SocketAddr,
    cred: opaque_auth<'static>,
    conn: RpcConn,
    root: nfs_fh3,
}

/// Mount `spec`'s export (the portmapper asked for MOUNT's port); each step
/// waits at most `timeout`.
async fn mount(spec: &FileSpec, timeout: Duration) -> Result<Mounted> {
    let cred = credential();
        let pm = RpcConn::connect(resolve(&spec.host, PORTMAP_PORT).await?, opaque_auth::default(), timeout).await?;
        let map = mapping { prog: nfs3_types::mount::PROGRAM, vers: nfs3_types::mount::VERSION, prot: nfs3_types::portmap::IPPROTO_TCP, port: 0 };
        let mount_port: u32 = pm
            .call(nfs3_types::portmap::PROGRAM, nfs3_types::portmap::VERSION, PMAP_PROG::PMAPPROC_GETPORT as u32, &map, timeout)
            .await?;
        drop(pm);
        if mount_port == 0 || mount_port > u16::MAX as u32 {
            return Err(Error::Invalid(format!("{}: no MOUNT v3 service over TCP registered with the portmapper", spec.host)));
        }
        let mnt = RpcConn::connect(resolve(&spec.host, mount_port as u16).await?, cred.clone(), timeout).await?;
        let path = dirpath(Opaque::borrowed(spec.export.as_bytes()));
        let res: mountres3 = mnt
            .call(nfs3_types::mount::PROGRAM, nfs3_types::mount::VERSION, MOUNT_PROGRAM::MOUNTPROC3_MNT as u32, &path, timeout)
            .await?;
        drop(mnt);
        let root = match res {
            mountres3::Ok(ok) => nfs_fh3 { data: Opaque::owned(ok.fhandle.0.into_owned()) },
            mountres3::Err(status) => return Err(Error::Mount { export: spec.export.clone(), status: status.to_string() }),
        };
        let addr = resolve(&spec.host, spec.port).await?;
        let conn = RpcConn::connect(addr, cred.clone(), timeout).await?;
        Ok(Mounted { addr, cred, conn, root })
}

/// The handle of `names` (path components) under `fh`, one LOOKUP each.
async fn lookup(conn: &RpcConn, mut fh: nfs_fh3, names: &[&str], timeout: Duration) -> Result<nfs_fh3> {
    for name in names {
        let args = LOOKUP3args { what: diropargs3 { dir: fh, name: name.as_bytes().into() } };
        let r: LOOKUP3res = conn.call(v3::PROGRAM, v3::VERSION, NFS_PROGRAM::NFSPROC3_LOOKUP as u32, &args, timeout).await?;
        fh = check("LOOKUP", r).map_err(|e| Error::Invalid(format!("{name}: {e}")))?.object;
    }
    Ok(fh)
}

/// The directories of `path` and its last name (`vm/disk.img`: `[vm]`, `disk.img`).
fn split_path(path: &str) -> Result<(Vec<&str>, &str)> {
    let mut names: Vec<&str> = path.split('/').filter(|n| !n.is_empty()).collect();
    let last = names.pop().ok_or_else(|| Error::Invalid(format!("{path:?} names no file")))?;
    Ok((names, last))
}

/// Create the regular file `spec` names (mode 0644, empty), GUARDED: a
/// file already there is an error, never truncated or reused.
pub async fn create(spec: &FileSpec, timeout: Duration) -> Result<()> {
    let m = mount(spec, timeout).await?;
    let (dirs, name) = split_path(&spec.path)?;
    let dir = lookup(&m.conn, m.root, &dirs, timeout).await?;
    let attrs = v3::sattr3 { mode: v3::Nfs3Option::Some(0o644), ..Default::default() };
    let args = v3::CREATE3args { where_: diropargs3 { dir, name: name.as_bytes().into() }, how: v3::createhow3::GUARDED(attrs) };
    let r: v3::CREATE3res = m.conn.call(v3::PROGRAM, v3::VERSION, NFS_PROGRAM::NFSPROC3_CREATE as u32, &args, timeout).await?;
    check("CREATE", r).map(|_| ()).map_err(|e| Error::Invalid(format!("{}: {e}", spec.path)))
}

/// Remove the file `spec` names.
pub async fn remove(spec: &FileSpec, timeout: Duration) -> Result<()> {
    let m = mount(spec, timeout).await?;
    let (dirs, name) = split_path(&spec.path)?;
    let dir = lookup(&m.conn, m.root, &dirs, timeout).await?;
    let args = v3::REMOVE3args { object: diropargs3 { dir, name: name.as_bytes().into() } };
    let r: v3::REMOVE3res = m.conn.call(v3::PROGRAM, v3::VERSION, NFS_PROGRAM::NFSPROC3_REMOVE as u32, &args, timeout).await?;
    check("REMOVE", r).map(|_| ()).map_err(|e| Error::Invalid(format!("{}: {e}", spec.path)))
}

impl NfsFile {
    /// Mount the export, look the file up, read its size and the server's
    /// transfer sizes. Each step waits at most `timeout`.
    pub async fn open(spec: FileSpec, timeout: Duration) -> Result<NfsFile> {
        let Mounted { addr, cred, conn, root } = mount(&spec, timeout).await?;
        let names: Vec<&str> = spec.path.split('/').filter(|n| !n.is_empty()).collect();
        let fh = lookup(&conn, root, &names, timeout).await.map_err(|e| match e {
            Error::Invalid(why) => Error::Invalid(format!("{}: {why}", spec.path)),
            e => e,
        })?;
        let conn = Arc::new(conn);
        let r: GETATTR3res = conn
            .call(v3::PROGRAM, v3::VERSION, NFS_PROGRAM::NFSPROC3_GETATTR as u32, &GETATTR3args { object: fh.clone() }, timeout)
            .await?;
        let attr = check("GETATTR", r)?.obj_attributes;
        if !matches!(attr.type_, v3::ftype3::NF3REG) {
            return Err(Error::Invalid(format!("{} is not a regular file", spec.path)));
        }
        let r: FSINFO3res = conn
            .call(v3::PROGRAM, v3::VERSION, NFS_PROGRAM::NFSPROC3_FSINFO as u32, &FSINFO3args { fsroot: fh.clone() }, timeout)
            .await?;
        let info = check("FSINFO", r)?;
        // Servers may answer 0 for "no preference"; 1 MiB is what Linux and ganesha offer.
        let clamp = |n: u32| if n == 0 { 1 << 20 } else { n.min(1 << 20) };
        Ok(NfsFile {
            addr,
            cred,
            fh,
            size: attr.size,
            max_read: clamp(info.rtmax),
            max_write: clamp(info.wtmax),
            timeout,
            conn: tokio::sync::Mutex::new(conn),
            unstable: Mutex::new(Unstable::default()),
            spec,
        })
    }

    pub fn spec(&self) -> &FileSpec {
        &self.spec
    }

    /// The file's size when it was opened.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The connection to use: the current one, or a new one (connected
    /// within `timeout`) if it ended.
    async fn conn(&self, timeout: Duration) -> Result<Arc<RpcConn>> {
        let mut c = self.conn.lock().await;
        if c.is_closed() {
            *c = Arc::new(RpcConn::connect(self.addr, self.cred.clone(), timeout).await?);
            log::info!("reconnected to {}", self.addr);
        }
        Ok(c.clone())
    }

    /// One NFS call, retried on new connections while the server is away,
    /// until `timeout` has passed since the first try. A call that
    /// timed out on a live connection ends it: the server may be hung, and a
    /// new connection is how NFS clients retransmit over TCP.
    async fn call<A: nfs3_types::xdr_codec::Pack, R: nfs3_types::xdr_codec::Unpack>(&self, proc: NFS_PROGRAM, args: &A) -> Result<R> {
        let deadline = Instant::now() + self.timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let attempt = match self.conn(left).await {
                Ok(c) => {
                    let r = c.call(v3::PROGRAM, v3::VERSION, proc as u32, args, left).await;
                    if matches!(r, Err(Error::Timeout(_))) {
                        c.close();
                    }
                    r
                }
                Err(e) => Err(e),
            };
            match attempt {
                Err(e @ (Error::Disconnected(_) | Error::Io(_) | Error::Timeout(_))) => {
                    if Instant::now() + Duration::from_millis(200) >= deadline {
                        return Err(e);
                    }
                    log::debug!("{proc:?}: {e}; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                r => return r,
            }
        }
    }

    /// Read `buf.len()` bytes at `offset`, in READs of at most
    /// [`NfsFile::max_read`] sent together. Past the end of file reads zeros.
    pub async fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let chunk = self.max_read as usize;
        let reads = buf.chunks_mut(chunk).enumerate().map(|(i, part)| self.read_one(offset + (i * chunk) as u64, part));
        futures::future::try_join_all(reads).await.map(|_| ())
    }

    async fn read_one(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let mut done = 0;
        while done < buf.len() {
            let args = READ3args { file: self.fh.clone(), offset: offset + done as u64, count: (buf.len() - done) as u32 };
            let r: READ3res = self.call(NFS_PROGRAM::NFSPROC3_READ, &args).await?;
            let ok = check("READ", r)?;
            let data = ok.data.as_ref();
            buf[done..done + data.len()].copy_from_slice(data);
            done += data.len();
            if ok.eof || data.is_empty() {
                buf[done..].fill(0);
                break;
            }
        }
        Ok(())
    }

    /// Write `data` at `offset`, in WRITEs of at most [`NfsFile::max_write`]
    /// sent together: UNSTABLE (durable after [`NfsFile::flush`]), or
    /// FILE_SYNC if the spec asks for sync.
    pub async fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        let chunk = self.max_write as usize;
        let writes = data.chunks(chunk).enumerate().map(|(i, part)| self.write_one(offset + (i * chunk) as u64, part));
        futures::future::try_join_all(writes).await.map(|_| ())
    }

    async fn write_one(&self, offset: u64, data: &[u8]) -> Result<()> {
        let stable = if self.spec.sync { stable_how::FILE_SYNC } else { stable_how::UNSTABLE };
        let mut done = 0;
        while done < data.len() {
            let part = &data[done..];
            let args = WRITE3args { file: self.fh.clone(), offset: offset + done as u64, count: part.len() as u32, stable, data: Opaque::borrowed(part) };
            let r: WRITE3res = self.call(NFS_PROGRAM::NFSPROC3_WRITE, &args).await?;
            let ok = check("WRITE", r)?;
            if ok.count == 0 {
                return Err(Error::Rpc("server wrote 0 bytes".into()));
            }
            if matches!(ok.committed, stable_how::UNSTABLE) {
                let mut u = self.unstable.lock().unwrap();
                match u.verf {
                    Some(v) if v != ok.verf.0 => u.changed = true,
                    _ => u.verf = Some(ok.verf.0),
                }
            }
            done += (ok.count as usize).min(part.len());
        }
        Ok(())
    }

    /// Make the writes acknowledged so far durable (COMMIT). Fails if the
    /// server restarted since some of them (its write verifier changed):
    /// they may be lost, as a volatile write cache is on power loss.
    pub async fn flush(&self) -> Result<()> {
        let pending = std::mem::take(&mut *self.unstable.lock().unwrap());
        if self.spec.sync && pending.verf.is_none() {
            return Ok(());
        }
        let r: COMMIT3res = self.call(NFS_PROGRAM::NFSPROC3_COMMIT, &COMMIT3args { file: self.fh.clone(), offset: 0, count: 0 }).await?;
        let ok = check("COMMIT", r)?;
        if pending.changed || pending.verf.is_some_and(|v| v != ok.verf.0) {
            return Err(Error::Rpc("the server restarted since unstable writes were acknowledged: they may be lost".into()));
        }
        Ok(())
    }

    /// Close the connection (NFSv3 has no open state to release).
    pub fn close(&self) {
        if let Ok(c) = self.conn.try_lock() {
            c.close();
        }
    }
}

