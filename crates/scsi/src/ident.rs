//! Stable identifiers derived from names (serial numbers, NAA designators).

/// 64-bit FNV-1a over the three names; stable across builds and platforms
/// (unlike `std`'s `DefaultHasher`), so a LUN keeps its identity on restart.
pub fn stable_id(volume: &str, target: &str, lun: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= *b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    eat(target.as_bytes());
    eat(&[0]);
    eat(volume.as_bytes());
    eat(&[0]);
    eat(&lun.to_be_bytes());
    h
}
