//! Human-friendly sizes: `512`, `4k`, `64M`, `1G`, `1GiB`, `2T` (powers of 1024).

/// Parse a size with an optional binary suffix (K, M, G, T; `B`, `iB` accepted).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let body = lower
        .strip_suffix("ib")
        .or_else(|| lower.strip_suffix('b'))
        .unwrap_or(&lower);
    let (num, mult) = match body.chars().last() {
        Some('k') => (&body[..body.len() - 1], 1u64 << 10),
        Some('m') => (&body[..body.len() - 1], 1u64 << 20),
        Some('g') => (&body[..body.len() - 1], 1u64 << 30),
        Some('t') => (&body[..body.len() - 1], 1u64 << 40),
        _ => (body, 1u64),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| format!("invalid size {t:?}: expected a number with optional K/M/G/T suffix"))?;
    n.checked_mul(mult).ok_or_else(|| format!("size {t:?} is too large"))
}

/// Format bytes with the largest exact binary suffix (`1G`, `1536K`, `100`).
pub fn format_size(bytes: u64) -> String {
    for (suffix, shift) in [("T", 40), ("G", 30), ("M", 20), ("K", 10)] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{}", bytes >> shift, suffix);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_suffixes() {
        assert_eq!(parse_size("512").unwrap(), 512);
        assert_eq!(parse_size("4k").unwrap(), 4096);
        assert_eq!(parse_size("64M").unwrap(), 64 << 20);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("2TB").unwrap(), 2 << 40);
        assert!(parse_size("x").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn formats_round_trip() {
        for v in [0u64, 1, 512, 4096, 1536 << 10, 1 << 30, 3 << 40] {
            assert_eq!(parse_size(&format_size(v)).unwrap(), v);
        }
    }
}
