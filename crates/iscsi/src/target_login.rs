//! Target side of the login phase (RFC 7143 sections 6 and 11.12-11.13):
//! security stage (AuthMethod None or CHAP, optionally mutual), operational
//! stage (key negotiation), transition to full feature phase, with the
//! status class/detail for each way a login can fail.

use std::time::Instant;
use crate::chap::{self, ChapAlgorithm};
use crate::msg::{login_status, stage, LoginRequest, LoginResponse, Message};
use crate::negotiate::{LocalLimits, Responder, SessionParams, SessionType};
use crate::pdu::{Opcode, Pdu};
use crate::text;
use bytes::Bytes;
use zeroize::Zeroizing;

/// Longest iSCSI name, in bytes (RFC 7143 section 4.2.7.1).
pub const MAX_NAME_LEN: usize = 223;

/// CHAP credentials: a user name and a secret, the secret wiped from
/// memory when dropped.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    pub user: String,
    pub secret: Zeroizing<String>,
}

impl Secret {
    pub fn new(user: impl Into<String>, secret: impl Into<String>) -> Secret {
        Secret { user: user.into(), secret: Zeroizing::new(secret.into()) }
    }
}

/// The user name only: a CHAP secret never reaches a log through `{:?}`.
impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secret").field("user", &self.user).field("secret", &"<redacted>").finish()
    }
}

/// One target as login sees it.
#[derive(Debug, Clone)]
pub struct TargetInfo {
    pub name: String,
    pub alias: Option<String>,
    pub portal_group_tag: u16,
    /// Initiator names allowed to log in; empty means anyone.
    pub allowed_initiators: Vec<String>,
    /// Initiators must authenticate with this (CHAP).
    pub chap: Option<Secret>,
    /// We authenticate ourselves with this when the initiator asks (mutual CHAP).
    pub mutual_chap: Option<Secret>,
}

#[derive(Debug, Clone)]
pub struct LoginConfig {
    pub targets: Vec<TargetInfo>,
    pub limits: LocalLimits,
    /// Commands a session may have outstanding (sets MaxCmdSN).
    pub queue_depth: u32,
    /// A discovery session (SendTargets) must authenticate with these (CHAP).
    pub discovery_chap: Option<Secret>,
    /// The portal proves itself with these in discovery sessions (mutual CHAP).
    pub discovery_mutual_chap: Option<Secret>,
}

/// What a successful login established.
#[derive(Debug, Clone)]
pub struct LoginResult {
    pub session_type: SessionType,
    pub initiator_name: String,
    pub isid: [u8; 6],
    pub tsih: u16,
    pub cid: u16,
    /// Index into [`LoginConfig::targets`] (None for discovery).
    pub target: Option<usize>,
    pub params: SessionParams,
    /// ExpCmdSN for the first full-feature command.
    pub exp_cmd_sn: u32,
    /// StatSN for the first full-feature response.
    pub next_stat_sn: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoginStep {
    /// Send the response and wait for the next request.
    Continue,
    /// Send the response; the connection enters full feature phase.
    Complete,
    /// Send the (failure) response and close the connection.
    Failed(u16),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Auth {
    /// AuthMethod not agreed yet.
    Start,
    /// AuthMethod=CHAP agreed; waiting for CHAP_A.
    WantAlgorithm,
    /// Challenge sent; waiting for CHAP_N/CHAP_R.
    WantResponse { alg: ChapAlgorithm, id: u8, challenge: Vec<u8> },
    Done,
}

pub struct TargetLogin<'a> {
    cfg: &'a LoginConfig,
    tsih: u16,
    first: Option<LoginRequest>,
    initiator_name: String,
    session_type: SessionType,
    target: Option<usize>,
    auth: Auth,
    responder: Responder,
    stat_sn: u32,
    sent_tpgt: bool,
    sent_declarations: bool,
    /// Text of a request split over several PDUs (C bit).
    partial: Vec<u8>,
    result: Option<LoginResult>,
    entropy: chap::ChapEntropy,
    /// The whole login, not each PDU, must end by then: a peer dripping a
    /// byte at a time must not hold its connection for ever.
    deadline: Option<Instant>,
}

/// The login did not complete by its deadline ([`TargetLogin::with_deadline`]):
/// close the connection without an answer (there is no request to answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginTimedOut;

fn status_parts(s: u16) -> (u8, u8) {
    ((s >> 8) as u8, s as u8)
}

impl<'a> TargetLogin<'a> {
    /// `tsih` is the session handle to give the session if login succeeds;
    /// `entropy` makes the CHAP challenge (random bytes from the caller).
    pub fn new(cfg: &'a LoginConfig, tsih: u16, entropy: chap::ChapEntropy) -> Self {
        TargetLogin {
            cfg,
            tsih,
            entropy,
            first: None,
            initiator_name: String::new(),
            session_type: SessionType::Normal,
            target: None,
            auth: Auth::Start,
            responder: Responder::new(cfg.limits.clone(), SessionType::Normal),
            stat_sn: 0,
            sent_tpgt: false,
            sent_declarations: false,
            partial: Vec::new(),
            result: None,
            deadline: None,
        }
    }

    /// The login must be complete by `deadline` (see [`TargetLogin::poll_timeout`]).
    pub fn with_deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// When [`TargetLogin::handle_timeout`] wants to run: the deadline, until
    /// the login is complete.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.deadline.filter(|_| self.result.is_none())
    }

    /// Time has reached `now`: past the deadline of an unfinished login the
    /// connection is to be closed.
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), LoginTimedOut> {
        match self.poll_timeout() {
            Some(d) if now >= d => Err(LoginTimedOut),
            _ => Ok(()),
        }
    }

    pub fn result(&self) -> Option<&LoginResult> {
        self.result.as_ref()
    }
    pub fn initiator_name(&self) -> &str {
        &self.initiator_name
    }
    /// The configured target the initiator asked for (an index into
    /// [`LoginConfig::targets`]), once it named one we have.
    pub fn target(&self) -> Option<usize> {
        self.target
    }

    /// Refuse the login `pdu` belongs to with `status` (e.g. OUT_OF_RESOURCES
    /// when the portal holds all the sessions it may); close afterwards.
    pub fn refuse(&mut self, pdu: &Pdu, status: u16) -> Pdu {
        let req = match Message::decode(&pdu.bhs) {
            Ok(Message::LoginRequest(r)) => r,
            _ => LoginRequest { itt: pdu.bhs.itt(), ..Default::default() },
        };
        self.fail(&req, status).0
    }

    /// Handle one PDU of the login phase and produce the response to send.
    pub fn step(&mut self, pdu: &Pdu) -> (Pdu, LoginStep) {
        let req = match pdu.bhs.opcode().ok().map(|_| Message::decode(&pdu.bhs)) {
            Some(Ok(Message::LoginRequest(r))) => r,
            _ => {
                // Anything but a Login Request during login is an initiator error.
                let fake = LoginRequest { itt: pdu.bhs.itt(), ..Default::default() };
                return self.fail(&fake, login_status::INVALID_DURING_LOGIN);
            }
        };
        let _ = Opcode::LoginRequest;
        if let Some(first) = &self.first {
            if first.isid != req.isid || first.tsih != req.tsih || first.cid != req.cid {
                return self.fail(&req, login_status::INITIATOR_ERROR);
            }
        } else {
            if req.version_min > 0 {
                return self.fail(&req, login_status::UNSUPPORTED_VERSION);
            }
            if req.tsih != 0 {
                // Adding a connection to an existing session (MC/S) is not supported.
                return self.fail(&req, login_status::SESSION_DOES_NOT_EXIST);
            }
            self.stat_sn = req.exp_stat_sn;
            self.first = Some(req.clone());
        }
        self.partial.extend_from_slice(&pdu.data);
        if self.partial.len() > 64 * 1024 {
            return self.fail(&req, login_status::OUT_OF_RESOURCES);
        }
        if req.continue_ {
            // More text follows: acknowledge with an empty response.
            let resp = self.response(&req, false, req.csg, 0, Vec::new());
            return (resp, LoginStep::Continue);
        }
        let data = std::mem::take(&mut self.partial);
        let pairs = match text::parse(&data) {
            Ok(p) => p,
            Err(_) => return self.fail(&req, login_status::INITIATOR_ERROR),
        };
        match self.process(&req, &pairs) {
            Ok((answers, transit)) => {
                let complete = transit && req.nsg == stage::FULL_FEATURE;
                let resp = self.response(&req, transit, req.csg, if transit { req.nsg } else { 0 }, answers);
                if complete {
                    self.result = Some(LoginResult {
                        session_type: self.session_type,
                        initiator_name: self.initiator_name.clone(),
                        isid: req.isid,
                        tsih: self.tsih,
                        cid: req.cid,
                        target: self.target,
                        params: self.responder.params.clone(),
                        exp_cmd_sn: req.cmd_sn,
                        next_stat_sn: self.stat_sn,
                    });
                    (resp, LoginStep::Complete)
                } else {
                    (resp, LoginStep::Continue)
                }
            }
            Err(status) => self.fail(&req, status),
        }
    }

    /// Process the keys of one complete request: returns our answers and
    /// whether we agree to the requested stage transition.
    fn process(&mut self, req: &LoginRequest, pairs: &[(String, String)]) -> Result<(Vec<(String, String)>, bool), u16> {
        let mut out: Vec<(String, String)> = Vec::new();
        let first_text = self.initiator_name.is_empty();
        if first_text {
            self.identify(pairs)?;
            if let Some(t) = self.target.map(|i| &self.cfg.targets[i]) {
                if !self.sent_tpgt {
                    out.push(("TargetPortalGroupTag".into(), t.portal_group_tag.to_string()));
                    if let Some(a) = &t.alias {
                        out.push(("TargetAlias".into(), a.clone()));
                    }
                    self.sent_tpgt = true;
                }
            }
        }
        if req.csg == stage::FULL_FEATURE || (req.transit && req.nsg <= req.csg) || req.nsg == 2 {
            return Err(login_status::INITIATOR_ERROR);
        }
        if req.csg == stage::OPERATIONAL && self.auth_required() && self.auth != Auth::Done {
            // Skipping the security stage when CHAP is required.
            return Err(login_status::AUTHENTICATION_FAILURE);
        }
        let mut seen = std::collections::HashSet::new();
        for (k, v) in pairs {
            if !seen.insert(k.as_str()) {
                continue; // answer each key once
            }
            match k.as_str() {
                "InitiatorName" | "TargetName" | "SessionType" | "InitiatorAlias" => {}
                "AuthMethod" | "CHAP_A" | "CHAP_N" | "CHAP_R" | "CHAP_I" | "CHAP_C" => {
                    if req.csg != stage::SECURITY {
                        return Err(login_status::INITIATOR_ERROR);
                    }
                }
                "TargetAlias" | "TargetAddress" | "TargetPortalGroupTag" => {
                    // Target-declared keys sent by an initiator.
                    return Err(login_status::INITIATOR_ERROR);
                }
                "SendTargets" => out.push((k.clone(), "Irrelevant".into())),
                _ => {
                    if let Some(a) = self.responder.answer(k, v) {
                        out.push((k.clone(), a));
                    }
                }
            }
        }
        if req.csg == stage::SECURITY {
            self.security(pairs, &mut out)?;
        }
        let ready = req.csg != stage::SECURITY || self.auth == Auth::Done;
        if req.csg == stage::SECURITY && self.auth == Auth::Start && self.auth_required() {
            // CHAP is required but the initiator did not offer any AuthMethod.
            return Err(login_status::AUTHENTICATION_FAILURE);
        }
        let transit = req.transit && ready;
        // Declare our receive limit once we are negotiating operational
        // parameters (or leaving security straight for full feature phase).
        if !self.sent_declarations && (req.csg == stage::OPERATIONAL || (transit && req.nsg == stage::FULL_FEATURE)) {
            out.push(("MaxRecvDataSegmentLength".into(), self.cfg.limits.max_recv_data_segment_length.to_string()));
            self.sent_declarations = true;
        }
        Ok((out, transit))
    }

    /// First request: who is logging in to what.
    fn identify(&mut self, pairs: &[(String, String)]) -> Result<(), u16> {
        let name = text::get(pairs, "InitiatorName").ok_or(login_status::MISSING_PARAMETER)?;
        if name.is_empty() {
            return Err(login_status::MISSING_PARAMETER);
        }
        if name.len() > MAX_NAME_LEN {
            return Err(login_status::INITIATOR_ERROR);
        }
        self.initiator_name = name.to_string();
        self.session_type = match text::get(pairs, "SessionType").unwrap_or("Normal") {
            "Normal" => SessionType::Normal,
            "Discovery" => SessionType::Discovery,
            _ => return Err(login_status::SESSION_TYPE_NOT_SUPPORTED),
        };
        self.responder.session_type = self.session_type;
        if self.session_type == SessionType::Normal {
            let tn = text::get(pairs, "TargetName").ok_or(login_status::MISSING_PARAMETER)?;
            if tn.len() > MAX_NAME_LEN {
                return Err(login_status::INITIATOR_ERROR);
            }
            let idx = self.cfg.targets.iter().position(|t| t.name == tn).ok_or(login_status::NOT_FOUND)?;
            let t = &self.cfg.targets[idx];
            if !t.allowed_initiators.is_empty() && !t.allowed_initiators.iter().any(|a| a == name) {
                return Err(login_status::AUTHORIZATION_FAILURE);
            }
            self.target = Some(idx);
        }
        Ok(())
    }

    fn target_info(&self) -> Option<&TargetInfo> {
        self.target.map(|i| &self.cfg.targets[i])
    }

    /// The CHAP secrets of this login (what the initiator must prove, what
    /// we prove in mutual CHAP): the target's for a normal session, the
    /// portal's discovery secrets for a discovery session.
    fn secrets(&self) -> (Option<&Secret>, Option<&Secret>) {
        match self.session_type {
            SessionType::Discovery => (self.cfg.discovery_chap.as_ref(), self.cfg.discovery_mutual_chap.as_ref()),
            SessionType::Normal => self.target_info().map_or((None, None), |t| (t.chap.as_ref(), t.mutual_chap.as_ref())),
        }
    }

    fn auth_required(&self) -> bool {
        self.secrets().0.is_some()
    }

    fn security(&mut self, pairs: &[(String, String)], out: &mut Vec<(String, String)>) -> Result<(), u16> {
        let fail = login_status::AUTHENTICATION_FAILURE;
        if let Some(methods) = text::get(pairs, "AuthMethod") {
            if self.auth != Auth::Start {
                return Err(login_status::INITIATOR_ERROR);
            }
            let offered: Vec<&str> = methods.split(',').collect();
            if self.auth_required() {
                if !offered.contains(&"CHAP") {
                    out.push(("AuthMethod".into(), "Reject".into()));
                    return Err(fail);
                }
                out.push(("AuthMethod".into(), "CHAP".into()));
                self.auth = Auth::WantAlgorithm;
            } else if offered.contains(&"None") {
                out.push(("AuthMethod".into(), "None".into()));
                self.auth = Auth::Done;
            } else {
                // Initiator insists on authenticating but we have no secret.
                return Err(fail);
            }
        }
        match self.auth.clone() {
            Auth::Start => {
                if !self.auth_required() && text::get(pairs, "CHAP_A").is_none() {
                    // No AuthMethod offered: none applies when none is needed.
                    self.auth = Auth::Done;
                }
            }
            Auth::WantAlgorithm => {
                if let Some(list) = text::get(pairs, "CHAP_A") {
                    let alg = ChapAlgorithm::choose(list).ok_or(fail)?;
                    let id = self.entropy.id();
                    let challenge = self.entropy.challenge(alg.digest_len().max(16));
                    out.push(("CHAP_A".into(), alg.code().to_string()));
                    out.push(("CHAP_I".into(), id.to_string()));
                    out.push(("CHAP_C".into(), chap::encode_hex(&challenge)));
                    self.auth = Auth::WantResponse { alg, id, challenge };
                }
            }
            Auth::WantResponse { alg, id, challenge } => {
                let (Some(n), Some(r)) = (text::get(pairs, "CHAP_N"), text::get(pairs, "CHAP_R")) else {
                    return Err(fail);
                };
                let (cred, mutual) = self.secrets();
                let cred = cred.ok_or(fail)?;
                let got = chap::decode_binary(r).ok_or(fail)?;
                let want = chap::response(alg, id, cred.secret.as_bytes(), &challenge);
                if n != cred.user || !chap::verify(&want, &got) {
                    return Err(fail);
                }
                // Mutual CHAP: the initiator challenges us in the same request.
                if let (Some(i), Some(c)) = (text::get(pairs, "CHAP_I"), text::get(pairs, "CHAP_C")) {
                    let m = mutual.ok_or(fail)?;
                    let their_id = crate::negotiate::parse_number(i).filter(|v| *v <= 255).ok_or(fail)? as u8;
                    let their_challenge = chap::decode_binary(c).ok_or(fail)?;
                    // Refuse a reflected challenge (RFC 7143 section 12.1.3).
                    if their_challenge == challenge || their_challenge.is_empty() {
                        return Err(fail);
                    }
                    let resp = chap::response(alg, their_id, m.secret.as_bytes(), &their_challenge);
                    out.push(("CHAP_N".into(), m.user.clone()));
                    out.push(("CHAP_R".into(), chap::encode_hex(&resp)));
                }
                self.auth = Auth::Done;
            }
            Auth::Done => {}
        }
        Ok(())
    }

    fn response(&mut self, req: &LoginRequest, transit: bool, csg: u8, nsg: u8, pairs: Vec<(String, String)>) -> Pdu {
        let complete = transit && nsg == stage::FULL_FEATURE;
        let r = LoginResponse {
            transit,
            continue_: false,
            csg,
            nsg,
            version_max: 0,
            version_active: 0,
            isid: req.isid,
            tsih: if complete { self.tsih } else { 0 },
            itt: req.itt,
            stat_sn: self.stat_sn,
            exp_cmd_sn: req.cmd_sn,
            max_cmd_sn: req.cmd_sn.wrapping_add(self.cfg.queue_depth.max(1) - 1),
            status_class: 0,
            status_detail: 0,
        };
        self.stat_sn = self.stat_sn.wrapping_add(1);
        Pdu::new(Message::LoginResponse(r).encode(), Bytes::from(text::encode(&pairs)))
    }

    fn fail(&mut self, req: &LoginRequest, status: u16) -> (Pdu, LoginStep) {
        let mut pdu = self.response(req, false, req.csg, 0, Vec::new());
        let (class, detail) = status_parts(status);
        pdu.bhs.set(crate::pdu::field::STATUS_CLASS, class);
        pdu.bhs.set(crate::pdu::field::STATUS_DETAIL, detail);
        (pdu, LoginStep::Failed(status))
    }
}

/// `SendTargets` answer: `TargetName=` then one `TargetAddress=ADDR:PORT,TPGT`
/// per portal, for each target the initiator may see.
pub fn send_targets(targets: &[(String, Vec<String>)], value: &str, current: Option<&str>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (name, portals) in targets {
        let wanted = match value {
            "All" => true,
            "" => current == Some(name.as_str()),
            v => v == name,
        };
        if wanted {
            out.push(("TargetName".to_string(), name.clone()));
            for p in portals {
                out.push(("TargetAddress".to_string(), p.clone()));
            }
        }
    }
    out
}
