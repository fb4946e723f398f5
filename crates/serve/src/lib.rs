//! `blockwire serve`'s data plane: the protocol front-ends (AoE, iSCSI,
//! NVMe/TCP and NVMe/RDMA) on their sockets, the connection driver, outbox
//! and framing they share, admission limits, tuning, metrics, and the
//! configuration as data with its validation. What changes a running
//! server (live changes, pools, the RPC vocabularies, the control socket
//! and HTTP) is bw-control's, above this crate.

pub mod accept;
pub mod aoe;
pub mod config;
pub mod dispatch;
pub mod driver;
pub mod framing;
pub mod frontend;
pub mod iscsi;
pub mod limits;
pub mod metrics;
pub mod nvme;
pub mod outbox;
pub mod refused;
pub mod session;
pub mod start;
pub mod systemd;
pub mod tuning;

use bw_block::Volume;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use config::ServeConfig;

/// Every opened volume by name.
pub type Volumes = Arc<HashMap<String, Volume>>;

/// A front-end's running part: resolves when it has shut down.
pub type Running = JoinHandle<anyhow::Result<()>>;

/// Shutdown signal shared by all front-ends; cheap to clone.
#[derive(Clone)]
pub struct Shutdown(watch::Receiver<bool>);

impl Shutdown {
    pub fn new() -> (watch::Sender<bool>, Shutdown) {
        let (tx, rx) = watch::channel(false);
        (tx, Shutdown(rx))
    }
    pub fn is_set(&self) -> bool {
        *self.0.borrow()
    }
    /// A shutdown of its own that also follows this one: setting the
    /// returned sender ends only those watching the child (one listener's
    /// connections). Spawns its forwarder on `rt`.
    pub fn child(&self, rt: &tokio::runtime::Handle) -> (watch::Sender<bool>, Shutdown) {
        let (tx, child) = Shutdown::new();
        let (mut parent, fwd) = (self.clone(), tx.clone());
        rt.spawn(async move {
            tokio::select! {
                _ = parent.wait() => { let _ = fwd.send(true); }
                _ = fwd.closed() => {}
            }
        });
        (tx, child)
    }

    /// Resolves once shutdown has been requested.
    pub async fn wait(&mut self) {
        while !*self.0.borrow() {
            if self.0.changed().await.is_err() {
                return;
            }
        }
    }
}
