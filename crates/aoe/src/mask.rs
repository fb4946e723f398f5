//! MAC Mask List argument (offset 24): reserved, mcmd (0 read, 1 edit),
//! merror, directive count (u8), then 8-byte directives: reserved, dcmd
//! (0 no-op, 1 add, 2 delete), MAC.

use crate::frame::Mac;
use crate::{need, need_out, WireError, HEADER_LEN};
use num_enum::{FromPrimitive, IntoPrimitive};

pub const MASK_ARG_LEN: usize = 4;
pub const DIRECTIVE_LEN: usize = 8;

/// The argument's fields at their offsets in the frame, and a directive's
/// within the directive, each defined once for parsing and encoding.
pub mod field {
    use bw_wire::Field;
    pub const RESERVED: Field<u8> = Field::at(24);
    pub const MCMD: Field<u8> = Field::at(25);
    pub const MERROR: Field<u8> = Field::at(26);
    pub const DIRECTIVE_COUNT: Field<u8> = Field::at(27);
    /// In a directive.
    pub const DIRECTIVE_RESERVED: Field<u8> = Field::at(0);
    pub const DCMD: Field<u8> = Field::at(1);
    pub const DIRECTIVE_MAC: Field<[u8; 6]> = Field::at(2);
    const _: () = assert!(RESERVED.offset() == crate::HEADER_LEN && DIRECTIVE_COUNT.end() == crate::HEADER_LEN + super::MASK_ARG_LEN);
    const _: () = assert!(DIRECTIVE_MAC.end() == super::DIRECTIVE_LEN);
}

pub const MCMD_READ: u8 = 0;
pub const MCMD_EDIT: u8 = 1;

pub const MERROR_NONE: u8 = 0;
pub const MERROR_UNSPECIFIED: u8 = 1;
pub const MERROR_BAD_DIRECTIVE: u8 = 2;
pub const MERROR_LIST_FULL: u8 = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq, FromPrimitive, IntoPrimitive)]
#[repr(u8)]
pub enum DirectiveCommand {
    Nop = 0,
    Add = 1,
    Delete = 2,
    #[num_enum(catch_all)]
    Other(u8),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Directive {
    pub command: DirectiveCommand,
    pub mac: Mac,
}

/// A MAC Mask List argument viewed over a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaskList<'a> {
    pub mcmd: u8,
    pub merror: u8,
    directives: &'a [u8],
}

impl<'a> MaskList<'a> {
    /// Decode from a whole frame; every announced directive must be present.
    pub fn parse(frame: &'a [u8]) -> Result<Self, WireError> {
        need(frame, HEADER_LEN + MASK_ARG_LEN)?;
        let count = field::DIRECTIVE_COUNT.get(frame) as usize;
        let start = HEADER_LEN + MASK_ARG_LEN;
        need(frame, start + count * DIRECTIVE_LEN)?;
        Ok(MaskList {
            mcmd: field::MCMD.get(frame),
            merror: field::MERROR.get(frame),
            directives: &frame[start..start + count * DIRECTIVE_LEN],
        })
    }

    pub fn len(&self) -> usize {
        self.directives.len() / DIRECTIVE_LEN
    }
    pub fn is_empty(&self) -> bool {
        self.directives.is_empty()
    }

    pub fn directives(&self) -> impl Iterator<Item = Directive> + 'a {
        self.directives
            .chunks_exact(DIRECTIVE_LEN)
            .map(|d| Directive { command: DirectiveCommand::from(field::DCMD.get(d)), mac: field::DIRECTIVE_MAC.get(d) })
    }
}

/// Encode a mask argument with `directives` after the header in `frame`;
/// returns the frame length.
pub fn encode(frame: &mut [u8], mcmd: u8, merror: u8, directives: &[Directive]) -> Result<usize, WireError> {
    if directives.len() > 255 {
        return Err(WireError::BadArg("more than 255 directives"));
    }
    let end = HEADER_LEN + MASK_ARG_LEN + directives.len() * DIRECTIVE_LEN;
    need_out(frame, end)?;
    field::RESERVED.set(frame, 0);
    field::MCMD.set(frame, mcmd);
    field::MERROR.set(frame, merror);
    field::DIRECTIVE_COUNT.set(frame, directives.len() as u8);
    for (d, out) in directives.iter().zip(frame[HEADER_LEN + MASK_ARG_LEN..end].chunks_exact_mut(DIRECTIVE_LEN)) {
        field::DIRECTIVE_RESERVED.set(out, 0);
        field::DCMD.set(out, d.command.into());
        field::DIRECTIVE_MAC.set(out, d.mac);
    }
    Ok(end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn decodes_an_edit_byte_vector() {
        let mut f = vec![0u8; 24];
        f.extend_from_slice(&[0, 1, 0, 2]);
        f.extend_from_slice(&[0, 1, 2, 0, 0, 0, 0, 0xAA]);
        f.extend_from_slice(&[0, 2, 2, 0, 0, 0, 0, 0xBB]);
        let m = MaskList::parse(&f).unwrap();
        assert_eq!(m.mcmd, MCMD_EDIT);
        let d: Vec<_> = m.directives().collect();
        assert_eq!(d[0], Directive { command: DirectiveCommand::Add, mac: [2, 0, 0, 0, 0, 0xAA] });
        assert_eq!(d[1], Directive { command: DirectiveCommand::Delete, mac: [2, 0, 0, 0, 0, 0xBB] });
        let mut out = vec![0u8; 64];
        let n = encode(&mut out, MCMD_EDIT, 0, &d).unwrap();
        assert_eq!(&out[24..n], &f[24..]);
        // Count says 3, only 2 present.
        f[27] = 3;
        assert!(MaskList::parse(&f).is_err());
    }

    proptest! {
        #[test]
        fn round_trips(mcmd in any::<u8>(), merror in any::<u8>(), ds in proptest::collection::vec((any::<u8>(), any::<[u8;6]>()), 0..40)) {
            let ds: Vec<Directive> = ds.into_iter().map(|(c, mac)| Directive { command: DirectiveCommand::from(c), mac }).collect();
            let mut buf = vec![0u8; 24 + 4 + 8 * 40];
            let n = encode(&mut buf, mcmd, merror, &ds).unwrap();
            let m = MaskList::parse(&buf[..n]).unwrap();
            prop_assert_eq!((m.mcmd, m.merror), (mcmd, merror));
            prop_assert_eq!(m.directives().collect::<Vec<_>>(), ds);
        }
    }
}
