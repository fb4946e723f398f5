//! Arbitrary capsules through a connected NVMe/RDMA controller queue, the
//! transport's side played: never panics, bounded, completes only what it
//! was sent.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    bw_nvme::fuzzing::rdma_queue(data);
});
