//! The lab's subjects beyond its own targets (issue 39), on this machine:
//! an external subject (a `blockwire serve` this test starts and hands to
//! the lab by URL, as a user hands it their array) is measured read-only
//! unless `--allow-writes` names it, never written otherwise, and its
//! identity is in results.json; and a kernel peer this machine's kernel
//! cannot run (LIO: no configfs targets here) is one "unavailable" line
//! while the run goes on. Needs root (the lab's namespaces).

use crate::common::{require_root, unique, Serve};
use crate::lab_e2e::{assert_nothing_left, out_dir, run_lab};
use std::path::Path;

fn results(out: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).expect("results.json")).expect("JSON")
}

/// Workload names of `key`'s samples.
fn workloads_of(r: &serde_json::Value, key: &str) -> Vec<String> {
    let mut v: Vec<String> =
        r["samples"].as_array().unwrap().iter().filter(|s| s["subject"] == key).map(|s| s["workload"]["name"].as_str().unwrap().to_string()).collect();
    v.sort();
    v.dedup();
    v
}

fn subject<'a>(r: &'a serde_json::Value, key: &str) -> &'a serde_json::Value {
    r["subjects"].as_array().unwrap().iter().find(|s| s["key"] == key).unwrap_or_else(|| panic!("no subject {key} in {}", r["subjects"]))
}

fn checksum(p: &Path) -> String {
    let out = std::process::Command::new("sha256sum").arg(p).output().expect("sha256sum");
    String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap_or_default().to_string()
}

#[test]
fn an_external_subject_is_measured_read_only_unless_writes_are_allowed() {
    require_root();
    let dir = out_dir(&unique("ext"));
    // The "array": a LUN whose contents the lab must not touch.
    let lun = dir.join("lun.img");
    let pattern: Vec<u8> = (0..32u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(&lun, &pattern).unwrap();
    let before = checksum(&lun);
    let port = crate::common::free_port().to_string();
    let iqn = format!("iqn.2026-11.org.example:{}", unique("array"));
    let toml = format!(
        "[[volume]]\nname = \"lun\"\nbackend = \"file:{}\"\n[iscsi]\nlisten = [\"127.0.0.1:{port}\"]\n[[iscsi.target]]\niqn = \"{iqn}\"\nluns = [{{ lun = 0, volume = \"lun\" }}]\n",
        lun.display()
    );
    let cfg = dir.join("array.toml");
    std::fs::write(&cfg, toml).unwrap();
    let array = Serve::start(&["--config", &cfg.to_string_lossy()]);
    let url = format!("arr=iscsi://127.0.0.1:{port}/{iqn}/0");
    let common = ["--quick", "--suite", "micro", "--protocols", "iscsi", "--peers", "none", "--repeat", "1", "--size", "16M", "--runtime", "1", "--no-baseline", "--micro-workloads", "randread-4k-qd1,randwrite-4k-qd32", "--subject", &url];

    // 1. Without --allow-writes: reads only, the write case named, the LUN untouched.
    let out1 = dir.join("read-only");
    let (pid, children, stderr) = run_lab(&common, &out1);
    assert_nothing_left(pid, &children);
    assert!(
        stderr.contains("lab: arr-iscsi: read workloads only: randwrite-4k-qd32 skipped") && stderr.contains("--allow-writes arr"),
        "the skipped write case is named with its reason: {stderr}"
    );
    let r = results(&out1);
    assert_eq!(workloads_of(&r, "arr-iscsi"), ["randread-4k-qd1"], "{stderr}");
    assert_eq!(workloads_of(&r, "blockwire-iscsi"), ["randread-4k-qd1", "randwrite-4k-qd32"]);
    let s = subject(&r, "arr-iscsi");
    assert_eq!(s["external"], true, "{s}");
    assert_eq!(s["target"], "arr");
    assert_eq!(s["identity"], "BLKWIRE blockwire disk 010", "SCSI INQUIRY vendor, product, revision: {s}");
    assert!(s["skipped"].as_str().unwrap().contains("randwrite-4k-qd32"), "{s}");
    for x in r["samples"].as_array().unwrap().iter().filter(|x| x["subject"] == "arr-iscsi") {
        assert!(x["bench"]["ios"].as_u64().unwrap() > 0 && x["target_cpu_s"].is_null() && x["wire"].is_null(), "{x}");
    }
    assert_eq!(checksum(&lun), before, "the lab wrote to an external LUN it was not allowed to write");
    let html = std::fs::read_to_string(out1.join("report.html")).unwrap();
    assert!(html.contains("external: arr (BLKWIRE blockwire disk 010)"), "the subject table shows it as external");

    // 2. With --allow-writes: every workload.
    let out2 = dir.join("writes");
    let mut args = common.to_vec();
    args.extend(["--allow-writes", "arr"]);
    let (pid, children, stderr) = run_lab(&args, &out2);
    assert_nothing_left(pid, &children);
    let r = results(&out2);
    assert_eq!(workloads_of(&r, "arr-iscsi"), ["randread-4k-qd1", "randwrite-4k-qd32"], "{stderr}");
    assert!(subject(&r, "arr-iscsi").get("skipped").is_none());
    assert_ne!(checksum(&lun), before, "--allow-writes let the write case write");
    drop(array);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn lio_here_is_one_unavailable_line_and_the_run_goes_on() {
    require_root();
    let out = out_dir(&unique("lio"));
    let args = ["--quick", "--suite", "micro", "--protocols", "iscsi", "--peers", "lio", "--repeat", "1", "--size", "16M", "--runtime", "1", "--no-baseline", "--micro-workloads", "randread-4k-qd1"];
    let (pid, children, stderr) = run_lab(&args, &out);
    assert_nothing_left(pid, &children);
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("lio-iscsi") || l.contains("configfs") || l.contains("LIO")).collect();
    assert_eq!(lines.len(), 1, "one line about LIO: {stderr}");
    assert!(lines[0].starts_with("lab: lio-iscsi at MTU 1500: unavailable: no configfs target support"), "{}", lines[0]);
    let r = results(&out);
    assert!(subject(&r, "lio-iscsi")["unavailable"].as_str().unwrap().starts_with("no configfs target support"));
    assert_eq!(workloads_of(&r, "blockwire-iscsi"), ["randread-4k-qd1"], "the run went on: {stderr}");
    // Nothing of LIO was loaded or mounted here.
    assert!(!Path::new("/sys/kernel/config/target").exists() && !Path::new("/sys/module/target_core_mod").exists());
    let _ = std::fs::remove_dir_all(&out);
}

/// A NAS's export (nfs-ganesha in a namespace of its own, started by the
/// test): the lab makes its own image file there, measures every workload
/// on it (only its file is written), names the server and export, and
/// removes the file at the end; the user's file beside it stays.
#[test]
fn an_nfs_export_gets_the_labs_own_image_file_and_nothing_else() {
    require_root();
    let dir = out_dir(&unique("nas"));
    let g = crate::common::ganesha::Ganesha::start(&dir.join("export"));
    let theirs = g.dir.join("theirs.img");
    std::fs::write(&theirs, b"the user's data").unwrap();
    let export = g.url("x");
    let export = export.trim_end_matches("/x");
    let out = dir.join("run");
    let args = ["--quick", "--suite", "micro", "--protocols", "iscsi", "--peers", "none", "--repeat", "1", "--size", "16M", "--runtime", "1", "--no-baseline", "--micro-workloads", "randread-4k-qd1,randwrite-4k-qd32", "--subject", &format!("nas={export}")];
    let (pid, children, stderr) = run_lab(&args, &out);
    assert_nothing_left(pid, &children);
    let r = results(&out);
    assert_eq!(workloads_of(&r, "nas-nfs"), ["randread-4k-qd1", "randwrite-4k-qd32"], "{stderr}");
    let s = subject(&r, "nas-nfs");
    assert_eq!(s["external"], true);
    assert_eq!(s["identity"], format!("NFS server {}:2049, export {}", g.ip, bw_lab::subjects::ganesha::EXPORT), "{s}");
    let left: Vec<String> = std::fs::read_dir(&g.dir).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(left, ["theirs.img"], "the lab's image file is removed, the user's file stays");
    assert_eq!(std::fs::read(&theirs).unwrap(), b"the user's data");
    drop(g);
    let _ = std::fs::remove_dir_all(&dir);
}
