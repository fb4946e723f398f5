//! The target side: one [`Export`] per shelf.slot, fed a received frame and
//! a buffer, writing the reply frame (or deciding there is none).
//!
//! I/O happens inline on the caller's thread (positional reads/writes on the
//! [`Volume`]), straight between the frames and the backend: read data lands
//! in the reply buffer, write data is taken from the request frame. Many
//! worker threads may call [`Export::handle`] at once; the little mutable
//! state (config string, MAC mask list, reservations) sits behind a lock
//! that the ATA fast path only touches when a list is non-empty.

use crate::ata::*;
use crate::frame::{AoeHeader, Command, ErrorCode, HeaderFields, Mac, FLAG_ERROR, FLAG_RESPONSE};
use crate::identify::{self, IdentifyInfo};
use crate::mask::{self, Directive, DirectiveCommand, MaskList};
use crate::query_config::{ConfigCommand, QueryConfig};
use crate::reserve_release::{self, ReserveRelease};
use crate::{pad_frame, WireError, AOE_VERSION, ATA_HEADER_LEN, BROADCAST_SHELF, BROADCAST_SLOT, HEADER_LEN, SECTOR};
use bw_block::{BlockError, Durability, Volume};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::RwLock;

/// Firmware version we report in Query Config.
pub const FIRMWARE_VERSION: u16 = 0x0001;
/// Longest MAC mask list and reservation list we keep (vblade keeps 32 masks);
/// bounded so a reply always fits in a 1500-byte frame.
pub const MAX_LIST: usize = 32;
/// Longest configured allow-list: the MAC Mask List reply that reports it
/// fits the smallest reply buffer and a 1500-byte frame.
pub const MAX_ALLOW: usize = 128;
const _: () = assert!(HEADER_LEN + mask::MASK_ARG_LEN + MAX_ALLOW * mask::DIRECTIVE_LEN <= 1514);
const _: () = assert!(
    HEADER_LEN + mask::MASK_ARG_LEN + MAX_ALLOW * mask::DIRECTIVE_LEN
        <= HEADER_LEN + crate::query_config::QC_ARG_LEN + crate::MAX_CONFIG_STRING
);

/// Static settings of one export.
#[derive(Debug, Clone)]
pub struct ExportSettings {
    pub shelf: u16,
    pub slot: u8,
    /// Initial config string (at most 1024 bytes).
    pub config_string: Vec<u8>,
    /// Buffer count advertised in Query Config: how many requests the target
    /// can really hold queued.
    pub buffer_count: u16,
    /// Sectors per ATA frame, from the interface MTU.
    pub max_sectors: u8,
    /// The stations that may use this export (at most [`MAX_ALLOW`];
    /// empty: any). Set by configuration only: frames from other MACs get
    /// no reply, and MAC Mask List edits fail (merror 1) instead of changing
    /// who has access; a Mask List read reports this list. Reservations
    /// still work between the allowed stations.
    pub allow: Vec<Mac>,
    /// Execute ATA writes addressed to the broadcast shelf (0xffff) or
    /// slot (0xff), as r11 allows. Off by default: one such frame would
    /// write every export that hears it, and no initiator needs it (the
    /// Linux driver and ours broadcast only Query Config, for discovery).
    pub broadcast_writes: bool,
}

/// Why a frame got no reply (for counters and debug logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ignored {
    /// Shorter than an AoE header or not AoE.
    NotAoe,
    /// A response (R flag): not for a target.
    Response,
    /// Another shelf/slot.
    NotAddressed,
    /// MAC mask list is non-empty and the sender is not on it.
    Masked,
    /// The sender is not on the configured allow-list.
    NotAllowed,
    /// An ATA write to the broadcast shelf or slot, and those are off.
    BroadcastWrite,
    /// Query Config test/prefix did not match: the protocol says stay silent.
    ConfigMismatch,
}

/// Result of handling one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A reply of this many bytes is in the output buffer.
    Reply(usize),
    NoReply(Ignored),
}

struct Control {
    config: Vec<u8>,
    masks: Vec<Mac>,
    reservations: Vec<Mac>,
}

pub struct Export {
    settings: ExportSettings,
    volume: Volume,
    sectors: u64,
    identify: [u8; 512],
    control: RwLock<Control>,
    /// True when masks or reservations are non-empty: only then does the
    /// ATA path take the lock.
    restricted: AtomicBool,
}

/// Where a reply is headed and what it answers.
struct ReplyTo {
    fields: HeaderFields,
}

impl ReplyTo {
    fn new(req: &AoeHeader<'_>, our_mac: Mac, shelf: u16, slot: u8) -> Self {
        ReplyTo {
            fields: HeaderFields {
                dst: req.src(),
                src: our_mac,
                flags: FLAG_RESPONSE,
                error: 0,
                shelf,
                slot,
                command: req.command(),
                tag: req.tag(),
            },
        }
    }

    fn header(&self, out: &mut [u8]) -> Result<(), WireError> {
        self.fields.encode(out)
    }

    /// A protocol error reply: header with E flag and the code, then the
    /// request's argument echoed (at most `echo` bytes of it).
    fn error(&self, code: ErrorCode, req: &[u8], echo: usize, out: &mut [u8]) -> Outcome {
        let mut f = self.fields;
        f.flags |= FLAG_ERROR;
        f.error = code as u8;
        if f.encode(out).is_err() {
            return Outcome::NoReply(Ignored::NotAoe);
        }
        let n = req.len().min(HEADER_LEN + echo).min(out.len());
        out[HEADER_LEN..n].copy_from_slice(&req[HEADER_LEN..n]);
        Outcome::Reply(pad_frame(out, n))
    }
}

impl Export {
    pub fn new(settings: ExportSettings, volume: Volume) -> Self {
        let sectors = volume.sectors();
        let info = IdentifyInfo {
            sectors,
            lba48: true,
            serial: format!("BW{:05}{:03}", settings.shelf, settings.slot),
            firmware: env!("CARGO_PKG_VERSION").to_string(),
            model: format!("blockwire {}", volume.name()),
            write_cache: volume.info().durability == Durability::WriteBack,
            max_multiple: settings.max_sectors,
        };
        let mut config = settings.config_string.clone();
        config.truncate(crate::MAX_CONFIG_STRING);
        Export {
            identify: identify::build(&info),
            settings,
            volume,
            sectors,
            control: RwLock::new(Control { config, masks: Vec::new(), reservations: Vec::new() }),
            restricted: AtomicBool::new(false),
        }
    }

    pub fn shelf(&self) -> u16 {
        self.settings.shelf
    }
    pub fn slot(&self) -> u8 {
        self.settings.slot
    }
    pub fn volume(&self) -> &Volume {
        &self.volume
    }
    pub fn settings(&self) -> &ExportSettings {
        &self.settings
    }

    /// Size of the buffer [`Export::handle`] needs to write any reply.
    pub fn reply_buffer_len(&self) -> usize {
        (ATA_HEADER_LEN + self.settings.max_sectors as usize * SECTOR)
            .max(HEADER_LEN + crate::query_config::QC_ARG_LEN + crate::MAX_CONFIG_STRING)
            .max(crate::MIN_FRAME)
    }

    /// Whether the frame is an AoE request addressed to this export (its
    /// shelf.slot or a broadcast).
    pub fn addressed(&self, h: &AoeHeader<'_>) -> bool {
        (h.shelf() == self.settings.shelf || h.shelf() == BROADCAST_SHELF)
            && (h.slot() == self.settings.slot || h.slot() == BROADCAST_SLOT)
    }

    fn control(&self) -> std::sync::RwLockReadGuard<'_, Control> {
        // A poisoned lock only means a panic elsewhere mid-update of plain
        // vectors; the data is still consistent enough to serve.
        self.control.read().unwrap_or_else(|e| e.into_inner())
    }
    fn control_mut(&self) -> std::sync::RwLockWriteGuard<'_, Control> {
        self.control.write().unwrap_or_else(|e| e.into_inner())
    }
    fn update_restricted(&self, c: &Control) {
        self.restricted.store(!c.masks.is_empty() || !c.reservations.is_empty(), Ordering::Release);
    }

    /// The current config string.
    pub fn config_string(&self) -> Vec<u8> {
        self.control().config.clone()
    }

    /// Handle one received frame; `out` must hold [`Export::reply_buffer_len`] bytes.
    pub fn handle(&self, frame: &[u8], our_mac: Mac, out: &mut [u8]) -> Outcome {
        let h = match AoeHeader::parse(frame) {
            Ok(h) => h,
            Err(_) => return Outcome::NoReply(Ignored::NotAoe),
        };
        if h.is_response() {
            return Outcome::NoReply(Ignored::Response);
        }
        // Unicast frames for another station (seen in promiscuous mode or on
        // a veth) belong to another target, even with our shelf.slot.
        let dst = h.dst();
        if !self.addressed(&h) || (dst != our_mac && dst[0] & 1 == 0) {
            return Outcome::NoReply(Ignored::NotAddressed);
        }
        let src = h.src();
        let allow = &self.settings.allow;
        if !allow.is_empty() && !allow.contains(&src) {
            return Outcome::NoReply(Ignored::NotAllowed);
        }
        let restricted = self.restricted.load(Ordering::Acquire);
        if restricted {
            let c = self.control();
            if !c.masks.is_empty() && !c.masks.contains(&src) {
                return Outcome::NoReply(Ignored::Masked);
            }
        }
        let rt = ReplyTo::new(&h, our_mac, self.settings.shelf, self.settings.slot);
        if h.version() != AOE_VERSION {
            return rt.error(ErrorCode::UnsupportedVersion, frame, 0, out);
        }
        match h.command() {
            Command::Ata => {
                let broadcast = h.shelf() == BROADCAST_SHELF || h.slot() == BROADCAST_SLOT;
                self.ata(frame, &rt, restricted, broadcast, out)
            }
            Command::QueryConfig => self.query_config(frame, &rt, out),
            Command::MacMask => self.mac_mask(frame, &rt, out),
            Command::ReserveRelease => self.reserve(frame, &rt, src, out),
            Command::Other(_) => rt.error(ErrorCode::UnrecognizedCommand, frame, 0, out),
        }
    }

    fn ata(&self, frame: &[u8], rt: &ReplyTo, restricted: bool, broadcast: bool, out: &mut [u8]) -> Outcome {
        let req = match AtaArg::parse(frame) {
            Ok(a) => a,
            Err(_) => return rt.error(ErrorCode::BadArgument, frame, 12, out),
        };
        let write = req.is_write() || matches!(req.cmd_status, CMD_WRITE_SECTORS | CMD_WRITE_SECTORS_EXT);
        if broadcast && write && !self.settings.broadcast_writes {
            return Outcome::NoReply(Ignored::BroadcastWrite);
        }
        if restricted && req.cmd_status != CMD_IDENTIFY_DEVICE {
            let c = self.control();
            if !c.reservations.is_empty() && !c.reservations.contains(&rt.fields.dst) {
                drop(c);
                return rt.error(ErrorCode::TargetReserved, frame, 12, out);
            }
        }
        if out.len() < ATA_HEADER_LEN.max(crate::MIN_FRAME) || rt.header(out).is_err() {
            return Outcome::NoReply(Ignored::NotAoe);
        }
        let mut reply = req;
        reply.err_feature = 0;
        reply.cmd_status = STATUS_DRDY;
        let mut data_len = 0usize;
        let ata_error = |reply: &mut AtaArg, err: u8| {
            reply.cmd_status = STATUS_DRDY | STATUS_ERR;
            reply.err_feature = err;
        };
        match req.cmd_status {
            CMD_READ_SECTORS | CMD_READ_SECTORS_EXT | CMD_WRITE_SECTORS | CMD_WRITE_SECTORS_EXT => {
                let write = matches!(req.cmd_status, CMD_WRITE_SECTORS | CMD_WRITE_SECTORS_EXT);
                let count = req.sector_count as usize;
                // Protocol-level problems: the frame itself is wrong.
                if count == 0 || count > self.settings.max_sectors as usize || write != req.is_write() {
                    return rt.error(ErrorCode::BadArgument, frame, 12, out);
                }
                let len = count * SECTOR;
                if write && frame.len() < ATA_HEADER_LEN + len {
                    return rt.error(ErrorCode::BadArgument, frame, 12, out);
                }
                if !write && out.len() < ATA_HEADER_LEN + len {
                    return rt.error(ErrorCode::BadArgument, frame, 12, out);
                }
                // Device-level problems: reported through ATA status/error.
                let lba = req.lba();
                if lba.checked_add(count as u64).is_none_or(|end| end > self.sectors) {
                    ata_error(&mut reply, ERR_IDNF | ERR_ABRT);
                } else if write {
                    let data = &frame[ATA_HEADER_LEN..ATA_HEADER_LEN + len];
                    match self.volume.write_at(data, lba * SECTOR as u64) {
                        Ok(()) => {}
                        Err(BlockError::OutOfRange { .. }) => ata_error(&mut reply, ERR_IDNF | ERR_ABRT),
                        Err(_) => ata_error(&mut reply, ERR_ABRT),
                    }
                } else {
                    let buf = &mut out[ATA_HEADER_LEN..ATA_HEADER_LEN + len];
                    match self.volume.read_at(buf, lba * SECTOR as u64) {
                        Ok(()) => data_len = len,
                        Err(BlockError::OutOfRange { .. }) => ata_error(&mut reply, ERR_IDNF | ERR_ABRT),
                        Err(_) => ata_error(&mut reply, ERR_UNC | ERR_ABRT),
                    }
                }
            }
            CMD_IDENTIFY_DEVICE => {
                if out.len() < ATA_HEADER_LEN + SECTOR {
                    return Outcome::NoReply(Ignored::NotAoe);
                }
                out[ATA_HEADER_LEN..ATA_HEADER_LEN + SECTOR].copy_from_slice(&self.identify);
                data_len = SECTOR;
            }
            CMD_FLUSH_CACHE | CMD_FLUSH_CACHE_EXT => {
                if self.volume.flush().is_err() {
                    ata_error(&mut reply, ERR_ABRT);
                }
            }
            CMD_CHECK_POWER_MODE => reply.sector_count = POWER_MODE_ACTIVE,
            _ => ata_error(&mut reply, ERR_ABRT),
        }
        // Cannot fail: length checked above.
        let _ = reply.encode(out);
        Outcome::Reply(pad_frame(out, ATA_HEADER_LEN + data_len))
    }

    fn query_config(&self, frame: &[u8], rt: &ReplyTo, out: &mut [u8]) -> Outcome {
        let q = match QueryConfig::parse(frame) {
            Ok(q) => q,
            Err(_) => return rt.error(ErrorCode::BadArgument, frame, 8, out),
        };
        let cmd = match q.command() {
            Some(c) => c,
            None => return rt.error(ErrorCode::BadArgument, frame, 8, out),
        };
        let mut error = None;
        let config = match cmd {
            ConfigCommand::Read => self.control().config.clone(),
            ConfigCommand::TestExact => {
                let c = self.control();
                if c.config != q.config {
                    return Outcome::NoReply(Ignored::ConfigMismatch);
                }
                c.config.clone()
            }
            ConfigCommand::TestPrefix => {
                let c = self.control();
                if !c.config.starts_with(q.config) {
                    return Outcome::NoReply(Ignored::ConfigMismatch);
                }
                c.config.clone()
            }
            ConfigCommand::SetIfEmpty => {
                let mut c = self.control_mut();
                if c.config.is_empty() || c.config == q.config {
                    c.config = q.config.to_vec();
                } else {
                    error = Some(ErrorCode::ConfigStringPresent);
                }
                c.config.clone()
            }
            ConfigCommand::ForceSet => {
                let mut c = self.control_mut();
                c.config = q.config.to_vec();
                c.config.clone()
            }
        };
        let mut f = rt.fields;
        if let Some(e) = error {
            f.flags |= FLAG_ERROR;
            f.error = e as u8;
        }
        let reply = QueryConfig {
            buffer_count: self.settings.buffer_count,
            firmware_version: FIRMWARE_VERSION,
            sector_count: self.settings.max_sectors,
            aoe_version: AOE_VERSION,
            ccmd: q.ccmd,
            config: &config,
        };
        match f.encode(out).and_then(|_| reply.encode(out)) {
            Ok(n) => Outcome::Reply(pad_frame(out, n)),
            Err(_) => Outcome::NoReply(Ignored::NotAoe),
        }
    }

    fn mac_mask(&self, frame: &[u8], rt: &ReplyTo, out: &mut [u8]) -> Outcome {
        let m = match MaskList::parse(frame) {
            Ok(m) => m,
            Err(_) => return rt.error(ErrorCode::BadArgument, frame, 4, out),
        };
        let mut merror = mask::MERROR_NONE;
        let mut failed_at = None;
        match m.mcmd {
            mask::MCMD_READ => {}
            mask::MCMD_EDIT => {
                let mut c = self.control_mut();
                for (i, d) in m.directives().enumerate() {
                    match d.command {
                        DirectiveCommand::Nop => {}
                        // The configured allow-list is the mask list, and
                        // the wire does not change it.
                        DirectiveCommand::Add | DirectiveCommand::Delete if !self.settings.allow.is_empty() => {
                            merror = mask::MERROR_UNSPECIFIED;
                            failed_at = Some(i);
                            break;
                        }
                        DirectiveCommand::Add => {
                            if !c.masks.contains(&d.mac) {
                                if c.masks.len() >= MAX_LIST {
                                    merror = mask::MERROR_LIST_FULL;
                                    failed_at = Some(i);
                                    break;
                                }
                                c.masks.push(d.mac);
                            }
                        }
                        DirectiveCommand::Delete => c.masks.retain(|x| *x != d.mac),
                        DirectiveCommand::Other(_) => {
                            merror = mask::MERROR_BAD_DIRECTIVE;
                            failed_at = Some(i);
                            break;
                        }
                    }
                }
                self.update_restricted(&c);
            }
            _ => return rt.error(ErrorCode::BadArgument, frame, 4, out),
        }
        if rt.header(out).is_err() {
            return Outcome::NoReply(Ignored::NotAoe);
        }
        // On success the reply carries the whole list; on a failed directive
        // it echoes the directives before the failing one, whose index is
        // the directive count.
        let list: Vec<Directive> = match failed_at {
            Some(i) => m.directives().take(i).collect(),
            None => {
                let c = self.control();
                let masks = if self.settings.allow.is_empty() { &c.masks } else { &self.settings.allow };
                masks.iter().map(|mac| Directive { command: DirectiveCommand::Nop, mac: *mac }).collect()
            }
        };
        match mask::encode(out, m.mcmd, merror, &list) {
            Ok(n) => Outcome::Reply(pad_frame(out, n)),
            Err(_) => Outcome::NoReply(Ignored::NotAoe),
        }
    }

    fn reserve(&self, frame: &[u8], rt: &ReplyTo, src: Mac, out: &mut [u8]) -> Outcome {
        let r = match ReserveRelease::parse(frame) {
            Ok(r) => r,
            Err(_) => return rt.error(ErrorCode::BadArgument, frame, 2, out),
        };
        let list = {
            let mut c = self.control_mut();
            match r.rcmd {
                reserve_release::RCMD_READ => {}
                reserve_release::RCMD_SET | reserve_release::RCMD_FORCE_SET => {
                    if r.rcmd == reserve_release::RCMD_SET && !c.reservations.is_empty() && !c.reservations.contains(&src) {
                        drop(c);
                        return rt.error(ErrorCode::TargetReserved, frame, 2, out);
                    }
                    if r.len() > MAX_LIST {
                        drop(c);
                        return rt.error(ErrorCode::BadArgument, frame, 2, out);
                    }
                    c.reservations = r.macs().collect();
                    c.reservations.dedup();
                    self.update_restricted(&c);
                }
                _ => {
                    drop(c);
                    return rt.error(ErrorCode::BadArgument, frame, 2, out);
                }
            }
            c.reservations.clone()
        };
        match rt.header(out).and_then(|_| reserve_release::encode(out, r.rcmd, &list)) {
            Ok(n) => Outcome::Reply(pad_frame(out, n)),
            Err(_) => Outcome::NoReply(Ignored::NotAoe),
        }
    }
}

#[cfg(test)]
mod tests;
