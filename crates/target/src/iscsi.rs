//! iscsi front-end (being built; see the iscsi issue).

use crate::{Running, Shutdown, Volumes};

pub async fn start(_cfg: &crate::config::IscsiConfig, _volumes: &Volumes, _shutdown: Shutdown) -> anyhow::Result<Running> {
    anyhow::bail!("the iscsi front-end is not built yet")
}
