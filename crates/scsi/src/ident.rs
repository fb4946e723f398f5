//! Stable identifiers derived from names (serial numbers, NAA designators),
//! and the transport's id of an I_T nexus.

/// One per I_T nexus (an iSCSI session), assigned by the transport. Ids must
/// not be reused while the nexus is alive; call [`crate::ScsiTarget::nexus_gone`]
/// when it ends.
pub type NexusId = u64;

/// 64-bit FNV-1a over the three names; stable across builds and platforms
/// (unlike `std`'s `DefaultHasher`), so a LUN keeps its identity on restart.
pub fn stable_id(volume: &str, target: &str, lun: u64) -> u64 {
    fnv1a(&[target.as_bytes(), &[0], volume.as_bytes(), &[0], &lun.to_be_bytes()])
}

/// Identity of a named initiator port. The top bit is set so it never
/// equals a transport's (small, counting) `NexusId` used for unnamed ports.
pub fn port_identity(name: &str) -> u64 {
    fnv1a(&[name.to_ascii_lowercase().as_bytes()]) | 1 << 63
}

fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in *part {
            h ^= *b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}
