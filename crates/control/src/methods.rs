//! blockwire's own control methods (`blockwire ctl`): the rows of
//! [`METHODS`], named as SPDK names its RPCs. Every change goes through
//! [`Live::change`], so it is validated as a whole configuration and
//! refused without side effects. Methods: docs/control.md.

use crate::edit;
use crate::live::Live;
use crate::pool;
use crate::rpc::{code, params, Method, RpcError};
use bw_block::BackendSpec;
use bw_serve::config::{self, AoeExport, Credentials, IscsiLun, IscsiTarget, NvmeHost, NvmeNamespace, NvmeSubsystem, PoolConfig, VolumeConfig};
use bw_serve::frontend::AccessState;
use bw_serve::refused::Refused;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;

/// A change's answer: what it did, line by line.
fn changed(log: Vec<String>) -> Value {
    json!({ "changes": log })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct None_ {}

/// `volume_add`'s parameters: a `[[volume]]`, whose backend text that
/// does not parse is a refused change (as the configuration file's would
/// be), not a malformed request.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct VolumeAdd {
    name: String,
    backend: String,
    #[serde(default)]
    pool: Option<String>,
    #[serde(default)]
    uuid: Option<String>,
    #[serde(default)]
    snapshot_of: Option<String>,
    #[serde(default)]
    clone_of: Option<String>,
    #[serde(default)]
    thick: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Name {
    name: String,
    #[serde(default)]
    force: bool,
}

/// A size in bytes, or a string with a suffix ("2G").
#[derive(Deserialize)]
#[serde(untagged)]
enum Size {
    Bytes(u64),
    Text(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Resize {
    name: String,
    size: Size,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Iqn {
    iqn: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AnaSet {
    nqn: String,
    #[serde(default)]
    group: Option<u32>,
    state: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TpgSet {
    iqn: String,
    #[serde(default)]
    group: Option<u16>,
    state: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Drain {
    /// Seconds to wait for the requests in flight (default 30).
    #[serde(default)]
    timeout_s: Option<u64>,
}

/// The longest `drain` waits for requests in flight.
const MAX_DRAIN_S: u64 = 24 * 3600;

/// An ANA state by its name in the configuration (`ana_state`).
fn ana_state(s: &str) -> Result<AccessState, RpcError> {
    use AccessState::*;
    Ok(match s {
        "optimized" => Optimized,
        "non-optimized" => NonOptimized,
        "inaccessible" => Inaccessible,
        "persistent-loss" => PersistentLoss,
        "change" => Change,
        _ => return Err(RpcError::new(code::INVALID_PARAMS, format!("ANA state {s:?}: optimized, non-optimized, inaccessible, persistent-loss or change"))),
    })
}

/// An ALUA state by its name in the configuration (`alua_state`), or by
/// the ANA name of its counterpart.
fn alua_state(s: &str) -> Result<AccessState, RpcError> {
    use AccessState::*;
    Ok(match s {
        "active-optimized" | "optimized" => Optimized,
        "active-non-optimized" | "non-optimized" => NonOptimized,
        "standby" => Standby,
        "unavailable" | "inaccessible" => Inaccessible,
        _ => return Err(RpcError::new(code::INVALID_PARAMS, format!("ALUA state {s:?}: active-optimized, active-non-optimized, standby or unavailable"))),
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LunAdd {
    iqn: String,
    lun: u64,
    volume: String,
    #[serde(default)]
    readonly: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LunRef {
    iqn: String,
    lun: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Acl {
    iqn: String,
    initiator: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Chap {
    iqn: String,
    #[serde(default)]
    chap: Option<Credentials>,
    #[serde(default)]
    mutual_chap: Option<Credentials>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Nqn {
    nqn: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NsAdd {
    nqn: String,
    nsid: u32,
    volume: String,
    #[serde(default)]
    readonly: bool,
    #[serde(default)]
    ana_group: Option<u32>,
    #[serde(default)]
    uuid: Option<String>,
    #[serde(default)]
    nguid: Option<String>,
    #[serde(default)]
    eui64: Option<String>,
    #[serde(default)]
    no_auto_visible: bool,
    #[serde(default)]
    hosts: Vec<String>,
}

/// `nvme_ns_host_add` / `nvme_ns_host_remove`: a host of a namespace's
/// visibility list.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NsHost {
    nqn: String,
    nsid: u32,
    host: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NsRef {
    nqn: String,
    nsid: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HostAdd {
    nqn: String,
    host: String,
    #[serde(default)]
    dhchap_secret: Option<config::Secret>,
    #[serde(default)]
    dhchap_ctrl_secret: Option<config::Secret>,
    #[serde(default)]
    dhchap_hashes: Option<Vec<String>>,
    #[serde(default)]
    dhchap_dhgroups: Option<Vec<String>>,
    #[serde(default)]
    tls_psk: Option<config::Secret>,
    #[serde(default)]
    tls_key: Option<String>,
}

/// An NVMe port: its address and transport (tcp unless given).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PortAddr {
    addr: String,
    trtype: Option<String>,
    /// `required`, `allowed` or `none` (NVMe/TCP ports; `[nvme] tls` unless given).
    #[serde(default)]
    tls: Option<config::TlsMode>,
}

impl PortAddr {
    /// The address, and whether it is an RDMA port.
    fn parse(&self) -> Result<(std::net::SocketAddr, bool), RpcError> {
        let rdma = match self.trtype.as_deref() {
            None | Some("tcp") => false,
            Some("rdma") => true,
            Some(t) => return Err(RpcError::new(code::INVALID_PARAMS, format!("invalid params: trtype {t:?} (tcp or rdma)"))),
        };
        let addr = config::parse_listen(&self.addr, 4420).map_err(|e| RpcError::new(code::INVALID_PARAMS, format!("invalid params: {e}")))?;
        Ok((addr, rdma))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HostRef {
    nqn: String,
    host: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AoeRef {
    interface: String,
    shelf: u16,
    slot: u8,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionId {
    id: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SavePath {
    path: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PoolCreate {
    name: String,
    #[serde(default)]
    path: String,
    rbd: Option<String>,
    conf: Option<String>,
    id: Option<String>,
    #[serde(default)]
    copy: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PoolName {
    name: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct VolumeCreate {
    name: String,
    size: Size,
    pool: String,
    #[serde(default)]
    thick: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct VolumeSnapshot {
    name: String,
    snapshot: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct VolumeClone {
    snapshot: String,
    name: String,
}

impl Size {
    fn bytes(self) -> Result<u64, RpcError> {
        match self {
            Size::Bytes(b) => Ok(b),
            Size::Text(t) => bw_block::parse_size(&t).map_err(|e| RpcError::new(code::INVALID_PARAMS, format!("invalid params: size: {e}"))),
        }
    }
}

/// A lifecycle change's answer: what changed (nothing if it existed
/// already) and the object as `volume_list` shows it.
fn made_volume(live: &Live, log: Vec<String>, name: &str) -> Result<Value, RpcError> {
    let c = live.config();
    let sizes = live.volume_sizes().into_iter().collect();
    let v = pool::volume(&c, name)?;
    Ok(json!({ "changes": log, "volume": pool::volume_info(&c, &sizes, v) }))
}

/// blockwire's methods, in the order `rpc_get_methods` lists them (after
/// itself).
pub const METHODS: &[Method] = &[
    Method { name: "status", params: "{}", call: |live, p| {
        params::<None_>(p)?;
        status(live)
    } },
    Method { name: "volume_add", params: "{name, backend}", call: |live, p| {
        let a: VolumeAdd = params(p)?;
        let backend = BackendSpec::parse(&a.backend).map_err(|e| Refused::Invalid(format!("volume {}: {e}", a.name)))?;
        let v = VolumeConfig { uuid: a.uuid, pool: a.pool, snapshot_of: a.snapshot_of, clone_of: a.clone_of, thick: a.thick, ..VolumeConfig::new(a.name, backend) };
        Ok(changed(live.change(|c| edit::volume_add(c, v))?))
    } },
    Method { name: "volume_remove", params: "{name, force?}", call: |live, p| {
        let n: Name = params(p)?;
        Ok(changed(live.change(|c| edit::volume_remove(c, &n.name, n.force))?))
    } },
    Method { name: "volume_resize", params: "{name, size: bytes or \"10G\"}", call: |live, p| {
        let r: Resize = params(p)?;
        let size = r.size.bytes()?;
        Ok(changed(live.change(|c| edit::volume_resize(c, &r.name, size))?))
    } },
    Method { name: "volume_set_qos", params: "{name, rw_ios_per_sec?, r_ios_per_sec?, w_ios_per_sec?, rw_mbytes_per_sec?, r_mbytes_per_sec?, w_mbytes_per_sec?} (0: unlimited; absent: unchanged)", call: |live, p| {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Args {
            name: String,
            #[serde(flatten)]
            set: edit::QosUpdate,
        }
        let a: Args = params(p)?;
        let log = live.change(|c| edit::volume_set_qos(c, &a.name, &a.set).map(drop))?;
        let q = live.config().volumes.iter().find(|v| v.name == a.name).and_then(|v| v.qos).unwrap_or_default();
        Ok(json!({ "changes": log, "qos": q }))
    } },
    Method { name: "pool_create", params: "{name, path, copy?} or {name, rbd, conf?, id?}", call: |live, p| {
        let r: PoolCreate = params(p)?;
        let asked = PoolConfig { name: r.name.clone(), path: r.path, rbd: r.rbd, conf: r.conf, id: r.id, copy: r.copy, uuid: None };
        let log = live.change(|c| pool::pool_create(c, asked).map(drop))?;
        let c = live.config();
        let sizes = live.volume_sizes().into_iter().collect();
        let made = c.pools.iter().find(|p| p.name == r.name).map(|p| pool::pool_info(&c, &sizes, p));
        Ok(json!({ "changes": log, "pool": made }))
    } },
    Method { name: "pool_delete", params: "{name}", call: |live, p| {
        let r: PoolName = params(p)?;
        Ok(changed(live.change(|c| pool::pool_delete(c, &r.name))?))
    } },
    Method { name: "pool_list", params: "{}", call: |live, p| {
        params::<None_>(p)?;
        Ok(pool_list(live))
    } },
    Method { name: "volume_create", params: "{name, size: bytes or \"10G\", pool, thick?}", call: |live, p| {
        let r: VolumeCreate = params(p)?;
        let size = r.size.bytes()?;
        let log = live.change_files(|c, _, f| pool::volume_create(c, f, &r.name, size, &r.pool, r.thick).map(drop))?;
        made_volume(live, log, &r.name)
    } },
    Method { name: "volume_delete", params: "{name}", call: |live, p| {
        let r: PoolName = params(p)?;
        Ok(changed(live.change_files(|c, _, f| pool::volume_delete(c, f, &r.name))?))
    } },
    Method { name: "volume_snapshot", params: "{name, snapshot}", call: |live, p| {
        let r: VolumeSnapshot = params(p)?;
        let log = live.change_files(|c, open, f| pool::volume_snapshot(c, open, f, &r.name, &r.snapshot).map(drop))?;
        made_volume(live, log, &r.snapshot)
    } },
    Method { name: "volume_clone", params: "{snapshot, name}", call: |live, p| {
        let r: VolumeClone = params(p)?;
        let log = live.change_files(|c, _, f| pool::volume_clone(c, f, &r.snapshot, &r.name).map(drop))?;
        made_volume(live, log, &r.name)
    } },
    Method { name: "volume_list", params: "{}", call: |live, p| {
        params::<None_>(p)?;
        Ok(volume_list(live))
    } },
    Method { name: "iscsi_target_add", params: "{iqn, luns?, allowed_initiators?, chap?, mutual_chap?, ...} as [[iscsi.target]]", call: |live, p| {
        let mut p = p;
        if let Some(o) = p.as_object_mut() {
            o.entry("luns").or_insert(json!([]));
        }
        let t: IscsiTarget = params(p)?;
        Ok(changed(live.change(|c| edit::iscsi_target_add(c, t))?))
    } },
    Method { name: "iscsi_target_remove", params: "{iqn}", call: |live, p| {
        let t: Iqn = params(p)?;
        Ok(changed(live.change(|c| edit::iscsi_target_remove(c, &t.iqn))?))
    } },
    Method { name: "iscsi_lun_add", params: "{iqn, lun, volume, readonly?}", call: |live, p| {
        let l: LunAdd = params(p)?;
        Ok(changed(live.change(|c| edit::iscsi_lun_add(c, &l.iqn, IscsiLun { lun: l.lun, volume: l.volume, readonly: l.readonly }))?))
    } },
    Method { name: "iscsi_lun_remove", params: "{iqn, lun}", call: |live, p| {
        let l: LunRef = params(p)?;
        Ok(changed(live.change(|c| edit::iscsi_lun_remove(c, &l.iqn, l.lun))?))
    } },
    Method { name: "iscsi_acl_add", params: "{iqn, initiator}", call: |live, p| {
        let a: Acl = params(p)?;
        Ok(changed(live.change(|c| edit::iscsi_acl_add(c, &a.iqn, &a.initiator))?))
    } },
    Method { name: "iscsi_acl_remove", params: "{iqn, initiator}", call: |live, p| {
        let a: Acl = params(p)?;
        Ok(changed(live.change(|c| edit::iscsi_acl_remove(c, &a.iqn, &a.initiator))?))
    } },
    Method { name: "iscsi_chap_set", params: "{iqn, chap?: {user, secret}, mutual_chap?: {user, secret}}", call: |live, p| {
        let a: Chap = params(p)?;
        Ok(changed(live.change(|c| edit::iscsi_chap_set(c, &a.iqn, a.chap, a.mutual_chap))?))
    } },
    Method { name: "nvme_subsystem_add", params: "{nqn, namespaces?, allowed_hosts?, serial?, model?, ...} as [[nvme.subsystem]]", call: |live, p| {
        let mut p = p;
        if let Some(o) = p.as_object_mut() {
            o.entry("namespaces").or_insert(json!([]));
        }
        let s: NvmeSubsystem = params(p)?;
        Ok(changed(live.change(|c| edit::nvme_subsystem_add(c, s))?))
    } },
    Method { name: "nvme_subsystem_remove", params: "{nqn}", call: |live, p| {
        let s: Nqn = params(p)?;
        Ok(changed(live.change(|c| edit::nvme_subsystem_remove(c, &s.nqn))?))
    } },
    Method { name: "nvme_ns_add", params: "{nqn, nsid, volume, readonly?, ana_group?, uuid?, nguid?, eui64?, no_auto_visible?, hosts?: [HOSTNQN]}", call: |live, p| {
        let n: NsAdd = params(p)?;
        let ns = NvmeNamespace { uuid: n.uuid, nguid: n.nguid, eui64: n.eui64, no_auto_visible: n.no_auto_visible, hosts: n.hosts, ..NvmeNamespace::new(n.nsid, n.volume, n.readonly, n.ana_group.unwrap_or(1)) };
        Ok(changed(live.change(|c| edit::nvme_ns_add(c, &n.nqn, ns))?))
    } },
    Method { name: "nvme_ns_host_add", params: "{nqn, nsid, host} (a no_auto_visible namespace becomes visible to host)", call: |live, p| {
        let n: NsHost = params(p)?;
        Ok(changed(live.change(|c| edit::nvme_ns_host(c, &n.nqn, n.nsid, &n.host, true))?))
    } },
    Method { name: "nvme_ns_host_remove", params: "{nqn, nsid, host}", call: |live, p| {
        let n: NsHost = params(p)?;
        Ok(changed(live.change(|c| edit::nvme_ns_host(c, &n.nqn, n.nsid, &n.host, false))?))
    } },
    Method { name: "nvme_ns_remove", params: "{nqn, nsid}", call: |live, p| {
        let n: NsRef = params(p)?;
        Ok(changed(live.change(|c| edit::nvme_ns_remove(c, &n.nqn, n.nsid))?))
    } },
    Method { name: "nvme_port_add", params: "{addr: \"IP[:PORT]\", trtype?: \"tcp\" | \"rdma\", tls?: \"required\" | \"allowed\" | \"none\"} (port 4420 unless given; TLS as [nvme] tls unless given)", call: |live, p| {
        let a: PortAddr = params(p)?;
        let (addr, rdma) = a.parse()?;
        Ok(changed(live.change(|c| edit::nvme_port_add(c, addr, rdma, a.tls))?))
    } },
    Method { name: "nvme_port_tls", params: "{addr, tls: \"required\" | \"allowed\" | \"none\"} (new connections take it)", call: |live, p| {
        let a: PortAddr = params(p)?;
        let (addr, rdma) = a.parse()?;
        let tls = a.tls.ok_or_else(|| RpcError::new(code::INVALID_PARAMS, "invalid params: tls is missing"))?;
        if rdma {
            return Err(RpcError::new(code::INVALID_PARAMS, "invalid params: TLS is for NVMe/TCP ports only"));
        }
        Ok(changed(live.change(|c| edit::nvme_port_tls(c, addr, tls))?))
    } },
    Method { name: "nvme_port_remove", params: "{addr, trtype?}", call: |live, p| {
        let a: PortAddr = params(p)?;
        if a.tls.is_some() {
            return Err(RpcError::new(code::INVALID_PARAMS, "invalid params: tls is for nvme_port_add and nvme_port_tls"));
        }
        let (addr, rdma) = a.parse()?;
        Ok(changed(live.change(|c| edit::nvme_port_remove(c, addr, rdma))?))
    } },
    Method { name: "nvme_host_add", params: "{nqn, host, dhchap_secret?, dhchap_ctrl_secret?, dhchap_hashes?, dhchap_dhgroups?, tls_psk?: \"NVMeTLSkey-1:...\", tls_key?: KEY_NAME}", call: |live, p| {
        let h: HostAdd = params(p)?;
        let host = NvmeHost {
            nqn: h.host.clone(),
            dhchap_secret: h.dhchap_secret,
            dhchap_ctrl_secret: h.dhchap_ctrl_secret,
            dhchap_hashes: h.dhchap_hashes,
            dhchap_dhgroups: h.dhchap_dhgroups,
            tls_psk: h.tls_psk,
            tls_key: h.tls_key,
        };
        if let Err(e) = host.auth_config() {
            return Err(RpcError::new(code::INVALID_PARAMS, format!("invalid params: {e}")));
        }
        let r = if host == NvmeHost::new(h.host.clone()) { live.change(|c| edit::nvme_host_allow(c, &h.nqn, &h.host)) } else { live.change(|c| edit::nvme_host_add(c, &h.nqn, host)) };
        Ok(changed(r?))
    } },
    Method { name: "nvme_host_remove", params: "{nqn, host}", call: |live, p| {
        let h: HostRef = params(p)?;
        Ok(changed(live.change(|c| edit::nvme_host_remove(c, &h.nqn, &h.host))?))
    } },
    Method { name: "aoe_export_add", params: "{interface, shelf, slot, volume, config_string?, buffers?, allow?: [MAC], broadcast_writes?} as [[aoe.export]]", call: |live, p| {
        let e: AoeExport = params(p)?;
        Ok(changed(live.change(|c| edit::aoe_export_add(c, e))?))
    } },
    Method { name: "aoe_export_remove", params: "{interface, shelf, slot}", call: |live, p| {
        let e: AoeRef = params(p)?;
        Ok(changed(live.change(|c| edit::aoe_export_remove(c, &e.interface, e.shelf, e.slot))?))
    } },
    Method { name: "session_list", params: "{}", call: |live, p| {
        params::<None_>(p)?;
        Ok(json!(live.sessions()))
    } },
    Method { name: "session_disconnect", params: "{id}", call: |live, p| {
        let s: SessionId = params(p)?;
        live.disconnect(&s.id)?;
        Ok(changed(vec![format!("session {} disconnected", s.id)]))
    } },
    Method { name: "ana_set", params: "{nqn, group?, state: optimized|non-optimized|inaccessible|persistent-loss|change} (run time only)", call: |live, p| {
        let a: AnaSet = params(p)?;
        Ok(changed(live.set_access(bw_serve::nvme::NAME, &a.nqn, a.group, ana_state(&a.state)?)?))
    } },
    Method { name: "tpg_set", params: "{iqn, group?, state: active-optimized|active-non-optimized|standby|unavailable} (run time only)", call: |live, p| {
        let t: TpgSet = params(p)?;
        Ok(changed(live.set_access(bw_serve::iscsi::NAME, &t.iqn, t.group.map(u32::from), alua_state(&t.state)?)?))
    } },
    Method { name: "drain", params: "{timeout_s?} (every path of this gateway inaccessible, then wait for the requests in flight)", call: |live, p| {
        let d: Drain = params(p)?;
        // Checked before any path changes: a refusal changes nothing.
        let secs = d.timeout_s.unwrap_or(30);
        if secs > MAX_DRAIN_S {
            return Err(RpcError::new(code::INVALID_PARAMS, format!("invalid params: timeout_s {secs}: at most {MAX_DRAIN_S} (a day)")));
        }
        let (log, in_flight, finished) = live.drain(std::time::Duration::from_secs(secs))?;
        if !finished {
            return Err(RpcError::new(code::INCOMPLETE, format!("paths drained ({}), but requests were still in flight after the timeout", log.join("; "))));
        }
        Ok(json!({ "changes": log, "in_flight_at_drain": in_flight }))
    } },
    Method { name: "save_config", params: "{path}", call: |live, p| {
        let s: SavePath = params(p)?;
        let bytes = live.save_config(&s.path)?;
        Ok(json!({ "path": s.path, "bytes": bytes }))
    } },
    Method { name: "config_reload", params: "{}", call: |live, p| {
        params::<None_>(p)?;
        Ok(changed(live.reload()?))
    } },
];

fn status(live: &Live) -> Result<Value, RpcError> {
    let cfg = live.config();
    Ok(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "pid": std::process::id(),
        "uptime_s": live.uptime().as_secs(),
        "volumes": live.volume_sizes().into_iter().map(|(n, s)| {
            let backend = cfg.volumes.iter().find(|v| v.name == n).map(|v| v.backend.to_string()).unwrap_or_default();
            // size_watched: resizes by other clients (another gateway,
            // `rbd resize`) are followed.
            json!({ "name": n, "backend": backend, "size": s, "size_watched": live.size_watched(&n) })
        }).collect::<Vec<_>>(),
        // librbd update watches in force in the process: one per watched
        // RBD volume (more would be a removed volume's, leaked).
        "rbd_update_watches": bw_block::RbdDevice::update_watches(),
        "iscsi_targets": cfg.iscsi.iter().flat_map(|i| &i.targets).map(|t| json!({
            "iqn": t.iqn, "luns": t.luns.iter().map(|l| json!({ "lun": l.lun, "volume": l.volume })).collect::<Vec<_>>(),
            "allowed_initiators": t.allowed_initiators,
        })).collect::<Vec<_>>(),
        "nvme_ports": cfg.nvme.iter().flat_map(|n| &n.listen).map(|a| a.to_string()).collect::<Vec<_>>(),
        "nvme_rdma_ports": cfg.nvme.iter().flat_map(|n| &n.rdma_listen).map(|a| a.to_string()).collect::<Vec<_>>(),
        "nvme_subsystems": cfg.nvme.iter().flat_map(|n| &n.subsystems).map(|s| json!({
            "nqn": s.nqn, "namespaces": s.namespaces.iter().map(|n| json!({ "nsid": n.nsid, "volume": n.volume, "no_auto_visible": n.no_auto_visible, "hosts": n.hosts })).collect::<Vec<_>>(),
            "allowed_hosts": s.allowed_hosts.iter().cloned().chain(s.hosts.iter().map(|h| h.nqn.clone())).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "aoe_exports": cfg.aoe.iter().flat_map(|a| &a.exports).map(|e| json!({
            "interface": e.interface, "shelf": e.shelf, "slot": e.slot, "volume": e.volume,
        })).collect::<Vec<_>>(),
        "sessions": live.session_counts().into_iter().map(|(name, n)| (name.to_string(), json!(n))).collect::<serde_json::Map<_, _>>(),
    }))
}

fn volume_list(live: &Live) -> Value {
    let c = live.config();
    let sizes: HashMap<String, u64> = live.volume_sizes().into_iter().collect();
    json!(c.volumes.iter().map(|v| pool::volume_info(&c, &sizes, v)).collect::<Vec<_>>())
}

fn pool_list(live: &Live) -> Value {
    let c = live.config();
    let sizes: HashMap<String, u64> = live.volume_sizes().into_iter().collect();
    json!(c.pools.iter().map(|p| pool::pool_info(&c, &sizes, p)).collect::<Vec<_>>())
}
