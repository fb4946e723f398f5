//! Volume pools: directories (or RBD pools) serve owns, where volumes are
//! created, snapshotted, cloned and deleted by name. In a directory a
//! volume is a sparse file (`NAME.img`); a snapshot is a read-only reflink
//! of it, a clone a writable reflink of a snapshot (bw_block::reflink). In
//! an RBD pool a volume is an image `NAME`, a snapshot a protected RBD
//! snapshot `ORIGIN@NAME`, a clone an RBD clone of it (bw_block::RbdPool);
//! RBD keeps a clone's unwritten blocks in its snapshot and a snapshot in
//! its image, so a snapshot with clones and an image with snapshots are
//! not deleted (the error names them).
//! What exists is the configuration: each operation here is an edit of
//! it (through [`crate::live::Live::change_files`], so it is validated, served and
//! persisted as a whole, and the files it made are removed if it is
//! refused). Creating what exists with the same parameters changes
//! nothing and answers the existing object; with other parameters it is
//! refused, naming what differs.
//!
//! Files in a pool directory that no volume of the configuration names
//! are leftovers of a change interrupted by a crash (the file was made or
//! doomed, the configuration not yet written or already written): they
//! are replaced when a volume of that name is created.

use bw_block::reflink::{self, CopyKind};
use bw_block::{BackendKind, BackendSpec, RbdPool, RbdTarget, Volume};
use bw_serve::config::{check_name, PoolConfig, ServeConfig, VolumeConfig};
use bw_serve::refused::Refused;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Now, in seconds since the epoch (a pool object's creation time).
fn now_unix() -> Option<i64> {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok().map(|d| d.as_secs() as i64)
}

/// A random (version 4) UUID.
pub fn new_uuid() -> String {
    let mut b = [0u8; 16];
    getrandom::getrandom(&mut b).expect("the kernel's random numbers");
    uuid_text(b, 4)
}

/// 16 bytes as an RFC 9562 UUID of `version` (variant 10).
fn uuid_text(mut b: [u8; 16], version: u8) -> String {
    b[6] = (b[6] & 0x0f) | (version << 4);
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

fn pool<'a>(c: &'a ServeConfig, name: &str) -> Result<&'a PoolConfig, Refused> {
    c.pools.iter().find(|p| p.name == name).ok_or_else(|| Refused::NotFound(format!("no pool {name} (pool_list lists them)")))
}

pub fn volume<'a>(c: &'a ServeConfig, name: &str) -> Result<&'a VolumeConfig, Refused> {
    c.volumes.iter().find(|v| v.name == name).ok_or_else(|| Refused::NotFound(format!("no volume {name}")))
}

fn volume_mut<'a>(c: &'a mut ServeConfig, name: &str) -> Result<&'a mut VolumeConfig, Refused> {
    c.volumes.iter_mut().find(|v| v.name == name).ok_or_else(|| Refused::NotFound(format!("no volume {name}")))
}

/// The file of a volume.
pub fn file_of(v: &VolumeConfig) -> Option<&Path> {
    match &v.backend.kind {
        BackendKind::File { path, .. } => Some(path),
        _ => None,
    }
}

/// The RBD image (or snapshot) of a volume.
pub fn rbd_of(v: &VolumeConfig) -> Option<&RbdTarget> {
    match &v.backend.kind {
        BackendKind::Rbd(t) => Some(t),
        _ => None,
    }
}

/// How an RBD pool's cluster is reached (no image named yet).
fn rbd_pool_target(p: &PoolConfig) -> Option<RbdTarget> {
    Some(RbdTarget {
        pool: p.rbd.clone()?,
        image: String::new(),
        snap: None,
        conf: p.conf.as_ref().map(PathBuf::from),
        id: p.id.clone(),
        size: None,
        timeout_secs: None,
    })
}

fn connect(t: &RbdTarget) -> Result<RbdPool, Refused> {
    RbdPool::connect(t).map_err(|e| Refused::by_kind(e.to_string(), &e))
}

/// Pool objects (files, RBD images and snapshots) a change makes or
/// unmakes beside the configuration: made ones are removed if the change
/// is refused; doomed ones once it is served.
#[derive(Default)]
pub struct Files {
    pub created: Vec<PoolObject>,
    pub remove_after: Vec<PoolObject>,
}

/// Something a pool holds for a volume: what a change makes, or removes
/// once it is served (see [`Files`]).
#[derive(Debug, Clone)]
pub enum PoolObject {
    File(PathBuf),
    /// An RBD image, or (`snap`) one of its snapshots.
    Rbd(RbdTarget),
}

impl PoolObject {
    pub fn remove(&self) -> Result<(), String> {
        match self {
            PoolObject::File(f) => match std::fs::remove_file(f) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(format!("removing {}: {e}", f.display())),
                // Its reservations go with it (FILE.pr beside it).
                _ => bw_reservation::FileStore::remove_beside(f).map_err(|e| format!("removing the reservations beside {}: {e}", f.display())),
            },
            PoolObject::Rbd(t) => {
                let p = RbdPool::connect(t).map_err(|e| e.to_string())?;
                match &t.snap {
                    Some(snap) => p.remove_snapshot(&t.image, snap),
                    None => p.remove(&t.image),
                }
                .map_err(|e| e.to_string())
            }
        }
    }
}

/// Where a pool volume's data is.
enum Backing {
    File(PathBuf),
    Rbd(RbdTarget),
}

/// The pool a volume was made in, or why this operation needs one.
fn pool_volume<'a>(c: &'a ServeConfig, name: &str, op: &str) -> Result<(&'a VolumeConfig, &'a PoolConfig, Backing), Refused> {
    let v = volume(c, name)?;
    let Some(p) = &v.pool else {
        return Err(Refused::Invalid(format!("volume {name} is not in a pool ({op} works on volumes made by volume_create, volume_snapshot or volume_clone)")));
    };
    let backing = match (file_of(v), rbd_of(v)) {
        (Some(f), _) => Backing::File(f.to_path_buf()),
        (_, Some(t)) => Backing::Rbd(t.clone()),
        _ => return Err(Refused::Invalid(format!("volume {name}: its backend is neither a file nor an RBD image"))),
    };
    Ok((v, pool(c, p)?, backing))
}

/// A pool volume's file, for what only file pools do.
fn pool_file<'a>(c: &'a ServeConfig, name: &str, op: &str) -> Result<(&'a VolumeConfig, &'a PoolConfig, PathBuf), Refused> {
    match pool_volume(c, name, op)? {
        (v, p, Backing::File(f)) => Ok((v, p, f)),
        (_, p, Backing::Rbd(_)) => Err(Refused::Unsupported(format!("volume {name} is in RBD pool {}: {op} is for directory pools", p.name))),
    }
}

/// Where a new volume's file goes; a leftover there (see the module
/// comment) is removed first.
fn new_file(p: &PoolConfig, c: &ServeConfig, name: &str) -> Result<PathBuf, Refused> {
    let path = Path::new(&p.path).join(format!("{name}.img"));
    if c.volumes.iter().any(|v| file_of(v) == Some(path.as_path())) {
        return Err(Refused::AlreadyExists(format!("{} belongs to another volume", path.display())));
    }
    match std::fs::remove_file(&path) {
        Ok(()) => log::warn!("pool {}: replaced {}, a leftover of an interrupted change", p.name, path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Refused::by_kind(format!("pool {}: {}: {e}", p.name, path.display()), &e)),
    }
    // A deleted volume's reservations may be left beside it too (a crash
    // between the two removals, or an older blockwire): never inherited.
    bw_reservation::FileStore::remove_beside(&path).map_err(|e| Refused::by_kind(format!("pool {}: the reservations beside {}: {e}", p.name, path.display()), &e))?;
    Ok(path)
}

fn file_backend(path: &Path, size: Option<u64>, readonly: bool) -> BackendSpec {
    BackendSpec { kind: BackendKind::File { path: path.to_path_buf(), size }, direct: false, sync: false, readonly }
}

fn rbd_backend(t: &RbdTarget) -> BackendSpec {
    BackendSpec { kind: BackendKind::Rbd(t.clone()), direct: false, sync: false, readonly: t.snap.is_some() }
}

/// The size a volume's backend asks for (what it was created or resized to).
fn spec_size(v: &VolumeConfig) -> Option<u64> {
    match &v.backend.kind {
        BackendKind::File { size, .. } => *size,
        BackendKind::Ram { size } => Some(*size),
        BackendKind::Rbd(t) => t.size,
    }
}

/// Refused naming what differs, or Ok if nothing does.
fn same_or_refuse(what: &str, diffs: Vec<String>) -> Result<(), Refused> {
    if diffs.is_empty() {
        Ok(())
    } else {
        Err(Refused::AlreadyExists(format!("{what} exists with other parameters: {}", diffs.join(", "))))
    }
}

fn differ<T: PartialEq + std::fmt::Debug>(field: &str, have: T, asked: T, diffs: &mut Vec<String>) {
    if have != asked {
        diffs.push(format!("{field} is {have:?}, not {asked:?}"));
    }
}

/// Whether a change made something or found it made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Made {
    Created,
    Existed,
}

/// Make a pool's directory (mode 700, root's, and its missing parents
/// likewise) if it is missing. An existing one must be one only root may
/// write, it and every directory above it (bw_rootdir): a user who may
/// write there could plant links beside the volumes' files, or replace
/// them. Otherwise refused, saying which directory lets whom in.
pub fn ensure_dir(p: &PoolConfig) -> Result<(), Refused> {
    bw_rootdir::RootDir::create(Path::new(&p.path)).map(drop).map_err(|e| Refused::by_kind(format!("pool {}: {e}", p.name), &e))
}

/// `pool_create`: `asked` names a directory (`path`, `copy`) or an RBD
/// pool (`rbd`, `conf`, `id`), which must be reachable.
pub fn pool_create(c: &mut ServeConfig, asked: PoolConfig) -> Result<Made, Refused> {
    let name = asked.name.clone();
    check_name("pool", &name).map_err(Refused::Invalid)?;
    if let Some(p) = c.pools.iter().find(|p| p.name == name) {
        let mut d = vec![];
        differ("path", p.path.as_str(), asked.path.as_str(), &mut d);
        differ("rbd", p.rbd.as_deref(), asked.rbd.as_deref(), &mut d);
        differ("conf", p.conf.as_deref(), asked.conf.as_deref(), &mut d);
        differ("id", p.id.as_deref(), asked.id.as_deref(), &mut d);
        differ("copy", p.copy, asked.copy, &mut d);
        same_or_refuse(&format!("pool {name}"), d)?;
        return Ok(Made::Existed);
    }
    let p = PoolConfig { uuid: Some(new_uuid()), ..asked };
    if let Some(t) = rbd_pool_target(&p) {
        if !p.path.is_empty() || p.copy {
            return Err(Refused::Invalid(format!("pool {name}: give either path (a directory, copy) or rbd (a Ceph pool)")));
        }
        if let Some(o) = c.pools.iter().find(|o| o.rbd == p.rbd && o.conf == p.conf) {
            return Err(Refused::AlreadyExists(format!("RBD pool {} is already pool {}", t.pool, o.name)));
        }
        // librados reads the conf (and the keyrings and logs it names):
        // confined as a volume's file is, before anything reads it.
        if let Some(conf) = &p.conf {
            c.check_allowed(Path::new(conf), &format!("pool {name}'s ceph.conf")).map_err(Refused::Invalid)?;
        }
        connect(&t)?;
    } else {
        if let Some(o) = c.pools.iter().find(|o| o.path == p.path) {
            return Err(Refused::AlreadyExists(format!("{} is already pool {}", p.path, o.name)));
        }
        if !Path::new(&p.path).is_absolute() {
            return Err(Refused::Invalid(format!("pool {name}: path {:?} must be absolute (or give rbd: a Ceph pool)", p.path)));
        }
        if p.conf.is_some() || p.id.is_some() {
            return Err(Refused::Invalid(format!("pool {name}: conf and id are for RBD pools")));
        }
        // Its directory is made (or checked) by Live once the change has
        // passed every check, [control] allowed_paths among them.
    }
    c.pools.push(p);
    Ok(Made::Created)
}

pub fn pool_delete(c: &mut ServeConfig, name: &str) -> Result<(), Refused> {
    pool(c, name)?;
    let inside: Vec<&str> = c.volumes.iter().filter(|v| v.pool.as_deref() == Some(name)).map(|v| v.name.as_str()).collect();
    if !inside.is_empty() {
        return Err(Refused::Busy(format!("pool {name} holds volumes ({}): delete them first", inside.join(", "))));
    }
    c.pools.retain(|p| p.name != name);
    Ok(())
}

/// `volume_create`: a sparse file of `size` bytes (or, `thick`, every
/// block allocated) in the pool.
pub fn volume_create(c: &mut ServeConfig, files: &mut Files, name: &str, size: u64, pool_name: &str, thick: bool) -> Result<Made, Refused> {
    check_name("volume", name).map_err(Refused::Invalid)?;
    if let Ok(v) = volume(c, name) {
        let mut d = vec![];
        differ("pool", v.pool.as_deref().unwrap_or("(none)"), pool_name, &mut d);
        differ("size", spec_size(v).unwrap_or(0), size, &mut d);
        differ("thick", v.thick, thick, &mut d);
        differ("snapshot", v.snapshot_of.is_some(), false, &mut d);
        same_or_refuse(&format!("volume {name}"), d)?;
        return Ok(Made::Existed);
    }
    if size == 0 || !size.is_multiple_of(512) {
        return Err(Refused::Invalid(format!("volume {name}: size {size} must be a positive multiple of 512 bytes")));
    }
    let p = pool(c, pool_name)?.clone();
    if let Some(mut t) = rbd_pool_target(&p) {
        if thick {
            return Err(Refused::Unsupported(format!("volume {name}: pool {} is an RBD pool, where images are thin (thick is for directory pools)", p.name)));
        }
        connect(&t)?.create(name, size).map_err(|e| Refused::by_kind(format!("volume {name}: {e}"), &e))?;
        t.image = name.into();
        files.created.push(PoolObject::Rbd(t.clone()));
        t.size = Some(size);
        c.volumes.push(VolumeConfig { pool: Some(p.name), uuid: Some(new_uuid()), created_unix: now_unix(), ..VolumeConfig::new(name, rbd_backend(&t)) });
        return Ok(Made::Created);
    }
    let path = new_file(&p, c, name)?;
    let made = (|| {
        use std::os::unix::fs::OpenOptionsExt;
        let f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).custom_flags(libc::O_NOFOLLOW).open(&path)?;
        files.created.push(PoolObject::File(path.clone()));
        f.set_len(size)?;
        if thick {
            reflink::allocate_all(&path)?;
        }
        f.sync_all()
    })();
    made.map_err(|e| Refused::by_kind(format!("volume {name}: {}: {e}", path.display()), &e))?;
    c.volumes.push(VolumeConfig { pool: Some(p.name), uuid: Some(new_uuid()), created_unix: now_unix(), thick, ..VolumeConfig::new(name, file_backend(&path, Some(size), false)) });
    Ok(Made::Created)
}

/// `volume_delete`: refused while the volume is exported (the exports
/// named). A snapshot's clones become independent volumes (their data
/// is theirs: reflinked extents stay until the last sharer lets go); a
/// volume's snapshots stay, naming the volume they were taken of.
pub fn volume_delete(c: &mut ServeConfig, files: &mut Files, name: &str) -> Result<(), Refused> {
    let (_, _, backing) = pool_volume(c, name, "volume_delete")?;
    let users = c.exports_of(name);
    if !users.is_empty() {
        return Err(Refused::Busy(format!("volume {name} is exported ({}): remove those exports first", users.join(", "))));
    }
    let object = match backing {
        Backing::File(f) => PoolObject::File(f),
        Backing::Rbd(t) => {
            // RBD reads a clone's unwritten blocks from its snapshot, and
            // keeps a snapshot in its image.
            let named = |f: fn(&VolumeConfig) -> Option<&String>| -> Vec<&str> { c.volumes.iter().filter(|v| f(v).map(String::as_str) == Some(name)).map(|v| v.name.as_str()).collect() };
            let clones = named(|v| v.clone_of.as_ref());
            if !clones.is_empty() {
                return Err(Refused::Busy(format!("volume {name} is an RBD snapshot with clones ({}): delete them first", clones.join(", "))));
            }
            let snaps = named(|v| v.snapshot_of.as_ref());
            if !snaps.is_empty() {
                return Err(Refused::Busy(format!("volume {name} is an RBD image with snapshots ({}): delete them first", snaps.join(", "))));
            }
            let mut t = t;
            t.size = None;
            PoolObject::Rbd(t)
        }
    };
    for v in c.volumes.iter_mut().filter(|v| v.clone_of.as_deref() == Some(name)) {
        v.clone_of = None;
    }
    c.volumes.retain(|v| v.name != name);
    files.remove_after.push(object);
    Ok(())
}

/// Reflink (or, in a copy pool, copy) `src` to a new file for `name`.
fn copy_for(p: &PoolConfig, c: &ServeConfig, files: &mut Files, src: &Path, name: &str) -> Result<(PathBuf, CopyKind), Refused> {
    let dst = new_file(p, c, name)?;
    let kind = reflink::clone_file(src, &dst, p.copy).map_err(|e| Refused::by_kind(format!("pool {}: {name}: {e}", p.name), &e))?;
    files.created.push(PoolObject::File(dst.clone()));
    Ok((dst, kind))
}

/// `volume_snapshot`: a read-only point-in-time copy. The origin is
/// flushed first and the reflink is taken under the file system's inode
/// locks, so every write acknowledged before the call is in it and none
/// after.
pub fn volume_snapshot(c: &mut ServeConfig, open: &HashMap<String, Volume>, files: &mut Files, origin: &str, snap: &str) -> Result<Made, Refused> {
    check_name("snapshot", snap).map_err(Refused::Invalid)?;
    if let Ok(v) = volume(c, snap) {
        let mut d = vec![];
        differ("snapshot_of", v.snapshot_of.as_deref().unwrap_or("(not a snapshot)"), origin, &mut d);
        same_or_refuse(&format!("volume {snap}"), d)?;
        return Ok(Made::Existed);
    }
    let (v, p, backing) = pool_volume(c, origin, "volume_snapshot")?;
    if v.snapshot_of.is_some() {
        return Err(Refused::Invalid(format!("volume {origin} is a snapshot already (read-only): clone it instead")));
    }
    let p = p.clone();
    let src = match backing {
        Backing::File(f) => f,
        Backing::Rbd(mut t) => {
            // Writes acknowledged to initiators are on the OSDs (no librbd
            // cache): flushing is for form's sake.
            flush_before_snapshot(open, origin)?;
            connect(&t)?.snapshot(&t.image, snap).map_err(|e| Refused::by_kind(format!("volume {origin}: {e}"), &e))?;
            t.snap = Some(snap.into());
            t.size = None;
            files.created.push(PoolObject::Rbd(t.clone()));
            c.volumes.push(VolumeConfig { pool: Some(p.name), uuid: Some(new_uuid()), created_unix: now_unix(), snapshot_of: Some(origin.into()), ..VolumeConfig::new(snap, rbd_backend(&t)) });
            return Ok(Made::Created);
        }
    };
    if p.copy && !reflink::reflinks_work(Path::new(&p.path)) {
        let users = c.exports_of(origin);
        if !users.is_empty() {
            return Err(Refused::Busy(format!(
                "pool {} copies instead of reflinking, and volume {origin} is exported ({}): writes during the copy would tear the snapshot; remove the exports first",
                p.name,
                users.join(", ")
            )));
        }
    }
    flush_before_snapshot(open, origin)?;
    let (dst, kind) = copy_for(&p, c, files, &src, snap)?;
    log::info!("volume {origin}: snapshot {snap} by {kind:?}");
    c.volumes.push(VolumeConfig { pool: Some(p.name), uuid: Some(new_uuid()), created_unix: now_unix(), snapshot_of: Some(origin.into()), ..VolumeConfig::new(snap, file_backend(&dst, None, true)) });
    // As in SPDK, the origin now reads through its snapshot (shared
    // extents) until it is inflated.
    volume_mut(c, origin)?.clone_of = Some(snap.into());
    Ok(Made::Created)
}

/// The origin's acknowledged writes on stable storage before its snapshot is taken.
fn flush_before_snapshot(open: &HashMap<String, Volume>, origin: &str) -> Result<(), Refused> {
    match open.get(origin) {
        Some(vol) => vol.flush().map_err(|e| Refused::block(format!("volume {origin}: flush before the snapshot"), &e)),
        None => Ok(()),
    }
}

/// `volume_clone`: a writable volume holding the snapshot's data.
pub fn volume_clone(c: &mut ServeConfig, files: &mut Files, snap: &str, name: &str) -> Result<Made, Refused> {
    check_name("volume", name).map_err(Refused::Invalid)?;
    if let Ok(v) = volume(c, name) {
        let mut d = vec![];
        differ("clone_of", v.clone_of.as_deref().unwrap_or("(not a clone)"), snap, &mut d);
        same_or_refuse(&format!("volume {name}"), d)?;
        return Ok(Made::Existed);
    }
    let (v, p, backing) = pool_volume(c, snap, "volume_clone")?;
    if v.snapshot_of.is_none() {
        return Err(Refused::Invalid(format!("volume {snap} is not a snapshot: snapshot it first (volume_snapshot), then clone the snapshot")));
    }
    let p = p.clone();
    let src = match backing {
        Backing::File(f) => f,
        Backing::Rbd(parent) => {
            let parent_snap = parent.snap.clone().ok_or_else(|| Refused::Invalid(format!("volume {snap}: its backend names no RBD snapshot")))?;
            let rbd = connect(&parent)?;
            rbd.clone_snapshot(&parent.image, &parent_snap, name).map_err(|e| Refused::by_kind(format!("volume {name}: {e}"), &e))?;
            let t = RbdTarget { image: name.into(), snap: None, size: None, ..parent };
            files.created.push(PoolObject::Rbd(t.clone()));
            let size = rbd.size(name, None).map_err(|e| Refused::by_kind(format!("volume {name}: {e}"), &e))?;
            let t = RbdTarget { size: Some(size), ..t };
            c.volumes.push(VolumeConfig { pool: Some(p.name), uuid: Some(new_uuid()), created_unix: now_unix(), clone_of: Some(snap.into()), ..VolumeConfig::new(name, rbd_backend(&t)) });
            return Ok(Made::Created);
        }
    };
    let (dst, _) = copy_for(&p, c, files, &src, name)?;
    let size = std::fs::metadata(&dst).map_err(|e| Refused::by_kind(format!("{}: {e}", dst.display()), &e))?.len();
    c.volumes.push(VolumeConfig { pool: Some(p.name), uuid: Some(new_uuid()), created_unix: now_unix(), clone_of: Some(snap.into()), ..VolumeConfig::new(name, file_backend(&dst, Some(size), false)) });
    Ok(Made::Created)
}

/// Allocate every block of a clone and let go of its snapshot (SPDK's
/// bdev_lvol_inflate).
pub fn volume_inflate(c: &mut ServeConfig, name: &str) -> Result<(), Refused> {
    let (v, _, file) = pool_file(c, name, "inflate")?;
    if v.snapshot_of.is_some() {
        return Err(Refused::Invalid(format!("volume {name} is a snapshot (read-only): it cannot be inflated")));
    }
    reflink::allocate_all(&file).map_err(|e| Refused::by_kind(format!("volume {name}: inflate: {e}"), &e))?;
    volume_mut(c, name)?.clone_of = None;
    Ok(())
}

/// The bytes a pool volume holds of its own: the file system's blocks
/// of its file, or the RBD objects of its image (or snapshot).
pub fn allocated_bytes(v: &VolumeConfig) -> Option<u64> {
    if let Some(f) = file_of(v) {
        return reflink::allocated_bytes(f).ok();
    }
    let t = rbd_of(v)?;
    RbdPool::connect(t).and_then(|p| p.allocated_bytes(&t.image, t.snap.as_deref())).map_err(|e| log::warn!("volume {}: {e}", v.name)).ok()
}

/// One volume as `volume_list` shows it.
pub fn volume_info(c: &ServeConfig, sizes: &HashMap<String, u64>, v: &VolumeConfig) -> Value {
    let size = sizes.get(&v.name).copied().unwrap_or(0);
    let allocated = allocated_bytes(v);
    json!({
        "name": v.name,
        "pool": v.pool,
        "uuid": v.uuid,
        "backend": v.backend.to_string(),
        "provisioned_bytes": size,
        "allocated_bytes": allocated,
        "thin": !v.thick,
        "readonly": v.backend.readonly,
        "snapshot_of": v.snapshot_of,
        "clone_of": v.clone_of,
        "snapshots": c.volumes.iter().filter(|o| o.snapshot_of.as_deref() == Some(&v.name)).map(|o| o.name.clone()).collect::<Vec<_>>(),
        "clones": c.volumes.iter().filter(|o| o.clone_of.as_deref() == Some(&v.name) && v.snapshot_of.is_some()).map(|o| o.name.clone()).collect::<Vec<_>>(),
        "exports": c.exports_of(&v.name),
        // Which hosts see each NVMe namespace of the volume ("all": every
        // host the subsystem allows).
        "nvme_visibility": c.nvme.iter().flat_map(|n| &n.subsystems).flat_map(|s| s.namespaces.iter().filter(|n| n.volume == v.name).map(move |n| json!({
            "nqn": s.nqn, "nsid": n.nsid, "hosts": if n.no_auto_visible { json!(n.hosts) } else { json!("all") },
        }))).collect::<Vec<_>>(),
        "qos": v.qos.unwrap_or_default(),
        "created_unix": v.created_unix,
    })
}

/// One pool as `pool_list` shows it: space of its file system, and what
/// its volumes are provisioned and hold.
pub fn pool_info(c: &ServeConfig, sizes: &HashMap<String, u64>, p: &PoolConfig) -> Value {
    let space = reflink::fs_space(Path::new(&p.path)).ok();
    let vols: Vec<&VolumeConfig> = c.volumes.iter().filter(|v| v.pool.as_deref() == Some(&p.name)).collect();
    let provisioned: u64 = vols.iter().map(|v| sizes.get(&v.name).copied().unwrap_or(0)).sum();
    let allocated: u64 = vols.iter().filter_map(|v| allocated_bytes(v)).sum();
    json!({
        "name": p.name,
        "path": p.path,
        "rbd": p.rbd,
        "uuid": p.uuid,
        "copy": p.copy,
        "reflinks": reflink::reflinks_work(Path::new(&p.path)),
        "fs_type": space.as_ref().map(|s| s.fs_type),
        "total_bytes": space.as_ref().map(|s| s.total),
        "free_bytes": space.as_ref().map(|s| s.available),
        "volumes": vols.len(),
        "provisioned_bytes": provisioned,
        "allocated_bytes": allocated,
    })
}

/// A pool's UUID: the configured one, or one derived from its name for a
/// hand-written `[[pool]]` without (stable across restarts).
pub fn pool_uuid(p: &PoolConfig) -> String {
    p.uuid.clone().unwrap_or_else(|| derived_uuid("pool", &p.name))
}

/// A volume's UUID, likewise.
pub fn volume_uuid(v: &VolumeConfig) -> String {
    v.uuid.clone().unwrap_or_else(|| derived_uuid("volume", &v.name))
}

fn derived_uuid(kind: &str, name: &str) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(format!("blockwire {kind} {name}").as_bytes());
    uuid_text(d[..16].try_into().expect("16 of 32 bytes"), 5)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_look_like_uuids() {
        let u = new_uuid();
        assert_eq!((u.len(), u.as_bytes()[14]), (36, b'4'), "{u}");
        assert_ne!(u, new_uuid());
        assert_eq!(derived_uuid("pool", "p"), derived_uuid("pool", "p"));
    }
}
