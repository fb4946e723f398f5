//! Arbitrary submission entries and data through the admin state machine and
//! the NVM command set over a small RAM volume: never panics, and a
//! completion's data never exceeds what the command's SGL asked for.
#![no_main]
use bw_block::{BackendSpec, Volume};
use bw_nvme::controller::{AdminOutcome, Role};
use bw_nvme::{io, Controller, Namespace, Sqe, Subsystem};
use libfuzzer_sys::fuzz_target;
use std::sync::Arc;
use std::time::Instant;

fuzz_target!(|data: &[u8]| {
    let v = Volume::open("f", &BackendSpec::ram(64 * 1024)).expect("ram volume");
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
        let r = io::execute(&s, &sqe, extra);
        if let Some(d) = r.data {
            assert_eq!(d.len(), sqe.sgl().length as usize);
        }
    }
});
