//! Secrets stay secret: CHAP secrets never reach the target's log (at trace
//! level, through good and bad logins of our initiator and libiscsi), the
//! initiator's output, `--print-config` or `--save-config` unless
//! `--show-secrets` asks for them; a configuration file with secrets that
//! others can read gets a warning at start-up.

use crate::common;
use common::*;
use std::os::unix::fs::PermissionsExt;

const IQN: &str = "iqn.2026-11.org.blockwire.test:secrets";
const SECRETS: [&str; 4] = ["Disc0very-s3cret", "P0rtal-s3cret", "T4rget-chap-s3cret", "Mutual-s3cret-42"];

fn config_text(port: u16) -> String {
    format!(
        "[[volume]]\nname = \"v\"\nbackend = \"ram:4M\"\n\
         [iscsi]\nlisten = [\"127.0.0.1:{port}\"]\n\
         discovery_chap = {{ user = \"scan\", secret = \"{}\" }}\n\
         discovery_mutual_chap = {{ user = \"portal\", secret = \"{}\" }}\n\
         [[iscsi.target]]\niqn = \"{IQN}\"\nluns = [{{ lun = 0, volume = \"v\" }}]\n\
         chap = {{ user = \"bob\", secret = \"{}\" }}\n\
         mutual_chap = {{ user = \"target\", secret = \"{}\" }}\n",
        SECRETS[0], SECRETS[1], SECRETS[2], SECRETS[3]
    )
}

fn assert_no_secret(what: &str, text: &str) {
    for s in SECRETS {
        assert!(!text.contains(s), "{what} shows the secret {s}:\n{text}");
    }
}

#[test]
fn print_and_save_config_redact_secrets_unless_asked() {
    let dir = TempDir::new("sec-cfg");
    let cfg = dir.path().join("serve.toml");
    std::fs::write(&cfg, config_text(free_port())).expect("write config");
    let cfg = cfg.to_str().expect("UTF-8");
    let shown = blockwire_ok(None, &["serve", "--config", cfg, "--print-config"]);
    assert_no_secret("--print-config", &shown);
    assert_eq!(shown.matches("<redacted>").count(), 4, "{shown}");
    let revealed = blockwire_ok(None, &["serve", "--config", cfg, "--print-config", "--show-secrets"]);
    for s in SECRETS {
        assert!(revealed.contains(s), "--show-secrets leaves out {s}");
    }
    // --save-config while serving: redacted, private.
    let saved = dir.path().join("saved.json");
    let serve = Serve::start(&["--config", cfg, "--save-config", saved.to_str().expect("UTF-8")]);
    assert!(serve.stop().success());
    let text = std::fs::read_to_string(&saved).expect("saved config");
    assert_no_secret("--save-config", &text);
    assert!(text.contains("<redacted>"));
    assert_eq!(std::fs::metadata(&saved).expect("stat").permissions().mode() & 0o777, 0o600, "saved config is readable by others");
    let out = blockwire_ok(None, &["serve", "--config", cfg, "--print-config", "--show-secrets"]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["iscsi"]["target"][0]["chap"]["secret"], SECRETS[2]);
}

/// Trace-level logs of the target through every kind of login (discovery
/// and normal, right and wrong secrets, our initiator and libiscsi), and
/// the initiator's own output, hold no secret.
#[test]
fn logs_never_show_chap_secrets() {
    let dir = TempDir::new("sec-log");
    let port = free_port();
    let cfg = dir.path().join("serve.toml");
    std::fs::write(&cfg, config_text(port)).expect("write config");
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let serve = Serve::start(&["-vvv", "--config", cfg.to_str().expect("UTF-8")]);
    let mut client_output = String::new();
    let mut run = |args: &[&str], ok: bool| {
        let out = blockwire(None, args);
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.status.success(), ok, "blockwire {args:?}: {text}");
        client_output.push_str(&text);
    };
    let url = |secret: &str| format!("iscsi://bob%{secret}@127.0.0.1:{port}/{IQN}/0");
    run(&["-vvv", "verify", &url(SECRETS[2]), "--size", "64K"], true);
    run(&["-vvv", "verify", &url("wrong-guess"), "--size", "64K", "--timeout", "5"], false);
    run(&["-vvv", "verify", &url(SECRETS[2]).replace(&format!("{port}/"), &format!("{port}")), "--size", "64K"], false);
    run(&["-vvv", "iscsi", "discover", &format!("scan%{}@127.0.0.1:{port}", SECRETS[0])], true);
    run(&["-vvv", "iscsi", "discover", &format!("scan%{}@no-such-host.invalid:{port}", SECRETS[0]), "--timeout", "3"], false);
    for (secret, ok) in [(SECRETS[2], true), ("wrong-guess", false)] {
        let out = std::process::Command::new("iscsi-inq").arg(url(secret)).output().expect("run iscsi-inq (libiscsi-bin)");
        assert_eq!(out.status.success(), ok, "iscsi-inq with {secret}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let log = serve.log_text();
    assert!(log.contains("CHAP") || log.contains("chap") || log.contains("refused"), "the trace log shows nothing of the logins:\n{log}");
    assert_no_secret("the target's trace log", &log);
    assert_no_secret("the initiator's output", &client_output);
    assert!(!log.contains("holds secrets"), "a private config got the readable-config warning");
    assert!(serve.stop().success());
}

#[test]
fn a_config_with_secrets_readable_by_others_gets_a_warning() {
    let dir = TempDir::new("sec-perm");
    let cfg = dir.path().join("serve.toml");
    std::fs::write(&cfg, config_text(free_port())).expect("write config");
    for (mode, warned) in [(0o644, true), (0o640, true), (0o600, false)] {
        std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(mode)).expect("chmod");
        let serve = Serve::start(&["--config", cfg.to_str().expect("UTF-8")]);
        let log = serve.log_text();
        assert!(serve.stop().success());
        assert_eq!(log.contains("holds secrets") && log.contains("chmod 600"), warned, "mode {mode:o}:\n{log}");
    }
    // Without secrets a readable file is fine.
    let plain = format!("[[volume]]\nname = \"v\"\nbackend = \"ram:4M\"\n[iscsi]\nlisten = [\"127.0.0.1:{}\"]\n[[iscsi.target]]\niqn = \"{IQN}\"\nluns = [{{ lun = 0, volume = \"v\" }}]\n", free_port());
    std::fs::write(&cfg, plain).expect("write");
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let serve = Serve::start(&["--config", cfg.to_str().expect("UTF-8")]);
    let log = serve.log_text();
    assert!(serve.stop().success());
    assert!(!log.contains("holds secrets"), "{log}");
}
