//! The CSI Controller service over blockwire gateways' control API.
//!
//! A CSI volume is a pool volume, its ID the volume's name
//! ([`names::id_of_name`]: the CSI name where it is a valid volume name);
//! a CSI snapshot a pool snapshot, its ID the snapshot's name. Every call
//! looks up what exists before it changes anything, so each is idempotent
//! by name: creating what exists with the same parameters answers it,
//! with other parameters is ALREADY_EXISTS; deleting what is gone is OK.
//!
//! Publishing gives a node's host NQN (or IQN) access to the volume's own
//! NVMe subsystem (or iSCSI target) on every gateway serving the volume;
//! the export is made on the first publish and removed with the last
//! unpublish, so an unpublished volume is exported nowhere (and an export
//! with no allowed host is never left behind: serve admits any host to a
//! subsystem whose list is empty only with `allow_any_host`, which these
//! never set).

use crate::gateways::{self, Gateway, PoolInfo, VolumeInfo};
use crate::names::{self, NodeId};
use crate::proto::{self, controller_server::Controller};
use crate::rpc::Credentials;
use crate::status::{from_rpc, required, required_msg};
use crate::{capability, qos, Protocol};
use serde_json::{json, Value};
use std::collections::HashMap;
use tonic::{Request, Response, Status};

/// Size of a volume whose request gives no capacity.
pub const DEFAULT_SIZE: u64 = 1 << 30;
/// Volume sizes are whole 4 KiB blocks (what every file system on them
/// and every initiator's block size divides).
const GRANULE: u64 = 4096;

pub struct ControllerService {
    pub gateways: Vec<Gateway>,
    /// Used where a request carries no secrets (ListVolumes, GetCapacity,
    /// ListSnapshots carry none by design).
    pub credentials: Option<Credentials>,
    pub nqn_prefix: String,
    pub iqn_prefix: String,
    /// Serialises changes: two calls for one name never interleave (the
    /// CO may retry a slow CreateVolume while the first still runs).
    pub lock: tokio::sync::Mutex<()>,
}

/// Where a volume is: the gateway that made it (its pool's) and the
/// others serving it (an RBD pool configured on several gateways).
struct Placement<'a> {
    home: &'a Gateway,
    peers: Vec<&'a Gateway>,
    info: VolumeInfo,
}

impl<'a> Placement<'a> {
    fn all(&self) -> impl Iterator<Item = &'a Gateway> + '_ {
        std::iter::once(self.home).chain(self.peers.iter().copied())
    }
}

/// The StorageClass parameters the plugin takes (`csi.storage.k8s.io/*`
/// keys are the external-provisioner's own and are passed over).
struct Params {
    pool: Option<String>,
    protocol: Protocol,
    fs: Option<String>,
    /// `nvmeSubsystem: shared`: publish through one subsystem shared by
    /// the class's volumes, a namespace per volume shown only to the
    /// hosts it is published to (ceph-csi's NVMe-oF way); `per-volume`
    /// (the default): a subsystem per volume (democratic-csi's).
    shared: bool,
}

/// The `nvmeSubsystem` parameter's values, and the volume context key
/// that carries the choice to ControllerPublishVolume.
const SUBSYSTEM_KEY: &str = "nvmeSubsystem";
const SHARED: &str = "shared";
const PER_VOLUME: &str = "per-volume";

fn params(p: &HashMap<String, String>) -> Result<Params, Status> {
    let mut out = Params { pool: None, protocol: Protocol::NvmeTcp, fs: None, shared: false };
    for (k, v) in p {
        match k.as_str() {
            "pool" => out.pool = Some(v.clone()),
            SUBSYSTEM_KEY => {
                out.shared = match v.as_str() {
                    SHARED => true,
                    PER_VOLUME => false,
                    _ => return Err(Status::invalid_argument(format!("parameter {k}: {v:?} is not {SHARED} or {PER_VOLUME}"))),
                }
            }
            "protocol" => out.protocol = v.parse().map_err(Status::invalid_argument)?,
            "fs" | "fsType" => {
                if !capability::FILE_SYSTEMS.contains(&v.as_str()) {
                    return Err(Status::invalid_argument(format!("parameter {k}: {v:?} is not one of {}", capability::FILE_SYSTEMS.join(", "))));
                }
                out.fs = Some(v.clone())
            }
            k if k.starts_with("csi.storage.k8s.io/") => {}
            _ => return Err(Status::invalid_argument(format!("parameter {k:?} is not known (pool, protocol, fs, {SUBSYSTEM_KEY})"))),
        }
    }
    if out.shared && out.protocol == Protocol::Iscsi {
        return Err(Status::invalid_argument(format!("parameter {SUBSYSTEM_KEY}: {SHARED} is for the NVMe protocols")));
    }
    Ok(out)
}

/// The size for a capacity range: the required bytes rounded up to
/// [`GRANULE`] ([`DEFAULT_SIZE`] if neither bound is given, the limit if
/// only it is), OUT_OF_RANGE if that passes the limit.
pub fn size_for(range: Option<&proto::CapacityRange>) -> Result<u64, Status> {
    let (req, lim) = range.map(|r| (r.required_bytes, r.limit_bytes)).unwrap_or((0, 0));
    if req < 0 || lim < 0 {
        return Err(Status::invalid_argument(format!("capacity range {req}..{lim}: negative")));
    }
    let (req, lim) = (req as u64, lim as u64);
    let size = match (req, lim) {
        (0, 0) => DEFAULT_SIZE,
        (0, l) => l / GRANULE * GRANULE,
        (r, _) => r.checked_next_multiple_of(GRANULE).ok_or_else(|| Status::out_of_range(format!("{r} bytes: too large")))?,
    };
    if size == 0 || (lim != 0 && size > lim) {
        return Err(Status::out_of_range(format!("no size of whole {GRANULE}-byte blocks lies in {req}..{lim} bytes")));
    }
    Ok(size)
}

fn fits(size: u64, range: Option<&proto::CapacityRange>) -> bool {
    let Some(r) = range else { return true };
    size >= r.required_bytes.max(0) as u64 && (r.limit_bytes <= 0 || size <= r.limit_bytes as u64)
}

fn creds_of(secrets: &HashMap<String, String>, default: &Option<Credentials>) -> Option<Credentials> {
    Credentials::from_secrets(secrets).or_else(|| default.clone())
}

fn timestamp(unix: Option<i64>) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds: unix.unwrap_or(0), nanos: 0 }
}

impl ControllerService {
    /// The volume `id` and where it is; None if no gateway has it.
    async fn find(&self, creds: Option<&Credentials>, id: &str) -> Result<Option<Placement<'_>>, Status> {
        let mut home = None;
        let mut peers = vec![];
        for g in &self.gateways {
            if let Some(v) = g.volume(creds, id).await.map_err(from_rpc)? {
                if home.is_none() && v.pool.is_some() {
                    home = Some((g, v));
                } else {
                    peers.push(g);
                }
            }
        }
        Ok(home.map(|(home, info)| Placement { home, peers, info }))
    }

    /// The gateway holding pool `name` (the first, in configuration
    /// order) and, for an RBD pool, the others that have it too.
    async fn pool(&self, creds: Option<&Credentials>, name: Option<&str>) -> Result<(&Gateway, PoolInfo, Vec<&Gateway>), Status> {
        let mut found: Vec<(&Gateway, PoolInfo)> = vec![];
        for g in &self.gateways {
            for p in g.pools(creds).await.map_err(from_rpc)? {
                if name.is_none_or(|n| n == p.name) {
                    found.push((g, p));
                }
            }
        }
        let Some((home, p)) = found.first().cloned() else {
            return Err(match name {
                Some(n) => Status::invalid_argument(format!("parameter pool: no gateway has a pool {n:?}")),
                None => Status::failed_precondition("no gateway has a pool (pool_create)"),
            });
        };
        if name.is_none() && found.len() > 1 {
            return Err(Status::invalid_argument("the gateways have several pools: name one with the StorageClass parameter pool"));
        }
        let peers = if p.rbd.is_some() { found[1..].iter().filter(|(_, q)| q.rbd == p.rbd).map(|(g, _)| *g).collect() } else { vec![] };
        Ok((home, p, peers))
    }

    fn volume_of(&self, v: &VolumeInfo, ctx: HashMap<String, String>, source: Option<proto::VolumeContentSource>) -> proto::Volume {
        proto::Volume { capacity_bytes: v.provisioned_bytes as i64, volume_id: v.name.clone(), volume_context: ctx, content_source: source, accessible_topology: vec![] }
    }

    /// Open a new RBD pool volume on the pool's other gateways.
    async fn open_on_peers(&self, creds: Option<&Credentials>, v: &VolumeInfo, peers: &[&Gateway]) -> Result<(), Status> {
        let Some(add) = gateways::peer_volume_add(v) else { return Ok(()) };
        for g in peers {
            if g.volume(creds, &v.name).await.map_err(from_rpc)?.is_none() {
                g.call(creds, "volume_add", add.clone()).await.map_err(from_rpc)?;
            }
        }
        Ok(())
    }

    async fn set_qos(&self, creds: Option<&Credentials>, p: &Placement<'_>, limits: serde_json::Map<String, Value>) -> Result<(), Status> {
        if limits.is_empty() {
            return Ok(());
        }
        let mut params = limits;
        params.insert("name".into(), json!(p.info.name));
        for g in p.all() {
            g.call(creds, "bdev_set_qos_limit", Value::Object(params.clone())).await.map_err(from_rpc)?;
        }
        Ok(())
    }

    /// The nodes (host NQNs or IQNs) the volume is published to, over
    /// all its gateways' exports.
    async fn published(&self, creds: Option<&Credentials>, p: &Placement<'_>) -> Result<Vec<String>, Status> {
        let mut nodes = vec![];
        for g in p.all() {
            let st = g.status(creds).await.map_err(from_rpc)?;
            let mut hosts = gateways::subsystem_hosts(&st, &names::subsystem_nqn(&self.nqn_prefix, &p.info.name)).unwrap_or_default();
            hosts.extend(gateways::shared_namespace(&st, &names::shared_subsystem_nqn(&self.nqn_prefix), &p.info.name).map(|(_, h)| h).unwrap_or_default());
            let inits = gateways::target_initiators(&st, &names::target_iqn(&self.iqn_prefix, &p.info.name)).unwrap_or_default();
            for n in hosts.into_iter().chain(inits) {
                if !nodes.contains(&n) {
                    nodes.push(n);
                }
            }
        }
        Ok(nodes)
    }

    /// The NSID volume `id` has in the shared subsystem: the one it has
    /// on a gateway already, else the lowest free on every gateway.
    async fn shared_nsid(&self, creds: Option<&Credentials>, p: &Placement<'_>, id: &str) -> Result<u32, Status> {
        let nqn = names::shared_subsystem_nqn(&self.nqn_prefix);
        let mut used = vec![];
        for g in p.all() {
            let st = g.status(creds).await.map_err(from_rpc)?;
            if let Some((nsid, _)) = gateways::shared_namespace(&st, &nqn, id) {
                return Ok(nsid);
            }
            used.extend(gateways::nsids_in_use(&st, &nqn));
        }
        (1..u32::MAX).find(|n| !used.contains(n)).ok_or_else(|| Status::resource_exhausted("no free NSID in the shared subsystem"))
    }

    /// On gateway `g` (whose `status` is `st`): the shared subsystem made
    /// if missing, `host` allowed on it, volume `id` its namespace `nsid`
    /// shown to `host` (and to no host not given it). Returns the NSID.
    #[allow(clippy::too_many_arguments)]
    async fn publish_shared(&self, creds: Option<&Credentials>, g: &Gateway, st: &Value, nqn: &str, id: &str, host: &str, nsid: u32) -> Result<u32, Status> {
        match gateways::subsystem_hosts(st, nqn) {
            None => {
                g.call(creds, "nvme_subsystem_add", json!({ "nqn": nqn, "namespaces": [], "allowed_hosts": [host], "allow_any_host": false })).await.map_err(from_rpc)?;
            }
            Some(hosts) if !hosts.iter().any(|h| h == host) => {
                g.call(creds, "nvme_host_add", json!({ "nqn": nqn, "host": host })).await.map_err(from_rpc)?;
            }
            Some(_) => {}
        }
        match gateways::shared_namespace(st, nqn, id) {
            None => {
                g.call(creds, "nvme_ns_add", json!({ "nqn": nqn, "nsid": nsid, "volume": id, "no_auto_visible": true, "hosts": [host] })).await.map_err(from_rpc)?;
                Ok(nsid)
            }
            Some((nsid, hosts)) => {
                if !hosts.iter().any(|h| h == host) {
                    g.call(creds, "nvme_ns_host_add", json!({ "nqn": nqn, "nsid": nsid, "host": host })).await.map_err(from_rpc)?;
                }
                Ok(nsid)
            }
        }
    }

    /// Volume `id`'s namespace `nsid` of the shared subsystem on `g`
    /// hidden from `host` (every host if None): the namespace removed
    /// with its last host, a host no namespace is shown to removed from
    /// the subsystem, and the subsystem with its last namespace.
    async fn unpublish_shared(&self, creds: Option<&Credentials>, g: &Gateway, nqn: &str, nsid: u32, hosts: &[String], host: Option<&str>) -> Result<(), Status> {
        let left: Vec<&String> = hosts.iter().filter(|h| host.is_some_and(|n| n != h.as_str())).collect();
        if left.is_empty() {
            g.call(creds, "nvme_ns_remove", json!({ "nqn": nqn, "nsid": nsid })).await.map_err(from_rpc)?;
        } else if let Some(h) = host.filter(|h| hosts.iter().any(|x| x == h)) {
            g.call(creds, "nvme_ns_host_remove", json!({ "nqn": nqn, "nsid": nsid, "host": h })).await.map_err(from_rpc)?;
        }
        let st = g.status(creds).await.map_err(from_rpc)?;
        if gateways::nsids_in_use(&st, nqn).is_empty() {
            g.call(creds, "nvme_subsystem_remove", json!({ "nqn": nqn })).await.map_err(from_rpc)?;
            return Ok(());
        }
        let gone: Vec<&String> = hosts.iter().filter(|h| host.is_none_or(|n| n == h.as_str())).collect();
        for h in gone {
            if !gateways::host_has_namespaces(&st, nqn, h) && gateways::subsystem_hosts(&st, nqn).is_some_and(|a| a.contains(h)) {
                g.call(creds, "nvme_host_remove", json!({ "nqn": nqn, "host": h })).await.map_err(from_rpc)?;
            }
        }
        Ok(())
    }
}

impl ControllerService {
    /// Where a clone of `src` (a snapshot if `is_snap`, else a volume)
    /// goes: its source's gateway and pool, once the request is checked
    /// against the source.
    async fn source_placement(&self, creds: Option<&Credentials>, is_snap: bool, src: &str, par: &Params, r: &proto::CreateVolumeRequest) -> Result<(&Gateway, PoolInfo, Vec<&Gateway>), Status> {
        let Some(sp) = self.find(creds, src).await? else {
            return Err(Status::not_found(format!("source {} {src} not found", if is_snap { "snapshot" } else { "volume" })));
        };
        if sp.info.snapshot_of.is_some() != is_snap {
            return Err(Status::not_found(format!("{src} is not a {}", if is_snap { "snapshot" } else { "volume" })));
        }
        if par.pool.as_deref().is_some_and(|want| sp.info.pool.as_deref() != Some(want)) {
            return Err(Status::invalid_argument(format!("source {src} is in pool {:?}, not {:?}: clones stay in their source's pool", sp.info.pool, par.pool)));
        }
        if r.capacity_range.as_ref().is_some_and(|c| c.limit_bytes > 0 && sp.info.provisioned_bytes > c.limit_bytes as u64) {
            return Err(Status::out_of_range(format!("source {src} is {} bytes, more than the limit asked", sp.info.provisioned_bytes)));
        }
        let pool = PoolInfo { name: sp.info.pool.clone().unwrap_or_default(), rbd: None, free_bytes: None };
        Ok((sp.home, pool, sp.peers))
    }
}

/// What of an existing volume `v` differs from a CreateVolume request for
/// it (none: the request is answered with it).
fn differences(v: &VolumeInfo, r: &proto::CreateVolumeRequest, par: &Params, source_id: &Option<(bool, String)>, id: &str) -> Vec<String> {
    let mut differs = vec![];
    if v.snapshot_of.is_some() {
        differs.push("it is a snapshot".to_string());
    }
    if !fits(v.provisioned_bytes, r.capacity_range.as_ref()) {
        differs.push(format!("its size is {} bytes", v.provisioned_bytes));
    }
    if par.pool.as_deref().is_some_and(|want| v.pool.as_deref() != Some(want)) {
        differs.push(format!("it is in pool {:?}", v.pool));
    }
    match source_id {
        Some((true, s)) if v.clone_of.as_deref() != Some(s) => differs.push(format!("it is not a clone of snapshot {s}")),
        Some((false, s)) if v.clone_of.as_deref() != Some(&clone_source_name(id)) => differs.push(format!("it is not a clone of volume {s}")),
        _ => {}
    }
    differs
}

/// Make volume `id` on `home`: a new one in `pool`, a clone of a snapshot
/// (`(true, snapshot)`), or a clone of a volume (`(false, volume)`).
async fn make_volume(home: &Gateway, creds: Option<&Credentials>, source_id: &Option<(bool, String)>, id: &str, size: u64, pool: &PoolInfo) -> Result<(), Status> {
    match source_id {
        None => {
            home.call(creds, "volume_create", json!({ "name": id, "size": size, "pool": pool.name })).await.map_err(from_rpc)?;
        }
        Some((true, snap)) => {
            home.call(creds, "volume_clone", json!({ "snapshot": snap, "name": id })).await.map_err(from_rpc)?;
        }
        Some((false, vol)) => {
            // A clone of a volume: of a snapshot taken for it, which a
            // directory pool drops at once (the clone's reflinked
            // extents are its own); RBD keeps it (the clone's parent).
            let snap = clone_source_name(id);
            home.call(creds, "volume_snapshot", json!({ "name": vol, "snapshot": snap })).await.map_err(from_rpc)?;
            home.call(creds, "volume_clone", json!({ "snapshot": snap, "name": id })).await.map_err(from_rpc)?;
            let kept = home.volume(creds, &snap).await.map_err(from_rpc)?.is_some_and(|s| s.backend.starts_with("rbd:"));
            if !kept {
                home.call(creds, "volume_delete", json!({ "name": snap })).await.map_err(from_rpc)?;
            }
        }
    }
    Ok(())
}

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn controller_get_capabilities(&self, _: Request<proto::ControllerGetCapabilitiesRequest>) -> Result<Response<proto::ControllerGetCapabilitiesResponse>, Status> {
        use proto::controller_service_capability::{rpc::Type as T, Rpc, Type};
        let caps = [
            T::CreateDeleteVolume,
            T::PublishUnpublishVolume,
            T::ListVolumes,
            T::GetCapacity,
            T::CreateDeleteSnapshot,
            T::ListSnapshots,
            T::CloneVolume,
            T::ExpandVolume,
            T::ListVolumesPublishedNodes,
            T::GetVolume,
            T::SingleNodeMultiWriter,
            T::ModifyVolume,
            T::GetSnapshot,
        ];
        Ok(Response::new(proto::ControllerGetCapabilitiesResponse {
            capabilities: caps.iter().map(|t| proto::ControllerServiceCapability { r#type: Some(Type::Rpc(Rpc { r#type: *t as i32 })) }).collect(),
        }))
    }

    async fn create_volume(&self, req: Request<proto::CreateVolumeRequest>) -> Result<Response<proto::CreateVolumeResponse>, Status> {
        use proto::volume_content_source::Type as Source;
        let r = req.into_inner();
        let name = required("name", &r.name)?;
        if name.len() > names::MAX_NAME {
            return Err(Status::invalid_argument(format!("name: {} bytes, at most {}", name.len(), names::MAX_NAME)));
        }
        capability::check(&r.volume_capabilities).map_err(Status::invalid_argument)?;
        let par = params(&r.parameters)?;
        let limits = qos::limits(&r.mutable_parameters)?;
        let size = size_for(r.capacity_range.as_ref())?;
        let creds = creds_of(&r.secrets, &self.credentials);
        let creds = creds.as_ref();
        let id = names::id_of_name(name);
        let mut ctx = HashMap::from([("protocol".to_string(), par.protocol.to_string())]);
        if let Some(fs) = &par.fs {
            ctx.insert("fs".into(), fs.clone());
        }
        if par.shared {
            ctx.insert(SUBSYSTEM_KEY.into(), SHARED.into());
        }
        let _g = self.lock.lock().await;
        let source_id = match r.volume_content_source.as_ref().and_then(|s| s.r#type.as_ref()) {
            Some(Source::Snapshot(s)) => Some((true, required("volume_content_source.snapshot.snapshot_id", &s.snapshot_id)?.to_string())),
            Some(Source::Volume(v)) => Some((false, required("volume_content_source.volume.volume_id", &v.volume_id)?.to_string())),
            None => None,
        };
        if let Some(p) = self.find(creds, &id).await? {
            let v = &p.info;
            let differs = differences(v, &r, &par, &source_id, &id);
            if !differs.is_empty() {
                return Err(Status::already_exists(format!("volume {id} (name {name:?}) exists with other parameters: {}", differs.join("; "))));
            }
            let v = v.clone();
            self.open_on_peers(creds, &v, &p.peers).await?;
            self.set_qos(creds, &p, limits).await?;
            return Ok(Response::new(proto::CreateVolumeResponse { volume: Some(self.volume_of(&v, ctx, r.volume_content_source)) }));
        }
        let (home, pool, peers) = match &source_id {
            None => self.pool(creds, par.pool.as_deref()).await?,
            Some((is_snap, src)) => self.source_placement(creds, *is_snap, src, &par, &r).await?,
        };
        make_volume(home, creds, &source_id, &id, size, &pool).await?;
        let source = if source_id.is_none() { None } else { r.volume_content_source.clone() };
        let mut v = home.volume(creds, &id).await.map_err(from_rpc)?.ok_or_else(|| Status::internal(format!("volume {id} made but not listed")))?;
        // A clone is its source's size unless more was asked.
        let asked = r.capacity_range.as_ref().is_some_and(|c| c.required_bytes > 0);
        if v.provisioned_bytes < size && (source_id.is_none() || asked) {
            home.call(creds, "volume_resize", json!({ "name": id, "size": size })).await.map_err(from_rpc)?;
            v.provisioned_bytes = size;
        }
        self.open_on_peers(creds, &v, &peers).await?;
        let p = Placement { home, peers, info: v.clone() };
        self.set_qos(creds, &p, limits).await?;
        log::info!("created volume {id} ({} bytes, pool {}, {})", v.provisioned_bytes, v.pool.as_deref().unwrap_or("-"), par.protocol);
        Ok(Response::new(proto::CreateVolumeResponse { volume: Some(self.volume_of(&v, ctx, source)) }))
    }

    async fn delete_volume(&self, req: Request<proto::DeleteVolumeRequest>) -> Result<Response<proto::DeleteVolumeResponse>, Status> {
        let r = req.into_inner();
        let id = required("volume_id", &r.volume_id)?;
        let creds = creds_of(&r.secrets, &self.credentials);
        let creds = creds.as_ref();
        let _g = self.lock.lock().await;
        let Some(p) = self.find(creds, id).await? else {
            return Ok(Response::new(proto::DeleteVolumeResponse {}));
        };
        if p.info.snapshot_of.is_some() {
            return Err(Status::invalid_argument(format!("{id} is a snapshot: DeleteSnapshot")));
        }
        let nodes = self.published(creds, &p).await?;
        if !nodes.is_empty() {
            return Err(Status::failed_precondition(format!("volume {id} is published to {}: ControllerUnpublishVolume first", nodes.join(", "))));
        }
        for g in &p.peers {
            g.call(creds, "volume_remove", json!({ "name": id })).await.map_err(from_rpc)?;
        }
        p.home.call(creds, "volume_delete", json!({ "name": id })).await.map_err(from_rpc)?;
        log::info!("deleted volume {id}");
        Ok(Response::new(proto::DeleteVolumeResponse {}))
    }

    async fn controller_publish_volume(&self, req: Request<proto::ControllerPublishVolumeRequest>) -> Result<Response<proto::ControllerPublishVolumeResponse>, Status> {
        let r = req.into_inner();
        let id = required("volume_id", &r.volume_id)?;
        let node = required("node_id", &r.node_id)?;
        let cap = required_msg("volume_capability", &r.volume_capability)?;
        capability::check(std::slice::from_ref(cap)).map_err(Status::invalid_argument)?;
        if r.readonly {
            return Err(Status::invalid_argument("readonly publishing is not supported (PUBLISH_READONLY is not advertised): mount read-only on the node"));
        }
        let creds = creds_of(&r.secrets, &self.credentials);
        let creds = creds.as_ref();
        let _g = self.lock.lock().await;
        let Some(p) = self.find(creds, id).await? else {
            return Err(Status::not_found(format!("volume {id} not found")));
        };
        let node = NodeId::parse(node).ok_or_else(|| Status::not_found(format!("node {node:?}: not a node of this plugin (\"HOSTNQN IQN\")")))?;
        let protocol: Protocol = r.volume_context.get("protocol").map(|s| s.parse()).transpose().map_err(Status::invalid_argument)?.unwrap_or(Protocol::NvmeTcp);
        let shared = r.volume_context.get(SUBSYSTEM_KEY).is_some_and(|v| v == SHARED);
        let mut ctx = HashMap::from([("protocol".to_string(), protocol.to_string())]);
        let mut addresses = vec![];
        // In a shared subsystem the namespace has one NSID on every gateway
        // (multipath joins paths by it): one free on all of them.
        let nsid = if shared { self.shared_nsid(creds, &p, id).await? } else { 1 };
        for g in p.all() {
            let st = g.status(creds).await.map_err(from_rpc)?;
            match protocol {
                Protocol::NvmeTcp | Protocol::NvmeRdma if shared => {
                    let nqn = names::shared_subsystem_nqn(&self.nqn_prefix);
                    let nsid = self.publish_shared(creds, g, &st, &nqn, id, &node.host_nqn, nsid).await?;
                    ctx.insert("nqn".into(), nqn);
                    ctx.insert("nsid".into(), nsid.to_string());
                    addresses.extend(g.nvme_addresses(&st, protocol == Protocol::NvmeRdma));
                }
                Protocol::NvmeTcp | Protocol::NvmeRdma => {
                    let nqn = names::subsystem_nqn(&self.nqn_prefix, id);
                    match gateways::subsystem_hosts(&st, &nqn) {
                        None => {
                            g.call(creds, "nvme_subsystem_add", json!({ "nqn": nqn, "namespaces": [{ "nsid": 1, "volume": id }], "allowed_hosts": [node.host_nqn], "allow_any_host": false })).await.map_err(from_rpc)?;
                        }
                        Some(hosts) if !hosts.contains(&node.host_nqn) => {
                            g.call(creds, "nvme_host_add", json!({ "nqn": nqn, "host": node.host_nqn })).await.map_err(from_rpc)?;
                        }
                        Some(_) => {}
                    }
                    ctx.insert("nqn".into(), nqn);
                    ctx.insert("nsid".into(), "1".into());
                    for a in g.nvme_addresses(&st, protocol == Protocol::NvmeRdma) {
                        addresses.push(a);
                    }
                }
                Protocol::Iscsi => {
                    let iqn = names::target_iqn(&self.iqn_prefix, id);
                    match gateways::target_initiators(&st, &iqn) {
                        None => {
                            g.call(creds, "iscsi_target_add", json!({ "iqn": iqn, "luns": [{ "lun": 0, "volume": id }], "allowed_initiators": [node.iqn] })).await.map_err(from_rpc)?;
                        }
                        Some(inits) if !inits.contains(&node.iqn) => {
                            g.call(creds, "iscsi_acl_add", json!({ "iqn": iqn, "initiator": node.iqn })).await.map_err(from_rpc)?;
                        }
                        Some(_) => {}
                    }
                    ctx.insert("iqn".into(), iqn);
                    ctx.insert("lun".into(), "0".into());
                    addresses.extend(g.config.iscsi.iter().cloned());
                }
            }
        }
        if addresses.is_empty() {
            return Err(Status::failed_precondition(format!("no gateway of volume {id} has an address for {protocol} (the plugin's gateway configuration)")));
        }
        ctx.insert("addresses".into(), addresses.join(","));
        log::info!("published volume {id} to {}", node.encode());
        Ok(Response::new(proto::ControllerPublishVolumeResponse { publish_context: ctx }))
    }

    async fn controller_unpublish_volume(&self, req: Request<proto::ControllerUnpublishVolumeRequest>) -> Result<Response<proto::ControllerUnpublishVolumeResponse>, Status> {
        let r = req.into_inner();
        let id = required("volume_id", &r.volume_id)?;
        let creds = creds_of(&r.secrets, &self.credentials);
        let creds = creds.as_ref();
        let _g = self.lock.lock().await;
        let Some(p) = self.find(creds, id).await? else {
            return Ok(Response::new(proto::ControllerUnpublishVolumeResponse {}));
        };
        // An empty node ID: unpublish from every node (CSI).
        let node = if r.node_id.is_empty() { None } else { Some(NodeId::parse(&r.node_id).ok_or_else(|| Status::not_found(format!("node {:?}: not a node of this plugin", r.node_id)))?) };
        let nqn = names::subsystem_nqn(&self.nqn_prefix, id);
        let iqn = names::target_iqn(&self.iqn_prefix, id);
        let shared = names::shared_subsystem_nqn(&self.nqn_prefix);
        for g in p.all() {
            let st = g.status(creds).await.map_err(from_rpc)?;
            if let Some((nsid, hosts)) = gateways::shared_namespace(&st, &shared, id) {
                self.unpublish_shared(creds, g, &shared, nsid, &hosts, node.as_ref().map(|n| n.host_nqn.as_str())).await?;
            }
            if let Some(hosts) = gateways::subsystem_hosts(&st, &nqn) {
                let left: Vec<_> = hosts.iter().filter(|h| node.as_ref().is_some_and(|n| &n.host_nqn != *h)).collect();
                if left.is_empty() {
                    g.call(creds, "nvme_subsystem_remove", json!({ "nqn": nqn })).await.map_err(from_rpc)?;
                } else if let Some(n) = node.as_ref().filter(|n| hosts.contains(&n.host_nqn)) {
                    g.call(creds, "nvme_host_remove", json!({ "nqn": nqn, "host": n.host_nqn })).await.map_err(from_rpc)?;
                }
            }
            if let Some(inits) = gateways::target_initiators(&st, &iqn) {
                let left: Vec<_> = inits.iter().filter(|i| node.as_ref().is_some_and(|n| &n.iqn != *i)).collect();
                if left.is_empty() {
                    g.call(creds, "iscsi_target_remove", json!({ "iqn": iqn })).await.map_err(from_rpc)?;
                } else if let Some(n) = node.as_ref().filter(|n| inits.contains(&n.iqn)) {
                    g.call(creds, "iscsi_acl_remove", json!({ "iqn": iqn, "initiator": n.iqn })).await.map_err(from_rpc)?;
                }
            }
        }
        log::info!("unpublished volume {id} from {}", node.map(|n| n.encode()).unwrap_or_else(|| "every node".into()));
        Ok(Response::new(proto::ControllerUnpublishVolumeResponse {}))
    }

    async fn validate_volume_capabilities(&self, req: Request<proto::ValidateVolumeCapabilitiesRequest>) -> Result<Response<proto::ValidateVolumeCapabilitiesResponse>, Status> {
        let r = req.into_inner();
        let id = required("volume_id", &r.volume_id)?;
        if r.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument("volume_capabilities is required"));
        }
        let creds = creds_of(&r.secrets, &self.credentials);
        if self.find(creds.as_ref(), id).await?.is_none() {
            return Err(Status::not_found(format!("volume {id} not found")));
        }
        let answer = match capability::check(&r.volume_capabilities).and_then(|()| params(&r.parameters).map(|_| ()).map_err(|s| s.message().to_string())) {
            Ok(()) => proto::ValidateVolumeCapabilitiesResponse {
                confirmed: Some(proto::validate_volume_capabilities_response::Confirmed {
                    volume_context: r.volume_context,
                    volume_capabilities: r.volume_capabilities,
                    parameters: r.parameters,
                    mutable_parameters: r.mutable_parameters,
                }),
                message: String::new(),
            },
            Err(why) => proto::ValidateVolumeCapabilitiesResponse { confirmed: None, message: why },
        };
        Ok(Response::new(answer))
    }

    async fn list_volumes(&self, req: Request<proto::ListVolumesRequest>) -> Result<Response<proto::ListVolumesResponse>, Status> {
        let r = req.into_inner();
        let creds = self.credentials.as_ref();
        let mut all: Vec<(VolumeInfo, Vec<String>)> = vec![];
        for g in &self.gateways {
            for v in g.volumes(creds).await.map_err(from_rpc)? {
                if v.pool.is_some() && v.snapshot_of.is_none() && !all.iter().any(|(o, _)| o.name == v.name) && !is_clone_source(&v.name) {
                    all.push((v, vec![]));
                }
            }
        }
        all.sort_by(|a, b| a.0.name.cmp(&b.0.name));
        let page = page(&r.starting_token, r.max_entries, all.len())?;
        let mut entries = vec![];
        for (v, _) in &all[page.clone()] {
            let p = self.find(creds, &v.name).await?;
            let nodes = match &p {
                Some(p) => self.published(creds, p).await?,
                None => vec![],
            };
            entries.push(proto::list_volumes_response::Entry {
                volume: Some(self.volume_of(v, HashMap::new(), None)),
                status: Some(proto::list_volumes_response::VolumeStatus { published_node_ids: nodes }),
            });
        }
        let next = if page.end < all.len() { page.end.to_string() } else { String::new() };
        Ok(Response::new(proto::ListVolumesResponse { entries, next_token: next }))
    }

    async fn get_capacity(&self, req: Request<proto::GetCapacityRequest>) -> Result<Response<proto::GetCapacityResponse>, Status> {
        let r = req.into_inner();
        if !r.volume_capabilities.is_empty() {
            if let Err(why) = capability::check(&r.volume_capabilities) {
                // Capabilities it cannot give: no capacity for them (CSI).
                log::debug!("GetCapacity: {why}");
                return Ok(Response::new(proto::GetCapacityResponse::default()));
            }
        }
        let par = params(&r.parameters)?;
        let creds = self.credentials.as_ref();
        let mut free = 0u64;
        let mut seen_rbd = vec![];
        for g in &self.gateways {
            for p in g.pools(creds).await.map_err(from_rpc)? {
                if par.pool.as_deref().is_some_and(|want| want != p.name) {
                    continue;
                }
                if let Some(rbd) = &p.rbd {
                    if seen_rbd.contains(rbd) {
                        continue;
                    }
                    seen_rbd.push(rbd.clone());
                }
                free += p.free_bytes.unwrap_or(0);
            }
        }
        Ok(Response::new(proto::GetCapacityResponse { available_capacity: free.min(i64::MAX as u64) as i64, maximum_volume_size: None, minimum_volume_size: Some(GRANULE as i64) }))
    }

    async fn create_snapshot(&self, req: Request<proto::CreateSnapshotRequest>) -> Result<Response<proto::CreateSnapshotResponse>, Status> {
        let r = req.into_inner();
        let name = required("name", &r.name)?;
        let src = required("source_volume_id", &r.source_volume_id)?;
        if name.len() > names::MAX_NAME {
            return Err(Status::invalid_argument(format!("name: {} bytes, at most {}", name.len(), names::MAX_NAME)));
        }
        if !r.parameters.is_empty() {
            return Err(Status::invalid_argument(format!("snapshot parameters are not taken: {:?}", r.parameters.keys().collect::<Vec<_>>())));
        }
        let creds = creds_of(&r.secrets, &self.credentials);
        let creds = creds.as_ref();
        let id = names::id_of_name(name);
        let _g = self.lock.lock().await;
        if let Some(p) = self.find(creds, &id).await? {
            if p.info.snapshot_of.as_deref() != Some(src) {
                return Err(Status::already_exists(format!("snapshot {id} (name {name:?}) exists, of {}", p.info.snapshot_of.as_deref().unwrap_or("nothing: it is a volume"))));
            }
            return Ok(Response::new(proto::CreateSnapshotResponse { snapshot: Some(snapshot_of(&p.info)) }));
        }
        let Some(p) = self.find(creds, src).await? else {
            return Err(Status::not_found(format!("source volume {src} not found")));
        };
        p.home.call(creds, "volume_snapshot", json!({ "name": src, "snapshot": id })).await.map_err(from_rpc)?;
        let v = p.home.volume(creds, &id).await.map_err(from_rpc)?.ok_or_else(|| Status::internal(format!("snapshot {id} made but not listed")))?;
        log::info!("snapshot {id} of {src}");
        Ok(Response::new(proto::CreateSnapshotResponse { snapshot: Some(snapshot_of(&v)) }))
    }

    async fn delete_snapshot(&self, req: Request<proto::DeleteSnapshotRequest>) -> Result<Response<proto::DeleteSnapshotResponse>, Status> {
        let r = req.into_inner();
        let id = required("snapshot_id", &r.snapshot_id)?;
        let creds = creds_of(&r.secrets, &self.credentials);
        let creds = creds.as_ref();
        let _g = self.lock.lock().await;
        let Some(p) = self.find(creds, id).await? else {
            return Ok(Response::new(proto::DeleteSnapshotResponse {}));
        };
        if p.info.snapshot_of.is_none() {
            return Err(Status::invalid_argument(format!("{id} is a volume, not a snapshot")));
        }
        p.home.call(creds, "volume_delete", json!({ "name": id })).await.map_err(from_rpc)?;
        Ok(Response::new(proto::DeleteSnapshotResponse {}))
    }

    async fn list_snapshots(&self, req: Request<proto::ListSnapshotsRequest>) -> Result<Response<proto::ListSnapshotsResponse>, Status> {
        let r = req.into_inner();
        let creds = creds_of(&r.secrets, &self.credentials);
        let mut all: Vec<VolumeInfo> = vec![];
        for g in &self.gateways {
            for v in g.volumes(creds.as_ref()).await.map_err(from_rpc)? {
                let wanted = v.pool.is_some()
                    && v.snapshot_of.is_some()
                    && !is_clone_source(&v.name)
                    && (r.snapshot_id.is_empty() || r.snapshot_id == v.name)
                    && (r.source_volume_id.is_empty() || Some(&r.source_volume_id) == v.snapshot_of.as_ref());
                if wanted && !all.iter().any(|o| o.name == v.name) {
                    all.push(v);
                }
            }
        }
        all.sort_by(|a, b| a.name.cmp(&b.name));
        let page = page(&r.starting_token, r.max_entries, all.len())?;
        let entries = all[page.clone()].iter().map(|v| proto::list_snapshots_response::Entry { snapshot: Some(snapshot_of(v)) }).collect();
        let next = if page.end < all.len() { page.end.to_string() } else { String::new() };
        Ok(Response::new(proto::ListSnapshotsResponse { entries, next_token: next }))
    }

    async fn get_snapshot(&self, req: Request<proto::GetSnapshotRequest>) -> Result<Response<proto::GetSnapshotResponse>, Status> {
        let r = req.into_inner();
        let id = required("snapshot_id", &r.snapshot_id)?;
        let creds = creds_of(&r.secrets, &self.credentials);
        match self.find(creds.as_ref(), id).await? {
            Some(p) if p.info.snapshot_of.is_some() => Ok(Response::new(proto::GetSnapshotResponse { snapshot: Some(snapshot_of(&p.info)) })),
            _ => Err(Status::not_found(format!("snapshot {id} not found"))),
        }
    }

    async fn controller_expand_volume(&self, req: Request<proto::ControllerExpandVolumeRequest>) -> Result<Response<proto::ControllerExpandVolumeResponse>, Status> {
        use proto::volume_capability::AccessType;
        let r = req.into_inner();
        let id = required("volume_id", &r.volume_id)?;
        let range = required_msg("capacity_range", &r.capacity_range)?;
        let size = size_for(Some(range))?;
        let creds = creds_of(&r.secrets, &self.credentials);
        let creds = creds.as_ref();
        let _g = self.lock.lock().await;
        let Some(p) = self.find(creds, id).await? else {
            return Err(Status::not_found(format!("volume {id} not found")));
        };
        if p.info.snapshot_of.is_some() {
            return Err(Status::invalid_argument(format!("{id} is a snapshot")));
        }
        let block = matches!(r.volume_capability.as_ref().and_then(|c| c.access_type.as_ref()), Some(AccessType::Block(_)));
        let have = p.info.provisioned_bytes;
        if have < size {
            // The home gateway resizes the image or file; the others serve
            // the same RBD image and are told its size (the namespace's
            // hosts are told by each). They would follow the image by
            // themselves (librbd update watch); told, they serve the new
            // size before this call returns.
            for g in p.all() {
                g.call(creds, "volume_resize", json!({ "name": id, "size": size })).await.map_err(from_rpc)?;
            }
        }
        Ok(Response::new(proto::ControllerExpandVolumeResponse { capacity_bytes: have.max(size) as i64, node_expansion_required: !block }))
    }

    async fn controller_get_volume(&self, req: Request<proto::ControllerGetVolumeRequest>) -> Result<Response<proto::ControllerGetVolumeResponse>, Status> {
        let r = req.into_inner();
        let id = required("volume_id", &r.volume_id)?;
        let creds = self.credentials.as_ref();
        let Some(p) = self.find(creds, id).await? else {
            return Err(Status::not_found(format!("volume {id} not found")));
        };
        let nodes = self.published(creds, &p).await?;
        Ok(Response::new(proto::ControllerGetVolumeResponse {
            volume: Some(self.volume_of(&p.info, HashMap::new(), None)),
            status: Some(proto::controller_get_volume_response::VolumeStatus { published_node_ids: nodes }),
        }))
    }

    async fn controller_modify_volume(&self, req: Request<proto::ControllerModifyVolumeRequest>) -> Result<Response<proto::ControllerModifyVolumeResponse>, Status> {
        let r = req.into_inner();
        let id = required("volume_id", &r.volume_id)?;
        let limits = qos::limits(&r.mutable_parameters)?;
        let creds = creds_of(&r.secrets, &self.credentials);
        let creds = creds.as_ref();
        let _g = self.lock.lock().await;
        let Some(p) = self.find(creds, id).await? else {
            return Err(Status::not_found(format!("volume {id} not found")));
        };
        self.set_qos(creds, &p, limits).await?;
        Ok(Response::new(proto::ControllerModifyVolumeResponse {}))
    }
}

/// The snapshot a clone of a volume is made from.
fn clone_source_name(id: &str) -> String {
    // Fits: ids are at most 128 bytes, volume names too; shorten with the
    // hash form if needed.
    let n = format!("{id}.clone-source");
    if n.len() <= 128 {
        n
    } else {
        format!("{}.clone-source", names::id_of_name(&format!("/{id}")))
    }
}

fn is_clone_source(name: &str) -> bool {
    name.ends_with(".clone-source")
}

fn snapshot_of(v: &VolumeInfo) -> proto::Snapshot {
    proto::Snapshot {
        size_bytes: v.provisioned_bytes as i64,
        snapshot_id: v.name.clone(),
        source_volume_id: v.snapshot_of.clone().unwrap_or_default(),
        creation_time: Some(timestamp(v.created_unix)),
        ready_to_use: true,
        group_snapshot_id: String::new(),
        accessible_topology: vec![],
    }
}

/// The entries of a page: from the starting token (an index this plugin
/// gave; anything else is ABORTED, as CSI asks) up to `max` of them.
fn page(token: &str, max: i32, len: usize) -> Result<std::ops::Range<usize>, Status> {
    if max < 0 {
        return Err(Status::invalid_argument(format!("max_entries {max}: negative")));
    }
    let start = if token.is_empty() {
        0
    } else {
        token.parse::<usize>().ok().filter(|&s| s <= len).ok_or_else(|| Status::aborted(format!("starting_token {token:?} is not one this plugin gave")))?
    };
    let end = if max == 0 { len } else { (start + max as usize).min(len) };
    Ok(start..end)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(req: i64, lim: i64) -> proto::CapacityRange {
        proto::CapacityRange { required_bytes: req, limit_bytes: lim }
    }

    #[test]
    fn sizes() {
        assert_eq!(size_for(None).unwrap(), DEFAULT_SIZE);
        assert_eq!(size_for(Some(&range(1, 0))).unwrap(), 4096);
        assert_eq!(size_for(Some(&range(0, 10000))).unwrap(), 8192);
        assert_eq!(size_for(Some(&range(5000, 6000))).unwrap_err().code(), tonic::Code::OutOfRange);
        assert_eq!(size_for(Some(&range(-1, 0))).unwrap_err().code(), tonic::Code::InvalidArgument);
        assert_eq!(size_for(Some(&range(i64::MAX, 0))).unwrap(), (i64::MAX as u64).next_multiple_of(4096));
        assert!(fits(8192, Some(&range(8192, 0))) && !fits(4096, Some(&range(8192, 0))) && !fits(16384, Some(&range(0, 8192))));
    }

    #[test]
    fn pages() {
        assert_eq!(page("", 0, 5).unwrap(), 0..5);
        assert_eq!(page("", 2, 5).unwrap(), 0..2);
        assert_eq!(page("4", 2, 5).unwrap(), 4..5);
        assert_eq!(page("6", 2, 5).unwrap_err().code(), tonic::Code::Aborted);
        assert_eq!(page("x", 2, 5).unwrap_err().code(), tonic::Code::Aborted);
        assert_eq!(page("", -1, 5).unwrap_err().code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn capabilities() {
        use proto::volume_capability::{access_mode::Mode, AccessMode, AccessType, BlockVolume, MountVolume};
        let cap = |block: bool, mode: Mode, fs: &str| proto::VolumeCapability {
            access_mode: Some(AccessMode { mode: mode as i32 }),
            access_type: Some(if block { AccessType::Block(BlockVolume {}) } else { AccessType::Mount(MountVolume { fs_type: fs.into(), ..Default::default() }) }),
        };
        assert!(capability::check(&[cap(false, Mode::SingleNodeWriter, "ext4")]).is_ok());
        assert!(capability::check(&[cap(true, Mode::MultiNodeMultiWriter, "")]).is_ok());
        assert!(capability::check(&[cap(false, Mode::MultiNodeMultiWriter, "")]).is_err());
        assert!(capability::check(&[cap(false, Mode::SingleNodeWriter, "ntfs")]).is_err());
        assert!(capability::check(&[cap(false, Mode::Unknown, "")]).is_err());
        assert!(capability::check(&[]).is_err());
        assert!(capability::check(&[proto::VolumeCapability { access_mode: Some(AccessMode { mode: 1 }), access_type: None }]).is_err());
    }
}
