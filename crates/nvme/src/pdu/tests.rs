//! Byte vectors for every PDU type and round-trip properties.

use super::*;
use crate::queue_entry::{sgl, Sgl};
use crate::Status;
use proptest::prelude::*;

const NONE: Digests = Digests { header: false, data: false };
const BOTH: Digests = Digests { header: true, data: true };

fn dec(bytes: &[u8], d: Digests) -> Result<Option<Pdu>, PduError> {
    let mut b = BytesMut::from(bytes);
    let r = decode(&mut b, d, 1 << 20);
    if let Ok(Some(_)) = r {
        assert!(b.is_empty(), "decode must consume exactly one PDU");
    }
    r
}

#[test]
fn icreq_bytes() {
    let p = Pdu::IcReq(IcReq { pfv: 0, hpda: 0, digests: BOTH, maxr2t: 0 });
    let b = p.encode_parts(BOTH).concat();
    assert_eq!(b.len(), 128);
    assert_eq!(&b[..16], &[0x00, 0x00, 128, 0, 128, 0, 0, 0, 0, 0, 0, 0x03, 0, 0, 0, 0]);
    assert!(b[16..].iter().all(|&x| x == 0));
    // IC PDUs never carry digests, whatever was negotiated.
    assert_eq!(dec(&b, BOTH).unwrap(), Some(p));
}

#[test]
fn icresp_bytes() {
    let p = Pdu::IcResp(IcResp { pfv: 0, cpda: 0, digests: Digests { header: true, data: false }, maxh2cdata: 0x20000 });
    let b = p.encode_parts(NONE).concat();
    assert_eq!(&b[..16], &[0x01, 0x00, 128, 0, 128, 0, 0, 0, 0, 0, 0, 0x01, 0x00, 0x00, 0x02, 0x00]);
    assert_eq!(dec(&b, NONE).unwrap(), Some(p));
}

#[test]
fn capsule_cmd_with_incapsule_data_and_digests() {
    let mut sqe = Sqe::new(0x01, 7, 1);
    sqe.set_rw(0, 1);
    sqe.set_sgl(Sgl { addr: 0, length: 512, kind: sgl::INCAPSULE });
    let p = Pdu::CapsuleCmd(CapsuleCmd { sqe, data: Bytes::from(vec![0xAB; 512]) });
    let b = p.encode_parts(BOTH).concat();
    // hlen 72 + hdgst 4 + 512 data + ddgst 4
    assert_eq!(&b[..8], &[0x04, 0x03, 72, 76, 0x50, 0x02, 0, 0]);
    assert_eq!(b.len(), 592);
    assert_eq!(u32::from_le_bytes(b[72..76].try_into().unwrap()), crc32c::crc32c(&b[..72]));
    assert_eq!(u32::from_le_bytes(b[588..592].try_into().unwrap()), crc32c::crc32c(&[0xAB; 512]));
    assert_eq!(dec(&b, BOTH).unwrap(), Some(p.clone()));
    // Without digests: pdo 72, plen 584.
    let b = p.encode_parts(NONE).concat();
    assert_eq!(&b[..8], &[0x04, 0x00, 72, 72, 0x48, 0x02, 0, 0]);
    assert_eq!(dec(&b, NONE).unwrap(), Some(p));
}

#[test]
fn capsule_cmd_without_data_has_pdo_zero() {
    let p = Pdu::CapsuleCmd(CapsuleCmd { sqe: Sqe::new(0x18, 1, 0), data: Bytes::new() });
    let b = p.encode_parts(NONE).concat();
    assert_eq!(&b[..8], &[0x04, 0x00, 72, 0, 72, 0, 0, 0]);
    assert_eq!(b[8], 0x18);
    assert_eq!(dec(&b, NONE).unwrap(), Some(p));
}

#[test]
fn capsule_resp_bytes() {
    let cqe = Cqe { result: 1, sq_head: 2, sq_id: 0, cid: 3, status: Status::INVALID_FIELD.dnr() };
    let p = Pdu::CapsuleResp(cqe);
    let b = p.encode_parts(NONE).concat();
    assert_eq!(b, vec![0x05, 0, 24, 0, 24, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0x04, 0x80]);
    assert_eq!(dec(&b, NONE).unwrap(), Some(p));
}

#[test]
fn data_pdus_and_r2t_bytes() {
    let c2h = Pdu::C2HData(DataPdu { cid: 9, ttag: 0, offset: 4096, last: true, success: true, data: Bytes::from_static(&[1, 2, 3, 4]) });
    let b = c2h.encode_parts(NONE).concat();
    assert_eq!(&b[..24], &[0x07, 0x0C, 24, 24, 28, 0, 0, 0, 9, 0, 0, 0, 0, 0x10, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(dec(&b, NONE).unwrap(), Some(c2h));
    let h2c = Pdu::H2CData(DataPdu { cid: 9, ttag: 5, offset: 0, last: false, success: false, data: Bytes::from_static(&[7; 8]) });
    let b = h2c.encode_parts(BOTH).concat();
    assert_eq!(&b[..4], &[0x06, 0x03, 24, 28]);
    assert_eq!(dec(&b, BOTH).unwrap(), Some(h2c));
    let r2t = Pdu::R2T(R2t { cid: 9, ttag: 5, offset: 512, length: 65536 });
    let b = r2t.encode_parts(NONE).concat();
    assert_eq!(b, vec![0x09, 0, 24, 0, 24, 0, 0, 0, 9, 0, 5, 0, 0, 2, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0]);
    assert_eq!(dec(&b, NONE).unwrap(), Some(r2t));
}

#[test]
fn term_req_bytes() {
    let t = Pdu::C2HTermReq(TermReq { fes: fes::INVALID_HEADER_FIELD, fei: 2, data: Bytes::from_static(&[0x04, 0, 99, 0]) });
    let b = t.encode_parts(BOTH).concat();
    assert_eq!(b, vec![0x03, 0, 24, 0, 28, 0, 0, 0, 1, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x04, 0, 99, 0]);
    assert_eq!(dec(&b, BOTH).unwrap(), Some(t));
}

/// A TermReq has no data digest whatever its DDGST flag says: with the flag
/// set and 1-3 bytes after the header, decode used to read a digest past
/// the end of the PDU and panic (found by the pdu_decode fuzz target).
#[test]
fn term_req_with_ddgst_flag_is_taken_without_a_digest() {
    for extra in 0..6usize {
        let plen = 24 + extra as u8;
        let mut b = vec![0x02, 0x02 | 0x01, 24, 0, plen, 0, 0, 0, 1, 0, 2, 0, 0, 0];
        b.resize(24, 0);
        b.extend((0..extra).map(|i| i as u8 + 1));
        let want = Pdu::H2CTermReq(TermReq { fes: 1, fei: 2, data: Bytes::from((1..=extra as u8).collect::<Vec<u8>>()) });
        for d in [NONE, BOTH] {
            assert_eq!(dec(&b, d).unwrap(), Some(want.clone()), "{extra} bytes of data, {d:?}");
        }
    }
}

#[test]
fn partial_input_waits_for_more() {
    let b = Pdu::R2T(R2t { cid: 1, ttag: 1, offset: 0, length: 1 }).encode_parts(NONE).concat();
    for n in 0..b.len() {
        assert_eq!(dec(&b[..n], NONE).unwrap(), None);
    }
}

#[test]
fn malformed_headers_are_rejected_with_fes() {
    let e = dec(&[0x42, 0, 24, 0, 24, 0, 0, 0], NONE).unwrap_err();
    assert_eq!((e.fes(), e.fei()), (Some(fes::INVALID_HEADER_FIELD), 0));
    let e = dec(&[0x04, 0, 99, 0, 72, 0, 0, 0], NONE).unwrap_err();
    assert_eq!(e.fei(), 2);
    let e = dec(&[0x04, 0, 72, 0, 10, 0, 0, 0], NONE).unwrap_err();
    assert!(matches!(e, PduError::BadPlen { .. }));
    let e = dec(&[0x04, 0, 72, 0, 0xFF, 0xFF, 0xFF, 0x7F], NONE).unwrap_err();
    assert_eq!(e.fes(), Some(fes::DATA_OUT_OF_RANGE));
    // Header digest negotiated but flag missing.
    let b = Pdu::R2T(R2t { cid: 1, ttag: 1, offset: 0, length: 1 }).encode_parts(NONE).concat();
    assert!(matches!(dec(&b, BOTH).unwrap_err(), PduError::DigestFlags { .. }));
    // Corrupt header digest.
    let mut b = Pdu::R2T(R2t { cid: 1, ttag: 1, offset: 0, length: 1 }).encode_parts(BOTH).concat();
    b[12] ^= 1;
    assert_eq!(dec(&b, BOTH).unwrap_err().fes(), Some(fes::HEADER_DIGEST_ERROR));
    // Corrupt data digest: not fatal, names the command.
    let mut b = Pdu::H2CData(DataPdu { cid: 77, ttag: 0, offset: 0, last: true, success: false, data: Bytes::from_static(&[1; 16]) })
        .encode_parts(BOTH)
        .concat();
    let n = b.len();
    b[n - 1] ^= 0xFF;
    let e = dec(&b, BOTH).unwrap_err();
    assert_eq!(e, PduError::DataDigest { kind: kind::H2C_DATA, cid: 77 });
    assert_eq!(e.fes(), None);
    // pdo pointing inside the header.
    let mut b = Pdu::H2CData(DataPdu { cid: 1, ttag: 0, offset: 0, last: true, success: false, data: Bytes::from_static(&[1; 16]) })
        .encode_parts(NONE)
        .concat();
    b[3] = 8;
    assert!(matches!(dec(&b, NONE).unwrap_err(), PduError::BadPdo { .. }));
    // data_length disagreeing with plen.
    let mut b = Pdu::H2CData(DataPdu { cid: 1, ttag: 0, offset: 0, last: true, success: false, data: Bytes::from_static(&[1; 16]) })
        .encode_parts(NONE)
        .concat();
    b[16] = 15;
    assert!(dec(&b, NONE).is_err());
}

fn arb_digests() -> impl Strategy<Value = Digests> {
    (any::<bool>(), any::<bool>()).prop_map(|(header, data)| Digests { header, data })
}

fn arb_pdu() -> impl Strategy<Value = Pdu> {
    let data = proptest::collection::vec(any::<u8>(), 0..600).prop_map(Bytes::from);
    prop_oneof![
        (any::<u16>(), any::<u8>(), 0u8..4, any::<u32>()).prop_map(|(pfv, hpda, d, maxr2t)| Pdu::IcReq(IcReq {
            pfv,
            hpda,
            digests: Digests::from_ic_bits(d),
            maxr2t
        })),
        (any::<u16>(), any::<u8>(), 0u8..4, any::<u32>()).prop_map(|(pfv, cpda, d, m)| Pdu::IcResp(IcResp {
            pfv,
            cpda,
            digests: Digests::from_ic_bits(d),
            maxh2cdata: m
        })),
        (proptest::collection::vec(any::<u8>(), 64), data.clone())
            .prop_map(|(s, data)| Pdu::CapsuleCmd(CapsuleCmd { sqe: Sqe::from_slice(&s), data })),
        (any::<u64>(), any::<u16>(), any::<u16>(), any::<u16>(), 0u16..0x7FFF).prop_map(|(result, sq_head, sq_id, cid, st)| {
            Pdu::CapsuleResp(Cqe { result, sq_head, sq_id, cid, status: Status(st) })
        }),
        (any::<u16>(), any::<u16>(), any::<u32>(), any::<bool>(), proptest::collection::vec(any::<u8>(), 1..600))
            .prop_map(|(cid, ttag, offset, last, d)| Pdu::H2CData(DataPdu { cid, ttag, offset, last, success: false, data: d.into() })),
        (any::<u16>(), any::<u32>(), any::<bool>(), any::<bool>(), proptest::collection::vec(any::<u8>(), 1..600))
            .prop_map(|(cid, offset, last, success, d)| Pdu::C2HData(DataPdu { cid, ttag: 0, offset, last, success, data: d.into() })),
        (any::<u16>(), any::<u16>(), any::<u32>(), any::<u32>()).prop_map(|(cid, ttag, offset, length)| Pdu::R2T(R2t { cid, ttag, offset, length })),
        (any::<u16>(), any::<u32>(), proptest::collection::vec(any::<u8>(), 0..100))
            .prop_map(|(fes, fei, d)| Pdu::H2CTermReq(TermReq { fes, fei, data: d.into() })),
    ]
}

proptest! {
    #[test]
    fn every_pdu_round_trips(p in arb_pdu(), d in arb_digests()) {
        let bytes = p.encode_parts(d).concat();
        prop_assert_eq!(dec(&bytes, d).unwrap(), Some(p));
    }

    #[test]
    fn several_pdus_in_one_buffer_split_anywhere(ps in proptest::collection::vec(arb_pdu(), 1..5), d in arb_digests(), cut in 0usize..2000) {
        let mut all = Vec::new();
        for p in &ps { all.extend(p.encode_parts(d).concat()); }
        let cut = cut.min(all.len());
        let mut buf = BytesMut::from(&all[..cut]);
        let mut got = Vec::new();
        while let Some(p) = decode(&mut buf, d, 1 << 20).unwrap() { got.push(p); }
        buf.extend_from_slice(&all[cut..]);
        while let Some(p) = decode(&mut buf, d, 1 << 20).unwrap() { got.push(p); }
        prop_assert_eq!(got, ps);
    }

    #[test]
    fn encode_into_matches_encode_parts(p in arb_pdu(), d in arb_digests()) {
        let mut v = vec![0xAA];
        p.encode_into(d, &mut v);
        prop_assert_eq!(&v[1..], &p.encode_parts(d).concat()[..]);
    }

    #[test]
    fn data_header_plus_payload_matches_encode_parts(p in arb_pdu(), d in arb_digests()) {
        let (h2c, dp) = match &p {
            Pdu::H2CData(dp) => (true, dp),
            Pdu::C2HData(dp) => (false, dp),
            _ => return Ok(()),
        };
        let hdr = DataPduHeader { cid: dp.cid, ttag: dp.ttag, offset: dp.offset, last: dp.last, success: dp.success };
        let mut v = DataHeader::new(h2c, &hdr, dp.data.len() as u32, d).bytes().to_vec();
        v.extend_from_slice(&dp.data);
        if d.data && !dp.data.is_empty() {
            v.extend_from_slice(&crc32c(&dp.data).to_le_bytes());
        }
        prop_assert_eq!(v, p.encode_parts(d).concat());
    }

    #[test]
    fn peek_data_header_agrees_with_decode(p in arb_pdu(), d in arb_digests(), cut in 0usize..700) {
        let bytes = p.encode_parts(d).concat();
        let cut = cut.min(bytes.len());
        match peek_data_header(&bytes[..cut], d, 1 << 20).unwrap() {
            None => {}
            Some(v) => {
                let Some(Pdu::C2HData(dp) | Pdu::H2CData(dp)) = dec(&bytes, d).unwrap() else { panic!("peeked a non-data PDU") };
                prop_assert_eq!(v.kind, p.kind());
                prop_assert_eq!(v.hdr, DataPduHeader { cid: dp.cid, ttag: dp.ttag, offset: dp.offset, last: dp.last, success: dp.success });
                prop_assert_eq!(&bytes[v.data_start..v.data_start + v.data_len], &dp.data[..]);
                prop_assert_eq!(v.ddgst, d.data);
            }
        }
    }

    #[test]
    fn peek_data_header_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..100), d in arb_digests()) {
        let _ = peek_data_header(&bytes, d, 1 << 16);
    }

    #[test]
    fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400), d in arb_digests()) {
        let mut buf = BytesMut::from(&bytes[..]);
        while let Ok(Some(_)) = decode(&mut buf, d, 1 << 16) {}
    }
}

/// With the CPU's CRC instruction and with the portable tables: the same
/// digests on the wire, and a corrupt header or data digest caught either way.
#[test]
fn digest_mismatches_caught_with_either_crc_implementation() {
    use bw_wire::crc32c::{set_impl, Impl};
    let data = DataPdu { cid: 77, ttag: 0, offset: 0, last: true, success: false, data: Bytes::from((0..=255u8).cycle().take(4099).collect::<Vec<u8>>()) };
    let hw = Pdu::H2CData(data.clone()).encode_parts(BOTH).concat();
    for imp in [Impl::Hardware, Impl::Soft] {
        set_impl(imp);
        assert_eq!(Pdu::H2CData(data.clone()).encode_parts(BOTH).concat(), hw, "{imp:?}");
        assert!(dec(&hw, BOTH).unwrap().is_some(), "{imp:?}");
        let mut b = hw.clone();
        b[12] ^= 1;
        assert_eq!(dec(&b, BOTH).unwrap_err().fes(), Some(fes::HEADER_DIGEST_ERROR), "{imp:?}");
        let mut b = hw.clone();
        let n = b.len();
        b[n - 9] ^= 0x10;
        assert_eq!(dec(&b, BOTH).unwrap_err(), PduError::DataDigest { kind: kind::H2C_DATA, cid: 77 }, "{imp:?}");
    }
    set_impl(Impl::Hardware);
}

/// A PDU that fails a check once framed (a digest, a data length) still
/// leaves the buffer whole, and only it: a target's C2HTermReq quotes what
/// follows. A good one's payload is the receive buffer's own bytes.
#[test]
fn decode_consumes_exactly_the_pdu_it_checks_and_keeps_the_payload_in_place() {
    let data = DataPdu { cid: 9, ttag: 9, offset: 0, last: true, success: false, data: Bytes::from(vec![7u8; 4096]) };
    let good = Pdu::H2CData(data.clone()).encode_parts(BOTH).concat();
    let next = Pdu::R2T(R2t { cid: 1, ttag: 1, offset: 0, length: 512 }).encode_parts(BOTH).concat();
    let mut bad_hdgst = good.clone();
    bad_hdgst[12] ^= 1;
    let mut bad_ddgst = good.clone();
    let n = bad_ddgst.len();
    bad_ddgst[n - 9] ^= 1;
    let mut bad_datal = Pdu::H2CData(data.clone()).encode_parts(NONE).concat();
    bad_datal[16] ^= 1;
    for (what, pdu, d) in [("header digest", &bad_hdgst, BOTH), ("data digest", &bad_ddgst, BOTH), ("DATAL", &bad_datal, NONE)] {
        let next = Pdu::R2T(R2t { cid: 1, ttag: 1, offset: 0, length: 512 }).encode_parts(d).concat();
        let mut b = BytesMut::from(&[&pdu[..], &next[..]].concat()[..]);
        assert!(decode(&mut b, d, 1 << 20).is_err(), "{what}");
        assert_eq!(&b[..], &next[..], "{what}: the bad PDU, and only it, is consumed");
    }
    let mut b = BytesMut::from(&[&good[..], &next[..]].concat()[..]);
    let range = b.as_ptr() as usize..b.as_ptr() as usize + b.len();
    let Some(Pdu::H2CData(got)) = decode(&mut b, BOTH, 1 << 20).unwrap() else { panic!("not H2CData") };
    assert_eq!(got, data);
    assert!(range.contains(&(got.data.as_ptr() as usize)), "the payload was copied");
    assert_eq!(&b[..], &next[..]);
    assert_eq!(decode(&mut b, BOTH, 1 << 20).unwrap(), Some(Pdu::R2T(R2t { cid: 1, ttag: 1, offset: 0, length: 512 })));
    assert!(b.is_empty());
}

/// A controller's path through [`frame`]: a CapsuleCmd read as its SQE and
/// taken with its payload ([`Framed::sqe`], [`Framed::take`]), anything
/// else typed ([`Framed::into_pdu`]).
fn decode_by_sqe(buf: &mut BytesMut, d: Digests, max: u32) -> Result<Option<Pdu>, PduError> {
    let Some(f) = frame(buf, d, max)? else { return Ok(None) };
    match f.sqe() {
        Some(sqe) => Ok(Some(Pdu::CapsuleCmd(CapsuleCmd { sqe, data: f.take() }))),
        None => f.into_pdu().map(Some),
    }
}

/// `bytes` through [`decode`] and through [`decode_by_sqe`], PDU after PDU
/// until either stops: the same PDUs (SQE, payload), the same error, the
/// same bytes left.
fn assert_sqe_path_agrees(bytes: &[u8], d: Digests, max: u32) {
    let (mut a, mut b) = (BytesMut::from(bytes), BytesMut::from(bytes));
    loop {
        let (ra, rb) = (decode(&mut a, d, max), decode_by_sqe(&mut b, d, max));
        assert_eq!(ra, rb, "{d:?} max {max}: {bytes:02x?}");
        assert_eq!(a, b, "{d:?} max {max}: bytes left after {ra:?}");
        if !matches!(ra, Ok(Some(_))) {
            return;
        }
    }
}

/// Every bit of a capsule (with and without in-capsule data, every digest
/// combination, decoded with every one) flipped in turn, and the capsule
/// cut at every length.
#[test]
fn sqe_path_agrees_with_decode_on_every_bit_flip() {
    let mut sqe = Sqe::new(0x01, 0x1234, 1);
    sqe.set_sgl(Sgl { addr: 0, length: 24, kind: sgl::INCAPSULE });
    let all = [NONE, BOTH, Digests { header: true, data: false }, Digests { header: false, data: true }];
    for data in [Bytes::new(), Bytes::from((0..24u8).collect::<Vec<u8>>())] {
        for enc in all {
            let p = Pdu::CapsuleCmd(CapsuleCmd { sqe, data: data.clone() }).encode_parts(enc).concat();
            for d in all {
                for max in [1 << 20, p.len() as u32 - 1] {
                    for cut in 0..=p.len() {
                        assert_sqe_path_agrees(&p[..cut], d, max);
                    }
                    for bit in 0..p.len() * 8 {
                        let mut m = p.clone();
                        m[bit / 8] ^= 1 << (bit % 8);
                        assert_sqe_path_agrees(&m, d, max);
                    }
                }
            }
        }
    }
}

proptest! {
    #[test]
    fn sqe_path_agrees_with_decode_on_garbage(bytes in proptest::collection::vec(any::<u8>(), 0..400), d in arb_digests(), small in any::<bool>()) {
        assert_sqe_path_agrees(&bytes, d, if small { 200 } else { 1 << 16 });
    }

    /// Valid PDUs (encoded with the digests they are decoded with, or
    /// not), some bytes overwritten, cut anywhere.
    #[test]
    fn sqe_path_agrees_with_decode_on_mutated_pdus(
        ps in proptest::collection::vec(arb_pdu(), 1..4),
        enc in arb_digests(),
        same in any::<bool>(),
        d in arb_digests(),
        muts in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..4),
        cut in any::<usize>(),
    ) {
        let mut all = Vec::new();
        for p in &ps { all.extend(p.encode_parts(enc).concat()); }
        for (at, v) in muts { let n = all.len(); all[at % n] = v; }
        if cut % 2 == 1 {
            all.truncate(cut / 2 % (all.len() + 1));
        }
        assert_sqe_path_agrees(&all, if same { enc } else { d }, 1 << 20);
    }
}

/// One fault put into a valid data PDU by [`faulty_data_pdu`]: a header
/// field, a digest, or `max_plen`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    Hlen,
    HdgstFlag,
    TooLarge,
    /// PLEN short of the header (and its digest).
    PlenShort,
    /// PLEN of the header alone: no room for the payload DATAL names.
    PlenNoData,
    /// PLEN one byte more than header, payload and digests.
    PlenLong,
    HeaderDigest,
    DdgstFlag,
    /// PDO inside the header or its digest.
    PdoLow,
    /// PDO past where the data digest (or the PDU) starts.
    PdoHigh,
    /// PDO where the data digest (or the PDU's end) starts: an empty payload.
    PdoEnd,
    DataDigest,
    /// DATAL two more than the payload (PLEN one more is a fault of its own).
    Datal,
}

const FAULTS: [Fault; 13] = {
    use Fault::*;
    [Hlen, HdgstFlag, TooLarge, PlenShort, PlenNoData, PlenLong, HeaderDigest, DdgstFlag, PdoLow, PdoHigh, PdoEnd, DataDigest, Datal]
};

impl Fault {
    /// It can be put into a PDU with an `n`-byte payload and `d`.
    fn applies(self, n: usize, d: Digests) -> bool {
        use Fault::*;
        match self {
            HeaderDigest => d.header,
            DataDigest => d.data && n > 0,
            PlenNoData | PlenLong | DdgstFlag | PdoLow | PdoHigh | PdoEnd => n > 0,
            _ => true,
        }
    }
    /// The field it sets: two faults on one field are not combined.
    fn field(self) -> u8 {
        use Fault::*;
        match self {
            PlenShort | PlenNoData | PlenLong => 100,
            PdoLow | PdoHigh | PdoEnd => 101,
            f => f as u8,
        }
    }
    /// Its place in `decode`'s order of checks (0-3: the common header's,
    /// made as soon as 8 bytes are in; the rest once all PLEN bytes are).
    fn decode_rank(self) -> u8 {
        use Fault::*;
        match self {
            Hlen => 0,
            HdgstFlag => 1,
            TooLarge => 2,
            PlenShort => 3,
            HeaderDigest => 4,
            DdgstFlag => 5,
            PdoLow | PdoHigh => 6,
            DataDigest => 7,
            PlenNoData | PlenLong | PdoEnd | Datal => 8,
        }
    }
    /// Its place in `peek_data_header`'s order (0-3 as `decode`; 5-6 from
    /// the common header alone too; 7-8 once PDO bytes are in); None: not
    /// seen (the data digest follows the payload; with no room for a
    /// payload, peek has nothing to say).
    fn peek_rank(self) -> Option<u8> {
        use Fault::*;
        match self {
            Hlen => Some(0),
            HdgstFlag => Some(1),
            TooLarge => Some(2),
            PlenShort => Some(3),
            DdgstFlag => Some(5),
            PdoLow | PdoHigh => Some(6),
            HeaderDigest => Some(7),
            PlenLong | PdoEnd | Datal => Some(8),
            DataDigest | PlenNoData => None,
        }
    }
    /// The error it is reported as, for the faulty header `ch`.
    fn error(self, ch: &CommonHeader, max: u32, cid: u16) -> PduError {
        use Fault::*;
        let kind = ch.kind;
        match self {
            Hlen => PduError::BadHlen { kind, hlen: ch.hlen, want: DATA_HLEN as u8 },
            HdgstFlag | DdgstFlag => PduError::DigestFlags { kind, flags: ch.flags },
            TooLarge => PduError::TooLarge { plen: ch.plen, max },
            PlenShort | PlenNoData | PlenLong | PdoEnd | Datal => PduError::BadPlen { kind, plen: ch.plen },
            HeaderDigest => PduError::HeaderDigest { kind },
            PdoLow | PdoHigh => PduError::BadPdo { kind, pdo: ch.pdo },
            DataDigest => PduError::DataDigest { kind, cid },
        }
    }
}

const CID: u16 = 0x1234;

/// A data PDU of `kind` with an `n`-byte payload (after `pad` bytes of
/// padding, PDO = header + digest + pad), digests `d`, with `faults` put
/// in, both digests made anew over what they cover after the header
/// faults (so that each fault is the only one), then `max_plen`.
fn faulty_data_pdu(kind: u8, d: Digests, n: usize, pad: usize, faults: &[Fault]) -> (Vec<u8>, u32) {
    use Fault::*;
    let hd = if d.header { DIGEST_LEN } else { 0 };
    let dd = if d.data && n > 0 { DIGEST_LEN } else { 0 };
    let mut plen = DATA_HLEN + hd + pad + n + dd;
    let mut b = vec![0xEEu8; plen];
    let mut fl = flags::DATA_LAST | if kind == kind::C2H_DATA { flags::DATA_SUCCESS } else { 0 };
    fl |= if hd != 0 { flags::HDGST } else { 0 } | if dd != 0 { flags::DDGST } else { 0 };
    let mut pdo = if n > 0 { DATA_HLEN + hd + pad } else { 0 };
    let mut datal = n as u32;
    for i in 0..n {
        b[DATA_HLEN + hd + pad + i] = i as u8 * 7 + 1;
    }
    let mut hlen = DATA_HLEN as u8;
    // PLEN first: PDO faults are relative to it.
    for f in faults {
        match f {
            PlenShort => plen = DATA_HLEN + hd - 1,
            PlenNoData => plen = DATA_HLEN + hd,
            PlenLong => {
                plen += 1;
                b.push(0xAB);
            }
            _ => {}
        }
    }
    for f in faults {
        match f {
            Hlen => hlen += 1,
            HdgstFlag => fl ^= flags::HDGST,
            DdgstFlag => fl ^= flags::DDGST,
            PdoLow => pdo = DATA_HLEN + hd - 1,
            PdoHigh => pdo = plen - dd + 1,
            PdoEnd => pdo = plen - dd,
            Datal => datal += 2,
            _ => {}
        }
    }
    CommonHeader { kind, flags: fl, hlen, pdo: u8::try_from(pdo).unwrap(), plen: plen as u32 }.write(&mut b);
    field::CCCID.set(&mut b, CID);
    field::TTAG.set(&mut b, if kind == kind::H2C_DATA { 0x55 } else { 0 });
    field::DATAO.set(&mut b, 0x10000);
    field::DATAL.set(&mut b, datal);
    if dd != 0 && pdo >= DATA_HLEN + hd && pdo + DIGEST_LEN <= plen && plen <= b.len() {
        let c = crc32c(&b[pdo..plen - DIGEST_LEN]);
        digest_at(plen - DIGEST_LEN).set(&mut b, c);
    }
    if hd != 0 {
        let c = crc32c(&b[..DATA_HLEN]);
        digest_at(DATA_HLEN).set(&mut b, c);
    }
    if faults.contains(&HeaderDigest) {
        b[DATA_HLEN] ^= 1;
    }
    // (No data digest in a PDU cut short of its payload.)
    if faults.contains(&DataDigest) && plen > DATA_HLEN + hd {
        b[plen - 1] ^= 1;
    }
    let max = if faults.contains(&TooLarge) { plen as u32 - 1 } else { 1 << 20 };
    (b, max)
}

/// Data PDUs (both kinds, every digest combination, payloads of 0-64
/// bytes, with and without padding before them) with no fault, each
/// fault, and each pair of faults on different fields, cut at every
/// length: `decode` and `peek_data_header` each report the error of the
/// fault it checks first, in its own order, as soon as it has the bytes
/// for it, and agree on the PDU when neither finds one. They differ only
/// in what peek cannot see or does not look at: the data digest, a PDU
/// without room for a payload (peek: `None`), bytes past PDO (peek needs
/// none of them), and so the order (PDO and DDGST before the header
/// digest; DATAL before the data digest).
#[test]
fn peek_data_header_and_decode_report_each_fault_as_specified() {
    let all = [NONE, BOTH, Digests { header: true, data: false }, Digests { header: false, data: true }];
    let mut checked = 0usize;
    for kind in [kind::H2C_DATA, kind::C2H_DATA] {
        for d in all {
            for (n, pad) in [(0, 0), (1, 0), (5, 0), (5, 4), (64, 0), (64, 4)] {
                let mut sets: Vec<Vec<Fault>> = vec![vec![]];
                let fs: Vec<Fault> = FAULTS.iter().copied().filter(|f| f.applies(n, d)).collect();
                for (i, &a) in fs.iter().enumerate() {
                    sets.push(vec![a]);
                    for &b in &fs[i + 1..] {
                        if a.field() != b.field() {
                            sets.push(vec![a, b]);
                        }
                    }
                }
                for faults in sets {
                    let (b, max) = faulty_data_pdu(kind, d, n, pad, &faults);
                    let ch = CommonHeader::parse(&b);
                    let (plen, pdo) = (ch.plen as usize, ch.pdo as usize);
                    let hd = if d.header { DIGEST_LEN } else { 0 };
                    let no_room = plen == DATA_HLEN + hd;
                    let what = format!("{kind:#x} {d:?} n {n} pad {pad} {faults:?}");
                    // decode's first fault; with no room for a payload,
                    // DDGST, PDO and the data digest are not looked at.
                    let dec_first = faults
                        .iter()
                        .filter(|f| !(no_room && matches!(f, Fault::DdgstFlag | Fault::PdoLow | Fault::PdoHigh | Fault::DataDigest)))
                        .min_by_key(|f| f.decode_rank())
                        .copied();
                    let peek_first = faults.iter().filter_map(|f| f.peek_rank().map(|r| (r, *f))).min_by_key(|x| x.0);
                    for cut in 0..=b.len() {
                        // decode
                        let mut buf = BytesMut::from(&b[..cut]);
                        let got = decode(&mut buf, d, max);
                        let want = match dec_first {
                            _ if cut < CH_LEN => Ok(false),
                            Some(f) if f.decode_rank() <= 3 => Err(f.error(&ch, max, CID)),
                            _ if cut < plen => Ok(false),
                            Some(f) => Err(f.error(&ch, max, CID)),
                            None => Ok(true),
                        };
                        match (&got, &want) {
                            (Ok(Some(Pdu::H2CData(p) | Pdu::C2HData(p))), Ok(true)) => {
                                assert_eq!(got.as_ref().unwrap().as_ref().unwrap().kind(), kind, "{what} cut {cut}");
                                assert_eq!((p.cid, p.offset, p.last, p.success), (CID, 0x10000, true, kind == kind::C2H_DATA), "{what}");
                                assert_eq!(&p.data[..], &b[pdo..pdo + n], "{what}");
                            }
                            (Ok(None), Ok(false)) => {}
                            (Err(g), Err(w)) => assert_eq!(g, w, "decode: {what} cut {cut}"),
                            _ => panic!("decode: {what} cut {cut}: got {got:?}, want {want:?}"),
                        }
                        // peek_data_header
                        let got = peek_data_header(&b[..cut], d, max);
                        let want = match peek_first {
                            _ if cut < CH_LEN => Ok(false),
                            Some((r, f)) if r <= 3 => Err(f.error(&ch, max, CID)),
                            _ if no_room => Ok(false),
                            Some((r, f)) if r <= 6 => Err(f.error(&ch, max, CID)),
                            _ if cut < pdo => Ok(false),
                            Some((_, f)) => Err(f.error(&ch, max, CID)),
                            None => Ok(true),
                        };
                        match (&got, &want) {
                            (Ok(Some(v)), Ok(true)) => {
                                let hdr = DataPduHeader {
                                    cid: CID,
                                    ttag: if kind == kind::H2C_DATA { 0x55 } else { 0 },
                                    offset: 0x10000,
                                    last: true,
                                    success: kind == kind::C2H_DATA,
                                };
                                assert_eq!(*v, DataHeaderView { kind, hdr, data_start: pdo, data_len: n, ddgst: d.data }, "{what} cut {cut}");
                            }
                            (Ok(None), Ok(false)) => {}
                            (Err(g), Err(w)) => assert_eq!(g, w, "peek: {what} cut {cut}"),
                            _ => panic!("peek: {what} cut {cut}: got {got:?}, want {want:?}"),
                        }
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked > 100_000, "{checked}");
}
