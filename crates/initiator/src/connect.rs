//! [`connect`]: a URL to the client of its protocol. (Above the protocol
//! modules, which use the crate root's trait and options.)

use crate::{aoe, iscsi, nfs, nvme, BlockClient, ClientError, ConnectOptions, Result, TargetUrl};
use std::sync::Arc;

/// Connect to the target a URL names.
pub async fn connect(url: &str, opts: &ConnectOptions) -> Result<Arc<dyn BlockClient>> {
    let r = match TargetUrl::parse(url)? {
        u @ TargetUrl::Aoe { .. } => aoe::connect(&u, opts).await,
        u @ TargetUrl::Iscsi { .. } => iscsi::connect(&u, opts).await,
        u @ (TargetUrl::Nvme { .. } | TargetUrl::NvmeRdma { .. }) => nvme::connect(&u, opts).await,
        u @ TargetUrl::Nfs { .. } => nfs::connect(&u, opts).await,
    };
    // OS errors name no peer: say which URL they came from.
    r.map_err(|e| match e {
        ClientError::Io(_) => ClientError::Connect { url: url.to_string(), source: Box::new(e) },
        e => e,
    })
}
