//! The verify pattern: every 512-byte sector carries its own absolute byte
//! offset and the seed in its first 16 bytes, then pseudo-random bytes seeded
//! from both. A sector written to the wrong place, a stale sector and a torn
//! sector all read back differently from what is expected.

pub const SECTOR: usize = 512;

/// Fill `buf` (a multiple of 512 bytes) with the pattern for data that lives
/// at byte `offset` on the device.
pub fn fill(buf: &mut [u8], offset: u64, seed: u64) {
    for (i, sector) in buf.chunks_mut(SECTOR).enumerate() {
        let at = offset + (i * SECTOR) as u64;
        fill_sector(sector, at, seed);
    }
}

fn fill_sector(sector: &mut [u8], at: u64, seed: u64) {
    let head = at.to_le_bytes().into_iter().chain(seed.to_le_bytes());
    for (dst, b) in sector.iter_mut().zip(head) {
        *dst = b;
    }
    // xorshift64* keyed by offset and seed: cheap, and distinct per sector.
    let mut x = at ^ seed.rotate_left(32) ^ 0x9E37_79B9_7F4A_7C15;
    if x == 0 {
        x = 1;
    }
    let start = 16.min(sector.len());
    for chunk in sector[start..].chunks_mut(8) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let v = x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
}

/// Compare `buf` read from `offset` against the pattern; on mismatch return
/// the absolute byte offset of the first differing byte and the expected and
/// found bytes there.
pub fn check(buf: &[u8], offset: u64, seed: u64) -> Option<(u64, u8, u8)> {
    let mut expect = [0u8; SECTOR];
    for (i, sector) in buf.chunks(SECTOR).enumerate() {
        let at = offset + (i * SECTOR) as u64;
        fill_sector(&mut expect[..sector.len()], at, seed);
        if sector != &expect[..sector.len()] {
            let j = sector.iter().zip(expect.iter()).position(|(a, b)| a != b).unwrap_or(0);
            return Some((at + j as u64, expect[j], sector[j]));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn detects_misplaced_sector() {
        let mut a = vec![0u8; 4096];
        fill(&mut a, 8192, 7);
        assert_eq!(check(&a, 8192, 7), None);
        // The same data checked as if it lived one sector later is wrong at its first byte.
        assert!(matches!(check(&a, 8192 + 512, 7), Some((o, _, _)) if o / 512 == (8192 + 512) / 512));
        // A different seed is wrong too.
        assert!(check(&a, 8192, 8).is_some());
    }

    proptest! {
        #[test]
        fn reports_first_corrupted_byte(sectors in 1usize..16, pos in 0usize..8192, seed: u64, off in 0u64..1_000_000) {
            let off = off * 512;
            let mut a = vec![0u8; sectors * 512];
            fill(&mut a, off, seed);
            let pos = pos % a.len();
            a[pos] ^= 0x5A;
            let (bad, _, found) = check(&a, off, seed).unwrap();
            prop_assert_eq!(bad, off + pos as u64);
            prop_assert_eq!(found, a[pos]);
        }
    }
}
