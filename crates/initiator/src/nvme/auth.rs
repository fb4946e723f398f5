//! In-band authentication (DH-HMAC-CHAP) of one queue right after its
//! Connect, run over Auth Send / Auth Receive. The protocol is
//! `bw_nvme::auth::HostAuth`; this moves its messages through whatever
//! submits the queue's commands (`Queue::submit_raw`, passed in: the
//! queue's Connect, in mod.rs, calls this).

use super::queue::Done;
use crate::{ClientError, ConnectOptions, Result};
use bw_nvme::queue_entry::Sqe;
use std::future::Future;
use bw_nvme::auth::host::RECEIVE_LEN;
use bw_nvme::auth::message::{AuthCommand, Message};
use bw_nvme::auth::{AuthConfig, Entropy, HostAction, HostAuth, Secret, SeqNum};
use bw_nvme::fabrics::{AUTHREQ_ASCR, AUTHREQ_ATR};
use bytes::Bytes;
use std::sync::{Arc, OnceLock};

fn auth_err(s: impl Into<String>) -> ClientError {
    ClientError::Auth(s.into())
}

/// The secrets of `opts`, checked; None without `--dhchap-secret`.
pub fn config(opts: &ConnectOptions) -> Result<Option<Arc<AuthConfig>>> {
    let host = match &opts.dhchap_secret {
        Some(s) => Secret::parse(s).map_err(|e| auth_err(format!("--dhchap-secret: {e}")))?,
        None if opts.dhchap_ctrl_secret.is_some() => {
            return Err(auth_err(
                "--dhchap-ctrl-secret needs --dhchap-secret: the host authenticates first",
            ))
        }
        None => return Ok(None),
    };
    let ctrl = match &opts.dhchap_ctrl_secret {
        Some(s) => {
            Some(Secret::parse(s).map_err(|e| auth_err(format!("--dhchap-ctrl-secret: {e}")))?)
        }
        None => None,
    };
    // A host offers every hash and group; the controller chooses.
    let mut cfg = AuthConfig::new(host, ctrl);
    cfg.groups = bw_nvme::auth::DhGroup::ALL.to_vec();
    Ok(Some(Arc::new(cfg)))
}

/// S2 sequence numbers of this process.
fn seq() -> &'static SeqNum {
    static SEQ: OnceLock<SeqNum> = OnceLock::new();
    SEQ.get_or_init(|| SeqNum::from_os().unwrap_or_else(|_| SeqNum::new(1)))
}

/// Authenticate the queue whose commands `submit` sends (a command, the
/// data it sends, the length it reads back) when its Connect response
/// (`authreq`, dword 0) asks for it, with the transaction id `qid`.
pub async fn authenticate<S, F>(
    submit: S,
    qid: u16,
    hostnqn: &str,
    subnqn: &str,
    authreq: u32,
    cfg: Option<&Arc<AuthConfig>>,
) -> Result<()>
where
    S: Fn(Sqe, Option<Bytes>, u32) -> F,
    F: Future<Output = Result<Done>>,
{
    if authreq & AUTHREQ_ASCR != 0 {
        return Err(ClientError::Unsupported(
            "the controller requires secure channel concatenation (NVMe/TCP TLS)".into(),
        ));
    }
    let cfg = match (authreq & AUTHREQ_ATR != 0, cfg) {
        (false, Some(c)) if c.ctrl_key.is_some() => {
            return Err(auth_err(format!("queue {qid}: the controller does not ask for authentication, so it cannot prove it holds the --dhchap-ctrl-secret")))
        }
        (false, _) => return Ok(()),
        (true, None) => return Err(auth_err(format!("queue {qid}: the controller requires in-band authentication (DH-HMAC-CHAP): give --dhchap-secret"))),
        (true, Some(c)) => c.clone(),
    };
    let entropy = Entropy::from_os(seq())
        .map_err(|e| auth_err(format!("no random numbers from the OS: {e}")))?;
    let mut h = HostAuth::new(cfg, hostnqn, subnqn, qid, entropy);
    let mut act = h.start();
    // Linux's target tears the controller down as it answers a failed
    // Reply with AUTH_Failure1, and the answer may not make it out.
    let mut last = "AUTH_Negotiate";
    let closed = |e: ClientError, last: &str| {
        match e {
        ClientError::Disconnected(why) => auth_err(format!(
            "queue {qid}: the controller closed the connection after our {last} ({why}): it refused us (wrong --dhchap-secret?)"
        )),
        e => e,
    }
    };
    loop {
        act = match act {
            HostAction::Send(b) => {
                last = Message::parse(&b).map(|m| m.name()).unwrap_or("?");
                log::debug!("nvme: queue {qid}: sending {last}");
                send(&submit, qid, b).await.map_err(|e| closed(e, last))?;
                h.sent()
            }
            HostAction::Receive => {
                let d = submit(AuthCommand::receive_sqe(0, RECEIVE_LEN), None, RECEIVE_LEN)
                    .await
                    .map_err(|e| closed(e, last))?;
                if !d.cqe.status.is_success() {
                    return Err(auth_err(format!(
                        "queue {qid}: Auth Receive failed: {}",
                        d.cqe.status
                    )));
                }
                log::debug!(
                    "nvme: queue {qid}: received {}",
                    Message::parse(&d.data)
                        .map(|m| m.name())
                        .unwrap_or("a malformed message")
                );
                h.received(&d.data)
            }
            HostAction::Done => {
                log::debug!("nvme: queue {qid} authenticated");
                return Ok(());
            }
            HostAction::Failed {
                send: failure2,
                error,
            } => {
                if let Some(b) = failure2 {
                    // Tell the controller why; the queue is lost either way.
                    let _ = send(&submit, qid, b).await;
                }
                return Err(auth_err(format!("queue {qid}: {error}")));
            }
        };
    }
}

async fn send<F: Future<Output = Result<Done>>>(submit: impl Fn(Sqe, Option<Bytes>, u32) -> F, qid: u16, b: Vec<u8>) -> Result<()> {
    let d = submit(AuthCommand::send_sqe(0, b.len() as u32), Some(Bytes::from(b)), 0).await?;
    if !d.cqe.status.is_success() {
        return Err(auth_err(format!(
            "queue {qid}: Auth Send failed: {}",
            d.cqe.status
        )));
    }
    Ok(())
}
