//! Live management: the configuration the server runs, changed while
//! initiators stay connected. Every change, from a control method or from
//! SIGHUP's re-read of the file, is a new [`ServeConfig`] that must pass
//! [`ServeConfig::validate`]; [`Live::apply`] then makes the server run it
//! by the same steps: open added volumes, resize resized ones, let each
//! front-end reconcile its targets (which tells connected initiators in
//! their protocol's way), close removed volumes. What a running server
//! cannot change (limits, tuning, and what each front-end's `admit` says:
//! listen addresses other than NVMe's, the interfaces AoE listens on) is
//! refused with the reason, and then nothing has changed.
//!
//! The front-ends are a list of [`Frontend`]s, each asked the same; none
//! is named here.
//!
//! Front-ends read what changes through a lock-free load of an `Arc`'d
//! table (`arc_swap`): the LUN table of a SCSI target, an NVMe subsystem,
//! the login configuration, the exports of an AoE interface. The mutex here serialises changes only.

use crate::pool::Files;
use bw_block::{BackendKind, BackendSpec, Volume};
use bw_serve::config::{ConfigError, ServeConfig, VolumeConfig};
use bw_serve::frontend::{fixed_at_start, AccessState, Frontend, Frontends};
use bw_serve::refused::Refused;
use bw_serve::session::SessionInfo;
use bw_serve::Volumes;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// Hand each size watch's news to [`Live::size_news`], off the runtime's
/// threads (it reads the backend and writes the configuration), one at a
/// time, until shutdown.
pub async fn follow_sizes(live: Arc<Live>, mut news: tokio::sync::mpsc::UnboundedReceiver<SizeNews>, mut shutdown: bw_serve::Shutdown) {
    loop {
        let n = tokio::select! {
            _ = shutdown.wait() => return,
            n = news.recv() => match n { Some(n) => n, None => return },
        };
        let l = live.clone();
        if let Err(e) = tokio::task::spawn_blocking(move || l.size_news(&n)).await {
            log::error!("following a size change failed: {e}");
        }
    }
}

/// Reads the configuration again (the file and the flags given at start),
/// for SIGHUP.
pub type Reload = Box<dyn Fn() -> anyhow::Result<ServeConfig> + Send + Sync>;

pub struct Live {
    state: Mutex<State>,
    frontends: Frontends,
    reload: Option<Reload>,
    /// The configuration file each accepted change is written to
    /// (write-rename-fsync) before it is acknowledged.
    persist: Option<std::path::PathBuf>,
    /// Changes applied so far (the HTTP endpoint logs the calls that moved it).
    generation: std::sync::atomic::AtomicU64,
    started: std::time::Instant,
    /// Where the volumes' size watches send their news, once
    /// [`Live::watch_sizes`] has been called.
    size_news: std::sync::OnceLock<tokio::sync::mpsc::UnboundedSender<SizeNews>>,
    /// Numbers the watches, so news from an ended one is told apart.
    next_watch: std::sync::atomic::AtomicU64,
}

struct State {
    cfg: ServeConfig,
    volumes: HashMap<String, Volume>,
    /// The size watch of each volume whose backend has one (rbd).
    watches: HashMap<String, Watched>,
}

/// A volume's size watch ([`Volume::watch_size`]) in force.
struct Watched {
    /// Which watch, for [`SizeNews::watch`].
    id: u64,
    /// News sent and not yet handled: the callback sends again only once
    /// [`Live::size_news`] has cleared it, so a burst of header updates
    /// makes one look at the size, not a queue of them.
    pending: Arc<std::sync::atomic::AtomicBool>,
    _watch: bw_block::SizeWatch,
}

/// A volume's backend says its size may have changed (another gateway
/// resized the RBD image, or `rbd resize` did); [`Live::size_news`]
/// takes it from there.
#[derive(Debug)]
pub struct SizeNews {
    volume: String,
    watch: u64,
}

/// What a change does to the volumes; computed before anything is done.
#[derive(Debug, Default, PartialEq)]
pub struct VolumePlan {
    pub add: Vec<VolumeConfig>,
    pub remove: Vec<String>,
    /// Name and new size in bytes.
    pub resize: Vec<(String, u64)>,
}

/// The size a backend spec asks for, and the spec with no size.
fn split_size(spec: &BackendSpec) -> (Option<u64>, BackendSpec) {
    let mut rest = spec.clone();
    let size = match &mut rest.kind {
        BackendKind::Ram { size } => Some(std::mem::take(size)),
        BackendKind::File { size, .. } => size.take(),
        BackendKind::Rbd(t) => t.size.take(),
    };
    (size, rest)
}

/// The settings of every front-end that a running server cannot change
/// (each front-end's own are its [`Frontend::admit`]); `Err` names the
/// first that differs.
fn check_fixed(old: &ServeConfig, new: &ServeConfig) -> Result<(), Refused> {
    if old.limits != new.limits {
        return Err(fixed_at_start("[limits]"));
    }
    if old.tuning != new.tuning {
        return Err(fixed_at_start("[tuning]"));
    }
    Ok(())
}

/// The volume side of going from `old` to `new` (both valid).
pub fn plan_volumes(old: &ServeConfig, new: &ServeConfig) -> Result<VolumePlan, Refused> {
    let mut plan = VolumePlan::default();
    for v in &new.volumes {
        match old.volumes.iter().find(|o| o.name == v.name) {
            None => plan.add.push(v.clone()),
            Some(o) if o.backend == v.backend => {}
            Some(o) => {
                let (was, was_rest) = split_size(&o.backend);
                let (now, now_rest) = split_size(&v.backend);
                if was_rest != now_rest {
                    return Err(Refused::Invalid(format!(
                        "volume {}: backend {:?} became {:?}; only its size can change while serving (remove the volume and add it again)",
                        v.name,
                        o.backend.to_string(),
                        v.backend.to_string()
                    )));
                }
                if let Some(n) = now.filter(|n| Some(*n) != was) {
                    plan.resize.push((v.name.clone(), n));
                }
            }
        }
    }
    plan.remove = old.volumes.iter().filter(|o| !new.volumes.iter().any(|v| v.name == o.name)).map(|o| o.name.clone()).collect();
    Ok(plan)
}

/// Whether a change is confined to `[control] allowed_paths`: those of
/// the control methods are; SIGHUP's re-read of the administrator's own
/// file is not (as the file read at start is not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reach {
    Confined,
    Anywhere,
}

/// `[control] allowed_paths` (ServeConfig::check_allowed) for what a
/// change by a control method names anew: each new pool's directory, by
/// the configuration being served (so a change cannot widen its own
/// reach, nor allow a pool by being one), then each added volume's file,
/// where the pools the change makes count as pools (they passed first).
/// Nothing is made before this: `pool_create` leaves making the
/// directory to [`Live::apply_locked`].
fn check_reach(old: &ServeConfig, new: &ServeConfig, plan: &VolumePlan) -> Result<(), Refused> {
    for p in new.pools.iter().filter(|p| p.rbd.is_none() && !old.pools.iter().any(|o| o.path == p.path)) {
        old.check_allowed(std::path::Path::new(&p.path), &format!("pool {}'s directory", p.name)).map_err(Refused::Invalid)?;
    }
    let scope = ServeConfig { pools: new.pools.clone(), control: old.control.clone(), ..ServeConfig::default() };
    for v in &plan.add {
        match &v.backend.kind {
            BackendKind::File { path, .. } => scope.check_allowed(path, &format!("volume {}'s file", v.name)).map_err(Refused::Invalid)?,
            BackendKind::Rbd(t) => {
                // A ceph.conf is read by librados (and may name keyrings
                // and logs): confined as a file is. A pool's volume
                // carries its pool's conf, which pool_create checked
                // before it connected.
                let pools_conf = new.pools.iter().any(|p| p.rbd.is_some() && p.conf.as_deref().map(std::path::Path::new) == t.conf.as_deref());
                if let (Some(conf), false) = (&t.conf, pools_conf) {
                    old.check_allowed(conf, &format!("volume {}'s ceph.conf", v.name)).map_err(Refused::Invalid)?;
                }
            }
            BackendKind::Ram { .. } => {}
        }
    }
    Ok(())
}

/// What a volume's data is, to tell two volumes on one file apart from
/// two on two files: the file's identity once it exists
/// (bw_block::Backing, as [`Volume::backing`] says it of an open one),
/// else where it will be made.
#[derive(Debug, PartialEq)]
enum FileKey {
    Is(bw_block::Backing),
    WillBe(std::path::PathBuf),
}

fn file_key(path: &std::path::Path) -> Option<FileKey> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    match std::fs::metadata(path) {
        Ok(m) if m.file_type().is_block_device() => Some(FileKey::Is(bw_block::Backing::Device { rdev: m.rdev() })),
        Ok(m) => Some(FileKey::Is(bw_block::Backing::File { dev: m.dev(), ino: m.ino() })),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => resolved(path).map(FileKey::WillBe),
        // Opening it says why.
        Err(_) => None,
    }
}

/// `path` with its links, `.` and `..` resolved (a missing file by its
/// directory's), or None if its directory is missing too.
fn resolved(path: &std::path::Path) -> Option<std::path::PathBuf> {
    std::fs::canonicalize(path).ok().or_else(|| Some(std::fs::canonicalize(path.parent()?).ok()?.join(path.file_name()?)))
}

/// One file is one volume, whatever its spelling (`./`, `..`, a link, a
/// pool volume's file named from outside the pool): two volumes on one
/// file would each cache, reserve and (a pool's) delete it as its own.
/// Looked up before anything is opened; the volumes this change removes
/// no longer count.
///
/// A pool's directory holds that pool's volumes only: a file there named
/// as a volume of its own would be removed as a leftover when the pool
/// makes a volume of that name.
fn check_one_file_one_volume(st: &State, new: &ServeConfig, plan: &VolumePlan) -> Result<(), Refused> {
    let mut taken: Vec<(FileKey, &str)> = st
        .volumes
        .iter()
        .filter(|(name, _)| !plan.remove.contains(name))
        .filter_map(|(name, v)| Some((FileKey::Is(v.backing()?), name.as_str())))
        .collect();
    for v in &plan.add {
        let BackendKind::File { path, .. } = &v.backend.kind else { continue };
        let Some(key) = file_key(path) else { continue };
        if let Some((_, other)) = taken.iter().find(|(k, _)| *k == key) {
            return Err(Refused::AlreadyExists(format!("volume {}: {} is the file of volume {other} (one file is one volume)", v.name, path.display())));
        }
        taken.push((key, &v.name));
    }
    let pool_dirs: Vec<(std::path::PathBuf, &str)> =
        new.pools.iter().filter(|p| p.rbd.is_none()).filter_map(|p| Some((std::fs::canonicalize(&p.path).ok()?, p.name.as_str()))).collect();
    for v in plan.add.iter().filter(|v| v.pool.is_none()) {
        let BackendKind::File { path, .. } = &v.backend.kind else { continue };
        let Some(at) = resolved(path) else { continue };
        if let Some((_, pool)) = pool_dirs.iter().find(|(d, _)| at.starts_with(d)) {
            return Err(Refused::Invalid(format!("volume {}: {} is in pool {pool}'s directory, which holds that pool's volumes only (volume_create makes one)", v.name, path.display())));
        }
    }
    Ok(())
}

impl Live {
    pub fn new(cfg: ServeConfig, volumes: &Volumes, frontends: Frontends, reload: Option<Reload>) -> Live {
        let volumes = volumes.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        Live {
            state: Mutex::new(State { cfg, volumes, watches: HashMap::new() }),
            frontends,
            reload,
            persist: None,
            generation: Default::default(),
            started: std::time::Instant::now(),
            size_news: std::sync::OnceLock::new(),
            next_watch: Default::default(),
        }
    }

    /// Watch every volume's backend for size changes made elsewhere (now
    /// and each volume added later), for [`follow_sizes`] to hand to
    /// [`Live::size_news`]. Called once.
    pub fn watch_sizes(&self) -> tokio::sync::mpsc::UnboundedReceiver<SizeNews> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        if self.size_news.set(tx).is_err() {
            panic!("Live::watch_sizes called twice");
        }
        let mut st = self.lock();
        let volumes: Vec<Volume> = st.volumes.values().cloned().collect();
        for v in volumes {
            self.watch_size(&mut st, &v);
        }
        rx
    }

    /// Start `vol`'s size watch, if sizes are watched and its backend can.
    /// The callback runs on the backend's thread: it only sends the news
    /// (an unbounded channel's send never waits).
    fn watch_size(&self, st: &mut State, vol: &Volume) {
        let Some(tx) = self.size_news.get() else { return };
        let id = self.next_watch.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pending = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (p, tx, volume) = (pending.clone(), tx.clone(), vol.name().to_string());
        let changed = Box::new(move || {
            if !p.swap(true, std::sync::atomic::Ordering::AcqRel) {
                // Fails only once the control path is gone (shutdown).
                let _ = tx.send(SizeNews { volume: volume.clone(), watch: id });
            }
        });
        match vol.watch_size(changed) {
            Ok(Some(w)) => {
                st.watches.insert(vol.name().to_string(), Watched { id, pending, _watch: w });
            }
            Ok(None) => {}
            Err(e) => log::warn!("volume {}: resizes made by other clients will not be noticed: {e}", vol.name()),
        }
    }

    /// Whether `name`'s size is watched.
    pub fn size_watched(&self, name: &str) -> bool {
        self.lock().watches.contains_key(name)
    }

    /// A size watch's news: if the backend's size now differs from the
    /// volume's, serve the volume at the backend's size as a
    /// `volume_resize` to it would (hosts told, the configuration persisted
    /// whole first). A backend that shrank is followed too, with a
    /// warning: the end is gone from the image, and serving the old size
    /// would fail every request there with a cluster error instead of the
    /// range error hosts get now, and only after they were told the new
    /// size. Returns what changed.
    pub fn size_news(&self, news: &SizeNews) -> Vec<String> {
        let mut st = self.lock();
        match st.watches.get(&news.volume) {
            // Before the size is read: news after this read sends again.
            Some(w) if w.id == news.watch => w.pending.store(false, std::sync::atomic::Ordering::Release),
            // Sent before the volume was removed (or replaced): its watch
            // has ended.
            _ => {
                log::info!("volume {}: news from a size watch that has ended, ignored", news.volume);
                return Vec::new();
            }
        }
        let Some(vol) = st.volumes.get(&news.volume).cloned() else { return Vec::new() };
        let (was, now) = match vol.size_now() {
            Ok(now) => (vol.size_bytes(), now),
            Err(e) => {
                log::error!("volume {}: its backend changed, but its size cannot be read: {e}; serving {} bytes as before", news.volume, vol.size_bytes());
                return Vec::new();
            }
        };
        if now == was {
            return Vec::new();
        }
        if now < was {
            log::warn!(
                "volume {}: its backend shrank from {was} to {now} bytes outside this gateway; hosts are told, and requests past {now} bytes are refused as out of range (what was there is gone)",
                news.volume
            );
        }
        let mut new = st.cfg.clone();
        let r = crate::edit::volume_resize(&mut new, &news.volume, now).and_then(|()| self.apply_locked(&mut st, new, Reach::Anywhere));
        match r {
            Ok(log) => {
                log::info!("volume {}: resized outside this gateway from {was} to {now} bytes; now served at that size", news.volume);
                log
            }
            Err(e) => {
                log::error!("volume {}: resized outside this gateway from {was} to {now} bytes, but not followed (still served at {was}): {e}", news.volume);
                Vec::new()
            }
        }
    }

    /// Write every accepted change to `path` before acknowledging it.
    pub fn persist_to(mut self, path: std::path::PathBuf) -> Live {
        self.persist = Some(path);
        self
    }

    /// `save_config`: the configuration being served, written to `path`
    /// if `[control] allowed_paths` reaches it; its length.
    pub fn save_config(&self, path: &str) -> Result<usize, Refused> {
        let cfg = self.config();
        cfg.check_allowed(std::path::Path::new(path), "save_config's target").map_err(Refused::Invalid)?;
        let text = cfg.to_toml();
        bw_serve::config::write_private(path, &text).map_err(|e| Refused::io(format!("writing {path}"), &e))?;
        Ok(text.len())
    }

    /// How many changes were applied since start.
    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The configuration being served (what `save_config` writes).
    pub fn config(&self) -> ServeConfig {
        self.lock().cfg.clone()
    }

    /// Every open volume (to flush at shutdown).
    pub fn volumes(&self) -> Vec<Volume> {
        self.lock().volumes.values().cloned().collect()
    }

    pub fn uptime(&self) -> std::time::Duration {
        self.started.elapsed()
    }

    /// Edit a copy of the configuration with `edit` and serve the result.
    pub fn change(&self, edit: impl FnOnce(&mut ServeConfig) -> Result<(), Refused>) -> Result<Vec<String>, Refused> {
        self.change_files(|c, _, _| edit(c))
    }

    /// As [`Live::change`], for edits that make or remove files (pool
    /// volumes): `edit` sees the open volumes (to flush one before copying
    /// it) and lists its files; those it created are removed if the change
    /// is refused, those it dooms are removed once the change is served
    /// and persisted.
    pub fn change_files(&self, edit: impl FnOnce(&mut ServeConfig, &HashMap<String, Volume>, &mut Files) -> Result<(), Refused>) -> Result<Vec<String>, Refused> {
        let mut st = self.lock();
        let mut new = st.cfg.clone();
        let mut files = Files::default();
        let r = edit(&mut new, &st.volumes, &mut files).and_then(|()| self.apply_locked(&mut st, new, Reach::Confined));
        match &r {
            // Newest first: an RBD snapshot goes before its image.
            Err(_) => files.created.iter().rev().for_each(|f| {
                if let Err(e) = f.remove() {
                    log::warn!("undoing a refused change: {e}");
                }
            }),
            Ok(_) => files.remove_after.iter().for_each(|f| {
                if let Err(e) = f.remove() {
                    log::warn!("{e} (the volume is gone from the configuration; this is left over)");
                }
            }),
        }
        r
    }

    /// Serve `new` instead of the current configuration.
    pub fn apply(&self, new: ServeConfig) -> Result<Vec<String>, Refused> {
        let mut st = self.lock();
        self.apply_locked(&mut st, new, Reach::Anywhere)
    }

    /// SIGHUP: read the configuration again and serve it.
    pub fn reload(&self) -> Result<Vec<String>, Refused> {
        let Some(reload) = &self.reload else {
            return Err(Refused::Unsupported("this server was not started from a configuration it can read again".into()));
        };
        let new = reload().map_err(|e| match e.downcast_ref::<ConfigError>() {
            Some(ConfigError::Read { source, .. }) => Refused::by_kind(format!("{e:#}"), source),
            _ => Refused::Invalid(format!("{e:#}")),
        })?;
        self.apply(new)
    }

    /// Serve `new`. Everything that can refuse comes before anything is
    /// made (a pool's directory, a volume's file: opening `file:...,size=`
    /// creates it), so a refused change made nothing.
    fn apply_locked(&self, st: &mut State, new: ServeConfig, reach: Reach) -> Result<Vec<String>, Refused> {
        new.validate().map_err(|e| Refused::Invalid(e.to_string()))?;
        check_fixed(&st.cfg, &new)?;
        for f in &self.frontends {
            f.admit(&st.cfg, &new)?;
        }
        let plan = plan_volumes(&st.cfg, &new)?;
        if reach == Reach::Confined {
            check_reach(&st.cfg, &new, &plan)?;
        }
        check_one_file_one_volume(st, &new, &plan)?;
        for p in new.pools.iter().filter(|p| !st.cfg.pools.contains(p)) {
            crate::pool::ensure_dir(p)?;
        }
        // What can fail comes first: opening and resizing.
        let mut opened = Vec::new();
        for v in &plan.add {
            let vol = Volume::open(&v.name, &v.backend).map_err(|e| Refused::block(format!("volume {}", v.name), &e))?;
            opened.push(vol);
        }
        if new != st.cfg {
            if let Some(path) = &self.persist {
                bw_serve::config::write_atomic(path, &new.to_toml()).map_err(|e| Refused::by_kind(format!("persisting the configuration to {}: {e}; nothing changed", path.display()), &e))?;
            }
        }
        match self.serve_locked(st, new, plan, opened) {
            Err(e) => {
                // Served as before: the file says so again.
                if let Some(path) = &self.persist {
                    if let Err(w) = bw_serve::config::write_atomic(path, &st.cfg.to_toml()) {
                        log::error!("restoring {} after a refused change: {w}", path.display());
                    }
                }
                Err(e)
            }
            ok => ok,
        }
    }

    fn serve_locked(&self, st: &mut State, new: ServeConfig, plan: VolumePlan, opened: Vec<Volume>) -> Result<Vec<String>, Refused> {
        let mut log = Vec::new();
        let mut resized = HashSet::new();
        for (name, size) in &plan.resize {
            let vol = &st.volumes[name];
            let was = vol.size_bytes();
            vol.resize(*size).map_err(|e| Refused::block(format!("volume {name}: resize to {size} bytes"), &e))?;
            log.push(format!("volume {name}: resized from {was} to {size} bytes"));
            resized.insert(name.clone());
        }
        for v in opened {
            log.push(format!("volume {}: added ({} bytes)", v.name(), v.size_bytes()));
            bw_serve::metrics::global().watch_volume(&v);
            self.watch_size(st, &v);
            st.volumes.insert(v.name().to_string(), v);
        }
        // QoS limits take effect on the open volume at once, for every
        // front-end (the limiter is the volume's).
        for v in &new.volumes {
            let want = v.qos.unwrap_or_default();
            if let Some(vol) = st.volumes.get(&v.name).filter(|vol| vol.qos() != want) {
                vol.set_qos(want);
                log.push(format!("volume {}: QoS {want}", v.name));
            }
        }
        let volumes: Volumes = Arc::new(st.volumes.clone());
        for f in &self.frontends {
            log.extend(f.reconcile(&new, &volumes, &resized)?);
        }
        for name in &plan.remove {
            // Ended before the volume goes: no news of it after this.
            st.watches.remove(name);
            if let Some(v) = st.volumes.remove(name) {
                if let Err(e) = v.flush() {
                    log::warn!("volume {name}: flush before removal failed: {e}");
                }
                bw_serve::metrics::global().forget_volume(name);
                log.push(format!("volume {name}: removed"));
            }
        }
        if new != st.cfg {
            self.generation.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        st.cfg = new;
        for l in &log {
            log::info!("live change: {l}");
        }
        Ok(log)
    }

    /// Sessions and controllers of every front-end.
    pub fn sessions(&self) -> Vec<SessionInfo> {
        self.frontends.iter().filter_map(|f| f.sessions()).flatten().collect()
    }

    /// How many sessions each front-end that has sessions has, by its name.
    pub fn session_counts(&self) -> Vec<(&'static str, usize)> {
        self.frontends.iter().filter_map(|f| Some((f.name(), f.sessions()?.len()))).collect()
    }

    /// `ana_set`, `tpg_set`: the access state of `target`'s paths on the
    /// front-end named `protocol` (see [`Frontend::set_access`]), at run
    /// time.
    pub fn set_access(&self, protocol: &str, target: &str, group: Option<u32>, state: AccessState) -> Result<Vec<String>, Refused> {
        let f = self.frontend(protocol).ok_or_else(|| Refused::Unsupported(format!("{protocol} is not served")))?;
        Ok(vec![f.set_access(target, group, state)?])
    }

    fn frontend(&self, name: &str) -> Option<&dyn Frontend> {
        self.frontends.iter().find(|f| f.name() == name).map(|f| f.as_ref())
    }

    /// `drain`: every path of this gateway inaccessible (every NVMe ANA
    /// group, every iSCSI target port group: hosts are told, and move
    /// their I/O to other gateways), then wait up to `timeout` until no
    /// request is in flight on any volume. Returns what changed, the
    /// requests in flight when the states changed, and whether they all
    /// finished.
    pub fn drain(&self, timeout: std::time::Duration) -> Result<(Vec<String>, u64, bool), Refused> {
        // Before any path changes (a deadline past the clock's range made
        // the addition panic after every path was down).
        let deadline = std::time::Instant::now().checked_add(timeout).ok_or_else(|| Refused::Invalid(format!("a wait of {timeout:?} is past the clock's range")))?;
        let log: Vec<String> = self.frontends.iter().flat_map(|f| f.drain()).collect();
        let volumes = self.volumes();
        let busy = || volumes.iter().map(|v| v.in_flight()).sum::<u64>();
        let at_start = busy();
        while busy() > 0 {
            if std::time::Instant::now() >= deadline {
                return Ok((log, at_start, false));
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        Ok((log, at_start, true))
    }

    /// End the session `id` as `session_list` names it: `NAME:N`, where
    /// NAME is the front-end's.
    pub fn disconnect(&self, id: &str) -> Result<(), Refused> {
        let bad = || {
            let kinds: Vec<String> = self.frontends.iter().filter(|f| f.sessions().is_some()).map(|f| format!("{}:N", f.name())).collect();
            Refused::NotFound(format!("no session {id:?} (ids look like {}; see session_list)", kinds.join(" or ")))
        };
        let (name, n) = id.split_once(':').ok_or_else(bad)?;
        match self.frontend(name) {
            Some(f) if f.disconnect(n) => Ok(()),
            _ => Err(bad()),
        }
    }

    /// Current size of every volume, by name.
    pub fn volume_sizes(&self) -> Vec<(String, u64)> {
        let st = self.lock();
        let mut v: Vec<(String, u64)> = st.volumes.iter().map(|(k, v)| (k.clone(), v.size_bytes())).collect();
        v.sort();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edit;
    use bw_serve::aoe::AoeFrontend;
    use bw_serve::iscsi::IscsiFrontend;
    use bw_serve::nvme::NvmeFrontend;
    use bw_serve::start::not_started;

    fn spec(s: &str) -> BackendSpec {
        BackendSpec::parse(s).unwrap()
    }

    /// What a server that started no front-end refuses before anything
    /// changes: the settings fixed at start, and each front-end's.
    fn admit(old: &ServeConfig, new: &ServeConfig) -> Result<(), Refused> {
        check_fixed(old, new)?;
        not_started().iter().try_for_each(|f| f.admit(old, new))
    }
    use bw_serve::config::{IscsiLun, NvmeHost, NvmeNamespace};

    fn cfg() -> ServeConfig {
        toml::from_str(
            r#"
            [[volume]]
            name = "a"
            backend = "ram:1M"
            [[volume]]
            name = "b"
            backend = "file:/tmp/bw-live-b,size=2M"
            [iscsi]
            listen = ["127.0.0.1:3260"]
            [[iscsi.target]]
            iqn = "iqn.2026-11.org.example:t"
            luns = [{ lun = 0, volume = "a" }]
            [nvme]
            listen = ["127.0.0.1:4420"]
            [[nvme.subsystem]]
            nqn = "nqn.2026-11.org.example:s"
            namespaces = [{ nsid = 1, volume = "a" }]
        "#,
        )
        .unwrap()
    }

    #[test]
    fn volume_plans_add_remove_and_resize_but_no_other_backend_change() {
        let old = cfg();
        let mut new = old.clone();
        edit::volume_add(&mut new, VolumeConfig::new("c", spec("ram:4M"))).unwrap();
        edit::volume_resize(&mut new, "a", 8 << 20).unwrap();
        edit::volume_resize(&mut new, "b", 3 << 20).unwrap();
        assert_eq!(new.volumes[0].backend.to_string(), "ram:8M");
        assert_eq!(new.volumes[1].backend.to_string(), "file:/tmp/bw-live-b,size=3M");
        let p = plan_volumes(&old, &new).unwrap();
        assert_eq!(p.add.iter().map(|v| v.name.as_str()).collect::<Vec<_>>(), ["c"]);
        assert_eq!(p.resize, [("a".to_string(), 8 << 20), ("b".to_string(), 3 << 20)]);
        assert!(p.remove.is_empty());
        let mut moved = old.clone();
        moved.volumes[1].backend = spec("file:/tmp/elsewhere,size=2M");
        let e = plan_volumes(&old, &moved).unwrap_err();
        assert!(e.message().contains("only its size can change"), "{e}");
        assert!(matches!(e, Refused::Invalid(_)), "{e:?}");
        edit::volume_remove(&mut new, "b", false).unwrap();
        assert_eq!(plan_volumes(&old, &new).unwrap().remove, ["b"]);
        // Spelling the same size differently is no change.
        let mut same = old.clone();
        same.volumes[0].backend = spec("ram:1024K");
        assert_eq!(plan_volumes(&old, &same).unwrap(), VolumePlan::default());
    }

    #[test]
    fn nvme_ports_of_both_transports_change_live() {
        let old = cfg();
        let mut c = old.clone();
        let a: std::net::SocketAddr = "10.0.2.15:4420".parse().unwrap();
        edit::nvme_port_add(&mut c, a, true, None).unwrap();
        assert_eq!(c.nvme.as_ref().unwrap().rdma_listen, [a]);
        assert!(!c.nvme.as_ref().unwrap().listen.contains(&a), "an RDMA port is not a TCP one");
        // Listening for RDMA there is not a setting fixed at start.
        admit(&old, &c).unwrap();
        let e = edit::nvme_port_add(&mut c, a, true, None).unwrap_err();
        assert!(e.message().contains("NVMe/RDMA already listens"), "{e}");
        assert!(matches!(e, Refused::AlreadyExists(_)), "{e:?}");
        let e = edit::nvme_port_remove(&mut c, a, false).unwrap_err();
        assert!(e.message().contains("NVMe/TCP does not listen"), "{e}");
        assert!(matches!(e, Refused::NotFound(_)), "{e:?}");
        edit::nvme_port_remove(&mut c, a, true).unwrap();
        assert_eq!(c, old);
        // The discovery port still is.
        let mut d = old.clone();
        d.nvme.as_mut().unwrap().discovery_listen = Some("127.0.0.1:8009".parse().unwrap());
        let e = admit(&old, &d).unwrap_err();
        assert!(matches!(e, Refused::NeedsRestart(_)) && e.message().contains("nvme.discovery_listen"), "{e:?}");
    }

    #[test]
    fn a_volume_in_use_is_removed_only_with_force_and_takes_its_exports() {
        let mut c = cfg();
        let e = edit::volume_remove(&mut c, "a", false).unwrap_err();
        assert!(e.message().contains("iSCSI iqn.2026-11.org.example:t LUN 0") && e.message().contains("NVMe nqn.2026-11.org.example:s namespace 1"), "{e}");
        assert!(matches!(e, Refused::Busy(_)), "{e:?}");
        assert_eq!(c, cfg(), "a refused edit changes nothing");
        edit::volume_remove(&mut c, "a", true).unwrap();
        assert!(c.iscsi.as_ref().unwrap().targets[0].luns.is_empty());
        assert!(c.nvme.as_ref().unwrap().subsystems[0].namespaces.is_empty());
        c.validate().unwrap();
        assert!(edit::volume_remove(&mut c, "nope", true).is_err());
    }

    #[test]
    fn edits_of_luns_namespaces_acls_and_hosts() {
        let mut c = cfg();
        let t = "iqn.2026-11.org.example:t";
        let s = "nqn.2026-11.org.example:s";
        edit::iscsi_lun_add(&mut c, t, IscsiLun { lun: 1, volume: "b".into(), readonly: false }).unwrap();
        assert!(edit::iscsi_lun_add(&mut c, t, IscsiLun { lun: 1, volume: "a".into(), readonly: false }).is_err());
        assert!(edit::iscsi_lun_add(&mut c, "iqn.x:none", IscsiLun { lun: 1, volume: "a".into(), readonly: false }).is_err());
        edit::iscsi_lun_remove(&mut c, t, 0).unwrap();
        assert!(edit::iscsi_lun_remove(&mut c, t, 0).is_err());
        edit::iscsi_acl_add(&mut c, t, "iqn.2026-11.org.example:i").unwrap();
        assert!(edit::iscsi_acl_add(&mut c, t, "iqn.2026-11.org.example:i").is_err());
        edit::iscsi_acl_remove(&mut c, t, "iqn.2026-11.org.example:i").unwrap();
        edit::nvme_ns_add(&mut c, s, NvmeNamespace::new(2, "b".into(), false, 1)).unwrap();
        edit::nvme_ns_remove(&mut c, s, 1).unwrap();
        assert!(edit::nvme_ns_remove(&mut c, s, 1).is_err());
        edit::nvme_host_allow(&mut c, s, "nqn.2014-08.org.example:h").unwrap();
        let key = "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
        let h = NvmeHost { dhchap_secret: Some(bw_serve::config::Secret::new(key)), ..NvmeHost::new("nqn.2014-08.org.example:h") };
        edit::nvme_host_add(&mut c, s, h).unwrap();
        let sub = &c.nvme.as_ref().unwrap().subsystems[0];
        assert!(sub.allowed_hosts.is_empty() && sub.hosts.len() == 1, "keys replace the plain entry");
        edit::nvme_host_remove(&mut c, s, "nqn.2014-08.org.example:h").unwrap();
        assert!(edit::nvme_host_remove(&mut c, s, "nqn.2014-08.org.example:h").is_err());
        c.validate().unwrap();
    }

    #[test]
    fn settings_fixed_at_start_are_refused_by_name() {
        let old = cfg();
        let mut new = old.clone();
        new.iscsi.as_mut().unwrap().listen[0].set_port(3261);
        let e = admit(&old, &new).unwrap_err();
        assert!(matches!(e, Refused::NeedsRestart(_)) && e.message().contains("iscsi.listen"), "{e:?}");
        let mut new = old.clone();
        new.limits.max_sessions = 3;
        let e = admit(&old, &new).unwrap_err();
        assert!(matches!(e, Refused::NeedsRestart(_)) && e.message().contains("[limits]"), "{e:?}");
        let mut new = old.clone();
        edit::iscsi_lun_remove(&mut new, "iqn.2026-11.org.example:t", 0).unwrap();
        admit(&old, &new).unwrap();
    }

    /// A server with volumes and no front-ends: changes that need one are
    /// refused and change nothing; volume changes go through.
    #[test]
    fn apply_opens_resizes_and_closes_volumes_and_refuses_without_side_effects() {
        let mut c = ServeConfig::default();
        c.add_volume_flag("a=ram:1M").unwrap();
        let vols = bw_serve::start::open_volumes(&c).unwrap();
        let live = Live::new(c.clone(), &vols, not_started(), None);
        let log = live.change(|c| edit::volume_add(c, VolumeConfig::new("b", spec("ram:2M")))).unwrap();
        assert_eq!(log, ["volume b: added (2097152 bytes)"]);
        live.change(|c| edit::volume_resize(c, "b", 4 << 20)).unwrap();
        assert_eq!(live.volume_sizes(), [("a".to_string(), 1 << 20), ("b".to_string(), 4 << 20)]);
        let before = live.config();
        let e = live.change(|c| edit::volume_add(c, VolumeConfig::new("c", spec("file:/nonexistent/dir/x")))).unwrap_err();
        assert!(e.message().contains("volume c"), "{e}");
        assert!(matches!(e, Refused::NotFound(_)), "{e:?}");
        let e = live.change(|c| edit::iscsi_target_add(c, IscsiTarget {
            iqn: "iqn.2026-11.org.example:t".into(), portal_group_tag: 1, luns: vec![], allowed_initiators: vec![], chap: None, mutual_chap: None,
            target_port_group: 1, alua_state: Default::default(), relative_target_port: None,
        })).unwrap_err();
        assert!(e.message().contains("not being served"), "{e}");
        assert!(matches!(e, Refused::NeedsRestart(_)), "{e:?}");
        assert_eq!(live.config(), before);
        assert_eq!(live.volume_sizes().len(), 2);
        live.change(|c| edit::volume_remove(c, "b", false)).unwrap();
        assert_eq!(live.volume_sizes().len(), 1);
        assert!(live.reload().is_err(), "no configuration to read again");
    }

    /// One file is one volume, whatever the spelling; a control method's
    /// change reaches only [control] allowed_paths and the pools (a new
    /// pool's directory is checked before it is made); SIGHUP's is not
    /// confined. Each refusal made nothing.
    #[test]
    fn changes_name_only_reachable_files_and_each_file_once() {
        let d = std::env::temp_dir().join(format!("bw-live-reach-{}", std::process::id()));
        for sub in ["in", "out", "in/pool"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        std::fs::File::create(d.join("in/a.img")).unwrap().set_len(1 << 20).unwrap();
        std::fs::File::create(d.join("out/s.img")).unwrap().set_len(1 << 20).unwrap();
        let mut c = ServeConfig { control: Some(bw_serve::config::ControlConfig { allowed_paths: Some(vec![format!("{}/in", d.display())]) }), ..Default::default() };
        c.add_volume_flag(&format!("a=file:{}/in/a.img", d.display())).unwrap();
        c.pools.push(bw_serve::config::PoolConfig { name: "p".into(), path: format!("{}/in/pool", d.display()), ..Default::default() });
        let vols = bw_serve::start::open_volumes(&c).unwrap();
        let live = Live::new(c.clone(), &vols, not_started(), None);
        let file = |name: &str, path: String| VolumeConfig::new(name, spec(&format!("file:{path}")));
        let dn = d.display();
        for (name, path) in [("b", format!("{dn}/in/./a.img")), ("c", format!("{dn}/in/../in/a.img"))] {
            let e = live.change(|c| edit::volume_add(c, file(name, path.clone()))).unwrap_err();
            assert!(matches!(&e, Refused::AlreadyExists(m) if m.contains("volume a")), "{path}: {e:?}");
        }
        for path in [format!("{dn}/out/s.img"), format!("{dn}/in/../out/s.img"), format!("{dn}/out/new.img,size=1M")] {
            let e = live.change(|c| edit::volume_add(c, file("o", path.clone()))).unwrap_err();
            assert!(e.message().contains("allowed_paths"), "{path}: {e:?}");
        }
        let e = live.change(|c| crate::pool::pool_create(c, bw_serve::config::PoolConfig { name: "q".into(), path: format!("{dn}/out/q"), ..Default::default() }).map(drop)).unwrap_err();
        assert!(e.message().contains("allowed_paths"), "{e:?}");
        // A ceph.conf is read by librados: confined as a file is.
        let e = live.change(|c| edit::volume_add(c, VolumeConfig::new("r", spec(&format!("rbd:rbd/img,conf={dn}/out/ceph.conf"))))).unwrap_err();
        assert!(e.message().contains("volume r's ceph.conf") && e.message().contains("allowed_paths"), "{e:?}");
        let rbd_pool = bw_serve::config::PoolConfig { name: "cp".into(), rbd: Some("rbd".into()), conf: Some(format!("{dn}/out/ceph.conf")), ..Default::default() };
        let e = live.change(|c| crate::pool::pool_create(c, rbd_pool.clone()).map(drop)).unwrap_err();
        assert!(e.message().contains("pool cp's ceph.conf") && e.message().contains("allowed_paths"), "{e:?}");
        assert!(!d.join("out/q").exists() && !d.join("out/new.img").exists(), "a refused change made something");
        assert_eq!(live.config(), c);
        // Inside, a new file: taken (twice in one change: refused).
        live.change(|c| edit::volume_add(c, file("n", format!("{dn}/in/n.img,size=1M")))).unwrap();
        let e = live.change(|c| {
            edit::volume_add(c, file("m1", format!("{dn}/in/m.img,size=1M")))?;
            edit::volume_add(c, file("m2", format!("{dn}/in/./m.img,size=1M")))
        }).unwrap_err();
        assert!(matches!(&e, Refused::AlreadyExists(m) if m.contains("volume m1")), "{e:?}");
        assert!(!d.join("in/m.img").exists());
        // A pool's directory is the pool's: a file there is no volume of its own.
        let e = live.change(|c| edit::volume_add(c, file("y", format!("{dn}/in/pool/../pool/y.img,size=1M")))).unwrap_err();
        assert!(matches!(&e, Refused::Invalid(m) if m.contains("pool p's directory")), "{e:?}");
        assert!(!d.join("in/pool/y.img").exists());
        // The administrator's own file is not confined, but is one file one volume too.
        let mut new = live.config();
        edit::volume_add(&mut new, file("o", format!("{dn}/out/s.img"))).unwrap();
        live.apply(new.clone()).unwrap();
        edit::volume_add(&mut new, file("o2", format!("{dn}/out/./s.img"))).unwrap();
        assert!(matches!(live.apply(new), Err(Refused::AlreadyExists(_))));
        // A removed volume's file is free again in the same change.
        let mut new = live.config();
        edit::volume_remove(&mut new, "o", false).unwrap();
        edit::volume_add(&mut new, file("o3", format!("{dn}/out/./s.img"))).unwrap();
        live.apply(new).unwrap();
        drop(live);
        std::fs::remove_dir_all(&d).unwrap();
    }

    use bw_serve::config::IscsiTarget;

    fn aoe_export(interface: &str, shelf: u16, slot: u8, volume: &str) -> bw_serve::config::AoeExport {
        bw_serve::config::AoeExport {
            interface: interface.into(), volume: volume.into(), shelf, slot,
            config_string: String::new(), buffers: None, allow: vec![], broadcast_writes: false,
        }
    }

    /// AoE exports come and go on the interfaces served; one on another
    /// interface, or twice the same shelf.slot, is refused and changes
    /// nothing; SIGHUP's path (a whole new configuration) does the same.
    #[test]
    fn aoe_exports_are_added_and_removed_on_served_interfaces_only() {
        let mut c = ServeConfig::default();
        c.add_volume_flag("a=ram:1M").unwrap();
        c.add_volume_flag("b=ram:1M").unwrap();
        edit::aoe_export_add(&mut c, aoe_export("bw0", 1, 0, "a")).unwrap();
        let vols = bw_serve::start::open_volumes(&c).unwrap();
        let aoe = bw_serve::aoe::Handle::detached(&["bw0"]);
        aoe.reconcile(c.aoe.as_ref().unwrap(), &vols).unwrap();
        let live = Live::new(c.clone(), &vols, vec![Box::new(IscsiFrontend(None)), Box::new(NvmeFrontend(None)), Box::new(AoeFrontend(Some(aoe.clone())))], None);
        let log = live.change(|c| edit::aoe_export_add(c, aoe_export("bw0", 1, 1, "b"))).unwrap();
        assert_eq!(log, ["AoE e1.1 on bw0: added (volume b)"]);
        assert_eq!(aoe.exports(), [("bw0".into(), 1, 0, "a".into()), ("bw0".into(), 1, 1, "b".into())]);
        let before = live.config();
        let e = live.change(|c| edit::aoe_export_add(c, aoe_export("bw1", 1, 2, "b"))).unwrap_err();
        assert!(e.message().contains("not served on bw1") && e.message().contains("restart"), "{e}");
        assert!(matches!(e, Refused::NeedsRestart(_)), "{e:?}");
        let e = live.change(|c| edit::aoe_export_add(c, aoe_export("bw0", 1, 1, "a"))).unwrap_err();
        assert!(e.message().contains("already"), "{e}");
        assert!(matches!(e, Refused::AlreadyExists(_)), "{e:?}");
        let e = live.change(|c| edit::aoe_export_add(c, aoe_export("bw0", 2, 0, "nope"))).unwrap_err();
        assert!(e.message().contains("nope"), "{e}");
        assert!(matches!(e, Refused::Invalid(_)), "{e:?}");
        let e = live.change(|c| edit::volume_remove(c, "b", false)).unwrap_err();
        assert!(e.message().contains("AoE 1.1 on bw0"), "{e}");
        assert!(matches!(e, Refused::Busy(_)), "{e:?}");
        assert_eq!(live.config(), before);
        assert_eq!(aoe.exports().len(), 2);
        // A changed setting rebuilds the export; the other stays as it is.
        let mut new = live.config();
        new.aoe.as_mut().unwrap().exports[1].broadcast_writes = true;
        assert_eq!(live.apply(new).unwrap(), ["AoE e1.1 on bw0: added (volume b)", "AoE e1.1 on bw0: removed (volume b)"]);
        let log = live.change(|c| edit::aoe_export_remove(c, "bw0", 1, 0)).unwrap();
        assert_eq!(log, ["AoE e1.0 on bw0: removed (volume a)"]);
        assert!(live.change(|c| edit::aoe_export_remove(c, "bw0", 1, 0)).is_err());
        let log = live.change(|c| edit::volume_remove(c, "b", true)).unwrap();
        assert_eq!(log, ["AoE e1.1 on bw0: removed (volume b)", "volume b: removed"]);
        assert!(aoe.exports().is_empty());
        assert!(live.config().aoe.unwrap().exports.is_empty());
        // The interface still listens: an export can come back.
        live.change(|c| edit::aoe_export_add(c, aoe_export("bw0", 1, 0, "a"))).unwrap();
        assert_eq!(aoe.exports(), [("bw0".into(), 1, 0, "a".into())]);
    }

    /// A transport the control plane has never heard of: Live asks it
    /// what it asks any front-end, and routes its session ids and access
    /// states to it by its name.
    struct Carrier;

    impl Frontend for Carrier {
        fn name(&self) -> &'static str {
            "pigeon"
        }
        fn admit(&self, _old: &ServeConfig, new: &ServeConfig) -> Result<(), Refused> {
            match new.volumes.iter().any(|v| v.name == "far") {
                true => Err(Refused::NeedsRestart("pigeons do not fly that far".into())),
                false => Ok(()),
            }
        }
        fn reconcile(&self, new: &ServeConfig, _: &Volumes, resized: &HashSet<String>) -> Result<Vec<String>, Refused> {
            Ok(vec![format!("pigeon: {} volumes, {} resized", new.volumes.len(), resized.len())])
        }
        fn sessions(&self) -> Option<Vec<SessionInfo>> {
            Some(vec![SessionInfo::new("pigeon:7".into(), "pigeon", "loft", "roof".into(), "coop".into(), &Default::default())])
        }
        fn disconnect(&self, n: &str) -> bool {
            n == "7"
        }
        fn drain(&self) -> Vec<String> {
            vec!["pigeon: grounded".into()]
        }
        fn set_access(&self, target: &str, _: Option<u32>, state: AccessState) -> Result<String, Refused> {
            Ok(format!("pigeon {target}: {state:?}"))
        }
    }

    /// A backend another client resizes (as `rbd resize` does an RBD
    /// image): its size is `size`, and `watch` holds the callback of its
    /// one size watch while that is in force.
    #[derive(Default)]
    struct Elsewhere {
        size: std::sync::atomic::AtomicU64,
        watch: Mutex<Option<bw_block::SizeChanged>>,
    }

    struct ElsewhereDev(Arc<Elsewhere>, bw_block::DeviceInfo);

    impl bw_block::BlockDevice for ElsewhereDev {
        fn info(&self) -> &bw_block::DeviceInfo {
            &self.1
        }
        fn read_at(&self, buf: &mut [u8], _: u64) -> std::io::Result<()> {
            buf.fill(0);
            Ok(())
        }
        fn write_at(&self, _: &[u8], _: u64) -> std::io::Result<()> {
            Ok(())
        }
        fn flush(&self) -> std::io::Result<()> {
            Ok(())
        }
        fn discard(&self, _: u64, _: u64) -> std::io::Result<()> {
            Ok(())
        }
        fn write_zeroes(&self, _: u64, _: u64) -> std::io::Result<()> {
            Ok(())
        }
        /// As rbd: resizing to the size the store already has is a no-op.
        fn resize(&self, new_size: u64) -> std::io::Result<()> {
            self.0.size.store(new_size, std::sync::atomic::Ordering::Relaxed);
            Ok(())
        }
        fn size_now(&self) -> std::io::Result<u64> {
            Ok(self.0.size.load(std::sync::atomic::Ordering::Relaxed))
        }
        fn watch_size(&self, changed: bw_block::SizeChanged) -> std::io::Result<Option<u64>> {
            *self.0.watch.lock().unwrap() = Some(changed);
            Ok(Some(7))
        }
        fn unwatch_size(&self, id: u64) {
            assert_eq!(id, 7);
            *self.0.watch.lock().unwrap() = None;
        }
    }

    /// A resize made elsewhere, as the serve's control path gets it: the
    /// callback's news (a burst is one piece of news until it is handled),
    /// then the change a `volume_resize` to the store's size makes, with
    /// the front-ends told and the file written; a shrink is followed as
    /// well. Removing the volume ends its watch, and news sent before that
    /// changes nothing.
    #[test]
    fn a_resize_made_elsewhere_is_served_told_and_persisted_and_removal_ends_the_watch() {
        use std::os::unix::fs::DirBuilderExt;
        let store = Arc::new(Elsewhere::default());
        store.size.store(1 << 20, std::sync::atomic::Ordering::Relaxed);
        let info = bw_block::DeviceInfo { kind: bw_block::DeviceKind::Rbd, direct: false, size_bytes: 1 << 20, read_only: false, durability: bw_block::Durability::WriteThrough, supports_discard: false, memory_backed: false, remote: true, async_submit: false, description: "elsewhere".into() };
        let mut c = ServeConfig::default();
        c.add_volume_flag("a=ram:1M").unwrap();
        let vols: Volumes = Arc::new(HashMap::from([("a".to_string(), Volume::new("a", Box::new(ElsewhereDev(store.clone(), info))))]));
        // Persisting refuses a directory every user may write (/tmp).
        let dir = std::env::temp_dir().join(format!("bw-live-elsewhere-{}", std::process::id()));
        std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
        let file = dir.join("serve.toml");
        std::fs::write(&file, c.to_toml()).unwrap();
        let live = Live::new(c, &vols, vec![Box::new(Carrier)], None).persist_to(file.clone());
        drop(vols);
        let mut news = live.watch_sizes();
        assert!(live.size_watched("a"));
        let changed = || (store.watch.lock().unwrap().as_ref().expect("a watch in force"))();

        store.size.store(3 << 20, std::sync::atomic::Ordering::Relaxed);
        changed();
        changed();
        let n = news.try_recv().expect("news of the resize");
        assert!(news.try_recv().is_err(), "a burst of callbacks is one piece of news until handled");
        assert_eq!(live.size_news(&n), ["volume a: resized from 1048576 to 3145728 bytes", "pigeon: 1 volumes, 1 resized"]);
        assert_eq!(live.volume_sizes(), [("a".to_string(), 3 << 20)]);
        assert!(std::fs::read_to_string(&file).unwrap().contains("ram:3M"), "the new size is not persisted");
        // Handled: the next callback is news again; the same size is no change.
        changed();
        let n = news.try_recv().expect("news after the last was handled");
        assert!(live.size_news(&n).is_empty());

        store.size.store(2 << 20, std::sync::atomic::Ordering::Relaxed);
        changed();
        let n = news.try_recv().expect("news of the shrink");
        assert_eq!(live.size_news(&n), ["volume a: resized from 3145728 to 2097152 bytes", "pigeon: 1 volumes, 1 resized"]);
        assert!(std::fs::read_to_string(&file).unwrap().contains("ram:2M"));

        store.size.store(4 << 20, std::sync::atomic::Ordering::Relaxed);
        changed();
        let late = news.try_recv().expect("news sent before the removal");
        live.change(|c| edit::volume_remove(c, "a", true)).unwrap();
        assert!(store.watch.lock().unwrap().is_none(), "the removed volume's watch is still in force");
        assert!(!live.size_watched("a"));
        assert!(live.size_news(&late).is_empty());
        assert!(live.volume_sizes().is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_new_transport_is_asked_like_the_others_by_its_name() {
        let mut c = ServeConfig::default();
        c.add_volume_flag("a=ram:1M").unwrap();
        let vols = bw_serve::start::open_volumes(&c).unwrap();
        let live = Live::new(c.clone(), &vols, vec![Box::new(Carrier)], None);
        let log = live.change(|c| edit::volume_resize(c, "a", 2 << 20)).unwrap();
        assert_eq!(log, ["volume a: resized from 1048576 to 2097152 bytes", "pigeon: 1 volumes, 1 resized"]);
        let before = live.config();
        let e = live.change(|c| edit::volume_add(c, VolumeConfig::new("far", spec("ram:1M")))).unwrap_err();
        assert_eq!(e, Refused::NeedsRestart("pigeons do not fly that far".into()));
        assert_eq!((live.config(), live.volume_sizes().len()), (before, 1), "refused before any volume was opened");
        assert_eq!(live.sessions()[0].id, "pigeon:7");
        assert_eq!(live.session_counts(), [("pigeon", 1)]);
        live.disconnect("pigeon:7").unwrap();
        for id in ["pigeon:8", "iscsi:7", "7"] {
            let e = live.disconnect(id).unwrap_err();
            assert!(matches!(&e, Refused::NotFound(m) if m.contains("pigeon:N")), "{id}: {e:?}");
        }
        assert_eq!(live.drain(std::time::Duration::ZERO).unwrap(), (vec!["pigeon: grounded".to_string()], 0, true));
        assert_eq!(live.set_access("pigeon", "coop", None, AccessState::Standby).unwrap(), ["pigeon coop: Standby"]);
        assert!(matches!(live.set_access("iscsi", "t", None, AccessState::Standby), Err(Refused::Unsupported(_))));
    }

    #[test]
    fn without_aoe_at_start_an_export_is_refused() {
        let mut c = ServeConfig::default();
        c.add_volume_flag("a=ram:1M").unwrap();
        let vols = bw_serve::start::open_volumes(&c).unwrap();
        let live = Live::new(c.clone(), &vols, not_started(), None);
        let e = live.change(|c| edit::aoe_export_add(c, aoe_export("eth0", 0, 0, "a"))).unwrap_err();
        assert!(e.message().contains("not served on eth0") && e.message().contains("no interface"), "{e}");
        assert!(matches!(e, Refused::NeedsRestart(_)), "{e:?}");
        assert_eq!(live.config(), c);
    }
}
