//! `make test` works on a clone of the repository alone: a clone with no
//! `../shared` beside it boots the project's own kernel VM harness
//! (tests/kernel-vm/vm) and runs `make audit`, which, with no advisory
//! snapshot and no way to fetch one, says so in one line and does not fail.
//!
//! The clone is of HEAD (what was committed). The live-database fetch is
//! pointed at a closed port on this machine through the proxy variables, so
//! the test sends nothing beyond loopback and fails to fetch at once.

use crate::common::*;
use std::process::Command;

/// A clone of HEAD in `dir/blockwire`, with nothing beside it.
fn clone_alone(dir: &TempDir) -> std::path::PathBuf {
    let dest = dir.path().join("blockwire");
    let out = Command::new("git")
        .args(["clone", "-q", "--no-hardlinks"])
        .arg(repo_root())
        .arg(&dest)
        .output()
        .expect("git clone");
    assert!(out.status.success(), "git clone failed: {}", String::from_utf8_lossy(&out.stderr));
    assert!(!dir.path().join("shared").exists());
    dest
}

#[test]
fn a_clone_alone_boots_the_kernel_vm_and_runs_make_audit() {
    require_root();
    let dir = TempDir::new("standalone");
    let clone = clone_alone(&dir);

    // The VM harness of the clone itself, with its smoke script.
    let mut vm = None;
    for _ in 0..3 {
        let out = Command::new(clone.join("tests/kernel-vm/vm"))
            .arg("run")
            .arg(clone.join("tests/kernel-vm/smoke.sh"))
            .env("KVM_TIMEOUT", "900")
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run the clone's tests/kernel-vm/vm");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let flaked = vm_boot_flaked(&text);
        vm = Some((out.status, text));
        if !flaked {
            break;
        }
    }
    let (status, console) = vm.unwrap();
    eprintln!("---- the clone's kernel VM ----\n{console}\n---- end ----");
    assert!(status.success(), "the clone's kernel VM smoke test failed ({status})");
    assert!(console.contains("SMOKE-DONE fails=0"), "no smoke summary in the console");
    assert!(!console.contains("\nFAIL "), "a smoke check failed");

    // make audit with no snapshot: one clear line, exit 0, and the marker
    // that makes `make test`'s summary say the audit did not run.
    let closed = format!("http://127.0.0.1:{}", free_port());
    let out = Command::new("make")
        .arg("audit")
        .current_dir(&clone)
        .env_remove("ADVISORY_DB")
        .envs(["https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "ALL_PROXY", "all_proxy"].map(|v| (v, closed.as_str())))
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("make audit");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("---- make audit in the clone ----\n{text}\n---- end ----");
    assert!(out.status.success(), "make audit failed without a snapshot; it must say so and go on");
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("audit: NOT RUN: ")).collect();
    assert_eq!(lines.len(), 1, "expected one 'audit: NOT RUN' line");
    assert!(lines[0].contains("no advisory database"), "{}", lines[0]);
    assert!(clone.join("target/audit.skipped").exists(), "no target/audit.skipped for make test's summary");
}

/// Without blktests (BLKTESTS_DIR names nothing), its tests skip
/// themselves (common::skip) and `make test`'s summary (tests/test-summary
/// on the run's output) counts them as skipped, none as passed, and lists
/// them with the reason. This test binary runs them itself, filtered to
/// blktests:: (each returns at once), with its own skip directory.
#[test]
fn tests_without_their_peer_count_as_skipped_in_the_summary() {
    let dir = TempDir::new("skips");
    let (skipped, log) = (dir.path().join("skipped"), dir.path().join("test.log"));
    let out = Command::new(std::env::current_exe().expect("this test binary"))
        .args(["blktests::", "--test-threads", "4"])
        .env("BLKTESTS_DIR", "/nonexistent")
        .env("BW_SKIPPED_DIR", &skipped)
        .output()
        .expect("run the blktests tests");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "blktests:: without blktests failed:\n{text}{}", String::from_utf8_lossy(&out.stderr));
    let ran = text.lines().filter(|l| l.starts_with("test blktests::") && l.ends_with(" ... ok")).count();
    assert_eq!(ran, 1, "blktests' test (every case and what the run leaves, from one VM run) did not run:\n{text}");
    std::fs::write(&log, &text).unwrap();

    let out = Command::new(repo_root().join("tests/test-summary")).arg(&log).arg(&skipped).output().expect("tests/test-summary");
    let summary = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "tests/test-summary: {summary}{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = summary.lines().collect();
    assert_eq!(lines.last(), Some(&"tests: 0 passed, 0 failed, 1 skipped"), "{summary}");
    // One line for the reason, naming the test.
    assert_eq!(lines.len(), 2, "{summary}");
    assert!(lines[0].starts_with("skipped: blktests not found at /nonexistent"), "{summary}");
    let named = lines[0].matches("blktests::").count();
    assert_eq!(named, 1, "{summary}");
}
