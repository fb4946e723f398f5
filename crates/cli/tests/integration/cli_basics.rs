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

/// Help, the README's opening and docs/control.md's method tables name
/// what the registries define: the transports (`bw_serve::start`), the
/// lab's peers and protocols (`bw_lab::subjects`), its fs workloads and
/// file systems, flowop's personalities, the control methods
/// (`bw_control::methods`, `bw_control::spdk`). Help is made from them
/// (help.rs); the hand-written text is compared with them here.
mod from_the_registries {
    use super::*;
    use bw_control::{jsonrpc, methods, spdk};
    use bw_lab::subjects::{PeerKind, Protocol};
    use bw_serve::start::TRANSPORTS;
    use clap::ValueEnum;
    use std::collections::BTreeSet;

    fn repo_file(name: &str) -> String {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().parent().unwrap();
        std::fs::read_to_string(root.join(name)).unwrap()
    }

    /// `word` in `text` as a word of its own (`tgt` is not in `tgtd`;
    /// `ganesha` is in `nfs-ganesha`).
    fn has_word(text: &str, word: &str) -> bool {
        let edge = |c: Option<char>| c.is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
        text.match_indices(word).any(|(i, _)| edge(text[..i].chars().next_back()) && edge(text[i + word.len()..].chars().next()))
    }

    fn missing<'a>(text: &str, words: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
        words.into_iter().filter(|w| !has_word(text, w)).collect()
    }

    #[test]
    fn help_names_every_transport_peer_and_protocol() {
        let top = blockwire_ok(None, &["--help"]);
        assert_eq!(missing(&top, TRANSPORTS.iter().map(|t| t.name)), Vec::<&str>::new(), "blockwire --help:\n{top}");
        let serve = blockwire_ok(None, &["serve", "--help"]);
        assert_eq!(missing(&serve, TRANSPORTS.iter().map(|t| t.name)), Vec::<&str>::new(), "serve --help:\n{serve}");
        let flags: Vec<String> = TRANSPORTS.iter().map(|t| format!("--{}", t.flag)).collect();
        assert_eq!(missing(&serve, flags.iter().map(String::as_str)), Vec::<&str>::new(), "serve --help:\n{serve}");
        let lab = blockwire_ok(None, &["lab", "--help"]);
        let peers = PeerKind::all().iter().map(|p| p.name());
        assert_eq!(missing(&lab, peers), Vec::<&str>::new(), "lab --help:\n{lab}");
        let protocols = Protocol::value_variants().iter().map(|p| p.name());
        assert_eq!(missing(&lab, protocols), Vec::<&str>::new(), "lab --help:\n{lab}");
        let fs_workloads = bw_lab_results::fs::ALL.iter().map(|w| w.name());
        assert_eq!(missing(&lab, fs_workloads), Vec::<&str>::new(), "lab --help:\n{lab}");
        let file_systems = bw_lab::suites::fs::fs_kind::ALL.iter().map(|k| k.name());
        assert_eq!(missing(&lab, file_systems), Vec::<&str>::new(), "lab --help:\n{lab}");
        let top = blockwire_ok(None, &["--help"]);
        let flowop = blockwire_ok(None, &["flowop", "--help"]);
        // The top help shows flowop's about; flowop's own also PERSONALITY's
        // help (hand-written: `mut_arg` would move the positional).
        let personality = flowop.lines().find(|l| l.trim_start().starts_with("<PERSONALITY>")).unwrap_or(&flowop);
        for (text, line, what) in [(&top, "filebench-style", "blockwire --help"), (&flowop, "filebench-style", "flowop --help"), (&flowop, personality, "flowop --help")] {
            let about = text.lines().find(|l| l.contains(line)).unwrap_or(text);
            assert_eq!(missing(about, bw_workload::flowop::NAMES), Vec::<&str>::new(), "{what}:\n{text}");
        }
        assert!(flowop.contains("<PERSONALITY> <DIR>"), "flowop takes PERSONALITY then DIR:\n{flowop}");
    }

    /// The README's opening paragraph ("blockwire is ..."): every transport,
    /// every peer target, and what the control methods offer (pools,
    /// snapshots, clones, the SPDK-compatible methods) and the CSI plugin.
    #[test]
    fn readme_opening_names_every_transport_peer_and_feature() {
        let readme = repo_file("README.md");
        let start = readme.find("\nblockwire is ").expect("the README opens with \"blockwire is ...\"");
        let opening = &readme[start..start + readme[start..].find("\n\n").unwrap()];
        let mut words: Vec<&str> = TRANSPORTS.iter().map(|t| t.name).collect();
        words.extend(PeerKind::all().iter().map(|p| p.target().target_name()));
        let names: Vec<&str> = jsonrpc::all_methods().map(|m| m.name).collect();
        // A feature the methods offer, by the word a reader looks for.
        for (method_part, word) in [("pool_", "pools"), ("snapshot", "snapshots"), ("clone", "clones")] {
            if names.iter().any(|n| n.contains(method_part)) {
                words.push(word);
            }
        }
        if !spdk::METHODS.is_empty() {
            words.push("SPDK-compatible");
        }
        let help = blockwire_ok(None, &["--help"]);
        if help.lines().any(|l| l.trim_start().starts_with("csi ")) {
            words.push("CSI");
        }
        // Prose capitalises as it likes (LIO, lio).
        let lower: Vec<String> = words.iter().map(|w| w.to_lowercase()).collect();
        let opening_lower = opening.to_lowercase();
        let absent = missing(&opening_lower, lower.iter().map(String::as_str));
        assert_eq!(absent, Vec::<&str>::new(), "README's opening paragraph:{opening}");
    }

    /// The method names docs/control.md's table in section `heading` lists.
    fn documented_methods(doc: &str, heading: &str) -> BTreeSet<String> {
        let section = doc.split("\n## ").find(|s| s.starts_with(heading)).unwrap_or_else(|| panic!("no section {heading}"));
        section.lines().filter_map(|l| Some(l.strip_prefix("| `")?.split('`').next()?.to_string())).collect()
    }

    #[test]
    fn docs_control_tables_list_exactly_the_methods() {
        let doc = repo_file("docs/control.md");
        let own = std::iter::once("rpc_get_methods").chain(methods::METHODS.iter().map(|m| m.name));
        let spdk = std::iter::once("rpc_get_methods").chain(spdk::METHODS.iter().map(|m| m.name));
        let mut problems = Vec::new();
        for (heading, methods) in [("Methods", own.collect::<Vec<_>>()), ("SPDK-compatible methods", spdk.collect())] {
            let documented = documented_methods(&doc, heading);
            let methods: BTreeSet<String> = methods.into_iter().map(String::from).collect();
            for m in methods.difference(&documented) {
                problems.push(format!("docs/control.md, {heading}: no row for method {m}"));
            }
            for m in documented.difference(&methods) {
                problems.push(format!("docs/control.md, {heading}: a row for {m}, which is no such method"));
            }
        }
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }
}
