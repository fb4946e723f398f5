//! One controller's admin state: properties (CAP/VS/CC/CSTS), features,
//! Identify, Get Log Page, Async Event Requests, keep-alive. Connect and
//! Disconnect are handled by whoever owns the set of controllers (the
//! target); everything else on the admin queue comes here, through
//! [`Controller::execute_admin`] (`admin.rs`: the command table's rows
//! name the admin commands' bodies here).

use crate::queue_entry::Sqe;
use crate::fabrics::{fctype, reg, Property};
use crate::identify::{self, cns, CtrlParams};
use crate::features::PlainFeatures;
use crate::limits::{INCAPSULE_DATA, MAX_IO_QUEUES, MAX_QUEUE_ENTRIES, MAX_TRANSFER, MDTS};
use crate::logpage::{self, lid, DiscoveryEntry, LogRequest};
use crate::subsystem::Subsystem;
use crate::Status;
use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Keep-alive granularity (KAS) in 100 ms units.
pub const KAS: u16 = 10;
/// Outstanding AERs, zero-based (4).
pub const AERL: u8 = 3;
pub const FIRMWARE: &str = "0.1";

pub mod feature {
    pub const VOLATILE_WC: u8 = 0x06;
    pub const NUM_QUEUES: u8 = 0x07;
    pub const ASYNC_EVENT: u8 = 0x0B;
    pub const KATO: u8 = 0x0F;
    pub const RESV_MASK: u8 = 0x82;
    pub const RESV_PERSIST: u8 = 0x83;
}

/// Async event: I/O command specific status (6h), Reservation Log Page
/// Available (00h), log page 80h.
#[allow(clippy::identity_op)]
pub const AEN_RESERVATION: u32 = 0x06 | (0x00 << 8) | (0x80 << 16);
/// Reservation notification log entries a controller keeps unread.
pub const RESV_LOG_MAX: usize = 255;

/// Async event: notice, namespace attribute changed, log page 04h.
#[allow(clippy::identity_op)] // the three fields spelled out, the middle one 0
pub const AEN_NS_CHANGED: u32 = 0x02 | (0x00 << 8) | (0x04 << 16);

/// What the controller serves.
#[derive(Debug, Clone)]
pub enum Role {
    Nvm(Arc<Subsystem>),
    /// A discovery controller with the entries this host may see.
    Discovery(Vec<DiscoveryEntry>),
}

/// Keep-alive bookkeeping shared with every queue of the controller: any
/// command counts as traffic (like Linux nvmet), so a busy host that is
/// late with its Keep Alive is not torn down.
#[derive(Debug)]
pub struct KeepAlive {
    epoch: Instant,
    last_ms: AtomicU64,
    /// What the host asked for (Connect or Set Features).
    kato_ms: AtomicU32,
    /// What applies when it asked for none (0: no timeout at all).
    idle_ms: AtomicU32,
    /// The longest timeout it may have.
    max_ms: AtomicU32,
}

impl KeepAlive {
    pub fn new(kato_ms: u32, now: Instant) -> KeepAlive {
        KeepAlive {
            epoch: now,
            last_ms: AtomicU64::new(0),
            kato_ms: AtomicU32::new(kato_ms),
            idle_ms: AtomicU32::new(0),
            max_ms: AtomicU32::new(u32::MAX),
        }
    }
    /// Bound a controller that any host may open (discovery): without a
    /// timeout of its own (KATO 0) it expires after `idle_ms` without a
    /// command, and never later than `max_ms`, whatever the host asks.
    pub fn bound(&self, idle_ms: u32, max_ms: u32) {
        self.idle_ms.store(idle_ms, Relaxed);
        self.max_ms.store(max_ms.max(idle_ms), Relaxed);
    }
    pub fn touch(&self, now: Instant) {
        self.last_ms.store(now.saturating_duration_since(self.epoch).as_millis() as u64, Relaxed);
    }
    /// The timeout in force.
    pub fn kato(&self) -> Option<Duration> {
        let ms = match self.kato_ms.load(Relaxed) {
            0 => self.idle_ms.load(Relaxed),
            ms => ms.min(self.max_ms.load(Relaxed)),
        };
        match ms {
            0 => None,
            ms => Some(Duration::from_millis(ms as u64)),
        }
    }
    pub fn set_kato_ms(&self, ms: u32) {
        self.kato_ms.store(ms, Relaxed)
    }
    /// When the controller expires unless a command arrives first.
    pub fn deadline(&self) -> Option<Instant> {
        let last = self.epoch + Duration::from_millis(self.last_ms.load(Relaxed));
        self.kato().map(|k| last + k + Duration::from_millis(1))
    }
    /// True once no command arrived for a whole KATO.
    pub fn expired(&self, now: Instant) -> bool {
        match self.kato() {
            None => false,
            Some(k) => {
                let last = self.epoch + Duration::from_millis(self.last_ms.load(Relaxed));
                now.saturating_duration_since(last) > k
            }
        }
    }
}

/// A finished admin command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    pub cid: u16,
    pub status: Status,
    pub result: u64,
    /// Data for the host (controller to host transfer).
    pub data: Option<Bytes>,
}

impl Completion {
    pub(crate) fn status(cid: u16, status: Status) -> Completion {
        Completion { cid, status, result: 0, data: None }
    }
    fn result(cid: u16, result: u64) -> Completion {
        Completion { cid, status: Status::SUCCESS, result, data: None }
    }
    fn data(cid: u16, data: Vec<u8>, want: usize) -> Completion {
        let mut data = data;
        data.truncate(want);
        Completion { cid, status: Status::SUCCESS, result: 0, data: Some(Bytes::from(data)) }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum AdminOutcome {
    Complete(Completion),
    /// An Async Event Request parked until an event happens.
    Held,
}

impl From<Completion> for AdminOutcome {
    fn from(c: Completion) -> AdminOutcome {
        AdminOutcome::Complete(c)
    }
}

#[derive(Debug)]
pub struct Controller {
    pub cntlid: u16,
    pub role: Role,
    pub hostnqn: String,
    pub hostid: [u8; 16],
    pub keep_alive: Arc<KeepAlive>,
    cc: u32,
    csts: u32,
    aec: u32,
    wce: bool,
    /// I/O queues granted by Set Features (Number of Queues).
    io_queues: u16,
    aers: VecDeque<u16>,
    events: VecDeque<u32>,
    changed_ns: Vec<u32>,
    plain: crate::features::PlainFeatures,
    keyed_sgls: bool,
    /// Unread Reservation Notification log entries: (count, type, NSID).
    resv_log: VecDeque<(u64, u8, u32)>,
    resv_count: u64,
    /// Reservation Notification Mask per NSID (bits 1..=3 mask the log
    /// page types), and for the namespaces not named.
    resv_mask: std::collections::HashMap<u32, u32>,
    resv_mask_all: u32,
}

fn cap() -> u64 {
    (MAX_QUEUE_ENTRIES as u64 - 1) // MQES
        | 1 << 16 // CQR: contiguous queues required
        | 30 << 24 // TO: 15 s in 500 ms units
        | 1 << 37 // CSS: NVM command set
}

impl Controller {
    pub fn new(cntlid: u16, role: Role, hostnqn: String, hostid: [u8; 16], kato_ms: u32, now: Instant) -> Controller {
        let ka = Arc::new(KeepAlive::new(kato_ms, now));
        ka.touch(now);
        let wce = matches!(&role, Role::Nvm(s) if s.write_cache());
        Controller {
            cntlid,
            role,
            hostnqn,
            hostid,
            keep_alive: ka,
            cc: 0,
            csts: 0,
            aec: 0,
            wce,
            io_queues: MAX_IO_QUEUES,
            aers: VecDeque::new(),
            events: VecDeque::new(),
            changed_ns: Vec::new(),
            plain: Default::default(),
            keyed_sgls: false,
            resv_log: VecDeque::new(),
            resv_count: 0,
            resv_mask: Default::default(),
            resv_mask_all: 0,
        }
    }

    /// The controller is reached over RDMA: Identify reports keyed SGLs.
    pub fn set_keyed_sgls(&mut self, on: bool) {
        self.keyed_sgls = on;
    }

    pub fn subsystem(&self) -> Option<&Arc<Subsystem>> {
        match &self.role {
            Role::Nvm(s) => Some(s),
            Role::Discovery(_) => None,
        }
    }
    /// Whether this controller's host sees namespace `nsid`.
    fn sees(&self, nsid: u32) -> bool {
        self.subsystem().is_some_and(|s| s.visible_namespace(nsid, &self.hostnqn).is_some())
    }
    pub fn is_discovery(&self) -> bool {
        matches!(self.role, Role::Discovery(_))
    }
    pub fn ready(&self) -> bool {
        self.csts & 1 != 0
    }
    /// Number of I/O queues the host may connect (qid 1..=n).
    pub fn io_queues(&self) -> u16 {
        if self.is_discovery() {
            0
        } else {
            self.io_queues
        }
    }
    pub fn shut_down(&self) -> bool {
        (self.csts >> 2) & 3 == 2
    }

    fn params(&self) -> CtrlParams {
        let (subnqn, nn, serial, model, cntrltype) = match &self.role {
            Role::Nvm(s) => (s.nqn.clone(), s.max_nsid(), s.serial.clone(), s.model.clone(), identify::CNTRLTYPE_IO),
            Role::Discovery(_) => (crate::DISCOVERY_NQN.to_string(), 0, "discovery".into(), "blockwire discovery".into(), identify::CNTRLTYPE_DISCOVERY),
        };
        CtrlParams {
            cntlid: self.cntlid,
            cntrltype,
            serial,
            model,
            firmware: FIRMWARE.into(),
            subnqn,
            nn,
            vwc: self.wce,
            mdts: MDTS,
            maxcmd: MAX_QUEUE_ENTRIES,
            ioccsz: (64 + INCAPSULE_DATA) / 16,
            iorcsz: 1,
            kas: KAS,
            aerl: AERL,
            oncs: if cntrltype == identify::CNTRLTYPE_IO { identify::ONCS_COMPARE | identify::ONCS_DSM | identify::ONCS_WRITE_ZEROES | identify::ONCS_RESERVATIONS } else { 0 },
            keyed_sgls: self.keyed_sgls,
        }
    }

    /// Property Get / Property Set (fabrics commands on the admin queue).
    pub fn property(&mut self, sqe: &Sqe) -> Completion {
        let cid = sqe.cid();
        let p = Property::parse(sqe);
        if sqe.fctype() == fctype::PROPERTY_SET {
            return match p.offset {
                reg::CC => {
                    self.set_cc(p.value as u32);
                    Completion::status(cid, Status::SUCCESS)
                }
                _ => Completion::status(cid, Status::INVALID_FIELD.dnr()),
            };
        }
        let v = match (p.offset, p.size8) {
            (reg::CAP, true) => cap(),
            (reg::VS, false) => identify::VERSION as u64,
            (reg::CC, false) => self.cc as u64,
            (reg::CSTS, false) => self.csts as u64,
            _ => return Completion::status(cid, Status::INVALID_FIELD.dnr()),
        };
        Completion::result(cid, v)
    }

    fn set_cc(&mut self, new: u32) {
        let old = self.cc;
        self.cc = new;
        let en = new & 1 != 0;
        if en && old & 1 == 0 {
            // Entry sizes must be 2^6 and 2^4 bytes, else controller fatal.
            if (new >> 16) & 0xF != 6 || (new >> 20) & 0xF != 4 {
                self.csts |= 1 << 1; // CFS
            } else {
                self.csts = 1;
            }
        } else if !en && old & 1 != 0 {
            // Controller reset.
            self.csts = 0;
            self.aers.clear();
        }
        let shn = (new >> 14) & 3;
        if shn != 0 && (old >> 14) & 3 == 0 {
            // Normal or abrupt shutdown: make everything durable first.
            if let Role::Nvm(s) = &self.role {
                for ns in &s.namespaces {
                    if let Err(e) = ns.volume.flush() {
                        log::warn!("controller {}: flush at shutdown failed: {e}", self.cntlid);
                    }
                }
            }
            self.csts = (self.csts & !(3 << 2)) | (2 << 2); // SHST: complete
        } else if shn == 0 {
            self.csts &= !(3 << 2);
        }
    }

    pub(crate) fn keep_alive_cmd(&mut self, sqe: &Sqe, _: &[u8]) -> AdminOutcome {
        Completion::status(sqe.cid(), Status::SUCCESS).into()
    }

    /// Commands complete too fast to abort: report "not aborted".
    pub(crate) fn abort(&mut self, sqe: &Sqe, _: &[u8]) -> AdminOutcome {
        Completion::result(sqe.cid(), 1).into()
    }

    /// Park the request until an event happens, unless one is waiting.
    pub(crate) fn async_event(&mut self, sqe: &Sqe, _: &[u8]) -> AdminOutcome {
        let cid = sqe.cid();
        if let Some(ev) = self.events.pop_front() {
            Completion::result(cid, ev as u64).into()
        } else if self.aers.len() > AERL as usize {
            Completion::status(cid, Status::ASYNC_LIMIT.dnr()).into()
        } else {
            self.aers.push_back(cid);
            AdminOutcome::Held
        }
    }

    pub(crate) fn identify(&mut self, sqe: &Sqe, _: &[u8]) -> AdminOutcome {
        let cid = sqe.cid();
        let want = sqe.sgl().length as usize;
        let c = (sqe.cdw(10) & 0xFF) as u8;
        let csi = (sqe.cdw(11) >> 24) as u8;
        let nsid = sqe.nsid();
        let bad_ns = Completion::status(cid, Status::INVALID_NS.dnr());
        let host = self.hostnqn.as_str();
        let page = match (c, &self.role) {
            (cns::CONTROLLER, _) => identify::controller(&self.params()),
            (cns::NAMESPACE, Role::Nvm(s)) => match s.visible_namespace(nsid, host) {
                Some(ns) => identify::namespace(ns),
                // Inactive but valid NSID (none there, or one this host
                // may not see): a zeroed structure.
                None if nsid != 0 && nsid <= s.max_nsid() => vec![0u8; identify::LEN],
                None => return bad_ns.into(),
            },
            (cns::ACTIVE_NS_LIST, Role::Nvm(s)) => {
                if nsid >= 0xFFFF_FFFE {
                    return bad_ns.into();
                }
                identify::active_ns_list(s, nsid, host)
            }
            (cns::NS_DESCRIPTORS, Role::Nvm(s)) => match s.visible_namespace(nsid, host) {
                Some(ns) => identify::ns_descriptors(ns),
                None => return bad_ns.into(),
            },
            // NVM command set specific structures: no limits to report.
            (cns::CS_CONTROLLER, Role::Nvm(_)) if csi == 0 => vec![0u8; identify::LEN],
            (cns::CS_NAMESPACE, Role::Nvm(s)) if csi == 0 => match s.visible_namespace(nsid, host) {
                Some(_) => vec![0u8; identify::LEN],
                None => return bad_ns.into(),
            },
            _ => return Completion::status(cid, Status::INVALID_FIELD.dnr()).into(),
        };
        Completion::data(cid, page, want.min(identify::LEN)).into()
    }

    /// Get Log Page; the Commands Supported and Effects page is what
    /// `effects_log` makes of the command table this handler is a row of
    /// (the table passes it in).
    pub(crate) fn get_log_page(&mut self, sqe: &Sqe, effects_log: fn() -> Vec<u8>) -> AdminOutcome {
        let cid = sqe.cid();
        let r = LogRequest::parse(sqe);
        if r.len > MAX_TRANSFER as usize {
            return Completion::status(cid, Status::INVALID_FIELD.dnr()).into();
        }
        if r.len > sqe.sgl().length as usize {
            return Completion::status(cid, Status::SGL_INVALID_DATA.dnr()).into();
        }
        let page = match (r.lid, &self.role) {
            (lid::DISCOVERY, Role::Discovery(entries)) => logpage::discovery_log(entries.len() as u64, entries),
            (lid::SUPPORTED, Role::Nvm(_)) => logpage::supported_pages(&logpage::NVM_PAGES),
            (lid::ERROR, _) => logpage::error_log(),
            (lid::SMART, _) => logpage::smart(self.subsystem().map(|s| s.as_ref())),
            (lid::FW_SLOT, _) => logpage::firmware_slots(FIRMWARE),
            (lid::CHANGED_NS, Role::Nvm(_)) => {
                let p = logpage::changed_ns(&self.changed_ns);
                if !r.rae {
                    self.changed_ns.clear();
                }
                p
            }
            (lid::CMD_EFFECTS, Role::Nvm(_)) => effects_log(),
            (lid::ANA, Role::Nvm(s)) => s.ana_log_page((sqe.cdw(10) >> 8) & crate::ana::LSP_RGO != 0, &self.hostnqn),
            (lid::RESERVATION, Role::Nvm(_)) => {
                let entry = if r.rae { self.resv_log.front().copied() } else { self.resv_log.pop_front() };
                logpage::reservation_notice(entry, self.resv_log.len().saturating_sub(r.rae as usize))
            }
            _ => return Completion::status(cid, Status::INVALID_LOG_PAGE.dnr()).into(),
        };
        let c = match logpage::window(&page, &r) {
            Some(d) => Completion::data(cid, d, r.len),
            None => Completion::status(cid, Status::INVALID_FIELD.dnr()),
        };
        c.into()
    }

    pub(crate) fn set_features(&mut self, sqe: &Sqe, _: &[u8]) -> AdminOutcome {
        let cid = sqe.cid();
        let c10 = sqe.cdw(10);
        let v = sqe.cdw(11);
        if c10 & (1 << 31) != 0 {
            return Completion::status(cid, Status::FEATURE_NOT_SAVEABLE.dnr()).into();
        }
        let c = match c10 as u8 {
            feature::NUM_QUEUES => {
                let (nsq, ncq) = (v & 0xFFFF, v >> 16);
                if nsq == 0xFFFF || ncq == 0xFFFF || self.is_discovery() {
                    return Completion::status(cid, Status::INVALID_FIELD.dnr()).into();
                }
                let granted = (nsq.min(ncq) + 1).min(MAX_IO_QUEUES as u32) as u16;
                self.io_queues = granted;
                let z = (granted - 1) as u64;
                Completion::result(cid, z | z << 16)
            }
            feature::ASYNC_EVENT => {
                self.aec = v;
                Completion::status(cid, Status::SUCCESS)
            }
            feature::KATO => {
                self.keep_alive.set_kato_ms(v);
                Completion::status(cid, Status::SUCCESS)
            }
            feature::VOLATILE_WC if self.subsystem().is_some_and(|s| s.write_cache()) => {
                // The page cache is the write cache; it cannot be turned off,
                // but with WCE clear we still honour every Flush.
                self.wce = v & 1 != 0;
                Completion::status(cid, Status::SUCCESS)
            }
            feature::RESV_MASK if !self.is_discovery() => {
                let nsid = sqe.nsid();
                match nsid {
                    0xFFFF_FFFF => {
                        self.resv_mask_all = v & 0xE;
                        self.resv_mask.clear();
                    }
                    n if self.sees(n) => {
                        self.resv_mask.insert(n, v & 0xE);
                    }
                    _ => return Completion::status(cid, Status::INVALID_NS.dnr()).into(),
                }
                Completion::status(cid, Status::SUCCESS)
            }
            feature::RESV_PERSIST if !self.is_discovery() => {
                let Some(ns) = self.subsystem().and_then(|s| s.visible_namespace(sqe.nsid(), &self.hostnqn)) else {
                    return Completion::status(cid, Status::INVALID_NS.dnr()).into();
                };
                let ptpl = v & 1 != 0;
                match ns.volume.reservations().change(|s| {
                    s.aptpl = ptpl;
                    Ok(())
                }) {
                    Ok(_) => Completion::status(cid, Status::SUCCESS),
                    Err(e) => {
                        log::warn!("controller {}: reservation persistence: {e}", self.cntlid);
                        Completion::status(cid, Status::INTERNAL)
                    }
                }
            }
            fid if PlainFeatures::handles(fid) && !self.is_discovery() => match self.plain.set(fid, v) {
                Ok(()) => Completion::status(cid, Status::SUCCESS),
                Err(s) => Completion::status(cid, s.dnr()),
            },
            _ => Completion::status(cid, Status::INVALID_FIELD.dnr()),
        };
        c.into()
    }

    pub(crate) fn get_features(&mut self, sqe: &Sqe, _: &[u8]) -> AdminOutcome {
        let cid = sqe.cid();
        let c10 = sqe.cdw(10);
        let sel = (c10 >> 8) & 7;
        let fid = c10 as u8;
        if sel == 3 {
            // Supported capabilities: changeable, not saveable.
            return match fid {
                feature::NUM_QUEUES | feature::ASYNC_EVENT | feature::KATO | feature::VOLATILE_WC => Completion::result(cid, 1 << 2).into(),
                // Namespace specific and changeable.
                feature::RESV_MASK | feature::RESV_PERSIST if !self.is_discovery() => Completion::result(cid, 1 << 1 | 1 << 2).into(),
                fid if PlainFeatures::handles(fid) && !self.is_discovery() => Completion::result(cid, 1 << 2).into(),
                _ => Completion::status(cid, Status::INVALID_FIELD.dnr()).into(),
            };
        }
        let default = sel == 1;
        let v = match fid {
            feature::NUM_QUEUES if !self.is_discovery() => {
                let z = (if default { MAX_IO_QUEUES } else { self.io_queues } - 1) as u32;
                z | z << 16
            }
            feature::ASYNC_EVENT => if default { 0 } else { self.aec },
            feature::KATO => self.keep_alive.kato_ms.load(Relaxed),
            feature::VOLATILE_WC if self.subsystem().is_some_and(|s| s.write_cache()) => (if default { true } else { self.wce }) as u32,
            feature::RESV_MASK if !self.is_discovery() => match sqe.nsid() {
                _ if default => 0,
                0xFFFF_FFFF => self.resv_mask_all,
                n if self.sees(n) => self.resv_mask_of(n),
                _ => return Completion::status(cid, Status::INVALID_NS.dnr()).into(),
            },
            feature::RESV_PERSIST if !self.is_discovery() => match self.subsystem().and_then(|s| s.visible_namespace(sqe.nsid(), &self.hostnqn)) {
                Some(_) if default => 0,
                Some(ns) => ns.volume.reservations().cached().aptpl as u32,
                None => return Completion::status(cid, Status::INVALID_NS.dnr()).into(),
            },
            fid if PlainFeatures::handles(fid) && !self.is_discovery() => match self.plain.get(fid, sqe.cdw(11), default) {
                Ok(v) => v,
                Err(s) => return Completion::status(cid, s.dnr()).into(),
            },
            _ => return Completion::status(cid, Status::INVALID_FIELD.dnr()).into(),
        };
        Completion::result(cid, v as u64).into()
    }

    /// A namespace's attributes changed (resize, new namespace). Returns the
    /// AER completion to send, if one was waiting and the host asked for
    /// these notices.
    pub fn namespace_changed(&mut self, nsid: u32) -> Option<Completion> {
        if !self.changed_ns.contains(&nsid) {
            self.changed_ns.push(nsid);
        }
        if self.aec & (1 << 8) == 0 {
            return None;
        }
        self.raise_event(AEN_NS_CHANGED)
    }

    /// The subsystem was changed live (namespaces added, removed or
    /// resized: `changed`): Identify answers from `new` from now on, and
    /// each change is reported as [`Controller::namespace_changed`] does.
    /// `changed` is what this controller's host is told (see
    /// [`crate::changed_for_host`]). Returns the AER completion to send:
    /// one event for them all, the log lists every NSID.
    pub fn subsystem_changed(&mut self, new: Arc<Subsystem>, changed: &[u32]) -> Option<Completion> {
        if let Role::Nvm(s) = &mut self.role {
            *s = new;
        }
        let (last, rest) = changed.split_last()?;
        for n in rest {
            if !self.changed_ns.contains(n) {
                self.changed_ns.push(*n);
            }
        }
        self.namespace_changed(*last)
    }

    /// This gateway's ANA state of the subsystem changed (see
    /// [`crate::ana::Ana::set_state`]). Returns the AER completion to send,
    /// if one was waiting and the host enabled ANA change notices; else the
    /// notice waits for the host's next AER.
    pub fn ana_changed(&mut self) -> Option<Completion> {
        if self.aec & crate::ana::AEC_ANA_CHANGE == 0 || self.is_discovery() {
            return None;
        }
        self.raise_event(crate::ana::AEN_ANA_CHANGE)
    }

    fn resv_mask_of(&self, nsid: u32) -> u32 {
        self.resv_mask.get(&nsid).copied().unwrap_or(self.resv_mask_all)
    }

    /// A reservation notice for this controller's host on namespace
    /// `nsid` (log page type `kind`, see [`crate::reservation::notice`]):
    /// a Reservation Notification log entry, and the AER completion to
    /// send if one was waiting (else the event waits for the next AER).
    /// Masked types (Reservation Notification Mask) are dropped.
    pub fn reservation_notice(&mut self, nsid: u32, kind: u8) -> Option<Completion> {
        if !self.sees(nsid) || self.resv_mask_of(nsid) & (1 << kind) != 0 {
            return None;
        }
        self.resv_count = self.resv_count.checked_add(1).unwrap_or(1);
        if self.resv_log.len() == RESV_LOG_MAX {
            self.resv_log.pop_front();
        }
        self.resv_log.push_back((self.resv_count, kind, nsid));
        self.raise_event(AEN_RESERVATION)
    }

    /// Complete a parked AER with event `aen`, or keep the event (once)
    /// for the host's next AER.
    fn raise_event(&mut self, aen: u32) -> Option<Completion> {
        match self.aers.pop_front() {
            Some(cid) => Some(Completion::result(cid, aen as u64)),
            None => {
                if !self.events.contains(&aen) {
                    self.events.push_back(aen);
                }
                None
            }
        }
    }

    /// AERs currently parked.
    pub fn held_aers(&self) -> usize {
        self.aers.len()
    }
}

#[cfg(test)]
mod tests;
