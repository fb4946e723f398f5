//! The CLI itself: help on every subcommand, config handling, clear errors.

use crate::common;
use common::*;

#[test]
fn every_subcommand_has_help() {
    for sub in [
        vec!["--help"],
        vec!["serve", "--help"],
        vec!["verify", "--help"],
        vec!["bench", "--help"],
        vec!["aoe", "discover", "--help"],
        vec!["iscsi", "discover", "--help"],
        vec!["nvme", "discover", "--help"],
        vec!["lab", "--help"],
    ] {
        let out = blockwire_ok(None, &sub);
        assert!(out.contains("Usage:"), "{sub:?}: {out}");
    }
}

#[test]
fn print_config_merges_file_and_flags() {
    let dir = TempDir::new("cfg");
    let cfg = dir.path().join("serve.toml");
    std::fs::write(&cfg, "[[volume]]\nname = \"a\"\nbackend = \"ram:16M\"\n").unwrap();
    let out = blockwire_ok(
        None,
        &["serve", "--config", cfg.to_str().unwrap(), "--volume", "b=ram:8M", "--iscsi", "127.0.0.1:3999", "--print-config"],
    );
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON config");
    assert_eq!(v["volume"].as_array().unwrap().len(), 2);
    assert_eq!(v["iscsi"]["target"][0]["luns"].as_array().unwrap().len(), 2);
}

/// The tuning knobs (once environment variables) are settings: defaults
/// shown by --print-config, set from the file, overridden by flags, and
/// bad values refused.
#[test]
fn tuning_settings_come_from_file_and_flags() {
    let dir = TempDir::new("tuning");
    let cfg = dir.path().join("serve.toml");
    std::fs::write(&cfg, "[tuning]\naoe_fanout = \"cpu\"\niscsi_inline_max = 8192\n").unwrap();
    let base = ["serve", "--volume", "b=ram:8M", "--iscsi", "127.0.0.1:3999", "--print-config"];
    let defaults: serde_json::Value = serde_json::from_str(&blockwire_ok(None, &base)).expect("JSON config");
    let t = &defaults["tuning"];
    assert_eq!(
        (t["aoe_workers"].as_u64(), t["aoe_io_threads"].as_u64(), t["aoe_fanout"].as_str(), t["aoe_datapath"].as_str()),
        (Some(0), Some(0), Some("round-robin"), Some("auto"))
    );
    assert_eq!(
        (t["iscsi_connection_threads"].as_bool(), t["zero_copy_min"].as_u64(), t["inline_max"].as_u64(), t["commands_per_send"].as_u64()),
        (Some(true), Some(32768), Some(65536), Some(0))
    );
    let mut args = base.to_vec();
    args.extend(["--config", cfg.to_str().unwrap(), "--iscsi-zero-copy-min", "1M", "--aoe-workers", "3", "--iscsi-connection-threads", "false", "--aoe-datapath", "packet"]);
    let set: serde_json::Value = serde_json::from_str(&blockwire_ok(None, &args)).expect("JSON config");
    let t = &set["tuning"];
    assert_eq!((t["aoe_fanout"].as_str(), t["inline_max"].as_u64()), (Some("cpu"), Some(8192)), "from the file (its former name)");
    assert_eq!((t["zero_copy_min"].as_u64(), t["aoe_workers"].as_u64()), (Some(1 << 20), Some(3)), "from flags");
    assert_eq!((t["iscsi_connection_threads"].as_bool(), t["aoe_datapath"].as_str()), (Some(false), Some("packet")));
    for (bad, needle) in [
        (vec!["--aoe-workers", "65"], "aoe_workers"),
        (vec!["--aoe-fanout", "rr"], "round-robin or cpu"),
        (vec!["--aoe-datapath", "af_xdp"], "auto, xdp, mmap or packet"),
    ] {
        let mut args = base.to_vec();
        args.extend(bad);
        let out = blockwire(None, &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn bad_input_gets_a_clear_error() {
    for (args, needle) in [
        (vec!["serve", "--volume", "x=ram:1M"], "nothing to serve"),
        (vec!["serve", "--volume", "x=tape:1", "--iscsi", "127.0.0.1:3998"], "invalid backend"),
        (vec!["serve", "--volume", "noequals", "--iscsi", "127.0.0.1:3998"], "NAME=BACKEND"),
        (vec!["verify", "ftp://x/y", "--size", "1M"], "unknown scheme"),
        (vec!["bench", "aoe://lo/1.1"], "--runtime"),
    ] {
        let out = blockwire(None, &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(needle), "{args:?}: {err}");
    }
}

/// Each error names the object it is about and says the cause once (an
/// error printed as its message and again as its source read
/// `X (os error 2): X (os error 2)`).
#[test]
fn errors_name_the_object_and_say_the_cause_once() {
    let closed = free_port();
    let url = format!("iscsi://127.0.0.1:{closed}/iqn.2026-11.org.blockwire.test:none/0");
    let nvme = format!("nvme+tcp://127.0.0.1:{closed}/nqn.2026-11.org.blockwire.test:none/1");
    let port = free_port().to_string();
    let listen = format!("127.0.0.1:{port}");
    for (args, names, cause) in [
        (vec!["serve", "--volume", "d0=file:/no/such/dir/x", "--iscsi", listen.as_str()], "/no/such/dir/x", "(os error 2)"),
        (vec!["serve", "--config", "/no/such/dir/bw.toml"], "/no/such/dir/bw.toml", "(os error 2)"),
        (vec!["verify", url.as_str(), "--size", "1M"], url.as_str(), "(os error 111)"),
        (vec!["verify", nvme.as_str(), "--size", "1M"], nvme.as_str(), "(os error 111)"),
        // No such interface: nothing is opened.
        (vec!["serve", "--volume", "d0=ram:1M", "--aoe", "bwnosuch0,volume=d0,shelf=1,slot=0"], "bwnosuch0", "AoE"),
    ] {
        let out = blockwire(None, &args);
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().last().unwrap_or_default();
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(last.contains(names), "{args:?}: does not name {names}: {last}");
        assert_eq!(last.matches(cause).count(), 1, "{args:?}: cause not said exactly once: {last}");
    }
}
