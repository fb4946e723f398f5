//! Linux open-iscsi + iscsi_tcp (in a real Debian kernel under qemu, via
//! tests/kernel-vm/vm) against `blockwire serve --iscsi`: discovery,
//! (refused without CHAP, then with mutual CHAP), login without and with
//! mutual CHAP, a wrong secret refused, O_DIRECT
//! write/read/compare, ext4 + e2fsck, logout. Guest script:
//! tests/kernel-vm/iscsi.sh.

use crate::common;
use common::*;

#[test]
fn linux_open_iscsi_against_blockwire() {
    require_root();
    let port = free_port();
    let dir = TempDir::new("iscsikvm");
    let iqn = "iqn.2026-11.org.blockwire.test:plain";
    let iqn_chap = "iqn.2026-11.org.blockwire.test:chap";
    let (user, secret, muser, msecret) = ("guest-user", "guest-secret-123", "target-user", "target-secret-456");
    let (duser, dsecret, dmuser, dmsecret) = ("scan-user", "scan-secret-789", "portal-user", "portal-secret-012");
    let config = format!(
        r#"
[[volume]]
name = "d0"
backend = "ram:64M"
[[volume]]
name = "d1"
backend = "ram:16M"
[iscsi]
listen = ["127.0.0.1:{port}"]
discovery_chap = {{ user = "{duser}", secret = "{dsecret}" }}
discovery_mutual_chap = {{ user = "{dmuser}", secret = "{dmsecret}" }}
[[iscsi.target]]
iqn = "{iqn}"
luns = [{{ lun = 0, volume = "d0" }}]
[[iscsi.target]]
iqn = "{iqn_chap}"
luns = [{{ lun = 0, volume = "d1" }}]
allowed_initiators = ["iqn.2026-11.org.debian:kernel-vm"]
chap = {{ user = "{user}", secret = "{secret}" }}
mutual_chap = {{ user = "{muser}", secret = "{msecret}" }}
"#
    );
    let script = std::fs::read_to_string(repo_root().join("tests/kernel-vm/iscsi.sh")).unwrap();
    let script = script
        .replace("@PORT@", &port.to_string())
        .replace("@IQN_CHAP@", iqn_chap)
        .replace("@IQN@", iqn)
        .replace("@USER@", user)
        .replace("@SECRET@", secret)
        .replace("@MUSER@", muser)
        .replace("@MSECRET@", msecret)
        .replace("@DUSER@", duser)
        .replace("@DSECRET@", dsecret)
        .replace("@DMUSER@", dmuser)
        .replace("@DMSECRET@", dmsecret);
    let script_path = dir.path().join("iscsi.sh");
    std::fs::write(&script_path, script).unwrap();
    let mut serve = Serve::with_config(&dir, &config, &[]);
    let run = kernel_vm(&script_path, None, None);
    assert!(serve.is_running(), "target died:\n{}", serve.log_text());
    assert!(run.output.contains("iscsi-guest: ALL OK"), "guest script did not finish:\n{}", run.output);
    assert!(run.status.success(), "guest script failed ({}):\n{}", run.status, run.output);
    // The wrong secret was refused with an authentication failure.
    assert!(serve.log_text().contains("status 0x0201"), "no 0x0201 refusal in the target log:\n{}", serve.log_text());
}
