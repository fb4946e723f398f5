//! The state file: one format for every host a run touches. What the lab
//! makes on a host is written there as a line `KIND A B` before it is made
//! (on an ssh host by `crate::hosts::ssh`, on this machine by
//! `crate::hosts::local_state`), and one shell text undoes the lines: the run's
//! own end ([`UNDO_ONE`] per thing, [`CLEANUP_SCRIPT`] for the whole file)
//! and a later run that finds the file of a dead run ([`CLEANUP_SCRIPT`]
//! with `stale`, which also says what it found and what stayed). The
//! first lines name whose file it is: `host net:[INODE]` (the system it
//! was written on, for ssh hosts that share a file system) and `run PID
//! START BOOT_ID LABHOST` (the lab process that owns it: see
//! [`RunOwner`]).

/// Undo one attachment (`$1` what, `$2` `$3` its address). A macro so the
/// state file's cleanup script ([`CLEANUP_SCRIPT`]) holds the same lines.
/// The kernel initiators (`crate::subjects::clients`, `crate::subjects::kernel_nfs`) attach;
/// undoing is here, with the other undo steps.
macro_rules! detach_script {
    () => {
        r#"PATH=$PATH:/usr/sbin:/sbin
case "$1" in
  iscsi) iscsiadm -m node -T "$2" -p "$3" --logout >/dev/null 2>&1
         iscsiadm -m node -T "$2" -p "$3" -o delete >/dev/null 2>&1
         iscsiadm -m discoverydb -t sendtargets -p "$3" -o delete >/dev/null 2>&1
         if [ -f /run/bwlab-iscsid ] && ! iscsiadm -m session >/dev/null 2>&1; then
           kill $(cat /run/bwlab-iscsid) 2>/dev/null; rm -f /run/bwlab-iscsid
         fi ;;
  nvme|nvme-rdma) nvme disconnect -n "$2" >/dev/null 2>&1 ;;
  # the name without a newline: the driver compares the bytes written
  aoe) [ -e /dev/etherd/flush ] && printf %s "$2" > /dev/etherd/flush 2>/dev/null ;;
  # a kernel NFS mount (crate::subjects::kernel_nfs), also when its server is gone
  nfs) umount -f "$2" 2>/dev/null || umount -f -l "$2" 2>/dev/null; rmdir "$2" 2>/dev/null ;;
esac
true"#
    };
}
pub const DETACH: &str = detach_script!();

/// Take down a kernel target the lab set up through configfs: `remove_lio
/// IQN HBA/NAME` (the iSCSI target with its TPGs, LUNs and portals, then
/// the backstore and its HBA, which the lab always makes fresh) and
/// `remove_nvmet NQN "PORT..."` (the ports the lab made, then the
/// subsystem with its namespaces once no port links it). Only the names
/// given: whatever else the host's LIO or nvmet serves stays.
macro_rules! configfs_removal {
    () => {
        r#"remove_lio() {
  cfs_t=/sys/kernel/config/target; cfs_d=$cfs_t/iscsi/$1
  if [ -d "$cfs_d" ]; then
    for cfs_g in "$cfs_d"/tpgt_*; do
      [ -d "$cfs_g" ] || continue
      echo 0 > "$cfs_g/enable" 2>/dev/null
      for cfs_l in "$cfs_g"/lun/lun_*; do
        [ -d "$cfs_l" ] || continue
        for cfs_p in "$cfs_l"/*; do [ -L "$cfs_p" ] && rm -f "$cfs_p"; done
        rmdir "$cfs_l"
      done
      for cfs_n in "$cfs_g"/np/*; do [ -d "$cfs_n" ] && rmdir "$cfs_n"; done
      rmdir "$cfs_g"
    done
    rmdir "$cfs_d"
  fi
  if [ -n "$2" ] && [ -d "$cfs_t/core/$2" ]; then rmdir "$cfs_t/core/$2" && rmdir "$cfs_t/core/${2%/*}"; fi
}
remove_nvmet() {
  cfs_n=/sys/kernel/config/nvmet; cfs_s=$cfs_n/subsystems/$1
  for cfs_p in $2; do
    rm -f "$cfs_n/ports/$cfs_p/subsystems/$1"
    [ -d "$cfs_n/ports/$cfs_p" ] && rmdir "$cfs_n/ports/$cfs_p"
  done
  [ -d "$cfs_s" ] || return 0
  for cfs_l in "$cfs_n"/ports/*/subsystems/"$1"; do [ -L "$cfs_l" ] && return 0; done
  for cfs_ns in "$cfs_s"/namespaces/*; do [ -d "$cfs_ns" ] || continue; echo 0 > "$cfs_ns/enable"; rmdir "$cfs_ns"; done
  rmdir "$cfs_s"
}
"#
    };
}

/// The shell function `undo KIND A B` that undoes one state-file line, for
/// [`CLEANUP_SCRIPT`] and [`UNDO_ONE`] (one text: what a run undoes at its
/// end is what a later run undoes for it). Kinds: `file`, `dir` (the
/// binary's: kept while another run's state file lists it), `mtu DEV OLD`,
/// `offload DEV FEATURE on|off...` (`ethtool -K`), `qdisc DEV` (the root
/// qdisc the lab put there; the kernel's default comes back), `kernel
/// WHAT A B` (`crate::subjects::clients`), `module NAME` (loaded by the lab),
/// `cgroup DIR` (its processes killed, then removed), `mount MP`,
/// `bwmount MP EXE` (`blockwire umount`), `rmdir DIR`, `lio IQN BACKSTORE`
/// and `nvmet NQN PORTS` (kernel targets, [`configfs_removal`]), `modules
/// NAME...` (loaded by the lab for them), `configfs MP` (mounted by it),
/// `nfsimage URL EXE` (the lab's image file on an external NFS export),
/// `export CLIENT:DIR` (`exportfs -u`), `nfsd` (the server's threads
/// stopped), `kill PID START` (a process the lab started, if it is still
/// that one), `write FILE VALUE` (the value put back) and `tlskey KEYRING
/// DESCRIPTION` (a TLS PSK the lab inserted for nvmet, invalidated); on this machine
/// also `netns NAME` (the processes left inside killed, then deleted),
/// `link NAME NS` (a link, in namespace NS or the root one), `qdisc DEV
/// NS` (in a namespace) and `loop DEV BACKING` (detached only while it
/// still backs BACKING; DEV `-`: every loop device on BACKING). `pid`,
/// `run` and `host` lines are not undone here ([`CLEANUP_SCRIPT`] kills
/// the processes first).
macro_rules! undo_function {
    () => {
        concat!(
            "detach_kernel() (\n",
            detach_script!(),
            "\n)\n",
            configfs_removal!(),
            r#"PATH=$PATH:/usr/sbin:/sbin
# The serials of the TLS PSKs described $2 in keyring $1, as `keyctl show`
# lists them (a search is refused: root does not possess the kernel's keys).
tls_psk_serial() { keyctl show "%:$1" 2>/dev/null | awk -v d="psk: $2" 'substr($0, length($0) - length(d) + 1) == d { print $1 }'; }
undo() {
  kind=$1; a=$2; b=$3
  case "$kind" in
    file) rm -f -- "$a" ;;
    dir) # The binary's directory is shared by runs of one version: kept
         # while another run's state file lists it.
         keep=""; for o in "${s%/*}"/state-*; do [ "$o" != "$s" ] && grep -q "^dir $a " "$o" 2>/dev/null && keep=1; done
         [ -n "$keep" ] || rm -rf -- "$a" ;;
    mtu) ip link set dev "$a" mtu "$b" ;;
    offload) ethtool -K "$a" $b >/dev/null 2>&1 ;;
    qdisc) if [ -z "$b" ]; then tc qdisc del dev "$a" root 2>/dev/null
           elif [ -e "/run/netns/$b" ]; then ip netns exec "$b" tc qdisc del dev "$a" root 2>/dev/null; fi ;;
    netns) if [ -e "/run/netns/$a" ]; then
             # what is still inside (the lab's own namespace, by record) goes first
             for p in $(ip netns pids "$a" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
             ip netns del "$a" 2>/dev/null
           fi ;;
    link) if [ -z "$b" ]; then ip link del "$a" 2>/dev/null
          elif [ -e "/run/netns/$b" ]; then ip -n "$b" link del "$a" 2>/dev/null; fi ;;
    loop) for l in /sys/block/loop*; do
            [ "$(cat "$l/loop/backing_file" 2>/dev/null)" = "$b" ] || continue
            [ "$a" = - ] || [ "/dev/${l##*/}" = "$a" ] || continue
            losetup -d "/dev/${l##*/}" 2>/dev/null
          done ;;
    kernel) detach_kernel "$a" $b ;;
    module) modprobe -r "$a" 2>/dev/null ;;
    cgroup) if [ -d "$a" ]; then
              n=0; while ! rmdir "$a" 2>/dev/null && [ $n -lt 50 ]; do
                for p in $(cat "$a/cgroup.procs" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
                sleep 0.1; n=$((n+1))
              done
            fi ;;
    mount) if grep -q " $a " /proc/mounts; then umount "$a" 2>/dev/null || umount -l "$a"; fi ;;
    bwmount) if grep -q " $a " /proc/mounts; then
               # A killed run's volume matters no more: its FUSE connection
               # is aborted first, so the unmount writes nothing back
               # through a daemon whose target may be gone.
               if [ -n "$stale" ]; then
                 f=/run/blockwire/fuse/$(printf %s "$a" | tr -c 'A-Za-z0-9' _)
                 c=$(mountpoint -d "$f" 2>/dev/null | cut -d: -f2)
                 [ -n "$c" ] && echo 1 > "/sys/fs/fuse/connections/$c/abort" 2>/dev/null
               fi
               x=$b; [ -x "$x" ] || x=${BWLAB_EXE:-$b}
               "$x" umount "$a" >/dev/null 2>&1 || umount -l "$a"
             fi ;;
    rmdir) rmdir "$a" 2>/dev/null ;;
    lio|nvmet) grep -q " /sys/kernel/config configfs " /proc/mounts || mount -t configfs none /sys/kernel/config 2>/dev/null
         remove_$kind "$a" "$b" ;;
    modules) # rmmod, not modprobe -r: a module the lab did not load stays,
             # and one still in use refuses (a few rounds: dependents first)
             for cfs_r in 1 2 3 4; do for cfs_m in $a $b; do [ -d "/sys/module/$cfs_m" ] && rmmod "$cfs_m" 2>/dev/null; done; done ;;
    configfs) grep -q " $a configfs " /proc/mounts && umount "$a" 2>/dev/null ;;
    nfsimage) "$b" nfs remove "$a" >/dev/null 2>&1 ;;
    # knfsd (subjects::knfsd): the lab's export, the nfsd threads it
    # started, a process it started (PID and start time), a value it wrote
    export) exportfs -u "$a" 2>/dev/null ;;
    nfsd) rpc.nfsd 0 2>/dev/null ;;
    kill) if [ "$(cut -d' ' -f22 /proc/$a/stat 2>/dev/null)" = "$b" ]; then
            kill "$a"; n=0; while [ -d "/proc/$a" ] && [ $n -lt 30 ]; do sleep 0.1; n=$((n+1)); done
          fi ;;
    # a value put back; where the local sweep names the lab's congestion
    # lock (and how long a run waits for it), under it
    # (hosts::local_state::CongestionLock: a live run holds it from its
    # look at the allowed list to its namespaces' sysctl)
    write) [ -w "$a" ] || return 0
           if [ -n "$BWLAB_CONGESTION_LOCK" ]; then
             flock -w "$BWLAB_CONGESTION_LOCK_WAIT" "$BWLAB_CONGESTION_LOCK" sh -c 'echo "$1" > "$2"' sh "$b" "$a" 2>/dev/null
           else echo "$b" > "$a" 2>/dev/null; fi ;;
    # a TLS PSK the lab put in keyring $a under description $b (--tls):
    # unlinked (the kernel then drops it); only the keyring's writer may
    # do that to the kernel's .nvme keys, not search or invalidate them
    tlskey) for k in $(tls_psk_serial "$a" "$b"); do keyctl unlink "$k" "%:$a" >/dev/null 2>&1; done ;;
  esac
  true
}
# Whether what line `KIND A B` made is there: 0 yes, 1 no, 2 cannot tell
# (for the report of a sweep: what a dead run left, what stayed).
present() {
  kind=$1; a=$2; b=$3
  case "$kind" in
    pid|kill) [ "$(cut -d' ' -f22 /proc/$a/stat 2>/dev/null)" = "$b" ] ;;
    file) [ -e "$a" ] ;;
    dir|rmdir|cgroup) [ -d "$a" ] ;;
    netns) [ -e "/run/netns/$a" ] ;;
    link) if [ -z "$b" ]; then ip link show "$a" >/dev/null 2>&1; else [ -e "/run/netns/$b" ] && ip -n "$b" link show "$a" >/dev/null 2>&1; fi ;;
    mount|bwmount|configfs) grep -q " $a " /proc/mounts ;;
    loop) for l in /sys/block/loop*; do
            [ "$(cat "$l/loop/backing_file" 2>/dev/null)" = "$b" ] && { [ "$a" = - ] || [ "/dev/${l##*/}" = "$a" ]; } && return 0
          done; return 1 ;;
    module) [ -d "/sys/module/$a" ] ;;
    tlskey) [ -n "$(tls_psk_serial "$a" "$b")" ] ;;
    mtu) [ -e "/sys/class/net/$a" ] && [ "$(cat "/sys/class/net/$a/mtu")" != "$b" ] ;;
    qdisc) if [ -z "$b" ]; then tc qdisc show dev "$a" root 2>/dev/null | grep -q tbf
           else [ -e "/run/netns/$b" ] && ip netns exec "$b" tc qdisc show dev "$a" root 2>/dev/null | grep -q tbf; fi ;;
    run|host) return 1 ;;
    *) return 2 ;;
  esac
}
"#
        )
    };
}

/// Undo what a state file lists (`$1`; `$2` is `stale` for a file an
/// interrupted run left): processes first (only if PID and start time
/// still match), then every other line newest first ([`undo_function`]),
/// the `modules` lines last, then the file itself. Safe to run twice.
/// With `stale` it prints `bwlab-left LINE` for each thing it found there
/// first, and `bwlab-still LINE` for each it could not undo ([`Sweep`]).
pub const CLEANUP_SCRIPT: &str = concat!(
    undo_function!(),
    r#"s="$1"; stale="$2"; [ -f "$s" ] || exit 0
if [ -n "$stale" ]; then
  while read -r kind a b; do present "$kind" "$a" "$b" </dev/null; [ $? = 1 ] || echo "bwlab-left $kind $a $b"; done < "$s"
fi
pids=""
while read -r kind a b; do
  if [ "$kind" = pid ] && [ "$(cut -d' ' -f22 /proc/$a/stat 2>/dev/null)" = "$b" ]; then pids="$pids $a"; kill "$a" 2>/dev/null; fi
done < "$s"
n=0; while [ $n -lt 30 ]; do
  left=""; for p in $pids; do [ -d /proc/$p ] && left="$left $p"; done
  [ -z "$left" ] && break; sleep 0.1; n=$((n+1))
done
for p in $left; do kill -9 "$p" 2>/dev/null; done
# modules last: rmmod waits for what used them to be gone
tac "$s" | while read -r kind a b; do [ "$kind" = modules ] || undo "$kind" "$a" "$b"; done
tac "$s" | while read -r kind a b; do [ "$kind" != modules ] || undo "$kind" "$a" "$b"; done
if [ -n "$stale" ]; then
  # (the binary's directory stays while another run uses it: not a failure)
  while read -r kind a b; do [ "$kind" = dir ] || { present "$kind" "$a" "$b" </dev/null && echo "bwlab-still $kind $a $b"; }; done < "$s"
fi
rm -f -- "$s"
rmdir "${s%/*}" 2>/dev/null || true"#
);

/// The longest command dropbear runs (its `MAX_CMD_LEN`): a longer one
/// ends the ssh session at once ("closed by remote host"). Dropbear is the
/// kernel VM's sshd and many small hosts'; OpenSSH allows far more.
pub const SSH_MAX_COMMAND: usize = 9000;

pub use crate::command::without_comments;

/// Undo one state-file line now (`$1` kind, `$2` `$3`; `$4` is `stale`
/// after an interruption): what a tracked resource recorded with
/// `SshHost::recorded` (or this machine's registry) runs when released.
pub const UNDO_ONE: &str = concat!(undo_function!(), r#"stale="$4"; undo "$1" "$2" "$3""#);

/// The lab process a state file belongs to: its PID, its start time (clock
/// ticks after boot, field 22 of /proc/PID/stat), the boot it runs in, and
/// the machine's name (for messages). A PID alone says nothing: PIDs are
/// reused, and a file may outlive a reboot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOwner {
    pub pid: u32,
    pub start: u64,
    pub boot_id: String,
    pub host: String,
}

/// This boot's id (/proc/sys/kernel/random/boot_id).
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").map(|s| s.trim().to_string()).unwrap_or_default()
}

/// The start time of process `pid` (clock ticks after boot), if it runs.
pub fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name, which may hold spaces and parentheses.
    let rest = stat.rsplit_once(") ")?.1;
    rest.split_whitespace().nth(19)?.parse().ok()
}

impl RunOwner {
    /// This process.
    pub fn current() -> RunOwner {
        let pid = std::process::id();
        let host = crate::command::first_line("hostname", &[]).unwrap_or_default();
        RunOwner { pid, start: start_ticks(pid).unwrap_or(0), boot_id: boot_id(), host: host.split_whitespace().next().unwrap_or("").to_string() }
    }

    /// The state file's `run` line.
    pub fn line(&self) -> String {
        format!("run {} {} {} {}", self.pid, self.start, self.boot_id, if self.host.is_empty() { "-" } else { &self.host })
    }

    /// The owner named by a state file's text (its `run` line).
    pub fn of_state(text: &str) -> Option<RunOwner> {
        let l = text.lines().find_map(|l| l.strip_prefix("run "))?;
        let f: Vec<&str> = l.split_whitespace().collect();
        Some(RunOwner { pid: f.first()?.parse().ok()?, start: f.get(1)?.parse().ok()?, boot_id: f.get(2)?.to_string(), host: f.get(3).unwrap_or(&"-").to_string() })
    }

    /// Whether the owner runs on this machine's current boot (whether it
    /// is alive can only be told here).
    pub fn of_this_boot(&self) -> bool {
        self.boot_id == boot_id()
    }

    /// Whether the owner is a live lab run: same boot, a process with that
    /// PID and that start time, and that process is `blockwire lab`.
    pub fn is_live(&self) -> bool {
        self.of_this_boot() && start_ticks(self.pid) == Some(self.start) && is_lab_run(self.pid)
    }

    /// "PID 123 (started 3 min ago, gone)", for messages.
    pub fn describe(&self) -> String {
        let when = if !self.of_this_boot() {
            "an earlier boot".to_string()
        } else if start_ticks(self.pid) == Some(self.start) {
            "this boot, still running".to_string()
        } else {
            "this boot, gone".to_string()
        };
        format!("PID {} on {}, {when}", self.pid, if self.host == "-" { "this machine" } else { &self.host })
    }
}

/// Whether process `pid` is a `blockwire lab` run (its argv has `lab`
/// right after the program).
fn is_lab_run(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.split(|b| *b == 0).nth(1) == Some(b"lab"))
}

/// What a sweep of one dead run's state file found and did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Swept {
    /// The state file.
    pub state: String,
    /// Whose it was ([`RunOwner::describe`], or why it counted as dead).
    pub owner: String,
    /// What was there (lines, described), all undone but `still`.
    pub left: Vec<String>,
    /// What could not be undone.
    pub still: Vec<String>,
}

impl Swept {
    /// Read [`CLEANUP_SCRIPT`]'s `stale` output (other lines ignored).
    pub fn from_output(state: &str, owner: &str, out: &str) -> Swept {
        let pick = |mark: &str| -> Vec<String> { out.lines().filter_map(|l| l.strip_prefix(mark)).map(describe).filter(|d| !d.is_empty()).collect() };
        Swept { state: state.into(), owner: owner.into(), left: pick("bwlab-left "), still: pick("bwlab-still ") }
    }

    /// One line for the terminal: `HOST: removed what a dead run left ...`.
    pub fn message(&self, host: &str) -> String {
        let what = if self.left.is_empty() { "nothing of it was left".to_string() } else { self.left.join(", ") };
        let mut m = format!("{host}: undid what an interrupted run left ({}; {}): {what}", self.owner, self.state);
        if !self.still.is_empty() {
            m.push_str(&format!("; could not undo: {}", self.still.join(", ")));
        }
        m
    }
}

/// A state-file line as a person reads it (`netns bwlab12t` is
/// "namespace bwlab12t"); empty for the header lines.
pub fn describe(line: &str) -> String {
    let mut f = line.trim().splitn(3, ' ');
    let (kind, a, b) = (f.next().unwrap_or(""), f.next().unwrap_or(""), f.next().unwrap_or("").trim());
    let inside = |what: &str| if b.is_empty() { what.to_string() } else { format!("{what} (in {b})") };
    match kind {
        "run" | "host" | "" => String::new(),
        "pid" | "kill" => format!("process {a}"),
        "netns" => format!("namespace {a}"),
        "link" => inside(&format!("link {a}")),
        "qdisc" => inside(&format!("qdisc on {a}")),
        "file" => format!("file {a}"),
        "rmdir" => format!("directory {a}"),
        "dir" => format!("directory {a} (with what is in it)"),
        "mount" => format!("mount {a}"),
        "bwmount" => format!("blockwire mount {a}"),
        "loop" if a == "-" => format!("loop device on {b}"),
        "loop" => format!("loop device {a} on {b}"),
        "cgroup" => format!("cgroup {a}"),
        "mtu" => format!("MTU of {a} (back to {b})"),
        "offload" => format!("offloads of {a}"),
        "kernel" => format!("kernel {a} session {b}"),
        "module" | "modules" => format!("module {a} {b}").trim().to_string(),
        _ => format!("{kind} {a} {b}").trim().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// What a killed fs suite leaves on a client host: a file system
    /// mounted on a (kernel initiator's, here a loop) device, a memory
    /// cgroup with a workload in it. The next run's sweep undoes both.
    #[test]
    fn cleanup_script_unmounts_and_removes_cgroups_of_a_killed_run() {
        let cg_root = std::path::Path::new("/sys/fs/cgroup/memory");
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 || !cg_root.join("memory.limit_in_bytes").exists() || !crate::command::which("mkfs.ext4") {
            eprintln!("skipped: needs root, a v1 memory cgroup and mkfs.ext4");
            return;
        }
        let dir = std::env::temp_dir().join(format!("bwlab-ssh-unit-fs-{}", std::process::id()));
        let mp = dir.join("mnt");
        std::fs::create_dir_all(&mp).unwrap();
        let img = dir.join("img");
        std::fs::File::create(&img).unwrap().set_len(32 << 20).unwrap();
        let dev = crate::command::sh("losetup", &["--find", "--show", &img.to_string_lossy()]).unwrap().trim().to_string();
        crate::command::sh("mkfs.ext4", &["-q", "-F", &dev]).unwrap();
        crate::command::sh("mount", &[&dev, &mp.to_string_lossy()]).unwrap();
        let cg = cg_root.join(format!("bwlab-ssh-unit-{}", std::process::id()));
        std::fs::create_dir(&cg).unwrap();
        let mut sleeper = Command::new("sleep").arg("60").spawn().unwrap();
        std::fs::write(cg.join("cgroup.procs"), sleeper.id().to_string()).unwrap();
        let state = dir.join("state-killed");
        std::fs::write(&state, format!("host x y\nrmdir {}\nmount {}\ncgroup {}\n", mp.display(), mp.display(), cg.display())).unwrap();
        let st = Command::new("sh").args(["-c", CLEANUP_SCRIPT, "sh"]).arg(&state).arg("stale").status().unwrap();
        let mounted = std::fs::read_to_string("/proc/mounts").unwrap().contains(&format!(" {} ", mp.display()));
        let killed = sleeper.wait().unwrap().code().is_none();
        let left = (cg.exists(), mp.exists(), state.exists());
        if mounted {
            let _ = crate::command::sh("umount", &["-l", &mp.to_string_lossy()]);
        }
        let _ = std::fs::remove_dir(&cg);
        let _ = crate::command::sh("losetup", &["-d", &dev]);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(st.success());
        assert!(!mounted, "{} still mounted", mp.display());
        assert!(killed, "the cgroup's process was not killed");
        assert_eq!(left, (false, false, false), "(cgroup, mount point, state file) left");
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
        // A mount point the lab made, and lines for things this machine
        // lacks: undoing them is harmless.
        std::fs::create_dir_all(dir.join("mp")).unwrap();
        let others = format!("rmdir {}\nqdisc bwlab-no-such-dev\noffload bwlab-no-such-dev tx on\nmodule bwlab_no_such_module\n", dir.join("mp").display());
        std::fs::write(&state, format!("pid {pid} {start}\npid 1 999\nfile {}\ndir {} \n{others}{shared}", file.display(), dir.join("sub").display())).unwrap();
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
        assert!(!file.exists() && !dir.join("sub").exists() && !dir.join("mp").exists() && !state.exists());
        assert!(dir.join("shared").exists(), "a directory another run uses was removed");
        // The other run's end removes it, and the directory once empty.
        let st = Command::new("sh").args(["-c", CLEANUP_SCRIPT, "sh"]).arg(&other).status().unwrap();
        assert!(st.success());
        assert!(!dir.exists());
    }

    /// What a killed local run leaves (a namespace with a process inside,
    /// a link, a loop device on its file, the file): found, reported and
    /// undone; a loop device on another file stays.
    #[test]
    fn a_stale_state_file_of_this_machine_is_reported_and_undone() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root (namespaces, loop devices)");
            return;
        }
        let id = std::process::id();
        let dir = std::env::temp_dir().join(format!("bwlab-state-unit-{id}"));
        std::fs::create_dir_all(&dir).unwrap();
        let (ns, link) = (format!("bwsu{id}n"), format!("bwsu{id}l"));
        let sh = |a: &[&str]| crate::command::sh(a[0], &a[1..]).unwrap();
        sh(&["ip", "netns", "add", &ns]);
        sh(&["ip", "link", "add", &link, "type", "veth", "peer", "name", &format!("{link}p")]);
        let mut inside = Command::new("ip").args(["netns", "exec", &ns, "sleep", "60"]).spawn().unwrap();
        let (img, other) = (dir.join("img"), dir.join("other"));
        for f in [&img, &other] {
            std::fs::File::create(f).unwrap().set_len(1 << 20).unwrap();
        }
        let dev = sh(&["losetup", "--find", "--show", &img.to_string_lossy()]).trim().to_string();
        let keep = sh(&["losetup", "--find", "--show", &other.to_string_lossy()]).trim().to_string();
        let state = dir.join("state-local-x");
        let text = format!(
            "run 1 1 not-this-boot lab\nnetns {ns}\nlink {link}\nfile {}\nloop - {}\nfile {}/never-made\n",
            img.display(),
            img.display(),
            dir.display()
        );
        std::fs::write(&state, text).unwrap();
        let out = Command::new("sh").args(["-c", CLEANUP_SCRIPT, "sh"]).arg(&state).arg("stale").output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let swept = Swept::from_output(&state.to_string_lossy(), "x", &stdout);
        let gone_inside = inside.wait().unwrap().code().is_none();
        let left = (std::path::Path::new(&format!("/run/netns/{ns}")).exists(), crate::command::sh("ip", &["link", "show", &link]).is_ok(), img.exists());
        let loops = (crate::cleanup::loop_backing(&dev), crate::cleanup::loop_backing(&keep));
        let _ = crate::command::sh("losetup", &["-d", &keep]);
        let _ = crate::command::sh("losetup", &["-d", &dev]);
        let _ = crate::command::sh("ip", &["netns", "del", &ns]);
        let _ = crate::command::sh("ip", &["link", "del", &link]);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(out.status.success(), "{stdout}");
        assert_eq!(
            swept.left,
            vec![format!("namespace {ns}"), format!("link {link}"), format!("file {}", img.display()), format!("loop device on {}", img.display())],
            "{stdout}"
        );
        assert!(swept.still.is_empty(), "{stdout}");
        assert!(gone_inside, "the process inside the namespace was not killed");
        assert_eq!(left, (false, false, false), "(namespace, link, file) left");
        assert_eq!(loops.0, None, "the loop device on the run's file stays attached");
        assert_eq!(loops.1, Some(other.clone()), "a loop device on another file was detached");
        assert!(swept.message("this machine").contains(&format!("namespace {ns}")));
    }

    #[test]
    fn owners_of_this_machine_are_told_by_pid_start_time_and_boot() {
        let me = RunOwner::current();
        assert_eq!(RunOwner::of_state(&format!("host net:[1]\n{}\nfile /x\n", me.line())), Some(me.clone()));
        // The test binary is no lab run, whatever its PID and start time.
        assert!(me.of_this_boot() && !me.is_live());
        // A process whose argv is `blockwire lab`: `cat` waiting to open a
        // FIFO named `lab`. Live while it runs...
        let dir = std::env::temp_dir().join(format!("bwlab-owner-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        crate::command::sh("mkfifo", &[&dir.join("lab").to_string_lossy()]).unwrap();
        let mut child = Command::new("bash").args(["-c", "exec -a blockwire cat lab"]).current_dir(&dir).spawn().unwrap();
        let pid = child.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !is_lab_run(pid) {
            assert!(std::time::Instant::now() < deadline, "exec -a did not take");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let owner = RunOwner { pid, start: start_ticks(pid).unwrap(), boot_id: boot_id(), host: "-".into() };
        assert!(owner.is_live());
        // ...not with another start time (a reused PID), nor on another boot.
        assert!(!RunOwner { start: owner.start + 1, ..owner.clone() }.is_live());
        assert!(!RunOwner { boot_id: "another-boot".into(), ..owner.clone() }.is_live());
        assert!(owner.describe().contains("still running"));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!owner.is_live(), "a dead process counts as live");
        assert!(owner.describe().ends_with("gone"), "{}", owner.describe());
        assert_eq!(RunOwner::of_state("host x\nfile /y\n"), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
