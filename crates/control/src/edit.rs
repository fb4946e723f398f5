//! Configuration edits, one per control method: each changes a copy of
//! the configuration or says why not; [`crate::live::Live::change`]
//! validates and serves the result.

use bw_serve::config::*;
use bw_serve::refused::Refused;

fn iscsi(c: &mut ServeConfig) -> &mut IscsiConfig {
    c.iscsi.get_or_insert_with(Default::default)
}

fn nvme(c: &mut ServeConfig) -> &mut NvmeConfig {
    c.nvme.get_or_insert_with(Default::default)
}

pub fn target<'a>(c: &'a mut ServeConfig, iqn: &str) -> Result<&'a mut IscsiTarget, Refused> {
    iscsi(c).targets.iter_mut().find(|t| t.iqn == iqn).ok_or_else(|| Refused::NotFound(format!("no iSCSI target {iqn}")))
}

pub fn subsystem<'a>(c: &'a mut ServeConfig, nqn: &str) -> Result<&'a mut NvmeSubsystem, Refused> {
    nvme(c).subsystems.iter_mut().find(|s| s.nqn == nqn).ok_or_else(|| Refused::NotFound(format!("no NVMe subsystem {nqn}")))
}

pub fn volume_add(c: &mut ServeConfig, v: VolumeConfig) -> Result<(), Refused> {
    if v.pool.is_some() || v.snapshot_of.is_some() || v.clone_of.is_some() || v.thick {
        return Err(Refused::Invalid(format!("volume {}: pool volumes are made by volume_create, volume_snapshot and volume_clone", v.name)));
    }
    if c.volumes.iter().any(|o| o.name == v.name) {
        return Err(Refused::AlreadyExists(format!("volume {} exists", v.name)));
    }
    c.volumes.push(v);
    Ok(())
}

/// Without `force`, a volume still exported is not removed; with it,
/// its LUNs, namespaces and AoE exports go first.
pub fn volume_remove(c: &mut ServeConfig, name: &str, force: bool) -> Result<(), Refused> {
    match c.volumes.iter().find(|v| v.name == name) {
        None => return Err(Refused::NotFound(format!("no volume {name}"))),
        Some(v) if v.pool.is_some() => return Err(Refused::Invalid(format!("volume {name} is in pool {}: volume_delete removes it and its file", v.pool.as_deref().unwrap_or_default()))),
        Some(_) => {}
    }
    let users = c.exports_of(name);
    if !users.is_empty() && !force {
        return Err(Refused::Busy(format!("volume {name} is in use ({}): remove those first, or pass force", users.join(", "))));
    }
    c.unexport(name);
    c.volumes.retain(|v| v.name != name);
    Ok(())
}

/// Set volume `name`'s QoS limits: those given in `set` replace the
/// ones it had (the others stay, as SPDK's `bdev_set_qos_limit`
/// leaves the limits it is not given); all zero is unlimited.
pub fn volume_set_qos(c: &mut ServeConfig, name: &str, set: &QosUpdate) -> Result<bw_block::QosLimits, Refused> {
    let v = c.volumes.iter_mut().find(|v| v.name == name).ok_or_else(|| Refused::NotFound(format!("no volume {name}")))?;
    let mut q = v.qos.unwrap_or_default();
    let fields = [
        (&mut q.rw_ios_per_sec, set.rw_ios_per_sec),
        (&mut q.r_ios_per_sec, set.r_ios_per_sec),
        (&mut q.w_ios_per_sec, set.w_ios_per_sec),
        (&mut q.rw_mbytes_per_sec, set.rw_mbytes_per_sec),
        (&mut q.r_mbytes_per_sec, set.r_mbytes_per_sec),
        (&mut q.w_mbytes_per_sec, set.w_mbytes_per_sec),
    ];
    for (have, given) in fields {
        if let Some(n) = given {
            *have = n;
        }
    }
    v.qos = (!q.is_unlimited()).then_some(q);
    Ok(q)
}

/// The limits a QoS call gives (absent: unchanged).
#[derive(Debug, Default, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QosUpdate {
    pub rw_ios_per_sec: Option<u64>,
    pub r_ios_per_sec: Option<u64>,
    pub w_ios_per_sec: Option<u64>,
    pub rw_mbytes_per_sec: Option<u64>,
    pub r_mbytes_per_sec: Option<u64>,
    pub w_mbytes_per_sec: Option<u64>,
}

/// The backend spec with its size set to `size` bytes.
pub fn volume_resize(c: &mut ServeConfig, name: &str, size: u64) -> Result<(), Refused> {
    let v = c.volumes.iter_mut().find(|v| v.name == name).ok_or_else(|| Refused::NotFound(format!("no volume {name}")))?;
    if v.snapshot_of.is_some() {
        return Err(Refused::Invalid(format!("volume {name} is a snapshot: its size is the size it was taken at")));
    }
    match &mut v.backend.kind {
        bw_block::BackendKind::Ram { size: s } => *s = size,
        bw_block::BackendKind::File { size: s, .. } => *s = Some(size),
        bw_block::BackendKind::Rbd(t) => t.size = Some(size),
    }
    Ok(())
}

pub fn iscsi_target_add(c: &mut ServeConfig, t: IscsiTarget) -> Result<(), Refused> {
    if iscsi(c).targets.iter().any(|o| o.iqn == t.iqn) {
        return Err(Refused::AlreadyExists(format!("iSCSI target {} exists", t.iqn)));
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
        return Err(Refused::AlreadyExists(format!("iSCSI target {iqn} has a LUN {}", lun.lun)));
    }
    t.luns.push(lun);
    Ok(())
}

pub fn iscsi_lun_remove(c: &mut ServeConfig, iqn: &str, lun: u64) -> Result<(), Refused> {
    let t = target(c, iqn)?;
    let n = t.luns.len();
    t.luns.retain(|l| l.lun != lun);
    if t.luns.len() == n {
        return Err(Refused::NotFound(format!("iSCSI target {iqn} has no LUN {lun}")));
    }
    Ok(())
}

pub fn iscsi_acl_add(c: &mut ServeConfig, iqn: &str, initiator: &str) -> Result<(), Refused> {
    let t = target(c, iqn)?;
    if t.allowed_initiators.iter().any(|i| i == initiator) {
        return Err(Refused::AlreadyExists(format!("{initiator} is already allowed on {iqn}")));
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
        return Err(Refused::NotFound(format!("{initiator} is not on the list of {iqn}")));
    }
    Ok(())
}

pub fn iscsi_chap_set(c: &mut ServeConfig, iqn: &str, chap: Option<Credentials>, mutual_chap: Option<Credentials>) -> Result<(), Refused> {
    let t = target(c, iqn)?;
    t.chap = chap;
    t.mutual_chap = mutual_chap;
    Ok(())
}

/// An export on an interface AoE is served on (see [`crate::live::Live::change`]).
pub fn aoe_export_add(c: &mut ServeConfig, e: AoeExport) -> Result<(), Refused> {
    let a = c.aoe.get_or_insert_with(Default::default);
    if a.exports.iter().any(|o| o.interface == e.interface && o.shelf == e.shelf && o.slot == e.slot) {
        return Err(Refused::AlreadyExists(format!("AoE e{}.{} is exported on {} already", e.shelf, e.slot, e.interface)));
    }
    a.exports.push(e);
    Ok(())
}

pub fn aoe_export_remove(c: &mut ServeConfig, interface: &str, shelf: u16, slot: u8) -> Result<(), Refused> {
    let a = c.aoe.get_or_insert_with(Default::default);
    let n = a.exports.len();
    a.exports.retain(|e| !(e.interface == interface && e.shelf == shelf && e.slot == slot));
    if a.exports.len() == n {
        return Err(Refused::NotFound(format!("no AoE export e{shelf}.{slot} on {interface}")));
    }
    Ok(())
}

pub fn nvme_subsystem_add(c: &mut ServeConfig, s: NvmeSubsystem) -> Result<(), Refused> {
    if nvme(c).subsystems.iter().any(|o| o.nqn == s.nqn) {
        return Err(Refused::AlreadyExists(format!("NVMe subsystem {} exists", s.nqn)));
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
        return Err(Refused::AlreadyExists(format!("NVMe {nqn} has a namespace {}", ns.nsid)));
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
        return Err(Refused::NotFound(format!("NVMe {nqn} has no namespace {nsid}")));
    }
    Ok(())
}

/// Let host `host` see namespace `nsid` of `nqn` (SPDK's
/// `nvmf_ns_add_host`), or (`visible` false) no longer see it
/// (`nvmf_ns_remove_host`). Only a `no_auto_visible` namespace has a host
/// list: the others are visible to every allowed host, as in SPDK (which
/// answers EPERM). As in SPDK, adding a host listed already, or removing
/// one not listed, changes nothing and is no error.
pub fn nvme_ns_host(c: &mut ServeConfig, nqn: &str, nsid: u32, host: &str, visible: bool) -> Result<(), Refused> {
    check_nqn(host).map_err(|e| Refused::Invalid(format!("host {host:?}: {e}")))?;
    let s = subsystem(c, nqn)?;
    let ns = s.namespaces.iter_mut().find(|n| n.nsid == nsid).ok_or_else(|| Refused::NotFound(format!("NVMe {nqn} has no namespace {nsid}")))?;
    if !ns.no_auto_visible {
        return Err(Refused::Invalid(format!("NVMe {nqn} namespace {nsid} is visible to every allowed host: per-host visibility needs a namespace added with no_auto_visible")));
    }
    let listed = ns.hosts.iter().any(|h| h == host);
    if visible && !listed {
        ns.hosts.push(host.to_string());
    } else if !visible {
        ns.hosts.retain(|h| h != host);
    }
    Ok(())
}

/// A host with keys authenticates (DH-HMAC-CHAP) or has a TLS PSK;
/// without, it is only allowed. Adding a host again replaces its keys.
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

/// Listen for NVMe/TCP (or NVMe/RDMA) at `addr` too; `tls` (TCP only)
/// when the port's TLS is not `[nvme] tls`.
pub fn nvme_port_add(c: &mut ServeConfig, addr: std::net::SocketAddr, rdma: bool, tls: Option<TlsMode>) -> Result<(), Refused> {
    if rdma && tls.is_some() {
        return Err(Refused::Invalid(format!("NVMe/RDMA port {addr}: TLS is for NVMe/TCP ports only")));
    }
    let (ports, name) = ports(c, rdma);
    if ports.contains(&addr) {
        return Err(Refused::AlreadyExists(format!("{name} already listens on {addr}")));
    }
    ports.push(addr);
    if let Some(t) = tls {
        nvme_port_tls(c, addr, t)?;
    }
    Ok(())
}

/// Set the TLS of NVMe/TCP port `addr` (new connections take it; the
/// discovery log says it).
pub fn nvme_port_tls(c: &mut ServeConfig, addr: std::net::SocketAddr, tls: TlsMode) -> Result<(), Refused> {
    let n = nvme(c);
    if !n.listen.contains(&addr) && n.discovery_listen != Some(addr) {
        return Err(Refused::NotFound(format!("NVMe/TCP does not listen on {addr} (status lists the ports)")));
    }
    if tls == n.tls {
        n.tls_ports.remove(&addr);
    } else {
        n.tls_ports.insert(addr, tls);
    }
    Ok(())
}

/// A named PSK file (SPDK's `keyring_file_add_key`): it must hold a
/// valid `NVMeTLSkey-1` PSK and be mode 600, read now so a bad file is
/// refused here rather than at the first connection.
pub fn nvme_key_add(c: &mut ServeConfig, key: NvmeKey) -> Result<(), Refused> {
    let n = nvme(c);
    if n.keys.iter().any(|k| k.name == key.name) {
        return Err(Refused::AlreadyExists(format!("key {:?} exists", key.name)));
    }
    if !key.path.is_absolute() {
        return Err(Refused::Invalid(format!("key {:?}: {} is not an absolute path", key.name, key.path.display())));
    }
    key.read().map_err(Refused::Invalid)?;
    n.keys.push(key);
    Ok(())
}

/// Forget a named key; refused while a host's `tls_key` names it.
pub fn nvme_key_remove(c: &mut ServeConfig, name: &str) -> Result<(), Refused> {
    let n = nvme(c);
    if let Some((s, h)) = n.subsystems.iter().flat_map(|s| s.hosts.iter().map(move |h| (s, h))).find(|(_, h)| h.tls_key.as_deref() == Some(name)) {
        return Err(Refused::Invalid(format!("key {name:?} is host {}'s PSK on {}: remove the host first", h.nqn, s.nqn)));
    }
    let before = n.keys.len();
    n.keys.retain(|k| k.name != name);
    if n.keys.len() == before {
        return Err(Refused::NotFound(format!("no key {name:?}")));
    }
    Ok(())
}

/// Stop listening at `addr`; its connections close.
pub fn nvme_port_remove(c: &mut ServeConfig, addr: std::net::SocketAddr, rdma: bool) -> Result<(), Refused> {
    let (ports, name) = ports(c, rdma);
    let before = ports.len();
    ports.retain(|a| *a != addr);
    if ports.len() == before {
        return Err(Refused::NotFound(format!("{name} does not listen on {addr} (status lists the ports)")));
    }
    Ok(())
}

pub fn nvme_host_allow(c: &mut ServeConfig, nqn: &str, host: &str) -> Result<(), Refused> {
    let s = subsystem(c, nqn)?;
    if s.allowed_hosts.iter().any(|h| h == host) || s.hosts.iter().any(|h| h.nqn == host) {
        return Err(Refused::AlreadyExists(format!("{host} is already allowed on {nqn}")));
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
        return Err(Refused::NotFound(format!("{host} is not listed on {nqn}")));
    }
    Ok(())
}
