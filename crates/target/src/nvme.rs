//! nvme front-end (being built; see the nvme issue).

use crate::{Running, Shutdown, Volumes};

pub async fn start(_cfg: &crate::config::NvmeConfig, _volumes: &Volumes, _shutdown: Shutdown) -> anyhow::Result<Running> {
    anyhow::bail!("the nvme front-end is not built yet")
}
