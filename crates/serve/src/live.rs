//! Live management: the configuration the server runs, changed while
//! initiators stay connected. Every change, from a control method or from
//! SIGHUP's re-read of the file, is a new [`ServeConfig`] that must pass
//! [`ServeConfig::validate`]; [`Live::apply`] then makes the server run it
//! by the same steps: open added volumes, resize resized ones, let each
//! front-end reconcile its targets (which tells connected initiators in
//! their protocol's way), close removed volumes. What a running server
//! cannot change (listen addresses other than NVMe/TCP's, limits, tuning, the interfaces AoE
//! listens on) is refused with the reason, and then nothing has changed.
//!
//! Front-ends read what changes through a lock-free load of an `Arc`'d
//! table (`arc_swap`): the LUN table of a SCSI target, an NVMe subsystem,
//! the login configuration, the exports of an AoE interface. The mutex here serialises changes only.

use crate::config::{ServeConfig, VolumeConfig};
use crate::session::SessionInfo;
use crate::{aoe, iscsi, nvme, Volumes};
use bw_block::{BackendKind, BackendSpec, Volume};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// The running front-ends that take live changes.
#[derive(Clone, Default)]
pub struct Frontends {
    pub iscsi: Option<iscsi::Handle>,
    pub nvme: Option<nvme::Handle>,
    pub aoe: Option<aoe::Handle>,
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
}

/// Pool objects (files, RBD images and snapshots) a change makes or
/// unmakes beside the configuration: made ones are removed if the change
/// is refused; doomed ones once it is served.
#[derive(Default)]
pub struct Files {
    pub created: Vec<crate::pool::PoolObject>,
    pub remove_after: Vec<crate::pool::PoolObject>,
}

struct State {
    cfg: ServeConfig,
    volumes: HashMap<String, Volume>,
}

/// A change refused: nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<String> for Refused {
    fn from(s: String) -> Refused {
        Refused(s)
    }
}

impl From<&str> for Refused {
    fn from(s: &str) -> Refused {
        Refused(s.into())
    }
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

/// The settings a running server cannot change, compared; `Err` names
/// the first that differs.
fn check_fixed(old: &ServeConfig, new: &ServeConfig) -> Result<(), Refused> {
    let restart = |what: &str| Err(Refused(format!("{what} cannot change while serving: restart blockwire serve for that")));
    if old.limits != new.limits {
        return restart("[limits]");
    }
    if old.tuning != new.tuning {
        return restart("[tuning]");
    }
    let listen = |c: &ServeConfig| c.iscsi.as_ref().map(|i| i.listen.clone()).unwrap_or_default();
    if listen(old) != listen(new) {
        return restart("iscsi.listen");
    }
    // (nvme.listen and nvme.rdma_listen change live: nvme_port_add,
    // nvme_port_remove.)
    let nvme = |c: &ServeConfig| c.nvme.as_ref().map(|n| (n.discovery_listen, n.cntlid_range)).unwrap_or_default();
    if nvme(old) != nvme(new) {
        return restart("nvme.discovery_listen or nvme.cntlid_range");
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
                let parse = |b: &str| BackendSpec::parse(b).map_err(|e| Refused(format!("volume {}: {e}", v.name)));
                let (was, was_rest) = split_size(&parse(&o.backend)?);
                let (now, now_rest) = split_size(&parse(&v.backend)?);
                if was_rest != now_rest {
                    return Err(Refused(format!(
                        "volume {}: backend {:?} became {:?}; only its size can change while serving (remove the volume and add it again)",
                        v.name, o.backend, v.backend
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

impl Live {
    pub fn new(cfg: ServeConfig, volumes: &Volumes, frontends: Frontends, reload: Option<Reload>) -> Live {
        let volumes = volumes.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        Live { state: Mutex::new(State { cfg, volumes }), frontends, reload, persist: None, generation: Default::default(), started: std::time::Instant::now() }
    }

    /// Write every accepted change to `path` before acknowledging it.
    pub fn persist_to(mut self, path: std::path::PathBuf) -> Live {
        self.persist = Some(path);
        self
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
        let r = edit(&mut new, &st.volumes, &mut files).and_then(|()| self.apply_locked(&mut st, new));
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
        self.apply_locked(&mut st, new)
    }

    /// SIGHUP: read the configuration again and serve it.
    pub fn reload(&self) -> Result<Vec<String>, Refused> {
        let Some(reload) = &self.reload else {
            return Err("this server was not started from a configuration it can read again".into());
        };
        let new = reload().map_err(|e| Refused(format!("{e:#}")))?;
        self.apply(new)
    }

    fn apply_locked(&self, st: &mut State, new: ServeConfig) -> Result<Vec<String>, Refused> {
        new.validate().map_err(|e| Refused(e.to_string()))?;
        check_fixed(&st.cfg, &new)?;
        let has_targets = |c: &ServeConfig| c.iscsi.as_ref().is_some_and(|i| !i.targets.is_empty());
        if self.frontends.iscsi.is_none() && has_targets(&new) && !has_targets(&st.cfg) {
            return Err("iSCSI is not being served (no listen address at start): restart with one to add targets".into());
        }
        let has_subsystems = |c: &ServeConfig| c.nvme.as_ref().is_some_and(|n| !n.subsystems.is_empty());
        if self.frontends.nvme.is_none() && has_subsystems(&new) && !has_subsystems(&st.cfg) {
            return Err("NVMe/TCP is not being served (no listen address at start): restart with one to add subsystems".into());
        }
        let served = self.frontends.aoe.as_ref().map(|h| h.interfaces()).unwrap_or_default();
        if let Some(e) = new.aoe.iter().flat_map(|a| &a.exports).find(|e| !served.contains(&e.interface)) {
            return Err(Refused(aoe::not_served(&e.interface, &served)));
        }
        for p in new.pools.iter().filter(|p| !st.cfg.pools.contains(p)) {
            crate::pool::ensure_dir(p)?;
        }
        let plan = plan_volumes(&st.cfg, &new)?;
        // What can fail comes first: opening and resizing.
        let mut opened = Vec::new();
        for v in &plan.add {
            let spec = BackendSpec::parse(&v.backend).map_err(|e| Refused(format!("volume {}: {e}", v.name)))?;
            let vol = Volume::open(&v.name, &spec).map_err(|e| Refused(format!("volume {}: {e}", v.name)))?;
            opened.push(vol);
        }
        if new != st.cfg {
            if let Some(path) = &self.persist {
                crate::config::write_atomic(path, &new.to_toml()).map_err(|e| Refused(format!("persisting the configuration to {}: {e}; nothing changed", path.display())))?;
            }
        }
        match self.serve_locked(st, new, plan, opened) {
            Err(e) => {
                // Served as before: the file says so again.
                if let Some(path) = &self.persist {
                    if let Err(w) = crate::config::write_atomic(path, &st.cfg.to_toml()) {
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
            vol.resize(*size).map_err(|e| Refused(format!("volume {name}: resize to {size} bytes: {e}")))?;
            log.push(format!("volume {name}: resized from {was} to {size} bytes"));
            resized.insert(name.clone());
        }
        for v in opened {
            log.push(format!("volume {}: added ({} bytes)", v.name(), v.size_bytes()));
            st.volumes.insert(v.name().to_string(), v);
        }
        let volumes: Volumes = Arc::new(st.volumes.clone());
        if let Some(h) = &self.frontends.iscsi {
            let cfg = new.iscsi.clone().unwrap_or_default();
            log.extend(h.reconcile(&cfg, &volumes, &resized).map_err(|e| Refused(format!("{e:#}")))?);
        }
        if let Some(h) = &self.frontends.nvme {
            let cfg = new.nvme.clone().unwrap_or_default();
            log.extend(h.reconcile(&cfg, &volumes, &resized).map_err(|e| Refused(format!("{e:#}")))?);
        }
        if let Some(h) = &self.frontends.aoe {
            let cfg = new.aoe.clone().unwrap_or_default();
            log.extend(h.reconcile(&cfg, &volumes).map_err(|e| Refused(format!("{e:#}")))?);
        }
        for name in &plan.remove {
            if let Some(v) = st.volumes.remove(name) {
                if let Err(e) = v.flush() {
                    log::warn!("volume {name}: flush before removal failed: {e}");
                }
                crate::metrics::global().forget_volume(name);
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
        let mut v = Vec::new();
        if let Some(h) = &self.frontends.iscsi {
            v.extend(h.sessions());
        }
        if let Some(h) = &self.frontends.nvme {
            v.extend(h.sessions());
        }
        v
    }

    /// `ana_set`: see [`nvme::Handle::ana_set`].
    pub fn ana_set(&self, nqn: &str, group: Option<u32>, state: bw_nvme::ana::AnaState) -> Result<Vec<String>, Refused> {
        let h = self.frontends.nvme.as_ref().ok_or("NVMe/TCP is not served")?;
        let changed = h.ana_set(nqn, group, state)?;
        let what = group.map_or("every ANA group".to_string(), |g| format!("ANA group {g}"));
        Ok(vec![if changed { format!("nvme {nqn}: {what} {state:?}; hosts notified") } else { format!("nvme {nqn}: {what} already {state:?}") }])
    }

    /// `tpg_set`: see [`iscsi::Handle::tpg_set`].
    pub fn tpg_set(&self, iqn: &str, group: Option<u16>, state: bw_scsi::AluaState) -> Result<Vec<String>, Refused> {
        let h = self.frontends.iscsi.as_ref().ok_or("iSCSI is not served")?;
        let changed = h.tpg_set(iqn, group, state)?;
        Ok(vec![if changed { format!("iscsi {iqn}: {state:?}; sessions notified") } else { format!("iscsi {iqn}: already {state:?}") }])
    }

    /// `drain`: every NVMe ANA group of this gateway inaccessible and every
    /// iSCSI target port group unavailable (hosts are told, and move their
    /// I/O to other gateways), then wait up to `timeout` until no request
    /// is in flight on any volume. Returns what changed, the requests in
    /// flight when the states changed, and whether they all finished.
    pub fn drain(&self, timeout: std::time::Duration) -> Result<(Vec<String>, u64, bool), Refused> {
        // Before any path changes (a deadline past the clock's range made
        // the addition below panic after every path was down).
        let deadline = std::time::Instant::now().checked_add(timeout).ok_or_else(|| Refused(format!("a wait of {timeout:?} is past the clock's range")))?;
        let mut log = Vec::new();
        if let Some(h) = &self.frontends.nvme {
            log.extend(h.drain().into_iter().map(|n| format!("nvme {n}: every ANA group Inaccessible; hosts notified")));
        }
        if let Some(h) = &self.frontends.iscsi {
            log.extend(h.drain().into_iter().map(|n| format!("iscsi {n}: Unavailable; sessions notified")));
        }
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

    /// End the session `id` as `session_list` names it.
    pub fn disconnect(&self, id: &str) -> Result<(), Refused> {
        let bad = || Refused(format!("no session {id:?} (ids look like iscsi:N or nvme:N; see session_list)"));
        let (proto, n) = id.split_once(':').ok_or_else(bad)?;
        let found = match (proto, &self.frontends.iscsi, &self.frontends.nvme) {
            ("iscsi", Some(h), _) => h.disconnect(n.parse().map_err(|_| bad())?),
            ("nvme", _, Some(h)) => h.disconnect(n.parse().map_err(|_| bad())?),
            _ => false,
        };
        if found { Ok(()) } else { Err(bad()) }
    }

    /// Current size of every volume, by name.
    pub fn volume_sizes(&self) -> Vec<(String, u64)> {
        let st = self.lock();
        let mut v: Vec<(String, u64)> = st.volumes.iter().map(|(k, v)| (k.clone(), v.size_bytes())).collect();
        v.sort();
        v
    }
}

/// Configuration edits, one per control method: each changes a copy of
/// the configuration or says why not; [`Live::change`] validates and
/// serves the result.
pub mod edit {
    use super::Refused;
    use crate::config::*;

    fn iscsi(c: &mut ServeConfig) -> &mut IscsiConfig {
        c.iscsi.get_or_insert_with(Default::default)
    }

    fn nvme(c: &mut ServeConfig) -> &mut NvmeConfig {
        c.nvme.get_or_insert_with(Default::default)
    }

    pub fn target<'a>(c: &'a mut ServeConfig, iqn: &str) -> Result<&'a mut IscsiTarget, Refused> {
        iscsi(c).targets.iter_mut().find(|t| t.iqn == iqn).ok_or_else(|| Refused(format!("no iSCSI target {iqn}")))
    }

    pub fn subsystem<'a>(c: &'a mut ServeConfig, nqn: &str) -> Result<&'a mut NvmeSubsystem, Refused> {
        nvme(c).subsystems.iter_mut().find(|s| s.nqn == nqn).ok_or_else(|| Refused(format!("no NVMe subsystem {nqn}")))
    }

    /// Where a volume is exported, for refusing its removal.
    pub fn users(c: &ServeConfig, volume: &str) -> Vec<String> {
        let mut v = Vec::new();
        for t in c.iscsi.iter().flat_map(|i| &i.targets) {
            v.extend(t.luns.iter().filter(|l| l.volume == volume).map(|l| format!("iSCSI {} LUN {}", t.iqn, l.lun)));
        }
        for s in c.nvme.iter().flat_map(|n| &n.subsystems) {
            v.extend(s.namespaces.iter().filter(|n| n.volume == volume).map(|n| format!("NVMe {} namespace {}", s.nqn, n.nsid)));
        }
        for e in c.aoe.iter().flat_map(|a| &a.exports) {
            if e.volume == volume {
                v.push(format!("AoE {}.{} on {}", e.shelf, e.slot, e.interface));
            }
        }
        v
    }

    pub fn volume_add(c: &mut ServeConfig, v: VolumeConfig) -> Result<(), Refused> {
        if v.pool.is_some() || v.snapshot_of.is_some() || v.clone_of.is_some() || v.thick {
            return Err(Refused(format!("volume {}: pool volumes are made by volume_create, volume_snapshot and volume_clone", v.name)));
        }
        if c.volumes.iter().any(|o| o.name == v.name) {
            return Err(Refused(format!("volume {} exists", v.name)));
        }
        c.volumes.push(v);
        Ok(())
    }

    /// Without `force`, a volume still exported is not removed; with it,
    /// its LUNs, namespaces and AoE exports go first.
    pub fn volume_remove(c: &mut ServeConfig, name: &str, force: bool) -> Result<(), Refused> {
        match c.volumes.iter().find(|v| v.name == name) {
            None => return Err(Refused(format!("no volume {name}"))),
            Some(v) if v.pool.is_some() => return Err(Refused(format!("volume {name} is in pool {}: volume_delete removes it and its file", v.pool.as_deref().unwrap_or_default()))),
            Some(_) => {}
        }
        let users = users(c, name);
        if !users.is_empty() && !force {
            return Err(Refused(format!("volume {name} is in use ({}): remove those first, or pass force", users.join(", "))));
        }
        for t in c.iscsi.iter_mut().flat_map(|i| &mut i.targets) {
            t.luns.retain(|l| l.volume != name);
        }
        for s in c.nvme.iter_mut().flat_map(|n| &mut n.subsystems) {
            s.namespaces.retain(|n| n.volume != name);
        }
        if let Some(a) = &mut c.aoe {
            a.exports.retain(|e| e.volume != name);
        }
        c.volumes.retain(|v| v.name != name);
        Ok(())
    }

    /// The backend spec with its size set to `size` bytes.
    pub fn volume_resize(c: &mut ServeConfig, name: &str, size: u64) -> Result<(), Refused> {
        let v = c.volumes.iter_mut().find(|v| v.name == name).ok_or_else(|| Refused(format!("no volume {name}")))?;
        if v.snapshot_of.is_some() {
            return Err(Refused(format!("volume {name} is a snapshot: its size is the size it was taken at")));
        }
        let mut spec = bw_block::BackendSpec::parse(&v.backend).map_err(Refused)?;
        match &mut spec.kind {
            bw_block::BackendKind::Ram { size: s } => *s = size,
            bw_block::BackendKind::File { size: s, .. } => *s = Some(size),
            bw_block::BackendKind::Rbd(t) => t.size = Some(size),
        }
        v.backend = spec.to_string();
        Ok(())
    }

    pub fn iscsi_target_add(c: &mut ServeConfig, t: IscsiTarget) -> Result<(), Refused> {
        if iscsi(c).targets.iter().any(|o| o.iqn == t.iqn) {
            return Err(Refused(format!("iSCSI target {} exists", t.iqn)));
        }
        iscsi(c).targets.push(t);
        Ok(())
    }

    pub fn iscsi_target_remove(c: &mut ServeConfig, iqn: &str) -> Result<(), Refused> {
        target(c, iqn)?;
        iscsi(c).targets.retain(|t| t.iqn != iqn);
        Ok(())
    }

    pub fn iscsi_lun_add(c: &mut ServeConfig, iqn: &str, lun: IscsiLun) -> Result<(), Refused> {
        let t = target(c, iqn)?;
        if t.luns.iter().any(|l| l.lun == lun.lun) {
            return Err(Refused(format!("iSCSI target {iqn} has a LUN {}", lun.lun)));
        }
        t.luns.push(lun);
        Ok(())
    }

    pub fn iscsi_lun_remove(c: &mut ServeConfig, iqn: &str, lun: u64) -> Result<(), Refused> {
        let t = target(c, iqn)?;
        let n = t.luns.len();
        t.luns.retain(|l| l.lun != lun);
        if t.luns.len() == n {
            return Err(Refused(format!("iSCSI target {iqn} has no LUN {lun}")));
        }
        Ok(())
    }

    pub fn iscsi_acl_add(c: &mut ServeConfig, iqn: &str, initiator: &str) -> Result<(), Refused> {
        let t = target(c, iqn)?;
        if t.allowed_initiators.iter().any(|i| i == initiator) {
            return Err(Refused(format!("{initiator} is already allowed on {iqn}")));
        }
        t.allowed_initiators.push(initiator.into());
        Ok(())
    }

    /// An initiator taken off the list: its sessions end (and with the
    /// list empty, the target is open to anyone again).
    pub fn iscsi_acl_remove(c: &mut ServeConfig, iqn: &str, initiator: &str) -> Result<(), Refused> {
        let t = target(c, iqn)?;
        let n = t.allowed_initiators.len();
        t.allowed_initiators.retain(|i| i != initiator);
        if t.allowed_initiators.len() == n {
            return Err(Refused(format!("{initiator} is not on the list of {iqn}")));
        }
        Ok(())
    }

    pub fn iscsi_chap_set(c: &mut ServeConfig, iqn: &str, chap: Option<Credentials>, mutual_chap: Option<Credentials>) -> Result<(), Refused> {
        let t = target(c, iqn)?;
        t.chap = chap;
        t.mutual_chap = mutual_chap;
        Ok(())
    }

    /// An export on an interface AoE is served on (see [`super::Live::change`]).
    pub fn aoe_export_add(c: &mut ServeConfig, e: AoeExport) -> Result<(), Refused> {
        let a = c.aoe.get_or_insert_with(Default::default);
        if a.exports.iter().any(|o| o.interface == e.interface && o.shelf == e.shelf && o.slot == e.slot) {
            return Err(Refused(format!("AoE e{}.{} is exported on {} already", e.shelf, e.slot, e.interface)));
        }
        a.exports.push(e);
        Ok(())
    }

    pub fn aoe_export_remove(c: &mut ServeConfig, interface: &str, shelf: u16, slot: u8) -> Result<(), Refused> {
        let a = c.aoe.get_or_insert_with(Default::default);
        let n = a.exports.len();
        a.exports.retain(|e| !(e.interface == interface && e.shelf == shelf && e.slot == slot));
        if a.exports.len() == n {
            return Err(Refused(format!("no AoE export e{shelf}.{slot} on {interface}")));
        }
        Ok(())
    }

    pub fn nvme_subsystem_add(c: &mut ServeConfig, s: NvmeSubsystem) -> Result<(), Refused> {
        if nvme(c).subsystems.iter().any(|o| o.nqn == s.nqn) {
            return Err(Refused(format!("NVMe subsystem {} exists", s.nqn)));
        }
        nvme(c).subsystems.push(s);
        Ok(())
    }

    pub fn nvme_subsystem_remove(c: &mut ServeConfig, nqn: &str) -> Result<(), Refused> {
        subsystem(c, nqn)?;
        nvme(c).subsystems.retain(|s| s.nqn != nqn);
        Ok(())
    }

    pub fn nvme_ns_add(c: &mut ServeConfig, nqn: &str, ns: NvmeNamespace) -> Result<(), Refused> {
        let s = subsystem(c, nqn)?;
        if s.namespaces.iter().any(|n| n.nsid == ns.nsid) {
            return Err(Refused(format!("NVMe {nqn} has a namespace {}", ns.nsid)));
        }
        s.namespaces.push(ns);
        s.namespaces.sort_by_key(|n| n.nsid);
        Ok(())
    }

    pub fn nvme_ns_remove(c: &mut ServeConfig, nqn: &str, nsid: u32) -> Result<(), Refused> {
        let s = subsystem(c, nqn)?;
        let n = s.namespaces.len();
        s.namespaces.retain(|n| n.nsid != nsid);
        if s.namespaces.len() == n {
            return Err(Refused(format!("NVMe {nqn} has no namespace {nsid}")));
        }
        Ok(())
    }

    /// A host with keys authenticates (DH-HMAC-CHAP); without, it is only
    /// allowed. Adding a host again replaces its keys.
    pub fn nvme_host_add(c: &mut ServeConfig, nqn: &str, host: NvmeHost) -> Result<(), Refused> {
        let s = subsystem(c, nqn)?;
        s.hosts.retain(|h| h.nqn != host.nqn);
        s.allowed_hosts.retain(|h| *h != host.nqn);
        s.hosts.push(host);
        Ok(())
    }

    /// The listen list of NVMe/TCP (`rdma` false) or NVMe/RDMA, and its name.
    fn ports(c: &mut ServeConfig, rdma: bool) -> (&mut Vec<std::net::SocketAddr>, &'static str) {
        let n = nvme(c);
        if rdma {
            (&mut n.rdma_listen, "NVMe/RDMA")
        } else {
            (&mut n.listen, "NVMe/TCP")
        }
    }

    /// Listen for NVMe/TCP (or NVMe/RDMA) at `addr` too.
    pub fn nvme_port_add(c: &mut ServeConfig, addr: std::net::SocketAddr, rdma: bool) -> Result<(), Refused> {
        let (ports, name) = ports(c, rdma);
        if ports.contains(&addr) {
            return Err(Refused(format!("{name} already listens on {addr}")));
        }
        ports.push(addr);
        Ok(())
    }

    /// Stop listening at `addr`; its connections close.
    pub fn nvme_port_remove(c: &mut ServeConfig, addr: std::net::SocketAddr, rdma: bool) -> Result<(), Refused> {
        let (ports, name) = ports(c, rdma);
        let before = ports.len();
        ports.retain(|a| *a != addr);
        if ports.len() == before {
            return Err(Refused(format!("{name} does not listen on {addr} (status lists the ports)")));
        }
        Ok(())
    }

    pub fn nvme_host_allow(c: &mut ServeConfig, nqn: &str, host: &str) -> Result<(), Refused> {
        let s = subsystem(c, nqn)?;
        if s.allowed_hosts.iter().any(|h| h == host) || s.hosts.iter().any(|h| h.nqn == host) {
            return Err(Refused(format!("{host} is already allowed on {nqn}")));
        }
        s.allowed_hosts.push(host.into());
        Ok(())
    }

    /// The host's controllers end; with no host listed any more, the
    /// subsystem is open to every host.
    pub fn nvme_host_remove(c: &mut ServeConfig, nqn: &str, host: &str) -> Result<(), Refused> {
        let s = subsystem(c, nqn)?;
        let n = s.allowed_hosts.len() + s.hosts.len();
        s.allowed_hosts.retain(|h| h != host);
        s.hosts.retain(|h| h.nqn != host);
        if s.allowed_hosts.len() + s.hosts.len() == n {
            return Err(Refused(format!("{host} is not listed on {nqn}")));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{IscsiLun, NvmeHost, NvmeNamespace};

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
        edit::volume_add(&mut new, VolumeConfig { name: "c".into(), backend: "ram:4M".into(), ..Default::default() }).unwrap();
        edit::volume_resize(&mut new, "a", 8 << 20).unwrap();
        edit::volume_resize(&mut new, "b", 3 << 20).unwrap();
        assert_eq!(new.volumes[0].backend, "ram:8M");
        assert_eq!(new.volumes[1].backend, "file:/tmp/bw-live-b,size=3M");
        let p = plan_volumes(&old, &new).unwrap();
        assert_eq!(p.add.iter().map(|v| v.name.as_str()).collect::<Vec<_>>(), ["c"]);
        assert_eq!(p.resize, [("a".to_string(), 8 << 20), ("b".to_string(), 3 << 20)]);
        assert!(p.remove.is_empty());
        let mut moved = old.clone();
        moved.volumes[1].backend = "file:/tmp/elsewhere,size=2M".into();
        let e = plan_volumes(&old, &moved).unwrap_err();
        assert!(e.0.contains("only its size can change"), "{e}");
        edit::volume_remove(&mut new, "b", false).unwrap();
        assert_eq!(plan_volumes(&old, &new).unwrap().remove, ["b"]);
        // Spelling the same size differently is no change.
        let mut same = old.clone();
        same.volumes[0].backend = "ram:1024K".into();
        assert_eq!(plan_volumes(&old, &same).unwrap(), VolumePlan::default());
    }

    #[test]
    fn nvme_ports_of_both_transports_change_live() {
        let old = cfg();
        let mut c = old.clone();
        let a: std::net::SocketAddr = "10.0.2.15:4420".parse().unwrap();
        edit::nvme_port_add(&mut c, a, true).unwrap();
        assert_eq!(c.nvme.as_ref().unwrap().rdma_listen, [a]);
        assert!(!c.nvme.as_ref().unwrap().listen.contains(&a), "an RDMA port is not a TCP one");
        // Listening for RDMA there is not a setting fixed at start.
        check_fixed(&old, &c).unwrap();
        let e = edit::nvme_port_add(&mut c, a, true).unwrap_err();
        assert!(e.0.contains("NVMe/RDMA already listens"), "{e}");
        let e = edit::nvme_port_remove(&mut c, a, false).unwrap_err();
        assert!(e.0.contains("NVMe/TCP does not listen"), "{e}");
        edit::nvme_port_remove(&mut c, a, true).unwrap();
        assert_eq!(c, old);
        // The discovery port still is.
        let mut d = old.clone();
        d.nvme.as_mut().unwrap().discovery_listen = Some("127.0.0.1:8009".parse().unwrap());
        assert!(check_fixed(&old, &d).unwrap_err().0.contains("nvme.discovery_listen"));
    }

    #[test]
    fn a_volume_in_use_is_removed_only_with_force_and_takes_its_exports() {
        let mut c = cfg();
        let e = edit::volume_remove(&mut c, "a", false).unwrap_err();
        assert!(e.0.contains("iSCSI iqn.2026-11.org.example:t LUN 0") && e.0.contains("NVMe nqn.2026-11.org.example:s namespace 1"), "{e}");
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
        let h = NvmeHost { nqn: "nqn.2014-08.org.example:h".into(), dhchap_secret: crate::config::Secret::new(key), dhchap_ctrl_secret: None, dhchap_hashes: None, dhchap_dhgroups: None };
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
        assert!(check_fixed(&old, &new).unwrap_err().0.contains("iscsi.listen"));
        let mut new = old.clone();
        new.limits.max_sessions = 3;
        assert!(check_fixed(&old, &new).unwrap_err().0.contains("[limits]"));
        let mut new = old.clone();
        edit::iscsi_lun_remove(&mut new, "iqn.2026-11.org.example:t", 0).unwrap();
        check_fixed(&old, &new).unwrap();
    }

    /// A server with volumes and no front-ends: changes that need one are
    /// refused and change nothing; volume changes go through.
    #[test]
    fn apply_opens_resizes_and_closes_volumes_and_refuses_without_side_effects() {
        let mut c = ServeConfig::default();
        c.add_volume_flag("a=ram:1M").unwrap();
        let vols = crate::open_volumes(&c).unwrap();
        let live = Live::new(c.clone(), &vols, Frontends::default(), None);
        let log = live.change(|c| edit::volume_add(c, VolumeConfig { name: "b".into(), backend: "ram:2M".into(), ..Default::default() })).unwrap();
        assert_eq!(log, ["volume b: added (2097152 bytes)"]);
        live.change(|c| edit::volume_resize(c, "b", 4 << 20)).unwrap();
        assert_eq!(live.volume_sizes(), [("a".to_string(), 1 << 20), ("b".to_string(), 4 << 20)]);
        let before = live.config();
        let e = live.change(|c| edit::volume_add(c, VolumeConfig { name: "c".into(), backend: "file:/nonexistent/dir/x".into(), ..Default::default() })).unwrap_err();
        assert!(e.0.contains("volume c"), "{e}");
        let e = live.change(|c| edit::iscsi_target_add(c, IscsiTarget {
            iqn: "iqn.2026-11.org.example:t".into(), portal_group_tag: 1, luns: vec![], allowed_initiators: vec![], chap: None, mutual_chap: None,
            target_port_group: 1, alua_state: Default::default(), relative_target_port: None,
        })).unwrap_err();
        assert!(e.0.contains("not being served"), "{e}");
        assert_eq!(live.config(), before);
        assert_eq!(live.volume_sizes().len(), 2);
        live.change(|c| edit::volume_remove(c, "b", false)).unwrap();
        assert_eq!(live.volume_sizes().len(), 1);
        assert!(live.reload().is_err(), "no configuration to read again");
    }

    use crate::config::IscsiTarget;

    fn aoe_export(interface: &str, shelf: u16, slot: u8, volume: &str) -> crate::config::AoeExport {
        crate::config::AoeExport {
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
        let vols = crate::open_volumes(&c).unwrap();
        let aoe = aoe::Handle::detached(&["bw0"]);
        aoe.reconcile(c.aoe.as_ref().unwrap(), &vols).unwrap();
        let live = Live::new(c.clone(), &vols, Frontends { aoe: Some(aoe.clone()), ..Default::default() }, None);
        let log = live.change(|c| edit::aoe_export_add(c, aoe_export("bw0", 1, 1, "b"))).unwrap();
        assert_eq!(log, ["AoE e1.1 on bw0: added (volume b)"]);
        assert_eq!(aoe.exports(), [("bw0".into(), 1, 0, "a".into()), ("bw0".into(), 1, 1, "b".into())]);
        let before = live.config();
        let e = live.change(|c| edit::aoe_export_add(c, aoe_export("bw1", 1, 2, "b"))).unwrap_err();
        assert!(e.0.contains("not served on bw1") && e.0.contains("restart"), "{e}");
        let e = live.change(|c| edit::aoe_export_add(c, aoe_export("bw0", 1, 1, "a"))).unwrap_err();
        assert!(e.0.contains("already"), "{e}");
        let e = live.change(|c| edit::aoe_export_add(c, aoe_export("bw0", 2, 0, "nope"))).unwrap_err();
        assert!(e.0.contains("nope"), "{e}");
        let e = live.change(|c| edit::volume_remove(c, "b", false)).unwrap_err();
        assert!(e.0.contains("AoE 1.1 on bw0"), "{e}");
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

    #[test]
    fn without_aoe_at_start_an_export_is_refused() {
        let mut c = ServeConfig::default();
        c.add_volume_flag("a=ram:1M").unwrap();
        let vols = crate::open_volumes(&c).unwrap();
        let live = Live::new(c.clone(), &vols, Frontends::default(), None);
        let e = live.change(|c| edit::aoe_export_add(c, aoe_export("eth0", 0, 0, "a"))).unwrap_err();
        assert!(e.0.contains("not served on eth0") && e.0.contains("no interface"), "{e}");
        assert_eq!(live.config(), c);
    }
}
