//! CRC32C (Castagnoli), the iSCSI and NVMe/TCP header and data digests, in
//! one place, so one switch picks how it is computed for the whole process:
//! the CPU's CRC instruction (the `crc32c` crate, which falls back to its own
//! tables on a CPU without one) or [`Impl::Soft`], portable slicing-by-8
//! tables even where the instruction exists. The soft path stands for a CPU
//! or NIC without CRC help (the lab's `--digest crc32c-soft`; serve's
//! `[tuning] digest_impl = "soft"`); both give the same digests.

use std::sync::atomic::{AtomicBool, Ordering};

/// How digests are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Impl {
    /// The CPU's CRC32C instruction where it has one (SSE4.2, ARMv8 CRC).
    #[default]
    Hardware,
    /// Table-driven code only (slicing-by-8).
    Soft,
}

impl Impl {
    pub fn name(self) -> &'static str {
        match self {
            Impl::Hardware => "hw",
            Impl::Soft => "soft",
        }
    }
}

impl std::str::FromStr for Impl {
    type Err = String;
    fn from_str(s: &str) -> Result<Impl, String> {
        match s {
            "hw" | "hardware" => Ok(Impl::Hardware),
            "soft" | "software" => Ok(Impl::Soft),
            _ => Err(format!("{s:?}: expected hw or soft")),
        }
    }
}

static SOFT: AtomicBool = AtomicBool::new(false);

/// Choose the implementation for every digest this process computes from now on.
pub fn set_impl(i: Impl) {
    SOFT.store(i == Impl::Soft, Ordering::Relaxed);
}

pub fn current_impl() -> Impl {
    if SOFT.load(Ordering::Relaxed) {
        Impl::Soft
    } else {
        Impl::Hardware
    }
}

/// CRC32C of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c_append(0, data)
}

/// CRC32C of the bytes whose CRC32C is `crc` followed by `data`.
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    if SOFT.load(Ordering::Relaxed) {
        soft_append(crc, data)
    } else {
        ::crc32c::crc32c_append(crc, data)
    }
}

/// The reflected Castagnoli polynomial.
const POLY: u32 = 0x82F6_3B78;

/// TABLES[k][b]: the CRC of byte b followed by k zero bytes.
static TABLES: [[u32; 256]; 8] = tables();

const fn tables() -> [[u32; 256]; 8] {
    let mut t = [[0u32; 256]; 8];
    let mut b = 0;
    while b < 256 {
        let mut c = b as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            k += 1;
        }
        t[0][b] = c;
        b += 1;
    }
    let mut k = 1;
    while k < 8 {
        let mut b = 0;
        while b < 256 {
            let prev = t[k - 1][b];
            t[k][b] = (prev >> 8) ^ t[0][(prev & 0xff) as usize];
            b += 1;
        }
        k += 1;
    }
    t
}

fn soft_append(crc: u32, data: &[u8]) -> u32 {
    let t = &TABLES;
    let mut c = !crc;
    let mut chunks = data.chunks_exact(8);
    for w in &mut chunks {
        let lo = u32::from_le_bytes([w[0], w[1], w[2], w[3]]) ^ c;
        let hi = u32::from_le_bytes([w[4], w[5], w[6], w[7]]);
        c = t[7][(lo & 0xff) as usize]
            ^ t[6][((lo >> 8) & 0xff) as usize]
            ^ t[5][((lo >> 16) & 0xff) as usize]
            ^ t[4][(lo >> 24) as usize]
            ^ t[3][(hi & 0xff) as usize]
            ^ t[2][((hi >> 8) & 0xff) as usize]
            ^ t[1][((hi >> 16) & 0xff) as usize]
            ^ t[0][(hi >> 24) as usize];
    }
    for &b in chunks.remainder() {
        c = (c >> 8) ^ t[0][((c ^ b as u32) & 0xff) as usize];
    }
    !c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn soft_matches_the_hardware_path_at_every_length_and_alignment() {
        // RFC 3720 B.4: 32 bytes of zeros, of ones, ascending.
        assert_eq!(soft_append(0, &[0u8; 32]), 0x8a91_36aa);
        assert_eq!(soft_append(0, &[0xffu8; 32]), 0x62a8_ab43);
        let up: Vec<u8> = (0..32).collect();
        assert_eq!(soft_append(0, &up), 0x46dd_794e);
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let buf: Vec<u8> = (0..70_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        for start in 0..16 {
            for len in (0..300).chain([511, 512, 513, 4095, 4096, 4100, 8192, 65_536]) {
                let b = &buf[start..start + len];
                assert_eq!(soft_append(0, b), ::crc32c::crc32c(b), "start {start} len {len}");
                // Appending in two pieces gives the digest of the whole.
                let (a, z) = b.split_at(len / 3);
                assert_eq!(soft_append(soft_append(0, a), z), ::crc32c::crc32c(b), "split, start {start} len {len}");
            }
        }
    }

    #[test]
    fn the_switch_picks_the_path_and_both_agree() {
        let b: Vec<u8> = (0..=255u8).cycle().take(9000).collect();
        let hw = crc32c(&b);
        set_impl(Impl::Soft);
        assert_eq!(current_impl(), Impl::Soft);
        let soft = crc32c(&b);
        set_impl(Impl::Hardware);
        assert_eq!((hw, current_impl()), (soft, Impl::Hardware));
        assert_eq!("soft".parse::<Impl>(), Ok(Impl::Soft));
        assert!("fast".parse::<Impl>().is_err());
    }
}
