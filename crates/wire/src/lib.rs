//! Header fields at fixed offsets, each defined once and used for both
//! reading and writing.
//!
//! A wire format declares its fields as constants, `const ITT: Field<u32> =
//! Field::at(16);`, and its decoder and encoder both go through them
//! (`ITT.get(hdr)`, `ITT.set(hdr, v)`), so an offset cannot be read at one
//! place and written at another. Multi-byte integers are big-endian
//! (network order) as in every protocol blockwire speaks except NVMe, whose
//! little-endian fields are `Field<Le<u32>>` and the like.
//!
//! Why not zerocopy or binary-layout: those describe one layout per struct,
//! but an iSCSI BHS or a SCSI CDB is one byte array whose layout depends on
//! its opcode, and the typed messages that already exist would need a
//! second struct per opcode plus conversions. A field constant keeps the
//! existing typed messages and adds one definition per offset.
//!
//! Accessors index the slice directly: callers check the header length once
//! (every format here has a fixed header) and an out-of-range field is a
//! bug in the format's definition, caught by its tests.

pub mod crc32c;

use std::marker::PhantomData;

/// How a field's bytes map to a value.
pub trait Codec {
    type Value: Copy;
    /// Bytes the field occupies.
    const LEN: usize;
    fn read(b: &[u8]) -> Self::Value;
    fn write(b: &mut [u8], v: Self::Value);
}

/// One integer codec per (field type, value type) pair, in the byte order
/// the conversion functions name.
macro_rules! int_codec {
    ($from:ident, $to:ident: $($codec:ty => $t:ty),*) => {$(
        impl Codec for $codec {
            type Value = $t;
            const LEN: usize = std::mem::size_of::<$t>();
            #[inline]
            fn read(b: &[u8]) -> $t {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(&b[..Self::LEN]);
                <$t>::$from(a)
            }
            #[inline]
            fn write(b: &mut [u8], v: $t) {
                b[..Self::LEN].copy_from_slice(&v.$to());
            }
        }
    )*};
}
int_codec!(from_be_bytes, to_be_bytes: u8 => u8, u16 => u16, u32 => u32, u64 => u64);

/// A little-endian integer field (`Field<Le<u32>>` reads a `u32`).
pub struct Le<T>(PhantomData<T>);

int_codec!(from_le_bytes, to_le_bytes: Le<u16> => u16, Le<u32> => u32, Le<u64> => u64);

/// A 24-bit big-endian integer, read as a `u32` (the high byte of a written
/// value is dropped).
pub struct U24;

impl Codec for U24 {
    type Value = u32;
    const LEN: usize = 3;
    #[inline]
    fn read(b: &[u8]) -> u32 {
        u32::from_be_bytes([0, b[0], b[1], b[2]])
    }
    #[inline]
    fn write(b: &mut [u8], v: u32) {
        b[..3].copy_from_slice(&v.to_be_bytes()[1..]);
    }
}

/// A run of `N` raw bytes (a MAC address, an ISID, a CDB).
impl<const N: usize> Codec for [u8; N] {
    type Value = [u8; N];
    const LEN: usize = N;
    #[inline]
    fn read(b: &[u8]) -> [u8; N] {
        let mut a = [0u8; N];
        a.copy_from_slice(&b[..N]);
        a
    }
    #[inline]
    fn write(b: &mut [u8], v: [u8; N]) {
        b[..N].copy_from_slice(&v);
    }
}

/// A field of type `C` at byte offset `at`.
pub struct Field<C> {
    at: usize,
    _c: PhantomData<fn() -> C>,
}

impl<C> Clone for Field<C> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<C> Copy for Field<C> {}

impl<C: Codec> Field<C> {
    pub const fn at(at: usize) -> Self {
        Field {
            at,
            _c: PhantomData,
        }
    }
    /// First byte of the field.
    pub const fn offset(self) -> usize {
        self.at
    }
    /// One past its last byte: the header must be at least this long.
    pub const fn end(self) -> usize {
        self.at + C::LEN
    }
    /// The field's value in `b`. Panics if `b` is shorter than [`Field::end`].
    #[inline]
    pub fn get(self, b: &[u8]) -> C::Value {
        C::read(&b[self.at..])
    }
    /// The value, or `None` if `b` is too short to hold the field.
    #[inline]
    pub fn try_get(self, b: &[u8]) -> Option<C::Value> {
        (b.len() >= self.end()).then(|| self.get(b))
    }
    /// Write `v` into `b`. Panics if `b` is shorter than [`Field::end`].
    #[inline]
    pub fn set(self, b: &mut [u8], v: C::Value) {
        C::write(&mut b[self.at..], v)
    }
}

/// Some bits of the byte at `at`: `mask` says which; values are shifted
/// down to start at bit 0 (a mask of 0x0c reads 0..=3).
#[derive(Clone, Copy)]
pub struct Bits {
    at: usize,
    mask: u8,
}

impl Bits {
    pub const fn at(at: usize, mask: u8) -> Self {
        assert!(mask != 0, "a bit field needs at least one bit");
        Bits { at, mask }
    }
    pub const fn offset(self) -> usize {
        self.at
    }
    pub const fn mask(self) -> u8 {
        self.mask
    }
    #[inline]
    pub fn get(self, b: &[u8]) -> u8 {
        (b[self.at] & self.mask) >> self.mask.trailing_zeros()
    }
    /// The value, or `None` if `b` is too short to hold the field.
    #[inline]
    pub fn try_get(self, b: &[u8]) -> Option<u8> {
        (b.len() > self.at).then(|| self.get(b))
    }
    /// Replace the bits (other bits of the byte are kept); `v` is cut to
    /// the field's width.
    #[inline]
    pub fn set(self, b: &mut [u8], v: u8) {
        let v = (v << self.mask.trailing_zeros()) & self.mask;
        b[self.at] = (b[self.at] & !self.mask) | v;
    }
}

/// One bit: a [`Bits`] read and written as `bool`.
#[derive(Clone, Copy)]
pub struct Flag(Bits);

impl Flag {
    pub const fn at(at: usize, bit: u8) -> Self {
        assert!(bit.count_ones() == 1, "a flag is one bit");
        Flag(Bits::at(at, bit))
    }
    pub const fn offset(self) -> usize {
        self.0.at
    }
    /// The bit as a mask of its byte.
    pub const fn bit(self) -> u8 {
        self.0.mask
    }
    #[inline]
    pub fn get(self, b: &[u8]) -> bool {
        b[self.0.at] & self.0.mask != 0
    }
    #[inline]
    pub fn set(self, b: &mut [u8], on: bool) {
        self.0.set(b, on as u8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_are_big_endian_and_round_trip() {
        let mut b = [0u8; 18];
        const A: Field<u16> = Field::at(1);
        const B: Field<u32> = Field::at(3);
        const C: Field<u64> = Field::at(7);
        const D: Field<U24> = Field::at(15);
        A.set(&mut b, 0x0102);
        B.set(&mut b, 0x0304_0506);
        C.set(&mut b, 0x0708_090a_0b0c_0d0e);
        D.set(&mut b, 0xff0f_1011); // the high byte does not fit
        assert_eq!(
            b,
            [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0xa, 0xb, 0xc, 0xd, 0xe, 0xf, 0x10, 0x11]
        );
        assert_eq!(
            (A.get(&b), B.get(&b), C.get(&b), D.get(&b)),
            (0x0102, 0x0304_0506, 0x0708_090a_0b0c_0d0e, 0x0f_1011)
        );
        assert_eq!(D.end(), 18);
        assert_eq!(C.try_get(&b[..14]), None);
        assert_eq!(C.try_get(&b[..15]), Some(0x0708_090a_0b0c_0d0e));
    }

    #[test]
    fn little_endian() {
        const PLEN: Field<Le<u32>> = Field::at(4);
        let mut b = [0u8; 8];
        PLEN.set(&mut b, 0x0102_0304);
        assert_eq!(b, [0, 0, 0, 0, 4, 3, 2, 1]);
        assert_eq!(PLEN.get(&b), 0x0102_0304);
    }

    #[test]
    fn byte_arrays() {
        const MAC: Field<[u8; 6]> = Field::at(6);
        let mut b = [0u8; 12];
        MAC.set(&mut b, [1, 2, 3, 4, 5, 6]);
        assert_eq!(&b[6..], &[1, 2, 3, 4, 5, 6]);
        assert_eq!(MAC.get(&b), [1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn bits_keep_their_neighbours() {
        const CSG: Bits = Bits::at(0, 0x0c);
        const NSG: Bits = Bits::at(0, 0x03);
        const T: Flag = Flag::at(0, 0x80);
        let mut b = [0u8; 1];
        T.set(&mut b, true);
        CSG.set(&mut b, 1);
        NSG.set(&mut b, 3);
        assert_eq!(b[0], 0x87);
        assert_eq!((T.get(&b), CSG.get(&b), NSG.get(&b)), (true, 1, 3));
        CSG.set(&mut b, 0xff); // cut to two bits
        assert_eq!(b[0], 0x8f);
        T.set(&mut b, false);
        assert_eq!(b[0], 0x0f);
    }
}
