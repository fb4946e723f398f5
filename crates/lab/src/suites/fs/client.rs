//! Where the fs suite's client side runs: this machine (the lab's
//! namespaces share its mounts and cgroups: [`super::mounts`]) or a client
//! host over ssh ([`super::remote_fs`]). This is the one place the suite
//! tells the two apart; the stage asks its `FsClient` for each operation
//! (the mount point, `blockwire mount`, a workload's files and memory
//! cgroup, cleaning up after a workload).

use super::fs_kind::FsKind;
use super::mounts::{Mounted, SharedDir};
use super::remote_fs;
use super::workloads::{FsParams, FsWorkload};
use crate::cleanup::{registry, Resource, Token};
use crate::hosts::cgroup::MemCgroup;
use crate::hosts::host::Host;
use crate::hosts::ssh::{quote, SshHost};
use crate::suites::runner::Finished;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

pub enum FsClient {
    /// This machine: the mount point in a shared mount, workloads in a
    /// memory cgroup of this machine's.
    Here,
    /// A client host over ssh, with its memory controller
    /// (`remote_fs::cgroup_base`): everything on that host, each thing in
    /// its state file before it is made.
    Ssh { host: SshHost, cgroup_base: (String, String) },
}

/// The fs suite's mount point, and what removes it.
pub struct Mountpoint {
    pub dir: PathBuf,
    token: Token,
    shared: Option<SharedDir>,
}

impl Mountpoint {
    pub fn release(self) -> anyhow::Result<()> {
        registry().release(self.token)?;
        if let Some(shared) = self.shared {
            shared.release()?;
        }
        Ok(())
    }
}

impl FsClient {
    /// The fs suite's client on `host`: over ssh when it is another
    /// machine (its memory controller looked up now).
    pub fn of(host: &Host) -> anyhow::Result<FsClient> {
        Ok(match host.ssh() {
            Some(h) => FsClient::Ssh { cgroup_base: remote_fs::cgroup_base(h)?, host: h.clone() },
            None => FsClient::Here,
        })
    }

    /// The mount point, made now and removed when released.
    pub fn mountpoint(&self) -> anyhow::Result<Mountpoint> {
        match self {
            FsClient::Ssh { host, .. } => {
                let (token, dir) = remote_fs::mountpoint(host)?;
                Ok(Mountpoint { dir, token, shared: None })
            }
            FsClient::Here => {
                // The mount point lives in a shared mount: see SharedDir.
                let pid = std::process::id();
                let shared = SharedDir::create(&super::mounts::fs_dir(pid))?;
                let dir = super::mounts::fs_mountpoint(pid);
                match registry().create(Resource::Dir(dir.clone()), || Ok(std::fs::create_dir_all(&dir)?)) {
                    Ok((token, ())) => Ok(Mountpoint { dir, token, shared: Some(shared) }),
                    Err(e) => {
                        let _ = shared.release();
                        Err(e)
                    }
                }
            }
        }
    }

    /// `blockwire mount URL MP` with `kind` made on the volume: over ssh
    /// with the lab's binary there, here with `exe` in `host`'s network.
    pub fn mount_blockwire(&self, exe: &Path, host: &Host, url: &str, mp: &Path, kind: FsKind, size: u64) -> anyhow::Result<Mounted> {
        match self {
            FsClient::Ssh { host: h, .. } => remote_fs::mount_blockwire(h, url, mp, kind, size),
            FsClient::Here => super::mounts::mount_remote_as(exe, host, url, mp, kind, size),
        }
    }

    /// What workload `w` needs in `dir` before it is measured: the
    /// directory, PostMark's config, IOgen's file laid out.
    pub fn prepare(&self, w: FsWorkload, fsp: &FsParams, dir: &Path) -> anyhow::Result<()> {
        match self {
            FsClient::Ssh { host, .. } => remote_fs::prepare(host, w, fsp, dir),
            FsClient::Here => {
                std::fs::create_dir_all(dir)?;
                prepare_here(w, fsp, dir)
            }
        }
    }

    /// Remove what a workload left in `dir` and write the rest back, so the
    /// next workload starts from the same file system state.
    pub fn clean_dir(&self, dir: &Path) -> anyhow::Result<()> {
        match self {
            FsClient::Ssh { host, .. } => host.run_line(&format!("rm -rf -- {}; sync", quote(&dir.to_string_lossy()))).map(|_| ()),
            FsClient::Here => super::mounts::clean_dir(dir),
        }
    }

    /// A memory cgroup `name` limited to `mem` bytes for one workload.
    pub fn cgroup(&self, name: &str, mem: u64) -> anyhow::Result<FsCgroup<'_>> {
        Ok(match self {
            FsClient::Ssh { host, cgroup_base } => FsCgroup::Ssh(host, remote_fs::Cgroup::create(host, cgroup_base, name, mem)?),
            FsClient::Here => {
                let (t, g) = crate::hosts::cgroup::create_tracked(Path::new(crate::hosts::cgroup::ROOT), name, mem)?;
                FsCgroup::Here(t, g)
            }
        })
    }
}

/// `prepare` on this machine.
fn prepare_here(w: FsWorkload, fsp: &FsParams, dir: &Path) -> anyhow::Result<()> {
    match w {
        FsWorkload::Postmark => std::fs::write(dir.join("postmark.cfg"), super::workloads::postmark_config(fsp, dir))?,
        FsWorkload::Iogen { .. } => {
            // Lay the file out first (not measured), as IOgen's file existed before its run.
            let mut cmd = Command::new("fio");
            cmd.args(super::workloads::iogen_layout_args(fsp, &dir.join("iogen.dat").to_string_lossy()));
            let f = crate::suites::runner::run_workload(cmd, "fio layout", Duration::from_secs(600), None)?;
            anyhow::ensure!(f.ok, "laying out the IOgen file failed: {}", crate::command::last_lines(&f.stderr, 3));
        }
        _ => {}
    }
    Ok(())
}

/// One fs case's memory cgroup, here or on the ssh client host.
pub enum FsCgroup<'a> {
    Here(Token, MemCgroup),
    Ssh(&'a SshHost, remote_fs::Cgroup),
}

impl FsCgroup<'_> {
    /// `prog args` in `dir`, in this cgroup (through the fsync `wrapper`).
    #[allow(clippy::too_many_arguments)]
    pub fn run(&self, dir: &Path, wrapper: Option<&str>, prog: &str, args: &[String], name: &str, timeout: Duration) -> anyhow::Result<Finished> {
        match self {
            FsCgroup::Ssh(h, g) => remote_fs::run_in_cgroup(h, g, dir, wrapper, prog, args, name, timeout),
            FsCgroup::Here(_, g) => {
                // eatmydata execs the workload: the PID (cgroup, rusage) stays its.
                let mut cmd = match wrapper {
                    Some(wrapper) => {
                        let mut c = Command::new(wrapper);
                        c.arg(prog);
                        c
                    }
                    None => Command::new(prog),
                };
                cmd.args(args).current_dir(dir);
                crate::suites::runner::run_workload(cmd, name, timeout, Some(&g.procs_file()))
            }
        }
    }

    /// The OOM kills and the peak memory; the cgroup is removed.
    pub fn finish(self) -> anyhow::Result<(u64, Option<u64>)> {
        Ok(match self {
            FsCgroup::Ssh(h, g) => g.finish(h)?,
            FsCgroup::Here(t, g) => {
                let v = (g.oom_kills(), g.peak_bytes());
                registry().release(t)?;
                v
            }
        })
    }
}
