//! Initiator side of login (no sockets): builds Login Requests, checks the
//! target's answers, runs CHAP (optionally mutual) and ends with the
//! negotiated parameters.

use crate::chap::{self, ChapAlgorithm};
use crate::target_login::Secret;
use crate::msg::{stage, LoginRequest, Message};
use crate::negotiate::{accept_answer, offers, LocalLimits, SessionParams, SessionType};
use crate::pdu::Pdu;
use crate::text;
use bytes::Bytes;

#[derive(Debug, Clone)]
pub struct InitiatorConfig {
    pub initiator_name: String,
    /// `None` for a discovery session.
    pub target_name: Option<String>,
    pub chap: Option<Secret>,
    /// Ask the target to prove itself with this secret (mutual CHAP).
    pub mutual_chap: Option<Secret>,
    pub limits: LocalLimits,
    pub isid: [u8; 6],
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoginError {
    #[error("target refused login: status {0:#06x} ({})", describe_status(*.0))]
    Refused(u16),
    #[error("unexpected login response: {0}")]
    Protocol(String),
    #[error("target failed mutual CHAP authentication")]
    TargetAuth,
}

pub fn describe_status(s: u16) -> &'static str {
    use crate::msg::login_status::*;
    match s {
        TARGET_MOVED_TEMPORARILY => "target moved",
        AUTHENTICATION_FAILURE => "authentication failure",
        AUTHORIZATION_FAILURE => "initiator not allowed",
        NOT_FOUND => "target not found",
        TARGET_REMOVED => "target removed",
        UNSUPPORTED_VERSION => "unsupported version",
        TOO_MANY_CONNECTIONS => "too many connections",
        MISSING_PARAMETER => "missing parameter",
        SESSION_TYPE_NOT_SUPPORTED => "session type not supported",
        SESSION_DOES_NOT_EXIST => "session does not exist",
        INVALID_DURING_LOGIN => "invalid request during login",
        OUT_OF_RESOURCES => "target out of resources (session limit?)",
        x if x >> 8 == 2 => "initiator error",
        x if x >> 8 == 3 => "target error",
        _ => "unknown",
    }
}

#[derive(Debug, Clone)]
pub struct LoginDone {
    pub params: SessionParams,
    pub tsih: u16,
    /// Next CmdSN to use and the target's window.
    pub cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub exp_stat_sn: u32,
}

#[derive(Debug, Clone)]
pub enum Progress {
    Send(Pdu),
    Done(LoginDone),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// Security request sent (AuthMethod offered).
    Auth,
    /// CHAP_A sent.
    ChapAlgorithm,
    /// CHAP_N/CHAP_R sent; for mutual, our challenge.
    ChapResponse { alg: ChapAlgorithm, id: u8, challenge: Vec<u8> },
    /// Operational keys sent.
    Operational,
}

pub struct InitiatorLogin {
    cfg: InitiatorConfig,
    phase: Phase,
    params: SessionParams,
    offered: Vec<(String, String)>,
    cmd_sn: u32,
    exp_stat_sn: u32,
    rounds: u32,
    entropy: chap::ChapEntropy,
}

impl InitiatorLogin {
    /// `entropy` makes the mutual-CHAP challenge (random bytes from the caller).
    pub fn new(cfg: InitiatorConfig, entropy: chap::ChapEntropy) -> Self {
        let params = SessionParams { max_recv_data_segment_length: cfg.limits.max_recv_data_segment_length, ..Default::default() };
        InitiatorLogin { cfg, entropy, phase: Phase::Auth, params, offered: Vec::new(), cmd_sn: 1, exp_stat_sn: 0, rounds: 0 }
    }

    fn session_type(&self) -> SessionType {
        if self.cfg.target_name.is_some() { SessionType::Normal } else { SessionType::Discovery }
    }

    fn request(&self, transit: bool, csg: u8, nsg: u8, pairs: &[(String, String)]) -> Pdu {
        let r = LoginRequest {
            transit,
            continue_: false,
            csg,
            nsg: if transit { nsg } else { 0 },
            version_max: 0,
            version_min: 0,
            isid: self.cfg.isid,
            tsih: 0,
            itt: 0,
            cid: 0,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
        };
        Pdu::new(Message::LoginRequest(r).encode(), Bytes::from(text::encode(pairs)))
    }

    /// The first Login Request.
    pub fn start(&mut self) -> Pdu {
        let mut pairs = vec![("InitiatorName".to_string(), self.cfg.initiator_name.clone())];
        match &self.cfg.target_name {
            Some(t) => {
                pairs.push(("SessionType".into(), "Normal".into()));
                pairs.push(("TargetName".into(), t.clone()));
            }
            None => pairs.push(("SessionType".into(), "Discovery".into())),
        }
        let method = if self.cfg.chap.is_some() { "CHAP,None" } else { "None" };
        pairs.push(("AuthMethod".into(), method.into()));
        self.phase = Phase::Auth;
        self.request(true, stage::SECURITY, stage::OPERATIONAL, &pairs)
    }

    fn operational(&mut self) -> Pdu {
        self.offered = offers(&self.cfg.limits, self.session_type());
        self.phase = Phase::Operational;
        let o = self.offered.clone();
        self.request(true, stage::OPERATIONAL, stage::FULL_FEATURE, &o)
    }

    /// Handle one Login Response.
    pub fn on_response(&mut self, pdu: &Pdu) -> Result<Progress, LoginError> {
        let Ok(Message::LoginResponse(r)) = Message::decode(&pdu.bhs) else {
            return Err(LoginError::Protocol(format!("expected a Login Response, got opcode {:#04x}", pdu.bhs.opcode_raw())));
        };
        let status = (r.status_class as u16) << 8 | r.status_detail as u16;
        if status != 0 {
            return Err(LoginError::Refused(status));
        }
        self.rounds += 1;
        if self.rounds > 16 {
            return Err(LoginError::Protocol("login does not converge".into()));
        }
        self.exp_stat_sn = r.stat_sn.wrapping_add(1);
        let pairs = text::parse(&pdu.data).map_err(|e| LoginError::Protocol(e.to_string()))?;
        let get = |k: &str| text::get(&pairs, k);
        match self.phase.clone() {
            Phase::Auth => {
                match get("AuthMethod") {
                    Some("CHAP") if self.cfg.chap.is_some() => {
                        self.phase = Phase::ChapAlgorithm;
                        return Ok(Progress::Send(self.request(false, stage::SECURITY, 0, &[("CHAP_A".into(), "7,5".into())])));
                    }
                    Some("None") | None => {}
                    Some(other) => return Err(LoginError::Protocol(format!("AuthMethod={other}"))),
                }
                if r.transit && r.nsg == stage::OPERATIONAL {
                    Ok(Progress::Send(self.operational()))
                } else if r.transit && r.nsg == stage::FULL_FEATURE {
                    self.done(&r)
                } else {
                    Ok(Progress::Send(self.request(true, stage::SECURITY, stage::OPERATIONAL, &[])))
                }
            }
            Phase::ChapAlgorithm => {
                let chap = self.cfg.chap.clone().ok_or_else(|| LoginError::Protocol("CHAP without credentials".into()))?;
                let alg = get("CHAP_A")
                    .and_then(crate::negotiate::parse_number)
                    .and_then(ChapAlgorithm::from_code)
                    .ok_or_else(|| LoginError::Protocol("bad CHAP_A".into()))?;
                let id = get("CHAP_I")
                    .and_then(crate::negotiate::parse_number)
                    .filter(|v| *v <= 255)
                    .ok_or_else(|| LoginError::Protocol("bad CHAP_I".into()))? as u8;
                let challenge = get("CHAP_C").and_then(chap::decode_binary).ok_or_else(|| LoginError::Protocol("bad CHAP_C".into()))?;
                let resp = chap::response(alg, id, chap.secret.as_bytes(), &challenge);
                let mut out = vec![("CHAP_N".to_string(), chap.user.clone()), ("CHAP_R".to_string(), chap::encode_hex(&resp))];
                let mut mine = (0u8, Vec::new());
                if self.cfg.mutual_chap.is_some() {
                    let my_id = self.entropy.id();
                    let my_ch = self.entropy.challenge(alg.digest_len().max(16));
                    out.push(("CHAP_I".into(), my_id.to_string()));
                    out.push(("CHAP_C".into(), chap::encode_hex(&my_ch)));
                    mine = (my_id, my_ch);
                }
                self.phase = Phase::ChapResponse { alg, id: mine.0, challenge: mine.1 };
                Ok(Progress::Send(self.request(true, stage::SECURITY, stage::OPERATIONAL, &out)))
            }
            Phase::ChapResponse { alg, id, challenge } => {
                if let Some(m) = &self.cfg.mutual_chap {
                    let (Some(n), Some(rsp)) = (get("CHAP_N"), get("CHAP_R")) else { return Err(LoginError::TargetAuth) };
                    let got = chap::decode_binary(rsp).ok_or(LoginError::TargetAuth)?;
                    let want = chap::response(alg, id, m.secret.as_bytes(), &challenge);
                    if n != m.user || !chap::verify(&want, &got) {
                        return Err(LoginError::TargetAuth);
                    }
                }
                if r.transit {
                    if r.nsg == stage::FULL_FEATURE {
                        return self.done(&r);
                    }
                    Ok(Progress::Send(self.operational()))
                } else {
                    Ok(Progress::Send(self.request(true, stage::SECURITY, stage::OPERATIONAL, &[])))
                }
            }
            Phase::Operational => {
                for (k, v) in &pairs {
                    if let Some((_, offered)) = self.offered.iter().find(|(ok, _)| ok == k) {
                        accept_answer(&mut self.params, k, offered, v).map_err(|e| LoginError::Protocol(e.to_string()))?;
                    } else if k == "MaxRecvDataSegmentLength" {
                        accept_answer(&mut self.params, k, v, v).map_err(|e| LoginError::Protocol(e.to_string()))?;
                    }
                }
                if r.transit && r.nsg == stage::FULL_FEATURE {
                    self.done(&r)
                } else {
                    self.offered.clear();
                    Ok(Progress::Send(self.request(true, stage::OPERATIONAL, stage::FULL_FEATURE, &[])))
                }
            }
        }
    }

    fn done(&self, r: &crate::msg::LoginResponse) -> Result<Progress, LoginError> {
        if self.session_type() == SessionType::Normal && r.tsih == 0 {
            return Err(LoginError::Protocol("target gave no TSIH".into()));
        }
        Ok(Progress::Done(LoginDone {
            params: self.params.clone(),
            tsih: r.tsih,
            cmd_sn: self.cmd_sn,
            max_cmd_sn: r.max_cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target_login::{LoginConfig, LoginStep, TargetInfo, TargetLogin};
    use crate::chap::ChapEntropy;
    use crate::msg::login_status;

    fn target(chap: Option<Secret>, mutual: Option<Secret>, acl: Vec<String>) -> LoginConfig {
        LoginConfig {
            targets: vec![TargetInfo {
                name: "iqn.2026-11.org.test:t".into(),
                alias: None,
                portal_group_tag: 7,
                allowed_initiators: acl,
                chap,
                mutual_chap: mutual,
            }],
            limits: LocalLimits::default(),
            queue_depth: 32,
            discovery_chap: None,
            discovery_mutual_chap: None,
        }
    }

    fn initiator(chap: Option<Secret>, mutual: Option<Secret>, target: Option<&str>) -> InitiatorLogin {
        InitiatorLogin::new(InitiatorConfig {
            initiator_name: "iqn.2026-11.org.test:i".into(),
            target_name: target.map(String::from),
            chap,
            mutual_chap: mutual,
            limits: LocalLimits { header_digests: vec![crate::negotiate::Digest::Crc32c], ..LocalLimits::default() },
            isid: [0x80, 0, 0, 0, 0, 1],
        }, ChapEntropy(core::array::from_fn(|i| 0xA0 ^ i as u8)))
    }

    /// Blockwire's initiator as it logs in (its own limits, no CHAP).
    fn ours() -> InitiatorLogin {
        let cfg = InitiatorConfig {
            initiator_name: "iqn.2026-11.org.test:i".into(),
            target_name: Some("iqn.2026-11.org.test:t".into()),
            chap: None,
            mutual_chap: None,
            limits: LocalLimits::initiator(false, false),
            isid: [0x80, 0, 0, 0, 0, 3],
        };
        InitiatorLogin::new(cfg, ChapEntropy([7; 33]))
    }

    /// Run both engines against each other; Ok(params) or the failing status.
    fn run(t: &LoginConfig, i: InitiatorLogin) -> Result<(LoginDone, Vec<String>), String> {
        run_with(&mut target_login(t), i)
    }

    fn target_login(t: &LoginConfig) -> TargetLogin<'_> {
        TargetLogin::new(t, 9, ChapEntropy(core::array::from_fn(|i| i as u8)))
    }

    fn run_with(tl: &mut TargetLogin, mut i: InitiatorLogin) -> Result<(LoginDone, Vec<String>), String> {
        let mut req = i.start();
        let mut seen = Vec::new();
        loop {
            // Every PDU survives a trip through the codec.
            let wire = req.encode(Default::default());
            let req2 = crate::pdu::Decoder::new(65536).decode(&mut bytes::BytesMut::from(&wire[..])).unwrap().unwrap();
            let (resp, step) = tl.step(&req2);
            seen.push(String::from_utf8_lossy(&resp.data).into_owned());
            if let LoginStep::Failed(s) = step {
                return Err(format!("{s:#06x}"));
            }
            match i.on_response(&resp).map_err(|e| e.to_string())? {
                Progress::Send(p) => req = p,
                Progress::Done(d) => {
                    assert_eq!(step, LoginStep::Complete);
                    return Ok((d, seen));
                }
            }
        }
    }

    fn s(u: &str, p: &str) -> Option<Secret> {
        Some(Secret::new(u, p))
    }

    /// The deadline is the whole login's: it fires while the login is
    /// unfinished and is gone once it completed.
    #[test]
    fn the_login_deadline_holds_until_the_login_completes() {
        use crate::target_login::LoginTimedOut;
        use std::time::{Duration, Instant};
        let t = target(None, None, vec![]);
        let t0 = Instant::now();
        let deadline = t0 + Duration::from_secs(10);
        let mut tl = target_login(&t).with_deadline(deadline);
        assert_eq!(tl.poll_timeout(), Some(deadline));
        assert_eq!(tl.handle_timeout(t0), Ok(()));
        assert_eq!(tl.handle_timeout(deadline), Err(LoginTimedOut));
        run_with(&mut tl, initiator(None, None, Some("iqn.2026-11.org.test:t"))).unwrap();
        assert_eq!(tl.poll_timeout(), None);
        assert_eq!(tl.handle_timeout(deadline + Duration::from_secs(1)), Ok(()));
        assert_eq!(target_login(&t).poll_timeout(), None, "no deadline unless given one");
    }

    /// Writes need no R2T round trip with our target: ImmediateData=Yes,
    /// InitialR2T=No and a first burst of at least 4 KiB come out of what
    /// blockwire's initiator offers, and of what open-iscsi (iscsid.conf's
    /// defaults) and libiscsi offer. (The kernel VM test checks
    /// open-iscsi's own view of it, iscsiadm -m session -P 2.)
    #[test]
    fn writes_need_no_r2t_with_the_initiators_people_run() {
        let t = target(None, None, vec![]);
        let (d, _) = run(&t, ours()).unwrap();
        let no_r2t = |p: &SessionParams| p.immediate_data && !p.initial_r2t && p.first_burst_length >= 4096;
        assert!(no_r2t(&d.params), "blockwire's initiator: {:?}", d.params);
        let common = [("HeaderDigest", "None"), ("DataDigest", "None"), ("InitialR2T", "No"), ("ImmediateData", "Yes"), ("MaxRecvDataSegmentLength", "262144"), ("FirstBurstLength", "262144"), ("MaxOutstandingR2T", "1"), ("ErrorRecoveryLevel", "0")];
        for (who, max_burst) in [("open-iscsi", "16776192"), ("libiscsi", "262144")] {
            let mut keys = vec![("InitiatorName", "iqn.2026-11.org.test:i"), ("TargetName", "iqn.2026-11.org.test:t"), ("SessionType", "Normal"), ("MaxBurstLength", max_burst)];
            keys.extend(common);
            let req = LoginRequest { transit: true, csg: 1, nsg: 3, isid: [0x80, 0, 0, 0, 0, 2], ..Default::default() };
            let pdu = Pdu::new(Message::LoginRequest(req).encode(), bytes::Bytes::from(crate::text::encode(&keys)));
            let mut tl = target_login(&t);
            let (_, step) = tl.step(&pdu);
            assert_eq!(step, LoginStep::Complete, "{who}");
            let p = &tl.result().expect("logged in").params;
            assert!(no_r2t(p), "{who}: {p:?}");
        }
        // A target that insists on R2T (InitialR2T=Yes) is followed.
        let mut strict = target(None, None, vec![]);
        strict.limits.initial_r2t = true;
        assert!(run(&strict, ours()).unwrap().0.params.initial_r2t);
    }

    /// A 1 MiB read is one Data-In between our initiator and our target:
    /// the initiator declares MaxRecvDataSegmentLength 1 MiB and the target's
    /// MaxBurstLength allows it (four 256 KiB Data-Ins before). A target
    /// that answers a smaller MaxBurstLength is followed.
    #[test]
    fn one_data_in_per_1m_read_with_our_target() {
        let t = target(None, None, vec![]);
        let mut tl = target_login(&t);
        let (d, _) = run_with(&mut tl, ours()).unwrap();
        assert_eq!(d.params.max_recv_data_segment_length, 1 << 20, "what our decoder takes");
        let p = &tl.result().expect("logged in").params;
        assert_eq!((p.max_send_data_segment_length, p.max_burst_length), (1 << 20, 1 << 20), "{p:?}");
        let mut small = target(None, None, vec![]);
        small.limits.max_burst_length = 262144;
        assert_eq!(run(&small, ours()).unwrap().0.params.max_burst_length, 262144);
    }

    #[test]
    fn plain_login_negotiates() {
        let (d, seen) = run(&target(None, None, vec![]), initiator(None, None, Some("iqn.2026-11.org.test:t"))).unwrap();
        assert_eq!(d.tsih, 9);
        assert!(d.params.header_digest);
        assert_eq!(d.params.max_send_data_segment_length, 262144);
        assert!(seen[0].contains("TargetPortalGroupTag=7"));
    }

    #[test]
    fn chap_and_mutual_chap() {
        let t = target(s("bob", "secret-one-12"), s("tgt", "secret-two-34"), vec![]);
        run(&t, initiator(s("bob", "secret-one-12"), None, Some("iqn.2026-11.org.test:t"))).unwrap();
        run(&t, initiator(s("bob", "secret-one-12"), s("tgt", "secret-two-34"), Some("iqn.2026-11.org.test:t"))).unwrap();
        // Wrong secret: authentication failure (0x0201).
        let e = run(&t, initiator(s("bob", "wrong"), None, Some("iqn.2026-11.org.test:t"))).unwrap_err();
        assert_eq!(e, format!("{:#06x}", login_status::AUTHENTICATION_FAILURE));
        // No credentials at all: also 0x0201.
        let e = run(&t, initiator(None, None, Some("iqn.2026-11.org.test:t"))).unwrap_err();
        assert_eq!(e, "0x0201");
        // Target answers mutual CHAP with the wrong secret: the initiator notices.
        let bad = target(s("bob", "secret-one-12"), s("tgt", "other"), vec![]);
        let e = run(&bad, initiator(s("bob", "secret-one-12"), s("tgt", "secret-two-34"), Some("iqn.2026-11.org.test:t"))).unwrap_err();
        assert!(e.contains("mutual"), "{e}");
    }

    #[test]
    fn discovery_chap_uses_the_portal_secrets() {
        let mut t = target(s("bob", "secret-one-12"), None, vec![]);
        // Without discovery secrets, discovery needs no CHAP even when the target does.
        run(&t, initiator(None, None, None)).unwrap();
        t.discovery_chap = s("disc", "discovery-1234");
        t.discovery_mutual_chap = s("portal", "portal-secret-5");
        let fail = format!("{:#06x}", login_status::AUTHENTICATION_FAILURE);
        assert_eq!(run(&t, initiator(None, None, None)).unwrap_err(), fail);
        // The target's secret is not the portal's.
        assert_eq!(run(&t, initiator(s("bob", "secret-one-12"), None, None)).unwrap_err(), fail);
        run(&t, initiator(s("disc", "discovery-1234"), None, None)).unwrap();
        run(&t, initiator(s("disc", "discovery-1234"), s("portal", "portal-secret-5"), None)).unwrap();
        let e = run(&t, initiator(s("disc", "discovery-1234"), s("portal", "wrong-secret-9"), None)).unwrap_err();
        assert!(e.contains("mutual"), "{e}");
        // Normal sessions still use the target's secret.
        run(&t, initiator(s("bob", "secret-one-12"), None, Some("iqn.2026-11.org.test:t"))).unwrap();
        let e = run(&t, initiator(s("disc", "discovery-1234"), None, Some("iqn.2026-11.org.test:t"))).unwrap_err();
        assert_eq!(e, fail);
    }

    #[test]
    fn refusals_have_the_right_status() {
        let t = target(None, None, vec!["iqn.2026-11.org.test:someone-else".into()]);
        assert_eq!(run(&t, initiator(None, None, Some("iqn.2026-11.org.test:t"))).unwrap_err(), "0x0202");
        assert_eq!(run(&t, initiator(None, None, Some("iqn.2026-11.org.test:nope"))).unwrap_err(), "0x0203");
        // Discovery needs no target name and is allowed.
        let (d, _) = run(&t, initiator(None, None, None)).unwrap();
        assert_eq!(d.params.max_send_data_segment_length, 262144);
    }

    /// iSCSI names are at most 223 bytes (RFC 7143 4.2.7.1): a longer
    /// InitiatorName or TargetName is refused as an initiator error (it
    /// was accepted, and the InitiatorName kept, before).
    #[test]
    fn names_longer_than_223_bytes_are_refused() {
        let t = target(None, None, vec![]);
        let named = |name: String, target: Option<&str>| {
            let mut i = initiator(None, None, target);
            i.cfg.initiator_name = name;
            i
        };
        let at_limit = format!("iqn.2026-11.org.test:{}", "i".repeat(223 - 21));
        assert_eq!(at_limit.len(), 223);
        run(&t, named(at_limit.clone(), Some("iqn.2026-11.org.test:t"))).unwrap();
        run(&t, named(at_limit.clone(), None)).unwrap();
        let e = format!("{:#06x}", login_status::INITIATOR_ERROR);
        assert_eq!(run(&t, named(format!("{at_limit}i"), Some("iqn.2026-11.org.test:t"))).unwrap_err(), e);
        assert_eq!(run(&t, named(format!("{at_limit}i"), None)).unwrap_err(), e, "discovery sessions too");
        let long_target = format!("iqn.2026-11.org.test:t{}", "t".repeat(8192));
        assert_eq!(run(&t, initiator(None, None, Some(&long_target))).unwrap_err(), e);
    }
}
