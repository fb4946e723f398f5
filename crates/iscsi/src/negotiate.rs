//! Operational parameter negotiation (RFC 7143 sections 6 and 13): each key's
//! value range and result function, the responder's answers (including
//! NotUnderstood / Irrelevant / Reject) and the originator's check of them.

/// Negotiated (or default) values for one session/connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionParams {
    pub header_digest: bool,
    pub data_digest: bool,
    pub max_connections: u32,
    pub initial_r2t: bool,
    pub immediate_data: bool,
    pub first_burst_length: u32,
    pub max_burst_length: u32,
    pub default_time2wait: u32,
    pub default_time2retain: u32,
    pub max_outstanding_r2t: u32,
    pub data_pdu_in_order: bool,
    pub data_sequence_in_order: bool,
    pub error_recovery_level: u32,
    /// Declared by this side: the largest data segment the peer may send us.
    pub max_recv_data_segment_length: u32,
    /// Declared by the peer: the largest data segment we may send it.
    pub max_send_data_segment_length: u32,
}

impl Default for SessionParams {
    /// The RFC 7143 defaults (what applies when a key is not negotiated).
    fn default() -> Self {
        SessionParams {
            header_digest: false,
            data_digest: false,
            max_connections: 1,
            initial_r2t: true,
            immediate_data: true,
            first_burst_length: 65536,
            max_burst_length: 262144,
            default_time2wait: 2,
            default_time2retain: 20,
            max_outstanding_r2t: 1,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            error_recovery_level: 0,
            max_recv_data_segment_length: 8192,
            max_send_data_segment_length: 8192,
        }
    }
}

/// What this side is willing to do; the starting point of its answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalLimits {
    /// Digests we accept, in order of preference when we offer.
    pub header_digests: Vec<Digest>,
    pub data_digests: Vec<Digest>,
    pub max_connections: u32,
    pub initial_r2t: bool,
    pub immediate_data: bool,
    pub first_burst_length: u32,
    pub max_burst_length: u32,
    pub default_time2wait: u32,
    pub default_time2retain: u32,
    pub max_outstanding_r2t: u32,
    pub error_recovery_level: u32,
    pub max_recv_data_segment_length: u32,
}

impl Default for LocalLimits {
    fn default() -> Self {
        LocalLimits {
            header_digests: vec![Digest::None, Digest::Crc32c],
            data_digests: vec![Digest::None, Digest::Crc32c],
            max_connections: 1,
            initial_r2t: false,
            immediate_data: true,
            first_burst_length: 262144,
            max_burst_length: 1 << 20,
            default_time2wait: 2,
            default_time2retain: 0,
            max_outstanding_r2t: 16,
            error_recovery_level: 0,
            max_recv_data_segment_length: 262144,
        }
    }
}

impl LocalLimits {
    /// What blockwire's initiator offers (`header`/`data`: ask for CRC32C
    /// digests, None accepted too: some targets, tgt, only do None). Writes
    /// need no R2T round trip: immediate data and an unsolicited first
    /// burst of 256 KiB, as open-iscsi and libiscsi offer. Data-In of up to
    /// 1 MiB per PDU (MaxRecvDataSegmentLength): a 1 MiB read comes as one
    /// Data-In where 256 KiB cut it into four, each a header read and a
    /// direct receive of its own on our side (see
    /// docs/notes/2026-11-27-h51o-datain.md). A target that declares less,
    /// or answers a smaller MaxBurstLength, still cuts it smaller.
    pub fn initiator(header: bool, data: bool) -> LocalLimits {
        let digests = |on: bool| if on { vec![Digest::Crc32c, Digest::None] } else { vec![Digest::None] };
        LocalLimits {
            header_digests: digests(header),
            data_digests: digests(data),
            initial_r2t: false,
            immediate_data: true,
            first_burst_length: 262144,
            max_burst_length: 16776192,
            max_recv_data_segment_length: 1 << 20,
            max_outstanding_r2t: 1,
            default_time2retain: 0,
            ..LocalLimits::default()
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Digest {
    None,
    Crc32c,
}

impl Digest {
    pub fn name(self) -> &'static str {
        match self {
            Digest::None => "None",
            Digest::Crc32c => "CRC32C",
        }
    }
    fn parse(s: &str) -> Option<Digest> {
        match s {
            "None" => Some(Digest::None),
            "CRC32C" => Some(Digest::Crc32c),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionType {
    Normal,
    Discovery,
}

/// How a key's result is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Responder picks the first value of the offered list it supports.
    List,
    Min { lo: u32, hi: u32 },
    Max { lo: u32, hi: u32 },
    /// Boolean, result = offer OR local.
    Or,
    /// Boolean, result = offer AND local.
    And,
    /// Each side states its own value; no answer needed.
    Declarative { lo: u32, hi: u32 },
}

const LEN_HI: u32 = (1 << 24) - 1;

/// The operational keys this engine negotiates, with their result rules.
pub fn rule(key: &str) -> Option<Rule> {
    Some(match key {
        "HeaderDigest" | "DataDigest" => Rule::List,
        "MaxConnections" => Rule::Min { lo: 1, hi: 65535 },
        "InitialR2T" => Rule::Or,
        "ImmediateData" => Rule::And,
        "FirstBurstLength" | "MaxBurstLength" => Rule::Min { lo: 512, hi: LEN_HI },
        "DefaultTime2Wait" => Rule::Max { lo: 0, hi: 3600 },
        "DefaultTime2Retain" => Rule::Min { lo: 0, hi: 3600 },
        "MaxOutstandingR2T" => Rule::Min { lo: 1, hi: 65535 },
        "DataPDUInOrder" | "DataSequenceInOrder" => Rule::Or,
        "ErrorRecoveryLevel" => Rule::Min { lo: 0, hi: 2 },
        "MaxRecvDataSegmentLength" => Rule::Declarative { lo: 512, hi: LEN_HI },
        _ => return None,
    })
}

/// Keys that only make sense in a Normal session.
fn irrelevant_in_discovery(key: &str) -> bool {
    matches!(
        key,
        "MaxConnections"
            | "InitialR2T"
            | "ImmediateData"
            | "FirstBurstLength"
            | "MaxBurstLength"
            | "MaxOutstandingR2T"
            | "DataPDUInOrder"
            | "DataSequenceInOrder"
    )
}

fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "Yes" => Some(true),
        "No" => Some(false),
        _ => None,
    }
}

fn yes_no(b: bool) -> String {
    if b { "Yes" } else { "No" }.to_string()
}

/// Numbers are decimal or 0x-hex (RFC 7143 section 5.1).
pub fn parse_number(v: &str) -> Option<u64> {
    if let Some(h) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        u64::from_str_radix(h, 16).ok()
    } else if !v.is_empty() && v.bytes().all(|c| c.is_ascii_digit()) && v.len() <= 20 {
        v.parse().ok()
    } else {
        None
    }
}

/// The responder's view of one negotiation (target side for login).
#[derive(Debug, Clone)]
pub struct Responder {
    pub local: LocalLimits,
    pub params: SessionParams,
    pub session_type: SessionType,
}

/// Apply a negotiated numeric/boolean/list result to `params`.
fn store(params: &mut SessionParams, key: &str, v: &str) {
    let n = || parse_number(v).unwrap_or(0) as u32;
    let b = || parse_bool(v).unwrap_or(false);
    match key {
        "HeaderDigest" => params.header_digest = v == "CRC32C",
        "DataDigest" => params.data_digest = v == "CRC32C",
        "MaxConnections" => params.max_connections = n(),
        "InitialR2T" => params.initial_r2t = b(),
        "ImmediateData" => params.immediate_data = b(),
        "FirstBurstLength" => params.first_burst_length = n(),
        "MaxBurstLength" => params.max_burst_length = n(),
        "DefaultTime2Wait" => params.default_time2wait = n(),
        "DefaultTime2Retain" => params.default_time2retain = n(),
        "MaxOutstandingR2T" => params.max_outstanding_r2t = n(),
        "DataPDUInOrder" => params.data_pdu_in_order = b(),
        "DataSequenceInOrder" => params.data_sequence_in_order = b(),
        "ErrorRecoveryLevel" => params.error_recovery_level = n(),
        _ => {}
    }
}

fn local_value(l: &LocalLimits, key: &str) -> u32 {
    match key {
        "MaxConnections" => l.max_connections,
        "FirstBurstLength" => l.first_burst_length,
        "MaxBurstLength" => l.max_burst_length,
        "DefaultTime2Wait" => l.default_time2wait,
        "DefaultTime2Retain" => l.default_time2retain,
        "MaxOutstandingR2T" => l.max_outstanding_r2t,
        "ErrorRecoveryLevel" => l.error_recovery_level,
        "InitialR2T" => l.initial_r2t as u32,
        "ImmediateData" => l.immediate_data as u32,
        // DataPDUInOrder / DataSequenceInOrder: we only do in-order (Yes).
        _ => 1,
    }
}

impl Responder {
    pub fn new(local: LocalLimits, session_type: SessionType) -> Responder {
        let params = SessionParams { max_recv_data_segment_length: local.max_recv_data_segment_length, ..Default::default() };
        Responder { local, params, session_type }
    }

    /// Answer one offered operational key. `None` means no answer is sent
    /// (declarative keys). Keys this engine does not know get NotUnderstood;
    /// callers handle login-only keys (names, AuthMethod, CHAP) first.
    pub fn answer(&mut self, key: &str, value: &str) -> Option<String> {
        match key {
            // Obsolete RFC 3720 marker keys: accepted and switched off.
            "OFMarker" | "IFMarker" => return Some("No".into()),
            "OFMarkInt" | "IFMarkInt" => return Some("Reject".into()),
            _ => {}
        }
        let Some(rule) = rule(key) else {
            return Some("NotUnderstood".into());
        };
        if self.session_type == SessionType::Discovery && irrelevant_in_discovery(key) {
            return Some("Irrelevant".into());
        }
        if key == "FirstBurstLength" && self.params.initial_r2t && !self.params.immediate_data {
            // Unsolicited data is impossible, so the key does not apply.
            return Some("Irrelevant".into());
        }
        let answer = match rule {
            Rule::List => {
                let ours = if key == "HeaderDigest" { &self.local.header_digests } else { &self.local.data_digests };
                let pick = value.split(',').filter_map(Digest::parse).find(|d| ours.contains(d));
                match pick {
                    Some(d) => d.name().to_string(),
                    None => return Some("Reject".into()),
                }
            }
            Rule::Min { lo, hi } | Rule::Max { lo, hi } => {
                let Some(n) = parse_number(value).filter(|n| *n >= lo as u64 && *n <= hi as u64) else {
                    return Some("Reject".into());
                };
                let mine = local_value(&self.local, key);
                let r = if matches!(rule, Rule::Min { .. }) { (n as u32).min(mine) } else { (n as u32).max(mine) };
                r.to_string()
            }
            Rule::Or | Rule::And => {
                let Some(b) = parse_bool(value) else { return Some("Reject".into()) };
                let mine = local_value(&self.local, key) != 0;
                yes_no(if rule == Rule::Or { b || mine } else { b && mine })
            }
            Rule::Declarative { lo, hi } => {
                // MaxRecvDataSegmentLength: the peer's receive limit bounds
                // what we send. Out-of-range values are rejected.
                match parse_number(value).filter(|n| *n >= lo as u64 && *n <= hi as u64) {
                    Some(n) => {
                        self.params.max_send_data_segment_length = n as u32;
                        return None;
                    }
                    None => return Some("Reject".into()),
                }
            }
        };
        store(&mut self.params, key, &answer);
        self.params.first_burst_length = self.params.first_burst_length.min(self.params.max_burst_length);
        Some(answer)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad answer {value:?} to key {key} (offered {offered:?})")]
pub struct AnswerError {
    pub key: String,
    pub offered: String,
    pub value: String,
}

/// The originator's offers (initiator side) built from its limits.
pub fn offers(local: &LocalLimits, session_type: SessionType) -> Vec<(String, String)> {
    let list = |d: &[Digest]| d.iter().map(|d| d.name()).collect::<Vec<_>>().join(",");
    let mut v = vec![
        ("HeaderDigest".to_string(), list(&local.header_digests)),
        ("DataDigest".to_string(), list(&local.data_digests)),
        ("DefaultTime2Wait".to_string(), local.default_time2wait.to_string()),
        ("DefaultTime2Retain".to_string(), local.default_time2retain.to_string()),
        ("ErrorRecoveryLevel".to_string(), local.error_recovery_level.to_string()),
        ("MaxRecvDataSegmentLength".to_string(), local.max_recv_data_segment_length.to_string()),
    ];
    if session_type == SessionType::Normal {
        v.extend([
            ("MaxConnections".to_string(), local.max_connections.to_string()),
            ("InitialR2T".to_string(), yes_no(local.initial_r2t)),
            ("ImmediateData".to_string(), yes_no(local.immediate_data)),
            ("FirstBurstLength".to_string(), local.first_burst_length.to_string()),
            ("MaxBurstLength".to_string(), local.max_burst_length.to_string()),
            ("MaxOutstandingR2T".to_string(), local.max_outstanding_r2t.to_string()),
            ("DataPDUInOrder".to_string(), "Yes".to_string()),
            ("DataSequenceInOrder".to_string(), "Yes".to_string()),
        ]);
    }
    v
}

/// Check the responder's answer to one of our offers and record the result.
/// `Irrelevant`/`NotUnderstood` leave the default in place.
pub fn accept_answer(params: &mut SessionParams, key: &str, offered: &str, value: &str) -> Result<(), AnswerError> {
    let bad = || AnswerError { key: key.into(), offered: offered.into(), value: value.into() };
    if matches!(value, "Irrelevant" | "NotUnderstood") {
        return Ok(());
    }
    if key == "MaxRecvDataSegmentLength" {
        // Responder's own declaration.
        let n = parse_number(value).filter(|n| (512..=LEN_HI as u64).contains(n)).ok_or_else(bad)?;
        params.max_send_data_segment_length = n as u32;
        return Ok(());
    }
    let Some(rule) = rule(key) else { return Ok(()) };
    match rule {
        Rule::List => {
            if !offered.split(',').any(|o| o == value) {
                return Err(bad());
            }
        }
        Rule::Min { lo, hi } | Rule::Max { lo, hi } => {
            let n = parse_number(value).filter(|n| *n >= lo as u64 && *n <= hi as u64).ok_or_else(bad)?;
            let o = parse_number(offered).ok_or_else(bad)?;
            let ok = if matches!(rule, Rule::Min { .. }) { n <= o } else { n >= o };
            if !ok {
                return Err(bad());
            }
        }
        Rule::Or => {
            let b = parse_bool(value).ok_or_else(bad)?;
            if parse_bool(offered) == Some(true) && !b {
                return Err(bad());
            }
        }
        Rule::And => {
            let b = parse_bool(value).ok_or_else(bad)?;
            if parse_bool(offered) == Some(false) && b {
                return Err(bad());
            }
        }
        Rule::Declarative { .. } => {}
    }
    store(params, key, value);
    params.first_burst_length = params.first_burst_length.min(params.max_burst_length);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn resp() -> Responder {
        Responder::new(LocalLimits::default(), SessionType::Normal)
    }

    #[test]
    fn answers_follow_result_rules() {
        let mut r = resp();
        assert_eq!(r.answer("HeaderDigest", "CRC32C,None").as_deref(), Some("CRC32C"));
        assert!(r.params.header_digest);
        assert_eq!(r.answer("DataDigest", "None").as_deref(), Some("None"));
        assert_eq!(r.answer("DataDigest", "MD5").as_deref(), Some("Reject"));
        assert_eq!(r.answer("MaxBurstLength", "16776192").as_deref(), Some("1048576"));
        assert_eq!(r.answer("FirstBurstLength", "262144").as_deref(), Some("262144"));
        assert_eq!(r.answer("InitialR2T", "No").as_deref(), Some("No"));
        assert_eq!(r.answer("ImmediateData", "Yes").as_deref(), Some("Yes"));
        assert_eq!(r.answer("DefaultTime2Wait", "0").as_deref(), Some("2"));
        assert_eq!(r.answer("ErrorRecoveryLevel", "2").as_deref(), Some("0"));
        assert_eq!(r.answer("MaxRecvDataSegmentLength", "65536"), None);
        assert_eq!(r.params.max_send_data_segment_length, 65536);
        assert_eq!(r.answer("MaxRecvDataSegmentLength", "12"), Some("Reject".into()));
        assert_eq!(r.answer("X-com.example.Foo", "1").as_deref(), Some("NotUnderstood"));
        assert_eq!(r.answer("OFMarker", "No").as_deref(), Some("No"));
        assert_eq!(r.answer("IFMarkInt", "1~65535").as_deref(), Some("Reject"));
        assert_eq!(r.answer("MaxOutstandingR2T", "0").as_deref(), Some("Reject"));
        assert_eq!(r.answer("InitialR2T", "maybe").as_deref(), Some("Reject"));
        let mut d = Responder::new(LocalLimits::default(), SessionType::Discovery);
        assert_eq!(d.answer("InitialR2T", "Yes").as_deref(), Some("Irrelevant"));
        assert_eq!(d.answer("HeaderDigest", "None").as_deref(), Some("None"));
    }

    #[test]
    fn first_burst_irrelevant_without_unsolicited_data() {
        let mut r = resp();
        r.answer("InitialR2T", "Yes");
        r.answer("ImmediateData", "No");
        assert_eq!(r.answer("FirstBurstLength", "65536").as_deref(), Some("Irrelevant"));
    }

    fn key_and_value() -> impl Strategy<Value = (String, String)> {
        let keys = prop::sample::select(vec![
            "MaxConnections",
            "InitialR2T",
            "ImmediateData",
            "FirstBurstLength",
            "MaxBurstLength",
            "DefaultTime2Wait",
            "DefaultTime2Retain",
            "MaxOutstandingR2T",
            "DataPDUInOrder",
            "DataSequenceInOrder",
            "ErrorRecoveryLevel",
            "HeaderDigest",
            "DataDigest",
        ]);
        let values = prop_oneof![
            (0u64..(1 << 25)).prop_map(|n| n.to_string()),
            Just("Yes".to_string()),
            Just("No".to_string()),
            Just("CRC32C,None".to_string()),
            Just("None".to_string()),
            "[a-zA-Z0-9,]{0,12}",
        ];
        (keys.prop_map(String::from), values)
    }

    proptest! {
        /// Whatever is offered, the responder's answer is either a refusal
        /// or a value the originator accepts, and both sides then agree.
        #[test]
        fn both_sides_agree(offers in prop::collection::vec(key_and_value(), 0..20)) {
            let mut r = resp();
            let mut originator = SessionParams::default();
            for (k, v) in &offers {
                let a = r.answer(k, v).unwrap();
                if a == "Reject" { continue; }
                accept_answer(&mut originator, k, v, &a).unwrap();
            }
            let mut target = r.params.clone();
            target.max_recv_data_segment_length = originator.max_recv_data_segment_length;
            target.max_send_data_segment_length = originator.max_send_data_segment_length;
            prop_assert_eq!(target, originator);
        }

        /// Numeric results stay within both sides' limits and the key's range.
        #[test]
        fn min_max_results_are_bounded(n in 0u64..(1 << 25)) {
            let mut r = resp();
            for key in ["MaxBurstLength", "FirstBurstLength", "MaxOutstandingR2T", "DefaultTime2Retain", "DefaultTime2Wait"] {
                let a = r.answer(key, &n.to_string()).unwrap();
                let (Rule::Min { lo, hi } | Rule::Max { lo, hi }) = rule(key).unwrap() else { unreachable!() };
                if n < lo as u64 || n > hi as u64 {
                    prop_assert_eq!(a, "Reject");
                } else {
                    let v: u64 = a.parse().unwrap();
                    let mine = local_value(&LocalLimits::default(), key) as u64;
                    if matches!(rule(key), Some(Rule::Min { .. })) {
                        prop_assert_eq!(v, n.min(mine));
                    } else {
                        prop_assert_eq!(v, n.max(mine));
                    }
                }
            }
            prop_assert!(r.params.first_burst_length <= r.params.max_burst_length);
        }

        /// Boolean results: OR can only turn No into Yes, AND only Yes into No.
        #[test]
        fn boolean_rules(offer in any::<bool>(), local in any::<bool>()) {
            let l = LocalLimits { initial_r2t: local, immediate_data: local, ..LocalLimits::default() };
            let mut r = Responder::new(l, SessionType::Normal);
            let o = if offer { "Yes" } else { "No" };
            prop_assert_eq!(r.answer("InitialR2T", o).unwrap(), yes_no(offer || local));
            prop_assert_eq!(r.answer("ImmediateData", o).unwrap(), yes_no(offer && local));
        }
    }
}
