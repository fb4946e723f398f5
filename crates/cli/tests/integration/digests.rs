//! CRC32C digests computed two ways (serve's `[tuning] digest_impl`, the
//! client's `--digest-impl`): a target on the portable tables and an
//! initiator on the CPU's CRC instruction, and the other way round, agree on
//! every iSCSI and NVMe/TCP header and data digest. (That a corrupt digest is
//! still caught with either implementation is checked at the decoders:
//! bw-iscsi `digest_errors_detected`, bw-nvme
//! `digest_mismatches_caught_with_either_crc_implementation`.)

use crate::common::*;

const IQN: &str = "iqn.2026-11.org.blockwire:digests";
const NQN: &str = "nqn.2026-11.org.blockwire:digests";

fn serve(dir: &TempDir, digest_impl: &str) -> (Serve, String, String) {
    let (ip, nport) = (free_port(), free_port());
    let toml = format!(
        r#"
[[volume]]
name = "d"
backend = "ram:16M"
[iscsi]
listen = ["127.0.0.1:{ip}"]
[[iscsi.target]]
iqn = "{IQN}"
luns = [{{ lun = 0, volume = "d" }}]
[nvme]
listen = ["127.0.0.1:{nport}"]
discovery_listen = "127.0.0.1:{}"
[[nvme.subsystem]]
nqn = "{NQN}"
namespaces = [{{ nsid = 1, volume = "d" }}]
[tuning]
digest_impl = "{digest_impl}"
"#,
        free_port()
    );
    let s = Serve::with_config(dir, &toml, &[]);
    (s, format!("iscsi://127.0.0.1:{ip}/{IQN}/0"), format!("nvme+tcp://127.0.0.1:{nport}/{NQN}/1"))
}

#[test]
fn soft_and_hardware_crc32c_agree_on_the_wire() {
    for (target, client) in [("soft", "hw"), ("hw", "soft"), ("soft", "soft")] {
        let dir = TempDir::new("dig");
        let (s, iscsi, nvme) = serve(&dir, target);
        for url in [&iscsi, &nvme] {
            blockwire_ok(None, &["verify", url, "--size", "2M", "--chunk", "12k", "--header-digest", "--data-digest", "--digest-impl", client]);
        }
        let log = s.log_text();
        assert!(log.contains("header: true, data: true"), "iSCSI negotiated both digests (target {target}): {log}");
        s.stop();
    }
}
