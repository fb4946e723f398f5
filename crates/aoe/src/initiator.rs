//! Initiator-side helpers: build requests into caller buffers, classify
//! replies, and estimate the retransmit timeout from round-trip times.

use crate::ata::{AtaArg, AFLAG_EXTENDED, AFLAG_WRITE};
use crate::frame::{AoeHeader, Command, HeaderFields, Mac};
use crate::mask::{self, Directive, MaskList};
use crate::query_config::{ConfigCommand, QueryConfig};
use crate::reserve_release::{self, ReserveRelease};
use crate::{need_out, pad_frame, WireError, ATA_HEADER_LEN, SECTOR};
use std::time::Duration;

/// Who a request goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addr {
    pub src: Mac,
    pub dst: Mac,
    pub shelf: u16,
    pub slot: u8,
}

impl Addr {
    fn header(&self, command: Command, tag: u32) -> HeaderFields {
        HeaderFields { dst: self.dst, src: self.src, flags: 0, error: 0, shelf: self.shelf, slot: self.slot, command, tag }
    }
}

/// Build a Query Config request; returns the padded frame length.
pub fn query_config(out: &mut [u8], to: &Addr, tag: u32, cmd: ConfigCommand, config: &[u8]) -> Result<usize, WireError> {
    to.header(Command::QueryConfig, tag).encode(out)?;
    let n = QueryConfig::request(cmd, config).encode(out)?;
    Ok(pad_frame(out, n))
}

/// One ATA request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtaRequest<'a> {
    pub command: u8,
    pub lba: u64,
    pub sectors: u8,
    pub extended: bool,
    /// Sector data for writes (`sectors * 512` bytes).
    pub write_data: Option<&'a [u8]>,
}

impl<'a> AtaRequest<'a> {
    pub fn read(lba: u64, sectors: u8) -> Self {
        AtaRequest { command: crate::ata::CMD_READ_SECTORS_EXT, lba, sectors, extended: true, write_data: None }
    }
    pub fn write(lba: u64, data: &'a [u8]) -> Self {
        AtaRequest {
            command: crate::ata::CMD_WRITE_SECTORS_EXT,
            lba,
            sectors: (data.len() / SECTOR) as u8,
            extended: true,
            write_data: Some(data),
        }
    }
    /// A command without data (IDENTIFY, FLUSH CACHE EXT, CHECK POWER MODE).
    pub fn simple(command: u8) -> Self {
        AtaRequest { command, lba: 0, sectors: if command == crate::ata::CMD_IDENTIFY_DEVICE { 1 } else { 0 }, extended: false, write_data: None }
    }
}

/// Build an ATA request; returns the padded frame length.
pub fn ata(out: &mut [u8], to: &Addr, tag: u32, req: &AtaRequest<'_>) -> Result<usize, WireError> {
    let data_len = req.write_data.map_or(0, |d| d.len());
    need_out(out, ATA_HEADER_LEN + data_len)?;
    to.header(Command::Ata, tag).encode(out)?;
    let mut aflags = 0;
    if req.extended {
        aflags |= AFLAG_EXTENDED;
    }
    if req.write_data.is_some() {
        aflags |= AFLAG_WRITE;
    }
    let arg = AtaArg {
        aflags,
        err_feature: 0,
        sector_count: req.sectors,
        cmd_status: req.command,
        lba_bytes: AtaArg::lba_bytes_for(req.lba, req.extended),
    };
    arg.encode(out)?;
    if let Some(d) = req.write_data {
        out[ATA_HEADER_LEN..ATA_HEADER_LEN + d.len()].copy_from_slice(d);
    }
    Ok(pad_frame(out, ATA_HEADER_LEN + data_len))
}

/// Build a MAC Mask List request.
pub fn mac_mask(out: &mut [u8], to: &Addr, tag: u32, mcmd: u8, directives: &[Directive]) -> Result<usize, WireError> {
    to.header(Command::MacMask, tag).encode(out)?;
    let n = mask::encode(out, mcmd, 0, directives)?;
    Ok(pad_frame(out, n))
}

/// Build a Reserve/Release request.
pub fn reserve(out: &mut [u8], to: &Addr, tag: u32, rcmd: u8, macs: &[Mac]) -> Result<usize, WireError> {
    to.header(Command::ReserveRelease, tag).encode(out)?;
    let n = reserve_release::encode(out, rcmd, macs)?;
    Ok(pad_frame(out, n))
}

/// A reply, classified. Borrowed from the received frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyBody<'a> {
    /// E flag set: the protocol error code.
    Error(u8),
    /// ATA reply: the argument (status in `cmd_status`) and any data after it.
    Ata(AtaArg, &'a [u8]),
    Config(QueryConfig<'a>),
    Mask(MaskList<'a>),
    Reserve(ReserveRelease<'a>),
    Other(u8),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply<'a> {
    pub src: Mac,
    pub shelf: u16,
    pub slot: u8,
    pub tag: u32,
    pub body: ReplyBody<'a>,
}

/// Parse a frame as a reply to us. Requests (no R flag) are an error here:
/// an initiator must ignore them.
pub fn parse_reply(frame: &[u8]) -> Result<Reply<'_>, WireError> {
    let h = AoeHeader::parse(frame)?;
    if h.version() != crate::AOE_VERSION {
        return Err(WireError::Version(h.version()));
    }
    if !h.is_response() {
        return Err(WireError::BadArg("not a response"));
    }
    let body = if h.is_error() {
        ReplyBody::Error(h.error())
    } else {
        match h.command() {
            Command::Ata => ReplyBody::Ata(AtaArg::parse(frame)?, &frame[ATA_HEADER_LEN..]),
            Command::QueryConfig => ReplyBody::Config(QueryConfig::parse(frame)?),
            Command::MacMask => ReplyBody::Mask(MaskList::parse(frame)?),
            Command::ReserveRelease => ReplyBody::Reserve(ReserveRelease::parse(frame)?),
            Command::Other(c) => ReplyBody::Other(c),
        }
    };
    Ok(Reply { src: h.src(), shelf: h.shelf(), slot: h.slot(), tag: h.tag(), body })
}

/// Retransmit timeout from measured round trips, as the Linux driver does:
/// smoothed average and mean deviation (gains 1/8 and 1/4), timeout
/// `2 * avg + 8 * dev`, starting at 250 ms. Samples come only from frames
/// that were not retransmitted (Karn's rule is the caller's job).
#[derive(Debug, Clone, Copy)]
pub struct RttEstimator {
    avg_us: f64,
    dev_us: f64,
    min: Duration,
    max: Duration,
    samples: u64,
}

pub const INITIAL_RTO: Duration = Duration::from_millis(250);

impl RttEstimator {
    /// `min` keeps a fast link from turning a backend hiccup into a storm
    /// of retransmits; `max` bounds the wait for a lost frame.
    pub fn new(min: Duration, max: Duration) -> Self {
        RttEstimator { avg_us: 0.0, dev_us: 0.0, min, max, samples: 0 }
    }

    pub fn sample(&mut self, rtt: Duration) {
        let s = rtt.as_secs_f64() * 1e6;
        if self.samples == 0 {
            self.avg_us = s;
            self.dev_us = s / 2.0;
        } else {
            let err = s - self.avg_us;
            self.avg_us += err / 8.0;
            self.dev_us += (err.abs() - self.dev_us) / 4.0;
        }
        self.samples += 1;
    }

    pub fn timeout(&self) -> Duration {
        if self.samples == 0 {
            return INITIAL_RTO.clamp(self.min, self.max);
        }
        let us = 2.0 * self.avg_us + 8.0 * self.dev_us;
        Duration::from_micros(us as u64).clamp(self.min, self.max)
    }

    pub fn average(&self) -> Duration {
        Duration::from_micros(self.avg_us as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ata::CMD_READ_SECTORS_EXT;

    const A: Addr = Addr { src: [2, 0, 0, 0, 0, 1], dst: [2, 0, 0, 0, 0, 2], shelf: 7, slot: 3 };

    #[test]
    fn read_request_bytes() {
        let mut f = [0u8; 64];
        let n = ata(&mut f, &A, 0xdeadbeef, &AtaRequest::read(0x0102_0304_0506, 2)).unwrap();
        assert_eq!(n, 60);
        assert_eq!(
            &f[..36],
            &[
                2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x88, 0xa2, 0x10, 0, 0, 7, 3, 0, 0xde, 0xad, 0xbe, 0xef, // header
                0x40, 0, 2, CMD_READ_SECTORS_EXT, 6, 5, 4, 3, 2, 1, 0, 0
            ]
        );
        assert!(f[36..60].iter().all(|b| *b == 0));
    }

    #[test]
    fn write_request_carries_data() {
        let data = [0x5Au8; 1024];
        let mut f = [0u8; 1100];
        let n = ata(&mut f, &A, 1, &AtaRequest::write(9, &data)).unwrap();
        assert_eq!(n, 36 + 1024);
        assert_eq!(&f[24..28], &[0x41, 0, 2, 0x34]);
        assert_eq!(&f[36..n], &data[..]);
        assert!(ata(&mut [0u8; 100], &A, 1, &AtaRequest::write(9, &data)).is_err());
    }

    #[test]
    fn replies_are_classified() {
        let mut f = [0u8; 64];
        let n = query_config(&mut f, &A, 5, ConfigCommand::Read, b"").unwrap();
        // Requests are not replies.
        assert!(parse_reply(&f[..n]).is_err());
        f[14] |= 0x8;
        let r = parse_reply(&f[..n]).unwrap();
        assert_eq!(r.tag, 5);
        assert!(matches!(r.body, ReplyBody::Config(_)));
        f[14] |= 0x4;
        f[15] = 6;
        assert_eq!(parse_reply(&f[..n]).unwrap().body, ReplyBody::Error(6));
        f[14] = 0x28;
        assert_eq!(parse_reply(&f[..n]), Err(WireError::Version(2)));
    }

    #[test]
    fn rtt_estimator_starts_at_250ms_and_tracks() {
        let mut r = RttEstimator::new(Duration::from_micros(1), Duration::from_secs(10));
        assert_eq!(r.timeout(), Duration::from_millis(250));
        for _ in 0..100 {
            r.sample(Duration::from_micros(100));
        }
        let t = r.timeout();
        assert!(t >= Duration::from_micros(200) && t < Duration::from_micros(300), "{t:?}");
        r.sample(Duration::from_millis(10));
        assert!(r.timeout() > Duration::from_millis(5));
        let clamped = RttEstimator::new(Duration::from_millis(20), Duration::from_millis(100));
        assert_eq!(clamped.timeout(), Duration::from_millis(100));
    }
}
