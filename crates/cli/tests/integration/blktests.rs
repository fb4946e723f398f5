//! blktests' `nvme` group, the Linux kernel's NVMe-oF test suite, against
//! blockwire: the guest's kernel (Debian's 6.12) is the host through its
//! nvme-tcp driver, blockwire serves in the guest, started empty and built
//! and torn down for each case by blktests through NVME_TARGET_CONTROL
//! (tests/blktests/blockwire-target-control, over `blockwire ctl`).
//!
//! One VM boot runs every case below (tests/blktests/run-vm.sh); each
//! #[test] reads its case's verdict from that shared run and, on failure,
//! shows the case's .out diff. The cases are those that honour
//! NVME_TARGET_CONTROL over TCP and that the kernel's nvmet passes in the
//! same VM (docs/notes/2026-11-25-blktests.md has the table, with why the
//! others do not apply). blktests comes from BLKTESTS_DIR (default
//! ../shared/blktests), copied and built in a temporary directory; where
//! it is absent every case says so in one line and passes as skipped.

use crate::common::*;
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// What the shared run saw: each case's status, its diff, the console.
struct Battery {
    status: HashMap<String, String>,
    diffs: HashMap<String, String>,
    console: String,
}

/// Err: why the battery did not run (blktests is not there).
static RUN: OnceLock<Result<Battery, String>> = OnceLock::new();

fn blktests_src() -> PathBuf {
    std::env::var_os("BLKTESTS_DIR").map(PathBuf::from).unwrap_or_else(|| shared_dir().join("blktests"))
}

/// Every case's verdict, from the one VM run.
fn run_battery() -> Result<Battery, String> {
    let src = blktests_src();
    if !src.join("check").is_file() {
        return Err(format!("blktests not found at {} (set BLKTESTS_DIR to a blktests tree)", src.display()));
    }
    require_root();
    let kvm = kernel_612_image();
    let mut c = Command::new(repo_root().join("tests/blktests/run-vm.sh"));
    c.arg(&src).arg(blockwire_bin()).arg(&kvm).arg("blockwire").args(CASES);
    c.env("KVM_TIMEOUT", "600");
    let out = c.stdin(Stdio::null()).output().expect("run tests/blktests/run-vm.sh");
    let console = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let (mut status, mut diffs) = (HashMap::new(), HashMap::new());
    let mut diff: Option<(String, String)> = None;
    for line in console.lines() {
        if let Some((case, text)) = diff.as_mut() {
            if line == "blktests-diff-end" {
                diffs.insert(std::mem::take(case), std::mem::take(text));
                diff = None;
            } else {
                text.push_str(line);
                text.push('\n');
            }
        } else if let Some(r) = line.strip_prefix("blktests: blockwire ") {
            if let Some((case, st)) = r.split_once(' ') {
                status.insert(case.to_string(), st.to_string());
            }
        } else if let Some(case) = line.strip_prefix("blktests-diff: blockwire ") {
            diff = Some((case.to_string(), String::new()));
        }
    }
    Ok(Battery { status, diffs, console })
}

fn case(name: &str) {
    let b = match RUN.get_or_init(run_battery) {
        Ok(b) => b,
        Err(why) => {
            println!("blktests nvme/{name}: skipped: {why}");
            return;
        }
    };
    let st = b.status.get(name).map(String::as_str);
    if st != Some("pass") {
        let tail: Vec<&str> = b.console.lines().rev().take(80).collect();
        let detail = match b.diffs.get(name) {
            Some(d) => d.clone(),
            None => tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
        };
        panic!("blktests nvme/{name} against blockwire: {}\n{detail}", st.unwrap_or("no verdict"));
    }
}

/// One #[test] per case, and CASES: every case the shared run runs.
macro_rules! cases {
    ($($name:ident => $case:literal),* $(,)?) => {
        const CASES: &[&str] = &[$($case),*];
        $( #[test] fn $name() { case($case) } )*
    };
}

cases! {
    nvme_004_uuid_ns_descriptors => "004",
    nvme_006_create_target => "006",
    // Not nvme/003: it passes, but blktests runs cases in numeric order and
    // the case after it then hangs until the VM's time runs out (seen in a
    // full make test; docs/notes/2026-11-25-blktests.md). It comes back
    // when that is understood.
}
