//! The tools an administrator types against blockwire, run by a real Linux
//! kernel (tests/kernel-vm/vm), in one boot: nvme-cli over the kernel
//! nvme-tcp host (discover, connect, identify, every mandatory log page and
//! feature, read/write/compare/write-zeroes/dsm/flush, reset, disconnect) and
//! sg3-utils over open-iscsi (INQUIRY and every listed VPD page, mode and log
//! pages, READ CAPACITY, persistent reservations, WRITE SAME, UNMAP, GET LBA
//! STATUS, REPORT TARGET PORT GROUPS, out-of-range and malformed requests
//! refused with the right sense). Guest script:
//! tests/kernel-vm/conformance.sh; each check prints one PASS/FAIL line.

use crate::common;
use common::*;

const NQN: &str = "nqn.2026-11.org.blockwire:conformance";
const HOSTNQN: &str = "nqn.2026-11.org.blockwire:kernel-vm";
const IQN: &str = "iqn.2026-11.org.blockwire:conformance";
/// How many checks the battery runs; a check that silently disappears (a
/// loop over VPD pages that found none, say) must fail the test too.
const EXPECTED_CHECKS: usize = 114;

#[test]
fn nvme_cli_and_sg3_utils_against_blockwire() {
    require_root();
    let dir = TempDir::new("conf");
    let (port, dport, iport) = (free_port(), free_port(), free_port());
    let cfg = format!(
        r#"
[[volume]]
name = "n0"
backend = "file:{d}/nvme.img,size=64M"
[[volume]]
name = "s0"
backend = "file:{d}/scsi.img,size=64M"
[nvme]
listen = ["127.0.0.1:{port}"]
discovery_listen = "127.0.0.1:{dport}"
[[nvme.subsystem]]
nqn = "{NQN}"
namespaces = [{{ nsid = 1, volume = "n0" }}]
[iscsi]
listen = ["127.0.0.1:{iport}"]
[[iscsi.target]]
iqn = "{IQN}"
luns = [{{ lun = 0, volume = "s0" }}]
"#,
        d = dir.path().display()
    );
    let mut serve = Serve::with_config(&dir, &cfg, &[]);
    let script = dir.path().join("conformance.sh");
    let body = std::fs::read_to_string(repo_root().join("tests/kernel-vm/conformance.sh")).unwrap();
    std::fs::write(
        &script,
        format!("PORT={port}\nDPORT={dport}\nNQN={NQN}\nHOSTNQN={HOSTNQN}\nISCSI_PORT={iport}\nIQN={IQN}\n{body}"),
    )
    .unwrap();
    let run = kernel_vm(&script, None, None);
    assert!(serve.is_running(), "target died:\n{}", serve.log_text());
    let lines: Vec<&str> = run.output.lines().map(str::trim).collect();
    let failed: Vec<&str> = lines.iter().copied().filter(|l| l.starts_with("FAIL ")).collect();
    let passed = lines.iter().filter(|l| l.starts_with("PASS ")).count();
    assert!(run.output.contains("CONFORMANCE-DONE"), "battery did not finish:\n{}", run.output);
    assert!(failed.is_empty(), "{} of {} checks failed:\n{}", failed.len(), passed + failed.len(), failed.join("\n"));
    assert_eq!(passed, EXPECTED_CHECKS, "the battery ran a different number of checks");
    assert!(serve.stop().success());
}
