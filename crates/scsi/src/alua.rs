//! Implicit ALUA (SPC-4 5.16): the TPGS bits of INQUIRY, the target port
//! group designator of VPD 0x83 and REPORT TARGET PORT GROUPS (MAINTENANCE
//! IN / 0x0A). One target port group per target by default, in the
//! active/optimized state; the group id and state come from configuration
//! so several gateways exporting one volume can tell initiators which path
//! to prefer. Transitions are the configuration's or the operator's
//! (`blockwire ctl tpg_set`, `drain`: [`crate::ScsiTarget::set_alua_state`]
//! raises ASYMMETRIC ACCESS STATE CHANGED), never the initiator's (SET
//! TARGET PORT GROUPS is not implemented: implicit ALUA only).

use crate::cdb::field;
use crate::sense::Sense;

/// Which asymmetric access states let the command run (SPC-4 5.16.2.4):
/// in standby and unavailable only what inspects the LU or its paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AluaAccess {
    /// Runs in every state.
    Always,
    /// Runs in the active states and standby (persistent reservations).
    UpToStandby,
    /// Runs in the active states only (medium access and the rest).
    ActiveOnly,
}

/// Asymmetric access states (SPC-4 table 172).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AluaState {
    #[default]
    ActiveOptimized,
    ActiveNonOptimized,
    Standby,
    Unavailable,
}

impl AluaState {
    pub fn code(self) -> u8 {
        match self {
            AluaState::ActiveOptimized => 0x0,
            AluaState::ActiveNonOptimized => 0x1,
            AluaState::Standby => 0x2,
            AluaState::Unavailable => 0x3,
        }
    }

    /// The state with asymmetric access state code `c`.
    pub fn from_code(c: u8) -> Option<AluaState> {
        match c {
            0x0 => Some(AluaState::ActiveOptimized),
            0x1 => Some(AluaState::ActiveNonOptimized),
            0x2 => Some(AluaState::Standby),
            0x3 => Some(AluaState::Unavailable),
            _ => None,
        }
    }

    /// The sense for a medium access refused in this state (SPC-4 5.16.2.4),
    /// `None` when access is allowed.
    pub fn refusal(self) -> Option<Sense> {
        match self {
            AluaState::ActiveOptimized | AluaState::ActiveNonOptimized => None,
            AluaState::Standby => Some(Sense::new(crate::sense::key::NOT_READY, 0x04, 0x0b)),
            AluaState::Unavailable => Some(Sense::new(crate::sense::key::NOT_READY, 0x04, 0x0c)),
        }
    }
}

/// Whether a command with ALUA access class `access` (from its row) may
/// run in `state` (SPC-4 5.16.2.4.4-5): in standby and unavailable only the
/// commands that inspect the LU or its paths (and, in standby, persistent
/// reservations) run; the rest get NOT READY.
pub fn permits(state: AluaState, access: AluaAccess) -> Result<(), Sense> {
    let Some(refusal) = state.refusal() else { return Ok(()) };
    match access {
        AluaAccess::Always => Ok(()),
        AluaAccess::UpToStandby if state == AluaState::Standby => Ok(()),
        _ => Err(refusal),
    }
}

/// The target port group a LUN is reached through, and the one target
/// port (this gateway's portals) in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortGroup {
    pub id: u16,
    pub state: AluaState,
    /// Relative target port identifier (VPD 0x83, RTPG). Gateways that
    /// export one LU use distinct ones: a host tells the paths' ports apart
    /// by it (SPC-4 4.3.5.8: unique within the SCSI target device).
    pub relative_port: u16,
}

impl Default for PortGroup {
    fn default() -> Self {
        PortGroup { id: 1, state: AluaState::ActiveOptimized, relative_port: 1 }
    }
}

/// Standard INQUIRY byte 5 TPGS field: implicit asymmetric access only.
pub const TPGS_IMPLICIT: u8 = 0x10;
/// REPORT TARGET PORT GROUPS: one group with one port.
pub fn report_target_port_groups(group: PortGroup, cdb: &[u8], out: &mut Vec<u8>) -> Result<(), Sense> {
    let extended = match field::RTPG_DATA_FORMAT.get(cdb) {
        0 => false,
        1 => true,
        _ => return Err(Sense::invalid_in_cdb(field::RTPG_DATA_FORMAT)),
    };
    out.extend_from_slice(&[0; 4]);
    if extended {
        // Format 1, implicit transition time unknown (0).
        out.extend_from_slice(&[0x10, 0, 0, 0]);
    }
    // PREF=0, state; supported states: T/O/LBD not, U S AN AO yes.
    out.push(group.state.code());
    out.push(0x0f);
    out.extend_from_slice(&group.id.to_be_bytes());
    out.extend_from_slice(&[0, 0x02, 0, 1]); // status: altered by implicit behaviour; one port
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&group.relative_port.to_be_bytes());
    // RETURN DATA LENGTH: the bytes after the first four.
    let len = (out.len() - 4) as u32;
    out[..4].copy_from_slice(&len.to_be_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_group_with_one_port() {
        let g = PortGroup { id: 0x0102, state: AluaState::Standby, relative_port: 3 };
        let mut out = Vec::new();
        report_target_port_groups(g, &[0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], &mut out).unwrap();
        assert_eq!(out, vec![0, 0, 0, 12, 0x02, 0x0f, 0x01, 0x02, 0, 0x02, 0, 1, 0, 0, 0, 3]);
        out.clear();
        report_target_port_groups(PortGroup::default(), &[0xa3, 0x2a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], &mut out)
            .unwrap();
        assert_eq!(out, vec![0, 0, 0, 16, 0x10, 0, 0, 0, 0x00, 0x0f, 0, 1, 0, 0x02, 0, 1, 0, 0, 0, 1]);
        out.clear();
        assert_eq!(
            report_target_port_groups(PortGroup::default(), &[0xa3, 0x4a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], &mut out),
            // PARAMETER DATA FORMAT is bits 7:5; the pointer names its first bit.
            Err(Sense::invalid_cdb_field(1, Some(7)))
        );
    }

    #[test]
    fn states_gate_media_access() {
        assert_eq!(AluaState::ActiveNonOptimized.refusal(), None);
        assert_eq!(AluaState::Unavailable.refusal(), Some(Sense::new(2, 0x04, 0x0c)));
        // The classes of READ(10), PERSISTENT RESERVE IN and REPORT TARGET
        // PORT GROUPS (the command table's test checks the rows have them).
        let (read10, pr_in, rtpg) = (AluaAccess::ActiveOnly, AluaAccess::UpToStandby, AluaAccess::Always);
        assert_eq!(permits(AluaState::Standby, read10), Err(Sense::new(2, 0x04, 0x0b)));
        assert_eq!(permits(AluaState::Standby, pr_in), Ok(()));
        assert_eq!(permits(AluaState::Unavailable, pr_in), Err(Sense::new(2, 0x04, 0x0c)));
        assert_eq!(permits(AluaState::Unavailable, rtpg), Ok(()));
        assert_eq!(permits(AluaState::ActiveNonOptimized, read10), Ok(()));
    }
}
