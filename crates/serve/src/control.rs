//! The control socket: JSON-RPC 2.0 over a Unix stream socket, one
//! request (or batch) per line and one response per line, for root only.
//! Methods are rows of [`METHODS`] (name, parameters, handler) named as
//! SPDK names its RPCs; every change goes through [`Live::change`], so it
//! is validated as a whole configuration and refused without side
//! effects. Protocol and methods: docs/control.md.

use crate::config::{self, AoeExport, Credentials, IscsiLun, IscsiTarget, NvmeHost, NvmeNamespace, NvmeSubsystem, PoolConfig, VolumeConfig};
use crate::live::{edit, Live, Refused};
use crate::pool;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Where the socket is when `--control` is not given.
pub const DEFAULT_PATH: &str = "/run/blockwire/control.sock";

/// JSON-RPC 2.0 error codes (the spec's, and ours in its server range).
pub mod code {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL: i64 = -32603;
    /// The change was refused (invalid, or impossible while serving): nothing changed.
    pub const REFUSED: i64 = -32000;
    /// The client is not root.
    pub const PERMISSION_DENIED: i64 = -32001;
    /// The change was made, but what it then waits for did not finish in
    /// time (`drain`): unlike REFUSED, things changed.
    pub const INCOMPLETE: i64 = -32002;
}

/// A JSON-RPC error object.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError { code, message: message.into() }
    }
}

impl From<Refused> for RpcError {
    fn from(r: Refused) -> RpcError {
        RpcError::new(code::REFUSED, r.0)
    }
}

pub type Handler = fn(&Live, Value) -> Result<Value, RpcError>;

/// One control method.
pub struct Method {
    pub name: &'static str,
    /// The parameters, as docs/control.md and `rpc_get_methods` show them.
    pub params: &'static str,
    pub call: Handler,
}

/// Parameters of a method, or INVALID_PARAMS saying what is wrong.
pub(crate) fn params<T: DeserializeOwned>(v: Value) -> Result<T, RpcError> {
    let v = if v.is_null() { json!({}) } else { v };
    serde_json::from_value(v).map_err(|e| RpcError::new(code::INVALID_PARAMS, format!("invalid params: {e}")))
}

/// A change's answer: what it did, line by line.
fn changed(log: Vec<String>) -> Value {
    json!({ "changes": log })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct None_ {}

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
fn ana_state(s: &str) -> Result<bw_nvme::ana::AnaState, RpcError> {
    use bw_nvme::ana::AnaState::*;
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
fn alua_state(s: &str) -> Result<bw_scsi::AluaState, RpcError> {
    use bw_scsi::AluaState::*;
    Ok(match s {
        "active-optimized" | "optimized" => ActiveOptimized,
        "active-non-optimized" | "non-optimized" => ActiveNonOptimized,
        "standby" => Standby,
        "unavailable" | "inaccessible" => Unavailable,
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
}

/// An NVMe port: its address and transport (tcp unless given).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PortAddr {
    addr: String,
    trtype: Option<String>,
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

/// Every method, in the order `rpc_get_methods` lists them.
pub const METHODS: &[Method] = &[
    Method { name: "rpc_get_methods", params: "{current?, include_aliases?}", call: |_, p| {
        // SPDK's shape: the names, as strings (every method is callable
        // at any time and none has an alias).
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Args {
            #[serde(default)]
            current: bool,
            #[serde(default)]
            include_aliases: bool,
        }
        params::<Args>(p)?;
        Ok(json!(all_methods().map(|m| m.name).collect::<Vec<_>>()))
    } },
    Method { name: "status", params: "{}", call: |live, p| {
        params::<None_>(p)?;
        status(live)
    } },
    Method { name: "volume_add", params: "{name, backend}", call: |live, p| {
        let v: VolumeConfig = params(p)?;
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
        Ok(pool::pool_list(live))
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
        Ok(pool::volume_list(live))
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
    Method { name: "nvme_ns_add", params: "{nqn, nsid, volume, readonly?, ana_group?, uuid?, nguid?, eui64?}", call: |live, p| {
        let n: NsAdd = params(p)?;
        let ns = NvmeNamespace { uuid: n.uuid, nguid: n.nguid, eui64: n.eui64, ..NvmeNamespace::new(n.nsid, n.volume, n.readonly, n.ana_group.unwrap_or(1)) };
        Ok(changed(live.change(|c| edit::nvme_ns_add(c, &n.nqn, ns))?))
    } },
    Method { name: "nvme_ns_remove", params: "{nqn, nsid}", call: |live, p| {
        let n: NsRef = params(p)?;
        Ok(changed(live.change(|c| edit::nvme_ns_remove(c, &n.nqn, n.nsid))?))
    } },
    Method { name: "nvme_port_add", params: "{addr: \"IP[:PORT]\", trtype?: \"tcp\" | \"rdma\"} (port 4420 unless given)", call: |live, p| {
        let a: PortAddr = params(p)?;
        let (addr, rdma) = a.parse()?;
        Ok(changed(live.change(|c| edit::nvme_port_add(c, addr, rdma))?))
    } },
    Method { name: "nvme_port_remove", params: "{addr, trtype?}", call: |live, p| {
        let a: PortAddr = params(p)?;
        let (addr, rdma) = a.parse()?;
        Ok(changed(live.change(|c| edit::nvme_port_remove(c, addr, rdma))?))
    } },
    Method { name: "nvme_host_add", params: "{nqn, host, dhchap_secret?, dhchap_ctrl_secret?, dhchap_hashes?, dhchap_dhgroups?}", call: |live, p| {
        let h: HostAdd = params(p)?;
        let r = match h.dhchap_secret {
            Some(secret) => {
                let host = NvmeHost { nqn: h.host, dhchap_secret: secret, dhchap_ctrl_secret: h.dhchap_ctrl_secret, dhchap_hashes: h.dhchap_hashes, dhchap_dhgroups: h.dhchap_dhgroups };
                live.change(|c| edit::nvme_host_add(c, &h.nqn, host))
            }
            None if h.dhchap_ctrl_secret.is_some() || h.dhchap_hashes.is_some() || h.dhchap_dhgroups.is_some() => {
                return Err(RpcError::new(code::INVALID_PARAMS, "invalid params: DH-HMAC-CHAP settings need dhchap_secret"));
            }
            None => live.change(|c| edit::nvme_host_allow(c, &h.nqn, &h.host)),
        };
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
        Ok(changed(live.ana_set(&a.nqn, a.group, ana_state(&a.state)?)?))
    } },
    Method { name: "tpg_set", params: "{iqn, group?, state: active-optimized|active-non-optimized|standby|unavailable} (run time only)", call: |live, p| {
        let t: TpgSet = params(p)?;
        Ok(changed(live.tpg_set(&t.iqn, t.group, alua_state(&t.state)?)?))
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
        let text = live.config().to_toml();
        config::write_private(&s.path, &text).map_err(|e| RpcError::from(Refused(format!("writing {}: {e}", s.path))))?;
        Ok(json!({ "path": s.path, "bytes": text.len() }))
    } },
    Method { name: "config_reload", params: "{}", call: |live, p| {
        params::<None_>(p)?;
        Ok(changed(live.reload()?))
    } },
];

/// blockwire's methods, then the SPDK-compatible ones (crate::spdk).
pub fn all_methods() -> impl Iterator<Item = &'static Method> {
    METHODS.iter().chain(crate::spdk::METHODS)
}

fn status(live: &Live) -> Result<Value, RpcError> {
    let cfg = live.config();
    let sessions = live.sessions();
    let count = |p: &str| sessions.iter().filter(|s| s.protocol == p).count();
    Ok(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "pid": std::process::id(),
        "uptime_s": live.uptime().as_secs(),
        "volumes": live.volume_sizes().into_iter().map(|(n, s)| {
            let backend = cfg.volumes.iter().find(|v| v.name == n).map(|v| v.backend.clone()).unwrap_or_default();
            json!({ "name": n, "backend": backend, "size": s })
        }).collect::<Vec<_>>(),
        "iscsi_targets": cfg.iscsi.iter().flat_map(|i| &i.targets).map(|t| json!({
            "iqn": t.iqn, "luns": t.luns.iter().map(|l| json!({ "lun": l.lun, "volume": l.volume })).collect::<Vec<_>>(),
            "allowed_initiators": t.allowed_initiators,
        })).collect::<Vec<_>>(),
        "nvme_ports": cfg.nvme.iter().flat_map(|n| &n.listen).map(|a| a.to_string()).collect::<Vec<_>>(),
        "nvme_rdma_ports": cfg.nvme.iter().flat_map(|n| &n.rdma_listen).map(|a| a.to_string()).collect::<Vec<_>>(),
        "nvme_subsystems": cfg.nvme.iter().flat_map(|n| &n.subsystems).map(|s| json!({
            "nqn": s.nqn, "namespaces": s.namespaces.iter().map(|n| json!({ "nsid": n.nsid, "volume": n.volume })).collect::<Vec<_>>(),
            "allowed_hosts": s.allowed_hosts.iter().cloned().chain(s.hosts.iter().map(|h| h.nqn.clone())).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "aoe_exports": cfg.aoe.iter().flat_map(|a| &a.exports).map(|e| json!({
            "interface": e.interface, "shelf": e.shelf, "slot": e.slot, "volume": e.volume,
        })).collect::<Vec<_>>(),
        "sessions": { "iscsi": count("iscsi"), "nvme": count("nvme") },
    }))
}

fn error_response(id: Value, e: RpcError) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "error": { "code": e.code, "message": e.message } })
}

/// Answer one request object; `None` for a notification (no id).
pub fn handle(live: &Live, req: Value) -> Option<Value> {
    let Value::Object(mut o) = req else {
        return Some(error_response(Value::Null, RpcError::new(code::INVALID_REQUEST, "invalid request: not a JSON object")));
    };
    let id = o.remove("id");
    let reply_id = id.clone().unwrap_or(Value::Null);
    let bad = |why: &str| Some(error_response(reply_id.clone(), RpcError::new(code::INVALID_REQUEST, format!("invalid request: {why}"))));
    if o.get("jsonrpc") != Some(&json!("2.0")) {
        return bad("\"jsonrpc\" must be \"2.0\"");
    }
    if !matches!(id, None | Some(Value::Null | Value::Number(_) | Value::String(_))) {
        return bad("\"id\" must be a number, a string or null");
    }
    let Some(Value::String(method)) = o.remove("method") else {
        return bad("\"method\" must be a string");
    };
    let p = o.remove("params").unwrap_or(Value::Null);
    if !matches!(p, Value::Null | Value::Object(_)) {
        return Some(error_response(reply_id, RpcError::new(code::INVALID_PARAMS, "invalid params: must be an object (named parameters)")));
    }
    let result = match all_methods().find(|m| m.name == method) {
        Some(m) => (m.call)(live, p),
        None => Err(RpcError::new(code::METHOD_NOT_FOUND, format!("Method not found: {method:?} (rpc_get_methods lists them)"))),
    };
    id.as_ref()?;
    Some(match result {
        Ok(r) => json!({ "jsonrpc": "2.0", "id": reply_id, "result": r }),
        Err(e) => {
            log::info!("control: {method}: {}", e.message);
            error_response(reply_id, e)
        }
    })
}

/// Answer one parsed request or batch. `None`: nothing to send back.
pub fn handle_value(live: &Live, v: Value) -> Option<String> {
    let out = match v {
        Value::Array(reqs) if reqs.is_empty() => error_response(Value::Null, RpcError::new(code::INVALID_REQUEST, "invalid request: empty batch")),
        Value::Array(reqs) => {
            let all: Vec<Value> = reqs.into_iter().filter_map(|r| handle(live, r)).collect();
            if all.is_empty() {
                return None;
            }
            Value::Array(all)
        }
        v => handle(live, v)?,
    };
    Some(out.to_string())
}

fn parse_error(e: impl std::fmt::Display) -> String {
    error_response(Value::Null, RpcError::new(code::PARSE_ERROR, format!("parse error: {e}"))).to_string()
}

/// Answer one line: a request or a batch. `None`: nothing to send back.
pub fn handle_line(live: &Live, line: &str) -> Option<String> {
    match serde_json::from_str(line) {
        Ok(v) => handle_value(live, v),
        Err(e) => Some(parse_error(e)),
    }
}

/// Splits a byte stream into JSON texts: one per line as `blockwire ctl`
/// sends them, or several lines each (SPDK's client indents its
/// requests) with or without a newline after. A text that is not JSON is
/// reported and the stream resumes after the next newline.
#[derive(Default)]
pub struct Framer {
    buf: Vec<u8>,
}

/// What the framer found in the bytes so far.
#[derive(Debug, PartialEq)]
pub enum Frame {
    Request(Value),
    /// Not JSON: answer a parse error.
    Garbage(String),
    /// A request longer than [`MAX_REQUEST`]: answer and close.
    TooLong,
}

impl Framer {
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete text, or `None` until more bytes come.
    pub fn next_frame(&mut self) -> Option<Frame> {
        let start = self.buf.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(self.buf.len());
        self.buf.drain(..start);
        if self.buf.is_empty() {
            return None;
        }
        let mut it = serde_json::Deserializer::from_slice(&self.buf).into_iter::<Value>();
        match it.next()? {
            Ok(v) => {
                let used = it.byte_offset();
                self.buf.drain(..used);
                Some(Frame::Request(v))
            }
            Err(e) if e.is_eof() => (self.buf.len() > MAX_REQUEST).then(|| {
                self.buf.clear();
                Frame::TooLong
            }),
            Err(e) => {
                let line_end = self.buf.iter().position(|&b| b == b'\n').map_or(self.buf.len(), |n| n + 1);
                self.buf.drain(..line_end);
                Some(Frame::Garbage(e.to_string()))
            }
        }
    }
}

/// The bound control socket; removed when dropped if it is still ours.
pub struct ControlSocket {
    listener: tokio::net::UnixListener,
    path: PathBuf,
    ino: u64,
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.ino) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Bind the socket at `path` (mode 600). A server answering there is an
/// error when `explicit` (`--control PATH`), else (the default path) a
/// warning and no socket: another server on this machine owns it. A
/// socket nobody answers on is stale and replaced; anything else at the
/// path is an error.
pub fn bind(path: &Path, explicit: bool) -> anyhow::Result<Option<ControlSocket>> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    // Servers starting at the same moment take turns: otherwise one can
    // find the other's socket bound but not yet listening, remove it as
    // stale, and leave the other failing on a path that is gone.
    let mut lock_path = path.as_os_str().to_owned();
    lock_path.push(".lock");
    let lock = std::fs::File::create(&lock_path).map_err(|e| anyhow::anyhow!("control socket lock {}: {e}", Path::new(&lock_path).display()))?;
    // SAFETY: flock on a descriptor this function owns; released when
    // `lock` is closed at the end of the function.
    if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) } != 0 {
        let e = std::io::Error::last_os_error();
        anyhow::bail!("control socket lock {}: {e}", Path::new(&lock_path).display());
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            anyhow::bail!("control socket {}: the path exists and is not a socket", path.display());
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            if explicit {
                anyhow::bail!("control socket {}: another blockwire server answers there (give another --control PATH)", path.display());
            }
            log::warn!("control socket {}: another server answers there; this one runs without a control socket", path.display());
            return Ok(None);
        }
        log::info!("control socket {}: removing a stale socket", path.display());
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
    }
    let listener = match tokio::net::UnixListener::bind(path) {
        Ok(l) => l,
        // Another server started at the same moment and bound it first.
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && !explicit => {
            log::warn!("control socket {}: taken by another server; this one runs without a control socket", path.display());
            return Ok(None);
        }
        Err(e) => anyhow::bail!("control socket {}: {e}", path.display()),
    };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    let ino = std::fs::symlink_metadata(path)?.ino();
    log::info!("control socket on {}", path.display());
    Ok(Some(ControlSocket { listener, path: path.to_path_buf(), ino }))
}

/// Longest request taken (a whole subsystem with its hosts fits).
pub const MAX_REQUEST: usize = 1 << 20;

impl ControlSocket {
    /// Serve clients until `shutdown`; each request runs on the blocking
    /// pool (opening a volume may wait for a disk).
    pub async fn run(self, live: Arc<Live>, mut shutdown: crate::Shutdown) {
        loop {
            let stream = tokio::select! {
                r = self.listener.accept() => match r {
                    Ok((s, _)) => s,
                    Err(e) => {
                        log::warn!("control socket: accept: {e}");
                        continue;
                    }
                },
                _ = shutdown.wait() => return,
            };
            tokio::spawn(client(stream, live.clone()));
        }
    }
}

async fn client(stream: tokio::net::UnixStream, live: Arc<Live>) {
    let uid = stream.peer_cred().map(|c| c.uid()).ok();
    let (mut rd, mut wr) = stream.into_split();
    if uid != Some(0) {
        log::warn!("control socket: refused a client with uid {uid:?} (root only)");
        let e = error_response(Value::Null, RpcError::new(code::PERMISSION_DENIED, "permission denied: the control socket is for root only"));
        let _ = wr.write_all(format!("{e}\n").as_bytes()).await;
        return;
    }
    let mut framer = Framer::default();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let reply = match framer.next_frame() {
            None => match rd.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    framer.push(&buf[..n]);
                    continue;
                }
            },
            Some(Frame::TooLong) => {
                let e = error_response(Value::Null, RpcError::new(code::INVALID_REQUEST, "invalid request: longer than 1 MiB"));
                let _ = wr.write_all(format!("{e}\n").as_bytes()).await;
                return;
            }
            Some(Frame::Garbage(e)) => Some(parse_error(e)),
            Some(Frame::Request(v)) => {
                let l = live.clone();
                match tokio::task::spawn_blocking(move || handle_value(&l, v)).await {
                    Ok(r) => r,
                    Err(e) => Some(error_response(Value::Null, RpcError::new(code::INTERNAL, format!("internal error: {e}"))).to_string()),
                }
            }
        };
        if let Some(r) = reply {
            if wr.write_all(format!("{r}\n").as_bytes()).await.is_err() {
                return;
            }
        }
    }
}

/// The client side (`blockwire ctl`): send `method` with `params` (JSON
/// text, passed as given, or none) and return the response object.
pub fn call(path: &Path, method: &str, params: Option<&str>) -> anyhow::Result<Value> {
    let mut s = std::os::unix::net::UnixStream::connect(path).map_err(|e| anyhow::anyhow!("control socket {}: {e} (is blockwire serve running? --control PATH)", path.display()))?;
    let method = serde_json::to_string(method)?;
    let line = match params {
        Some(p) => format!("{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":{method},\"params\":{p}}}\n"),
        None => format!("{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":{method}}}\n"),
    };
    // A refused client (not root) is answered and closed before its
    // request is read: the answer is there even if the write failed.
    let sent = s.write_all(line.as_bytes());
    let mut reply = String::new();
    BufReader::new(s).read_line(&mut reply)?;
    if reply.is_empty() {
        sent?;
        anyhow::bail!("the server closed the connection without an answer");
    }
    Ok(serde_json::from_str(&reply)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::Frontends;

    fn live() -> Live {
        let mut c = config::ServeConfig::default();
        c.add_volume_flag("a=ram:1M").unwrap();
        let vols = crate::open_volumes(&c).unwrap();
        Live::new(c, &vols, Frontends::default(), None)
    }

    fn code_of(r: &str) -> i64 {
        let v: Value = serde_json::from_str(r).unwrap();
        v["error"]["code"].as_i64().unwrap_or(0)
    }

    #[test]
    fn errors_follow_json_rpc_and_change_nothing() {
        let l = live();
        let before = l.config();
        for (line, code) in [
            ("{not json", code::PARSE_ERROR),
            ("[]", code::INVALID_REQUEST),
            ("42", code::INVALID_REQUEST),
            (r#"{"jsonrpc":"1.0","id":1,"method":"status"}"#, code::INVALID_REQUEST),
            (r#"{"jsonrpc":"2.0","id":[1],"method":"status"}"#, code::INVALID_REQUEST),
            (r#"{"jsonrpc":"2.0","id":1,"method":7}"#, code::INVALID_REQUEST),
            (r#"{"jsonrpc":"2.0","id":1,"method":"volume_explode"}"#, code::METHOD_NOT_FOUND),
            (r#"{"jsonrpc":"2.0","id":1,"method":"volume_add","params":[1,2]}"#, code::INVALID_PARAMS),
            (r#"{"jsonrpc":"2.0","id":1,"method":"volume_add","params":{"name":"b"}}"#, code::INVALID_PARAMS),
            (r#"{"jsonrpc":"2.0","id":1,"method":"volume_add","params":{"name":"b","backend":"ram:1M","colour":"red"}}"#, code::INVALID_PARAMS),
            (r#"{"jsonrpc":"2.0","id":1,"method":"volume_add","params":{"name":"b","backend":"floppy:1M"}}"#, code::REFUSED),
            (r#"{"jsonrpc":"2.0","id":1,"method":"volume_resize","params":{"name":"a","size":"lots"}}"#, code::INVALID_PARAMS),
            (r#"{"jsonrpc":"2.0","id":1,"method":"status","params":{"verbose":true}}"#, code::INVALID_PARAMS),
            (r#"{"jsonrpc":"2.0","id":"x","method":"nvme_ns_add","params":{"nqn":"nqn.x:y","nsid":1,"volume":"a"}}"#, code::REFUSED),
        ] {
            let r = handle_line(&l, line).unwrap();
            assert_eq!(code_of(&r), code, "{line} -> {r}");
        }
        assert_eq!(l.config(), before);
        // A notification gets no answer; a batch one answer per request.
        assert!(handle_line(&l, r#"{"jsonrpc":"2.0","method":"status"}"#).is_none());
        let r: Value = serde_json::from_str(&handle_line(&l, r#"[{"jsonrpc":"2.0","id":1,"method":"status"},{"jsonrpc":"2.0","id":2,"method":"nope"}]"#).unwrap()).unwrap();
        assert_eq!((r[0]["id"].as_i64(), r[1]["error"]["code"].as_i64()), (Some(1), Some(code::METHOD_NOT_FOUND)));
    }

    #[test]
    fn methods_change_the_configuration() {
        let l = live();
        let r: Value = serde_json::from_str(&handle_line(&l, r#"{"jsonrpc":"2.0","id":1,"method":"volume_add","params":{"name":"b","backend":"ram:2M"}}"#).unwrap()).unwrap();
        assert_eq!(r["result"]["changes"][0], "volume b: added (2097152 bytes)", "{r}");
        handle_line(&l, r#"{"jsonrpc":"2.0","id":2,"method":"volume_resize","params":{"name":"b","size":"3M"}}"#).unwrap();
        let s: Value = serde_json::from_str(&handle_line(&l, r#"{"jsonrpc":"2.0","id":3,"method":"status"}"#).unwrap()).unwrap();
        assert_eq!(s["result"]["volumes"][1]["size"], 3 << 20, "{s}");
        let names: Value = serde_json::from_str(&handle_line(&l, r#"{"jsonrpc":"2.0","id":4,"method":"rpc_get_methods"}"#).unwrap()).unwrap();
        assert_eq!(names["result"].as_array().unwrap().len(), all_methods().count());
        assert_eq!(names["result"][0], "rpc_get_methods");
        // Method names are unique.
        let mut n: Vec<&str> = all_methods().map(|m| m.name).collect();
        n.sort();
        n.dedup();
        assert_eq!(n.len(), all_methods().count());
    }

    /// Requests split over reads, several per read, indented over lines
    /// (SPDK's client) or one per line; garbage costs its line only.
    #[test]
    fn framer_finds_each_request() {
        let mut f = Framer::default();
        f.push(b"{\n  \"jsonrpc\": \"2.0\",\n  \"id\": 1,\n  \"met");
        assert_eq!(f.next_frame(), None);
        f.push(b"hod\": \"status\"\n}{\"id\":2}\n{not json\n[1]");
        let mut got = vec![];
        while let Some(x) = f.next_frame() {
            got.push(x);
        }
        assert!(matches!(&got[0], Frame::Request(v) if v["method"] == "status"), "{got:?}");
        assert_eq!(got[1], Frame::Request(json!({"id": 2})));
        assert!(matches!(got[2], Frame::Garbage(_)), "{got:?}");
        assert_eq!(got[3], Frame::Request(json!([1])));
        assert_eq!(got.len(), 4);
        f.push(b"\"");
        f.push(&vec![b'a'; MAX_REQUEST]);
        assert_eq!(f.next_frame(), Some(Frame::TooLong));
    }

    /// What save_config writes loads back to the same configuration,
    /// secrets included.
    #[test]
    fn saved_configuration_round_trips() {
        let text = r#"
            [[volume]]
            name = "v"
            backend = "ram:1M"
            [iscsi]
            listen = ["127.0.0.1:3260"]
            [[iscsi.target]]
            iqn = "iqn.2026-11.org.example:v"
            luns = [{ lun = 0, volume = "v" }]
            chap = { user = "bob", secret = "tgt-Secret-3" }
            [nvme]
            listen = ["127.0.0.1:4420"]
            [[nvme.subsystem]]
            nqn = "nqn.2026-11.org.example:v"
            namespaces = [{ nsid = 1, volume = "v" }]
            [[nvme.subsystem.host]]
            nqn = "nqn.2026-11.org.example:h"
            dhchap_secret = "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:"
        "#;
        let c: config::ServeConfig = toml::from_str(text).unwrap();
        let saved = c.to_toml();
        assert!(saved.contains("tgt-Secret-3") && saved.contains("DHHC-1:00:AAEC"), "{saved}");
        let back: config::ServeConfig = toml::from_str(&saved).unwrap();
        assert_eq!(back, c);
    }
}
