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
//!
//! A SHA-384 PSK (`NVMeTLSkey-1:02`) is bound with SHA-384 for
//! TLS_AES_256_GCM_SHA384, as TP 8011 means (our target, SPDK). Linux
//! nvmet refuses that: its handshakes are tlshd 1.0's, whose GnuTLS PSK
//! credentials bind every key with SHA-256. So when both derivations are
//! refused with TP 8011's binding, a queue tries them again with the 48
//! bytes bound with SHA-256, offering TLS_AES_128_GCM_SHA256 and
//! TLS_CHACHA20_POLY1305_SHA256 (bw_tls::handshake::Binding), says so in
//! the log, and the controller's other queues start with that.

use crate::{ClientError, ConnectOptions, Result};
use bw_nvme::tls_psk::{ConfiguredPsk, Derivation, IdentityVersion, PskHash};
use bw_tls::handshake::Binding;
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
    /// The derivation and binding the target took last.
    worked: Mutex<Option<Candidate>>,
}

/// One way of offering the configured PSK: which TLS PSK it derives, and
/// how that is bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Candidate {
    derivation: Derivation,
    binding: Binding,
}

/// The order a queue tries them in: the one that worked last, then TP
/// 8011's binding with each derivation, then the others (a SHA-384 PSK
/// bound with SHA-256).
fn candidates(hash: PskHash, worked: Option<Candidate>) -> Vec<Candidate> {
    let all = Binding::candidates(hash).iter().flat_map(|&binding| Derivation::ALL.into_iter().map(move |derivation| Candidate { derivation, binding }));
    worked.into_iter().chain(all.filter(|c| Some(*c) != worked)).collect()
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

    /// A TCP connection to `host:port`, secured: the derivation and binding
    /// that worked last first, then the others (see [`candidates`]), each on
    /// a connection of its own. Also what the binding was, when it was not
    /// TP 8011's (for the queue's description).
    pub async fn open(&self, host: &str, port: u16, opts: &ConnectOptions) -> Result<(TcpStream, Secured, Option<String>)> {
        let worked = *self.worked.lock().unwrap_or_else(|p| p.into_inner());
        let hash = self.psk.hash();
        let mut refusals = Vec::new();
        for c in candidates(hash, worked) {
            let Candidate { derivation: d, binding } = c;
            let id = self.psk.identity(d, self.version, &self.hostnqn, &self.subnqn);
            let Some(psk) = self.psk.tls_psk(d, &id) else { continue };
            let stream = crate::connect_tcp(host, port, opts).await?;
            let r = tokio::time::timeout(opts.timeout, secure::connect_bound(&stream, &id.to_string(), psk, binding, self.choice))
                .await
                .map_err(|_| ClientError::Timeout(format!("TLS handshake with {host}:{port}")))?;
            match r {
                Ok(s) => {
                    let bound = binding.describe(hash);
                    // Not TP 8011's binding: the SHA-384 PSK bound with SHA-256.
                    let fell_back = binding.hash(hash) != hash;
                    if worked != Some(c) {
                        // Once per controller (and again if the target changes its mind).
                        let fallback = if fell_back {
                            ": the target refused TP 8011's binding (a Linux nvmet, whose tlshd 1.0 binds every PSK with SHA-256); the controller's other queues use this one"
                        } else {
                            ""
                        };
                        log::info!("nvme: TLS with {host}:{port} as {:?}: {}, the PSK derived by {d}, {bound}{fallback}", s.identity, s.suite);
                    }
                    *self.worked.lock().unwrap_or_else(|p| p.into_inner()) = Some(c);
                    return Ok((stream, s, fell_back.then_some(bound)));
                }
                // Refused during the handshake: perhaps another key or binding.
                Err(e @ (SecureError::Handshake(_) | SecureError::Closed)) => {
                    log::debug!("nvme: TLS with the PSK derived by {d}, {}: {e}", binding.describe(hash));
                    refusals.push(format!("with the PSK derived by {d}, {}: {e}", binding.describe(hash)));
                }
                Err(e) => return Err(tls_err(e.to_string())),
            }
        }
        Err(tls_err(format!("the target refused the TLS handshake as {} ({})", self.psk.identity(Derivation::Rfc8446, self.version, &self.hostnqn, &self.subnqn), refusals.join("; "))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(derivation: Derivation, binding: Binding) -> Candidate {
        Candidate { derivation, binding }
    }

    #[test]
    fn tp_8011_binding_first_then_sha256_for_a_sha384_psk_and_what_worked_before_all() {
        let [r, l] = Derivation::ALL;
        assert_eq!(candidates(PskHash::Sha256, None), [c(r, Binding::Specified), c(l, Binding::Specified)]);
        assert_eq!(candidates(PskHash::Sha384, None), [c(r, Binding::Specified), c(l, Binding::Specified), c(r, Binding::Sha256), c(l, Binding::Sha256)]);
        // nvmet took the SHA-256 binding of the older derivation: the next
        // queue starts there, and still has the others.
        assert_eq!(candidates(PskHash::Sha384, Some(c(l, Binding::Sha256))), [c(l, Binding::Sha256), c(r, Binding::Specified), c(l, Binding::Specified), c(r, Binding::Sha256)]);
    }
}
