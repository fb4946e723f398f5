//! aoe front-end (being built; see the aoe issue).

use crate::{Running, Shutdown, Volumes};

pub async fn start(_cfg: &crate::config::AoeConfig, _volumes: &Volumes, _shutdown: Shutdown) -> anyhow::Result<Running> {
    anyhow::bail!("the aoe front-end is not built yet")
}
