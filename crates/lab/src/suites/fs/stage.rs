//! The fs suite as a stage: after micro and sweep, on the same targets,
//! every subject (the networked ones that are still up, then the local
//! baseline) gets a file system mounted in its turn, runs every
//! (workload, memory limit) case in a memory cgroup of its own, and is
//! unmounted; the order rotates between repetitions.

use crate::stage::link::MAX_CONSECUTIVE_FAILURES;
use crate::stage::context::RunContext;
use crate::stage::hooks::Stage;
use crate::stage::link::LinkRun;
use crate::cleanup::interrupted;
use crate::suites::fs::client::{FsClient, Mountpoint};
use crate::subjects::process::TargetProcess;
use crate::network::topology::{Link, Topology};
use bw_lab_results::net::WireCounters;
use bw_lab_results::{unix_now, Failure, SubjectKey};
use std::path::Path;
use std::time::Duration;

/// The fs suite's state over the run.
#[derive(Default)]
pub struct FsStage {
    /// Where the fs suite mounts each subject in turn.
    mountpoint: Option<Mountpoint>,
    /// Numbers the fs suite's cgroups.
    serial: u64,
    /// Where the workloads run: here, or on an ssh client host.
    client: Option<FsClient>,
    /// The file system and fsync setting being measured.
    fs_kind: crate::suites::fs::fs_kind::FsKind,
    fsync: crate::suites::fs::fs_kind::Fsync,
    fs_factors: bw_lab_results::fs::FsFactors,
    /// The file system the file servers' exports are on now.
    nfs_server_fs: crate::suites::fs::fs_kind::FsKind,
}

impl Stage for FsStage {
    /// The mount point (on an ssh client host: there, with its memory
    /// controller looked up).
    fn setup(&mut self, _cx: &mut RunContext, topo: &Topology) -> anyhow::Result<()> {
        let client = FsClient::of(&topo.client)?;
        self.mountpoint = Some(client.mountpoint()?);
        self.client = Some(client);
        Ok(())
    }

    fn needs_targets(&self) -> bool {
        true
    }

    fn cases_on_link(&self, cx: &RunContext, at: &crate::resume::case::At, link: &Link, first: bool) -> Vec<String> {
        if !first || cx.plan().fs.is_none() {
            return vec![];
        }
        cx.plan().fs_combinations.iter().map(|&(kind, fsync)| fs_case(kind, fsync, &at.shape, link.mtu)).collect()
    }

    fn on_link(&mut self, cx: &mut RunContext, run: &mut LinkRun) -> anyhow::Result<()> {
        self.nfs_server_fs = Default::default();
        if run.first {
            self.run_fs(cx, run)?;
        }
        Ok(())
    }

    fn teardown(&mut self) -> anyhow::Result<()> {
        if let Some(m) = self.mountpoint.take() {
            m.release()?;
        }
        Ok(())
    }
}

/// The case of the fs suite at one (file system, fsync) setting: every
/// subject and the local baseline, every repetition (see `crate::resume::case`).
fn fs_case(kind: crate::suites::fs::fs_kind::FsKind, fsync: crate::suites::fs::fs_kind::Fsync, shape: &bw_lab_results::LinkName, mtu: u32) -> String {
    crate::resume::case::fs(kind.name(), fsync.name(), shape, mtu)
}

/// A subject of the fs suite: its key, how its file system is reached,
/// and the index of its target process (none for the local baseline).
#[derive(Clone)]
struct FsSubject {
    key: SubjectKey,
    reach: Reach,
    proc: Option<usize>,
}

/// Where an fs subject's file system is.
#[derive(Clone)]
enum Reach {
    /// The local baseline: a loop device over the backing file.
    Local,
    /// `blockwire mount` of the URL (over NFS: a file system in the
    /// image file, as a VM guest has one).
    Blockwire { url: String, image_on_nfs: bool },
    /// A kernel block initiator's device, with a file system made on it.
    KernelDevice(String),
    /// The client host's kernel NFS client mounting the export at
    /// `address`: the server's file system.
    KernelNfs(crate::subjects::kernel_nfs::NfsVersion, crate::subjects::Address),
}

/// One fs case: a workload at one memory limit on one subject's file
/// system (or the local raw device) in one repetition.
#[derive(Clone, Copy)]
struct FsCaseRun<'a> {
    topo: &'a Topology,
    link: &'a Link,
    /// The subject (`crate::suites::fs::workloads::LOCAL` for the local baseline).
    key: &'a SubjectKey,
    /// The target serving the subject, for its CPU (none locally).
    target: Option<&'a TargetProcess>,
    /// The attach daemon of the mount, for the initiator's CPU.
    daemon: Option<u32>,
    rep: u32,
    workload: crate::suites::fs::workloads::FsWorkload,
    mem: u64,
    /// The mount point; the workload runs in its `w` directory.
    mp: &'a Path,
    /// The raw device the raw workload runs on (local baseline only).
    raw_dev: Option<&'a str>,
    /// A kernel initiator's file system: its CPU is the client machine's.
    kernel: bool,
}


/// The result of workload `w` from what it printed.
fn parse_fs_result(w: crate::suites::fs::workloads::FsWorkload, fsp: &crate::suites::fs::workloads::FsParams, stdout: &str) -> anyhow::Result<crate::suites::fs::workloads::FsResult> {
    use crate::suites::fs::workloads::{FsResult, FsWorkload};
    Ok(match w {
        FsWorkload::Flowop(_) => {
            let r: bw_workload_report::FlowReport = crate::suites::runner::parse_json_report(stdout)
                .map_err(|e| anyhow::anyhow!("flowop {e}"))?;
            anyhow::ensure!(
                r.ops > 0,
                "flowop did no operation (errors: {:?})",
                r.errors
            );
            FsResult::Flowop(r)
        }
        FsWorkload::Postmark => {
            let mut r = crate::suites::fs::workloads::parse_postmark(stdout)?;
            r.transactions = fsp.postmark_transactions as u64;
            FsResult::Postmark(r)
        }
        FsWorkload::Bonnie => FsResult::Bonnie(crate::suites::fs::workloads::parse_bonnie(stdout)?),
        FsWorkload::Iogen { .. } | FsWorkload::IogenRaw => {
            FsResult::Iogen(crate::suites::fs::workloads::parse_iogen(stdout)?)
        }
    })
}

/// What an fs case reads before and after its workload: the client's wire
/// counters (networked subjects), the target's and the client daemon's
/// CPU time, and for a kernel initiator the client machine's CPU.
struct Readings {
    wire: Option<WireCounters>,
    target_cpu: Option<f64>,
    daemon_cpu: Option<f64>,
    machine_cpu: Option<(f64, f64)>,
}

impl Readings {
    fn before(topo: &Topology, link: &Link, local: bool, target: Option<&TargetProcess>, daemon: Option<u32>, kernel: bool) -> anyhow::Result<Readings> {
        let wire = if local { None } else { Some(topo.client_counters(link)?) };
        let target_cpu = target.map(|t| t.cpu_seconds()).transpose()?;
        let daemon_cpu = daemon.and_then(|p| topo.client.process_cpu_seconds(p).ok());
        // A kernel initiator's work is the client machine's (see clients.rs).
        let machine_cpu = if kernel { Some(crate::subjects::clients::machine_cpu_seconds(&topo.client)?) } else { None };
        Ok(Readings { wire, target_cpu, daemon_cpu, machine_cpu })
    }

    /// The same, read in the reverse order (the machine's CPU first).
    fn after(topo: &Topology, link: &Link, local: bool, target: Option<&TargetProcess>, daemon: Option<u32>, kernel: bool) -> anyhow::Result<Readings> {
        let machine_cpu = if kernel { Some(crate::subjects::clients::machine_cpu_seconds(&topo.client)?) } else { None };
        let target_cpu = target.map(|t| t.cpu_seconds()).transpose()?;
        let daemon_cpu = daemon.and_then(|p| topo.client.process_cpu_seconds(p).ok());
        let wire = if local { None } else { Some(topo.client_counters(link)?) };
        Ok(Readings { wire, target_cpu, daemon_cpu, machine_cpu })
    }

    fn delta(a: Option<f64>, b: Option<f64>) -> Option<f64> {
        Some(b? - a?)
    }

    /// A kernel initiator's: the client machine's CPU beside the
    /// workload's own (what the kernel did for it: initiator, block layer,
    /// the file system's writeback); else the client daemon's.
    fn attach_cpu_s(&self, after: &Readings, workload_cpu_s: f64) -> Option<f64> {
        match (self.machine_cpu, after.machine_cpu) {
            (Some(a), Some(b)) => Some(((b.0 + b.1) - (a.0 + a.1) - workload_cpu_s).max(0.0)),
            _ => Readings::delta(self.daemon_cpu, after.daemon_cpu),
        }
    }
}

impl FsStage {
    /// The fs suite's client (made in `setup`).
    fn client(&self) -> anyhow::Result<&FsClient> {
        self.client.as_ref().ok_or_else(|| anyhow::anyhow!("the fs suite's client is not set up"))
    }

    /// File server `server` (process `pi` of `run`) restarted with its
    /// export on `kind`: over NFS, `--fs` is the server's file system (the
    /// one under the data), not one on the client. The kernel NFS mounts
    /// of the micro and sweep runs on it go first: they would be stale.
    fn serve_files_on(
        &mut self,
        cx: &mut RunContext,
        run: &mut LinkRun,
        kind: crate::suites::fs::fs_kind::FsKind,
        pi: usize,
        server: &dyn crate::subjects::FileServer,
    ) -> Result<(), String> {
        let (topo, link) = (run.topo, run.link);
        for s in run.live.iter_mut().filter(|s| s.proc == Some(pi)) {
            if let Some(k) = s.kernel.take() {
                k.release().map_err(|e| format!("unmounting {}: {e:#}", s.key))?;
            }
        }
        let p = &mut run.procs[pi];
        cx.progress().set_message(format!("MTU {}: {}'s export on {}", link.mtu, p.name, kind.name()));
        // One server per address and port: the old one goes first.
        p.halt();
        let new = server.start_on(topo, link, cx.backing(), kind)?;
        std::mem::replace(p, new).stop();
        Ok(())
    }

    /// The fs suite on one link: every subject (the networked ones that are
    /// still up, then the local baseline) gets ext4 mounted in its turn,
    /// runs every (workload, memory limit) case, and is unmounted; the
    /// order rotates between repetitions. Subjects share the backing file,
    /// so only one is mounted at a time, and each turn starts on a fresh
    /// file system with an empty client cache. A peer serving files serves
    /// from an export on each `--fs` file system in turn.
    fn run_fs(&mut self, cx: &mut RunContext, run: &mut LinkRun) -> anyhow::Result<()> {
        use crate::subjects::clients::ClientKind;
        let Some(fsp) = cx.plan().fs.clone() else {
            return Ok(());
        };
        let Some(mp) = self.mountpoint.as_ref().map(|m| m.dir.clone()) else {
            return Ok(());
        };
        // The fs suite makes a file system on its subject: never on the
        // user's own storage.
        let runs = cx.plan().fs_cases(false).len() as u64 * fsp.repeat as u64 * cx.plan().fs_combinations.len() as u64;
        for s in run.live.iter().filter(|s| s.subject.external().is_some() && !s.gave_up) {
            cx.progress().inc(runs);
            cx.note_skipped(&s.key, "the fs suite does not run on external subjects (it makes a file system on its subject)");
        }
        let mut subjects: Vec<FsSubject> = run
            .live
            .iter()
            .filter(|s| !s.gave_up && s.subject.external().is_none())
            .map(|s| FsSubject {
                key: s.key.clone(),
                reach: match s.client {
                    ClientKind::Blockwire => Reach::Blockwire { url: s.url.clone(), image_on_nfs: s.subject.address().serves_files() },
                    ClientKind::Kernel(_) => Reach::KernelDevice(s.url.clone()),
                    ClientKind::KernelNfs(v) => Reach::KernelNfs(v, s.subject.address()),
                },
                proc: s.proc,
            })
            .collect();
        if cx.plan().baseline {
            subjects.push(FsSubject { key: crate::suites::fs::workloads::LOCAL, reach: Reach::Local, proc: None });
        }
        // The file servers' processes (once each), by blockwire's subject of them.
        let servers: Vec<(usize, &'static dyn crate::subjects::FileServer)> = run
            .live
            .iter()
            .filter(|s| s.client == ClientKind::Blockwire)
            .filter_map(|s| s.subject.file_server().zip(s.proc).map(|(f, p)| (p, f)))
            .collect();
        for (kind, fsync) in cx.plan().fs_combinations.clone() {
            if !cx.begin_case(&fs_case(kind, fsync, cx.link_shape(), run.link.mtu)) {
                // Finished by an earlier start of this run: kept.
                let runs: usize = subjects.iter().map(|s| cx.plan().fs_cases(s.proc.is_none()).len()).sum();
                cx.progress().inc((runs * fsp.repeat as usize) as u64);
                continue;
            }
            let first = cx.results().fs.len();
            (self.fs_kind, self.fsync) = (kind, fsync);
            self.fs_factors = bw_lab_results::fs::FsFactors { fs: kind.factor().into(), fsync: fsync.factor().into() };
            if cx.plan().fs_combinations.len() > 1 {
                cx.say(&format!("lab: fs suite on {}, fsync {}", kind.name(), fsync.name()));
            }
            if self.nfs_server_fs != kind && !servers.is_empty() {
                for &(pi, server) in &servers {
                    if let Err(why) = self.serve_files_on(cx, run, kind, pi, server) {
                        for s in subjects.iter().filter(|s| s.proc == Some(pi)) {
                            self.fs_failure(cx, &s.key, Some(run.link.mtu), "(server file system)", 0, why.clone());
                        }
                    }
                }
                self.nfs_server_fs = kind;
            }
            self.run_fs_setting(cx, run, &subjects, &fsp, &mp)?;
            self.print_fs_rows(cx, first);
            cx.end_case();
            cx.save()?;
        }
        Ok(())
    }

    /// The fs suite at one (file system, fsync) setting.
    fn run_fs_setting(&mut self, cx: &mut RunContext, run: &mut LinkRun, subjects: &[FsSubject], fsp: &crate::suites::fs::workloads::FsParams, mp: &Path) -> anyhow::Result<()> {
        let link = run.link;
        let n = subjects.len();
        let mut failed_turns = vec![0u32; n];
        for rep in 1..=fsp.repeat {
            for turn in 0..n {
                let i = (turn + rep as usize - 1) % n;
                if interrupted() {
                    anyhow::bail!("interrupted");
                }
                let FsSubject { key, proc, .. } = &subjects[i];
                let (key, proc) = (key.clone(), *proc);
                let local = proc.is_none();
                let cases = cx.plan().fs_cases(local);
                if failed_turns[i] >= MAX_CONSECUTIVE_FAILURES {
                    cx.progress().inc(cases.len() as u64);
                    continue;
                }
                if let Some(pi) = proc {
                    let p = &mut run.procs[pi];
                    if !p.alive() {
                        let why = format!("{} died: {}", p.name, p.log_tail());
                        self.fs_failure(cx, &key, Some(link.mtu), "(mount)", 0, why);
                        failed_turns[i] = MAX_CONSECUTIVE_FAILURES;
                        cx.progress().inc(cases.len() as u64);
                        continue;
                    }
                }
                let target = proc.map(|pi| &run.procs[pi]);
                match self.fs_turn(cx, run, &subjects[i], target, rep, &cases, mp) {
                    Ok(()) => failed_turns[i] = 0,
                    Err(e) => {
                        if interrupted() {
                            anyhow::bail!("interrupted");
                        }
                        failed_turns[i] += 1;
                        self.fs_failure(cx, 
                            &key,
                            if local { None } else { Some(link.mtu) },
                            "(mount)",
                            0,
                            format!("{e:#}"),
                        );
                    }
                }
                cx.save()?;
            }
        }
        Ok(())
    }

    fn fs_failure(
        &mut self,
        cx: &mut RunContext,
        subject: &SubjectKey,
        mtu: Option<u32>,
        workload: &str,
        mem: u64,
        reason: String,
    ) {
        let at = if mem > 0 {
            format!(" at --client-mem {}M", mem >> 20)
        } else {
            String::new()
        };
        cx.say(&format!("lab: fs {subject} {workload}{at}: {reason}"));
        cx.push_failure(Failure {
            subject: subject.clone().into(),
            mtu,
            workload: format!("fs {workload}{at}"),
            reason,
        });
    }

    /// One subject's turn: mount, every case, unmount. Cases that fail are
    /// recorded and the turn goes on; a mount that fails ends the turn.
    #[allow(clippy::too_many_arguments)]
    fn fs_turn(
        &mut self,
        cx: &mut RunContext,
        run: &LinkRun,
        subject: &FsSubject,
        target: Option<&TargetProcess>,
        rep: u32,
        cases: &[(crate::suites::fs::workloads::FsWorkload, u64)],
        mp: &Path,
    ) -> anyhow::Result<()> {
        let (topo, link, key) = (run.topo, run.link, &subject.key);
        let kernel = matches!(subject.reach, Reach::KernelDevice(_));
        use crate::suites::fs::workloads::FsWorkload;
        cx.progress()
            .set_message(format!("fs {key} #{rep}: mounting"));
        let mut left = cases.len() as u64;
        let r = (|| -> anyhow::Result<()> {
            let base = FsCaseRun {
                topo,
                link,
                key,
                target: None,
                daemon: None,
                rep,
                workload: FsWorkload::IogenRaw,
                mem: 0,
                mp,
                raw_dev: None,
                kernel,
            };
            let size = cx.plan().params.size_bytes;
            let client = &topo.client;
            let mounted = match &subject.reach {
                Reach::KernelNfs(v, address) => crate::subjects::kernel_nfs::mount(client, link.target_ip, *address, *v, mp, "")?,
                Reach::KernelDevice(dev) => crate::suites::fs::remote_fs::mount_device(client, dev, mp, self.fs_kind, size)?,
                Reach::Blockwire { url, image_on_nfs } => {
                    // Over NFS `--fs` is the server's file system; the
                    // image's own (a VM guest's) stays ext4.
                    let kind = if *image_on_nfs { crate::suites::fs::fs_kind::FsKind::Ext4 } else { self.fs_kind };
                    self.client()?.mount_blockwire(cx.exe(), client, url, mp, kind, size)?
                }
                Reach::Local => {
                    // The raw device first: the file system goes on it next.
                    let (loop_token, dev) = crate::suites::fs::mounts::loop_device(cx.backing())?;
                    for &(workload, mem) in cases.iter().filter(|(w, _)| *w == FsWorkload::IogenRaw) {
                        if interrupted() {
                            break;
                        }
                        self.fs_case(cx, &FsCaseRun { workload, mem, raw_dev: Some(&dev), ..base });
                        left -= 1;
                    }
                    crate::suites::fs::mounts::mount_local_as(&dev, loop_token, mp, self.fs_kind, cx.plan().params.size_bytes)?
                }
            };
            let on_fs = FsCaseRun { target, daemon: mounted.daemon_pid, ..base };
            for &(workload, mem) in cases.iter().filter(|(w, _)| *w != FsWorkload::IogenRaw) {
                if interrupted() {
                    break;
                }
                self.fs_case(cx, &FsCaseRun { workload, mem, ..on_fs });
                left -= 1;
            }
            cx.progress()
                .set_message(format!("fs {key} #{rep}: unmounting"));
            mounted.release()
        })();
        cx.progress().inc(left);
        r
    }

    /// One workload at one memory limit, in a cgroup of its own; the sample
    /// or the failure (an OOM kill among them) goes into the results.
    fn fs_case(&mut self, cx: &mut RunContext, c: &FsCaseRun) {
        let (key, w, mem) = (c.key, c.workload, c.mem);
        let local = *key == crate::suites::fs::workloads::LOCAL;
        let mtu = if local { None } else { Some(c.link.mtu) };
        cx.progress()
            .set_message(format!("fs {key} {} {}M #{}", w.name(), mem >> 20, c.rep));
        match self.fs_case_inner(cx, c) {
            Ok(s) => cx.push_fs(s),
            Err(e) => {
                if !interrupted() {
                    self.fs_failure(cx, key, mtu, w.name(), mem, format!("{e:#}"));
                }
            }
        }
        // (Interrupted: the file system is about to go, and writing its
        // deletions back through a busy link is what made Ctrl-C slow.)
        if !interrupted() {
            if let Err(e) = self.client().and_then(|client| client.clean_dir(&c.mp.join("w"))) {
                cx.say(&format!("lab: {e:#}"));
            }
        }
        cx.progress().inc(1);
    }

    fn fs_case_inner(&mut self, cx: &mut RunContext, c: &FsCaseRun) -> anyhow::Result<crate::suites::fs::workloads::FsSample> {
        let &FsCaseRun { topo, link, key, target, daemon, rep, workload: w, mem, mp, raw_dev, kernel } = c;
        let fsp = cx.plan().fs.clone().ok_or_else(|| anyhow::anyhow!("no fs suite"))?;
        let local = *key == crate::suites::fs::workloads::LOCAL;
        let dir = mp.join("w");
        self.serial += 1;
        let name = format!("bwlab-{}-{}", std::process::id(), self.serial);
        // Over ssh the workload, its files and its cgroup are the client host's.
        let client = self.client()?;
        client.prepare(w, &fsp, &dir)?;
        let cg = client.cgroup(&name, mem)?;
        let (busy, _) = cx.wait_idle();
        let started_unix = unix_now();
        let before = Readings::before(topo, link, local, target, daemon, kernel)?;
        let (prog, args) = crate::suites::fs::workloads::command(w, &fsp, &topo.client.lab_exe(cx.exe()), &dir, raw_dev);
        // Room for making the file sets and Bonnie++'s passes over a slow link.
        let timeout = Duration::from_secs(fsp.runtime_s as u64 + 600);
        let run = cg.run(&dir, self.fsync.wrapper(), &prog, &args, w.name(), timeout);
        let after = Readings::after(topo, link, local, target, daemon, kernel)?;
        let (ooms, peak) = cg.finish()?;
        let f = run?;
        if ooms > 0 {
            anyhow::bail!(
                "OOM: the kernel killed the workload in its {} MiB memory cgroup ({ooms} kill(s))",
                mem >> 20
            );
        }
        if !f.ok {
            let how = match f.signal {
                Some(sig) => format!("killed by signal {sig}"),
                None => "failed".to_string(),
            };
            anyhow::bail!(
                "{} {how}: {}",
                prog,
                crate::command::last_lines(&f.stderr, 3)
            );
        }
        let result = parse_fs_result(w, &fsp, &f.stdout)?;
        Ok(crate::suites::fs::workloads::FsSample {
            subject: key.clone(),
            link: cx.link_shape().clone(),
            mtu: if local { None } else { Some(link.mtu) },
            client_mem: mem,
            workload: w.name().into(),
            repeat: rep,
            result,
            elapsed_s: f.elapsed_s,
            workload_cpu_s: f.cpu_s,
            attach_cpu_s: before.attach_cpu_s(&after, f.cpu_s),
            target_cpu_s: Readings::delta(before.target_cpu, after.target_cpu),
            wire: match (before.wire, after.wire) {
                (Some(a), Some(b)) => Some(WireCounters::delta(&a, &b)),
                _ => None,
            },
            peak_mem_bytes: peak,
            busy_before: busy,
            started_unix,
            factors: self.fs_factors.clone(),
        })
    }

    /// The fs results of this link in the terminal (from `first` on).
    fn print_fs_rows(&self, cx: &RunContext, first: usize) {
        for line in bw_lab_report::rows::fs_rows(&cx.results().fs[first..]) {
            cx.say(&line);
        }
    }
}
