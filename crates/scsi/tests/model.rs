//! Property test: any sequence of WRITE / WRITE SAME / UNMAP / COMPARE AND
//! WRITE through the SCSI layer leaves the disk equal to a byte-array model,
//! as seen by READ commands of every size.

mod common;
use common::*;
use proptest::prelude::*;

const BLOCKS: u64 = 96;

const SUPPORTED_OPCODES: [u8; 39] = [
    0x00, 0x03, 0x08, 0x0a, 0x12, 0x15, 0x16, 0x17, 0x1a, 0x1b, 0x1e, 0x25, 0x28, 0x2a, 0x2e, 0x2f, 0x34, 0x35, 0x41,
    0x42, 0x55, 0x5a, 0x5e, 0x5f, 0x88, 0x89, 0x8a, 0x8e, 0x8f, 0x90, 0x91, 0x93, 0x9e, 0xa0, 0xa3, 0xa8, 0xaa, 0xae,
    0xaf,
];

#[derive(Debug, Clone)]
enum Op {
    Write { lba: u64, n: u64, seed: u8, size: u8 },
    WriteSame { lba: u64, n: u64, byte: u8, unmap: bool },
    Unmap { ranges: Vec<(u64, u64)> },
    CompareAndWrite { lba: u64, n: u64, seed: u8, matching: bool },
    Read { lba: u64, n: u64, size: u8 },
}

fn range() -> impl Strategy<Value = (u64, u64)> {
    (0..BLOCKS).prop_flat_map(|lba| (Just(lba), 0..=(BLOCKS - lba).min(24)))
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (range(), any::<u8>(), 0u8..4).prop_map(|((lba, n), seed, size)| Op::Write { lba, n, seed, size }),
        (range(), prop_oneof![Just(0u8), any::<u8>()], any::<bool>())
            .prop_map(|((lba, n), byte, unmap)| Op::WriteSame { lba, n: n.max(1).min(BLOCKS - lba), byte, unmap }),
        proptest::collection::vec(range(), 0..4).prop_map(|ranges| Op::Unmap { ranges }),
        (range(), any::<u8>(), any::<bool>())
            .prop_map(|((lba, n), seed, matching)| Op::CompareAndWrite { lba, n, seed, matching }),
        (range(), 0u8..4).prop_map(|((lba, n), size)| Op::Read { lba, n, size }),
    ]
}

fn rw_cdb(write: bool, size: u8, lba: u64, n: u64) -> Vec<u8> {
    match size {
        0 if n > 0 && n < 256 => vec![if write { 0x0a } else { 0x08 }, (lba >> 16) as u8, (lba >> 8) as u8, lba as u8, n as u8, 0],
        1 | 0 => cdb10(if write { 0x2a } else { 0x28 }, 0, lba as u32, n as u16).to_vec(),
        2 => cdb12(if write { 0xaa } else { 0xa8 }, 0, lba as u32, n as u32).to_vec(),
        _ => cdb16(if write { 0x8a } else { 0x88 }, 0, lba, n as u32).to_vec(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    fn scsi_disk_matches_model(ops in proptest::collection::vec(op(), 1..30)) {
        let t = ram_target(BLOCKS);
        let mut model = vec![0u8; BLOCKS as usize * BS];
        let span = |lba: u64, n: u64| lba as usize * BS..(lba + n) as usize * BS;
        for op in ops {
            match op {
                Op::Write { lba, n, seed, size } => {
                    let data = pattern(n as usize, seed);
                    good(&t, 1, &rw_cdb(true, size, lba, n), &data);
                    model[span(lba, n)].copy_from_slice(&data);
                }
                Op::WriteSame { lba, n, byte, unmap } => {
                    let mut c = cdb16(0x93, if unmap { 0x08 } else { 0 }, lba, n as u32);
                    if byte == 0 && unmap && n % 2 == 0 {
                        c[1] |= 0x01; // NDOB
                        good(&t, 1, &c, &[]);
                    } else {
                        good(&t, 1, &c, &[byte; BS]);
                    }
                    model[span(lba, n)].fill(byte);
                }
                Op::Unmap { ranges } => {
                    let descs: Vec<(u64, u32)> = ranges.iter().map(|(l, n)| (*l, *n as u32)).collect();
                    let p = unmap_params(&descs);
                    good(&t, 1, &unmap_cdb(p.len() as u16), &p);
                    for (lba, n) in ranges {
                        model[span(lba, n)].fill(0);
                    }
                }
                Op::CompareAndWrite { lba, n, seed, matching } => {
                    let n = n.min(24);
                    let mut c = [0u8; 16];
                    c[0] = 0x89;
                    c[2..10].copy_from_slice(&lba.to_be_bytes());
                    c[13] = n as u8;
                    let mut buf = model[span(lba, n)].to_vec();
                    if !matching && n > 0 {
                        buf[0] ^= 0xff;
                    }
                    let new = pattern(n as usize, seed);
                    buf.extend_from_slice(&new);
                    let (o, _) = run(&t, 1, &c, &buf);
                    if matching || n == 0 {
                        prop_assert!(o.is_good());
                        model[span(lba, n)].copy_from_slice(&new);
                    } else {
                        prop_assert_eq!(sense(&o), MISCOMPARE);
                    }
                }
                Op::Read { lba, n, size } => {
                    let d = good(&t, 1, &rw_cdb(false, size, lba, n), &[]);
                    prop_assert_eq!(&d[..], &model[span(lba, n)]);
                }
            }
        }
        let all = good(&t, 1, &cdb16(0x88, 0, 0, BLOCKS as u32), &[]);
        prop_assert_eq!(all, model);
    }

    // Arbitrary CDBs (mostly with a supported opcode) and data never panic,
    // and failures always carry well-formed fixed sense data and no data-in.
    #[test]
    fn arbitrary_cdbs_are_handled(
        opcode in prop_oneof![any::<u8>(), proptest::sample::select(SUPPORTED_OPCODES.to_vec())],
        rest in proptest::collection::vec(any::<u8>(), 0..19),
        data in proptest::collection::vec(any::<u8>(), 0..1200),
        lun in 0u64..3,
    ) {
        let t = ram_target(64);
        let mut cdb = vec![opcode];
        cdb.extend_from_slice(&rest);
        let mut out = Vec::new();
        let o = t.execute(7, lun, &cdb, &data, &mut out);
        if o.status == bw_scsi::status::CHECK_CONDITION {
            prop_assert_eq!(o.sense.len(), 18);
            prop_assert_eq!(o.sense[0] & 0x7f, 0x70);
            prop_assert!(out.is_empty());
        }
        let _ = t.plan(lun, &cdb).data_out_len();
    }
}
