//! Asymmetric Namespace Access (base spec 2.0, 8.1): how good this
//! controller's path to each namespace is. Several gateways export one
//! subsystem (same NQN, serial and namespace ids); each namespace belongs to
//! one ANA group, the same on every gateway, and each gateway reports its
//! own state for that group. The Linux host's native multipath sends I/O to
//! optimized paths and falls back to non-optimized ones.
//!
//! Here: the per-gateway state ([`Ana`]), the ANA log page (LID 0Ch), and
//! the Identify fields that announce ANA support.

use crate::Status;
use num_enum::FromPrimitive;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Arc;

/// ANAGRPMAX and NANAGRPID: group ids 1..=MAX_GROUPS are valid (like Linux
/// nvmet's 128).
pub const MAX_GROUPS: u32 = 128;
/// ANATT: seconds a transition may take.
pub const TRANSITION_TIME_S: u8 = 10;
/// ANACAP: reports optimized, non-optimized, inaccessible, persistent loss
/// and change states; group ids do not change while a namespace is attached
/// (bit 6); non-zero ANAGRPIDs are supported (bit 7).
pub const ANACAP: u8 = 0x1F | 1 << 6 | 1 << 7;
/// CMIC bit 3: ANA reporting supported.
pub const CMIC_ANA: u8 = 1 << 3;
/// OAES bit 11: ANA change notices supported.
pub const OAES_ANA_CHANGE: u32 = 1 << 11;
/// Async event: notice, ANA change (03h), log page 0Ch.
pub const AEN_ANA_CHANGE: u32 = 0x02 | 0x03 << 8 | 0x0C << 16;
/// Asynchronous Event Configuration bit enabling ANA change notices.
pub const AEC_ANA_CHANGE: u32 = 1 << 11;
/// Get Log Page LSP bit 0 for the ANA log: Return Groups Only (no NSIDs).
pub const LSP_RGO: u32 = 1;

/// ANA states (ANAS), as reported in the log page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromPrimitive)]
#[repr(u8)]
pub enum AnaState {
    #[num_enum(default)]
    Optimized = 0x01,
    NonOptimized = 0x02,
    Inaccessible = 0x03,
    PersistentLoss = 0x04,
    Change = 0x0F,
}

impl AnaState {
    /// Status for an I/O command on a namespace in this state (path-related
    /// status type 3h), or None if I/O is allowed. Without DNR: the host is
    /// meant to retry on another path.
    pub fn io_status(self) -> Option<Status> {
        match self {
            AnaState::Optimized | AnaState::NonOptimized => None,
            AnaState::PersistentLoss => Some(Status::ANA_PERSISTENT_LOSS),
            AnaState::Inaccessible => Some(Status::ANA_INACCESSIBLE),
            AnaState::Change => Some(Status::ANA_TRANSITION),
        }
    }
}

/// This gateway's ANA state for a subsystem's groups. Shared by every
/// controller of the subsystem (clones share the state), so a change is
/// seen by all of them at once; `change_count` is CHGCNT of the log page.
/// One state for every group (the configuration's `ana_state`), which
/// `blockwire ctl ana_set` may override group by group at run time.
#[derive(Debug, Clone)]
pub struct Ana {
    state: Arc<AtomicU8>,
    /// Per group id (1..=MAX_GROUPS): 0 follows `state`.
    groups: Arc<[AtomicU8]>,
    change_count: Arc<AtomicU64>,
    /// The state the configuration asks for, to tell a reload that changes
    /// it from one that keeps it (and keeps the run-time state).
    configured: Arc<AtomicU8>,
}

impl Default for Ana {
    fn default() -> Self {
        Ana::new(AnaState::Optimized)
    }
}

impl Ana {
    pub fn new(state: AnaState) -> Ana {
        Ana {
            state: Arc::new(AtomicU8::new(state as u8)),
            groups: (0..=MAX_GROUPS).map(|_| AtomicU8::new(0)).collect(),
            change_count: Arc::new(AtomicU64::new(1)),
            configured: Arc::new(AtomicU8::new(state as u8)),
        }
    }
    /// The state of the groups without a state of their own.
    pub fn state(&self) -> AnaState {
        AnaState::from(self.state.load(Relaxed))
    }
    /// The state of group `group`.
    #[inline]
    pub fn state_of(&self, group: u32) -> AnaState {
        match self.groups.get(group as usize).map(|g| g.load(Relaxed)) {
            Some(0) | None => self.state(),
            Some(s) => AnaState::from(s),
        }
    }
    /// Change the state of every group; true if any group's changed (then
    /// every controller of the subsystem should send an ANA change notice,
    /// see [`crate::Controller::ana_changed`]).
    pub fn set_state(&self, s: AnaState) -> bool {
        let mut changed = self.state.swap(s as u8, Relaxed) != s as u8;
        for g in self.groups.iter() {
            let old = g.swap(0, Relaxed);
            changed |= old != 0 && old != s as u8;
        }
        if changed {
            self.change_count.fetch_add(1, Relaxed);
        }
        changed
    }
    /// Change one group's state; true if it changed. `None` if `group` is
    /// not a group id.
    pub fn set_group_state(&self, group: u32, s: AnaState) -> Option<bool> {
        if group == 0 || group > MAX_GROUPS {
            return None;
        }
        let before = self.state_of(group);
        self.groups[group as usize].store(s as u8, Relaxed);
        let changed = before != s;
        if changed {
            self.change_count.fetch_add(1, Relaxed);
        }
        Some(changed)
    }
    pub fn change_count(&self) -> u64 {
        self.change_count.load(Relaxed)
    }
    /// The state the configuration gave.
    pub fn configured(&self) -> AnaState {
        AnaState::from(self.configured.load(Relaxed))
    }
    /// A new configuration gives `s`: true if that differs from the one
    /// before (the caller then applies it with [`Ana::set_state`]).
    pub fn reconfigure(&self, s: AnaState) -> bool {
        self.configured.swap(s as u8, Relaxed) != s as u8
    }
}

/// The ANA log page of `ana` for namespaces `members` (NSID, ANA group
/// each; `Subsystem::ana_log_page` gives a subsystem's): a 16-byte header
/// (CHGCNT, NGRPS), then one 32-byte descriptor per group in use
/// (ANAGRPID, NNSID, CHGCNT, ANAS) followed by its NSIDs unless
/// `groups_only` (RGO). Zero-padded to the largest size the Identify
/// fields allow (16 + NANAGRPID * 32 + MNAN * 4): hosts size their reads
/// by it, and nvme-cli reads it in 4 KiB pieces, so a read at an offset
/// past the groups in use must still find the page there.
pub fn log_page(ana: &Ana, members: &[(u32, u32)], groups_only: bool) -> Vec<u8> {
    let mut b = log_page_used(ana, members, groups_only);
    let max = 16 + MAX_GROUPS as usize * 32 + if groups_only { 0 } else { 4 * members.len() };
    b.resize(b.len().max(max), 0);
    b
}

/// ANA log page fields: the header, then 32-byte group descriptors, each
/// followed by its NSIDs.
mod field {
    use bw_wire::{Field, Le};

    pub const CHGCNT: Field<Le<u64>> = Field::at(0);
    pub const NGRPS: Field<Le<u16>> = Field::at(8);
    pub const HEADER_LEN: usize = 16;
    // One group descriptor.
    pub const GRPID: Field<Le<u32>> = Field::at(0);
    pub const NNSIDS: Field<Le<u32>> = Field::at(4);
    pub const GROUP_CHGCNT: Field<Le<u64>> = Field::at(8);
    pub const ANAS: Field<u8> = Field::at(16);
    pub const DESCRIPTOR_LEN: usize = 32;
    pub const NSID: Field<Le<u32>> = Field::at(0);
}

fn log_page_used(ana: &Ana, members: &[(u32, u32)], groups_only: bool) -> Vec<u8> {
    let mut groups: Vec<u32> = members.iter().map(|&(_, group)| group).collect();
    groups.sort_unstable();
    groups.dedup();
    let chg = ana.change_count();
    let mut b = vec![0u8; field::HEADER_LEN];
    field::CHGCNT.set(&mut b, chg);
    field::NGRPS.set(&mut b, groups.len() as u16);
    for g in groups {
        let mut nsids: Vec<u32> = members.iter().filter(|&&(_, group)| group == g).map(|&(nsid, _)| nsid).collect();
        nsids.sort_unstable();
        let o = b.len();
        b.resize(o + field::DESCRIPTOR_LEN, 0);
        let d = &mut b[o..];
        field::GRPID.set(d, g);
        field::NNSIDS.set(d, if groups_only { 0 } else { nsids.len() as u32 });
        field::GROUP_CHGCNT.set(d, chg);
        field::ANAS.set(d, ana.state_of(g) as u8);
        if !groups_only {
            for id in nsids {
                let o = b.len();
                b.resize(o + 4, 0);
                field::NSID.set(&mut b[o..], id);
            }
        }
    }
    b
}

/// One group descriptor as a host reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDesc {
    pub group: u32,
    pub state: u8,
    pub nsids: Vec<u32>,
}

/// Parse an ANA log page: (CHGCNT, groups). None if it is cut short.
pub fn parse_log(b: &[u8]) -> Option<(u64, Vec<GroupDesc>)> {
    let chg = field::CHGCNT.try_get(b)?;
    let n = field::NGRPS.try_get(b)?;
    let mut o = field::HEADER_LEN;
    let mut out = Vec::new();
    for _ in 0..n {
        let d = b.get(o..o + field::DESCRIPTOR_LEN)?;
        let group = field::GRPID.get(d);
        let nn = field::NNSIDS.get(d) as usize;
        let state = field::ANAS.get(d) & 0x0F;
        o += field::DESCRIPTOR_LEN;
        let mut nsids = Vec::with_capacity(nn.min(1024));
        for _ in 0..nn {
            nsids.push(field::NSID.try_get(b.get(o..)?)?);
            o += 4;
        }
        out.push(GroupDesc { group, state, nsids });
    }
    Some((chg, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Namespaces 1 and 2 in group 1, 3 in group 7.
    const MEMBERS: [(u32, u32); 3] = [(1, 1), (3, 7), (2, 1)];

    #[test]
    fn log_page_lists_groups_with_their_namespaces() {
        let ana = Ana::new(AnaState::NonOptimized);
        let b = log_page(&ana, &MEMBERS, false);
        // Header + group 1 (two NSIDs) + group 7 (one NSID), then zeroes
        // up to the largest page the Identify fields allow.
        assert_eq!(log_page_used(&ana, &MEMBERS, false).len(), 16 + 32 + 8 + 32 + 4);
        assert_eq!(b.len(), 16 + 128 * 32 + 3 * 4);
        assert!(b[16 + 32 + 8 + 32 + 4..].iter().all(|&x| x == 0));
        assert_eq!(&b[8..10], &[2, 0]);
        let (chg, groups) = parse_log(&b).unwrap();
        assert_eq!(chg, 1);
        assert_eq!(
            groups,
            vec![GroupDesc { group: 1, state: 2, nsids: vec![1, 2] }, GroupDesc { group: 7, state: 2, nsids: vec![3] }]
        );
        let rgo = log_page(&ana, &MEMBERS, true);
        assert_eq!((log_page_used(&ana, &MEMBERS, true).len(), rgo.len()), (16 + 64, 16 + 128 * 32));
        assert_eq!(parse_log(&rgo).unwrap().1[1], GroupDesc { group: 7, state: 2, nsids: vec![] });
    }

    #[test]
    fn state_changes_bump_the_change_count_once() {
        let ana = Ana::default();
        assert_eq!(ana.state(), AnaState::Optimized);
        assert!(ana.set_state(AnaState::Inaccessible));
        assert!(!ana.set_state(AnaState::Inaccessible));
        assert_eq!(ana.change_count(), 2);
        let (chg, groups) = parse_log(&log_page(&ana, &MEMBERS, false)).unwrap();
        assert_eq!((chg, groups[0].state), (2, 3));
        assert_eq!(AnaState::Inaccessible.io_status(), Some(Status::ANA_INACCESSIBLE));
        assert_eq!(AnaState::NonOptimized.io_status(), None);
        // One group moved on its own; setting every group clears that.
        assert_eq!(ana.set_group_state(7, AnaState::Optimized), Some(true));
        assert_eq!(ana.set_group_state(7, AnaState::Optimized), Some(false));
        assert_eq!(ana.set_group_state(0, AnaState::Optimized), None);
        let (chg, groups) = parse_log(&log_page(&ana, &MEMBERS, false)).unwrap();
        assert_eq!((chg, groups[0].state, groups[1].group, groups[1].state), (3, 3, 7, 1));
        assert!(ana.set_state(AnaState::Inaccessible), "group 7 changes back");
        assert_eq!(ana.state_of(7), AnaState::Inaccessible);
        // Notice type 2, information 03h (ANA change), log page 0Ch.
        assert_eq!(AEN_ANA_CHANGE, 0x000C_0302);
    }
}
