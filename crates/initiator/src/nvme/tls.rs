//! NVMe/TCP over TLS from the host side (`nvme+tcp://...?tls`): each
//! queue's TCP connection runs the TLS 1.3 handshake with our PSK before
//! its ICReq (bw_tls), and then its bytes go through the kernel's record
//! layer (kTLS: the queue's code runs as without TLS) or ours.
//!
//! The TLS PSK comes from the configured PSK, the host NQN and the
//! subsystem NQN (bw_nvme::tls_psk). The same configured key derives two
//! different TLS PSKs, as the NVMe specification says (SPDK, libnvme 1.16
//! on) and as libnvme before 1.16 did (the keys Linux hosts and nvmet
//! keyrings hold on Debian 13, Ubuntu 24.04, RHEL 9); a target accepts one
//! of them, so a queue tries the specification's first, the other when
//! the target refuses, and the rest of the controller's queues start with
//! the one that worked.

use crate::{ClientError, ConnectOptions, Result};
use bw_nvme::tls_psk::{ConfiguredPsk, Derivation, IdentityVersion};
use bw_tls::secure::{self, SecureError, Secured};
use bw_tls::RecordChoice;
use std::sync::Mutex;
use tokio::net::TcpStream;

fn tls_err(s: impl Into<String>) -> ClientError {
    ClientError::Tls(s.into())
}

/// One controller's TLS settings.
pub struct TlsClient {
    psk: ConfiguredPsk,
    version: IdentityVersion,
    hostnqn: String,
    subnqn: String,
    choice: RecordChoice,
    /// The derivation the target took last.
    worked: Mutex<Option<Derivation>>,
}

impl TlsClient {
    /// The settings of `opts` for a URL with `?tls` (`choice`); None
    /// without TLS. A PSK without `?tls`, or `?tls` without a PSK, is an error.
    pub fn new(opts: &ConnectOptions, choice: Option<RecordChoice>, hostnqn: &str, subnqn: &str) -> Result<Option<TlsClient>> {
        let (choice, text) = match (choice, &opts.tls_psk) {
            (None, None) => return Ok(None),
            (None, Some(_)) => return Err(tls_err("a TLS PSK is given but the URL does not ask for TLS (add ?tls)")),
            (Some(_), None) => return Err(tls_err("?tls needs a PSK: --tls-psk NVMeTLSkey-1:..., --tls-psk-file or BLOCKWIRE_TLS_PSK")),
            (Some(c), Some(t)) => (c, t),
        };
        let psk = ConfiguredPsk::parse(text).map_err(|e| tls_err(format!("the PSK: {e}")))?;
        Ok(Some(TlsClient { psk, version: opts.tls_identity, hostnqn: hostnqn.into(), subnqn: subnqn.into(), choice, worked: Mutex::new(None) }))
    }

    /// A TCP connection to `host:port`, secured: the derivation that
    /// worked last first, then the others, each on a connection of its own.
    pub async fn open(&self, host: &str, port: u16, opts: &ConnectOptions) -> Result<(TcpStream, Secured)> {
        let first = *self.worked.lock().unwrap_or_else(|p| p.into_inner());
        let order: Vec<Derivation> = first.into_iter().chain(Derivation::ALL.into_iter().filter(|d| Some(*d) != first)).collect();
        let mut refusals = Vec::new();
        for d in order {
            let id = self.psk.identity(d, self.version, &self.hostnqn, &self.subnqn);
            let Some(psk) = self.psk.tls_psk(d, &id) else { continue };
            let stream = crate::connect_tcp(host, port, opts).await?;
            let r = tokio::time::timeout(opts.timeout, secure::connect(&stream, &id.to_string(), psk, self.choice)).await.map_err(|_| ClientError::Timeout(format!("TLS handshake with {host}:{port}")))?;
            match r {
                Ok(s) => {
                    *self.worked.lock().unwrap_or_else(|p| p.into_inner()) = Some(d);
                    return Ok((stream, s));
                }
                // Refused during the handshake: perhaps the other key.
                Err(e @ (SecureError::Handshake(_) | SecureError::Closed)) => {
                    log::debug!("nvme: TLS with the PSK derived by {d}: {e}");
                    refusals.push(format!("with the PSK derived by {d}: {e}"));
                }
                Err(e) => return Err(tls_err(e.to_string())),
            }
        }
        Err(tls_err(format!("the target refused the TLS handshake as {} ({})", self.psk.identity(Derivation::Rfc8446, self.version, &self.hostnqn, &self.subnqn), refusals.join("; "))))
    }
}
