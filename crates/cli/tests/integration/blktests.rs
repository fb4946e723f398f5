//! blktests' `nvme` group, the Linux kernel's NVMe-oF test suite, against
//! blockwire: the guest's kernel (Debian's 6.12) is the host through its
//! nvme-tcp driver, blockwire serves in the guest, started empty and built
//! and torn down for each case by blktests through NVME_TARGET_CONTROL
//! (tests/blktests/blockwire-target-control, over `blockwire ctl`).
//!
//! One VM boot runs every case below (tests/blktests/run-vm.sh); each
//! #[test] reads its case's verdict from that shared run and, on failure,
//! shows the case's .out diff. The cases are among those that apply to an
//! external target over TCP and that blockwire passes, as many as fit make
//! test's time; docs/notes/2026-11-25-blktests.md has the whole table
//! (nvmet in the same VM, TCP and RDMA, the times, why the others do not
//! apply). Two more tests check what the run leaves behind. blktests comes
//! from BLKTESTS_DIR (default ../shared/blktests), copied and built in a
//! temporary directory; where it is absent every test is skipped
//! (common::skip: make test's summary counts and lists it as skipped).

use crate::common::*;
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// What the shared run saw: each case's status, its diff, the loop
/// devices left bound, the volume files blockwire still had open at the
/// end, the console.
struct Battery {
    status: HashMap<String, String>,
    diffs: HashMap<String, String>,
    loop_devices: Option<usize>,
    open_volumes: Option<usize>,
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
    c.env("KVM_TIMEOUT", "900");
    // Small namespaces: nvme/010 writes and verifies all of its namespace
    // with fio, at emulated speed.
    c.env("BLKTESTS_IMG_SIZE", "64M");
    let out = c.stdin(Stdio::null()).output().expect("run tests/blktests/run-vm.sh");
    let console = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let (mut status, mut diffs, mut loop_devices, mut open_volumes) = (HashMap::new(), HashMap::new(), None, None);
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
        } else if let Some(n) = line.strip_prefix("blktests-loop-devices: blockwire ") {
            loop_devices = n.trim().parse().ok();
        } else if let Some(n) = line.strip_prefix("blktests-open-volumes: blockwire ") {
            open_volumes = n.trim().parse().ok();
        }
    }
    Ok(Battery { status, diffs, loop_devices, open_volumes, console })
}

/// The shared run, or None (the calling test recorded as skipped, with
/// why) when blktests is not there.
fn battery() -> Option<&'static Battery> {
    match RUN.get_or_init(run_battery) {
        Ok(b) => Some(b),
        Err(why) => {
            skip(why);
            None
        }
    }
}

fn console_tail(b: &Battery) -> String {
    let tail: Vec<&str> = b.console.lines().rev().take(80).collect();
    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
}

fn case(name: &str) {
    let Some(b) = battery() else { return };
    let st = b.status.get(name).map(String::as_str);
    if st != Some("pass") {
        let detail = match b.diffs.get(name) {
            Some(d) => d.clone(),
            None => console_tail(b),
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

/// blktests leaves nothing bound on the host side: a loop device left by
/// one case (blktests' default backing, "device", under
/// NVME_TARGET_CONTROL) held the next case's `modprobe --remove --wait
/// loop` for good, and the run after nvme/003 hung.
#[test]
fn nvme_run_leaves_no_loop_device() {
    let Some(b) = battery() else { return };
    assert_eq!(b.loop_devices, Some(0), "loop devices left bound after the blktests run\n{}", console_tail(b));
}

/// Every case's cleanup removed its volume (`volume_remove`), and
/// blockwire closed its file: a deleted file held open keeps its space.
#[test]
fn nvme_removed_volumes_are_closed() {
    let Some(b) = battery() else { return };
    assert_eq!(b.open_volumes, Some(0), "blockwire still had volume files open after the run\n{}", console_tail(b));
}

// The cases blockwire passes over TCP, as many as fit make test's time
// (the others, with their times, are in the note's table).
cases! {
    nvme_003_discovery_keep_alive => "003",
    nvme_004_uuid_ns_descriptors => "004",
    nvme_010_fio_verify => "010",
    nvme_019_dsm_discard => "019",
    nvme_026_ns_descs => "026",
    nvme_027_ns_rescan => "027",
    nvme_040_reset_disconnect_during_io => "040",
    nvme_041_authenticated_connect => "041",
    nvme_043_auth_hash_and_dh_groups => "043",
    nvme_044_bidirectional_auth => "044",
}
