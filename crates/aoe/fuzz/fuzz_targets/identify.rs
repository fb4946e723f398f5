#![no_main]
// IDENTIFY page parser (initiator side): any 512 bytes decode without panicking.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(i) = bw_aoe::identify::parse(data) {
        let _ = (i.sectors, i.model.len(), i.serial.len());
    }
});
