//! A memory cgroup that limits the client's page cache (`--client-mem`):
//! cgroup v2 `memory.max` where the memory controller is on the unified
//! hierarchy, v1 `memory.limit_in_bytes` where it is on a v1 mount (this
//! machine). Only the workload's processes join it; the attach daemon stays
//! outside. An OOM kill inside is read back so the case is reported as failed.

use std::path::{Path, PathBuf};

/// Where cgroup file systems are mounted.
pub const ROOT: &str = "/sys/fs/cgroup";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error(
        "no memory cgroup controller under {0} (neither a v1 memory mount nor v2 with +memory)"
    )]
    NoController(PathBuf),
    #[error("{path}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CgroupError + '_ {
    move |source| CgroupError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Where the memory controller lives under `root` (normally /sys/fs/cgroup).
pub fn detect(root: &Path) -> Result<(Version, PathBuf), CgroupError> {
    let v1 = root.join("memory");
    if v1.join("memory.limit_in_bytes").exists() {
        return Ok((Version::V1, v1));
    }
    let controllers = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
    if controllers.split_whitespace().any(|c| c == "memory") {
        return Ok((Version::V2, root.to_path_buf()));
    }
    Err(CgroupError::NoController(root.to_path_buf()))
}

#[derive(Debug)]
pub struct MemCgroup {
    pub version: Version,
    pub dir: PathBuf,
    pub limit: u64,
}

impl MemCgroup {
    /// Create `NAME` under the memory controller of `root` with `limit` bytes.
    pub fn create(root: &Path, name: &str, limit: u64) -> Result<MemCgroup, CgroupError> {
        let (version, base) = detect(root)?;
        let dir = base.join(name);
        std::fs::create_dir(&dir).map_err(io(&dir))?;
        let g = MemCgroup {
            version,
            dir,
            limit,
        };
        let file = match version {
            Version::V1 => "memory.limit_in_bytes",
            Version::V2 => "memory.max",
        };
        let p = g.dir.join(file);
        if let Err(e) = std::fs::write(&p, limit.to_string()).map_err(io(&p)) {
            let _ = std::fs::remove_dir(&g.dir);
            return Err(e);
        }
        Ok(g)
    }

    /// Move a process (and so its later children) into the group.
    pub fn add(&self, pid: u32) -> Result<(), CgroupError> {
        let p = self.procs_file();
        std::fs::write(&p, pid.to_string()).map_err(io(&p))
    }

    /// The file a process writes to join (see `Registry::spawn_in`).
    pub fn procs_file(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// Peak memory use so far (v1 `memory.max_usage_in_bytes`, v2
    /// `memory.peak` where the kernel has it), page cache included.
    pub fn peak_bytes(&self) -> Option<u64> {
        let file = match self.version {
            Version::V1 => "memory.max_usage_in_bytes",
            Version::V2 => "memory.peak",
        };
        std::fs::read_to_string(self.dir.join(file))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// OOM kills inside the group so far (v2 memory.events `oom_kill`, v1
    /// memory.oom_control `oom_kill`, present since Linux 4.13).
    pub fn oom_kills(&self) -> u64 {
        let file = match self.version {
            Version::V1 => "memory.oom_control",
            Version::V2 => "memory.events",
        };
        parse_oom_kill(&std::fs::read_to_string(self.dir.join(file)).unwrap_or_default())
    }

    /// Remove the group (its processes must have ended). The kernel's
    /// control files go with the directory: only rmdir works on a real cgroup.
    pub fn remove(self) -> Result<(), CgroupError> {
        match std::fs::remove_dir(&self.dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            r => r.map_err(io(&self.dir)),
        }
    }
}

/// `MemCgroup::create`, tracked by the cleanup registry (its processes are
/// killed and the group removed on Ctrl-C).
pub fn create_tracked(
    root: &Path,
    name: &str,
    limit: u64,
) -> anyhow::Result<(crate::cleanup::Token, MemCgroup)> {
    let (version, base) = detect(root)?;
    let dir = base.join(name);
    let (t, g) = crate::cleanup::registry()
        .create(crate::cleanup::Resource::Cgroup(dir), || {
            Ok(MemCgroup::create(root, name, limit)?)
        })?;
    debug_assert_eq!(g.version, version);
    Ok((t, g))
}

pub fn parse_oom_kill(text: &str) -> u64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix("oom_kill ")
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_root(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("bw-cg-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn v1_and_v2_layouts_are_told_apart() {
        let v1 = fake_root("v1");
        std::fs::create_dir(v1.join("memory")).unwrap();
        std::fs::write(
            v1.join("memory/memory.limit_in_bytes"),
            "9223372036854771712",
        )
        .unwrap();
        assert_eq!(detect(&v1).unwrap(), (Version::V1, v1.join("memory")));
        let v2 = fake_root("v2");
        std::fs::write(v2.join("cgroup.controllers"), "cpuset cpu io memory pids").unwrap();
        assert_eq!(detect(&v2).unwrap(), (Version::V2, v2.clone()));
        let none = fake_root("none");
        std::fs::write(none.join("cgroup.controllers"), "cpu io").unwrap();
        assert!(matches!(detect(&none), Err(CgroupError::NoController(_))));
        for d in [v1, v2, none] {
            std::fs::remove_dir_all(d).unwrap();
        }
    }

    /// The v2 layout on a stand-in directory (this machine's memory
    /// controller is on v1, and a controller cannot be on both): the limit
    /// goes to memory.max, a process joins through cgroup.procs, OOM kills
    /// are read from memory.events.
    #[test]
    fn v2_setup_writes_memory_max_and_reads_events() {
        let root = fake_root("v2-setup");
        std::fs::write(root.join("cgroup.controllers"), "cpu io memory pids").unwrap();
        let g = MemCgroup::create(&root, "case", 256 << 20).unwrap();
        assert_eq!(g.version, Version::V2);
        assert_eq!(
            std::fs::read_to_string(root.join("case/memory.max")).unwrap(),
            (256u64 << 20).to_string()
        );
        assert_eq!(g.procs_file(), root.join("case/cgroup.procs"));
        g.add(4242).unwrap();
        assert_eq!(std::fs::read_to_string(g.procs_file()).unwrap(), "4242");
        std::fs::write(
            root.join("case/memory.events"),
            "low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\n",
        )
        .unwrap();
        assert_eq!(g.oom_kills(), 1);
        // On cgroupfs the kernel's files go with rmdir; here we remove them.
        for f in ["memory.max", "cgroup.procs", "memory.events"] {
            std::fs::remove_file(root.join("case").join(f)).unwrap();
        }
        g.remove().unwrap();
        assert!(!root.join("case").exists());
        // A second group of the same name is refused while the first exists.
        let _g = MemCgroup::create(&root, "again", 1 << 20).unwrap();
        assert!(MemCgroup::create(&root, "again", 1 << 20).is_err());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn oom_kill_counts() {
        assert_eq!(
            parse_oom_kill("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"),
            3
        );
        assert_eq!(
            parse_oom_kill("low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\noom_group_kill 0\n"),
            2
        );
        assert_eq!(parse_oom_kill(""), 0);
    }

    /// The real controller (root only): a group with the limit, this test's
    /// own child inside it, and the group gone afterwards.
    #[test]
    fn real_memory_cgroup_setup_and_teardown() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 || detect(Path::new("/sys/fs/cgroup")).is_err() {
            eprintln!("skipped: needs root and a memory cgroup controller");
            return;
        }
        let name = format!("bwlab-test-{}", std::process::id());
        let g = MemCgroup::create(Path::new("/sys/fs/cgroup"), &name, 64 << 20).unwrap();
        let file = if g.version == Version::V1 {
            "memory.limit_in_bytes"
        } else {
            "memory.max"
        };
        assert_eq!(
            std::fs::read_to_string(g.dir.join(file)).unwrap().trim(),
            (64u64 << 20).to_string()
        );
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        g.add(child.id()).unwrap();
        let procs = std::fs::read_to_string(g.dir.join("cgroup.procs")).unwrap();
        assert!(
            procs.lines().any(|l| l.trim() == child.id().to_string()),
            "{procs}"
        );
        assert_eq!(g.oom_kills(), 0);
        // A group with a live process cannot go.
        let dir = g.dir.clone();
        assert!(std::fs::remove_dir(&dir).is_err());
        child.kill().unwrap();
        child.wait().unwrap();
        g.remove().unwrap();
        assert!(!dir.exists());
    }

    /// A child spawned into a group is in it from its first instruction, a
    /// child that outgrows the limit is OOM-killed and counted, and the
    /// registry removes the group (root and a memory controller only).
    #[test]
    fn a_child_over_the_limit_is_oom_killed_and_counted() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 || detect(Path::new("/sys/fs/cgroup")).is_err() {
            eprintln!("skipped: needs root and a memory cgroup controller");
            return;
        }
        let reg = crate::cleanup::registry();
        let name = format!("bwlab-test-oom-{}", std::process::id());
        let (token, g) = create_tracked(Path::new("/sys/fs/cgroup"), &name, 32 << 20).unwrap();
        // 64 MiB of anonymous memory (no swap here) in a 32 MiB group.
        let mut cmd = std::process::Command::new("sh");
        cmd.args([
            "-c",
            "cat /proc/self/cgroup; dd if=/dev/zero of=/dev/null bs=64M count=1 2>/dev/null",
        ])
        .stdout(std::process::Stdio::piped());
        let (t, child) = reg
            .spawn_in(
                &mut cmd,
                "hog",
                crate::cleanup::Role::Workload,
                Some(&g.procs_file()),
            )
            .unwrap();
        let out = child.wait_with_output().unwrap();
        reg.forget(t);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(&name),
            "the child was not in the group from the start: {text}"
        );
        assert!(!out.status.success(), "64 MiB fit in a 32 MiB group?");
        assert!(g.oom_kills() >= 1, "no OOM kill counted");
        let dir = g.dir.clone();
        reg.release(token).unwrap();
        assert!(!dir.exists(), "cgroup left behind");
    }
}
