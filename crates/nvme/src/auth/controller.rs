//! The controller side of DH-HMAC-CHAP on one queue: Auth Send and Auth
//! Receive commands in, their status and data out.
//!
//! Steps: Negotiate (Send) -> Challenge (Receive) -> Reply (Send) ->
//! Success1 or Failure1 (Receive) -> Success2 or Failure2 (Send, only when
//! the host asked the controller to authenticate too). A problem the host
//! should hear about is reported with Failure1 on its next Auth Receive,
//! as Linux's target does; after a Failure1 has been read, or a Failure2
//! received, [`ControllerAuth::failed`] says why and the caller tears the
//! controller down. A new Negotiate restarts the exchange
//! (re-authentication keeps the queue authenticated until it fails).

use super::dh::KeyPair;
use super::message::{AuthCommand, Challenge, Failure, Message, Success1, RESCODE_FAILED};
use super::response::{augmented_challenge, ctrl_response, host_response, ResponseInput};
use super::{AuthConfig, DhGroup, Entropy, FailureReason, HashId};
use crate::queue_entry::Sqe;
use crate::status::Status;
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// Auth Receive data is padded to AL (as Linux's target does) up to this
/// size; a larger AL gets just the message.
pub const RECEIVE_PAD_MAX: usize = 64 * 1024;

/// Negotiates accepted on a queue before the host proves its secret. Each
/// one makes the controller generate a DH key pair (ffdhe8192: about 12 ms
/// of CPU), and all it takes is a configured host NQN; a host restarts an
/// exchange rarely, so a few are plenty.
pub const MAX_UNPROVEN_NEGOTIATIONS: u32 = 4;

/// One transaction between Negotiate and Reply.
struct Txn {
    tid: u16,
    hash: HashId,
    group: DhGroup,
    c1: Vec<u8>,
    s1: u32,
    dh: Option<KeyPair>,
}

enum Step {
    /// Expecting AUTH_Negotiate.
    Idle,
    /// Negotiate accepted: the next Auth Receive reads the Challenge.
    ChallengeDue(Txn),
    /// Expecting DH-HMAC-CHAP_Reply.
    ReplyDue(Txn),
    /// The host is authenticated; `r2` answers its challenge if it sent one.
    Success1Due {
        tid: u16,
        hash: HashId,
        r2: Option<Vec<u8>>,
    },
    /// Expecting Success2 (or Failure2) after a bidirectional Success1.
    Success2Due {
        tid: u16,
    },
    /// The next Auth Receive reads this Failure1.
    Failure1Due {
        tid: u16,
        reason: FailureReason,
    },
    Done,
    Failed(FailureReason),
}

pub struct ControllerAuth {
    cfg: Arc<AuthConfig>,
    hostnqn: String,
    subnqn: String,
    step: Step,
    authenticated: bool,
    mutual: bool,
    /// Hash and group of the last Negotiate accepted.
    chosen: Option<(HashId, DhGroup)>,
    /// Why the exchange failed or is failing, for the log.
    why: Option<String>,
    /// Negotiates since the host last proved its secret (a matching Reply).
    unproven_negotiations: u32,
}

/// Names and progress only: never key material.
impl std::fmt::Debug for ControllerAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerAuth")
            .field("hostnqn", &self.hostnqn)
            .field("subnqn", &self.subnqn)
            .field("authenticated", &self.authenticated)
            .field("mutual", &self.mutual)
            .field("chosen", &self.chosen)
            .field("failed", &self.failed())
            .finish()
    }
}

impl ControllerAuth {
    pub fn new(cfg: Arc<AuthConfig>, hostnqn: &str, subnqn: &str) -> ControllerAuth {
        ControllerAuth {
            cfg,
            hostnqn: hostnqn.into(),
            subnqn: subnqn.into(),
            step: Step::Idle,
            authenticated: false,
            mutual: false,
            chosen: None,
            why: None,
            unproven_negotiations: 0,
        }
    }

    /// Commands other than Auth Send/Receive (and Disconnect) may run.
    pub fn authenticated(&self) -> bool {
        self.authenticated
    }

    /// The exchange failed for good: the controller must go. The reason
    /// is what the host was told (Failure1) or told us (Failure2).
    pub fn failed(&self) -> Option<FailureReason> {
        match self.step {
            Step::Failed(r) => Some(r),
            _ => None,
        }
    }

    /// Why it failed or is failing, in words (never with key material).
    pub fn why(&self) -> Option<&str> {
        self.why.as_deref()
    }

    /// The hash function and DH group in use.
    pub fn chosen(&self) -> Option<(HashId, DhGroup)> {
        self.chosen
    }

    /// The controller proved itself too (the host sent Success2).
    pub fn mutual(&self) -> bool {
        self.mutual
    }

    /// The host this exchange authenticates.
    pub fn hostnqn(&self) -> &str {
        &self.hostnqn
    }

    /// What was agreed, for the log: `DH-HMAC-CHAP sha256 ffdhe2048, bidirectional`.
    pub fn summary(&self) -> String {
        let (hash, group) = self.chosen.map(|(h, g)| (h.name(), g.name())).unwrap_or(("?", "?"));
        let how = if self.mutual { "bidirectional" } else { "host only" };
        format!("DH-HMAC-CHAP {hash} {group}, {how}")
    }

    fn fail1(&mut self, tid: u16, reason: FailureReason, why: impl Into<String>) {
        self.authenticated = false;
        self.mutual = false;
        self.why = Some(why.into());
        self.step = Step::Failure1Due { tid, reason };
    }

    /// Auth Send: the host's message. `entropy` is used when the message
    /// starts a transaction (challenge, DH exponent, S1).
    pub fn auth_send(&mut self, sqe: &Sqe, data: &[u8], entropy: Entropy) -> Status {
        let Some(cmd) = AuthCommand::parse(sqe).filter(|c| c.send) else {
            return Status::INVALID_OPCODE.dnr();
        };
        if let Err(st) = cmd.check(data.len() as u32) {
            return st;
        }
        if let Step::Failed(_) = self.step {
            return Status::CMD_SEQ_ERROR.dnr();
        }
        let tid_now = self.current_tid();
        let msg = match Message::parse(data) {
            Ok(m) => m,
            Err(e) => {
                self.fail1(
                    tid_now.unwrap_or(0),
                    e.reason(),
                    format!("malformed message from the host: {e}"),
                );
                return Status::SUCCESS;
            }
        };
        match (std::mem::replace(&mut self.step, Step::Idle), msg) {
            (_, Message::Negotiate(n)) => self.negotiate(n, entropy),
            (_, Message::Failure2(f)) => {
                self.authenticated = false;
                self.why = Some(if f.reason == FailureReason::FAILED {
                    "the host refused the controller's response (AUTH_Failure2): is the host's dhchap_ctrl_secret this one?".into()
                } else {
                    format!("the host gave up with AUTH_Failure2: {}", f.reason)
                });
                self.step = Step::Failed(f.reason);
            }
            (Step::ReplyDue(t), Message::Reply(r)) => self.reply(t, r),
            (Step::Success2Due { tid }, Message::Success2 { tid: got }) if got == tid => {
                self.authenticated = true;
                self.mutual = true;
                self.why = None;
                self.step = Step::Done;
            }
            (step, m) => {
                let tid = m.tid();
                let expected = match step {
                    Step::Success2Due { tid: want } if matches!(m, Message::Success2 { .. }) => {
                        self.fail1(
                            tid,
                            FailureReason::INCORRECT_PAYLOAD,
                            format!("Success2 with transaction id {tid}, expected {want}"),
                        );
                        return Status::SUCCESS;
                    }
                    Step::Idle | Step::Done => "AUTH_Negotiate",
                    Step::ReplyDue(_) => "DH-HMAC-CHAP_Reply",
                    Step::Success2Due { .. } => "DH-HMAC-CHAP_Success2",
                    _ => "an Auth Receive",
                };
                self.fail1(
                    tid,
                    FailureReason::INCORRECT_MESSAGE,
                    format!("{} from the host where {expected} was due", m.name()),
                );
            }
        }
        Status::SUCCESS
    }

    fn current_tid(&self) -> Option<u16> {
        match &self.step {
            Step::ChallengeDue(t) | Step::ReplyDue(t) => Some(t.tid),
            Step::Success1Due { tid, .. }
            | Step::Success2Due { tid }
            | Step::Failure1Due { tid, .. } => Some(*tid),
            _ => None,
        }
    }

    fn negotiate(&mut self, n: super::message::Negotiate, entropy: Entropy) {
        let tid = n.tid;
        if self.unproven_negotiations >= MAX_UNPROVEN_NEGOTIATIONS {
            return self.fail1(
                tid,
                FailureReason::FAILED,
                format!(
                    "{MAX_UNPROVEN_NEGOTIATIONS} AUTH_Negotiate on this queue without a valid Reply"
                ),
            );
        }
        self.unproven_negotiations += 1;
        if n.sc_c != 0 {
            return self.fail1(tid, FailureReason::CONCAT_MISMATCH, format!(
                "the host asks for secure channel concatenation (SC_C {:#04x}: a TLS PSK generated by this DH-HMAC-CHAP, TP 8011), which blockwire does not implement (no generated-PSK derivation, no REPLACETLSPSK, no TLS restart after AUTH); configure a TLS PSK for the host (tls_psk/tls_key) and DH-HMAC-CHAP runs inside that TLS",
                n.sc_c
            ));
        }
        let Some(hash) = self
            .cfg
            .hashes
            .iter()
            .copied()
            .find(|h| n.hashes.contains(&h.id()))
        else {
            return self.fail1(
                tid,
                FailureReason::HASH_UNUSABLE,
                format!("no common hash function (host offers ids {:?})", n.hashes),
            );
        };
        let Some(group) = self
            .cfg
            .groups
            .iter()
            .copied()
            .find(|g| n.groups.contains(&g.id()))
        else {
            return self.fail1(
                tid,
                FailureReason::DHGROUP_UNUSABLE,
                format!("no common DH group (host offers ids {:?})", n.groups),
            );
        };
        let dh = match group {
            DhGroup::Null => None,
            g => match KeyPair::generate(g, entropy.dh_private()) {
                Ok(k) => Some(k),
                Err(e) => return self.fail1(tid, FailureReason::DHGROUP_UNUSABLE, e.to_string()),
            },
        };
        self.chosen = Some((hash, group));
        let c1 = entropy.challenge(hash.digest_len()).to_vec();
        self.step = Step::ChallengeDue(Txn {
            tid,
            hash,
            group,
            c1,
            s1: entropy.seqnum,
            dh,
        });
    }

    fn reply(&mut self, t: Txn, r: super::message::Reply) {
        let tid = t.tid;
        if r.tid != tid {
            return self.fail1(
                tid,
                FailureReason::INCORRECT_PAYLOAD,
                format!("Reply with transaction id {}, expected {tid}", r.tid),
            );
        }
        if r.response.len() != t.hash.digest_len() {
            return self.fail1(
                tid,
                FailureReason::INCORRECT_PAYLOAD,
                format!(
                    "Reply with a {}-byte response for {}",
                    r.response.len(),
                    t.hash
                ),
            );
        }
        let session = match (&t.dh, r.dh_value.is_empty()) {
            (None, true) => None,
            (None, false) => {
                return self.fail1(
                    tid,
                    FailureReason::INCORRECT_PAYLOAD,
                    "Reply carries a DH value but the null group was chosen",
                )
            }
            (Some(_), true) => {
                return self.fail1(
                    tid,
                    FailureReason::INCORRECT_PAYLOAD,
                    format!("Reply lacks the DH value of {}", t.group),
                )
            }
            (Some(k), false) => match k.shared_secret(&r.dh_value) {
                Ok(s) => Some(s),
                Err(e) => {
                    return self.fail1(
                        tid,
                        FailureReason::DHGROUP_UNUSABLE,
                        format!("host DH value refused: {e}"),
                    )
                }
            },
        };
        let augment = |c: &[u8]| match &session {
            Some(ks) => augmented_challenge(t.hash, ks, c),
            None => c.to_vec(),
        };
        let ca1 = augment(&t.c1);
        let input = ResponseInput {
            hash: t.hash,
            challenge: &ca1,
            seqnum: t.s1,
            tid,
            sc_c: 0,
            hostnqn: &self.hostnqn,
            subnqn: &self.subnqn,
        };
        let want = host_response(&self.cfg.host_key.transformed(&self.hostnqn), &input);
        if !bool::from(want.ct_eq(&r.response)) {
            return self.fail1(
                tid,
                FailureReason::FAILED,
                "the host's response does not match its secret (wrong dhchap_secret?)",
            );
        }
        self.unproven_negotiations = 0;
        // S2 = 0 with a C2 only asks for a TLS PSK, which is not offered.
        let r2 = match r.challenge.filter(|_| r.seqnum != 0) {
            None => None,
            Some(c2) => {
                let Some(kc) = &self.cfg.ctrl_key else {
                    return self.fail1(tid, FailureReason::FAILED, "the host asks the controller to authenticate, but no dhchap_ctrl_secret is configured for it");
                };
                let ca2 = augment(&c2);
                let input = ResponseInput {
                    challenge: &ca2,
                    seqnum: r.seqnum,
                    ..input
                };
                Some(ctrl_response(&kc.transformed(&self.subnqn), &input))
            }
        };
        self.step = Step::Success1Due {
            tid,
            hash: t.hash,
            r2,
        };
    }

    /// Auth Receive: the message the host reads now, padded to AL (at
    /// most [`RECEIVE_PAD_MAX`] bytes).
    pub fn auth_receive(&mut self, sqe: &Sqe) -> Result<Vec<u8>, Status> {
        let Some(cmd) = AuthCommand::parse(sqe).filter(|c| !c.send) else {
            return Err(Status::INVALID_OPCODE.dnr());
        };
        cmd.check(sqe.sgl().length)?;
        let failure = |tid, reason| {
            Message::Failure1(Failure {
                tid,
                rescode: RESCODE_FAILED,
                reason,
            })
        };
        let msg = match &self.step {
            Step::ChallengeDue(t) => Message::Challenge(Challenge {
                tid: t.tid,
                hash_id: t.hash.id(),
                group_id: t.group.id(),
                seqnum: t.s1,
                challenge: t.c1.clone(),
                dh_value: t
                    .dh
                    .as_ref()
                    .map(|k| k.public().to_vec())
                    .unwrap_or_default(),
            }),
            Step::Success1Due { tid, hash, r2 } => Message::Success1(Success1 {
                tid: *tid,
                hl: hash.digest_len() as u8,
                response: r2.clone(),
            }),
            Step::Failure1Due { tid, reason } => failure(*tid, *reason),
            Step::Failed(_) => return Err(Status::CMD_SEQ_ERROR.dnr()),
            Step::ReplyDue(t) => failure(t.tid, FailureReason::INCORRECT_MESSAGE),
            Step::Success2Due { tid } => failure(*tid, FailureReason::INCORRECT_MESSAGE),
            Step::Idle | Step::Done => failure(0, FailureReason::INCORRECT_MESSAGE),
        };
        let mut out = msg.encode();
        let al = cmd.len as usize;
        if out.len() > al {
            // A Challenge may simply need a larger buffer (the host can ask
            // again); an AL too small for the short messages is a host bug.
            if !matches!(msg, Message::Challenge(_)) {
                self.authenticated = false;
                self.why = Some(format!(
                    "Auth Receive of {al} bytes cannot hold {}",
                    msg.name()
                ));
                self.step = Step::Failed(FailureReason::INCORRECT_PAYLOAD);
            }
            return Err(Status::INVALID_FIELD.dnr());
        }
        self.step = match std::mem::replace(&mut self.step, Step::Idle) {
            Step::ChallengeDue(t) => Step::ReplyDue(t),
            Step::Success1Due {
                tid, r2: Some(_), ..
            } => Step::Success2Due { tid },
            Step::Success1Due { r2: None, .. } => {
                self.authenticated = true;
                self.why = None;
                Step::Done
            }
            Step::Failure1Due { reason, .. } => Step::Failed(reason),
            _ => {
                self.authenticated = false;
                self.why = Some("Auth Receive where the host had to send a message".into());
                Step::Failed(FailureReason::INCORRECT_MESSAGE)
            }
        };
        out.resize(al.min(RECEIVE_PAD_MAX).max(out.len()), 0);
        Ok(out)
    }
}
