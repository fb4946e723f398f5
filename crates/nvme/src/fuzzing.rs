//! Harness bodies shared by the cargo-fuzz targets (crates/nvme/fuzz) and
//! the regression replay (tests/fuzz_regressions.rs): feed untrusted bytes
//! to the PDU parser and the command sets and check invariants. Panics mean
//! bugs.

use crate::controller::{AdminOutcome, Role};
use crate::pdu::{decode, Digests};
use crate::{nvm_io, Controller, Namespace, Sqe, Subsystem};
use bw_block::{BackendSpec, Volume};
use bytes::BytesMut;
use std::sync::Arc;
use std::time::Instant;

/// The PDU parser on arbitrary bytes (the first picks digests and the
/// size limit): never panics, consumes only whole PDUs, and whatever it
/// accepts re-encodes to something it decodes to the same PDU.
pub fn pdu_decode(data: &[u8]) {
    let Some((&sel, rest)) = data.split_first() else { return };
    let d = Digests { header: sel & 1 != 0, data: sel & 2 != 0 };
    let max = if sel & 4 != 0 { 1 << 20 } else { 4096 };
    let mut buf = BytesMut::from(rest);
    while let Ok(Some(p)) = decode(&mut buf, d, max) {
        let bytes = p.encode_parts(d).concat();
        let mut again = BytesMut::from(&bytes[..]);
        let q = decode(&mut again, d, u32::MAX).expect("re-encoded PDU must decode").expect("complete");
        assert_eq!(p, q);
        assert!(again.is_empty());
    }
}

const COMMANDS_VOLUME: u64 = 64 * 1024;

thread_local! {
    /// One RAM volume per thread (libFuzzer runs one): a memfd per input
    /// cost more than the commands. Punched back to all-holes before each
    /// input, the state a new RAM volume starts in.
    static COMMANDS_VOLUME_CACHE: Volume = Volume::open("f", &BackendSpec::ram(COMMANDS_VOLUME)).expect("ram volume");
}

/// Arbitrary submission entries (64 bytes, then 16 bytes of data each)
/// through the admin state machine and the NVM command set over a small RAM
/// volume: never panics, and a completion's data never exceeds what the
/// command's SGL asked for. Each input gets a new subsystem and controller;
/// only the volume's I/O counters carry over (they feed SMART's totals).
pub fn commands(data: &[u8]) {
    let v = COMMANDS_VOLUME_CACHE.with(|v| v.clone());
    v.discard(0, COMMANDS_VOLUME).expect("punch the volume back to holes");
    let s = Arc::new(Subsystem {
        nqn: "nqn.f:s".into(),
        serial: "s".into(),
        model: "m".into(),
        namespaces: vec![Namespace::new("nqn.f:s", 1, v, false)],
        allowed_hosts: vec![],
        ana: Default::default(),
    });
    let mut c = Controller::new(1, Role::Nvm(s.clone()), "h".into(), [0; 16], 1000, Instant::now());
    for chunk in data.chunks(80) {
        if chunk.len() < 64 {
            break;
        }
        let sqe = Sqe::from_slice(&chunk[..64]);
        let extra = &chunk[64..];
        if let AdminOutcome::Complete(done) = c.execute_admin(&sqe, extra, Instant::now()) {
            if let Some(d) = done.data {
                assert!(d.len() <= sqe.sgl().length as usize);
            }
        }
        let r = nvm_io::execute(&s, &nvm_io::Host::new([0; 16]), &sqe, extra);
        if let Some(d) = r.data {
            assert_eq!(d.len(), sqe.sgl().length as usize);
        }
    }
}
