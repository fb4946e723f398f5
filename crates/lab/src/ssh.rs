//! A host reached over ssh: the system `ssh` client with the user's own
//! config and keys (BatchMode: never a password prompt), one multiplexed
//! connection per host (ControlMaster) so a command costs a round trip, not
//! a handshake.
//!
//! What the lab changes on such a host is written to a state file there
//! ([`SshHost::state_file`]) before it is done: processes (PID and start
//! time, as PIDs are reused), files, directories and MTUs. The run's master
//! connection holds a lock on that file (`flock` running as its remote
//! command, reading its stdin), so the lock goes when the connection does;
//! a later run that finds a state file nobody locks undoes what it lists
//! ([`CLEANUP_SCRIPT`]). Processes the lab starts there are tied to their
//! own ssh session as well ([`SshHost::service_command`]).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// Where the lab keeps its state files and its binary on a remote host.
pub const REMOTE_DIR: &str = "/var/tmp/bwlab-remote";

/// The line a wrapped remote service prints first (on stderr): its PID.
pub const PID_MARK: &str = "bwlab-remote-pid ";

/// Every ssh invocation of this process (the cost of the remote mode).
static INVOCATIONS: AtomicU64 = AtomicU64::new(0);
/// Set once the run is ending: masters exiting then are expected.
static ENDING: AtomicBool = AtomicBool::new(false);
/// The masters' stdin: their remote `flock` holds the state file's lock
/// until it reads end-of-file, i.e. until this process exits or the
/// connection drops.
static MASTER_STDIN: Mutex<Vec<std::process::ChildStdin>> = Mutex::new(Vec::new());

pub fn invocations() -> u64 {
    INVOCATIONS.load(Ordering::Relaxed)
}

/// The run is over: the masters may go without that being a fault.
pub fn set_ending() {
    ENDING.store(true, Ordering::SeqCst);
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshHost {
    pub user: Option<String>,
    pub host: String,
    pub port: Option<u16>,
    /// `--ssh-option KEY=VALUE`, passed as `-o KEY=VALUE`.
    pub options: Vec<(String, String)>,
    /// The multiplexing socket on this machine.
    pub control: PathBuf,
    /// This run's name on the host (its files and state file carry it).
    pub run_id: String,
    /// The lab's binary there (a private directory named by its hash).
    pub exe: PathBuf,
}

/// Quote `s` for a POSIX shell.
pub fn quote(s: &str) -> String {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./:=@,+%".contains(&b)) {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// A command line for the remote shell: `program args...`, each quoted.
pub fn shell_line<S: AsRef<str>>(program: &str, args: &[S]) -> String {
    std::iter::once(quote(program)).chain(args.iter().map(|a| quote(a.as_ref()))).collect::<Vec<_>>().join(" ")
}

/// `ssh://[USER@]HOST[:PORT]` (HOST may be `[v6]`).
pub fn parse_url(url: &str) -> anyhow::Result<(Option<String>, String, Option<u16>)> {
    let rest = url
        .strip_prefix("ssh://")
        .ok_or_else(|| anyhow::anyhow!("{url:?}: a host is ssh://[USER@]HOST[:PORT]"))?;
    let rest = rest.trim_end_matches('/');
    let (user, hostport) = match rest.rsplit_once('@') {
        Some((u, h)) => (Some(u.to_string()), h),
        None => (None, rest),
    };
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let (h, tail) = v6.split_once(']').ok_or_else(|| anyhow::anyhow!("{url:?}: unclosed ["))?;
        let port = match tail.strip_prefix(':') {
            Some(p) => Some(p.parse().map_err(|_| anyhow::anyhow!("{url:?}: bad port {p:?}"))?),
            None if tail.is_empty() => None,
            None => anyhow::bail!("{url:?}: junk after ]"),
        };
        (h.to_string(), port)
    } else {
        match hostport.split_once(':') {
            Some((h, p)) => (h.to_string(), Some(p.parse().map_err(|_| anyhow::anyhow!("{url:?}: bad port {p:?}"))?)),
            None => (hostport.to_string(), None),
        }
    };
    anyhow::ensure!(!host.is_empty(), "{url:?}: no host");
    Ok((user, host, port))
}

/// `KEY=VALUE` of `--ssh-option`.
pub fn parse_option(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => Err(format!("{s:?}: an ssh option is KEY=VALUE")),
    }
}

/// sha256 of a local file, hex (sha256sum from coreutils).
fn sha256(path: &Path) -> anyhow::Result<String> {
    let out = crate::host::sh("sha256sum", &[&path.to_string_lossy()])?;
    Ok(out.split_whitespace().next().unwrap_or_default().to_string())
}

/// Undo what a state file lists (`$1`): processes first (only if PID and
/// start time still match), then files, directories (the binary's only
/// when no other run's state file lists it), MTUs and kernel initiators'
/// sessions (`crate::clients`), newest first; then
/// the file itself. Safe to run twice.
pub const CLEANUP_SCRIPT: &str = concat!(
    "detach_kernel() (\n",
    crate::clients::detach_script!(),
    "\n)\n",
    r#"s="$1"; [ -f "$s" ] || exit 0
pids=""
while read -r kind a b; do
  if [ "$kind" = pid ] && [ "$(cut -d' ' -f22 /proc/$a/stat 2>/dev/null)" = "$b" ]; then pids="$pids $a"; kill "$a" 2>/dev/null; fi
done < "$s"
n=0; while [ $n -lt 30 ]; do
  left=""; for p in $pids; do [ -d /proc/$p ] && left="$left $p"; done
  [ -z "$left" ] && break; sleep 0.1; n=$((n+1))
done
for p in $left; do kill -9 "$p" 2>/dev/null; done
tac "$s" | while read -r kind a b; do
  case "$kind" in
    file) rm -f -- "$a" ;;
    dir) # The binary's directory is shared by runs of one version: kept
         # while another run's state file lists it.
         keep=""; for o in "${s%/*}"/state-*; do [ "$o" != "$s" ] && grep -q "^dir $a " "$o" 2>/dev/null && keep=1; done
         [ -n "$keep" ] || rm -rf -- "$a" ;;
    mtu) ip link set dev "$a" mtu "$b" ;;
    kernel) detach_kernel "$a" $b ;;
  esac
done
rm -f -- "$s"
rmdir "${s%/*}" 2>/dev/null || true"#
);

/// Run `script` under `sh -c` with `args` ($1...), as one remote command.
fn sh_c(script: &str, args: &[&str]) -> String {
    let mut a = vec!["-c", script, "sh"];
    a.extend_from_slice(args);
    shell_line("sh", &a)
}

impl SshHost {
    /// A host from its `ssh://` URL; its control socket and names are this
    /// run's, its binary path follows `local_exe`'s hash.
    pub fn new(url: &str, options: &[(String, String)], local_exe: &Path) -> anyhow::Result<SshHost> {
        let (user, host, port) = parse_url(url)?;
        let pid = std::process::id();
        let me = crate::machine::first_line("hostname", &[]).unwrap_or_else(|| "lab".into());
        let me: String = me.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-').collect();
        let tag: String = host.chars().filter(|c| c.is_ascii_alphanumeric()).collect();
        let hash = sha256(local_exe)?;
        Ok(SshHost {
            user,
            port,
            options: options.to_vec(),
            control: PathBuf::from(format!("/tmp/bwlab-{pid}-ssh-{tag}-{}.sock", port.unwrap_or(22))),
            run_id: format!("{me}-{pid}"),
            exe: PathBuf::from(format!("{REMOTE_DIR}/bin-{}/blockwire", &hash[..16.min(hash.len())])),
            host,
        })
    }

    /// `ssh://...` as the user gave it (for messages and the report).
    pub fn url(&self) -> String {
        let user = self.user.as_ref().map(|u| format!("{u}@")).unwrap_or_default();
        let host = if self.host.contains(':') { format!("[{}]", self.host) } else { self.host.clone() };
        let port = self.port.map(|p| format!(":{p}")).unwrap_or_default();
        format!("ssh://{user}{host}{port}")
    }

    pub fn state_file(&self) -> String {
        format!("{REMOTE_DIR}/state-{}", self.run_id)
    }

    /// Where this run's file `name` lives on the host (`/dev/shm` or `/tmp`).
    pub fn run_path(&self, base: &str, name: &str) -> PathBuf {
        PathBuf::from(format!("{base}/bwlab-remote-{}-{name}", self.run_id))
    }

    fn ssh(&self, master: bool) -> Command {
        INVOCATIONS.fetch_add(1, Ordering::Relaxed);
        let mut c = Command::new("ssh");
        // The first value ssh sees wins: ours that must hold come first,
        // then the user's, then defaults the user may override.
        c.args(["-o", "BatchMode=yes", "-o"]).arg(format!("ControlPath={}", self.control.display()));
        c.args(["-o", if master { "ControlMaster=yes" } else { "ControlMaster=no" }]);
        for (k, v) in &self.options {
            c.arg("-o").arg(format!("{k}={v}"));
        }
        // A dropped connection is noticed within ~6 s.
        c.args(["-o", "ServerAliveInterval=2", "-o", "ServerAliveCountMax=3", "-o", "ConnectTimeout=10"]);
        if let Some(p) = self.port {
            c.arg("-p").arg(p.to_string());
        }
        if let Some(u) = &self.user {
            c.arg("-l").arg(u);
        }
        c.arg("-T").arg(&self.host).arg("--");
        c
    }

    /// A command running `line` (already shell-quoted) on the host.
    pub fn remote(&self, line: &str) -> Command {
        let mut c = self.ssh(false);
        c.arg(line);
        c
    }

    /// `program args` on the host, each argument quoted.
    pub fn command_with<S: AsRef<str>>(&self, program: &str, args: &[S]) -> Command {
        self.remote(&format!("exec {}", shell_line(program, args)))
    }

    /// Run a remote shell line; its stdout, or its stderr as the error.
    pub fn run_line(&self, line: &str) -> anyhow::Result<String> {
        let out = self.remote(line).stdin(Stdio::null()).output().map_err(|e| anyhow::anyhow!("cannot run ssh: {e}"))?;
        if !out.status.success() {
            anyhow::bail!("`{line}` on {} failed: {}", self.url(), String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Add a line to the state file (before the thing it names is made).
    pub fn record(&self, kind: &str, a: &str, b: &str) -> anyhow::Result<()> {
        self.run_line(&format!("echo {} >> {}", quote(&format!("{kind} {a} {b}")), quote(&self.state_file())))
            .map(|_| ())
    }

    /// A long-running `program args` on the host, tied to this ssh session:
    /// it runs in the background of a shell that prints its PID (on stderr,
    /// [`PID_MARK`]), records it in the state file, and kills it once the
    /// session's stdin ends (the local ssh stopped, or the connection
    /// dropped). The caller must keep the command's stdin a pipe it holds.
    pub fn service_command<S: AsRef<str>>(&self, program: &str, args: &[S]) -> Command {
        let script = format!(
            r#"exec 3<&0
{} </dev/null & p=$!
echo "{PID_MARK}$p" >&2
echo "pid $p $(cut -d' ' -f22 /proc/$p/stat)" >> {}
( read -r _ <&3; kill $p; sleep 3; kill -9 $p ) >/dev/null 2>&1 &
w=$!; exec 3<&-
wait $p; s=$?; kill $w 2>/dev/null; exit $s"#,
            shell_line(program, args),
            quote(&self.state_file())
        );
        self.remote(&sh_c(&script, &[]))
    }

    /// Open the master connection: its remote command makes the lab's
    /// directory and holds the state file's lock. Returns it (for the
    /// registry) once the control socket answers, or why it cannot.
    pub fn open_master(&self) -> anyhow::Result<crate::cleanup::Token> {
        let script = format!(
            "mkdir -p {dir} && exec flock -x {state} sh -c 'read -r _'",
            dir = REMOTE_DIR,
            state = quote(&self.state_file())
        );
        let mut cmd = self.ssh(true);
        cmd.arg(script).stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::piped());
        let (token, mut child) = crate::cleanup::registry().spawn(&mut cmd, "ssh master", crate::cleanup::Role::Service)?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    use std::io::Read;
                    let _ = e.read_to_string(&mut err);
                }
                crate::cleanup::registry().forget(token);
                anyhow::bail!("{}: not reachable: {}", self.url(), crate::runner::last_lines(&err, 2));
            }
            let check = Command::new("ssh")
                .arg("-o")
                .arg(format!("ControlPath={}", self.control.display()))
                .args(["-O", "check", "x"])
                .output();
            if check.is_ok_and(|o| o.status.success()) {
                break;
            }
            if std::time::Instant::now() > deadline {
                let _ = crate::cleanup::registry().release(token);
                anyhow::bail!("{}: not reachable: no connection within 20 s", self.url());
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        if let Some(stdin) = child.stdin.take() {
            MASTER_STDIN.lock().unwrap_or_else(|p| p.into_inner()).push(stdin);
        }
        // A master that ends before the run does means the host is gone:
        // the run stops as on Ctrl-C (what was measured is kept).
        let url = self.url();
        std::thread::spawn(move || {
            let _ = child.wait();
            if !ENDING.load(Ordering::SeqCst) {
                crate::cleanup::abort(format!("lost the ssh connection to {url}"));
            }
        });
        Ok(token)
    }

    /// Undo what earlier, interrupted runs left on the host (state files
    /// nobody holds the lock of). Returns what it cleaned, for the log.
    pub fn sweep_stale(&self) -> anyhow::Result<Vec<String>> {
        let script = format!(
            r#"for f in {REMOTE_DIR}/state-*; do
  [ -f "$f" ] && [ "$f" != {own} ] || continue
  if flock -n "$f" true; then echo "$f"; sh -c "$1" sh "$f"; fi
done"#,
            own = quote(&self.state_file())
        );
        let out = self.run_line(&sh_c(&script, &[CLEANUP_SCRIPT]))?;
        Ok(out.lines().map(|l| l.to_string()).collect())
    }

    /// Bring the lab's binary: copy it unless the same one (by hash, the
    /// name of its directory) is there already. Recorded either way: the
    /// run's end removes it.
    pub fn deploy(&self, local_exe: &Path) -> anyhow::Result<()> {
        let dir = self.exe.parent().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
        let want = sha256(local_exe)?;
        self.record("dir", &dir, "")?;
        let have = self
            .run_line(&format!("sha256sum {} 2>/dev/null || true", quote(&self.exe.to_string_lossy())))
            .unwrap_or_default();
        if have.split_whitespace().next() == Some(want.as_str()) {
            return Ok(());
        }
        let exe = quote(&self.exe.to_string_lossy());
        // A part file of its own: two runs may bring the same binary at once.
        let line = format!("mkdir -p {d} && cat > {exe}.$$ && chmod 755 {exe}.$$ && mv {exe}.$$ {exe}", d = quote(&dir));
        let out = self
            .remote(&line)
            .stdin(std::fs::File::open(local_exe)?)
            .output()?;
        anyhow::ensure!(out.status.success(), "{}: cannot copy the lab's binary: {}", self.url(), String::from_utf8_lossy(&out.stderr).trim());
        Ok(())
    }

    /// `size` bytes of random data at `path` (a backing file: non-zero, so
    /// reads touch real pages), tracked.
    pub fn fill_random(&self, path: &Path, size: u64) -> anyhow::Result<crate::cleanup::Token> {
        let p = path.to_string_lossy();
        self.record("file", &p, "")?;
        let res = crate::cleanup::Resource::HostFile { host: self.clone(), path: path.to_path_buf() };
        let line = format!("head -c {size} /dev/urandom > {}", quote(&p));
        Ok(crate::cleanup::registry().create(res, || self.run_line(&line).map(|_| ()))?.0)
    }

    /// The end of the run on this host: undo everything the state file lists.
    pub fn cleanup(&self) -> anyhow::Result<()> {
        self.run_line(&sh_c(CLEANUP_SCRIPT, &[&self.state_file()])).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(parse_url("ssh://root@10.0.0.1:2222").unwrap(), (Some("root".into()), "10.0.0.1".into(), Some(2222)));
        assert_eq!(parse_url("ssh://server").unwrap(), (None, "server".into(), None));
        assert_eq!(parse_url("ssh://u@[fe80::1]:22").unwrap(), (Some("u".into()), "fe80::1".into(), Some(22)));
        assert!(parse_url("server").is_err());
        assert!(parse_url("ssh://h:port").is_err());
        assert!(parse_url("ssh://").is_err());
        assert_eq!(parse_option("StrictHostKeyChecking=no"), Ok(("StrictHostKeyChecking".into(), "no".into())));
        assert!(parse_option("novalue").is_err());
    }

    #[test]
    fn quoting_survives_a_shell() {
        let args = ["plain", "with space", "it's", "$HOME", "a;b", ""];
        let line = shell_line("printf", &["%s|"].iter().chain(args.iter()).copied().collect::<Vec<_>>());
        let out = Command::new("sh").arg("-c").arg(&line).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "plain|with space|it's|$HOME|a;b||");
    }

    #[test]
    fn cleanup_script_undoes_a_state_file() {
        let dir = std::env::temp_dir().join(format!("bwlab-ssh-unit-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        let file = dir.join("f");
        std::fs::write(&file, "x").unwrap();
        let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = sleeper.id();
        let start = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap().split(' ').nth(21).unwrap().to_string();
        let state = dir.join("state");
        std::fs::create_dir_all(dir.join("shared")).unwrap();
        let shared = format!("dir {} \n", dir.join("shared").display());
        std::fs::write(&state, format!("pid {pid} {start}\npid 1 999\nfile {}\ndir {} \n{shared}", file.display(), dir.join("sub").display())).unwrap();
        // Another run's state file lists the shared directory: it stays.
        let other = dir.join("state-other");
        std::fs::write(&other, &shared).unwrap();
        let state = {
            let s = dir.join("state-this");
            std::fs::rename(&state, &s).unwrap();
            s
        };
        let st = Command::new("sh").args(["-c", CLEANUP_SCRIPT, "sh"]).arg(&state).status().unwrap();
        assert!(st.success());
        assert!(sleeper.wait().unwrap().code().is_none(), "the recorded process was not killed");
        assert!(!file.exists() && !dir.join("sub").exists() && !state.exists());
        assert!(dir.join("shared").exists(), "a directory another run uses was removed");
        // The other run's end removes it, and the directory once empty.
        let st = Command::new("sh").args(["-c", CLEANUP_SCRIPT, "sh"]).arg(&other).status().unwrap();
        assert!(st.success());
        assert!(!dir.exists());
    }
}
