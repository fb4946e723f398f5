//! aoe client (being built; see the aoe issue).

use crate::{BlockClient, ClientError, ConnectOptions, Result, TargetUrl};
use std::sync::Arc;

pub async fn connect(url: &TargetUrl, _opts: &ConnectOptions) -> Result<Arc<dyn BlockClient>> {
    Err(ClientError::Protocol(format!("{url}: the aoe initiator is not built yet")))
}
