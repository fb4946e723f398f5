//! blktests' `nvme` group, the Linux kernel's NVMe-oF test suite, against
//! blockwire: the guest's kernel (Debian's 6.12) is the host through its
//! nvme-tcp driver, blockwire serves in the guest, started empty and built
//! and torn down for each case by blktests through NVME_TARGET_CONTROL
//! (tests/blktests/blockwire-target-control, over `blockwire ctl`).
//!
//! One VM boot runs every case below (tests/blktests/run-vm.sh), and one
//! #[test] reads every case's verdict from it and what the run left behind;
//! on failure it names each failed case with its .out diff. The cases are
//! among those that apply to an external target over TCP and that
//! blockwire passes, as many as fit make test's time;
//! docs/notes/2026-11-25-blktests.md has the whole table (nvmet in the
//! same VM, TCP and RDMA, the times, why the others do not apply). blktests
//! comes from BLKTESTS_DIR (default ../shared/blktests), copied and built
//! in a temporary directory; where it is absent the test is skipped
//! (common::skip: make test's summary counts and lists it as skipped).

use crate::common::*;
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};

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

fn blktests_src() -> PathBuf {
    std::env::var_os("BLKTESTS_DIR").map(PathBuf::from).unwrap_or_else(|| shared_dir().join("blktests"))
}

/// Every case's verdict, from the one VM run; Err: why it did not run
/// (blktests is not there).
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

/// The run, or None (the test recorded as skipped, with why) when
/// blktests is not there.
fn battery() -> Option<Battery> {
    match run_battery() {
        Ok(b) => Some(b),
        Err(why) => {
            skip(&why);
            None
        }
    }
}

fn console_tail(b: &Battery) -> String {
    let tail: Vec<&str> = b.console.lines().rev().take(80).collect();
    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
}

/// Why `name` failed, or None when it passed.
fn case_failure(b: &Battery, name: &str) -> Option<String> {
    let st = b.status.get(name).map(String::as_str);
    if st == Some("pass") {
        return None;
    }
    let detail = b.diffs.get(name).cloned().unwrap_or_default();
    Some(format!("blktests nvme/{name} against blockwire: {}\n{detail}", st.unwrap_or("no verdict")))
}

/// Every case of the shared run, and what the run leaves behind, in one
/// #[test]: the run is one VM boot of about three minutes, and one test
/// per case had libtest's second thread block on the same run for all of
/// it (make test's wall time, not its coverage). The failure message names
/// every case that failed, with its .out diff.
#[test]
fn nvme_group_passes_and_leaves_nothing() {
    let Some(b) = battery() else { return };
    let mut failed: Vec<String> = CASES.iter().filter_map(|c| case_failure(&b, c)).collect();
    // blktests leaves nothing bound on the host side: a loop device left by
    // one case (blktests' default backing, "device", under
    // NVME_TARGET_CONTROL) held the next case's `modprobe --remove --wait
    // loop` for good, and the run after nvme/003 hung.
    if b.loop_devices != Some(0) {
        failed.push(format!("loop devices left bound after the blktests run: {:?}", b.loop_devices));
    }
    // Every case's cleanup removed its volume (`volume_remove`), and
    // blockwire closed its file: a deleted file held open keeps its space.
    if b.open_volumes != Some(0) {
        failed.push(format!("blockwire still had volume files open after the run: {:?}", b.open_volumes));
    }
    assert!(failed.is_empty(), "{} of {} checks failed:\n{}\n--- console tail\n{}", failed.len(), CASES.len() + 2, failed.join("\n"), console_tail(&b));
}

// The cases blockwire passes over TCP, as many as fit make test's time
// (the others, with their times, are in the note's table).
// nvme/003 discovery keep-alive, 004 UUID namespace descriptors, 010 fio
// verify, 019 DSM discard, 026 namespace descriptors, 027 namespace rescan,
// 040 reset and disconnect during I/O, 041 authenticated connect, 043 auth
// hashes and DH groups, 044 bidirectional auth.
const CASES: &[&str] = &["003", "004", "010", "019", "026", "027", "040", "041", "043", "044"];
