//! `blockwire csi`: a Container Storage Interface plugin (CSI v1.13.0,
//! the specification's csi.proto, see proto/README.md) over blockwire
//! gateways. The controller service is a client of the gateways' control
//! API over HTTP, as Cinder's SPDK driver is (`serve --rpc-http`); the
//! node service attaches published volumes with the kernel's initiators,
//! or with blockwire's own where there are none. One binary serves
//! Identity with either or both, on a Unix socket, as COs expect.

pub mod client;
pub mod controller;
pub mod gateways;
pub mod names;
pub mod node;
pub mod qos;
pub mod rpc;
mod status;

pub mod proto;
mod protocol;
pub mod capability;

pub use protocol::Protocol;

use std::path::PathBuf;
use tonic::{Request, Response, Status};

/// The name COs know the plugin by (StorageClass `provisioner`).
pub const DRIVER_NAME: &str = "csi.blockwire.io";
/// Largest gRPC request taken: CSI requests are small (names, maps of
/// parameters and secrets); a larger one is refused before it is decoded
/// (tonic answers OUT_OF_RANGE, "decoded message length too large").
pub const MAX_REQUEST: usize = 1 << 20;

/// What the plugin serves.
pub struct Plugin {
    pub controller: Option<controller::ControllerService>,
    pub node: Option<node::NodeService>,
}

struct Identity {
    controller: bool,
    /// Controller endpoints Probe checks.
    gateways: Vec<rpc::Endpoint>,
    credentials: Option<rpc::Credentials>,
}

#[tonic::async_trait]
impl proto::identity_server::Identity for Identity {
    async fn get_plugin_info(&self, _: Request<proto::GetPluginInfoRequest>) -> Result<Response<proto::GetPluginInfoResponse>, Status> {
        Ok(Response::new(proto::GetPluginInfoResponse { name: DRIVER_NAME.into(), vendor_version: env!("CARGO_PKG_VERSION").into(), manifest: Default::default() }))
    }

    async fn get_plugin_capabilities(&self, _: Request<proto::GetPluginCapabilitiesRequest>) -> Result<Response<proto::GetPluginCapabilitiesResponse>, Status> {
        use proto::plugin_capability::{service, volume_expansion, Service, Type, VolumeExpansion};
        let mut caps = vec![proto::PluginCapability { r#type: Some(Type::VolumeExpansion(VolumeExpansion { r#type: volume_expansion::Type::Online as i32 })) }];
        if self.controller {
            caps.push(proto::PluginCapability { r#type: Some(Type::Service(Service { r#type: service::Type::ControllerService as i32 })) });
        }
        Ok(Response::new(proto::GetPluginCapabilitiesResponse { capabilities: caps }))
    }

    /// Ready when every gateway answers `status` (a controller without
    /// its gateways can do nothing); a node is ready once it serves.
    async fn probe(&self, _: Request<proto::ProbeRequest>) -> Result<Response<proto::ProbeResponse>, Status> {
        for g in &self.gateways {
            if let Err(e) = g.call(self.credentials.as_ref(), "status", serde_json::Value::Null).await {
                log::warn!("probe: {e}");
                return Ok(Response::new(proto::ProbeResponse { ready: Some(false) }));
            }
        }
        Ok(Response::new(proto::ProbeResponse { ready: Some(true) }))
    }
}

/// `unix:///path`, `unix:/path` or a plain path: the socket's path.
pub fn socket_path(endpoint: &str) -> PathBuf {
    PathBuf::from(endpoint.strip_prefix("unix://").or_else(|| endpoint.strip_prefix("unix:")).unwrap_or(endpoint))
}

impl Plugin {
    /// Serve on the Unix socket `path` until `shutdown` resolves. A socket
    /// left by an earlier run is replaced; the socket is removed at the end.
    pub async fn serve(self, path: PathBuf, shutdown: impl std::future::Future<Output = ()>) -> anyhow::Result<()> {
        use proto::controller_server::ControllerServer;
        use proto::identity_server::IdentityServer;
        use proto::node_server::NodeServer;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        match std::fs::symlink_metadata(&path) {
            Ok(m) if std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()) => std::fs::remove_file(&path)?,
            Ok(_) => anyhow::bail!("{}: exists and is not a socket", path.display()),
            Err(_) => {}
        }
        let listener = tokio::net::UnixListener::bind(&path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let identity = Identity {
            controller: self.controller.is_some(),
            gateways: self.controller.iter().flat_map(|c| c.gateways.iter().map(|g| g.endpoint.clone())).collect(),
            credentials: self.controller.as_ref().and_then(|c| c.credentials.clone()),
        };
        let mut router = tonic::transport::Server::builder().add_service(IdentityServer::new(identity).max_decoding_message_size(MAX_REQUEST));
        if let Some(c) = self.controller {
            router = router.add_service(ControllerServer::new(c).max_decoding_message_size(MAX_REQUEST));
        }
        if let Some(n) = self.node {
            router = router.add_service(NodeServer::new(n).max_decoding_message_size(MAX_REQUEST));
        }
        log::info!("CSI {DRIVER_NAME} on {}", path.display());
        let r = router.serve_with_incoming_shutdown(tokio_stream::wrappers::UnixListenerStream::new(listener), shutdown).await;
        let _ = std::fs::remove_file(&path);
        r.map_err(Into::into)
    }
}
