//! The subset of SPDK's JSON-RPC methods that orchestrators drive
//! (OpenStack Cinder's SPDK driver and its `spdk-nvmeof` target helper,
//! SPDK's own `spdk-rpc`), with SPDK's method names, parameter shapes and
//! answers, mapped onto blockwire's pools, volumes and exports. Each is a
//! row of [`METHODS`] (the same [`Method`] rows as blockwire's own, crate::methods), and
//! each change goes through the same [`Live::change`] (validated,
//! persisted, all or nothing).
//!
//! The mapping: an lvol store is a pool; an lvol is a pool volume, whose
//! bdev name is its UUID and whose alias is `POOL/NAME` (volume names are
//! unique across pools here, in SPDK only within a store); an aio bdev is
//! a file volume; an NVMe-oF subsystem and an iSCSI target node are
//! blockwire's. Errors carry SPDK's codes (a negative errno, or the
//! JSON-RPC ones) and say what blockwire refused. Parameters SPDK knows
//! and blockwire has no use for (tunables of SPDK's own machinery, and
//! options newer clients send by default) are taken and ignored; those
//! that would change what an initiator gets, if set, are refused. The
//! table in docs/control.md lists what is supported and how it maps.

use crate::edit;
use crate::live::Live;
use crate::pool;
use crate::rpc::{code, params, Method, RpcError};
use bw_block::{BackendKind, BackendSpec};
use bw_serve::config::{IscsiLun, IscsiTarget, NvmeNamespace, NvmeSubsystem, ServeConfig, VolumeConfig};
use bw_serve::refused::Refused;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;

/// SPDK's lvol store cluster size (its default): free and total space are
/// reported in clusters of this size.
pub const CLUSTER_SIZE: u64 = 4 << 20;
/// The logical block size blockwire's front-ends report.
const BLOCK_SIZE: u64 = 512;
/// SPDK prefixes a target node name that is not an iSCSI name with this.
const SPDK_IQN_PREFIX: &str = "iqn.2016-06.io.spdk:";
/// SPDK's NQN of the discovery subsystem, listed first by nvmf_get_subsystems.
const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// SPDK's number for each way a change is refused: the negative errno
/// its RPCs answer, and the errno's text it puts before the message.
fn errno(r: &Refused) -> (i32, &'static str) {
    match r {
        Refused::NotFound(_) => (libc::ENODEV, "No such device"),
        Refused::AlreadyExists(_) => (libc::EEXIST, "File exists"),
        Refused::Busy(_) => (libc::EBUSY, "Device or resource busy"),
        Refused::Invalid(_) | Refused::NeedsRestart(_) | Refused::Unsupported(_) => (libc::EINVAL, "Invalid argument"),
        Refused::NoSpace(_) => (libc::ENOSPC, "No space left on device"),
        Refused::Unavailable(_) => (libc::EAGAIN, "Resource temporarily unavailable"),
        Refused::Io(_) => (libc::EIO, "Input/output error"),
    }
}

/// A refused change as SPDK answers it.
fn refused(r: Refused) -> RpcError {
    let (errno, what) = errno(&r);
    RpcError::new(-i64::from(errno), format!("{what}: {}", r.message()))
}

/// What this layer refuses itself (SPDK's parameters), as [`refused`].
fn err(what: fn(String) -> Refused, msg: impl std::fmt::Display) -> RpcError {
    refused(what(msg.to_string()))
}

/// The volume a bdev name means: its UUID, its alias `POOL/NAME`, or its
/// name.
fn bdev<'a>(c: &'a ServeConfig, name: &str) -> Result<&'a VolumeConfig, RpcError> {
    c.volumes
        .iter()
        .find(|v| v.name == name || (v.pool.is_some() && pool::volume_uuid(v) == name) || alias(v).as_deref() == Some(name))
        .ok_or_else(|| err(Refused::NotFound, format!("no bdev {name}")))
}

fn alias(v: &VolumeConfig) -> Option<String> {
    v.pool.as_ref().map(|p| format!("{p}/{}", v.name))
}

/// What SPDK calls a bdev: an lvol's UUID, other volumes' names.
fn bdev_name(v: &VolumeConfig) -> String {
    if v.pool.is_some() { pool::volume_uuid(v) } else { v.name.clone() }
}

fn lvol<'a>(c: &'a ServeConfig, name: &str) -> Result<&'a VolumeConfig, RpcError> {
    let v = bdev(c, name)?;
    if v.pool.is_none() {
        return Err(err(Refused::NotFound, format!("bdev {name} is not a logical volume (not in a pool)")));
    }
    Ok(v)
}

fn lvstore<'a>(c: &'a ServeConfig, uuid: Option<&str>, name: Option<&str>) -> Result<&'a bw_serve::config::PoolConfig, RpcError> {
    match (uuid, name) {
        (Some(_), Some(_)) => Err(err(Refused::Invalid, "give uuid or lvs_name, not both")),
        (None, None) => Err(err(Refused::Invalid, "give uuid or lvs_name")),
        (u, n) => c
            .pools
            .iter()
            .find(|p| u.is_some_and(|u| pool::pool_uuid(p) == u) || n.is_some_and(|n| p.name == n))
            .ok_or_else(|| err(Refused::NotFound, format!("no lvol store {}", u.or(n).unwrap_or_default()))),
    }
}

fn bdev_json(c: &ServeConfig, sizes: &HashMap<String, u64>, v: &VolumeConfig) -> Value {
    let size = sizes.get(&v.name).copied().unwrap_or(0);
    let readonly = v.backend.readonly;
    let (product, driver) = match (&v.pool, &v.backend.kind) {
        (Some(p), _) => {
            let allocated = pool::allocated_bytes(v).unwrap_or(0);
            let pool_cfg = c.pools.iter().find(|x| &x.name == p);
            let mut l = json!({
                "lvol_store_uuid": pool_cfg.map(pool::pool_uuid),
                "base_bdev": pool_cfg.map(base_bdev),
                "thin_provision": !v.thick,
                "num_allocated_clusters": allocated.div_ceil(CLUSTER_SIZE),
                "snapshot": v.snapshot_of.is_some(),
                "clone": v.clone_of.is_some(),
                "esnap_clone": false,
            });
            if let Some(s) = &v.clone_of {
                l["base_snapshot"] = json!(s);
            }
            if v.snapshot_of.is_some() {
                l["clones"] = json!(c.volumes.iter().filter(|o| o.clone_of.as_deref() == Some(&v.name)).map(|o| o.name.clone()).collect::<Vec<_>>());
            }
            ("Logical Volume", json!({ "lvol": l }))
        }
        (None, BackendKind::File { path, .. }) => {
            ("AIO disk", json!({ "aio": { "filename": path, "block_size_override": false, "readonly": readonly, "fallocate": false } }))
        }
        (None, BackendKind::Ram { .. }) => ("Malloc disk", json!({})),
        (None, BackendKind::Rbd(_)) => ("Ceph Rbd Disk", json!({})),
    };
    json!({
        "name": bdev_name(v),
        "aliases": alias(v).into_iter().collect::<Vec<_>>(),
        "product_name": product,
        "block_size": BLOCK_SIZE,
        "num_blocks": size / BLOCK_SIZE,
        "uuid": pool::volume_uuid(v),
        "claimed": !c.exports_of(&v.name).is_empty(),
        "zoned": false,
        "supported_io_types": {
            "read": true, "write": !readonly, "unmap": !readonly, "write_zeroes": !readonly, "flush": true,
            "reset": false, "compare": false, "compare_and_write": false, "abort": false, "nvme_admin": false, "nvme_io": false,
        },
        "driver_specific": driver,
    })
}

/// What an lvol store sits on: the pool's directory, or its Ceph pool.
fn base_bdev(p: &bw_serve::config::PoolConfig) -> String {
    p.rbd.as_ref().map_or_else(|| p.path.clone(), |r| format!("rbd:{r}"))
}

fn lvstore_json(c: &ServeConfig, p: &bw_serve::config::PoolConfig) -> Value {
    let space = bw_block::reflink::fs_space(std::path::Path::new(&p.path)).ok();
    let total = space.as_ref().map_or(0, |s| s.total) / CLUSTER_SIZE;
    let free = space.as_ref().map_or(0, |s| s.available) / CLUSTER_SIZE;
    let _ = c;
    json!({
        "uuid": pool::pool_uuid(p),
        "name": p.name,
        "base_bdev": base_bdev(p),
        "total_data_clusters": total,
        "free_clusters": free,
        "block_size": BLOCK_SIZE,
        "cluster_size": CLUSTER_SIZE,
        "max_growable_size": total * CLUSTER_SIZE,
    })
}

/// An SPDK size: `size_in_mib`, or the older `size` in bytes (which
/// Cinder's driver sends).
fn size_of(size: Option<u64>, size_in_mib: Option<u64>) -> Result<u64, RpcError> {
    match (size, size_in_mib) {
        (Some(b), None) => Ok(b),
        (None, Some(m)) => m.checked_mul(1 << 20).ok_or_else(|| err(Refused::Invalid, "size_in_mib too large")),
        _ => Err(RpcError::new(code::INVALID_PARAMS, "Invalid parameters: give size_in_mib (or size in bytes), one of them")),
    }
}

#[derive(Deserialize)]
struct GetBdevs {
    name: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    timeout: Option<u64>,
}

#[derive(Deserialize)]
struct GetLvstores {
    uuid: Option<String>,
    lvs_name: Option<String>,
}

#[derive(Deserialize)]
struct LvolCreate {
    lvol_name: String,
    size: Option<u64>,
    size_in_mib: Option<u64>,
    #[serde(default)]
    thin_provision: bool,
    uuid: Option<String>,
    lvs_name: Option<String>,
    #[allow(dead_code)]
    clear_method: Option<String>,
}

#[derive(Deserialize)]
struct BdevName {
    name: String,
}

#[derive(Deserialize)]
struct LvolResize {
    name: String,
    size: Option<u64>,
    size_in_mib: Option<u64>,
}

#[derive(Deserialize)]
struct LvolSnapshot {
    lvol_name: String,
    snapshot_name: String,
}

#[derive(Deserialize)]
struct LvolClone {
    snapshot_name: String,
    clone_name: String,
}

#[derive(Deserialize)]
struct AioCreate {
    name: String,
    filename: String,
    block_size: Option<u64>,
    #[serde(default)]
    readonly: bool,
    #[serde(default)]
    #[allow(dead_code)]
    fallocate: bool,
    uuid: Option<String>,
}

/// nvmf_create_transport: its tunables belong to SPDK's transports and
/// are taken and ignored; only the type matters.
#[derive(Deserialize)]
struct CreateTransport {
    trtype: String,
}

#[derive(Deserialize)]
struct GetSubsystems {
    nqn: Option<String>,
    #[allow(dead_code)]
    tgt_name: Option<String>,
}

#[derive(Deserialize)]
struct CreateSubsystem {
    nqn: String,
    #[allow(dead_code)]
    tgt_name: Option<String>,
    serial_number: Option<String>,
    model_number: Option<String>,
    #[allow(dead_code)]
    max_namespaces: Option<u32>,
    #[serde(default)]
    allow_any_host: bool,
    #[allow(dead_code)]
    ana_reporting: Option<bool>,
    min_cntlid: Option<u16>,
    max_cntlid: Option<u16>,
    #[serde(default)]
    passthrough: bool,
}

#[derive(Deserialize)]
struct SubsystemNqn {
    nqn: String,
    #[allow(dead_code)]
    tgt_name: Option<String>,
}

#[derive(Deserialize)]
struct ListenAddress {
    trtype: String,
    #[allow(dead_code)]
    adrfam: Option<String>,
    traddr: String,
    trsvcid: Option<String>,
}

#[derive(Deserialize)]
struct AddListener {
    nqn: String,
    listen_address: ListenAddress,
    /// TLS 1.3 on the listener (SPDK: the port then requires it).
    #[serde(default)]
    secure_channel: bool,
}

#[derive(Deserialize)]
struct KeyringFileKey {
    name: String,
    path: std::path::PathBuf,
}

#[derive(Deserialize)]
struct KeyName {
    name: String,
}

#[derive(Deserialize)]
struct NsSpec {
    bdev_name: String,
    nsid: Option<u32>,
    uuid: Option<String>,
    nguid: Option<String>,
    eui64: Option<String>,
    anagrpid: Option<u32>,
    #[serde(default)]
    no_auto_visible: bool,
}

#[derive(Deserialize)]
struct AddNs {
    nqn: String,
    namespace: NsSpec,
    #[allow(dead_code)]
    tgt_name: Option<String>,
}

#[derive(Deserialize)]
struct NsVisibleHost {
    nqn: String,
    nsid: u32,
    host: String,
    #[allow(dead_code)]
    tgt_name: Option<String>,
}

#[derive(Deserialize)]
struct RemoveNs {
    nqn: String,
    nsid: u32,
    #[allow(dead_code)]
    tgt_name: Option<String>,
}

#[derive(Deserialize)]
struct SubsystemHost {
    nqn: String,
    host: String,
    #[allow(dead_code)]
    tgt_name: Option<String>,
    psk: Option<String>,
    dhchap_key: Option<String>,
    dhchap_ctrlr_key: Option<String>,
    #[allow(dead_code)]
    timeout_ms: Option<u64>,
}

#[derive(Deserialize)]
struct TargetLun {
    bdev_name: String,
    lun_id: u64,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct PgIgMap {
    pg_tag: u32,
    ig_tag: u32,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct CreateTargetNode {
    name: String,
    alias_name: String,
    pg_ig_maps: Vec<PgIgMap>,
    luns: Vec<TargetLun>,
    queue_depth: i32,
    #[serde(default)]
    disable_chap: bool,
    #[serde(default)]
    require_chap: bool,
    #[serde(default)]
    mutual_chap: bool,
    #[serde(default)]
    chap_group: i32,
    #[serde(default)]
    header_digest: bool,
    #[serde(default)]
    data_digest: bool,
}

#[derive(Deserialize)]
struct TargetNodeName {
    name: String,
}

#[derive(Deserialize)]
struct NoParams {}

/// A target node name as SPDK completes it.
fn target_iqn(name: &str) -> String {
    if ["iqn.", "eui.", "naa."].iter().any(|p| name.starts_with(p)) { name.to_string() } else { format!("{SPDK_IQN_PREFIX}{name}") }
}

fn lvol_uuid(live: &Live, name: &str) -> Result<Value, RpcError> {
    let c = live.config();
    Ok(json!(pool::volume_uuid(pool::volume(&c, name).map_err(refused)?)))
}

/// SPDK refuses a name in use (EEXIST), whatever the parameters:
/// blockwire's idempotent answer is its own methods'.
fn name_free(live: &Live, name: &str) -> Result<(), RpcError> {
    match live.config().volumes.iter().any(|v| v.name == name) {
        true => Err(err(Refused::AlreadyExists, format!("a volume named {name} exists"))),
        false => Ok(()),
    }
}

fn listen_json(addr: &std::net::SocketAddr, trtype: &str) -> Value {
    json!({
        "trtype": trtype,
        "adrfam": if addr.is_ipv4() { "IPv4" } else { "IPv6" },
        "traddr": addr.ip().to_string(),
        "trsvcid": addr.port().to_string(),
    })
}

fn nvme_listeners(c: &ServeConfig) -> Vec<Value> {
    let n = c.nvme.clone().unwrap_or_default();
    n.listen.iter().map(|a| listen_json(a, "TCP")).chain(n.rdma_listen.iter().map(|a| listen_json(a, "RDMA"))).collect()
}

fn subsystem_json(c: &ServeConfig, s: &NvmeSubsystem) -> Value {
    let hosts: Vec<Value> = s.allowed_hosts.iter().chain(s.hosts.iter().map(|h| &h.nqn)).map(|h| json!({ "nqn": h })).collect();
    let [min, max] = c.nvme.as_ref().and_then(|n| n.cntlid_range).unwrap_or([1, 0xFFEF]);
    json!({
        "nqn": s.nqn,
        "subtype": "NVMe",
        "listen_addresses": nvme_listeners(c),
        "allow_any_host": s.allow_any_host.unwrap_or(s.allowed_hosts.is_empty() && s.hosts.is_empty()),
        "hosts": hosts,
        "serial_number": s.serial,
        "model_number": s.model.clone().unwrap_or_else(|| "blockwire".into()),
        "max_namespaces": 0,
        "min_cntlid": min,
        "max_cntlid": max,
        "namespaces": s.namespaces.iter().map(|n| {
            let v = c.volumes.iter().find(|v| v.name == n.volume);
            json!({
                "nsid": n.nsid,
                "bdev_name": v.map(bdev_name),
                "name": v.map(bdev_name),
                "uuid": v.map(pool::volume_uuid),
                "anagrpid": n.ana_group,
                "no_auto_visible": n.no_auto_visible,
                "hosts": n.hosts.iter().map(|h| json!({ "nqn": h })).collect::<Vec<_>>(),
            })
        }).collect::<Vec<_>>(),
    })
}

fn target_json(c: &ServeConfig, t: &IscsiTarget) -> Value {
    json!({
        "name": t.iqn,
        "alias_name": "",
        "pg_ig_maps": [],
        "luns": t.luns.iter().map(|l| json!({
            "bdev_name": c.volumes.iter().find(|v| v.name == l.volume).map(bdev_name),
            "lun_id": l.lun,
        })).collect::<Vec<_>>(),
        "queue_depth": 64,
        "disable_chap": t.chap.is_none(),
        "require_chap": t.chap.is_some(),
        "mutual_chap": t.mutual_chap.is_some(),
        "chap_group": 0,
        "header_digest": false,
        "data_digest": false,
    })
}

fn changed<T>(r: Result<T, Refused>) -> Result<Value, RpcError> {
    r.map(|_| json!(true)).map_err(refused)
}

/// Every SPDK-compatible method, in the order `rpc_get_methods` lists them.
pub const METHODS: &[Method] = &[
    Method { name: "bdev_get_bdevs", params: "{name?, timeout?}", call: |live, p| {
        let a: GetBdevs = params(p)?;
        let c = live.config();
        let sizes: HashMap<String, u64> = live.volume_sizes().into_iter().collect();
        let list: Vec<Value> = match &a.name {
            Some(n) => vec![bdev_json(&c, &sizes, bdev(&c, n)?)],
            None => c.volumes.iter().map(|v| bdev_json(&c, &sizes, v)).collect(),
        };
        Ok(json!(list))
    } },
    Method { name: "bdev_lvol_get_lvstores", params: "{uuid?, lvs_name?}", call: |live, p| {
        let a: GetLvstores = params(p)?;
        let c = live.config();
        Ok(json!(match (a.uuid.as_deref(), a.lvs_name.as_deref()) {
            (None, None) => c.pools.iter().map(|p| lvstore_json(&c, p)).collect::<Vec<_>>(),
            (u, n) => vec![lvstore_json(&c, lvstore(&c, u, n)?)],
        }))
    } },
    Method { name: "bdev_lvol_create", params: "{lvol_name, size_in_mib (or size in bytes), thin_provision?, uuid? | lvs_name?, clear_method?}", call: |live, p| {
        let a: LvolCreate = params(p)?;
        let size = size_of(a.size, a.size_in_mib)?;
        let pool_name = lvstore(&live.config(), a.uuid.as_deref(), a.lvs_name.as_deref())?.name.clone();
        name_free(live, &a.lvol_name)?;
        live.change_files(|c, _, f| pool::volume_create(c, f, &a.lvol_name, size, &pool_name, !a.thin_provision).map(drop)).map_err(refused)?;
        lvol_uuid(live, &a.lvol_name)
    } },
    Method { name: "bdev_lvol_delete", params: "{name}", call: |live, p| {
        let a: BdevName = params(p)?;
        let name = lvol(&live.config(), &a.name)?.name.clone();
        changed(live.change_files(|c, _, f| pool::volume_delete(c, f, &name)))
    } },
    Method { name: "bdev_set_qos_limit", params: "{name, rw_ios_per_sec?, rw_mbytes_per_sec?, r_mbytes_per_sec?, w_mbytes_per_sec?} (0: unlimited; absent: unchanged)", call: |live, p| {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Args {
            name: String,
            rw_ios_per_sec: Option<u64>,
            rw_mbytes_per_sec: Option<u64>,
            r_mbytes_per_sec: Option<u64>,
            w_mbytes_per_sec: Option<u64>,
            // blockwire's own, which SPDK lacks.
            r_ios_per_sec: Option<u64>,
            w_ios_per_sec: Option<u64>,
        }
        let a: Args = params(p)?;
        let name = bdev(&live.config(), &a.name)?.name.clone();
        let set = edit::QosUpdate { rw_ios_per_sec: a.rw_ios_per_sec, r_ios_per_sec: a.r_ios_per_sec, w_ios_per_sec: a.w_ios_per_sec, rw_mbytes_per_sec: a.rw_mbytes_per_sec, r_mbytes_per_sec: a.r_mbytes_per_sec, w_mbytes_per_sec: a.w_mbytes_per_sec };
        live.change(|c| edit::volume_set_qos(c, &name, &set).map(drop)).map_err(refused)?;
        Ok(json!(true))
    } },
    Method { name: "bdev_lvol_resize", params: "{name, size_in_mib (or size in bytes)}", call: |live, p| {
        let a: LvolResize = params(p)?;
        let size = size_of(a.size, a.size_in_mib)?;
        let name = lvol(&live.config(), &a.name)?.name.clone();
        changed(live.change(|c| edit::volume_resize(c, &name, size)))
    } },
    Method { name: "bdev_lvol_snapshot", params: "{lvol_name, snapshot_name}", call: |live, p| {
        let a: LvolSnapshot = params(p)?;
        let origin = lvol(&live.config(), &a.lvol_name)?.name.clone();
        name_free(live, &a.snapshot_name)?;
        live.change_files(|c, open, f| pool::volume_snapshot(c, open, f, &origin, &a.snapshot_name).map(drop)).map_err(refused)?;
        lvol_uuid(live, &a.snapshot_name)
    } },
    Method { name: "bdev_lvol_clone", params: "{snapshot_name, clone_name}", call: |live, p| {
        let a: LvolClone = params(p)?;
        let snap = lvol(&live.config(), &a.snapshot_name)?.name.clone();
        name_free(live, &a.clone_name)?;
        live.change_files(|c, _, f| pool::volume_clone(c, f, &snap, &a.clone_name).map(drop)).map_err(refused)?;
        lvol_uuid(live, &a.clone_name)
    } },
    Method { name: "bdev_lvol_inflate", params: "{name}", call: |live, p| {
        let a: BdevName = params(p)?;
        let name = lvol(&live.config(), &a.name)?.name.clone();
        changed(live.change(|c| pool::volume_inflate(c, &name)))
    } },
    Method { name: "bdev_aio_create", params: "{name, filename, block_size?: 512, readonly?, fallocate?, uuid?}", call: |live, p| {
        let a: AioCreate = params(p)?;
        if a.block_size.is_some_and(|b| b != BLOCK_SIZE) {
            return Err(err(Refused::Unsupported, format!("block_size {}: blockwire's volumes have {BLOCK_SIZE}-byte blocks", a.block_size.unwrap_or(0))));
        }
        let spec = BackendSpec { kind: BackendKind::File { path: a.filename.into(), size: None }, direct: false, sync: false, readonly: a.readonly };
        // A file name the configuration cannot carry (a comma would read
        // back as options) is refused by the change's checks.
        let v = VolumeConfig { uuid: a.uuid, ..VolumeConfig::new(a.name.clone(), spec) };
        live.change(|c| edit::volume_add(c, v)).map_err(refused)?;
        Ok(json!(a.name))
    } },
    Method { name: "bdev_aio_delete", params: "{name}", call: |live, p| {
        let a: BdevName = params(p)?;
        let c = live.config();
        let v = bdev(&c, &a.name)?;
        if v.pool.is_some() || !matches!(v.backend.kind, BackendKind::File { .. }) {
            return Err(err(Refused::NotFound, format!("bdev {} is not an aio bdev", a.name)));
        }
        changed(live.change(|c| edit::volume_remove(c, &a.name, false)))
    } },
    Method { name: "nvmf_create_transport", params: "{trtype, ...transport tunables (ignored)}", call: |live, p| {
        let a: CreateTransport = params(p)?;
        let n = live.config().nvme.unwrap_or_default();
        let served = match a.trtype.to_ascii_uppercase().as_str() {
            "TCP" => !n.listen.is_empty(),
            "RDMA" => !n.rdma_listen.is_empty(),
            _ => false,
        };
        if !served {
            return Err(err(Refused::Unsupported, format!("transport {} is not served: blockwire serves NVMe/TCP (--nvme) and NVMe/RDMA (--nvme-rdma) on the addresses given at start", a.trtype)));
        }
        Ok(json!(true))
    } },
    Method { name: "nvmf_get_subsystems", params: "{nqn?, tgt_name?}", call: |live, p| {
        let a: GetSubsystems = params(p)?;
        let c = live.config();
        let subs = c.nvme.iter().flat_map(|n| &n.subsystems);
        if let Some(nqn) = &a.nqn {
            let s = subs.clone().find(|s| &s.nqn == nqn).ok_or_else(|| err(Refused::NotFound, format!("no subsystem {nqn}")))?;
            return Ok(json!([subsystem_json(&c, s)]));
        }
        let discovery = json!({
            "nqn": DISCOVERY_NQN, "subtype": "Discovery", "listen_addresses": nvme_listeners(&c), "allow_any_host": true, "hosts": [],
        });
        Ok(json!(std::iter::once(discovery).chain(subs.map(|s| subsystem_json(&c, s))).collect::<Vec<_>>()))
    } },
    Method { name: "nvmf_create_subsystem", params: "{nqn, serial_number?, model_number?, allow_any_host?, max_namespaces?, ana_reporting?, min_cntlid?, max_cntlid?}", call: |live, p| {
        let a: CreateSubsystem = params(p)?;
        if a.passthrough {
            return Err(err(Refused::Unsupported, "passthrough subsystems pass an NVMe controller through; blockwire's namespaces are volumes"));
        }
        if a.min_cntlid.is_some() || a.max_cntlid.is_some() {
            return Err(err(Refused::Unsupported, "controller ids are per server here ([nvme] cntlid_range), not per subsystem"));
        }
        let s = NvmeSubsystem {
            nqn: a.nqn.clone(),
            namespaces: vec![],
            allowed_hosts: vec![],
            allow_any_host: Some(a.allow_any_host),
            serial: a.serial_number,
            model: a.model_number,
            ana_state: Default::default(),
            hosts: vec![],
        };
        live.change(|c| edit::nvme_subsystem_add(c, s)).map_err(refused)?;
        Ok(json!(true))
    } },
    Method { name: "nvmf_delete_subsystem", params: "{nqn, tgt_name?}", call: |live, p| {
        let a: SubsystemNqn = params(p)?;
        changed(live.change(|c| edit::nvme_subsystem_remove(c, &a.nqn)))
    } },
    Method { name: "nvmf_subsystem_add_listener", params: "{nqn, listen_address: {trtype, adrfam?, traddr, trsvcid}, ...}", call: |live, p| {
        let a: AddListener = params(p)?;
        let c = live.config();
        if a.nqn != "discovery" && a.nqn != DISCOVERY_NQN {
            c.nvme.iter().flat_map(|n| &n.subsystems).find(|s| s.nqn == a.nqn).ok_or_else(|| err(Refused::NotFound, format!("no subsystem {}", a.nqn)))?;
        }
        let l = &a.listen_address;
        let want = (l.trtype.to_ascii_uppercase(), l.traddr.clone(), l.trsvcid.clone().unwrap_or_default());
        let have = nvme_listeners(&c);
        let found = have.iter().any(|h| (h["trtype"].as_str().unwrap_or_default().to_string(), h["traddr"].as_str().unwrap_or_default().to_string(), h["trsvcid"].as_str().unwrap_or_default().to_string()) == want);
        if !found {
            return Err(err(Refused::Invalid, format!(
                "blockwire does not listen on {} {}:{} (listen addresses are fixed at start; every subsystem is served on each of them: {})",
                want.0, want.1, want.2, have.iter().map(|h| format!("{} {}:{}", h["trtype"], h["traddr"], h["trsvcid"])).collect::<Vec<_>>().join(", ")
            )));
        }
        if a.secure_channel {
            if want.0 != "TCP" {
                return Err(err(Refused::Invalid, "secure_channel: TLS is for NVMe/TCP listeners only"));
            }
            let addr: std::net::SocketAddr = format!("{}:{}", want.1, want.2).parse().map_err(|e| err(Refused::Invalid, format!("listen address {}:{}: {e}", want.1, want.2)))?;
            live.change(|c| edit::nvme_port_tls(c, addr, bw_serve::config::TlsMode::Required)).map_err(refused)?;
        }
        Ok(json!(true))
    } },
    Method { name: "nvmf_subsystem_add_ns", params: "{nqn, namespace: {bdev_name, nsid?, uuid?, nguid?, eui64?, anagrpid?, no_auto_visible?}}", call: |live, p| {
        let a: AddNs = params(p)?;
        let c = live.config();
        let volume = bdev(&c, &a.namespace.bdev_name)?.name.clone();
        let s = c.nvme.iter().flat_map(|n| &n.subsystems).find(|s| s.nqn == a.nqn).ok_or_else(|| err(Refused::NotFound, format!("no subsystem {}", a.nqn)))?;
        let nsid = a.namespace.nsid.filter(|&n| n != 0).unwrap_or_else(|| (1..).find(|n| !s.namespaces.iter().any(|x| x.nsid == *n)).unwrap_or(1));
        let mut ns = NvmeNamespace::new(nsid, volume, false, a.namespace.anagrpid.unwrap_or(1));
        (ns.uuid, ns.nguid, ns.eui64) = (a.namespace.uuid, a.namespace.nguid, a.namespace.eui64);
        ns.no_auto_visible = a.namespace.no_auto_visible;
        live.change(|c| edit::nvme_ns_add(c, &a.nqn, ns)).map_err(refused)?;
        Ok(json!(nsid))
    } },
    Method { name: "nvmf_subsystem_remove_ns", params: "{nqn, nsid}", call: |live, p| {
        let a: RemoveNs = params(p)?;
        changed(live.change(|c| edit::nvme_ns_remove(c, &a.nqn, a.nsid)))
    } },
    Method { name: "nvmf_ns_add_host", params: "{nqn, nsid, host, tgt_name?}", call: |live, p| {
        let a: NsVisibleHost = params(p)?;
        changed(live.change(|c| edit::nvme_ns_host(c, &a.nqn, a.nsid, &a.host, true)))
    } },
    Method { name: "nvmf_ns_remove_host", params: "{nqn, nsid, host, tgt_name?}", call: |live, p| {
        let a: NsVisibleHost = params(p)?;
        changed(live.change(|c| edit::nvme_ns_host(c, &a.nqn, a.nsid, &a.host, false)))
    } },
    Method { name: "keyring_file_add_key", params: "{name, path} (a file of mode 600 holding an NVMeTLSkey-1 PSK)", call: |live, p| {
        let a: KeyringFileKey = params(p)?;
        let key = bw_serve::config::NvmeKey { name: a.name, path: a.path };
        changed(live.change(|c| edit::nvme_key_add(c, key)))
    } },
    Method { name: "keyring_file_remove_key", params: "{name}", call: |live, p| {
        let a: KeyName = params(p)?;
        changed(live.change(|c| edit::nvme_key_remove(c, &a.name)))
    } },
    Method { name: "keyring_get_keys", params: "{}", call: |live, _p| {
        let c = live.config();
        let n = c.nvme.clone().unwrap_or_default();
        // As SPDK answers: name, path, how many hosts hold it; never the key.
        Ok(Value::Array(n.keys.iter().map(|k| {
            let refcnt = n.subsystems.iter().flat_map(|s| &s.hosts).filter(|h| h.tls_key.as_deref() == Some(k.name.as_str())).count();
            json!({ "name": k.name, "path": k.path, "module": "keyring_file", "removed": false, "probed": false, "refcnt": refcnt })
        }).collect()))
    } },
    Method { name: "nvmf_subsystem_add_host", params: "{nqn, host, psk?: KEY_NAME}", call: |live, p| {
        let a: SubsystemHost = params(p)?;
        if a.dhchap_key.is_some() || a.dhchap_ctrlr_key.is_some() {
            return Err(err(Refused::Unsupported, "dhchap_key: blockwire's keyring holds TLS PSKs only: give the DH-HMAC-CHAP secret itself with nvme_host_add {nqn, host, dhchap_secret}"));
        }
        match a.psk {
            // The PSK by its keyring name (keyring_file_add_key).
            Some(name) => {
                let mut h = bw_serve::config::NvmeHost::new(a.host.clone());
                h.tls_key = Some(name);
                changed(live.change(|c| edit::nvme_host_add(c, &a.nqn, h)))
            }
            None => changed(live.change(|c| edit::nvme_host_allow(c, &a.nqn, &a.host))),
        }
    } },
    Method { name: "nvmf_subsystem_remove_host", params: "{nqn, host}", call: |live, p| {
        let a: SubsystemHost = params(p)?;
        changed(live.change(|c| edit::nvme_host_remove(c, &a.nqn, &a.host)))
    } },
    Method { name: "iscsi_create_target_node", params: "{name, alias_name, pg_ig_maps, luns: [{bdev_name, lun_id}], queue_depth, disable_chap?, require_chap?, mutual_chap?, chap_group?, header_digest?, data_digest?}", call: |live, p| {
        let a: CreateTargetNode = params(p)?;
        if a.require_chap || a.mutual_chap || a.chap_group != 0 {
            return Err(err(Refused::Unsupported, "CHAP groups are SPDK's; set CHAP with iscsi_chap_set {iqn, chap: {user, secret}}"));
        }
        let c = live.config();
        let mut luns = Vec::new();
        for l in &a.luns {
            let v = bdev(&c, &l.bdev_name)?;
            luns.push(IscsiLun { lun: l.lun_id, volume: v.name.clone(), readonly: false });
        }
        let mut t: IscsiTarget = serde_json::from_value(json!({ "iqn": target_iqn(&a.name), "luns": [] })).map_err(|e| err(Refused::Invalid, e))?;
        t.luns = luns;
        live.change(|c| edit::iscsi_target_add(c, t)).map_err(refused)?;
        Ok(json!(true))
    } },
    Method { name: "iscsi_delete_target_node", params: "{name}", call: |live, p| {
        let a: TargetNodeName = params(p)?;
        changed(live.change(|c| edit::iscsi_target_remove(c, &target_iqn(&a.name))))
    } },
    Method { name: "iscsi_get_target_nodes", params: "{}", call: |live, p| {
        params::<NoParams>(p)?;
        let c = live.config();
        Ok(json!(c.iscsi.iter().flat_map(|i| &i.targets).map(|t| target_json(&c, t)).collect::<Vec<_>>()))
    } },
];

#[cfg(test)]
mod tests {
    use super::*;
    use bw_serve::start::not_started;

    const ENODEV: i64 = -(libc::ENODEV as i64);
    const EEXIST: i64 = -(libc::EEXIST as i64);
    const EINVAL: i64 = -(libc::EINVAL as i64);

    fn call(l: &Live, method: &str, p: Value) -> Result<Value, RpcError> {
        (METHODS.iter().find(|m| m.name == method).unwrap().call)(l, p)
    }

    /// Every refusal is numbered by its variant, whatever its message
    /// says (the numbers were once guessed from the text: "no ..." was
    /// ENODEV, "is exported" EBUSY, anything else EINVAL).
    #[test]
    fn errnos_follow_the_variant() {
        let m = || "no such thing is exported".to_string();
        for (r, code) in [
            (Refused::NotFound(m()), -19),
            (Refused::AlreadyExists(m()), -17),
            (Refused::Busy(m()), -16),
            (Refused::Invalid(m()), -22),
            (Refused::NeedsRestart(m()), -22),
            (Refused::Unsupported(m()), -22),
            (Refused::NoSpace(m()), -28),
            (Refused::Unavailable(m()), -11),
            (Refused::Io(m()), -5),
        ] {
            let e = refused(r.clone());
            assert_eq!(e.code, code, "{r:?}");
            assert!(e.message.ends_with(": no such thing is exported"), "{e:?}");
        }
    }

    /// An lvol's life through SPDK's methods on a pool in a temp dir
    /// (reflinks or not, the pool copies): names, aliases, the fields
    /// Cinder reads back, and SPDK's error codes.
    #[test]
    fn lvols_follow_spdk() {
        let dir = std::env::temp_dir().join(format!("bw-spdk-{}", std::process::id()));
        let mut cfg = ServeConfig::default();
        cfg.pools.push(bw_serve::config::PoolConfig { name: "lvs0".into(), path: dir.to_str().unwrap().into(), copy: true, ..Default::default() });
        pool::ensure_dir(&cfg.pools[0]).unwrap();
        let l = Live::new(cfg, &bw_serve::start::open_volumes(&ServeConfig::default()).unwrap(), not_started(), None);
        let stores = call(&l, "bdev_lvol_get_lvstores", json!({})).unwrap();
        assert_eq!((stores[0]["name"].as_str(), stores[0]["cluster_size"].as_u64()), (Some("lvs0"), Some(CLUSTER_SIZE)), "{stores}");
        let lvs = stores[0]["uuid"].as_str().unwrap().to_string();
        let uuid = call(&l, "bdev_lvol_create", json!({ "lvol_name": "v", "size": 8 << 20, "uuid": lvs, "thin_provision": true })).unwrap();
        let b = call(&l, "bdev_get_bdevs", json!({ "name": "lvs0/v" })).unwrap();
        assert_eq!((&b[0]["name"], &b[0]["aliases"][0], &b[0]["num_blocks"]), (&uuid, &json!("lvs0/v"), &json!(16384)), "{b}");
        assert_eq!(b[0]["driver_specific"]["lvol"]["lvol_store_uuid"], json!(lvs));
        // The name is taken: SPDK's EEXIST.
        let e = call(&l, "bdev_lvol_create", json!({ "lvol_name": "v", "size_in_mib": 8, "lvs_name": "lvs0" })).unwrap_err();
        assert_eq!(e.code, EEXIST, "{e:?}");
        call(&l, "bdev_lvol_snapshot", json!({ "lvol_name": uuid, "snapshot_name": "s" })).unwrap();
        call(&l, "bdev_lvol_clone", json!({ "snapshot_name": "lvs0/s", "clone_name": "c" })).unwrap();
        let s = call(&l, "bdev_get_bdevs", json!({ "name": "lvs0/s" })).unwrap();
        assert_eq!(s[0]["driver_specific"]["lvol"]["clones"], json!(["v", "c"]), "{s}");
        assert_eq!(s[0]["supported_io_types"]["write"], json!(false));
        let c = call(&l, "bdev_get_bdevs", json!({ "name": "lvs0/c" })).unwrap();
        assert_eq!(c[0]["driver_specific"]["lvol"]["base_snapshot"], json!("s"), "{c}");
        call(&l, "bdev_lvol_inflate", json!({ "name": "lvs0/c" })).unwrap();
        let c = call(&l, "bdev_get_bdevs", json!({ "name": "lvs0/c" })).unwrap();
        assert_eq!(c[0]["driver_specific"]["lvol"]["clone"], json!(false), "{c}");
        call(&l, "bdev_lvol_resize", json!({ "name": "lvs0/c", "size_in_mib": 16 })).unwrap();
        assert_eq!(call(&l, "bdev_get_bdevs", json!({ "name": "lvs0/c" })).unwrap()[0]["num_blocks"], json!(32768));
        for n in ["lvs0/c", "lvs0/s", "lvs0/v"] {
            assert_eq!(call(&l, "bdev_lvol_delete", json!({ "name": n })).unwrap(), json!(true));
        }
        assert_eq!(call(&l, "bdev_lvol_delete", json!({ "name": "lvs0/v" })).unwrap_err().code, ENODEV);
        assert_eq!(call(&l, "bdev_lvol_create", json!({ "lvol_name": "x", "size_in_mib": 1 })).unwrap_err().code, EINVAL);
        assert_eq!(call(&l, "bdev_get_bdevs", json!({})).unwrap(), json!([]));
        // A file name with a comma would read back from the configuration
        // as options (a file x of 64 MiB): refused, nothing added.
        let before = l.config();
        let e = call(&l, "bdev_aio_create", json!({ "name": "a", "filename": format!("{}/x,size=64M", dir.display()) })).unwrap_err();
        assert!(e.code == EINVAL && e.message.contains("comma"), "{e:?}");
        assert_eq!(l.config(), before);
        assert!(!dir.join("x").exists() && !dir.join("x,size=64M").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
