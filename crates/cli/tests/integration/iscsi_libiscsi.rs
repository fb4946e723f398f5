//! libiscsi's conformance suite (`iscsi-test-cu`, Debian libiscsi-bin 1.19)
//! against `blockwire serve --iscsi`: the gate list from PROTOCOLS.md plus
//! iSCSIResiduals and iSCSIdatasn must all pass.

use crate::common;
use common::*;
use std::process::Command;

const GATE: &[&str] = &[
    "SCSI.Inquiry",
    "SCSI.Mandatory",
    "SCSI.ModeSense6",
    "SCSI.NoMedia",
    "SCSI.Prefetch10",
    "SCSI.Prefetch16",
    "SCSI.PreventAllow",
    "SCSI.ReadCapacity10",
    "SCSI.ReadCapacity16",
    "SCSI.Read6",
    "SCSI.Read10",
    "SCSI.Read12",
    "SCSI.Read16",
    "SCSI.ReadOnly",
    "SCSI.ReportSupportedOpcodes.Simple",
    "SCSI.Reserve6.Simple",
    "SCSI.StartStopUnit",
    "SCSI.TestUnitReady",
    "SCSI.Write10",
    "SCSI.Write12",
    "SCSI.Write16",
    "SCSI.WriteVerify10",
    "SCSI.WriteVerify12",
    "SCSI.WriteVerify16",
    "SCSI.Verify10",
    "SCSI.Verify12",
    "SCSI.Verify16",
    "SCSI.WriteSame10.Simple",
    "SCSI.WriteSame16.Simple",
    "SCSI.Unmap.Simple",
    "SCSI.Unmap.VPD",
    "SCSI.Unmap.ZeroBlocks",
    "iSCSI.iSCSITMF",
    "iSCSI.iSCSIcmdsn",
    "iSCSI.iSCSIResiduals",
    "iSCSI.iSCSIdatasn",
];

fn have_test_cu() -> bool {
    Command::new("iscsi-test-cu").arg("-l").output().is_ok_and(|o| o.status.success())
}

/// Run suites and return (passed, failed, full output).
fn run_suites(url: &str, tests: &str, extra: &[&str]) -> (u32, u32, String) {
    let out = Command::new("iscsi-test-cu")
        .args(["--dataloss", "-t", tests])
        .args(extra)
        .arg(url)
        .output()
        .expect("run iscsi-test-cu");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    // "  tests  138  138  138  0  0" in the CUnit run summary.
    let line = text.lines().find(|l| l.trim_start().starts_with("tests")).unwrap_or_else(|| panic!("no CUnit summary:\n{text}"));
    let n: Vec<u32> = line.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    assert!(n.len() >= 4, "odd summary line {line:?}");
    (n[2], n[3], text)
}

fn failed_tests(text: &str) -> Vec<String> {
    let mut cur = String::new();
    let mut out = Vec::new();
    for l in text.lines() {
        if let Some(t) = l.trim_start().strip_prefix("Test: ") {
            cur = t.split(" ...").next().unwrap_or(t).to_string();
        }
        if l.contains("FAILED") && !cur.is_empty() && out.last() != Some(&cur) {
            out.push(cur.clone());
        }
    }
    out
}

#[test]
fn libiscsi_gate_passes() {
    if !have_test_cu() {
        panic!("iscsi-test-cu not found: install Debian package libiscsi-bin");
    }
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let serve = Serve::start(&["--volume", "d0=ram:128M", "--iscsi", &listen]);
    let log = serve.log_text();
    let iqn = log
        .lines()
        .find_map(|l| l.split("iSCSI target ").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no target IQN printed at start-up:\n{log}"))
        .to_string();
    let url = format!("iscsi://{listen}/{iqn}/0");
    let (passed, failed, text) = run_suites(&url, &GATE.join(","), &[]);
    eprintln!("{text}");
    assert_eq!(failed, 0, "libiscsi gate failures: {:?}", failed_tests(&text));
    assert!(passed >= 130, "only {passed} libiscsi tests ran and passed");
}

/// A read-only LUN (`readonly = true` in the config): libiscsi's ReadOnly
/// suite checks that writes fail with DATA PROTECT and that MODE SENSE
/// reports WP; the gate above ran it against a writable LUN, where it skips.
#[test]
fn libiscsi_read_only_lun() {
    if !have_test_cu() {
        panic!("iscsi-test-cu not found: install Debian package libiscsi-bin");
    }
    let port = free_port();
    let dir = TempDir::new("iscsiro");
    let cfg = format!(
        "[[volume]]\nname = \"d0\"\nbackend = \"ram:16M\"\n[iscsi]\nlisten = [\"127.0.0.1:{port}\"]\n\
         [[iscsi.target]]\niqn = \"iqn.2026-11.org.blockwire.test:ro\"\nluns = [{{ lun = 0, volume = \"d0\", readonly = true }}]\n"
    );
    let _serve = Serve::with_config(&dir, &cfg, &[]);
    let url = format!("iscsi://127.0.0.1:{port}/iqn.2026-11.org.blockwire.test:ro/0");
    let (passed, failed, text) = run_suites(&url, "SCSI.ReadOnly", &[]);
    eprintln!("{text}");
    assert_eq!(failed, 0, "ReadOnly failures: {:?}", failed_tests(&text));
    assert!(passed >= 1);
    // A LUN that is not reported write-protected makes the suite return
    // after one or two checks; a real run makes a dozen or more.
    let asserts: Vec<u32> = text
        .lines()
        .find(|l| l.trim_start().starts_with("asserts"))
        .map(|l| l.split_whitespace().filter_map(|w| w.parse().ok()).collect())
        .unwrap_or_default();
    assert!(asserts.get(2).is_some_and(|n| *n >= 10), "ReadOnly suite did not really run:\n{text}");
}
