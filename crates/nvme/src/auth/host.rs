//! The host side of DH-HMAC-CHAP on one queue. The caller runs the
//! actions: [`HostAction::Send`] is an Auth Send of those bytes,
//! [`HostAction::Receive`] an Auth Receive whose data goes to
//! [`HostAuth::received`]; after a successful Send it calls
//! [`HostAuth::sent`]. On failure the host tells the controller with
//! AUTH_Failure2 when the protocol wants it ([`HostAction::Failed::send`]).

use super::dh::KeyPair;
use super::message::{Failure, Message, Negotiate, Reply, RESCODE_FAILED};
use super::response::{augmented_challenge, ctrl_response, host_response, ResponseInput};
use super::{AuthConfig, DhGroup, Entropy, FailureReason, HashId};
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// The Auth Receive buffer a host offers (Linux uses 4 KiB too; the
/// largest message, a Challenge with an ffdhe8192 value, is 1104 bytes).
pub const RECEIVE_LEN: u32 = 4096;

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum HostError {
    /// The controller refused us (AUTH_Failure1), e.g. a wrong host secret.
    #[error("the controller refused authentication: {0}")]
    Refused(FailureReason),
    /// The controller failed to prove it holds the controller secret.
    #[error("the controller did not prove it knows the controller secret (wrong --dhchap-ctrl-secret, or not this controller)")]
    ControllerNotAuthenticated,
    /// We cannot go on with what the controller sent.
    #[error("{why} ({reason})")]
    Unusable { reason: FailureReason, why: String },
    #[error("authentication used out of order: {0}")]
    Sequence(&'static str),
}

pub enum HostAction {
    /// Auth Send these bytes.
    Send(Vec<u8>),
    /// Auth Receive up to [`RECEIVE_LEN`] bytes.
    Receive,
    /// The queue is authenticated.
    Done,
    /// Authentication failed; send `send` (AUTH_Failure2) first if given.
    Failed {
        send: Option<Vec<u8>>,
        error: HostError,
    },
}

enum Step {
    Start,
    NegotiateSent,
    AwaitChallenge,
    ReplySent { hash: HashId, r2: Option<Vec<u8>> },
    AwaitSuccess1 { hash: HashId, r2: Option<Vec<u8>> },
    Success2Sent,
    Finished,
}

pub struct HostAuth {
    cfg: Arc<AuthConfig>,
    hostnqn: String,
    subnqn: String,
    tid: u16,
    entropy: Entropy,
    step: Step,
}

impl HostAuth {
    /// One transaction with id `tid`; `entropy` makes C2, the DH exponent
    /// and S2.
    pub fn new(
        cfg: Arc<AuthConfig>,
        hostnqn: &str,
        subnqn: &str,
        tid: u16,
        entropy: Entropy,
    ) -> HostAuth {
        HostAuth {
            cfg,
            hostnqn: hostnqn.into(),
            subnqn: subnqn.into(),
            tid,
            entropy,
            step: Step::Start,
        }
    }

    /// The first action: send AUTH_Negotiate with what we offer.
    pub fn start(&mut self) -> HostAction {
        if !matches!(self.step, Step::Start) {
            return self.abort(HostError::Sequence("start called twice"));
        }
        self.step = Step::NegotiateSent;
        let n = Negotiate {
            tid: self.tid,
            sc_c: 0,
            hashes: self.cfg.hashes.iter().map(|h| h.id()).collect(),
            groups: self.cfg.groups.iter().map(|g| g.id()).collect(),
        };
        HostAction::Send(Message::Negotiate(n).encode())
    }

    /// The last Send completed successfully.
    pub fn sent(&mut self) -> HostAction {
        match std::mem::replace(&mut self.step, Step::Finished) {
            Step::NegotiateSent => {
                self.step = Step::AwaitChallenge;
                HostAction::Receive
            }
            Step::ReplySent { hash, r2 } => {
                self.step = Step::AwaitSuccess1 { hash, r2 };
                HostAction::Receive
            }
            Step::Success2Sent => HostAction::Done,
            _ => self.abort(HostError::Sequence("sent() without a pending Send")),
        }
    }

    fn abort(&mut self, error: HostError) -> HostAction {
        self.step = Step::Finished;
        HostAction::Failed { send: None, error }
    }

    /// Fail and tell the controller why with AUTH_Failure2.
    fn fail2(&mut self, reason: FailureReason, error: HostError) -> HostAction {
        self.step = Step::Finished;
        let f = Message::Failure2(Failure {
            tid: self.tid,
            rescode: RESCODE_FAILED,
            reason,
        })
        .encode();
        HostAction::Failed {
            send: Some(f),
            error,
        }
    }

    fn unusable(&mut self, reason: FailureReason, why: String) -> HostAction {
        self.fail2(reason, HostError::Unusable { reason, why })
    }

    /// The data of an Auth Receive.
    pub fn received(&mut self, data: &[u8]) -> HostAction {
        let msg = match Message::parse(data) {
            Ok(m) => m,
            Err(e) => {
                return self.unusable(
                    e.reason(),
                    format!("malformed message from the controller: {e}"),
                )
            }
        };
        if let Message::Failure1(f) = msg {
            return self.abort(HostError::Refused(f.reason));
        }
        if msg.tid() != self.tid {
            return self.unusable(
                FailureReason::INCORRECT_MESSAGE,
                format!(
                    "{} with transaction id {}, expected {}",
                    msg.name(),
                    msg.tid(),
                    self.tid
                ),
            );
        }
        match (std::mem::replace(&mut self.step, Step::Finished), msg) {
            (Step::AwaitChallenge, Message::Challenge(c)) => self.challenge(c),
            (Step::AwaitSuccess1 { hash, r2 }, Message::Success1(s)) => {
                if s.hl as usize != hash.digest_len() {
                    return self.unusable(
                        FailureReason::HASH_UNUSABLE,
                        format!(
                            "Success1 with hash length {}, expected {}",
                            s.hl,
                            hash.digest_len()
                        ),
                    );
                }
                let Some(want) = r2 else {
                    return HostAction::Done;
                };
                match s.response {
                    Some(got) if bool::from(want.ct_eq(&got)) => {
                        self.step = Step::Success2Sent;
                        HostAction::Send(Message::Success2 { tid: self.tid }.encode())
                    }
                    // Wrong or missing R2: the controller does not hold the key.
                    _ => self.fail2(FailureReason::FAILED, HostError::ControllerNotAuthenticated),
                }
            }
            (_, m) => self.unusable(
                FailureReason::INCORRECT_MESSAGE,
                format!("unexpected {} from the controller", m.name()),
            ),
        }
    }

    fn challenge(&mut self, c: super::message::Challenge) -> HostAction {
        let Some(hash) = HashId::from_id(c.hash_id).filter(|h| self.cfg.hashes.contains(h)) else {
            return self.unusable(
                FailureReason::HASH_UNUSABLE,
                format!(
                    "the controller chose hash id {}, which we did not offer",
                    c.hash_id
                ),
            );
        };
        if c.challenge.len() != hash.digest_len() {
            return self.unusable(
                FailureReason::HASH_UNUSABLE,
                format!("a {}-byte challenge for {hash}", c.challenge.len()),
            );
        }
        let Some(group) = DhGroup::from_id(c.group_id).filter(|g| self.cfg.groups.contains(g))
        else {
            return self.unusable(
                FailureReason::DHGROUP_UNUSABLE,
                format!(
                    "the controller chose DH group id {}, which we did not offer",
                    c.group_id
                ),
            );
        };
        let (session, our_value) = match group {
            DhGroup::Null if c.dh_value.is_empty() => (None, Vec::new()),
            DhGroup::Null => {
                return self.unusable(
                    FailureReason::INCORRECT_PAYLOAD,
                    "a DH value with the null group".into(),
                )
            }
            g => {
                let k = match KeyPair::generate(g, self.entropy.dh_private()) {
                    Ok(k) => k,
                    Err(e) => return self.unusable(FailureReason::DHGROUP_UNUSABLE, e.to_string()),
                };
                match k.shared_secret(&c.dh_value) {
                    Ok(s) => (Some(s), k.public().to_vec()),
                    Err(e) => {
                        return self.unusable(
                            FailureReason::DHGROUP_UNUSABLE,
                            format!("controller DH value refused: {e}"),
                        )
                    }
                }
            }
        };
        let augment = |x: &[u8]| match &session {
            Some(ks) => augmented_challenge(hash, ks, x),
            None => x.to_vec(),
        };
        let ca1 = augment(&c.challenge);
        let input = ResponseInput {
            hash,
            challenge: &ca1,
            seqnum: c.seqnum,
            tid: self.tid,
            sc_c: 0,
            hostnqn: &self.hostnqn,
            subnqn: &self.subnqn,
        };
        let r1 = host_response(&self.cfg.host_key.transformed(&self.hostnqn), &input);
        // Bidirectional: our challenge C2 and sequence number S2 (never 0),
        // and the R2 we will expect back.
        let (c2, s2, r2) = match &self.cfg.ctrl_key {
            None => (None, 0, None),
            Some(kc) => {
                let c2 = self.entropy.challenge(hash.digest_len()).to_vec();
                let s2 = self.entropy.seqnum.max(1);
                let ca2 = augment(&c2);
                let r2 = ctrl_response(
                    &kc.transformed(&self.subnqn),
                    &ResponseInput {
                        challenge: &ca2,
                        seqnum: s2,
                        ..input
                    },
                );
                (Some(c2), s2, Some(r2))
            }
        };
        self.step = Step::ReplySent { hash, r2 };
        HostAction::Send(
            Message::Reply(Reply {
                tid: self.tid,
                response: r1,
                challenge: c2,
                seqnum: s2,
                dh_value: our_value,
            })
            .encode(),
        )
    }
}
