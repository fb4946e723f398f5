//! The blockwire servers (gateways) the controller drives, and what it
//! asks of them: where a pool lives, where a volume is, how to reach its
//! exports. A directory pool lives on one gateway; an RBD pool (the same
//! Ceph pool configured on several gateways) on each of them, and its
//! volumes are opened and exported on every one (the hosts see one
//! namespace through several paths, as with `rbd_gateways` today).

use crate::rpc::{Credentials, Endpoint, RpcError};
use serde::Deserialize;
use serde_json::{json, Value};

/// One gateway, as the plugin's configuration names it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    /// The control endpoint, `http://HOST:PORT` (serve --rpc-http).
    pub url: String,
    /// NVMe/TCP addresses hosts connect to (default: the gateway's
    /// `nvme_ports` from `status`, which must then be reachable addresses).
    #[serde(default)]
    pub nvme_tcp: Vec<String>,
    /// NVMe/RDMA addresses (default: `nvme_rdma_ports` from `status`).
    #[serde(default)]
    pub nvme_rdma: Vec<String>,
    /// iSCSI portals `HOST:PORT` (no default: serve does not list them).
    #[serde(default)]
    pub iscsi: Vec<String>,
}

pub struct Gateway {
    pub config: GatewayConfig,
    pub endpoint: Endpoint,
}

/// A volume as one gateway's `volume_list` reports it.
#[derive(Debug, Clone, Deserialize)]
pub struct VolumeInfo {
    pub name: String,
    pub pool: Option<String>,
    pub backend: String,
    #[serde(default)]
    pub provisioned_bytes: u64,
    #[serde(default)]
    pub readonly: bool,
    pub snapshot_of: Option<String>,
    pub clone_of: Option<String>,
    #[serde(default)]
    pub snapshots: Vec<String>,
    #[serde(default)]
    pub exports: Vec<String>,
    /// Seconds since the epoch at creation (volumes made before serve
    /// recorded it have none).
    pub created_unix: Option<i64>,
    #[serde(default)]
    pub qos: Option<Value>,
}

/// A pool as `pool_list` reports it.
#[derive(Debug, Clone, Deserialize)]
pub struct PoolInfo {
    pub name: String,
    pub rbd: Option<String>,
    pub free_bytes: Option<u64>,
}

impl Gateway {
    pub fn new(config: GatewayConfig) -> anyhow::Result<Gateway> {
        let endpoint = Endpoint::new(&config.url)?;
        Ok(Gateway { config, endpoint })
    }

    pub async fn call(&self, creds: Option<&Credentials>, method: &str, params: Value) -> Result<Value, RpcError> {
        log::debug!("{} {method} {params}", self.config.url);
        self.endpoint.call(creds, method, params).await
    }

    pub async fn volumes(&self, creds: Option<&Credentials>) -> Result<Vec<VolumeInfo>, RpcError> {
        let v = self.call(creds, "volume_list", Value::Null).await?;
        serde_json::from_value(v).map_err(|e| self.broken("volume_list", e))
    }

    pub async fn volume(&self, creds: Option<&Credentials>, name: &str) -> Result<Option<VolumeInfo>, RpcError> {
        Ok(self.volumes(creds).await?.into_iter().find(|v| v.name == name))
    }

    pub async fn pools(&self, creds: Option<&Credentials>) -> Result<Vec<PoolInfo>, RpcError> {
        let v = self.call(creds, "pool_list", Value::Null).await?;
        serde_json::from_value(v).map_err(|e| self.broken("pool_list", e))
    }

    /// The gateway's `status` (exports and ports).
    pub async fn status(&self, creds: Option<&Credentials>) -> Result<Value, RpcError> {
        self.call(creds, "status", Value::Null).await
    }

    fn broken(&self, method: &str, e: serde_json::Error) -> RpcError {
        RpcError::Unavailable { method: method.into(), url: self.config.url.clone(), why: format!("unexpected answer: {e}") }
    }

    /// Addresses hosts reach this gateway's NVMe transport at: the
    /// configured ones, else the ports `status` lists.
    pub fn nvme_addresses(&self, status: &Value, rdma: bool) -> Vec<String> {
        let configured = if rdma { &self.config.nvme_rdma } else { &self.config.nvme_tcp };
        if !configured.is_empty() {
            return configured.clone();
        }
        let key = if rdma { "nvme_rdma_ports" } else { "nvme_ports" };
        status.get(key).and_then(Value::as_array).map(|a| a.iter().filter_map(Value::as_str).map(String::from).collect()).unwrap_or_default()
    }
}

/// The subsystem `nqn` as `status` lists it: its allowed hosts.
pub fn subsystem_hosts(status: &Value, nqn: &str) -> Option<Vec<String>> {
    let s = status.get("nvme_subsystems")?.as_array()?.iter().find(|s| s.get("nqn").and_then(Value::as_str) == Some(nqn))?;
    Some(s.get("allowed_hosts").and_then(Value::as_array).map(|a| a.iter().filter_map(Value::as_str).map(String::from).collect()).unwrap_or_default())
}

/// The namespace of `volume` in subsystem `nqn` as `status` lists it:
/// its NSID and the hosts it is visible to (`no_auto_visible` ones).
pub fn shared_namespace(status: &Value, nqn: &str, volume: &str) -> Option<(u32, Vec<String>)> {
    let s = status.get("nvme_subsystems")?.as_array()?.iter().find(|s| s.get("nqn").and_then(Value::as_str) == Some(nqn))?;
    let n = s.get("namespaces")?.as_array()?.iter().find(|n| n.get("volume").and_then(Value::as_str) == Some(volume))?;
    let hosts = n.get("hosts").and_then(Value::as_array).map(|a| a.iter().filter_map(Value::as_str).map(String::from).collect()).unwrap_or_default();
    Some((n.get("nsid")?.as_u64()?.try_into().ok()?, hosts))
}

/// The NSIDs subsystem `nqn` uses, as `status` lists them.
pub fn nsids_in_use(status: &Value, nqn: &str) -> Vec<u32> {
    let s = status.get("nvme_subsystems").and_then(Value::as_array).and_then(|a| a.iter().find(|s| s.get("nqn").and_then(Value::as_str) == Some(nqn)));
    s.and_then(|s| s.get("namespaces")?.as_array().cloned()).unwrap_or_default().iter().filter_map(|n| n.get("nsid")?.as_u64()?.try_into().ok()).collect()
}

/// Whether any namespace of subsystem `nqn` is shown to `host`.
pub fn host_has_namespaces(status: &Value, nqn: &str, host: &str) -> bool {
    let s = status.get("nvme_subsystems").and_then(Value::as_array).and_then(|a| a.iter().find(|s| s.get("nqn").and_then(Value::as_str) == Some(nqn)));
    s.and_then(|s| s.get("namespaces")?.as_array().cloned()).unwrap_or_default().iter().any(|n| n.get("hosts").and_then(Value::as_array).is_some_and(|h| h.iter().any(|h| h.as_str() == Some(host))))
}

/// The iSCSI target `iqn` as `status` lists it: its allowed initiators.
pub fn target_initiators(status: &Value, iqn: &str) -> Option<Vec<String>> {
    let t = status.get("iscsi_targets")?.as_array()?.iter().find(|t| t.get("iqn").and_then(Value::as_str) == Some(iqn))?;
    Some(t.get("allowed_initiators").and_then(Value::as_array).map(|a| a.iter().filter_map(Value::as_str).map(String::from).collect()).unwrap_or_default())
}

/// The backend a second gateway opens an RBD pool volume with: the
/// first gateway's, which names the image in the shared Ceph pool.
pub fn rbd_backend_for_peer(v: &VolumeInfo) -> Option<String> {
    v.backend.starts_with("rbd:").then(|| v.backend.clone())
}

/// `volume_add` params of a volume another gateway created in a shared
/// RBD pool.
pub fn peer_volume_add(v: &VolumeInfo) -> Option<Value> {
    rbd_backend_for_peer(v).map(|b| json!({ "name": v.name, "backend": b }))
}
