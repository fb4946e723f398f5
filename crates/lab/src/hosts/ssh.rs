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
//! (`state_file::CLEANUP_SCRIPT`, the one undo text of every host). The
//! file also names the lab process that owns it (`run PID START BOOT`): a
//! connection cut without a word (a cable, a firewall) leaves the host's
//! sshd holding the session, and its lock, until its keepalive gives up
//! (hours, by default); a later run from the same machine that finds its
//! owner dead takes the lock from that orphaned session and undoes the
//! file ([`SshHost::sweep_stale`]). Processes the lab starts there are tied
//! to their own ssh session as well ([`SshHost::service_command`]).

use crate::cleanup::{Resource, Undo};
use crate::command::run_undo_script;
use crate::hosts::state_file::{without_comments, RunOwner, Swept, CLEANUP_SCRIPT, UNDO_ONE};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// Where the lab keeps its state files and its binary on a remote host.
pub const REMOTE_DIR: &str = "/var/tmp/bwlab-remote";

/// ssh's ConnectTimeout unless the user sets one (seconds).
const DEFAULT_CONNECT_TIMEOUT_S: u64 = 10;
/// How much longer than the connect timeout the master may take to be up.
const MASTER_GRACE_S: u64 = 10;

/// Which system a state file's lines belong to, written first into it
/// (`host net:[INODE]`): the network namespace of the ssh session. Two
/// "hosts" that share a file system (namespaces of one machine, as in the
/// tests) each undo only their own files, a mount on the host that made
/// it. (The mount namespace is left out: an sshd restarted by `ip netns
/// exec` gets a new one, yet it is the same host; the initial network
/// namespace keeps its inode across reboots.)
const HOST_IDENTITY: &str = "$(readlink /proc/self/ns/net)";

/// The line a wrapped remote service prints first (on stderr): its PID.
pub const PID_MARK: &str = "bwlab-remote-pid ";

/// The PID in a line holding [`PID_MARK`]. The mark need not start the
/// line: a login profile may have printed something without a newline
/// before it.
pub fn pid_mark(line: &str) -> Option<u32> {
    let at = line.find(PID_MARK)? + PID_MARK.len();
    let digits = &line[at..];
    let end = digits.find(|c: char| !c.is_ascii_digit()).unwrap_or(digits.len());
    digits[..end].parse().ok()
}

/// The header of the one record a remote command's output reaches the
/// lab in: `bwlab-frame TAG LENGTH STATUS`, a line of its own, then
/// exactly LENGTH bytes of the program's stdout (see [`framed`]).
///
/// sshd runs a command through the user's login shell, and Debian's bash
/// sources `~/.bashrc` for ssh commands, so whatever a profile prints (a
/// version manager's notice, a banner, with or without a newline; an EXIT
/// trap's goodbye after the command) shares the command's stdout. The
/// reader takes the record and nothing else ([`unframe`]): TAG is this
/// run's random tag, which no profile prints, and the length says where
/// the record ends, so noise before and after it is never read as output.
/// (fio's client/server protocol is the model: a framed command stream
/// over one connection, never scraped text.)
pub const FRAME_MARK: &str = "bwlab-frame";

/// `line` as the remote command: `sh` runs it (whatever the login shell
/// is), its stdout is held until it ends, then written as one record:
/// [`FRAME_MARK`], the tag, the length in bytes and the exit status on a
/// line that starts a line, then the output. stdin and stderr stay the
/// command's own (a service reads its session on stdin, its PID mark goes
/// to stderr). The output is text (a shell variable holds it: a NUL byte
/// would be dropped).
fn framed(line: &str, tag: &str) -> String {
    let script = format!(
        "o=$( ( {line}\n ); s=$?; printf x; exit $s ); s=$?; o=${{o%x}}\nLC_ALL=C; printf '\\n{FRAME_MARK} %s %s %s\\n%s' {tag} \"${{#o}}\" \"$s\" \"$o\"; exit $s"
    );
    sh_c(&script, &[])
}

/// What went wrong reading a framed output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// No record: the command never ran (ssh or the login shell failed
    /// first).
    Missing,
    /// A record cut short: the connection ended while it was written.
    Truncated { have: usize, want: usize },
    /// A header that does not parse.
    BadHeader(String),
}

/// The record tagged `tag` in `stdout`: the command's output and its exit
/// status; whatever else is there is ignored.
pub fn unframe<'a>(stdout: &'a str, tag: &str) -> Result<(&'a str, i32), FrameError> {
    let head = format!("{FRAME_MARK} {tag} ");
    let mut at = 0;
    let start = loop {
        let i = stdout[at..].find(&head).ok_or(FrameError::Missing)? + at;
        // Only at the start of a line (the record writes a newline first).
        if i == 0 || stdout.as_bytes()[i - 1] == b'\n' {
            break i + head.len();
        }
        at = i + head.len();
    };
    let nl = stdout[start..].find('\n').ok_or_else(|| FrameError::BadHeader(stdout[start..].to_string()))? + start;
    let fields: Vec<&str> = stdout[start..nl].split(' ').collect();
    let (len, status) = match fields[..] {
        [len, status] => match (len.parse::<usize>(), status.parse::<i32>()) {
            (Ok(l), Ok(s)) => (l, s),
            _ => return Err(FrameError::BadHeader(stdout[start..nl].to_string())),
        },
        _ => return Err(FrameError::BadHeader(stdout[start..nl].to_string())),
    };
    let body = nl + 1;
    let have = stdout.len() - body;
    if have < len {
        return Err(FrameError::Truncated { have, want: len });
    }
    stdout.get(body..body + len).map(|o| (o, status)).ok_or_else(|| FrameError::BadHeader(format!("{len} bytes end inside a character")))
}

/// A tag no login shell prints: 64 random bits, hex.
fn new_frame_tag() -> String {
    let mut b = [0u8; 8];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut b);
    }
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos() as u64;
    format!("{:016x}", u64::from_le_bytes(b) ^ t.rotate_left(17) ^ std::process::id() as u64)
}

/// The remote shell script of [`SshHost::service_command`], recording the
/// program's PID in `state_file`. The PID mark is written by the program's
/// own process just before it execs the program: written afterwards, by
/// the shell that started it, it raced the program's first writes to the
/// same stderr (a C program's unbuffered stderr goes out a few bytes per
/// write) and could land inside one of its lines, where it went unseen.
fn service_script<S: AsRef<str>>(program: &str, args: &[S], state_file: &str) -> String {
    format!(
        r#"exec 3<&0
sh -c 'echo "{PID_MARK}$$" >&2; exec "$@"' sh {} </dev/null & p=$!
echo "pid $p $(cut -d' ' -f22 /proc/$p/stat)" >> {}
( read -r _ <&3; kill $p; sleep 3; kill -9 $p ) >/dev/null 2>&1 &
w=$!; exec 3<&-
wait $p; s=$?; kill $w 2>/dev/null; exit $s"#,
        shell_line(program, args),
        quote(state_file)
    )
}

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
    /// This run's name on the host (its files and state file carry it):
    /// `LABHOST-HOSTpPORT-PID`.
    pub run_id: String,
    /// The lab's binary there (a private directory named by its hash).
    pub exe: PathBuf,
    /// This run's tag on the framed outputs of its commands ([`FRAME_MARK`]).
    pub frame_tag: String,
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
    let out = crate::command::sh("sha256sum", &[&path.to_string_lossy()])?;
    Ok(out.split_whitespace().next().unwrap_or_default().to_string())
}


/// Run `script` under `sh -c` with `args` ($1...), as one remote command.
fn sh_c(script: &str, args: &[&str]) -> String {
    let mut a = vec!["-c", script, "sh"];
    a.extend_from_slice(args);
    shell_line("sh", &a)
}

/// Sweeping one stale state file (`$2`; `$3` `locked` or `free`) with the
/// cleanup script (`$1`): a session the host still holds is ended first.
const SWEEP_WRAPPER: &str = r#"f="$2"
if [ "$3" = locked ]; then
  # the orphaned session's lock holder (`flock`) and what it runs
  for p in /proc/[0-9]*; do
    [ "$(cat "$p/comm" 2>/dev/null)" = flock ] || continue
    for d in "$p"/fd/*; do
      [ "$(readlink "$d" 2>/dev/null)" = "$f" ] || continue
      for c in /proc/[0-9]*; do [ "$(cut -d' ' -f4 "$c/stat" 2>/dev/null)" = "${p#/proc/}" ] && kill -9 "${c#/proc/}" 2>/dev/null; done
      kill -9 "${p#/proc/}" 2>/dev/null; break
    done
  done
  n=0; until flock -n "$f" true || [ $n -ge 50 ]; do sleep 0.1; n=$((n+1)); done
fi
flock -n "$f" true && sh -c "$1" sh "$f" stale"#;

/// The command that sweeps one stale state file over ssh: the wrapper
/// running the cleanup script, both without comments (it must stay under
/// [`crate::hosts::state_file::SSH_MAX_COMMAND`]).
fn sweep_command(file: &str, locked: bool) -> String {
    sh_c(&without_comments(SWEEP_WRAPPER), &[&without_comments(CLEANUP_SCRIPT), file, if locked { "locked" } else { "free" }])
}

impl SshHost {
    /// A host from its `ssh://` URL; its control socket and names are this
    /// run's, its binary path follows `local_exe`'s hash.
    pub fn new(url: &str, options: &[(String, String)], local_exe: &Path) -> anyhow::Result<SshHost> {
        let (user, host, port) = parse_url(url)?;
        let pid = std::process::id();
        let me = crate::command::first_line("hostname", &[]).unwrap_or_else(|| "lab".into());
        let me: String = me.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-').collect();
        let tag: String = host.chars().filter(|c| c.is_ascii_alphanumeric()).collect();
        let hash = sha256(local_exe)?;
        Ok(SshHost {
            user,
            port,
            options: options.to_vec(),
            control: PathBuf::from(format!("/tmp/bwlab-{pid}-ssh-{tag}-{}.sock", port.unwrap_or(22))),
            // The host in the name too: two "hosts" may share one file
            // system (namespaces of one machine), each needs a state file.
            run_id: format!("{me}-{tag}p{}-{pid}", port.unwrap_or(22)),
            exe: PathBuf::from(format!("{REMOTE_DIR}/bin-{}/blockwire", &hash[..16.min(hash.len())])),
            frame_tag: new_frame_tag(),
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

    /// ssh's ConnectTimeout for this host: the user's (`--ssh-option
    /// ConnectTimeout=N`, which ssh takes before ours) or ours.
    fn connect_timeout_s(&self) -> u64 {
        self.options
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("ConnectTimeout"))
            .and_then(|(_, v)| v.trim().parse().ok())
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT_S)
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
        c.args(["-o", "ServerAliveInterval=2", "-o", "ServerAliveCountMax=3", "-o"]).arg(format!("ConnectTimeout={DEFAULT_CONNECT_TIMEOUT_S}"));
        if let Some(p) = self.port {
            c.arg("-p").arg(p.to_string());
        }
        if let Some(u) = &self.user {
            c.arg("-l").arg(u);
        }
        c.arg("-T").arg(&self.host).arg("--");
        c
    }

    /// A command running `line` (already shell-quoted) on the host, its
    /// stdout framed ([`framed`]; read it with [`SshHost::program_output`]).
    /// Arguments added to the command later are joined to the command
    /// line by ssh (and split again by the remote shell): they reach
    /// `line` as `"$@"`.
    pub fn remote(&self, line: &str) -> Command {
        let mut c = self.ssh(false);
        c.arg(framed(line, &self.frame_tag));
        c
    }

    /// `program args` on the host, each argument quoted (any added to the
    /// command later follow them, as the remote shell splits them).
    pub fn command_with<S: AsRef<str>>(&self, program: &str, args: &[S]) -> Command {
        self.remote(&format!("exec {} \"$@\"", shell_line(program, args)))
    }

    /// Run a remote shell line; its stdout, or its stderr as the error.
    pub fn run_line(&self, line: &str) -> anyhow::Result<String> {
        let out = self.remote(line).stdin(Stdio::null()).output().map_err(|e| anyhow::anyhow!("cannot run ssh: {e}"))?;
        if !out.status.success() {
            anyhow::bail!("`{line}` on {} failed: {}", self.url(), String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(self.program_output(&String::from_utf8_lossy(&out.stdout))?.to_string())
    }

    /// Add a line to the state file (before the thing it names is made).
    pub fn record(&self, kind: &str, a: &str, b: &str) -> anyhow::Result<()> {
        self.run_line(&format!("echo {} >> {}", quote(&format!("{kind} {a} {b}")), quote(&self.state_file())))
            .map(|_| ())
    }

    /// Record `kind a b` in the state file, then make the thing with `make`,
    /// tracked: released, it is undone as a later run would undo the line
    /// ([`UNDO_ONE`]).
    pub fn recorded<T>(&self, kind: &str, a: &str, b: &str, make: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<(crate::cleanup::Token, T)> {
        self.record(kind, a, b)?;
        let undo = RecordedUndo { host: self.clone(), args: vec![kind.into(), a.into(), b.into()] };
        crate::cleanup::registry().create(Resource::owned(undo), make)
    }

    /// A long-running `program args` on the host, tied to this ssh session:
    /// it runs in the background of a shell that prints its PID (on stderr,
    /// [`PID_MARK`]), records it in the state file, and kills it once the
    /// session's stdin ends (the local ssh stopped, or the connection
    /// dropped). The caller must keep the command's stdin a pipe it holds.
    /// Its stdout is the program's result, framed once it ends.
    pub fn service_command<S: AsRef<str>>(&self, program: &str, args: &[S]) -> Command {
        self.remote(&sh_c(&service_script(program, args, &self.state_file()), &[]))
    }

    /// [`SshHost::service_command`] for a daemon (a target, a server)
    /// whose output is a log, read line by line while it runs: not framed
    /// (a profile's noise is then one more log line).
    pub fn daemon_command<S: AsRef<str>>(&self, program: &str, args: &[S]) -> Command {
        let mut c = self.ssh(false);
        c.arg(sh_c(&service_script(program, args, &self.state_file()), &[]));
        c
    }

    /// What a remote command printed on stdout: its framed record, without
    /// whatever the login shell printed around it.
    pub fn program_output<'a>(&self, stdout: &'a str) -> anyhow::Result<&'a str> {
        let why = match unframe(stdout, &self.frame_tag) {
            Ok((out, _)) => return Ok(out),
            Err(FrameError::Missing) => "the remote command never started (no framed output)".to_string(),
            Err(FrameError::Truncated { have, want }) => format!("the remote command's output was cut short ({have} of {want} bytes)"),
            Err(FrameError::BadHeader(h)) => format!("a framed output with a bad header ({h:?})"),
        };
        anyhow::bail!("{}: {why}; it printed: {}", self.url(), crate::command::last_lines(stdout, 3))
    }

    /// Open the master connection: its remote command makes the lab's
    /// directory and holds the state file's lock. Returns it (for the
    /// registry) once the control socket answers, or why it cannot.
    pub fn open_master(&self) -> anyhow::Result<crate::cleanup::Token> {
        // A forced end kills the masters: expected then.
        crate::cleanup::before_forced_end(set_ending);
        let script = format!(
            "mkdir -p {dir} && echo \"host {HOST_IDENTITY}\" >> {state} && echo {owner} >> {state} && exec flock -x {state} sh -c 'read -r _'",
            dir = REMOTE_DIR,
            state = quote(&self.state_file()),
            owner = quote(&RunOwner::current().line())
        );
        let mut cmd = self.ssh(true);
        cmd.arg(script).stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::piped());
        // ssh removes its control socket only when the master ends of
        // itself, not when it is signalled, as the run's end stops it:
        // tracked before the master, the socket is removed after it.
        let (socket, ()) = crate::cleanup::registry().create(crate::cleanup::Resource::File(self.control.clone()), || Ok(()))?;
        let (token, mut child) = match crate::cleanup::registry().spawn(&mut cmd, "ssh master", crate::cleanup::Role::Service) {
            Ok(t) => t,
            Err(e) => {
                let _ = crate::cleanup::registry().release(socket);
                return Err(e);
            }
        };
        // ssh gives up by itself after its ConnectTimeout (which also bounds
        // the banner exchange); this deadline only catches a master that
        // hangs after that, so it follows the timeout in effect: a user who
        // raised it for a slow host is not cut off at our default.
        let wait = self.connect_timeout_s() + MASTER_GRACE_S;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(wait);
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    use std::io::Read;
                    let _ = e.read_to_string(&mut err);
                }
                crate::cleanup::registry().forget(token);
                let _ = crate::cleanup::registry().release(socket);
                anyhow::bail!("{}: not reachable: {}", self.url(), crate::command::last_lines(&err, 2));
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
                let _ = crate::cleanup::registry().release(socket);
                anyhow::bail!("{}: not reachable: no connection within {wait} s", self.url());
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

    /// Undo what earlier, interrupted runs left on the host: state files
    /// written on this host (see [`HOST_IDENTITY`]) that nobody holds the
    /// lock of, and those whose lock an orphaned session still holds while
    /// their owner, a lab process of this machine's boot, is gone (a cut
    /// connection the host's sshd has not noticed: that session's lock
    /// holder is killed first). A file whose owner runs elsewhere and is
    /// locked is a live run's, and stays. Returns what each sweep found.
    pub fn sweep_stale(&self) -> anyhow::Result<Vec<Swept>> {
        let list = format!(
            r#"me="{HOST_IDENTITY}"
for f in {REMOTE_DIR}/state-*; do
  [ -f "$f" ] && [ "$f" != {own} ] || continue
  h=$(sed -n 's/^host //p' "$f" | head -n 1)
  [ -z "$h" ] || [ "$h" = "$me" ] || continue
  if flock -n "$f" true; then l=free; else l=locked; fi
  echo "bwlab-state $l $f $(grep -m1 '^run ' "$f")"
done"#,
            own = quote(&self.state_file())
        );
        let mut stale: Vec<(String, bool, String)> = vec![];
        for line in self.run_line(&list)?.lines() {
            let Some(rest) = line.strip_prefix("bwlab-state ") else { continue };
            let mut f = rest.splitn(3, ' ');
            let (lock, file, run) = (f.next().unwrap_or(""), f.next().unwrap_or("").to_string(), f.next().unwrap_or(""));
            let owner = RunOwner::of_state(run);
            match (lock, &owner) {
                ("free", Some(o)) => stale.push((file, false, format!("its ssh session ended; {}", o.describe()))),
                ("free", None) => stale.push((file, false, "its ssh session ended".into())),
                ("locked", Some(o)) if o.of_this_boot() && !o.is_live() => {
                    stale.push((file, true, format!("its lab process is gone ({}), the host still held its session", o.describe())))
                }
                _ => {}
            }
        }
        let mut swept = vec![];
        for (file, locked, owner) in stale {
            let out = self.run_line(&sweep_command(&file, locked))?;
            swept.push(Swept::from_output(&file, &owner, &out));
        }
        Ok(swept)
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
        let res = Resource::owned(RemoteFile { host: self.clone(), path: path.to_path_buf() });
        let line = format!("head -c {size} /dev/urandom > {}", quote(&p));
        Ok(crate::cleanup::registry().create(res, || self.run_line(&line).map(|_| ()))?.0)
    }

    /// The end of the run on this host: undo everything the state file lists.
    pub fn cleanup(&self) -> anyhow::Result<()> {
        self.run_line(&sh_c(&without_comments(CLEANUP_SCRIPT), &[&self.state_file()])).map(|_| ())
    }
}

/// A file on an ssh host (also in the host's state file), removed.
#[derive(Debug)]
pub struct RemoteFile {
    pub host: SshHost,
    pub path: PathBuf,
}

impl Undo for RemoteFile {
    fn undo(&self) -> anyhow::Result<()> {
        let p = quote(&self.path.to_string_lossy());
        self.host.run_line(&format!("rm -f -- {p}")).map(|_| ())
    }
}

/// Everything the run's state file on an ssh host lists (processes,
/// files, the lab's binary, MTUs), undone there by its cleanup script.
#[derive(Debug)]
pub struct RunOnHost(pub SshHost);

impl Undo for RunOnHost {
    fn undo(&self) -> anyhow::Result<()> {
        self.0.cleanup()
    }
}

/// One line `KIND A B` of the state file, undone as a later run would
/// undo it ([`UNDO_ONE`]).
#[derive(Debug)]
struct RecordedUndo {
    host: SshHost,
    args: Vec<String>,
}

impl Undo for RecordedUndo {
    fn undo(&self) -> anyhow::Result<()> {
        run_undo_script(&self.host.host, UNDO_ONE, &self.args, |a| self.host.command_with("sh", a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Dropbear ends a session whose command is longer than 9000 bytes:
    /// the sweep of a killed run over ssh and the per-line undo must fit,
    /// with a state file path as long as the lab makes (seen failing at
    /// 9233 bytes when the comments were sent too).
    #[test]
    fn commands_sent_over_ssh_fit_dropbear() {
        use crate::hosts::state_file::SSH_MAX_COMMAND;
        let file = format!("{REMOTE_DIR}/state-{}-4294967295", "h".repeat(80));
        for locked in [false, true] {
            let c = sweep_command(&file, locked);
            assert!(c.len() + 200 < SSH_MAX_COMMAND, "the sweep's command is {} bytes", c.len());
        }
        let undo = shell_line("sh", &["-c", &without_comments(UNDO_ONE), "sh", "tlskey", ".nvme", &"k".repeat(300), "stale"]);
        assert!(undo.len() + 200 < SSH_MAX_COMMAND, "the undo's command is {} bytes", undo.len());
        // Only whole-line comments go, so no script may hold a quoted
        // string across lines (a comment line there would be content).
        for script in [SWEEP_WRAPPER, CLEANUP_SCRIPT, UNDO_ONE] {
            for l in without_comments(script).lines() {
                let code = l.split(" # ").next().unwrap_or(l);
                assert_eq!(code.replace(r"'\''", "").matches('\'').count() % 2, 0, "a quote left open at the end of: {l}");
            }
        }
    }

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

    /// The master's wait follows the ConnectTimeout ssh will use: the
    /// user's where given (ssh takes the first value, theirs), else ours.
    #[test]
    fn the_connect_timeout_is_the_users_where_given() {
        let exe = std::env::current_exe().unwrap();
        let host = |opts: &[(&str, &str)]| {
            let o: Vec<(String, String)> = opts.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            SshHost::new("ssh://root@10.0.0.1", &o, &exe).unwrap()
        };
        assert_eq!(host(&[]).connect_timeout_s(), DEFAULT_CONNECT_TIMEOUT_S);
        assert_eq!(host(&[("LogLevel", "ERROR"), ("connecttimeout", "120")]).connect_timeout_s(), 120);
        assert_eq!(host(&[("ConnectTimeout", "soon")]).connect_timeout_s(), DEFAULT_CONNECT_TIMEOUT_S);
    }

    #[test]
    fn quoting_survives_a_shell() {
        let args = ["plain", "with space", "it's", "$HOME", "a;b", ""];
        let line = shell_line("printf", &["%s|"].iter().chain(args.iter()).copied().collect::<Vec<_>>());
        let out = Command::new("sh").arg("-c").arg(&line).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "plain|with space|it's|$HOME|a;b||");
    }

    /// What the login shell around a remote command prints (a `~/.bashrc`
    /// sourced for ssh commands; here noise without a newline first, and an
    /// EXIT trap's goodbye after the command) never reaches the program's
    /// output, for a service (its PID recorded, the program's exit status
    /// kept) and a plain command, with arguments added later.
    #[test]
    fn program_output_is_the_framed_record_alone() {
        let dir = std::env::temp_dir().join(format!("bwlab-ssh-unit-frame-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let state = dir.join("state");
        let tag = new_frame_tag();
        let login_shell = |command: &str, args: &[&str]| {
            let out = held_stdin_output(
                Command::new("sh")
                    .arg("-c")
                    .arg(format!("trap 'echo \"bye {{\\\"not\\\": 2}}\"' EXIT; printf 'pyenv: notice {{\"not\": 1}}'; {command}"))
                    .arg("sh")
                    .args(args),
            );
            (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
        };
        let service = framed(&sh_c(&service_script("printf", &["{\"ops\": %s}\\n", "7"], &state.to_string_lossy()), &[]), &tag);
        let (code, stdout) = login_shell(&service, &[]);
        assert_eq!(code, Some(0), "{stdout}");
        assert!(stdout.starts_with("pyenv: notice") && stdout.trim_end().ends_with("bye {\"not\": 2}"), "{stdout}");
        assert_eq!(unframe(&stdout, &tag), Ok(("{\"ops\": 7}\n", 0)));
        assert!(std::fs::read_to_string(&state).unwrap().starts_with("pid "));
        // A failing program: its output and status, and ssh's status too.
        let (code, stdout) = login_shell(&framed("printf 'half\\n\\nlines'; exit 3", &tag), &[]);
        assert_eq!((code, unframe(&stdout, &tag)), (Some(3), Ok(("half\n\nlines", 3))));
        // `exec program "$@"` with arguments the caller added afterwards
        // (ssh joins them to the command line: the remote shell splits them).
        let (_, stdout) = login_shell(&format!("{} one 'ü two'", framed("exec printf '%s|' \"$@\"", &tag)), &[]);
        assert_eq!(unframe(&stdout, &tag), Ok(("one|ü two|", 0)));
        // The wrapper never ran, another run's tag, a record cut short.
        assert_eq!(unframe("pyenv: notice\n{\"ops\": 7}\n", &tag), Err(FrameError::Missing));
        assert_eq!(unframe(&stdout, "0123456789abcdef"), Err(FrameError::Missing));
        let cut = &stdout[..stdout.find("one").unwrap() + 3];
        assert_eq!(unframe(cut, &tag), Err(FrameError::Truncated { have: 3, want: "one|ü two|".len() }));
        // A header not at a line's start is noise quoting it.
        assert_eq!(unframe(&format!("x{FRAME_MARK} {tag} 2 0\nhi"), &tag), Err(FrameError::Missing));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// `cmd`'s output, its stdin a pipe held open until it ends (a
    /// service's session stops it when its stdin ends).
    fn held_stdin_output(cmd: &mut Command) -> std::process::Output {
        use std::process::Stdio;
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let stdin = child.stdin.take();
        let out = child.wait_with_output().unwrap();
        drop(stdin);
        out
    }

    /// A service that writes to stderr from its first instruction: its PID
    /// mark still comes whole, on a line of its own, first, and names the
    /// program's own process.
    #[test]
    fn a_service_pid_mark_comes_first_and_whole() {
        let dir = std::env::temp_dir().join(format!("bwlab-ssh-unit-pid-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let state = dir.join("state");
        // A program whose stderr gets bytes at once, a few at a time
        // (as a C program's unbuffered stderr does).
        let chatty = r#"for i in 1 2 3 4 5 6 7 8; do printf 'tgtd: part %s ' $i >&2; done; echo "self $$" >&2"#;
        for _ in 0..20 {
            let out = held_stdin_output(Command::new("sh").arg("-c").arg(sh_c(&service_script("sh", &["-c", chatty], &state.to_string_lossy()), &[])));
            let err = String::from_utf8_lossy(&out.stderr);
            let first = err.lines().next().unwrap_or_default();
            let pid = pid_mark(first).unwrap_or_else(|| panic!("no PID mark first: {err:?}"));
            assert_eq!(first, format!("{PID_MARK}{pid}"), "{err:?}");
            assert!(err.contains(&format!("self {pid}")), "the mark names another process: {err:?}");
        }
        assert_eq!(pid_mark("pyenv: notice bwlab-remote-pid 4242"), Some(4242));
        assert_eq!(pid_mark("bwlab-remote-pid 17\r"), Some(17));
        assert_eq!(pid_mark("bwlab-remote-pid x"), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

}
