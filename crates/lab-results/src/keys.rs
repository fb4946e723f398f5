//! The typed keys records are filed under: which subject a sample measured
//! ([`SubjectKey`]) and which suite ran it ([`Suite`]). results.json holds
//! them as the names the lab always wrote (`blockwire-aoe`,
//! `kernel-iscsi@tgt`, `local-fio`, `micro`), byte for byte; readers match
//! on the variants instead of comparing text.
//!
//! Both order by their names, as the strings they replace did: the report
//! walks cases in that order, so a typed key changes no table or row.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Cow;
use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

/// Who was measured: a target through blockwire's client, a target through
/// the client host's kernel initiator, or a local baseline (no network).
///
/// The target, protocol and client parts stay names: the lab's registry
/// (`bw_lab::subjects`, `bw_lab::clients`) owns those sets, and results of
/// an older or newer lab with other peers still load.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SubjectKey {
    /// `local-fio`: fio on the backing file, the micro and sweep suites'
    /// baseline.
    LocalFio,
    /// `local-fs`: ext4 on a loop device over the backing file, the fs
    /// suite's baseline.
    LocalFs,
    /// `TARGET-PROTOCOL` (`tgt-iscsi`, `blockwire-nvme-rdma`): blockwire's
    /// client against a target.
    Served { target: Cow<'static, str>, protocol: Cow<'static, str> },
    /// `kernel-CLIENT@TARGET` (`kernel-iscsi@tgt`, `kernel-nfs3@ganesha`):
    /// the client host's kernel initiator or NFS mount.
    Kernel { client: Cow<'static, str>, target: Cow<'static, str> },
}

impl SubjectKey {
    /// `TARGET-PROTOCOL`, usable in constants.
    pub const fn served(target: &'static str, protocol: &'static str) -> SubjectKey {
        SubjectKey::Served { target: Cow::Borrowed(target), protocol: Cow::Borrowed(protocol) }
    }

    /// `kernel-CLIENT@TARGET`, usable in constants.
    pub const fn kernel(client: &'static str, target: &'static str) -> SubjectKey {
        SubjectKey::Kernel { client: Cow::Borrowed(client), target: Cow::Borrowed(target) }
    }

    /// Its name in results.json and the report.
    pub fn name(&self) -> Cow<'static, str> {
        match self {
            SubjectKey::LocalFio => Cow::Borrowed("local-fio"),
            SubjectKey::LocalFs => Cow::Borrowed("local-fs"),
            SubjectKey::Served { target, protocol } => Cow::Owned(format!("{target}-{protocol}")),
            SubjectKey::Kernel { client, target } => Cow::Owned(format!("kernel-{client}@{target}")),
        }
    }

    /// A local baseline: no network, no target process.
    pub fn is_local(&self) -> bool {
        matches!(self, SubjectKey::LocalFio | SubjectKey::LocalFs)
    }

    /// Measured through the client host's kernel (initiator or NFS mount).
    pub fn is_kernel(&self) -> bool {
        matches!(self, SubjectKey::Kernel { .. })
    }
}

impl FromStr for SubjectKey {
    type Err = String;

    fn from_str(s: &str) -> Result<SubjectKey, String> {
        let owned = |x: &str| Cow::Owned(x.to_string());
        let part = |x: &str| !x.is_empty();
        match s {
            "local-fio" => return Ok(SubjectKey::LocalFio),
            "local-fs" => return Ok(SubjectKey::LocalFs),
            _ => {}
        }
        let kernel = s.strip_prefix("kernel-").and_then(|k| k.split_once('@'));
        match (kernel, s.split_once('-')) {
            (Some((client, target)), _) if part(client) && part(target) => Ok(SubjectKey::Kernel { client: owned(client), target: owned(target) }),
            (None, Some((target, protocol))) if part(target) && part(protocol) => {
                Ok(SubjectKey::Served { target: owned(target), protocol: owned(protocol) })
            }
            _ => Err(format!("{s:?} is not a subject key (TARGET-PROTOCOL, kernel-CLIENT@TARGET, local-fio or local-fs)")),
        }
    }
}

impl fmt::Display for SubjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `pad`: the terminal rows align subjects with `{:<16}`.
        f.pad(&self.name())
    }
}

impl SubjectKey {
    /// The variant's place, to order keys that print alike but differ
    /// (`served("local", "fio")` is no `LocalFio`): Ord agrees with Eq.
    fn rank(&self) -> u8 {
        match self {
            SubjectKey::LocalFio => 0,
            SubjectKey::LocalFs => 1,
            SubjectKey::Served { .. } => 2,
            SubjectKey::Kernel { .. } => 3,
        }
    }
}

impl Ord for SubjectKey {
    fn cmp(&self, other: &SubjectKey) -> Ordering {
        self.name().cmp(&other.name()).then_with(|| self.rank().cmp(&other.rank()))
    }
}

impl PartialOrd for SubjectKey {
    fn partial_cmp(&self, other: &SubjectKey) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Serialize for SubjectKey {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.name())
    }
}

impl<'de> Deserialize<'de> for SubjectKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<SubjectKey, D::Error> {
        let s = Cow::<'de, str>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The suite a micro-style sample (`Sample`) belongs to: the fixed
/// workloads or the numjobs x iodepth sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Suite {
    Micro,
    Sweep,
}

impl Suite {
    /// Its name in results.json, `--suite` and the report.
    pub fn name(self) -> &'static str {
        match self {
            Suite::Micro => "micro",
            Suite::Sweep => "sweep",
        }
    }
}

impl fmt::Display for Suite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

impl Ord for Suite {
    fn cmp(&self, other: &Suite) -> Ordering {
        self.name().cmp(other.name())
    }
}

impl PartialOrd for Suite {
    fn partial_cmp(&self, other: &Suite) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// What a [`crate::Failure`] is of: a subject, or the net suite's iperf3
/// runs (which measure the links, no subject). results.json holds the
/// subject's name or `iperf3`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum FailureSubject {
    Subject(SubjectKey),
    Iperf3,
}

impl FailureSubject {
    pub fn name(&self) -> Cow<'static, str> {
        match self {
            FailureSubject::Subject(k) => k.name(),
            FailureSubject::Iperf3 => Cow::Borrowed("iperf3"),
        }
    }
}

impl From<SubjectKey> for FailureSubject {
    fn from(k: SubjectKey) -> FailureSubject {
        FailureSubject::Subject(k)
    }
}

impl FromStr for FailureSubject {
    type Err = String;

    fn from_str(s: &str) -> Result<FailureSubject, String> {
        match s {
            "iperf3" => Ok(FailureSubject::Iperf3),
            _ => s.parse().map(FailureSubject::Subject),
        }
    }
}

impl fmt::Display for FailureSubject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl Serialize for FailureSubject {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.name())
    }
}

impl<'de> Deserialize<'de> for FailureSubject {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<FailureSubject, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A link shape's name, as the user gave it to `--link` (`none`, `1gbit`,
/// `100mbit`): the key samples of one shape are filed under. The shapes
/// are the user's, so this is the name and not a list of variants; what a
/// name means (its rate) is [`crate::net::parse_link`]'s. `none`, the
/// unshaped veth, is the default, and what results older than link shapes
/// are read as. results.json holds the name as it was, byte for byte; it
/// orders and prints (padding included) as the name did.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LinkName(String);

impl LinkName {
    /// `none`: the unshaped veth.
    pub const NONE: &'static str = "none";

    pub fn new(name: impl Into<String>) -> LinkName {
        LinkName(name.into())
    }

    /// The unshaped link, `none`.
    pub fn none() -> LinkName {
        LinkName::new(LinkName::NONE)
    }

    pub fn is_none(&self) -> bool {
        self.0 == LinkName::NONE
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&str> for LinkName {
    fn from(name: &str) -> LinkName {
        LinkName::new(name)
    }
}

impl From<String> for LinkName {
    fn from(name: String) -> LinkName {
        LinkName(name)
    }
}

impl Default for LinkName {
    fn default() -> LinkName {
        LinkName::none()
    }
}

impl fmt::Display for LinkName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&self.0)
    }
}

/// One value set of the offload study's factors ([`crate::Factors`]):
/// results.json holds a value as its name, and the lab's default as the
/// empty text (left out of the record), byte for byte as the strings they
/// replace. Ordered by name, as those strings were.
macro_rules! factor {
    ($(#[$doc:meta])* $ty:ident, $flag:literal, { $default:ident, $($(#[$vdoc:meta])* $v:ident = $name:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
        pub enum $ty {
            /// The lab's default (recorded as the empty text).
            #[default]
            $default,
            $($(#[$vdoc])* $v),+
        }

        impl $ty {
            pub const ALL: &'static [$ty] = &[$ty::$default, $($ty::$v),+];

            /// Its name in results.json (empty at the default).
            pub fn name(self) -> &'static str {
                match self {
                    $ty::$default => "",
                    $($ty::$v => $name),+
                }
            }

            pub fn is_default(&self) -> bool {
                *self == $ty::$default
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }

        impl FromStr for $ty {
            type Err = String;

            fn from_str(s: &str) -> Result<$ty, String> {
                $ty::ALL.iter().copied().find(|v| v.name() == s).ok_or_else(|| format!("{} {s:?}: not one of {:?}", $flag, $ty::ALL.iter().map(|v| v.name()).collect::<Vec<_>>()))
            }
        }

        impl Ord for $ty {
            fn cmp(&self, other: &$ty) -> Ordering {
                self.name().cmp(other.name())
            }
        }

        impl PartialOrd for $ty {
            fn partial_cmp(&self, other: &$ty) -> Option<Ordering> {
                Some(self.cmp(other))
            }
        }

        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.name())
            }
        }

        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<$ty, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

factor!(
    /// NIC offloads on the lab's links (`--offload`); the default:
    /// segmentation offloads off, GRO and checksums on.
    OffloadFactor, "offload", { Default,
    /// Every offload off.
    None = "none",
    /// Every stateless offload on (checksums, segmentation, GRO).
    Stateless = "stateless",
});

factor!(
    /// iSCSI and NVMe/TCP digests (`--digest`); the default: none.
    DigestFactor, "digest", { Off,
    /// CRC32C with the CPU's instruction.
    Crc32c = "crc32c",
    /// CRC32C in software (what a CPU without CRC help pays).
    Crc32cSoft = "crc32c-soft",
});

factor!(
    /// NVMe/TCP over TLS 1.3 (`--tls`); the default: plaintext.
    TlsFactor, "tls", { Off,
    On = "on",
});

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key the lab writes reads back as its kind and prints as it
    /// was; keys order as their names did.
    #[test]
    fn factors_round_trip_as_their_names_and_order_by_them() {
        for (v, json) in [(OffloadFactor::Default, "\"\""), (OffloadFactor::None, "\"none\""), (OffloadFactor::Stateless, "\"stateless\"")] {
            assert_eq!(serde_json::to_string(&v).unwrap(), json);
            assert_eq!(serde_json::from_str::<OffloadFactor>(json).unwrap(), v);
        }
        assert_eq!(serde_json::to_string(&DigestFactor::Crc32cSoft).unwrap(), "\"crc32c-soft\"");
        assert_eq!(serde_json::from_str::<TlsFactor>("\"on\"").unwrap(), TlsFactor::On);
        assert!(serde_json::from_str::<DigestFactor>("\"crc64\"").is_err());
        let mut d = DigestFactor::ALL.to_vec();
        d.sort();
        assert_eq!(d.iter().map(|v| v.name()).collect::<Vec<_>>(), ["", "crc32c", "crc32c-soft"]);
    }

    #[test]
    fn link_names_are_their_names() {
        for name in ["none", "1gbit", "100mbit"] {
            let json = format!("\"{name}\"");
            let l: LinkName = serde_json::from_str(&json).unwrap();
            assert_eq!(l, LinkName::new(name));
            assert_eq!(serde_json::to_string(&l).unwrap(), json);
            assert_eq!(l.to_string(), name);
        }
        assert!(LinkName::default().is_none() && !LinkName::new("1gbit").is_none());
        assert_eq!(format!("{:>6}|", LinkName::new("1gbit")), " 1gbit|");
        let mut v = [LinkName::new("none"), LinkName::new("10gbit"), LinkName::new("1gbit")];
        v.sort();
        assert_eq!(v.iter().map(|l| l.as_str()).collect::<Vec<_>>(), ["10gbit", "1gbit", "none"]);
    }

    #[test]
    fn failure_subjects_round_trip_as_their_names() {
        for (v, json) in [(FailureSubject::Iperf3, "\"iperf3\""), (FailureSubject::Subject(SubjectKey::served("tgt", "iscsi")), "\"tgt-iscsi\""), (FailureSubject::Subject(SubjectKey::LocalFio), "\"local-fio\"")] {
            assert_eq!(serde_json::to_string(&v).unwrap(), json);
            assert_eq!(serde_json::from_str::<FailureSubject>(json).unwrap(), v);
        }
        assert!(serde_json::from_str::<FailureSubject>("\"iperf\"").is_err());
    }

    #[test]
    fn subject_keys_round_trip_and_order_by_name() {
        let kinds = [
            ("local-fio", SubjectKey::LocalFio),
            ("local-fs", SubjectKey::LocalFs),
            ("blockwire-aoe", SubjectKey::served("blockwire", "aoe")),
            ("blockwire-nvme-rdma", SubjectKey::served("blockwire", "nvme-rdma")),
            ("ganesha-nfs", SubjectKey::served("ganesha", "nfs")),
            ("kernel-iscsi@tgt", SubjectKey::kernel("iscsi", "tgt")),
            ("kernel-nvme-rdma@blockwire", SubjectKey::kernel("nvme-rdma", "blockwire")),
            ("kernel-nfs4.1@ganesha", SubjectKey::kernel("nfs4.1", "ganesha")),
        ];
        for (name, key) in &kinds {
            let parsed: SubjectKey = name.parse().unwrap();
            assert_eq!(&parsed, key, "{name}");
            assert_eq!(parsed.to_string(), *name);
            assert_eq!(serde_json::to_string(key).unwrap(), format!("\"{name}\""));
            assert_eq!(serde_json::from_str::<SubjectKey>(&format!("\"{name}\"")).unwrap(), *key);
        }
        assert!(SubjectKey::kernel("aoe", "vblade").is_kernel() && !SubjectKey::served("tgt", "iscsi").is_kernel());
        assert!(SubjectKey::LocalFs.is_local() && !SubjectKey::kernel("nfs3", "ganesha").is_local());
        let mut by_key: Vec<&SubjectKey> = kinds.iter().map(|(_, k)| k).collect();
        let mut by_name: Vec<&str> = kinds.iter().map(|(n, _)| *n).collect();
        by_key.sort();
        by_name.sort();
        assert_eq!(by_key.iter().map(|k| k.to_string()).collect::<Vec<_>>(), by_name);
        assert_eq!(format!("{:<12}|", SubjectKey::served("tgt", "iscsi")), "tgt-iscsi   |");
        for bad in ["", "iperf3", "-aoe", "tgt-", "kernel-@tgt"] {
            let e = serde_json::from_str::<SubjectKey>(&format!("\"{bad}\"")).unwrap_err().to_string();
            assert!(e.contains("is not a subject key"), "{bad}: {e}");
        }
    }

    #[test]
    fn suites_are_their_names() {
        for (name, s) in [("micro", Suite::Micro), ("sweep", Suite::Sweep)] {
            assert_eq!(serde_json::to_string(&s).unwrap(), format!("\"{name}\""));
            assert_eq!(serde_json::from_str::<Suite>(&format!("\"{name}\"")).unwrap(), s);
            assert_eq!(s.to_string(), name);
        }
        assert!(Suite::Micro < Suite::Sweep);
        assert!(serde_json::from_str::<Suite>("\"fs\"").is_err());
    }
}
