//! Arbitrary submission entries and data through the admin state machine and
//! the NVM command set over a small RAM volume: never panics, and a
//! completion's data never exceeds what the command's SGL asked for.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    bw_nvme::fuzzing::commands(data);
});
