//! Reserve/Release argument (offset 24): rcmd (0 read, 1 set, 2 force set),
//! number of MACs (u8), then the MACs.

use crate::frame::{mac_at, Mac};
use crate::{need, need_out, WireError, HEADER_LEN};

pub const RR_ARG_LEN: usize = 2;

/// The argument's fields at their offsets in the frame, each defined once
/// for [`ReserveRelease::parse`] and [`encode`].
pub mod field {
    use bw_wire::Field;
    pub const RCMD: Field<u8> = Field::at(24);
    pub const MAC_COUNT: Field<u8> = Field::at(25);
    const _: () = assert!(RCMD.offset() == crate::HEADER_LEN && MAC_COUNT.end() == crate::HEADER_LEN + super::RR_ARG_LEN);
}

pub const RCMD_READ: u8 = 0;
/// Set the list only if the requester is already on it (or it is empty).
pub const RCMD_SET: u8 = 1;
/// Set the list unconditionally.
pub const RCMD_FORCE_SET: u8 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReserveRelease<'a> {
    pub rcmd: u8,
    macs: &'a [u8],
}

impl<'a> ReserveRelease<'a> {
    /// Decode from a whole frame; every announced MAC must be present.
    pub fn parse(frame: &'a [u8]) -> Result<Self, WireError> {
        need(frame, HEADER_LEN + RR_ARG_LEN)?;
        let n = field::MAC_COUNT.get(frame) as usize;
        let start = HEADER_LEN + RR_ARG_LEN;
        need(frame, start + 6 * n)?;
        Ok(ReserveRelease { rcmd: field::RCMD.get(frame), macs: &frame[start..start + 6 * n] })
    }
    pub fn len(&self) -> usize {
        self.macs.len() / 6
    }
    pub fn is_empty(&self) -> bool {
        self.macs.is_empty()
    }
    pub fn macs(&self) -> impl Iterator<Item = Mac> + 'a {
        self.macs.chunks_exact(6).map(|m| mac_at(m, 0))
    }
}

/// Encode after the header in `frame`; returns the frame length.
pub fn encode(frame: &mut [u8], rcmd: u8, macs: &[Mac]) -> Result<usize, WireError> {
    if macs.len() > 255 {
        return Err(WireError::BadArg("more than 255 MACs"));
    }
    let end = HEADER_LEN + RR_ARG_LEN + 6 * macs.len();
    need_out(frame, end)?;
    field::RCMD.set(frame, rcmd);
    field::MAC_COUNT.set(frame, macs.len() as u8);
    for (m, out) in macs.iter().zip(frame[HEADER_LEN + RR_ARG_LEN..end].chunks_exact_mut(6)) {
        out.copy_from_slice(m);
    }
    Ok(end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn decodes_a_set_byte_vector() {
        let mut f = vec![0u8; 24];
        f.extend_from_slice(&[1, 2, 2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2]);
        let r = ReserveRelease::parse(&f).unwrap();
        assert_eq!(r.rcmd, RCMD_SET);
        assert_eq!(r.macs().collect::<Vec<_>>(), vec![[2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]]);
        f.pop();
        assert!(ReserveRelease::parse(&f).is_err());
        assert!(ReserveRelease::parse(&f[..25]).is_err());
    }

    proptest! {
        #[test]
        fn round_trips(rcmd in any::<u8>(), macs in proptest::collection::vec(any::<[u8;6]>(), 0..50)) {
            let mut buf = vec![0u8; 24 + 2 + 6 * 50];
            let n = encode(&mut buf, rcmd, &macs).unwrap();
            let r = ReserveRelease::parse(&buf[..n]).unwrap();
            prop_assert_eq!(r.rcmd, rcmd);
            prop_assert_eq!(r.macs().collect::<Vec<_>>(), macs);
        }
    }
}
