//! The 512-byte ATA IDENTIFY DEVICE page: built by the target, parsed by the
//! initiator, with the fields where the Linux aoe driver reads them.
//!
//! Linux (`ataid_complete`): LBA48 if bit 10 of word 83 or word 86 is set;
//! capacity then from words 100-103 (u64 LE), else from words 60-61 (u32 LE);
//! serial words 10-19, firmware 23-26, model 27-46 (ATA strings: two
//! characters per word, the first in the high byte).

use crate::{need, WireError, SECTOR};

/// What the page describes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentifyInfo {
    pub sectors: u64,
    pub lba48: bool,
    pub serial: String,
    pub firmware: String,
    pub model: String,
    /// Volatile write cache present and enabled (FLUSH needed for durability).
    pub write_cache: bool,
    /// Largest sector count per command (word 47 low byte).
    pub max_multiple: u8,
}

const W_LBA48: u16 = 1 << 10;
const W_FLUSH: u16 = 1 << 12;
const W_FLUSH_EXT: u16 = 1 << 13;
const W_VALID: u16 = 1 << 14;
const W_WRITE_CACHE: u16 = 1 << 5;

fn put(page: &mut [u8; 512], word: usize, v: u16) {
    page[word * 2..word * 2 + 2].copy_from_slice(&v.to_le_bytes());
}

fn get(page: &[u8], word: usize) -> u16 {
    u16::from_le_bytes([page[word * 2], page[word * 2 + 1]])
}

/// Store an ATA string over `words` words: space padded, byte-swapped pairs.
fn put_string(page: &mut [u8; 512], first_word: usize, words: usize, s: &str) {
    let mut bytes = vec![b' '; words * 2];
    for (d, c) in bytes.iter_mut().zip(s.bytes().filter(|c| c.is_ascii_graphic() || *c == b' ')) {
        *d = c;
    }
    for i in 0..words {
        // High byte first character: in little-endian memory that is index+1.
        page[(first_word + i) * 2] = bytes[i * 2 + 1];
        page[(first_word + i) * 2 + 1] = bytes[i * 2];
    }
}

fn get_string(page: &[u8], first_word: usize, words: usize) -> String {
    let mut s = Vec::with_capacity(words * 2);
    for i in 0..words {
        s.push(page[(first_word + i) * 2 + 1]);
        s.push(page[(first_word + i) * 2]);
    }
    String::from_utf8_lossy(&s).trim().to_string()
}

/// Build the page for a disk of `info.sectors` 512-byte sectors.
pub fn build(info: &IdentifyInfo) -> [u8; 512] {
    let mut p = [0u8; 512];
    let sectors = info.sectors;
    // Word 0: fixed (non-removable) ATA device.
    put(&mut p, 0, 0x0040);
    // Legacy CHS geometry (16 heads, 63 sectors/track), capped as ATA says.
    let cyl = (sectors / (16 * 63)).min(16383) as u16;
    put(&mut p, 1, cyl);
    put(&mut p, 3, 16);
    put(&mut p, 6, 63);
    put_string(&mut p, 10, 10, &info.serial);
    put_string(&mut p, 23, 4, &info.firmware);
    put_string(&mut p, 27, 20, &info.model);
    put(&mut p, 47, 0x8000 | info.max_multiple as u16);
    // Word 49: LBA and DMA supported. Word 50: valid marker.
    put(&mut p, 49, 0x0300);
    put(&mut p, 50, 0x4000);
    // Word 53: words 54-58 and 64-70, 88 valid.
    put(&mut p, 53, 0x0007);
    put(&mut p, 54, cyl);
    put(&mut p, 55, 16);
    put(&mut p, 56, 63);
    let chs = (cyl as u32) * 16 * 63;
    put(&mut p, 57, chs as u16);
    put(&mut p, 58, (chs >> 16) as u16);
    // Words 60-61: LBA28 capacity, saturated when the disk needs LBA48.
    let lba28 = sectors.min(0x0FFF_FFFF) as u32;
    put(&mut p, 60, lba28 as u16);
    put(&mut p, 61, (lba28 >> 16) as u16);
    // Word 80: ATA/ATAPI-6 and earlier supported.
    put(&mut p, 80, 0x007E);
    let wc = if info.write_cache { W_WRITE_CACHE } else { 0 };
    let lba48 = if info.lba48 { W_LBA48 } else { 0 };
    // 82/85: write cache supported/enabled (+ NOP bit 14 supported).
    put(&mut p, 82, 0x4000 | W_WRITE_CACHE);
    put(&mut p, 85, 0x4000 | wc);
    // 83/86: LBA48 + FLUSH CACHE (EXT) supported/enabled.
    put(&mut p, 83, W_VALID | lba48 | W_FLUSH | W_FLUSH_EXT);
    put(&mut p, 86, lba48 | W_FLUSH | W_FLUSH_EXT);
    put(&mut p, 84, W_VALID);
    put(&mut p, 87, W_VALID);
    // Words 100-103: LBA48 capacity.
    let cap48 = if info.lba48 { sectors } else { 0 };
    for i in 0..4 {
        put(&mut p, 100 + i, (cap48 >> (16 * i)) as u16);
    }
    // Word 106: valid, one logical sector per physical sector.
    put(&mut p, 106, W_VALID);
    // Word 255: integrity word (signature 0xA5 + checksum making the byte sum 0).
    p[510] = 0xA5;
    let sum = p[..511].iter().fold(0u8, |a, b| a.wrapping_add(*b));
    p[511] = 0u8.wrapping_sub(sum);
    p
}

/// Parse a page the way the Linux driver does.
pub fn parse(page: &[u8]) -> Result<IdentifyInfo, WireError> {
    need(page, SECTOR)?;
    let lba48 = (get(page, 83) | get(page, 86)) & W_LBA48 != 0;
    let sectors = if lba48 {
        (0..4).fold(0u64, |acc, i| acc | (get(page, 100 + i) as u64) << (16 * i))
    } else {
        get(page, 60) as u64 | (get(page, 61) as u64) << 16
    };
    Ok(IdentifyInfo {
        sectors,
        lba48,
        serial: get_string(page, 10, 10),
        firmware: get_string(page, 23, 4),
        model: get_string(page, 27, 20),
        write_cache: get(page, 85) & W_WRITE_CACHE != 0,
        max_multiple: get(page, 47) as u8,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn info(sectors: u64) -> IdentifyInfo {
        IdentifyInfo {
            sectors,
            lba48: true,
            serial: "BW0001".into(),
            firmware: "0.1.0".into(),
            model: "blockwire AoE disk0".into(),
            write_cache: true,
            max_multiple: 17,
        }
    }

    #[test]
    fn fields_sit_where_linux_reads_them() {
        let p = build(&info(131072));
        // Word 83 bit 10 (LBA48) and word 86 bit 10.
        assert_eq!(p[83 * 2 + 1] & 0x04, 0x04);
        assert_eq!(p[86 * 2 + 1] & 0x04, 0x04);
        // Words 100-103 = 131072 (0x20000) little-endian.
        assert_eq!(&p[200..208], &[0x00, 0x00, 0x02, 0x00, 0, 0, 0, 0]);
        // Words 60-61 = 131072 too.
        assert_eq!(&p[120..124], &[0x00, 0x00, 0x02, 0x00]);
        // Model: "bl" stored as 'l','b' in memory.
        assert_eq!(&p[54..58], b"lbco");
        // Serial padded with spaces: "BW0001" -> "WB00 10   ...".
        assert_eq!(&p[20..26], b"WB0010");
        assert_eq!(p[26], b' ');
        // Integrity checksum.
        assert_eq!(p[510], 0xA5);
        assert_eq!(p.iter().fold(0u8, |a, b| a.wrapping_add(*b)), 0);
    }

    #[test]
    fn big_disks_saturate_lba28() {
        let p = build(&info(1 << 32));
        assert_eq!(&p[120..124], &[0xFF, 0xFF, 0xFF, 0x0F]);
        assert_eq!(parse(&p).unwrap().sectors, 1 << 32);
    }

    #[test]
    fn lba28_only_pages_use_words_60_61() {
        let mut i = info(1000);
        i.lba48 = false;
        let p = build(&i);
        let back = parse(&p).unwrap();
        assert!(!back.lba48);
        assert_eq!(back.sectors, 1000);
        assert!(parse(&p[..511]).is_err());
    }

    proptest! {
        #[test]
        fn round_trips(sectors in 1u64..(1 << 48), serial in "[A-Z0-9]{0,20}", model in "[a-zA-Z0-9 ]{0,40}", fw in "[0-9.]{0,8}", wc in any::<bool>(), mm in any::<u8>()) {
            let i = IdentifyInfo { sectors, lba48: true, serial, firmware: fw, model, write_cache: wc, max_multiple: mm };
            let back = parse(&build(&i)).unwrap();
            prop_assert_eq!(back.sectors, i.sectors);
            prop_assert_eq!(back.serial, i.serial.trim().to_string());
            prop_assert_eq!(back.model, i.model.trim().to_string());
            prop_assert_eq!(back.firmware, i.firmware.trim().to_string());
            prop_assert_eq!(back.write_cache, wc);
            prop_assert_eq!(back.max_multiple, mm);
        }
    }
}
