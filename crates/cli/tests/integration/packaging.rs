//! What `make install` and the Debian package put on a machine: the files
//! (into a DESTDIR, never this machine's root), the systemd unit as
//! `systemd-analyze verify` sees it, the man pages as `man -l` renders
//! them, the package's contents (dpkg-deb -c, lintian), and serve's
//! notifications to systemd.

use crate::common;
use common::*;
use std::path::Path;
use std::process::Command;

/// `make TARGET VAR=VALUE...` in the repository, with the test's own binary.
fn make(target: &str, vars: &[String]) -> String {
    let mut c = Command::new("make");
    c.current_dir(repo_root()).args(["-s", target, "NO_BUILD=1"]).arg(format!("BIN={}", blockwire_bin().display()));
    let out = c.args(vars).output().expect("run make");
    assert!(
        out.status.success(),
        "make {target} failed\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every file under `root`, as paths relative to it, sorted.
fn files_under(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("read dir").map_while(Result::ok) {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else {
                found.push(p.strip_prefix(root).expect("under root").display().to_string());
            }
        }
    }
    found.sort();
    found
}

const EXPECTED: &[&str] = &[
    "bin/blockwire",
    "lib/systemd/system/blockwire.service",
    "share/bash-completion/completions/blockwire",
    "share/doc/blockwire/examples/blockwire.toml",
    "share/fish/vendor_completions.d/blockwire.fish",
    "share/man/man1/blockwire-serve.1.gz",
    "share/man/man1/blockwire.1.gz",
    "share/zsh/vendor-completions/_blockwire",
];

#[test]
fn make_install_into_destdir_then_the_unit_verifies_and_the_man_pages_render() {
    let dest = TempDir::new("destdir");
    make("install", &[format!("DESTDIR={}", dest.path().display()), "PREFIX=/usr".into()]);
    let files = files_under(dest.path());
    for want in EXPECTED {
        assert!(files.contains(&format!("usr/{want}")), "usr/{want} not installed; got {files:#?}");
    }
    let usr = dest.path().join("usr");
    let unit = std::fs::read_to_string(usr.join("lib/systemd/system/blockwire.service")).expect("unit");
    assert!(unit.contains("ExecStart=/usr/bin/blockwire serve --config /etc/blockwire/blockwire.toml"), "{unit}");
    assert!(unit.contains("Type=notify") && unit.contains("ExecReload=/bin/kill -HUP $MAINPID"), "{unit}");

    // verify checks that ExecStart's program exists and that the man page
    // Documentation= names is there: point both into the DESTDIR.
    let staged = dest.path().join("blockwire.service");
    std::fs::write(&staged, unit.replace("/usr/bin/blockwire", &usr.join("bin/blockwire").display().to_string())).unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", staged.to_str().unwrap()])
        .env("MANPATH", usr.join("share/man"))
        .output()
        .expect("systemd-analyze (Debian package systemd)");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && said.trim().is_empty(), "systemd-analyze verify: {}\n{said}", out.status);

    // Every page renders without a warning; serve's names its flags.
    for f in files.iter().filter(|f| f.starts_with("usr/share/man/man1/")) {
        let out = Command::new("man")
            .args(["--warnings", "-l"])
            .arg(dest.path().join(f))
            .env("MANWIDTH", "100")
            .output()
            .expect("man (Debian package man-db)");
        let text = String::from_utf8_lossy(&out.stdout);
        let warn = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && warn.trim().is_empty(), "man -l {f}: {}\n{warn}", out.status);
        assert!(text.contains("NAME") && text.contains("SYNOPSIS"), "{f}:\n{text}");
        if f.ends_with("blockwire-serve.1.gz") {
            assert!(text.contains("--metrics") && text.contains("--config"), "{text}");
        }
    }
    let bash = std::fs::read_to_string(usr.join("share/bash-completion/completions/blockwire")).unwrap();
    assert!(bash.contains("complete -F") && bash.contains("--metrics"), "bash completion");
}

#[test]
fn the_debian_package_holds_what_make_install_installs() {
    let out = TempDir::new("deb");
    let built = make("deb", &[format!("DEB_DIR={}", out.path().display())]);
    let deb = built.lines().last().expect("package path").trim().to_string();
    assert!(deb.ends_with(".deb") && Path::new(&deb).exists(), "{built}");
    let listing = sh(&format!("dpkg-deb -c {deb}"));
    for want in EXPECTED {
        assert!(listing.contains(&format!("./usr/{want}")), "./usr/{want} not in the package:\n{listing}");
    }
    assert!(listing.contains("./usr/share/doc/blockwire/copyright"), "{listing}");
    let control = sh(&format!("dpkg-deb -f {deb} Package Depends Architecture"));
    assert!(control.contains("Package: blockwire") && control.contains("libc6"), "{control}");
    let out = Command::new("lintian").args(["--tag-display-limit", "0", &deb]).output().expect("lintian (Debian package lintian)");
    let said = String::from_utf8_lossy(&out.stdout);
    let errors: Vec<&str> = said.lines().filter(|l| l.starts_with("E:")).collect();
    assert!(errors.is_empty(), "lintian errors:\n{said}");
}

/// The unit's Type=notify: serve sends READY=1 to $NOTIFY_SOCKET only once
/// its listeners accept connections, and STOPPING=1 on SIGTERM.
#[test]
fn serve_notifies_systemd_when_ready_and_when_stopping() {
    use std::os::unix::net::UnixDatagram;
    let dir = TempDir::new("notify");
    let path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&path).expect("bind notify socket");
    sock.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    let (iport, mport) = (free_port(), free_port());
    let mut child = Command::new(blockwire_bin())
        .args(["serve", "--volume", "d0=ram:8M", "--iscsi", &format!("127.0.0.1:{iport}"), "--metrics", &format!("127.0.0.1:{mport}")])
        .env("NOTIFY_SOCKET", &path)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn serve");
    let mut buf = [0u8; 256];
    let n = sock.recv(&mut buf).expect("READY=1 within 30 s");
    let ready = String::from_utf8_lossy(&buf[..n]).to_string();
    let listening = std::net::TcpStream::connect(("127.0.0.1", iport)).is_ok() && std::net::TcpStream::connect(("127.0.0.1", mport)).is_ok();
    // SAFETY: signalling our own child by PID.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let n = sock.recv(&mut buf).expect("STOPPING=1 after SIGTERM");
    let stopping = String::from_utf8_lossy(&buf[..n]).to_string();
    let status = child.wait().expect("serve exits");
    assert_eq!(ready, "READY=1");
    assert!(listening, "READY=1 came before the listeners accepted connections");
    assert_eq!(stopping, "STOPPING=1");
    assert!(status.success(), "{status}");
}
