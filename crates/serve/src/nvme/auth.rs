//! In-band authentication (DH-HMAC-CHAP) on the target's queues: which
//! hosts must authenticate, and the gate every command of a queue passes
//! until its host has. The protocol itself is `bw_nvme::auth`.

use crate::config::NvmeConfig;
use bw_nvme::auth::message::{AuthCommand, Message};
use bw_nvme::auth::{AuthConfig, ControllerAuth, Entropy, SeqNum};
use bw_nvme::command::Sqe;
use bw_nvme::fabrics::fctype;
use bw_nvme::Status;
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::Arc;

/// Per (subsystem NQN, host NQN): the keys that host authenticates with.
#[derive(Debug)]
pub struct HostKeys {
    keys: HashMap<(String, String), Arc<AuthConfig>>,
    /// Sequence numbers S1 for every challenge this target sends.
    pub seq: SeqNum,
}

impl Default for HostKeys {
    fn default() -> Self {
        HostKeys {
            keys: HashMap::new(),
            seq: SeqNum::new(0),
        }
    }
}

impl HostKeys {
    pub fn from_config(cfg: &NvmeConfig) -> anyhow::Result<HostKeys> {
        let mut keys = HashMap::new();
        for s in &cfg.subsystems {
            for h in &s.hosts {
                let a = h
                    .auth_config()
                    .map_err(|e| anyhow::anyhow!("NVMe {} host {}: {e}", s.nqn, h.nqn))?;
                log::info!(
                    "nvme: {} requires DH-HMAC-CHAP from {}{} (hashes {:?}, groups {:?})",
                    s.nqn,
                    h.nqn,
                    if a.ctrl_key.is_some() {
                        ", and proves itself when asked"
                    } else {
                        ""
                    },
                    a.hashes.iter().map(|x| x.name()).collect::<Vec<_>>(),
                    a.groups.iter().map(|x| x.name()).collect::<Vec<_>>()
                );
                keys.insert((s.nqn.clone(), h.nqn.clone()), Arc::new(a));
            }
        }
        let seq = SeqNum::from_os()
            .map_err(|e| anyhow::anyhow!("no random numbers from the OS for DH-HMAC-CHAP: {e}"))?;
        Ok(HostKeys { keys, seq })
    }

    pub fn get(&self, subnqn: &str, hostnqn: &str) -> Option<Arc<AuthConfig>> {
        self.keys
            .get(&(subnqn.to_string(), hostnqn.to_string()))
            .cloned()
    }
}

/// What the gate decided about one command.
pub enum Gate {
    /// Authenticated (or a Disconnect): run it as usual.
    Pass,
    /// Complete it with this status and data; `close` tears the controller
    /// down once the completion is out (authentication failed).
    Complete {
        status: Status,
        data: Option<Bytes>,
        close: bool,
    },
}

/// One queue's authentication.
pub struct QueueAuth {
    auth: ControllerAuth,
    /// For logs: "controller 3 queue 1".
    name: String,
    hostnqn: String,
}

impl QueueAuth {
    pub fn new(
        cfg: Arc<AuthConfig>,
        hostnqn: &str,
        subnqn: &str,
        cntlid: u16,
        qid: u16,
    ) -> QueueAuth {
        QueueAuth {
            auth: ControllerAuth::new(cfg, hostnqn, subnqn),
            name: format!("controller {cntlid} queue {qid}"),
            hostnqn: hostnqn.into(),
        }
    }

    /// Until the login deadline, a queue must have authenticated.
    pub fn authenticated(&self) -> bool {
        self.auth.authenticated()
    }

    /// Auth Send/Receive go to the state machine (re-authentication
    /// included); anything else waits for authentication.
    pub fn gate(&mut self, sqe: &Sqe, data: &Bytes, seq: &SeqNum) -> Gate {
        let Some(cmd) = AuthCommand::parse(sqe) else {
            if self.auth.authenticated() || (sqe.is_fabrics() && sqe.fctype() == fctype::DISCONNECT)
            {
                return Gate::Pass;
            }
            return Gate::Complete {
                status: Status::AUTH_REQUIRED.dnr(),
                data: None,
                close: false,
            };
        };
        let was = self.auth.authenticated();
        if log::log_enabled!(log::Level::Debug) {
            let what = if cmd.send {
                Message::parse(data)
                    .map(|m| m.name())
                    .unwrap_or("a malformed message")
            } else {
                "Auth Receive"
            };
            log::debug!("nvme: {}: {} ({} bytes)", self.name, what, cmd.len);
        }
        let (status, out) = if cmd.send {
            match Entropy::from_os(seq) {
                Ok(e) => (self.auth.auth_send(sqe, data, e), None),
                Err(e) => {
                    log::error!("nvme: {}: no random numbers from the OS: {e}", self.name);
                    (Status::INTERNAL, None)
                }
            }
        } else {
            match self.auth.auth_receive(sqe) {
                Ok(d) => {
                    log::debug!(
                        "nvme: {}: sends {}",
                        self.name,
                        Message::parse(&d).map(|m| m.name()).unwrap_or("?")
                    );
                    (Status::SUCCESS, Some(Bytes::from(d)))
                }
                Err(st) => (st, None),
            }
        };
        if let Some(reason) = self.auth.failed() {
            log::warn!(
                "nvme: {}: DH-HMAC-CHAP authentication of {} failed: {} ({reason})",
                self.name,
                self.hostnqn,
                self.auth.why().unwrap_or("-")
            );
            return Gate::Complete {
                status,
                data: out,
                close: true,
            };
        }
        if self.auth.authenticated() && !was {
            let (hash, group) = self
                .auth
                .chosen()
                .map(|(h, g)| (h.name(), g.name()))
                .unwrap_or(("?", "?"));
            let how = if self.auth.mutual() {
                "bidirectional"
            } else {
                "host only"
            };
            log::info!(
                "nvme: {}: {} authenticated (DH-HMAC-CHAP {hash} {group}, {how})",
                self.name,
                self.hostnqn
            );
        }
        Gate::Complete {
            status,
            data: out,
            close: false,
        }
    }
}
