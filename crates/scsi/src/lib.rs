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
//! reservations) lives here, keyed by that id.

use bw_block::Volume;

/// One per I_T nexus (an iSCSI session), assigned by the transport. Ids must
/// not be reused while the nexus is alive; call [`ScsiTarget::nexus_gone`]
/// when it ends.
pub type NexusId = u64;

/// SCSI status codes (SAM-5) a command can complete with.
pub mod status {
    pub const GOOD: u8 = 0x00;
    pub const CHECK_CONDITION: u8 = 0x02;
    pub const BUSY: u8 = 0x08;
    pub const RESERVATION_CONFLICT: u8 = 0x18;
    pub const TASK_SET_FULL: u8 = 0x28;
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

mod ident;

/// All logical units of one target; `Send + Sync`, share it with `Arc`.
pub struct ScsiTarget {
    luns: Vec<(u64, Volume, LunConfig)>,
}

impl ScsiTarget {
    /// Build a target from `(lun number, volume, config)` triples.
    pub fn new(luns: Vec<(u64, Volume, LunConfig)>) -> Self {
        ScsiTarget { luns }
    }

    /// The mapped LUN numbers, ascending.
    pub fn luns(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.luns.iter().map(|l| l.0).collect();
        v.sort_unstable();
        v
    }

    /// Execute one command.
    ///
    /// `data_out` is the data the initiator sent; it may be shorter or longer
    /// than the CDB asks for (the command then fails or ignores the excess as
    /// SPC/SBC say). `data_in` is cleared and filled with the full data the
    /// command produces; the transport truncates it to the expected transfer
    /// length and computes residuals.
    pub fn execute(&self, nexus: NexusId, lun: u64, cdb: &[u8], data_out: &[u8], data_in: &mut Vec<u8>) -> ScsiOutcome {
        let _ = (nexus, lun, cdb, data_out);
        data_in.clear();
        ScsiOutcome::GOOD
    }

    /// How many data-out bytes this CDB transfers (so the transport can
    /// solicit them), or `None` if it is not a data-out command.
    pub fn data_out_len(&self, lun: u64, cdb: &[u8]) -> Option<usize> {
        let _ = (lun, cdb);
        None
    }

    /// LUN reset: aborts nothing itself (the transport aborts its tasks),
    /// releases RESERVE(6) and raises a POWER ON, RESET, OR BUS DEVICE RESET
    /// OCCURRED unit attention for every nexus. `false` if no such LUN.
    pub fn lun_reset(&self, lun: u64) -> bool {
        self.luns.iter().any(|l| l.0 == lun)
    }

    /// Target reset: [`ScsiTarget::lun_reset`] on every LUN.
    pub fn target_reset(&self) {}

    /// The nexus ended (session closed): drop the RESERVE(6) it held and its
    /// pending unit attentions. Persistent reservations survive, as SPC says.
    pub fn nexus_gone(&self, nexus: NexusId) {
        let _ = nexus;
    }
}
