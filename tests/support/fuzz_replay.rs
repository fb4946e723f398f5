//! Shared by each crate's `tests/fuzz_regressions.rs` (included with
//! `#[path]`): every input the fuzz campaign ever crashed a harness with,
//! kept in crates/<crate>/fuzz/regressions/<target>/, runs through that
//! harness on each `cargo test`.

use std::path::Path;

/// Feed every file of `<manifest>/fuzz/regressions/<target>` to `harness`;
/// the number of inputs replayed (a test asserts it is not zero, so an
/// emptied directory cannot pass silently).
pub fn replay(manifest_dir: &str, target: &str, harness: fn(&[u8])) -> usize {
    let dir = Path::new(manifest_dir).join("fuzz/regressions").join(target);
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("directory entry").path();
        let data = std::fs::read(&path).expect("read regression input");
        eprintln!("{target}: {}", path.display());
        harness(&data);
        n += 1;
    }
    n
}
