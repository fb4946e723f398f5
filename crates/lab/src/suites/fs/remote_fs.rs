//! The fs suite on a client host reached over ssh (`--client-host`), and
//! on a kernel initiator's block device on any client host: the mount point,
//! the file system (`blockwire mount` for blockwire's userspace initiator,
//! mkfs and mount on the device for a kernel one), and each workload in a
//! memory cgroup of its own, all on that host. Each of these is written to
//! the host's state file before it is made: released, it is undone by the
//! same shell text a later run applies after a killed one
//! (`state_file::UNDO_ONE`), so a cut run's mounts and cgroups do not outlive the
//! next run's start.

use crate::cleanup::{registry, Resource, Token};
use crate::suites::fs::fs_kind::FsKind;
use crate::hosts::host::Host;
use crate::suites::fs::mounts::Mounted;
use crate::suites::runner::Finished;
use crate::hosts::ssh::{quote, shell_line, SshHost};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The mount point on the host, made now and removed at the end.
pub fn mountpoint(h: &SshHost) -> anyhow::Result<(Token, PathBuf)> {
    let mp = h.run_path("/tmp", "mnt");
    let p = mp.to_string_lossy().into_owned();
    let (t, ()) = h.recorded("rmdir", &p, "", || h.run_line(&format!("mkdir -p {}", quote(&p))).map(|_| ()))?;
    Ok((t, mp))
}

/// `blockwire mount URL MP --mkfs TYPE` on the host with the lab's binary
/// there; its attach daemon's PID is read from the state `blockwire mount`
/// leaves in /run/blockwire.
pub fn mount_blockwire(h: &SshHost, url: &str, mp: &Path, kind: FsKind, size: u64) -> anyhow::Result<Mounted> {
    let exe = h.exe.to_string_lossy().into_owned();
    let p = mp.to_string_lossy().into_owned();
    let mut args: Vec<String> = ["mount", url, p.as_str(), "--mkfs", kind.mkfs_type(), "-o", kind.mount_options(), "--timeout", "30"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(kind.mkfs_options(size).into_iter().map(|o| format!("--mkfs-option={o}")));
    let (t, ()) = h.recorded("bwmount", &p, &exe, || h.run_line(&shell_line(&exe, &args)).map(|_| ()))?;
    Ok(Mounted::new(mp.to_path_buf(), attach_daemon_of(h, mp), vec![t]))
}

/// The PID of the attach daemon serving `blockwire mount`'s file system at
/// `mp` on the host (its state file `/run/blockwire/attach-PID.json`).
fn attach_daemon_of(h: &SshHost, mp: &Path) -> Option<u32> {
    let pattern = format!("\"mountpoint\":\"{}\"", mp.display());
    let out = h.run_line(&format!("grep -lF {} {}/attach-*.json 2>/dev/null || true", quote(&pattern), bw_attach::STATE_DIR)).ok()?;
    parse_attach_state_name(out.lines().next()?)
}

/// `.../attach-PID.json` -> PID.
fn parse_attach_state_name(path: &str) -> Option<u32> {
    path.trim().rsplit_once("attach-")?.1.strip_suffix(".json")?.parse().ok()
}

/// `sh -c` with the system directories on PATH (a non-login ssh session
/// may lack /usr/sbin, where mkfs and bonnie++ live).
const SBIN: &str = r#"PATH=$PATH:/usr/sbin:/sbin; exec "$@""#;

fn run_sbin(host: &Host, args: &[&str]) -> anyhow::Result<String> {
    let mut a = vec!["-c", SBIN, "sh"];
    a.extend_from_slice(args);
    host.run("sh", &a)
}

/// `kind` made on the block device `dev` of `host` (a kernel initiator's)
/// and mounted on `mp`. Over ssh the mount is in the state file first.
pub fn mount_device(host: &Host, dev: &str, mp: &Path, kind: FsKind, size: u64) -> anyhow::Result<Mounted> {
    let p = mp.to_string_lossy().into_owned();
    let force = if kind.mkfs_type() == "ext4" { "-F" } else { "-f" };
    let opts = kind.mkfs_options(size);
    let make = || -> anyhow::Result<()> {
        // The device's page cache may hold blocks another subject's client
        // has overwritten since (they share the volume): dropped first.
        let _ = run_sbin(host, &["blockdev", "--flushbufs", dev]);
        let mut mkfs = vec![kind.mkfs_program(), "-q", force];
        mkfs.extend(opts.iter().map(|s| s.as_str()));
        mkfs.push(dev);
        run_sbin(host, &mkfs)?;
        run_sbin(host, &["mount", "-o", kind.mount_options(), dev, &p]).map(|_| ())
    };
    let (t, ()) = host.create_recorded("mount", &p, "", Resource::Mount(mp.to_path_buf()), make)?;
    Ok(Mounted::new(mp.to_path_buf(), None, vec![t]))
}

/// Where the host's memory controller is: (`v1`|`v2`, its directory).
pub fn cgroup_base(h: &SshHost) -> anyhow::Result<(String, String)> {
    let out = h.run_line(
        r#"if [ -f /sys/fs/cgroup/memory/memory.limit_in_bytes ]; then echo v1 /sys/fs/cgroup/memory
elif grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then echo v2 /sys/fs/cgroup; fi"#,
    )?;
    match out.split_whitespace().collect::<Vec<_>>()[..] {
        [v, base] => Ok((v.to_string(), base.to_string())),
        _ => anyhow::bail!("{}: no memory cgroup controller under /sys/fs/cgroup (the fs suite limits the client's memory with one)", h.url()),
    }
}

/// A memory cgroup on the host for one fs case.
pub struct Cgroup {
    version: String,
    pub dir: String,
    token: Token,
}

impl Cgroup {
    /// `NAME` under `base` (from [`cgroup_base`]) with `limit` bytes.
    pub fn create(h: &SshHost, base: &(String, String), name: &str, limit: u64) -> anyhow::Result<Cgroup> {
        let (version, root) = base;
        let dir = format!("{root}/{name}");
        let file = if version == "v1" { "memory.limit_in_bytes" } else { "memory.max" };
        let line = format!("mkdir {d} && echo {limit} > {d}/{file}", d = quote(&dir));
        let (token, ()) = h.recorded("cgroup", &dir, "", || h.run_line(&line).map(|_| ()))?;
        Ok(Cgroup { version: version.clone(), dir, token })
    }

    /// OOM kills inside and peak memory use, read before the group goes.
    pub fn finish(self, h: &SshHost) -> anyhow::Result<(u64, Option<u64>)> {
        let (peak, events) = if self.version == "v1" {
            ("memory.max_usage_in_bytes", "memory.oom_control")
        } else {
            ("memory.peak", "memory.events")
        };
        let d = quote(&self.dir);
        let read = h.run_line(&format!("cat {d}/{peak} 2>/dev/null || echo; cat {d}/{events} 2>/dev/null || true"));
        registry().release(self.token)?;
        let text = read?;
        let peak = text.lines().next().and_then(|l| l.trim().parse().ok());
        Ok((crate::hosts::cgroup::parse_oom_kill(&text), peak))
    }
}

/// Joins the cgroup (`$1`), goes to the workload's directory (`$2`), runs
/// the rest as the workload, and prints its CPU time (the shell's `times`,
/// after [`TIMES_MARK`]) on stderr. Stopped (its ssh session ending), it
/// stops the workload first.
const IN_CGROUP: &str = r#"PATH=$PATH:/usr/sbin:/sbin
echo $$ > "$1/cgroup.procs" || exit 1
cd "$2" || exit 1
shift 2
trap 'kill $c 2>/dev/null' TERM
"$@" </dev/null & c=$!
wait $c; s=$?
wait $c 2>/dev/null
{ echo bwlab-times; times; } >&2
exit $s"#;

const TIMES_MARK: &str = "bwlab-times";

/// The workload's CPU seconds from `times` after [`TIMES_MARK`]: its second
/// line is the children's user and system time (`0m1.230s 0m0.400s`).
pub fn parse_times(stderr: &str) -> Option<f64> {
    let mut lines = stderr.lines().skip_while(|l| l.trim() != TIMES_MARK);
    lines.next()?;
    lines.next()?;
    let children = lines.next()?;
    let secs = |t: &str| -> Option<f64> {
        let (m, s) = t.strip_suffix('s')?.split_once('m')?;
        Some(m.parse::<f64>().ok()? * 60.0 + s.parse::<f64>().ok()?)
    };
    let v: Vec<f64> = children.split_whitespace().map(secs).collect::<Option<_>>()?;
    (v.len() == 2).then(|| v[0] + v[1])
}

/// What the workload's stderr was, without the lines [`IN_CGROUP`] adds.
fn workload_stderr(stderr: &str) -> String {
    stderr.lines().take_while(|l| l.trim() != TIMES_MARK).collect::<Vec<_>>().join("\n")
}

/// Run `wrapper prog args` in `dir` inside `cg` on the host, tied to its ssh
/// session (Ctrl-C or a lost connection stop it); its CPU time is the
/// remote shell's account of it, not the ssh client's.
#[allow(clippy::too_many_arguments)]
pub fn run_in_cgroup(
    h: &SshHost,
    cg: &Cgroup,
    dir: &Path,
    wrapper: Option<&str>,
    prog: &str,
    args: &[String],
    what: &str,
    timeout: Duration,
) -> anyhow::Result<Finished> {
    let d = dir.to_string_lossy();
    let mut a: Vec<&str> = vec!["-c", IN_CGROUP, "sh", cg.dir.as_str(), d.as_ref()];
    a.extend(wrapper);
    a.push(prog);
    a.extend(args.iter().map(|s| s.as_str()));
    let cmd = h.service_command("sh", &a);
    let mut f = crate::suites::runner::run_workload_with_stdin(cmd, what, timeout, None, std::process::Stdio::piped())?;
    if f.ok {
        f.stdout = h.program_output(&f.stdout)?.to_string();
    }
    f.cpu_s = parse_times(&f.stderr).unwrap_or(0.0);
    f.stderr = workload_stderr(&f.stderr);
    Ok(f)
}

/// What workload `w` needs in `dir` on the host before it is measured (as
/// `client::FsClient::prepare` does here): the directory, PostMark's
/// config, IOgen's file laid out.
pub fn prepare(h: &SshHost, w: crate::suites::fs::workloads::FsWorkload, fsp: &crate::suites::fs::workloads::FsParams, dir: &Path) -> anyhow::Result<()> {
    use crate::suites::fs::workloads::FsWorkload;
    let d = quote(&dir.to_string_lossy());
    match w {
        FsWorkload::Postmark => {
            let cfg = crate::suites::fs::workloads::postmark_config(fsp, dir);
            h.run_line(&format!("mkdir -p {d} && printf %s {} > {d}/postmark.cfg", quote(&cfg)))?;
        }
        FsWorkload::Iogen { .. } => {
            h.run_line(&format!("mkdir -p {d}"))?;
            let args = crate::suites::fs::workloads::iogen_layout_args(fsp, &dir.join("iogen.dat").to_string_lossy());
            // Tied to its session like the workloads: Ctrl-C stops it there.
            let cmd = h.service_command("fio", &args);
            let f = crate::suites::runner::run_workload_with_stdin(cmd, "fio layout", Duration::from_secs(600), None, std::process::Stdio::piped())?;
            anyhow::ensure!(f.ok, "laying out the IOgen file failed: {}", crate::command::last_lines(&f.stderr, 3));
        }
        _ => {
            h.run_line(&format!("mkdir -p {d}"))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_of_bash_and_dash() {
        // bash, then dash: the shell's own line, then its children's.
        let bash = "some workload noise\nbwlab-times\n0m0.004s 0m0.002s\n1m2.500s 0m0.250s\n";
        assert_eq!(parse_times(bash), Some(62.75));
        let dash = "bwlab-times\n0m0.000000s 0m0.004000s\n0m1.230000s 0m0.400000s\n";
        assert!((parse_times(dash).unwrap() - 1.63).abs() < 1e-9);
        assert_eq!(parse_times("no mark\n"), None);
        assert_eq!(workload_stderr(bash), "some workload noise");
    }

    #[test]
    fn the_shell_reports_its_childrens_cpu() {
        let dir = std::env::temp_dir();
        let out = std::process::Command::new("sh")
            .args(["-c", &IN_CGROUP.replace("echo $$ > \"$1/cgroup.procs\" || exit 1", ""), "sh", "/nonexistent", &dir.to_string_lossy()])
            .args(["sh", "-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; echo done"])
            .output()
            .unwrap();
        assert!(out.status.success());
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "done");
        let cpu = parse_times(&String::from_utf8_lossy(&out.stderr)).expect("times printed");
        assert!(cpu > 0.0, "{}", String::from_utf8_lossy(&out.stderr));
    }

    /// A kernel initiator's block device stands in as a loop device: the
    /// file system is made and mounted, and the release unmounts it.
    #[test]
    fn a_block_device_gets_a_file_system_and_loses_it() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 || !crate::command::which("mkfs.ext4") {
            eprintln!("skipped: needs root and mkfs.ext4");
            return;
        }
        let base = std::env::temp_dir().join(format!("bwlab-remote-fs-unit-{}", std::process::id()));
        let mp = base.join("mnt");
        std::fs::create_dir_all(&mp).unwrap();
        let img = base.join("img");
        std::fs::File::create(&img).unwrap().set_len(32 << 20).unwrap();
        let (loop_token, dev) = crate::suites::fs::mounts::loop_device(&img).unwrap();
        let mounted = mount_device(&Host::Local, &dev, &mp, FsKind::Ext4, 32 << 20);
        let is_mounted = || std::fs::read_to_string("/proc/mounts").unwrap().lines().any(|l| l.contains(&format!(" {} ext4 ", mp.display())));
        let was = is_mounted();
        let released = mounted.map(|m| m.release());
        let still = is_mounted();
        registry().release(loop_token).unwrap();
        std::fs::remove_dir_all(&base).unwrap();
        assert!(was, "not mounted");
        assert!(matches!(released, Ok(Ok(()))), "{released:?}");
        assert!(!still, "still mounted after the release");
    }

    #[test]
    fn attach_state_names() {
        assert_eq!(parse_attach_state_name("/run/blockwire/attach-4242.json\n"), Some(4242));
        assert_eq!(parse_attach_state_name("/run/blockwire/attach-x.json"), None);
    }
}
