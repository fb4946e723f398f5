//! SCSI disk emulation (SPC-4 / SBC-3) over a [`bw_block::Volume`].
//!
//! Transport independent and socket free: a transport (iSCSI here, anything
//! that carries CDBs later) hands [`ScsiTarget::execute`] one command at a
//! time — CDB, the data the initiator sent, and a buffer for the data the
//! command returns — and gets back a status byte plus fixed-format sense data.
//! The transport does the framing, truncation to the expected transfer length
//! and residual accounting.
//!
//! One [`ScsiTarget`] holds every LUN of one target and is shared by all
//! sessions through an `Arc`; each session is an I_T nexus identified by a
//! [`NexusId`] the transport assigns. Per-nexus state (unit attentions,
//! reservations) lives here, keyed by that id — or by the initiator port
//! name when the transport gives one ([`ScsiTarget::set_initiator_name`]).
//!
//! Commands (modules): INQUIRY with VPD 0x00/0x80/0x83/0xB0/0xB1/0xB2
//! (`inquiry`); MODE SENSE/SELECT 6/10 with the caching, control and
//! informational-exceptions pages (`mode`); LOG SENSE with the supported,
//! temperature and informational-exceptions pages (`log`); READ/WRITE
//! 6/10/12/16, WRITE AND VERIFY, VERIFY, WRITE SAME 10/16, UNMAP, COMPARE AND
//! WRITE, PRE-FETCH, SYNCHRONIZE CACHE, READ CAPACITY 10/16 (`block_io`);
//! GET LBA STATUS (`provisioning`); RESERVE/RELEASE(6) and PERSISTENT RESERVE
//! IN/OUT (`reservation`); REPORT TARGET PORT GROUPS and implicit ALUA
//! (`alua`); REPORT SUPPORTED OPERATION CODES / TASK MANAGEMENT FUNCTIONS
//! (`opcodes`); unit attentions (`ua`); TEST UNIT READY, REQUEST SENSE,
//! REPORT LUNS, START STOP UNIT and PREVENT ALLOW MEDIUM REMOVAL here. Not
//! implemented (answered INVALID COMMAND OPERATION CODE, which initiators and
//! libiscsi treat as "unsupported"; reasons in docs/conformance.md): LOG
//! SELECT, SET TARGET PORT GROUPS (implicit ALUA only),
//! EXTENDED COPY, ORWRITE, WRITE ATOMIC, READ DEFECT DATA, SANITIZE, FORMAT
//! UNIT, SEND DIAGNOSTIC; PR OUT PREEMPT AND ABORT is an invalid field.
//!
//! Every supported command is one row of [`commands::COMMANDS`] (CDB
//! length and usage data, data direction and length, reservation conflict
//! class, ALUA access, inline or pooled execution) plus one handler
//! function; see that module for what reads the row.
//!
//! Checked against libiscsi's `iscsi-test-cu -t SCSI` (215 tests) through
//! the blockwire iSCSI target.

use bw_block::Volume;


/// SCSI status codes (SAM-5) a command can complete with.
pub mod status {
    pub const GOOD: u8 = 0x00;
    pub const CHECK_CONDITION: u8 = 0x02;
    pub const BUSY: u8 = 0x08;
    pub const RESERVATION_CONFLICT: u8 = 0x18;
    pub const TASK_SET_FULL: u8 = 0x28;
    pub const TASK_ABORTED: u8 = 0x40;
}

/// Identity and policy of one logical unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LunConfig {
    /// Refuse writes with DATA PROTECT even if the volume is writable.
    pub read_only: bool,
    /// T10 vendor identification (INQUIRY bytes 8..16, padded to 8 ASCII chars).
    pub vendor: String,
    /// Product identification (padded to 16 ASCII chars).
    pub product: String,
    /// Product revision level (padded to 4 ASCII chars).
    pub revision: String,
    /// Unit serial number (VPD page 0x80).
    pub serial: String,
    /// Low 64 bits of the NAA IEEE Registered Extended designator (VPD 0x83).
    pub naa_id: u64,
    /// ALUA target port group this LUN is reached through, and its state.
    pub port_group: PortGroup,
}

impl LunConfig {
    /// Defaults for exporting `volume_name` as `lun` of `target_name`: vendor
    /// "BLKWIRE", product "blockwire disk", and a serial number and NAA id that
    /// are stable across restarts and distinct for different (target, volume,
    /// LUN) triples (a 64-bit FNV-1a hash of the three).
    pub fn for_volume(volume_name: &str, target_name: &str, lun: u64) -> Self {
        let id = ident::stable_id(volume_name, target_name, lun);
        LunConfig {
            read_only: false,
            vendor: "BLKWIRE".into(),
            product: "blockwire disk".into(),
            revision: env!("CARGO_PKG_VERSION").chars().filter(|c| *c != '.').take(4).collect(),
            serial: format!("{id:016x}"),
            naa_id: id,
            port_group: PortGroup::default(),
        }
    }
}

/// Result of one command: a SCSI status and, for CHECK CONDITION, fixed-format
/// sense data (response code 0x70). `sense` is empty when the status is GOOD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScsiOutcome {
    pub status: u8,
    pub sense: Vec<u8>,
}

impl ScsiOutcome {
    pub const GOOD: ScsiOutcome = ScsiOutcome { status: status::GOOD, sense: Vec::new() };

    pub fn is_good(&self) -> bool {
        self.status == status::GOOD
    }
}

mod alua;
mod block_io;
pub mod initiator;
mod cdb;
pub mod commands;
mod ident;
mod inquiry;
mod limits;
mod log;
mod mode;
mod opcodes;
mod plan;
mod provisioning;
mod reservation;
pub mod sense;
mod ua;

pub use alua::{AluaState, PortGroup};
pub use ident::NexusId;
pub use inquiry::naa_designator;
pub use plan::{io_outcome, IoPlan, Plan, Planned, ReadPlan};

pub use limits::MAX_DATA_OUT_BYTES;
pub use sense::Sense;
/// Operation codes and service actions, for initiators as for this target.
pub use cdb::op;

use cdb::field;
use reservation::{Denied, Reservations};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::{Acquire, Relaxed, Release}};
use arc_swap::ArcSwap;
use std::sync::{Arc, Mutex, RwLock};
use ua::UnitAttentions;

/// One logical unit: the volume, its identity and its mutable SCSI state.
pub(crate) struct Lun {
    number: u64,
    volume: Volume,
    cfg: LunConfig,
    /// Capacity in 512-byte blocks (re-read by [`ScsiTarget::capacity_changed`]).
    blocks: AtomicU64,
    /// Whether the backend really deallocates (UNMAP, LBPME).
    discard: bool,
    /// Configured or backend read-only.
    read_only: bool,
    /// Software write protect (control mode page SWP).
    swp: AtomicBool,
    /// Write cache enable (caching mode page WCE); when off every write is
    /// followed by a flush.
    wce: AtomicBool,
    wce_default: bool,
    wce_changeable: bool,
    ua: Arc<UnitAttentions>,
    res: Reservations,
    /// Serialises COMPARE AND WRITE commands.
    caw_lock: Mutex<()>,
}

impl Lun {
    fn new(number: u64, volume: Volume, cfg: LunConfig) -> Self {
        let info = volume.info();
        let wce_default = info.durability != bw_block::Durability::WriteThrough;
        let blocks = volume.sectors();
        let ua = Arc::new(UnitAttentions::default());
        let res = Reservations::new(volume.reservations().clone(), cfg.port_group.relative_port, ua.clone());
        Lun {
            number,
            discard: info.supports_discard,
            read_only: cfg.read_only || volume.read_only(),
            wce_changeable: info.durability == bw_block::Durability::WriteBack,
            wce: AtomicBool::new(wce_default),
            wce_default,
            swp: AtomicBool::new(false),
            blocks: AtomicU64::new(blocks),
            volume,
            cfg,
            ua,
            res,
            caw_lock: Mutex::new(()),
        }
    }

    #[inline]
    fn blocks(&self) -> u64 {
        self.blocks.load(Relaxed)
    }

    fn write_protected(&self) -> bool {
        self.read_only || self.swp.load(Relaxed)
    }

    fn reset(&self) {
        self.res.clear_spc2(None);
        self.swp.store(false, Relaxed);
        self.wce.store(self.wce_default, Relaxed);
        self.ua.broadcast(Sense::POWER_ON_RESET);
    }
}

/// Why a command did not complete with GOOD.
pub(crate) enum Fail {
    Check(Sense),
    Conflict,
}

impl From<Sense> for Fail {
    fn from(s: Sense) -> Self {
        Fail::Check(s)
    }
}

impl From<Denied> for Fail {
    fn from(d: Denied) -> Self {
        match d {
            Denied::Conflict => Fail::Conflict,
            Denied::Check(s) => Fail::Check(s),
        }
    }
}

impl ScsiOutcome {
    fn from_result(r: Result<(), Fail>) -> Self {
        match r {
            Ok(()) => ScsiOutcome::GOOD,
            Err(Fail::Check(s)) => ScsiOutcome::check(s),
            Err(Fail::Conflict) => ScsiOutcome { status: status::RESERVATION_CONFLICT, sense: Vec::new() },
        }
    }

    /// CHECK CONDITION with `sense`.
    pub fn check(sense: Sense) -> Self {
        ScsiOutcome { status: status::CHECK_CONDITION, sense: sense.to_fixed() }
    }
}

/// The LUN a transport's connection used last, for
/// [`ScsiTarget::plan_cached`]: one per connection, used with one target
/// only. It holds the LUN weakly: a LUN unmapped while the connection is
/// idle is dropped (its volume closed) as if no cache held it, and the
/// generation it was filled at makes it look the LUN up again after any
/// mapping change (a LUN unmapped and mapped again at the same number is
/// a new LUN).
#[derive(Default)]
pub struct LunCache {
    generation: u64,
    number: u64,
    lun: std::sync::Weak<Lun>,
}

/// All logical units of one target; `Send + Sync`, share it with `Arc`.
pub struct ScsiTarget {
    /// The mapped LUNs, sorted by number. Commands load the table without
    /// a lock ([`ArcSwap`]); [`ScsiTarget::add_lun`] and
    /// [`ScsiTarget::remove_lun`] publish a new one.
    luns: ArcSwap<Vec<Arc<Lun>>>,
    /// Bumped after each new `luns` is published: a [`LunCache`] filled
    /// under an older value is stale and looks its LUN up again.
    generation: AtomicU64,
    /// Serialises writers of `luns` (the control path only).
    mapping: Mutex<()>,
    /// Initiator port identity of each nexus whose name the transport told
    /// us (see [`ScsiTarget::set_initiator_name`]).
    ports: RwLock<HashMap<NexusId, u64>>,
    /// Initiator port names by identity, kept after the nexus ends while a
    /// persistent reservation registration refers to the port, so READ FULL
    /// STATUS can still name registrants that are not logged in; forgotten
    /// once neither a nexus nor a registration uses it (initiators choose
    /// their names, so keeping every one would grow without bound). Locked
    /// before `ports` and before any LUN's reservations.
    port_names: Mutex<HashMap<u64, String>>,
    /// The asymmetric access state the operator set for every LUN
    /// ([`ScsiTarget::set_alua_state`]), as its code; [`NO_ALUA_OVERRIDE`]:
    /// each LUN's configured one.
    alua: std::sync::atomic::AtomicU8,
}

const NO_ALUA_OVERRIDE: u8 = 0xFF;

impl ScsiTarget {
    /// Build a target from `(lun number, volume, config)` triples.
    pub fn new(luns: Vec<(u64, Volume, LunConfig)>) -> Self {
        let mut luns: Vec<Arc<Lun>> = luns.into_iter().map(|(n, v, c)| Arc::new(Lun::new(n, v, c))).collect();
        luns.sort_by_key(|l| l.number);
        luns.dedup_by_key(|l| l.number);
        ScsiTarget {
            luns: ArcSwap::from_pointee(luns),
            generation: AtomicU64::new(0),
            mapping: Mutex::new(()),
            ports: RwLock::new(HashMap::new()),
            port_names: Mutex::new(HashMap::new()),
            alua: std::sync::atomic::AtomicU8::new(NO_ALUA_OVERRIDE),
        }
    }

    /// The mapped LUN numbers, ascending.
    pub fn luns(&self) -> Vec<u64> {
        self.luns.load().iter().map(|l| l.number).collect()
    }

    /// The volume mapped at `lun`, if any.
    pub fn volume(&self, lun: u64) -> Option<Volume> {
        self.lun(lun).map(|l| l.volume.clone())
    }

    /// The identity and policy `lun` was mapped with.
    pub fn lun_config(&self, lun: u64) -> Option<LunConfig> {
        self.lun(lun).map(|l| l.cfg.clone())
    }

    #[inline]
    fn lun(&self, lun: u64) -> Option<Arc<Lun>> {
        self.luns.load().iter().find(|l| l.number == lun).cloned()
    }

    /// [`ScsiTarget::lun`] through `cache`: while no LUN was mapped or
    /// unmapped since the cache was filled, its LUN is still the one
    /// mapped at that number (a plain load and an upgrade, against the
    /// table's load, ~90 instructions with arc-swap's debt list).
    #[inline]
    pub(crate) fn lun_cached(&self, cache: &mut LunCache, lun: u64) -> Option<Arc<Lun>> {
        // Loaded before the table: a change between the two leaves the
        // cache marked older than what it holds, so it is only refilled.
        let generation = self.generation.load(Acquire);
        if cache.generation == generation && cache.number == lun {
            if let Some(l) = cache.lun.upgrade() {
                return Some(l);
            }
        }
        let l = self.lun(lun);
        *cache = LunCache { generation, number: lun, lun: l.as_ref().map_or_else(std::sync::Weak::new, Arc::downgrade) };
        l
    }

    /// Map `volume` at `lun` while sessions run, and raise REPORTED LUNS
    /// DATA HAS CHANGED on the LUNs they already use (SPC-4 6.6: every
    /// I_T nexus learns it on its next command there; a rescan finds the
    /// new LUN). `false` if the number is taken.
    pub fn add_lun(&self, lun: u64, volume: Volume, cfg: LunConfig) -> bool {
        let _w = self.mapping.lock().unwrap_or_else(|p| p.into_inner());
        let old = self.luns.load_full();
        if old.iter().any(|l| l.number == lun) {
            return false;
        }
        let mut new: Vec<Arc<Lun>> = old.iter().cloned().collect();
        new.push(Arc::new(Lun::new(lun, volume, cfg)));
        new.sort_by_key(|l| l.number);
        self.luns.store(Arc::new(new));
        self.generation.fetch_add(1, Release);
        for l in old.iter() {
            l.ua.broadcast(Sense::REPORTED_LUNS_CHANGED);
        }
        true
    }

    /// Unmap `lun` while sessions run (commands already started on it
    /// finish; later ones get LOGICAL UNIT NOT SUPPORTED) and raise
    /// REPORTED LUNS DATA HAS CHANGED on the LUNs left. `false` if no such
    /// LUN.
    pub fn remove_lun(&self, lun: u64) -> bool {
        let _w = self.mapping.lock().unwrap_or_else(|p| p.into_inner());
        let old = self.luns.load_full();
        if !old.iter().any(|l| l.number == lun) {
            return false;
        }
        let new: Vec<Arc<Lun>> = old.iter().filter(|l| l.number != lun).cloned().collect();
        for l in &new {
            l.ua.broadcast(Sense::REPORTED_LUNS_CHANGED);
        }
        self.luns.store(Arc::new(new));
        self.generation.fetch_add(1, Release);
        drop(_w);
        self.forget_unused_names(None);
        true
    }

    /// Optional but recommended: record the SCSI initiator port name of a
    /// nexus (iSCSI: `<initiator name>,i,0x<ISID in hex>`). Unit attentions,
    /// reservations and registrations then belong to that initiator port, so
    /// a session that is reinstated with the same name and ISID keeps its
    /// persistent reservation registrations (SPC-4 I_T nexus semantics), and
    /// PERSISTENT RESERVE IN / READ FULL STATUS reports its TransportID.
    /// Without it each `NexusId` is its own initiator port.
    pub fn set_initiator_name(&self, nexus: NexusId, name: &str) {
        let id = ident::port_identity(name);
        // Both tables under the names lock, so a concurrent
        // `forget_unused_names` sees the nexus and the name together.
        let mut names = self.port_names.lock().unwrap_or_else(|p| p.into_inner());
        let old = self.ports.write().unwrap_or_else(|p| p.into_inner()).insert(nexus, id);
        names.insert(id, name.to_string());
        drop(names);
        // A nexus renamed: its former name may now be unused.
        if let Some(old) = old.filter(|o| *o != id) {
            self.forget_unused_names(Some(old));
        }
    }

    /// Forget the names of initiator ports that no nexus stands for and no
    /// registration on any LUN refers to: just `only`, or all of them.
    fn forget_unused_names(&self, only: Option<u64>) {
        let mut names = self.port_names.lock().unwrap_or_else(|p| p.into_inner());
        let ports = self.ports.read().unwrap_or_else(|p| p.into_inner());
        match only {
            Some(id) => {
                if !ports.values().any(|p| *p == id) && !self.luns.load().iter().any(|l| l.res.is_registered(id)) {
                    names.remove(&id);
                }
            }
            None => {
                let mut used: std::collections::HashSet<u64> = ports.values().copied().collect();
                for l in self.luns.load().iter() {
                    l.res.registered_into(&mut used);
                }
                names.retain(|id, _| used.contains(id));
            }
        }
    }

    /// The initiator port a nexus stands for (its own id if unnamed).
    pub(crate) fn identity(&self, nexus: NexusId) -> u64 {
        self.ports.read().unwrap_or_else(|p| p.into_inner()).get(&nexus).copied().unwrap_or(nexus)
    }

    /// The asymmetric access state `l` is reached in now.
    #[inline]
    pub(crate) fn alua_state(&self, l: &Lun) -> AluaState {
        AluaState::from_code(self.alua.load(Relaxed)).unwrap_or(l.cfg.port_group.state)
    }

    /// The target port group of `l` as RTPG reports it now.
    pub(crate) fn port_group(&self, l: &Lun) -> PortGroup {
        PortGroup { state: self.alua_state(l), ..l.cfg.port_group }
    }

    /// Set every LUN's asymmetric access state (`None`: back to each one's
    /// configured state) while sessions run. Every nexus gets ASYMMETRIC
    /// ACCESS STATE CHANGED on each LUN whose state changed (SPC-4
    /// 5.16.2.6), so initiators read REPORT TARGET PORT GROUPS again and
    /// move their I/O. Returns whether any LUN's state changed.
    pub fn set_alua_state(&self, state: Option<AluaState>) -> bool {
        let _w = self.mapping.lock().unwrap_or_else(|p| p.into_inner());
        let luns = self.luns.load();
        let before: Vec<AluaState> = luns.iter().map(|l| self.alua_state(l)).collect();
        self.alua.store(state.map_or(NO_ALUA_OVERRIDE, |s| s.code()), Relaxed);
        let mut changed = false;
        for (l, b) in luns.iter().zip(before) {
            if self.alua_state(l) != b {
                l.ua.broadcast(Sense::ASYMMETRIC_ACCESS_STATE_CHANGED);
                changed = true;
            }
        }
        changed
    }

    /// The target port group ids of the LUNs.
    pub fn port_group_ids(&self) -> Vec<u16> {
        let mut ids: Vec<u16> = self.luns.load().iter().map(|l| l.cfg.port_group.id).collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// The initiator port name of a nexus (a made-up one if the transport
    /// gave none).
    pub(crate) fn port_name(&self, nexus: NexusId) -> String {
        let id = self.identity(nexus);
        self.port_names.lock().unwrap_or_else(|p| p.into_inner()).get(&id).cloned().unwrap_or_else(|| reservation::unnamed_port(nexus))
    }

    /// The nexus as a persistent reservation registrant of `l`: its
    /// initiator port and the LU's relative target port.
    pub(crate) fn pr_who(&self, nexus: NexusId, l: &Lun) -> bw_reservation::Who {
        bw_reservation::Who::scsi(&self.port_name(nexus), l.cfg.port_group.relative_port)
    }

    /// The backend of `lun` changed size: re-read it and raise CAPACITY DATA
    /// HAS CHANGED for every nexus. `false` if no such LUN.
    pub fn capacity_changed(&self, lun: u64) -> bool {
        match self.lun(lun) {
            Some(l) => {
                l.blocks.store(l.volume.sectors(), Relaxed);
                l.ua.broadcast(Sense::CAPACITY_CHANGED);
                true
            }
            None => false,
        }
    }

    /// Names of the initiator ports seen so far, by identity.
    #[cfg(test)]
    pub(crate) fn port_names_snapshot(&self) -> HashMap<u64, String> {
        self.port_names.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// REPORT LUNS. LUN 0 is always listed so initiators can probe a target
    /// whose LUN 0 is not mapped (it then answers INQUIRY with qualifier 3).
    pub(crate) fn report_luns(&self, cdb: &[u8], out: &mut Vec<u8>) -> Result<(), Sense> {
        let select = field::REPORT_LUNS_SELECT.get(cdb);
        let alloc = field::REPORT_LUNS_ALLOCATION_LENGTH.get(cdb) as usize;
        if alloc < 16 {
            return Err(Sense::invalid_in_cdb(field::REPORT_LUNS_ALLOCATION_LENGTH));
        }
        out.extend_from_slice(&[0; 8]);
        match select {
            0x00 | 0x02 => {
                let mut numbers = self.luns();
                if numbers.first() != Some(&0) {
                    numbers.insert(0, 0);
                }
                for n in numbers {
                    out.extend_from_slice(&encode_lun(n));
                }
            }
            0x01 => {} // well-known LUNs: none
            _ => return Err(Sense::invalid_in_cdb(field::REPORT_LUNS_SELECT)),
        }
        let len = (out.len() - 8) as u32;
        out[0..4].copy_from_slice(&len.to_be_bytes());
        Ok(())
    }

    /// LUN reset: aborts nothing itself (the transport aborts its tasks),
    /// releases RESERVE(6), returns mode parameters to their defaults and
    /// raises a POWER ON, RESET, OR BUS DEVICE RESET OCCURRED unit attention
    /// for every nexus. `false` if no such LUN.
    pub fn lun_reset(&self, lun: u64) -> bool {
        match self.lun(lun) {
            Some(l) => {
                l.reset();
                true
            }
            None => false,
        }
    }

    /// Target reset: [`ScsiTarget::lun_reset`] on every LUN.
    pub fn target_reset(&self) {
        for l in self.luns.load().iter() {
            l.reset();
        }
    }

    /// The nexus ended (session closed): drop the RESERVE(6) it held and its
    /// pending unit attentions. Persistent reservations survive, as SPC says,
    /// and with them the initiator port's name; an unregistered port's name
    /// is forgotten when its last nexus ends.
    pub fn nexus_gone(&self, nexus: NexusId) {
        let who = self.identity(nexus);
        for l in self.luns.load().iter() {
            l.res.clear_spc2(Some(who));
            l.ua.forget(who);
        }
        self.ports.write().unwrap_or_else(|p| p.into_inner()).remove(&nexus);
        self.forget_unused_names(Some(who));
    }

    /// PERSISTENT RESERVE OUT may have removed registrations (REGISTER with
    /// key 0, CLEAR, PREEMPT), possibly of ports no longer logged in.
    pub(crate) fn registrations_changed(&self) {
        self.forget_unused_names(None);
    }
}

// The transport shares one target between all its sessions and threads.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ScsiTarget>();
};

/// The largest LUN [`encode_lun`] can write (24-bit extended flat space):
/// a configuration may not name a larger one.
pub const MAX_LUN: u64 = 0xFF_FFFF;

/// SAM-5 LUN encoding: peripheral addressing below 256, flat space below
/// 16384, extended flat space up to [`MAX_LUN`].
pub fn encode_lun(lun: u64) -> [u8; 8] {
    debug_assert!(lun <= MAX_LUN, "LUN {lun} has no encoding");
    let mut b = [0u8; 8];
    if lun < 256 {
        b[1] = lun as u8;
    } else if lun < 0x4000 {
        b[0] = 0x40 | (lun >> 8) as u8;
        b[1] = lun as u8;
    } else {
        // Extended flat space addressing (SAM-5 4.7.8), 24-bit.
        b[0] = 0xd2;
        b[1] = (lun >> 16) as u8;
        b[2] = (lun >> 8) as u8;
        b[3] = lun as u8;
    }
    b
}

/// Decode an 8-byte LUN field as [`encode_lun`] writes it (peripheral, flat
/// or extended flat); `None` for other addressing methods.
pub fn decode_lun(b: [u8; 8]) -> Option<u64> {
    match b[0] >> 6 {
        0 if b[0] == 0 => Some(b[1] as u64),
        1 => Some((((b[0] & 0x3f) as u64) << 8) | b[1] as u64),
        3 if b[0] == 0xd2 => Some(((b[1] as u64) << 16) | ((b[2] as u64) << 8) | b[3] as u64),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> ScsiTarget {
        let vol = Volume::open("disk", &bw_block::BackendSpec::ram(64 * 512)).unwrap();
        ScsiTarget::new(vec![(0, vol, LunConfig::for_volume("disk", "iqn.2026-11.test:t", 0))])
    }

    fn pr_out(t: &ScsiTarget, nexus: NexusId, action: u8, key: u64, sa_key: u64) {
        let mut params = [0u8; 24];
        params[0..8].copy_from_slice(&key.to_be_bytes());
        params[8..16].copy_from_slice(&sa_key.to_be_bytes());
        let cdb = [op::PR_OUT, action, 0x01, 0, 0, 0, 0, 0, 24, 0];
        let o = t.execute(nexus, 0, &cdb, &params, &mut Vec::new());
        assert!(o.is_good(), "PR OUT {action} from {nexus}: {o:?}");
    }

    fn names(t: &ScsiTarget) -> Vec<String> {
        let mut v: Vec<String> = t.port_names_snapshot().into_values().collect();
        v.sort();
        v
    }

    /// Initiators choose their names: a name no nexus and no registration
    /// uses must not stay in memory (thousands of logins with long names
    /// grew the table without bound).
    #[test]
    fn names_are_forgotten_when_no_nexus_or_registration_uses_them() {
        let t = target();
        let long = |i: u64| format!("iqn.2026-11.test:{}{i},i,0x400001370000", "x".repeat(8192));
        for i in 0..100 {
            t.set_initiator_name(i, &long(i));
        }
        assert_eq!(names(&t).len(), 100);
        for i in 0..100 {
            t.nexus_gone(i);
        }
        assert_eq!(names(&t).len(), 0, "names kept after every nexus ended");

        // Two sessions of one port: the name stays until the last one ends.
        let port = "iqn.2026-11.test:a,i,0x400001370001";
        t.set_initiator_name(200, port);
        t.set_initiator_name(201, port);
        t.nexus_gone(200);
        assert_eq!(names(&t), vec![port.to_string()]);
        t.nexus_gone(201);
        assert_eq!(names(&t), Vec::<String>::new());

        // A registered port keeps its name after logout (READ FULL STATUS
        // reports it), until its registration is preempted.
        let registered = "iqn.2026-11.test:b,i,0x400001370002";
        let other = "iqn.2026-11.test:c,i,0x400001370003";
        t.set_initiator_name(300, registered);
        pr_out(&t, 300, 0, 0, 0xb);
        t.nexus_gone(300);
        assert_eq!(names(&t), vec![registered.to_string()]);
        t.set_initiator_name(301, other);
        pr_out(&t, 301, 0, 0, 0xc);
        pr_out(&t, 301, 4, 0xc, 0xb); // PREEMPT the logged-out registrant
        assert_eq!(names(&t), vec![other.to_string()]);
        // A logged-in port that unregisters keeps its name while logged in.
        pr_out(&t, 301, 0, 0xc, 0);
        assert_eq!(names(&t), vec![other.to_string()]);
        t.nexus_gone(301);
        assert_eq!(names(&t), Vec::<String>::new());
    }
}

#[cfg(test)]
mod live_tests {
    use super::*;

    fn vol(name: &str) -> Volume {
        Volume::open(name, &bw_block::BackendSpec::ram(64 * 512)).unwrap()
    }

    fn tur(t: &ScsiTarget, nexus: NexusId, lun: u64) -> ScsiOutcome {
        t.execute(nexus, lun, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], &[], &mut Vec::new())
    }

    /// LUNs mapped and unmapped while a nexus is logged in: REPORT LUNS
    /// follows, the LUNs it already used report REPORTED LUNS DATA HAS
    /// CHANGED once, and an unmapped LUN is not supported any more.
    #[test]
    fn luns_added_and_removed_live_raise_reported_luns_changed() {
        let t = ScsiTarget::new(vec![(0, vol("a"), LunConfig::for_volume("a", "iqn.t:t", 0))]);
        assert!(tur(&t, 1, 0).is_good());
        assert!(t.add_lun(1, vol("b"), LunConfig::for_volume("b", "iqn.t:t", 1)));
        assert!(!t.add_lun(1, vol("c"), LunConfig::for_volume("c", "iqn.t:t", 1)), "LUN 1 is taken");
        assert_eq!(t.luns(), [0, 1]);
        assert_eq!(tur(&t, 1, 0), ScsiOutcome::check(Sense::REPORTED_LUNS_CHANGED));
        assert!(tur(&t, 1, 0).is_good());
        assert!(tur(&t, 1, 1).is_good(), "the new LUN has nothing to report");
        assert!(t.remove_lun(0));
        assert!(!t.remove_lun(0));
        assert_eq!(tur(&t, 1, 0), ScsiOutcome::check(Sense::LUN_NOT_SUPPORTED));
        assert_eq!(tur(&t, 1, 1), ScsiOutcome::check(Sense::REPORTED_LUNS_CHANGED));
        let mut d = Vec::new();
        assert!(t.execute(1, 1, &[op::REPORT_LUNS, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], &[], &mut d).is_good());
        assert_eq!(&d[..4], &16u32.to_be_bytes(), "LUN 0 (always listed) and LUN 1");
    }

    /// A connection's [`LunCache`] answers as the table does across live
    /// changes (a LUN unmapped and mapped again at the same number is the
    /// new one, even while a command still holds the old), and keeps no
    /// unmapped LUN, so none of its volumes, alive.
    #[test]
    fn the_lun_cache_follows_live_changes() {
        let cfg = |n: &str, l| LunConfig::for_volume(n, "iqn.t:t", l);
        let t = ScsiTarget::new(vec![(0, vol("a"), cfg("a", 0)), (1, vol("b"), cfg("b", 1))]);
        let tur_cdb = [op::TEST_UNIT_READY, 0, 0, 0, 0, 0];
        let mut c = LunCache::default();
        let name = |c: &mut LunCache, n| t.plan_cached(c, n, &tur_cdb).volume().map(|v| v.name().to_string());
        assert_eq!(name(&mut c, 0).as_deref(), Some("a"));
        assert_eq!(name(&mut c, 0).as_deref(), Some("a"), "from the cache");
        assert_eq!(name(&mut c, 1).as_deref(), Some("b"));
        assert_eq!(name(&mut c, 7), None);
        assert_eq!(name(&mut c, 0).as_deref(), Some("a"));

        // Unmapped and mapped again with another volume while a command
        // still holds the old LUN: the cache must not hand that one out.
        let running = t.plan_cached(&mut c, 0, &tur_cdb);
        assert!(t.remove_lun(0));
        assert!(t.add_lun(0, vol("c"), cfg("c", 0)));
        assert_eq!(name(&mut c, 0).as_deref(), Some("c"), "a LUN mapped again is the new one");
        assert_eq!(running.volume().map(|v| v.name()), Some("a"), "the running command keeps its LUN");
        drop(running);

        // Unmapped while the connection is idle: the cache holds it only
        // weakly, so the LUN (and its volume) is gone at once.
        assert_eq!(name(&mut c, 0).as_deref(), Some("c"));
        assert!(t.remove_lun(0));
        assert_eq!(c.lun.strong_count(), 0, "the cache kept an unmapped LUN alive");
        assert_eq!(name(&mut c, 0), None);
        let mut d = Vec::new();
        let o = t.plan_cached(&mut c, 0, &tur_cdb).execute(1, &[], 0, &mut d).0;
        assert_eq!(o, ScsiOutcome::check(Sense::LUN_NOT_SUPPORTED));
    }
}
