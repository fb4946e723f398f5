//! [`connect`]: a URL to the client of its protocol. (Above the protocol
//! modules, which use the crate root's trait and options.)

use crate::iscsi::IscsiClient;
use crate::nvme::NvmeClient;
use crate::{aoe, nfs, BlockClient, ClientError, ConnectOptions, Result, TargetUrl};
use std::sync::Arc;

/// A connected client: NVMe (TCP or RDMA) and iSCSI by their types, for a
/// caller that holds each request's future ([`crate::HeldIo`]); the others
/// as any client.
pub enum Connected {
    Nvme(Arc<NvmeClient>),
    Iscsi(Arc<IscsiClient>),
    Other(Arc<dyn BlockClient>),
}

impl Connected {
    /// The client as any client.
    pub fn shared(&self) -> Arc<dyn BlockClient> {
        match self {
            Connected::Nvme(c) => c.clone(),
            Connected::Iscsi(c) => c.clone(),
            Connected::Other(c) => c.clone(),
        }
    }
}

/// Connect to the target a URL names.
pub async fn connect(url: &str, opts: &ConnectOptions) -> Result<Arc<dyn BlockClient>> {
    connect_typed(url, opts).await.map(|c| c.shared())
}

/// [`connect`], the client by its type where it has one.
pub async fn connect_typed(url: &str, opts: &ConnectOptions) -> Result<Connected> {
    let r = match TargetUrl::parse(url)? {
        u @ TargetUrl::Aoe { .. } => aoe::connect(&u, opts).await.map(Connected::Other),
        u @ TargetUrl::Iscsi { .. } => IscsiClient::connect(&u, opts).await.map(|c| Connected::Iscsi(Arc::new(c))),
        u @ (TargetUrl::Nvme { .. } | TargetUrl::NvmeRdma { .. }) => {
            NvmeClient::connect(&u, opts).await.map(|c| Connected::Nvme(Arc::new(c)))
        }
        u @ TargetUrl::Nfs { .. } => nfs::connect(&u, opts).await.map(Connected::Other),
    };
    // OS errors name no peer: say which URL they came from.
    r.map_err(|e| match e {
        ClientError::Io(_) => ClientError::Connect { url: url.to_string(), source: Box::new(e) },
        e => e,
    })
}
