//! Instructions per call of `pdu::frame` (the per-PDU receive path of
//! target and host) and `pdu::peek_data_header` (the host's C2HData
//! header), for comparing two builds of bw-nvme: one PDU framed in place
//! N times (CASE: cmd, cmd4k, resp, c2h, c2hpart, h2c; peek), optionally
//! with both digests.
//!
//! ```text
//! cargo build --release -p bw-nvme --example pdu_cost
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     --toggle-collect=bw_nvme::pdu::frame \
//!     target/release/examples/pdu_cost cmd 11000 [digests] 2>&1 | grep Collected
//! ```
//! (`--toggle-collect=bw_nvme::pdu::peek_data_header` for `peek`.) Subtract
//! the run with N = 1000 and divide by 10,000.
use bw_nvme::pdu::{self, CapsuleCmd, DataPdu, Digests, Pdu};
use bw_nvme::Sqe;
use bytes::{Bytes, BytesMut};
use std::hint::black_box;

fn main() {
    let case = std::env::args().nth(1).unwrap();
    let n: usize = std::env::args().nth(2).unwrap().parse().unwrap();
    let hd = std::env::args().nth(3).is_some_and(|s| s == "digests");
    let d = Digests { header: hd, data: hd };
    let data4k = Bytes::from(vec![7u8; 4096]);
    let pdu = match case.as_str() {
        "cmd" => Pdu::CapsuleCmd(CapsuleCmd { sqe: Sqe::new(0x02, 1, 1), data: Bytes::new() }),
        "cmd4k" => Pdu::CapsuleCmd(CapsuleCmd { sqe: Sqe::new(0x01, 1, 1), data: data4k.clone() }),
        "resp" => Pdu::CapsuleResp(Default::default()),
        "c2h" | "c2hpart" | "peek" => Pdu::C2HData(DataPdu { cid: 1, ttag: 0, offset: 0, last: true, success: true, data: data4k.clone() }),
        "h2c" => Pdu::H2CData(DataPdu { cid: 1, ttag: 1, offset: 0, last: true, success: false, data: data4k.clone() }),
        _ => panic!("case"),
    };
    let mut bytes = pdu.encode_parts(d).concat();
    if case == "c2hpart" || case == "peek" {
        bytes.truncate(100);
    }
    let mut buf = BytesMut::with_capacity(8192);
    buf.extend_from_slice(&bytes);
    if case == "peek" {
        for _ in 0..n {
            black_box(pdu::peek_data_header(black_box(&buf[..]), d, 1 << 20).unwrap());
        }
        return;
    }
    for _ in 0..n {
        let r = pdu::frame(black_box(&mut buf), d, 1 << 20);
        black_box(r.map(|f| f.is_some()).unwrap());
    }
}
