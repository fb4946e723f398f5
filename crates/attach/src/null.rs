//! `null://SIZE`: a volume that answers every request at once, with no
//! network and no storage (the FUSE counterpart of Linux's null_blk). An
//! attach on it measures what the FUSE + loop chain and the serving loop
//! cost by themselves: bench/attach-overhead runs fio on it beside the raw
//! initiator, which bounds what any real attach can reach on the machine.
//!
//! Reads leave the request buffer as it is (like null_blk without
//! memory_backed: the data is undefined), writes are dropped.

use async_trait::async_trait;
use bw_initiator::{BlockClient, ClientError, Result};

pub const SCHEME: &str = "null://";

pub struct NullClient {
    size: u64,
}

impl NullClient {
    /// `null://SIZE`, SIZE in bytes or with a K, M, G or T suffix (powers of 1024).
    pub fn parse(url: &str) -> Result<NullClient> {
        let bad = |why: &str| {
            ClientError::Protocol(format!("{url}: {why} (null://SIZE, e.g. null://1G)"))
        };
        let spec = url
            .strip_prefix(SCHEME)
            .ok_or_else(|| bad("not a null:// URL"))?;
        let (digits, shift) = match spec.char_indices().last() {
            Some((i, 'K' | 'k')) => (&spec[..i], 10),
            Some((i, 'M' | 'm')) => (&spec[..i], 20),
            Some((i, 'G' | 'g')) => (&spec[..i], 30),
            Some((i, 'T' | 't')) => (&spec[..i], 40),
            _ => (spec, 0),
        };
        let n: u64 = digits.parse().map_err(|_| bad("size is not a number"))?;
        let size = n
            .checked_mul(1 << shift)
            .filter(|s| *s > 0 && s % 512 == 0)
            .ok_or_else(|| bad("size must be a non-zero multiple of 512 bytes"))?;
        Ok(NullClient { size })
    }
}

#[async_trait]
impl BlockClient for NullClient {
    fn describe(&self) -> String {
        format!("null volume of {} bytes", self.size)
    }
    fn size_bytes(&self) -> u64 {
        self.size
    }
    async fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        bw_initiator::check_range(self, offset, buf.len())
    }
    async fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        bw_initiator::check_range(self, offset, data.len())
    }
    async fn flush(&self) -> Result<()> {
        Ok(())
    }
    async fn discard(&self, _offset: u64, _len: u64) -> Result<()> {
        Ok(())
    }
    async fn close(&self) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_suffixes() {
        assert_eq!(NullClient::parse("null://1G").unwrap().size, 1 << 30);
        assert_eq!(NullClient::parse("null://256M").unwrap().size, 256 << 20);
        assert_eq!(NullClient::parse("null://4096").unwrap().size, 4096);
        for bad in [
            "null://",
            "null://0",
            "null://100",
            "null://xM",
            "iscsi://1G",
            "null://99999999999T",
        ] {
            assert!(NullClient::parse(bad).is_err(), "{bad} was accepted");
        }
    }

    #[tokio::test]
    async fn requests_outside_the_volume_are_refused() {
        let c = NullClient::parse("null://1M").unwrap();
        assert!(c.read(0, &mut [0u8; 4096]).await.is_ok());
        assert!(c.write((1 << 20) - 512, &[0u8; 512]).await.is_ok());
        assert!(c.read(1 << 20, &mut [0u8; 512]).await.is_err());
        assert!(c.write(1, &[0u8; 512]).await.is_err());
    }
}
