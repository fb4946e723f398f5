//! Names: a CSI request's name to a blockwire volume name (the volume and
//! snapshot IDs), a volume to the NVMe subsystem and iSCSI target that
//! export it, a node's ID to its host NQN and IQN.

use sha2::{Digest, Sha256};

/// Longest CSI name taken (the specification asks plugins to take at
/// least 128 bytes; Kubernetes sends `pvc-UUID`, 40).
pub const MAX_NAME: usize = 128;
/// Longest ID given to the CO (CSI: at most 128 bytes).
pub const MAX_ID: usize = 128;

/// Whether `s` is a blockwire volume name (serve's rule: 1 to 128 of
/// A-Z a-z 0-9 . _ -, starting with a letter or digit).
pub fn is_volume_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 128 && s.bytes().all(|c| c.is_ascii_alphanumeric() || b"._-".contains(&c)) && s.as_bytes()[0].is_ascii_alphanumeric()
}

/// The volume (or snapshot) ID for a CSI name: the name itself where it
/// is a valid volume name (Kubernetes' `pvc-UUID`, `snapshot-UUID`), else
/// `csi-` and 32 hex digits of its SHA-256. Always the same for one name:
/// that is what makes CreateVolume idempotent by name.
pub fn id_of_name(name: &str) -> String {
    if is_volume_name(name) {
        name.into()
    } else {
        format!("csi-{}", &hex::encode(Sha256::digest(name.as_bytes()))[..32])
    }
}

/// A name as the lower-case letters, digits, `.` and `-` that IQNs and
/// NQNs are made of, with 8 hex digits of its hash where that changed it
/// (so `A` and `a` do not meet).
fn name_part(id: &str) -> String {
    let lower: String = id.chars().map(|c| match c { 'A'..='Z' => c.to_ascii_lowercase(), '_' => '-', c => c }).collect();
    if lower == id {
        lower
    } else {
        format!("{lower}-{}", &hex::encode(Sha256::digest(id.as_bytes()))[..8])
    }
}

/// The NVMe subsystem exporting volume `id` alone (a subsystem per volume).
pub fn subsystem_nqn(prefix: &str, id: &str) -> String {
    format!("{prefix}:{}", name_part(id))
}

/// The one NVMe subsystem that exports every volume of a StorageClass
/// with `nvmeSubsystem: shared`, each as a namespace only the hosts it
/// is published to see.
pub fn shared_subsystem_nqn(prefix: &str) -> String {
    format!("{prefix}:shared")
}

/// The iSCSI target exporting volume `id` as LUN 0.
pub fn target_iqn(prefix: &str, id: &str) -> String {
    format!("{prefix}:{}", name_part(id))
}

/// A node's identity: the host NQN its NVMe initiator connects with and
/// the IQN its iSCSI initiator logs in with. The node ID carries both,
/// separated by one space (neither may hold one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeId {
    pub host_nqn: String,
    pub iqn: String,
}

/// Kubernetes keeps node IDs of at most 192 bytes (CSINode).
pub const MAX_NODE_ID: usize = 192;

impl NodeId {
    pub fn encode(&self) -> String {
        format!("{} {}", self.host_nqn, self.iqn)
    }

    pub fn parse(s: &str) -> Option<NodeId> {
        let (nqn, iqn) = s.split_once(' ')?;
        let ok = |x: &str, prefix: &str| x.starts_with(prefix) && x.len() <= 223 && !x.chars().any(|c| c.is_whitespace() || c.is_control());
        (ok(nqn, "nqn.") && ok(iqn, "iqn.")).then(|| NodeId { host_nqn: nqn.into(), iqn: iqn.into() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_of_names() {
        assert_eq!(id_of_name("pvc-0d5e4b7e-1c2a-4f0e-9d3c-2b4a5f6e7d8c"), "pvc-0d5e4b7e-1c2a-4f0e-9d3c-2b4a5f6e7d8c");
        let odd = id_of_name("sanity/volume with spaces");
        assert!(odd.starts_with("csi-") && odd.len() == 36 && is_volume_name(&odd));
        assert_eq!(odd, id_of_name("sanity/volume with spaces"));
        assert_ne!(id_of_name(".hidden"), ".hidden");
        assert_eq!(subsystem_nqn("nqn.2026-11.io.blockwire.csi", "pvc-1"), "nqn.2026-11.io.blockwire.csi:pvc-1");
        assert_ne!(target_iqn("iqn.x", "A"), target_iqn("iqn.x", "a"));
        assert!(target_iqn("iqn.x", "Vol_1").starts_with("iqn.x:vol-1-"));
    }

    #[test]
    fn node_ids() {
        let n = NodeId { host_nqn: "nqn.2014-08.org.nvmexpress:uuid:1".into(), iqn: "iqn.1993-08.org.debian:01:ab".into() };
        assert_eq!(NodeId::parse(&n.encode()), Some(n));
        for bad in ["", "nqn.a", "iqn.b nqn.a", "nqn.a iqn.b c", "x.a iqn.b"] {
            assert_eq!(NodeId::parse(bad), None, "{bad:?}");
        }
    }
}
