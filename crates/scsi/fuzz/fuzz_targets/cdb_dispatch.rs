#![no_main]
//! SCSI CDB dispatch: a sequence of commands from several nexuses to a
//! two-LUN target over RAM volumes (plus unmapped LUNs), with resets and
//! nexus ends in between. Never panics; outcomes are well formed: GOOD has
//! no sense, CHECK CONDITION has fixed-format sense, a failed command
//! returns no data, no command returns more than the largest transfer, and
//! a zero-copy read plan stays inside the volume.
//!
//! Each input gets a fresh `ScsiTarget` (reservations, unit attentions,
//! mode pages, nexus names all start over) on two RAM volumes made once per
//! process and punched back to all-holes before every input, which is the
//! state a new RAM volume starts in: making two memfds per input cost a
//! fifth of the run time. What carries over is only the volumes' I/O
//! counters, which no SCSI command reports.
use bw_block::{BackendSpec, Volume};
use bw_scsi::{status, AluaState, LunConfig, PortGroup, ReadPlan, ScsiTarget};
use libfuzzer_sys::fuzz_target;

const BLOCKS: u64 = 128;
/// READ/WRITE refuse more than MAX_TRANSFER_BLOCKS; other data-in is small.
const MAX_DATA_IN: usize = 8192 * 512;

thread_local! {
    static VOLUMES: [Volume; 2] = ["a", "b"].map(|n| Volume::open(n, &BackendSpec::ram(BLOCKS * 512)).expect("ram volume"));
}

fn target(standby: bool) -> ScsiTarget {
    let [a, b] = VOLUMES.with(|v| v.clone());
    for v in [&a, &b] {
        v.discard(0, BLOCKS * 512).expect("punch the volume back to holes");
    }
    let mut ro = LunConfig::for_volume("b", "iqn.2026-11.org.fuzz:t", 1);
    ro.read_only = true;
    if standby {
        ro.port_group = PortGroup { id: 2, state: AluaState::Standby, relative_port: 2 };
    }
    ScsiTarget::new(vec![(0, a, LunConfig::for_volume("a", "iqn.2026-11.org.fuzz:t", 0)), (1, b, ro)])
}

fuzz_target!(|data: &[u8]| {
    let Some((&setup, mut rest)) = data.split_first() else { return };
    let t = target(setup & 1 != 0);
    if setup & 2 != 0 {
        t.set_initiator_name(0, "iqn.2026-11.org.fuzz:i,i,0x000000000001");
    }
    let mut data_in = Vec::new();
    // Record: nexus/flags, lun, cdb length, cdb, data-out length (2 bytes), data-out.
    while rest.len() >= 3 {
        let (ctl, lun, cdb_len) = (rest[0], rest[1], rest[2] as usize % 33);
        rest = &rest[3..];
        let cdb = &rest[..cdb_len.min(rest.len())];
        rest = &rest[cdb.len()..];
        let dlen = match rest {
            [a, b, ..] => u16::from_le_bytes([*a, *b]) as usize,
            _ => 0,
        };
        rest = rest.get(2..).unwrap_or(&[]);
        let dout = &rest[..dlen.min(rest.len())];
        rest = &rest[dout.len()..];
        let nexus = (ctl & 3) as u64;
        let lun = (lun % 4) as u64;
        match ctl >> 5 {
            1 => {
                t.lun_reset(lun);
                continue;
            }
            2 if ctl & 0x10 != 0 => {
                t.nexus_gone(nexus);
                continue;
            }
            _ => {}
        }
        let plan = t.plan(lun, cdb);
        let _ = plan.data_out_len();
        if let ReadPlan::Range { offset, len, .. } = plan.read() {
            assert!(offset + len as u64 <= BLOCKS * 512, "read range {offset}+{len} past the end");
            continue;
        }
        // Data-out in one piece or cut in two, as transports hand it over.
        let o = if ctl & 4 != 0 && dout.len() > 1 {
            let (a, b) = dout.split_at(dout.len() / 2);
            t.execute_pieces(nexus, lun, cdb, &[a, b], &mut data_in)
        } else {
            t.execute(nexus, lun, cdb, dout, &mut data_in)
        };
        match o.status {
            status::GOOD => assert!(o.sense.is_empty(), "GOOD with sense"),
            status::CHECK_CONDITION => {
                assert!(o.sense.len() >= 8 && matches!(o.sense[0] & 0x7F, 0x70 | 0x71), "bad sense {:02x?}", o.sense);
                assert_eq!(o.sense.len(), 8 + o.sense[7] as usize, "sense length field");
                assert!(data_in.is_empty(), "failed command returned data");
            }
            s => {
                assert!(o.sense.is_empty(), "status {s:#x} with sense");
                assert!(data_in.is_empty(), "failed command returned data");
            }
        }
        assert!(data_in.len() <= MAX_DATA_IN, "{} bytes of data-in", data_in.len());
    }
});
