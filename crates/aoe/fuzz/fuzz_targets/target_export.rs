#![no_main]
// The whole target state machine on a small RAM disk: any frame gives a
// well-formed reply or none, never a panic; replies fit the buffer.
use bw_aoe::frame::AoeHeader;
use bw_aoe::target::{Export, ExportSettings, Outcome};
use bw_block::{BackendSpec, Volume};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fn export() -> &'static Export {
    static E: OnceLock<Export> = OnceLock::new();
    E.get_or_init(|| {
        let v = Volume::open("fuzz", &BackendSpec::ram(64 * 1024)).unwrap();
        Export::new(ExportSettings { shelf: 1, slot: 1, config_string: vec![], buffer_count: 16, max_sectors: 17, allow: vec![], broadcast_writes: false }, v)
    })
}

fuzz_target!(|data: &[u8]| {
    let e = export();
    let mut out = vec![0u8; e.reply_buffer_len()];
    if let Outcome::Reply(n) = e.handle(data, [2, 0, 0, 0, 0, 1], &mut out) {
        assert!(n >= 60 && n <= out.len());
        let h = AoeHeader::parse(&out[..n]).unwrap();
        assert!(h.is_response());
    }
});
