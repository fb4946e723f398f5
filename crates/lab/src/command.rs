//! Running programs on this machine and reading what they print: the
//! plain helpers every other module of the lab uses (so they import
//! nothing of the lab's but [`crate::cleanup`]'s stop flag).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Run a program on this machine, outside any namespace.
pub fn sh(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(program).args(args).output().map_err(|e| anyhow::anyhow!("cannot run {program}: {e}"))?;
    if !out.status.success() {
        anyhow::bail!("`{program} {}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether `program` is installed on this machine (every local namespace
/// shares its file system).
pub fn which(program: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
        .unwrap_or(false)
        || ["/usr/sbin", "/sbin", "/usr/bin"].iter().any(|d| std::path::Path::new(d).join(program).is_file())
}

/// The installed version of Debian package `package` on this machine.
pub fn package_version(package: &str) -> Option<String> {
    let out = Command::new("dpkg-query").args(["-W", "-f", "${Version}", package]).output().ok()?;
    if out.status.success() {
        Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        None
    }
}

/// The first line a program prints (stdout, else stderr): a version.
pub fn first_line(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    let text = if out.stdout.is_empty() { out.stderr } else { out.stdout };
    String::from_utf8_lossy(&text).lines().next().map(|l| l.trim().to_string())
}

/// Run `cmd` to its end or for at most `timeout` (then killed), outside
/// the registry: for undo steps, which must run during a cleanup too.
pub fn run_bounded(mut cmd: Command, timeout: Duration) -> anyhow::Result<()> {
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
    let mut child = cmd.spawn()?;
    let err = read_in_background(child.stderr.take().expect("piped"));
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break Some(st);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // See run_workload_with_stdin: an ssh master may hold the pipe.
    let err = err.recv_timeout(Duration::from_secs(5)).unwrap_or_default();
    match status {
        Some(st) if st.success() => Ok(()),
        Some(st) => anyhow::bail!("{st}: {}", last_lines(&err, 2)),
        None => anyhow::bail!("not done after {timeout:?}: {}", last_lines(&err, 2)),
    }
}

/// Read a pipe to its end on a thread; the text arrives on the channel
/// (bytes that are no UTF-8, say a login shell's Latin-1 banner, replaced:
/// they do not cost the rest of the text).
pub fn read_in_background(mut pipe: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut b = vec![];
        let _ = pipe.read_to_end(&mut b);
        let _ = tx.send(String::from_utf8_lossy(&b).into_owned());
    });
    rx
}

pub fn last_lines(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

/// Undo something with a shell script on some host (`cmd` runs `sh` there,
/// given the arguments passed to `args_to_cmd`): `sh -c SCRIPT sh ARGS`,
/// and `stale` appended once the run was interrupted, so the script may
/// take the quick way (what is undone need not be kept then: a volume's
/// last writes). Bounded: a kernel driver can hold an undo (an aoe flush
/// waits for its device's pending work); the host's state file still
/// lists it for the next run.
/// The script goes without its comment lines: over ssh a command must fit
/// dropbear's limit ([`crate::hosts::state_file::SSH_MAX_COMMAND`]).
pub fn run_undo_script(on: &str, script: &str, args: &[String], cmd: impl FnOnce(&[&str]) -> Command) -> anyhow::Result<()> {
    let script = without_comments(script);
    let mut a: Vec<&str> = vec!["-c", &script, "sh"];
    a.extend(args.iter().map(|s| s.as_str()));
    if crate::cleanup::interrupted() {
        a.push("stale");
    }
    run_bounded(cmd(&a), Duration::from_secs(180)).map_err(|e| anyhow::anyhow!("undo on {on}: {e:#}"))
}

/// `script` without its comment lines, for sending over ssh: the cleanup
/// scripts' comments alone are ~1.5 KB, which took the sweep's command
/// past `hosts::state_file::SSH_MAX_COMMAND` on 2026-11-26. Only whole-line comments go:
/// no script here has a quoted string that spans lines (a test checks).
pub fn without_comments(script: &str) -> String {
    script
        .lines()
        .filter(|l| {
            let t = l.trim_start();
            !t.starts_with('#') || t.starts_with("#!")
        })
        .collect::<Vec<_>>()
        .join("\n")
}
