//! The run itself: set up the topology and the backing file, then for each
//! link shape measure the network, and for each MTU start every target and
//! run every workload `repeat` times, each repeat over all subjects in a
//! rotated order, recording raw samples as it goes. The fs suite runs at
//! the first MTU of each link shape, with the same rotation, the local
//! baseline taking its turn among the subjects.

use bw_lab_results::accounting::Case;
use bw_lab_results::net::WireCounters;
use crate::cleanup::{interrupted, registry, Resource};
use crate::plan::Plan;
use bw_lab_results::{SubjectKey, Suite, 
    unix_now, utc_now, Failure, Results, Sample, Subject as SubjectRecord, Workload,
    FORMAT,
};
use crate::subjects::{blockwire, Subject};
use crate::targets::TargetProcess;
use crate::topology::{Link, Remote, Topology};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Consecutive failed runs after which a subject is given up (at this MTU).
const MAX_CONSECUTIVE_FAILURES: u32 = 2;

/// A subject being measured on one link, and how its runs are going.
struct LiveSubject {
    key: SubjectKey,
    url: String,
    /// A kernel initiator's block device (fio runs on it instead of the
    /// bench on `url`), and what detaches it.
    kernel: Option<crate::clients::Attached>,
    /// Index of the target process that serves it (None: an external
    /// subject, which the lab does not run).
    proc: Option<usize>,
    /// The target and protocol it measures.
    subject: Subject,
    done: u64,
    consecutive_failures: u32,
    gave_up: bool,
}

impl LiveSubject {
    fn new(subject: Subject, link: &Link, proc: Option<usize>) -> LiveSubject {
        LiveSubject {
            key: subject.key(),
            url: subject.url(link),
            kernel: None,
            proc,
            subject,
            done: 0,
            consecutive_failures: 0,
            gave_up: false,
        }
    }
}

/// A subject of the fs suite: its key, its URL (or a kernel initiator's
/// block device), the index of its target process, whether it is a kernel
/// initiator's (none of them for the local baseline).
type FsSubject = (SubjectKey, Option<String>, Option<usize>, bool);

/// One fs case: a workload at one memory limit on one subject's file
/// system (or the local raw device) in one repetition.
#[derive(Clone, Copy)]
struct FsCaseRun<'a> {
    topo: &'a Topology,
    link: &'a Link,
    /// The subject (`crate::fs::LOCAL` for the local baseline).
    key: &'a SubjectKey,
    /// The target serving the subject, for its CPU (none locally).
    target: Option<&'a TargetProcess>,
    /// The attach daemon of the mount, for the initiator's CPU.
    daemon: Option<u32>,
    rep: u32,
    workload: crate::fs::FsWorkload,
    mem: u64,
    /// The mount point; the workload runs in its `w` directory.
    mp: &'a Path,
    /// The raw device the raw workload runs on (local baseline only).
    raw_dev: Option<&'a str>,
    /// A kernel initiator's file system: its CPU is the client machine's.
    kernel: bool,
}

pub struct LabRun {
    pub plan: Plan,
    pub exe: PathBuf,
    pub out: PathBuf,
    pub results: Results,
    backing: PathBuf,
    progress: ProgressBar,
    idle_spent: f64,
    /// The link shape being measured.
    shape: String,
    /// Where the fs suite mounts each subject in turn.
    fs_dir: Option<PathBuf>,
    /// Numbers the fs suite's cgroups.
    fs_serial: u64,
    /// The memory controller of an ssh client host (`remote_fs::cgroup_base`).
    client_cgroup: Option<(String, String)>,
    /// The hosts of a run across machines (None: namespaces on this one).
    pub remote: Option<Remote>,
    /// The clients the subjects are measured with on the remote client
    /// host (`--clients`, narrowed to what it has).
    pub remote_clients: Vec<crate::clients::ClientKind>,
    /// The offload study's factors being measured.
    factors: bw_lab_results::Factors,
    digest: crate::offload::Digest,
    /// Whole-machine CPU of the target and client hosts' machines.
    meter: crate::machine_cpu::MachineMeter,
    /// The fs suite's file system and fsync setting being measured.
    fs_kind: crate::fs_kind::FsKind,
    fsync: crate::fs_kind::Fsync,
    fs_factors: bw_lab_results::fs::FsFactors,
    /// The client host has a kernel NFS client (asked only when the fs
    /// suite runs with ganesha).
    kernel_nfs_client: bool,
    /// The kernel NFS subjects are measured (`crate::kernel_nfs`).
    kernel_nfs: bool,
    /// The file system ganesha's export is on now.
    nfs_server_fs: crate::fs_kind::FsKind,
}

/// Where blockwire's client reaches an external subject from: the client
/// host between machines; in one box this machine itself (the lab's
/// namespaces reach nothing outside).
fn external_client(topo: &Topology) -> crate::host::Host {
    if topo.remote {
        topo.client.clone()
    } else {
        crate::host::Host::Local
    }
}

/// Whether workload `w` writes (sequential or random writes, or a mix).
fn writes(w: &Workload) -> bool {
    w.rw != "read" && w.rw != "randread"
}

/// Fill the backing file with non-zero data so reads touch real pages
/// (a sparse tmpfs file would answer reads from the shared zero page).
fn make_backing(path: &Path, size: u64) -> anyhow::Result<()> {
    let mut f = std::fs::File::create(path)?;
    let mut block = vec![0u8; 1 << 20];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for chunk in block.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    let mut left = size;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        f.write_all(&block[..n])?;
        left -= n as u64;
    }
    f.sync_all()?;
    Ok(())
}

/// What workload `w` needs in `dir` before it is measured: PostMark's
/// config; IOgen's file, laid out (not measured), as IOgen's file existed
/// before its run.
fn prepare_fs_workload(w: crate::fs::FsWorkload, fsp: &crate::fs::FsParams, dir: &Path) -> anyhow::Result<()> {
    use crate::fs::FsWorkload;
    match w {
        FsWorkload::Postmark => std::fs::write(
            dir.join("postmark.cfg"),
            crate::fs::postmark_config(fsp, dir),
        )?,
        FsWorkload::Iogen { .. } => {
            // Lay the file out first (not measured), as IOgen's file existed before its run.
            let mut cmd = Command::new("fio");
            cmd.args(crate::fs::iogen_layout_args(
                fsp,
                &dir.join("iogen.dat").to_string_lossy(),
            ));
            let f =
                crate::runner::run_workload(cmd, "fio layout", Duration::from_secs(600), None)?;
            anyhow::ensure!(
                f.ok,
                "laying out the IOgen file failed: {}",
                crate::command::last_lines(&f.stderr, 3)
            );
        }
        _ => {}
    }
    Ok(())
}

/// The result of workload `w` from what it printed.
fn parse_fs_result(w: crate::fs::FsWorkload, fsp: &crate::fs::FsParams, stdout: &str) -> anyhow::Result<crate::fs::FsResult> {
    use crate::fs::{FsResult, FsWorkload};
    Ok(match w {
        FsWorkload::Flowop(_) => {
            let r: bw_workload_report::FlowReport = crate::runner::parse_json_report(stdout)
                .map_err(|e| anyhow::anyhow!("flowop {e}"))?;
            anyhow::ensure!(
                r.ops > 0,
                "flowop did no operation (errors: {:?})",
                r.errors
            );
            FsResult::Flowop(r)
        }
        FsWorkload::Postmark => {
            let mut r = crate::fs::parse_postmark(stdout)?;
            r.transactions = fsp.postmark_transactions as u64;
            FsResult::Postmark(r)
        }
        FsWorkload::Bonnie => FsResult::Bonnie(crate::fs::parse_bonnie(stdout)?),
        FsWorkload::Iogen { .. } | FsWorkload::IogenRaw => {
            FsResult::Iogen(crate::fs::parse_iogen(stdout)?)
        }
    })
}

/// The memory cgroup of one fs case: on this machine, or on the ssh client
/// host the workload runs on.
enum FsCgroup {
    Local(crate::cleanup::Token, crate::cgroup::MemCgroup),
    Remote(crate::remote_fs::Cgroup),
}

/// The storage suites (net, micro, sweep, fs) run as one: they share the
/// targets started per link, and every case takes turns over the subjects.
impl crate::suite::Suite for LabRun {
    fn estimate(&self) -> Option<String> {
        let plan = &self.plan;
        Some(format!(
            "lab: {} runs planned ({} subjects, MTU {:?}, repeat {}), {}, output in {}",
            plan.total_runs(),
            plan.subjects().len() + plan.baseline as usize,
            plan.params.mtus,
            plan.params.repeat,
            plan.estimate().describe(),
            self.out.display()
        ))
    }

    fn run_cases(&mut self) -> anyhow::Result<()> {
        self.run_inner()
    }

    fn results(&mut self) -> &mut Results {
        &mut self.results
    }

    fn finish(&mut self) {
        self.progress.finish_and_clear();
        self.results.ssh_commands = crate::ssh::invocations();
        if self.remote.is_some() {
            let cases = self.results.samples.len() + self.results.fs.len() + self.results.net.len();
            eprintln!("lab: {} ssh commands for {cases} samples", self.results.ssh_commands);
        }
    }

    fn print_outcome(&self, ok: bool) {
        let report = self.out.join("report.html");
        if report.exists() {
            eprintln!("lab: results: {}", self.out.join("results.json").display());
            eprintln!("lab: report:  {}", report.display());
        }
        if ok {
            bw_lab_report::print_recommendations(&self.results);
        }
    }
}

impl LabRun {
    pub fn new(plan: Plan, exe: PathBuf, out: PathBuf) -> LabRun {
        let mut results = Results {
            format: FORMAT,
            started_utc: utc_now(),
            ..Default::default()
        };
        results.params = plan.params.clone();
        results.machine = crate::machine::machine_info();
        results.software = crate::subjects::software(&exe);
        let progress = ProgressBar::new(plan.total_runs());
        progress.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} runs, ~{eta} left  {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        let backing = PathBuf::from(format!("/dev/shm/bwlab-{}.img", std::process::id()));
        LabRun {
            plan,
            exe,
            out,
            results,
            backing,
            progress,
            idle_spent: 0.0,
            shape: bw_lab_results::default_link(),
            fs_dir: None,
            fs_serial: 0,
            client_cgroup: None,
            remote: None,
            remote_clients: vec![],
            factors: Default::default(),
            digest: Default::default(),
            meter: Default::default(),
            fs_kind: Default::default(),
            fsync: Default::default(),
            fs_factors: Default::default(),
            kernel_nfs_client: false,
            kernel_nfs: false,
            nfs_server_fs: Default::default(),
        }
    }

    fn say(&self, line: &str) {
        // A hidden bar (not a terminal) swallows println: write directly then.
        if self.progress.is_hidden() {
            eprintln!("{line}");
        } else {
            self.progress.println(line);
        }
    }

    /// Bounded wait for an idle machine: at most `idle_max_wait_s` per run
    /// and `idle_budget_s` over the whole run. On a shared box "idle" may
    /// come and go all the time; once the budget is spent, runs only measure
    /// the busy share (stored with every sample) and go, so the run keeps to
    /// its time limit.
    fn wait_idle(&mut self) -> (f64, f64) {
        let p = &self.plan.params;
        let left = (p.idle_budget_s - self.idle_spent).max(0.0);
        let max = p.idle_max_wait_s.min(left);
        let (busy, waited) =
            crate::machine::wait_idle(p.idle_threshold, Duration::from_secs_f64(max));
        self.idle_spent += waited;
        if left > 0.0 && self.idle_spent >= p.idle_budget_s {
            self.say(&format!(
                "lab: the machine keeps getting busy (other work; {:.0}% now): idle-wait budget of {:.0} s spent, measuring without waiting from here on",
                busy * 100.0,
                p.idle_budget_s
            ));
        }
        (busy, waited)
    }

    fn save(&self) -> anyhow::Result<()> {
        self.results.save(&self.out.join("results.json"))
    }

    fn run_inner(&mut self) -> anyhow::Result<()> {
        let size = self.plan.params.size_bytes;
        if let Some(r) = &self.remote {
            self.backing = r.target.run_path("/dev/shm", "backing.img");
        }
        let backing = self.backing.clone();
        let on = self.remote.as_ref().map(|r| format!(" on {}", r.target.name())).unwrap_or_default();
        self.say(&format!(
            "lab: filling backing file {}{on} ({} MiB) ...",
            backing.display(),
            size >> 20
        ));
        let backing_token = match self.remote.as_ref().and_then(|r| r.target.ssh()) {
            Some(h) => h.fill_random(&backing, size)?,
            None => registry().create(Resource::File(backing.clone()), || make_backing(&backing, size))?.0,
        };
        self.results.params.backing = format!(
            "{}{on} ({} MiB, tmpfs) shared by every target{}",
            backing.display(),
            size >> 20,
            if self.remote.is_some() { "" } else { " and the local baseline" }
        );
        let topo = match &self.remote {
            None => {
                self.say("lab: creating namespaces and veth pairs ...");
                let cc = Some(self.plan.params.tcp_congestion.as_str()).filter(|c| !c.is_empty());
                Topology::setup(&self.plan.params.mtus, cc)?
            }
            Some(r) => {
                let t = Topology::connect(r)?;
                let l = &t.links[0];
                self.say(&format!(
                    "lab: target {} ({}, {}) <- client {} ({}, {}), MTU {}",
                    t.target.name(), l.target_ip, l.target_if, t.client.name(), l.client_ip, l.client_if, l.mtu
                ));
                // The run measures at the NICs' MTU (or the one --mtu set).
                self.plan.params.mtus = vec![l.mtu];
                self.results.params.mtus = vec![l.mtu];
                for (role, host, nic) in [("target", &t.target, &l.target_if), ("client", &t.client, &l.client_if)] {
                    let info = crate::remote::host_info(host, role, nic)?;
                    if info.emulated {
                        self.say(&format!("lab: the {role} host {} is a virtual machine (hypervisor flag): its timings are the VM's", host.name()));
                    }
                    self.results.hosts.push(info);
                }
                t
            }
        };
        self.results.params.veth_offloads_off = topo.offloads_off;
        let clients = self.clients();
        self.results.subjects = self
            .plan
            .subjects()
            .into_iter()
            .flat_map(|s| clients.iter().filter(move |c| c.serves(s)).map(move |c| (s, *c)))
            .map(|(s, c)| SubjectRecord {
                key: c.key(s),
                protocol: s.address().protocol_name().into(),
                target: s.target_name().into(),
                initiator: c.initiator(s, &topo.client),
                unavailable: None,
                target_datapath: None, settings: None, external: s.external().is_some(), identity: None, skipped: None,
            })
            .collect();
        self.plan_kernel_nfs(&topo.client, &clients);
        if self.plan.baseline && !self.jobs().is_empty() {
            self.results.subjects.push(SubjectRecord {
                key: SubjectKey::LocalFio,
                protocol: "local".into(),
                target: "tmpfs file".into(),
                initiator: "fio (io_uring)".into(),
                unavailable: None,
                target_datapath: None, settings: None, external: false, identity: None, skipped: None,
            });
        }
        let mut fs_dir_token = None;
        if self.plan.fs.is_some() {
            if self.plan.baseline {
                self.results.subjects.push(SubjectRecord {
                    key: crate::fs::LOCAL,
                    protocol: "local".into(),
                    target: "ext4 on a loop device over the backing file".into(),
                    initiator: "the kernel (no network)".into(),
                    unavailable: None,
                    target_datapath: None, settings: None, external: false, identity: None, skipped: None,
                });
            }
            if let Some(h) = topo.client.ssh() {
                // The workloads run on the client host, and mount there.
                self.client_cgroup = Some(crate::remote_fs::cgroup_base(h)?);
                let (t, dir) = crate::remote_fs::mountpoint(h)?;
                fs_dir_token = Some((t, None));
                self.fs_dir = Some(dir);
            } else {
                // The mount point lives in a shared mount: see SharedDir.
                let pid = std::process::id();
                let shared = crate::mounts::SharedDir::create(&crate::mounts::fs_dir(pid))?;
                let dir = crate::mounts::fs_mountpoint(pid);
                let made = registry().create(Resource::Dir(dir.clone()), || {
                    Ok(std::fs::create_dir_all(&dir)?)
                });
                let (t, ()) = match made {
                    Ok(v) => v,
                    Err(e) => {
                        let _ = shared.release();
                        return Err(e);
                    }
                };
                fs_dir_token = Some((t, Some(shared)));
                self.fs_dir = Some(dir);
            }
        }
        self.save()?;
        self.progress.enable_steady_tick(Duration::from_millis(200));
        self.print_table_header();
        let links = topo.links.clone();
        for shape in self.plan.links.clone() {
            // Shape every veth pair, then measure the network before storage.
            let mut qdiscs = vec![];
            // A real NIC is shaped only with --allow-nic-changes (the plan
            // refuses shapes between hosts without it).
            for link in &links {
                qdiscs.extend(crate::net::apply_shape(&topo, link, &shape)?);
            }
            self.shape = shape.name.clone();
            if self.plan.net_runs > 0 {
                for link in &links {
                    self.run_net(&topo, link, &shape)?;
                }
            }
            if !self.jobs().is_empty() || self.plan.fs.is_some() {
                let r = self.run_factors(&topo, &links);
                // Put the offloads back (and check them) even after a failure.
                let restored = topo.restore_offloads();
                r?;
                restored?;
                if !self.plan.params.offloads.is_empty() {
                    self.say(&format!("lab: offloads restored and checked on {} link ends", 2 * links.len()));
                }
            }
            for t in qdiscs {
                registry().release(t)?;
            }
        }
        if self.plan.baseline {
            self.run_baseline()?;
        }
        self.progress.finish_and_clear();
        topo.teardown()?;
        if let Some((t, shared)) = fs_dir_token {
            registry().release(t)?;
            if let Some(shared) = shared {
                shared.release()?;
            }
        }
        registry().release(backing_token)?;
        Ok(())
    }

    /// Every (offload, digest) combination on every link; the fs suite
    /// runs at the first combination only (its cases carry no factors).
    fn run_factors(&mut self, topo: &Topology, links: &[Link]) -> anyhow::Result<()> {
        for (n, (offload, digest)) in self.plan.factor_combinations().into_iter().enumerate() {
            if offload != crate::offload::Offload::MtuFrames {
                topo.set_offload(offload)?;
            }
            self.factors = bw_lab_results::Factors { offload: offload.name().into(), digest: digest.factor().into() };
            self.digest = digest;
            if self.plan.factor_combinations().len() > 1 {
                self.say(&format!("lab: offload {}, digest {}", if offload.name().is_empty() { "default" } else { offload.name() }, digest.name()));
            }
            for (i, link) in links.iter().enumerate() {
                self.run_link(topo, link, i == 0 && n == 0)?;
            }
        }
        Ok(())
    }

    /// File-level NFS: with the fs suite and ganesha, the kernel NFS
    /// subjects when the client host has the client and the run's clients
    /// include the kernel's (always in one box: its only client is
    /// blockwire's, and the kernel NFS client needs no initiator of its own).
    fn plan_kernel_nfs(&mut self, client: &crate::host::Host, clients: &[crate::clients::ClientKind]) {
        use crate::subjects::PeerKind;
        if self.plan.fs.is_none() || !self.plan.peers.contains(&PeerKind::Ganesha) {
            return;
        }
        self.kernel_nfs_client = crate::kernel_nfs::available(client);
        let kernel_wanted = self.remote.is_none() || clients.iter().any(|c| matches!(c, crate::clients::ClientKind::Kernel(_)));
        self.kernel_nfs = self.kernel_nfs_client && kernel_wanted;
        if !self.kernel_nfs {
            return;
        }
        for v in crate::kernel_nfs::VERSIONS {
            self.results.subjects.push(SubjectRecord {
                key: v.key(),
                protocol: Subject::Peer(PeerKind::Ganesha).address().protocol_name().into(),
                target: PeerKind::Ganesha.name().into(),
                initiator: v.initiator(client),
                unavailable: None,
                target_datapath: None, settings: None, external: false, identity: None, skipped: None,
            });
        }
    }

    /// ganesha restarted with its export on `kind` unless it is on it
    /// already: over NFS, `--fs` is the server's file system (the one
    /// under the data), not one on the client.
    fn serve_nfs_on(&mut self, kind: crate::fs_kind::FsKind, topo: &Topology, link: &Link, p: &mut TargetProcess) -> Result<(), String> {
        if self.nfs_server_fs == kind {
            return Ok(());
        }
        self.progress.set_message(format!("MTU {}: ganesha's export on {}", link.mtu, kind.name()));
        // One ganesha per address and port: the old one goes first.
        p.halt();
        let new = crate::subjects::ganesha::start_on(topo, link, &self.backing, kind)?;
        std::mem::replace(p, new).stop();
        self.nfs_server_fs = kind;
        Ok(())
    }

    /// The clients of the run (blockwire's alone in one box).
    fn clients(&self) -> Vec<crate::clients::ClientKind> {
        match &self.remote {
            Some(_) => self.remote_clients.clone(),
            None => vec![crate::clients::ClientKind::Blockwire],
        }
    }

    /// The AoE datapath target `s` uses, on every client's subject of it
    /// (each MTU's, when they differ).
    fn record_target_datapath(&mut self, s: Subject, datapath: &str) {
        for c in self.clients().into_iter().filter(|c| c.serves(s)) {
            let key = c.key(s);
            if let Some(r) = self.results.subjects.iter_mut().find(|r| r.key == key) {
                match &mut r.target_datapath {
                    Some(d) if d.split(", ").any(|x| x == datapath) => {}
                    Some(d) => *d = format!("{d}, {datapath}"),
                    None => r.target_datapath = Some(datapath.to_string()),
                }
            }
        }
    }

    /// How target `s` serves (a kernel target's version and settings), on
    /// every client's subject of it.
    fn record_settings(&mut self, s: Subject, settings: &str) {
        for c in self.clients().into_iter().filter(|c| c.serves(s)) {
            let key = c.key(s);
            if let Some(r) = self.results.subjects.iter_mut().find(|r| r.key == key) {
                r.settings = Some(settings.to_string());
            }
        }
    }

    /// Before an external subject is measured: what it says it is
    /// (`blockwire identify`, from where its client runs) goes on its
    /// records, and its size must hold the run's volume. Err: why it is
    /// unavailable.
    fn visit_external(&mut self, topo: &Topology, s: Subject) -> Result<(), String> {
        let Some(e) = s.external() else { return Ok(()) };
        let client = external_client(topo);
        let exe = client.lab_exe(&self.exe).to_string_lossy().into_owned();
        let out = client
            .command_with(&exe, &["identify", "--json", "--timeout", "15", e.url])
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|err| format!("cannot run blockwire identify on {}: {err}", client.name()))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            return Err(format!("not reachable from {}: {}", client.name(), crate::command::last_lines(err.trim(), 2).replace('\n', "; ")));
        }
        let v: serde_json::Value = serde_json::from_str(client.program_output(&stdout).map_err(|err| format!("{err:#}"))?.trim())
            .map_err(|err| format!("blockwire identify printed no JSON: {err}"))?;
        let size = v["size_bytes"].as_u64().unwrap_or(0);
        let need = self.plan.params.size_bytes;
        if size < need {
            return Err(format!("it has {} MiB, the run's volume is {} MiB: give --size {}M or less", size >> 20, need >> 20, size >> 20));
        }
        let identity = v["identity"].as_str().map(str::to_string);
        self.say(&format!("lab: {}: {} ({} MiB), measured from {}", s.key(), identity.as_deref().unwrap_or("no identity"), size >> 20, client.name()));
        for c in self.clients().into_iter().filter(|c| c.serves(s)) {
            let key = c.key(s);
            if let Some(r) = self.results.subjects.iter_mut().find(|r| r.key == key) {
                r.identity = identity.clone();
            }
        }
        Ok(())
    }

    /// A target that did not start: every client's subject of it.
    fn mark_target_unavailable(&mut self, s: Subject, mtu: u32, reason: String) {
        for c in self.clients().into_iter().filter(|c| c.serves(s)) {
            self.mark_unavailable(&c.key(s), mtu, reason.clone());
        }
    }

    fn mark_unavailable(&mut self, key: &SubjectKey, mtu: u32, reason: String) {
        self.say(&format!("lab: {key} at MTU {mtu}: unavailable: {reason}"));
        if let Some(s) = self.results.subjects.iter_mut().find(|s| &s.key == key) {
            if s.unavailable.is_none() {
                s.unavailable = Some(reason.clone());
            }
        }
        self.results.failures.push(Failure {
            subject: key.to_string(),
            mtu: Some(mtu),
            workload: String::new(),
            reason,
        });
        // Its runs will not happen: keep the progress bar honest.
        let skipped = self.runs_per_subject(mtu);
        self.progress.inc(skipped);
    }

    fn runs_per_subject(&self, mtu: u32) -> u64 {
        let p = &self.plan.params;
        let fs = match &self.plan.fs {
            Some(f) if p.mtus.first() == Some(&mtu) => {
                self.plan.fs_cases(false).len() as u64 * f.repeat as u64
            }
            _ => 0,
        };
        self.plan.micro.len() as u64 * p.repeat as u64
            + self.plan.sweep.len() as u64 * p.sweep_repeats() as u64
            + fs
    }

    /// The net suite on one link: iperf3's rate with 1..8 streams, the
    /// ceiling every protocol on this link is shown against.
    fn run_net(
        &mut self,
        topo: &Topology,
        link: &Link,
        shape: &crate::net::LinkShape,
    ) -> anyhow::Result<()> {
        self.progress
            .set_message(format!("iperf3 MTU {} link {}", link.mtu, shape.name));
        let runs = self.plan.net_runs as u64;
        let repeats = runs / crate::net::STREAMS.len() as u64;
        match crate::net::run_net(
            topo,
            link,
            shape,
            self.plan.params.net_runtime_s,
            repeats as u32,
        ) {
            Ok(samples) => {
                for n in crate::net::STREAMS {
                    let v: Vec<&crate::net::NetSample> =
                        samples.iter().filter(|s| s.streams == n).collect();
                    if v.is_empty() {
                        continue;
                    }
                    let k = v.len() as f64;
                    self.say(&format!(
                        "{:<16} {:>5} {:<18} {:>12.2} Gbit/s  client CPU {:.0}%  server CPU {:.0}%  link {}",
                        "iperf3",
                        link.mtu,
                        format!("{n} stream(s)"),
                        v.iter().map(|s| s.bits_per_s).sum::<f64>() / k / 1e9,
                        v.iter().map(|s| s.client_cpu_pct).sum::<f64>() / k,
                        v.iter().map(|s| s.server_cpu_pct).sum::<f64>() / k,
                        shape.name
                    ));
                }
                self.results.net.extend(samples);
            }
            Err(e) => {
                if interrupted() {
                    anyhow::bail!("interrupted");
                }
                self.say(&format!(
                    "lab: iperf3 at MTU {} link {} failed: {e:#}",
                    link.mtu, shape.name
                ));
                self.results.failures.push(Failure {
                    subject: "iperf3".into(),
                    mtu: Some(link.mtu),
                    workload: format!("net link {}", shape.name),
                    reason: format!("{e:#}"),
                });
            }
        }
        self.progress.inc(runs);
        self.save()
    }

    /// The runs of one link or of the baseline: (suite, workload, seconds, repeats).
    fn jobs(&self) -> Vec<(Suite, Workload, u32, u32)> {
        let p = &self.plan.params;
        let mut jobs: Vec<(Suite, Workload, u32, u32)> = self
            .plan
            .micro
            .iter()
            .map(|w| (Suite::Micro, w.clone(), p.runtime_s, p.repeat))
            .collect();
        {
            jobs.extend(self.plan.sweep.iter().map(|w| {
                (
                    Suite::Sweep,
                    w.clone(),
                    p.sweep_runtime_s,
                    p.sweep_repeats(),
                )
            }));
        }
        jobs
    }

    /// All subjects at one MTU, interleaved: every target is started first
    /// (blockwire serve with all its protocols, tgt, vblade: they listen on
    /// different ports and AoE shelves), then each workload runs every
    /// subject once per repeat, one at a time, in an order rotated between
    /// repeats. So all subjects see the same machine state: this machine's
    /// speed drifts by tens of percent over minutes, and measuring subjects
    /// one after another turned that drift into false differences.
    fn run_link(&mut self, topo: &Topology, link: &Link, first_mtu: bool) -> anyhow::Result<()> {
        let mut procs: Vec<TargetProcess> = vec![];
        let mut live: Vec<LiveSubject> = vec![];
        let measured = self.plan.subjects_for(self.digest);
        let mut ours: Vec<_> = self.plan.protocols.iter().copied().filter(|p| measured.contains(&Subject::Blockwire(*p))).collect();
        let mut peers = self.plan.peers.clone();
        self.nfs_server_fs = Default::default();
        if topo.routed {
            // AoE is Ethernet frames: a router between the hosts ends it.
            let why = "AoE needs the hosts on one layer-2 segment; the client reaches the target through a router";
            for p in ours.iter().filter(|p| **p == crate::subjects::Protocol::Aoe) {
                self.mark_target_unavailable(Subject::Blockwire(*p), link.mtu, why.into());
            }
            for p in peers.iter().filter(|p| p.target().address().aoe().is_some()) {
                self.mark_target_unavailable(Subject::Peer(*p), link.mtu, why.into());
            }
            ours.retain(|p| *p != crate::subjects::Protocol::Aoe);
            peers.retain(|p| p.target().address().aoe().is_none());
        }
        let rdma = crate::subjects::Protocol::NvmeRdma;
        if ours.contains(&rdma) {
            // No RDMA device on the link: one line, no serve that fails to bind.
            let why = crate::rdma::check(&topo.target, &link.target_if).or_else(|| crate::rdma::check(&topo.client, &link.client_if));
            if let Some(why) = why {
                self.mark_target_unavailable(Subject::Blockwire(rdma), link.mtu, why);
                ours.retain(|p| *p != rdma);
            }
        }
        if !ours.is_empty() {
            self.progress
                .set_message(format!("MTU {}: starting blockwire serve", link.mtu));
            let serve = blockwire::Serve {
                exe: &self.exe,
                host: &topo.target,
                link,
                backend: format!("file:{}", self.backing.display()),
                log: None,
                ready_within: Duration::from_secs(20),
                soft_digest: self.digest == crate::offload::Digest::Crc32cSoft,
            };
            let (proc, status) = blockwire::start(&serve, &ours);
            for (proto, st) in &status {
                if let Err(why) = st {
                    self.mark_target_unavailable(Subject::Blockwire(*proto), link.mtu, why.clone());
                }
            }
            if let Some(p) = proc {
                if let Some(d) = blockwire::aoe_datapath(&p.log_tail()) {
                    self.record_target_datapath(Subject::Blockwire(crate::subjects::Protocol::Aoe), &d);
                }
                for (proto, _) in status.iter().filter(|(_, s)| s.is_ok()) {
                    live.push(LiveSubject::new(Subject::Blockwire(*proto), link, Some(procs.len())));
                }
                procs.push(p);
            }
        }
        for peer in peers {
            let subject = Subject::Peer(peer);
            if !measured.contains(&subject) {
                continue;
            }
            self.progress
                .set_message(format!("MTU {}: starting {}", link.mtu, peer.name()));
            match peer.start(topo, link, &self.backing) {
                Ok(p) => {
                    if let Some(settings) = &p.settings {
                        self.record_settings(subject, settings);
                    }
                    live.push(LiveSubject::new(subject, link, Some(procs.len())));
                    procs.push(p);
                }
                Err(why) => self.mark_target_unavailable(subject, link.mtu, why),
            }
        }
        for s in measured.iter().copied().filter(|s| s.external().is_some()) {
            // Not the lab's link: once per run, at the first MTU.
            if !first_mtu {
                continue;
            }
            self.progress.set_message(format!("{}: asking what it is", s.key()));
            match self.visit_external(topo, s) {
                Ok(()) => live.push(LiveSubject::new(s, link, None)),
                Err(why) => self.mark_target_unavailable(s, link.mtu, why),
            }
        }
        if topo.remote {
            self.check_aoe_reach(topo, link, &mut live);
        }
        // Kernel initiators negotiate no digests here: they are measured in
        // the digest-free combination only.
        if self.digest == crate::offload::Digest::None {
            self.attach_kernel_clients(topo, link, &mut live);
        }
        // The idle baseline, with the targets up but nothing asked of them.
        let mut r = crate::machine_cpu::MachineMeter::new(&[&topo.target, &topo.client]).map(|m| self.meter = m);
        if r.is_ok() {
            r = self.run_interleaved(topo, link, &mut procs, &mut live);
        }
        if r.is_ok() && first_mtu && self.plan.fs.is_some() {
            r = self.run_fs(topo, link, &mut procs, &mut live);
        }
        // The kernel's sessions go before their targets do.
        for s in &mut live {
            if let Some(k) = s.kernel.take() {
                if let Err(e) = registry().release(k.token) {
                    self.say(&format!("lab: {}: detaching {}: {e:#}", s.key, k.device));
                }
            }
        }
        for p in procs {
            p.stop();
        }
        r
    }

    /// Between hosts, the AoE targets that started are asked for by an AoE
    /// config query broadcast from the client host's interface; those that
    /// do not answer are unavailable (a layer-2 reason, not a failure of the
    /// target), for every client.
    fn check_aoe_reach(&mut self, topo: &Topology, link: &Link, live: &mut Vec<LiveSubject>) {
        // (An external AoE target is on the user's interface, not the link's.)
        let wanted: Vec<(Subject, (u16, u8))> =
            live.iter().filter(|s| s.subject.external().is_none()).filter_map(|s| s.subject.address().aoe().map(|a| (s.subject, a))).collect();
        if wanted.is_empty() {
            return;
        }
        let addrs: Vec<(u16, u8)> = wanted.iter().map(|w| w.1).collect();
        // A second, longer query before giving up: a frame lost on a busy
        // (or emulated) host is not a missing layer-2 path.
        let mut result = (vec![], String::new());
        for wait_s in [2, 5] {
            result = match crate::remote::aoe_answers(&topo.client, &self.exe, &link.client_if, &addrs, wait_s) {
                Ok(v) => v,
                Err(e) => (vec![], format!("{e:#}")),
            };
            if result.0.len() == addrs.len() {
                break;
            }
        }
        let (answered, err) = result;
        for (subject, (shelf, slot)) in wanted.into_iter().filter(|w| !answered.contains(&w.1)) {
            let why = format!(
                "AoE cannot reach the target at layer 2: an AoE config query broadcast from {} on {} got no answer from e{shelf}.{slot} ({}){}",
                link.client_if,
                topo.client.name(),
                subject.target_name(),
                if err.is_empty() { String::new() } else { format!(": {err}") }
            );
            self.say(&format!("lab: preflight: {why}"));
            self.mark_target_unavailable(subject, link.mtu, why);
            live.retain(|s| s.subject != subject);
        }
    }

    /// Beside each started target measured by blockwire's client, the
    /// client host's kernel initiator of its protocol, attached now (its
    /// block device stays for the link's runs); blockwire's own client
    /// leaves the runs unless `--clients` has it.
    fn attach_kernel_clients(&mut self, topo: &Topology, link: &Link, live: &mut Vec<LiveSubject>) {
        use crate::clients::ClientKind;
        let clients = self.clients();
        let per_subject = self.runs_per_subject(link.mtu);
        let mut added = vec![];
        let has_runs = per_subject > 0;
        for s in live.iter().filter(|_| has_runs) {
            let subject = s.subject;
            for c in clients.iter().filter(|c| matches!(c, ClientKind::Kernel(_)) && c.serves(subject)) {
                let key = c.key(subject);
                self.progress.set_message(format!("MTU {}: attaching {key}", link.mtu));
                self.progress.inc_length(per_subject);
                match crate::clients::attach(&topo.client, subject, link) {
                    Ok(a) => {
                        self.say(&format!("lab: {key}: {} on {}", a.device, topo.client.name()));
                        added.push(LiveSubject { key, url: a.device.clone(), kernel: Some(a), proc: s.proc, subject, done: 0, consecutive_failures: 0, gave_up: false });
                    }
                    Err(e) => {
                        if let Some(r) = self.results.subjects.iter_mut().find(|x| x.key == key) {
                            r.unavailable.get_or_insert(format!("{e:#}"));
                        }
                        self.results.failures.push(Failure { subject: key.to_string(), mtu: Some(link.mtu), workload: String::new(), reason: format!("{e:#}") });
                        self.say(&format!("lab: {key} at MTU {}: unavailable: {e:#}", link.mtu));
                        self.progress.inc(per_subject);
                    }
                }
            }
        }
        if !clients.contains(&ClientKind::Blockwire) {
            live.retain(|s| s.kernel.is_some());
        }
        live.extend(added);
    }

    fn run_interleaved(
        &mut self,
        topo: &Topology,
        link: &Link,
        procs: &mut [TargetProcess],
        live: &mut [LiveSubject],
    ) -> anyhow::Result<()> {
        let per_subject = self.runs_per_subject(link.mtu);
        let n = live.len();
        // The write cases a subject may not take (an external block subject
        // without --allow-writes), named once per subject.
        let mut skipped: Vec<Vec<String>> = vec![vec![]; n];
        for (suite, w, runtime, repeats) in self.jobs() {
            let mut samples: Vec<Vec<Sample>> = vec![vec![]; n];
            for rep in 1..=repeats {
                for turn in 0..n {
                    let i = (turn + rep as usize - 1) % n;
                    if interrupted() {
                        anyhow::bail!("interrupted");
                    }
                    if live[i].gave_up {
                        continue;
                    }
                    let key = live[i].key.clone();
                    if !live[i].subject.writes_allowed() && writes(&w) {
                        if rep == 1 {
                            skipped[i].push(w.name.clone());
                            self.progress.inc(repeats as u64);
                            live[i].done += repeats as u64;
                        }
                        continue;
                    }
                    if let Some(target) = live[i].proc.map(|p| &mut procs[p]) {
                        if !target.alive() {
                            let why = format!("{} died: {}", target.name, target.log_tail());
                            self.give_up(&mut live[i], per_subject, link.mtu, &w.name, why, false);
                            continue;
                        }
                    }
                    self.progress
                        .set_message(format!("{key} MTU {} {} #{rep}", link.mtu, w.name));
                    let url = live[i].url.clone();
                    let kernel = live[i].kernel.is_some();
                    match self.one_networked_run(
                        topo,
                        link,
                        &key,
                        &url,
                        kernel,
                        suite,
                        &w,
                        rep,
                        runtime,
                        live[i].proc.map(|p| &procs[p]),
                    ) {
                        Ok(s) => {
                            live[i].consecutive_failures = 0;
                            samples[i].push(s.clone());
                            self.results.samples.push(s);
                        }
                        Err(e) => {
                            if interrupted() {
                                anyhow::bail!("interrupted");
                            }
                            live[i].consecutive_failures += 1;
                            self.results.failures.push(Failure {
                                subject: key.to_string(),
                                mtu: Some(link.mtu),
                                workload: w.name.clone(),
                                reason: format!("{e:#}"),
                            });
                            self.say(&format!("lab: {key} {} run {rep} failed: {e:#}", w.name));
                        }
                    }
                    self.progress.inc(1);
                    live[i].done += 1;
                    if live[i].consecutive_failures >= MAX_CONSECUTIVE_FAILURES {
                        let reason = format!(
                            "gave up after {MAX_CONSECUTIVE_FAILURES} failed runs in a row"
                        );
                        self.give_up(&mut live[i], per_subject, link.mtu, &w.name, reason, true);
                    }
                }
            }
            for (s, got) in live.iter().zip(samples) {
                if !got.is_empty() {
                    self.print_case_row(&s.key, Some(link.mtu), suite, &w, got);
                }
            }
            self.save()?;
        }
        for (s, cases) in live.iter().zip(skipped) {
            if let Some(why) = s.subject.external().and_then(|e| e.skipped_writes(&cases)) {
                self.say(&format!("lab: {}: {why}", s.key));
                if let Some(r) = self.results.subjects.iter_mut().find(|r| r.key == s.key) {
                    r.skipped = Some(why);
                }
            }
        }
        Ok(())
    }

    /// Stop measuring a subject at this MTU: record why, keep the progress
    /// bar honest, and mark it unavailable if it never produced a sample.
    fn give_up(
        &mut self,
        s: &mut LiveSubject,
        per_subject: u64,
        mtu: u32,
        workload: &str,
        why: String,
        failures_recorded: bool,
    ) {
        s.gave_up = true;
        self.progress.inc(per_subject.saturating_sub(s.done));
        if !failures_recorded {
            self.results.failures.push(Failure {
                subject: s.key.to_string(),
                mtu: Some(mtu),
                workload: workload.into(),
                reason: why.clone(),
            });
        }
        if self.results.samples.iter().all(|x| x.subject != s.key) {
            let last = self
                .results
                .failures
                .last()
                .map(|f| f.reason.clone())
                .unwrap_or(why.clone());
            if let Some(subj) = self.results.subjects.iter_mut().find(|x| x.key == s.key) {
                subj.unavailable.get_or_insert(last);
            }
        }
        self.say(&format!("lab: {} at MTU {mtu}: {why}", s.key));
    }

    #[allow(clippy::too_many_arguments)]
    fn one_networked_run(
        &mut self,
        topo: &Topology,
        link: &Link,
        key: &SubjectKey,
        url: &str,
        kernel: bool,
        suite: Suite,
        w: &Workload,
        rep: u32,
        runtime: u32,
        // None: an external subject (no target of the lab's, not on its link).
        target: Option<&TargetProcess>,
    ) -> anyhow::Result<Sample> {
        let (busy, waited) = self.wait_idle();
        let started_unix = unix_now();
        let wire0 = target.map(|_| topo.client_counters(link)).transpose()?;
        let cpu0 = target.map(|t| t.cpu_seconds()).transpose()?;
        let machine0 = self.meter.start()?;
        let bench = if kernel {
            // `url` is the block device; the initiator's work is the kernel's.
            let m0 = crate::clients::machine_cpu_seconds(&topo.client)?;
            let mut b = crate::runner::run_fio_on_device(&topo.client, url, w, runtime, self.plan.params.size_bytes)?;
            let m1 = crate::clients::machine_cpu_seconds(&topo.client)?;
            (b.cpu_user_s, b.cpu_sys_s) = ((m1.0 - m0.0).max(0.0), (m1.1 - m0.1).max(0.0));
            b
        } else {
            crate::runner::run_bench(
                &self.exe,
                &if target.is_some() { topo.client.clone() } else { external_client(topo) },
                url,
                w,
                runtime,
                self.plan.params.size_bytes,
                self.digest.bench_args(),
            )?
        };
        let machine_cpu = self.meter.finish(machine0)?;
        let cpu1 = target.map(|t| t.cpu_seconds()).transpose()?;
        let wire1 = target.map(|_| topo.client_counters(link)).transpose()?;
        Ok(Sample {
            subject: key.clone(),
            mtu: Some(link.mtu),
            link: self.shape.clone(),
            suite,
            workload: w.clone(),
            repeat: rep,
            bench,
            target_cpu_s: cpu0.zip(cpu1).map(|(a, b)| b - a),
            wire: wire0.zip(wire1).map(|(a, b)| WireCounters::delta(&a, &b)),
            busy_before: busy,
            idle_wait_s: waited,
            started_unix,
            factors: self.factors.clone(),
            machine_cpu,
        })
    }

    /// The fs suite on one link: every subject (the networked ones that are
    /// still up, then the local baseline) gets ext4 mounted in its turn,
    /// runs every (workload, memory limit) case, and is unmounted; the
    /// order rotates between repetitions. Subjects share the backing file,
    /// so only one is mounted at a time, and each turn starts on a fresh
    /// file system with an empty client cache.
    fn run_fs(
        &mut self,
        topo: &Topology,
        link: &Link,
        procs: &mut [TargetProcess],
        live: &mut [LiveSubject],
    ) -> anyhow::Result<()> {
        let Some(fsp) = self.plan.fs.clone() else {
            return Ok(());
        };
        let Some(mp) = self.fs_dir.clone() else {
            return Ok(());
        };
        // (key, url or a kernel initiator's device, target process index,
        // kernel); the local baseline has neither.
        let mut subjects: Vec<FsSubject> = live
            .iter()
            .filter(|s| !s.gave_up)
            .filter(|s| s.subject.external().is_none())
            .map(|s| (s.key.clone(), Some(s.url.clone()), s.proc, s.kernel.is_some()))
            .collect();
        // The fs suite makes a file system on its subject: never on the
        // user's own storage.
        let runs = self.plan.fs_cases(false).len() as u64 * fsp.repeat as u64 * self.plan.fs_combinations.len() as u64;
        for s in live.iter().filter(|s| s.subject.external().is_some() && !s.gave_up) {
            let why = "the fs suite does not run on external subjects (it makes a file system on its subject)";
            self.progress.inc(runs);
            if let Some(r) = self.results.subjects.iter_mut().find(|r| r.key == s.key) {
                r.skipped = Some(match r.skipped.take() {
                    Some(x) => format!("{x}; {why}"),
                    None => why.to_string(),
                });
            }
        }
        // ganesha's process, serving the NFS subjects.
        let ganesha = live
            .iter()
            .find(|s| s.subject == Subject::Peer(crate::subjects::PeerKind::Ganesha) && !s.gave_up && s.kernel.is_none())
            .and_then(|s| s.proc);
        if ganesha.is_some() && !self.kernel_nfs_client {
            self.say(&format!(
                "lab: fs: the client ({}) has no kernel NFS client: NFS is measured through nfs:// (a file system on the image file), not on an NFS mount",
                topo.client.name()
            ));
        }
        if self.kernel_nfs {
            let versions = crate::kernel_nfs::VERSIONS;
            match ganesha {
                Some(pi) => {
                    let src = format!("{}:{}", link.target_ip, crate::subjects::ganesha::EXPORT);
                    let runs = self.plan.fs_cases(false).len() * fsp.repeat as usize * self.plan.fs_combinations.len();
                    for v in versions {
                        subjects.push((v.key(), Some(src.clone()), Some(pi), false));
                        self.progress.inc_length(runs as u64);
                    }
                }
                None => {
                    for v in versions {
                        // (Not in the progress bar's count: nothing to skip.)
                        let key = v.key();
                        if let Some(r) = self.results.subjects.iter_mut().find(|r| r.key == key) {
                            r.unavailable.get_or_insert_with(|| "ganesha is not serving".into());
                        }
                    }
                }
            }
        }
        if self.plan.baseline {
            subjects.push((crate::fs::LOCAL, None, None, false));
        }
        for (kind, fsync) in self.plan.fs_combinations.clone() {
            let first = self.results.fs.len();
            (self.fs_kind, self.fsync) = (kind, fsync);
            self.fs_factors = bw_lab_results::fs::FsFactors { fs: kind.factor().into(), fsync: fsync.factor().into() };
            if self.plan.fs_combinations.len() > 1 {
                self.say(&format!("lab: fs suite on {}, fsync {}", kind.name(), fsync.name()));
            }
            if let Some(pi) = ganesha {
                if let Err(why) = self.serve_nfs_on(kind, topo, link, &mut procs[pi]) {
                    for (key, _, _, _) in subjects.iter().filter(|(_, _, p, _)| *p == Some(pi)) {
                        self.fs_failure(key, Some(link.mtu), "(server file system)", 0, why.clone());
                    }
                }
            }
            self.run_fs_setting(topo, link, procs, &subjects, &fsp, &mp)?;
            self.print_fs_rows(first);
        }
        Ok(())
    }

    /// The fs suite at one (file system, fsync) setting.
    fn run_fs_setting(
        &mut self,
        topo: &Topology,
        link: &Link,
        procs: &mut [TargetProcess],
        subjects: &[FsSubject],
        fsp: &crate::fs::FsParams,
        mp: &Path,
    ) -> anyhow::Result<()> {
        let n = subjects.len();
        let mut failed_turns = vec![0u32; n];
        for rep in 1..=fsp.repeat {
            for turn in 0..n {
                let i = (turn + rep as usize - 1) % n;
                if interrupted() {
                    anyhow::bail!("interrupted");
                }
                let (key, url, proc, kernel) = subjects[i].clone();
                let local = url.is_none();
                let cases = self.plan.fs_cases(local);
                if failed_turns[i] >= MAX_CONSECUTIVE_FAILURES {
                    self.progress.inc(cases.len() as u64);
                    continue;
                }
                if let Some(pi) = proc {
                    if !procs[pi].alive() {
                        let why = format!("{} died: {}", procs[pi].name, procs[pi].log_tail());
                        self.fs_failure(&key, Some(link.mtu), "(mount)", 0, why);
                        failed_turns[i] = MAX_CONSECUTIVE_FAILURES;
                        self.progress.inc(cases.len() as u64);
                        continue;
                    }
                }
                let target = proc.map(|pi| &procs[pi]);
                match self.fs_turn(topo, link, &key, url.as_deref(), kernel, target, rep, &cases, mp) {
                    Ok(()) => failed_turns[i] = 0,
                    Err(e) => {
                        if interrupted() {
                            anyhow::bail!("interrupted");
                        }
                        failed_turns[i] += 1;
                        self.fs_failure(
                            &key,
                            if local { None } else { Some(link.mtu) },
                            "(mount)",
                            0,
                            format!("{e:#}"),
                        );
                    }
                }
                self.save()?;
            }
        }
        Ok(())
    }

    fn fs_failure(
        &mut self,
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
        self.say(&format!("lab: fs {subject} {workload}{at}: {reason}"));
        self.results.failures.push(Failure {
            subject: subject.to_string(),
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
        topo: &Topology,
        link: &Link,
        key: &SubjectKey,
        url: Option<&str>,
        kernel: bool,
        target: Option<&TargetProcess>,
        rep: u32,
        cases: &[(crate::fs::FsWorkload, u64)],
        mp: &Path,
    ) -> anyhow::Result<()> {
        use crate::fs::FsWorkload;
        self.progress
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
            let size = self.plan.params.size_bytes;
            let nfs = crate::kernel_nfs::NfsVersion::from_key(key);
            let mounted = match (url, &topo.client) {
                (Some(_), client) if nfs.is_some() => crate::kernel_nfs::mount(client, link.target_ip, nfs.expect("matched"), mp)?,
                // `url` is the kernel initiator's block device.
                (Some(dev), client) if kernel => crate::remote_fs::mount_device(client, dev, mp, self.fs_kind, size)?,
                (Some(url), client) => {
                    // Over NFS `--fs` is the server's file system; the
                    // image's own (a VM guest's) stays ext4.
                    let image_on_nfs = self.plan.subjects().into_iter().any(|s| s.key() == *key && s.address().serves_files());
                    let kind = if image_on_nfs { crate::fs_kind::FsKind::Ext4 } else { self.fs_kind };
                    match client.ssh() {
                        Some(h) => crate::remote_fs::mount_blockwire(h, url, mp, kind, size)?,
                        None => crate::mounts::mount_remote_as(&self.exe, client, url, mp, kind, size)?,
                    }
                }
                (None, _) => {
                    // The raw device first: the file system goes on it next.
                    let (loop_token, dev) = crate::mounts::loop_device(&self.backing)?;
                    for &(workload, mem) in cases.iter().filter(|(w, _)| *w == FsWorkload::IogenRaw) {
                        if interrupted() {
                            break;
                        }
                        self.fs_case(&FsCaseRun { workload, mem, raw_dev: Some(&dev), ..base });
                        left -= 1;
                    }
                    crate::mounts::mount_local_as(&dev, loop_token, mp, self.fs_kind, self.plan.params.size_bytes)?
                }
            };
            let on_fs = FsCaseRun { target, daemon: mounted.daemon_pid, ..base };
            for &(workload, mem) in cases.iter().filter(|(w, _)| *w != FsWorkload::IogenRaw) {
                if interrupted() {
                    break;
                }
                self.fs_case(&FsCaseRun { workload, mem, ..on_fs });
                left -= 1;
            }
            self.progress
                .set_message(format!("fs {key} #{rep}: unmounting"));
            mounted.release()
        })();
        self.progress.inc(left);
        r
    }

    /// One workload at one memory limit, in a cgroup of its own; the sample
    /// or the failure (an OOM kill among them) goes into the results.
    fn fs_case(&mut self, c: &FsCaseRun) {
        let (key, w, mem) = (c.key, c.workload, c.mem);
        let local = *key == crate::fs::LOCAL;
        let mtu = if local { None } else { Some(c.link.mtu) };
        self.progress
            .set_message(format!("fs {key} {} {}M #{}", w.name(), mem >> 20, c.rep));
        match self.fs_case_inner(c) {
            Ok(s) => self.results.fs.push(s),
            Err(e) => {
                if !interrupted() {
                    self.fs_failure(key, mtu, w.name(), mem, format!("{e:#}"));
                }
            }
        }
        // (Interrupted: the file system is about to go, and writing its
        // deletions back through a busy link is what made Ctrl-C slow.)
        if !interrupted() {
            if let Err(e) = crate::remote_fs::clean_dir(&c.topo.client, &c.mp.join("w")) {
                self.say(&format!("lab: {e:#}"));
            }
        }
        self.progress.inc(1);
    }

    fn fs_case_inner(&mut self, c: &FsCaseRun) -> anyhow::Result<crate::fs::FsSample> {
        let &FsCaseRun { topo, link, key, target, daemon, rep, workload: w, mem, mp, raw_dev, kernel } = c;
        let fsp = self
            .plan
            .fs
            .clone()
            .ok_or_else(|| anyhow::anyhow!("no fs suite"))?;
        let local = *key == crate::fs::LOCAL;
        let dir = mp.join("w");
        // Over ssh the workload, its files and its cgroup are the client host's.
        let remote = topo.client.ssh();
        match remote {
            Some(h) => crate::remote_fs::prepare(h, w, &fsp, &dir)?,
            None => {
                std::fs::create_dir_all(&dir)?;
                prepare_fs_workload(w, &fsp, &dir)?;
            }
        }
        self.fs_serial += 1;
        let name = format!("bwlab-{}-{}", std::process::id(), self.fs_serial);
        let cg = match (remote, &self.client_cgroup) {
            (Some(h), Some(base)) => FsCgroup::Remote(crate::remote_fs::Cgroup::create(h, base, &name, mem)?),
            (Some(_), None) => anyhow::bail!("the client host's memory controller was not looked up"),
            (None, _) => {
                let (t, g) = crate::cgroup::create_tracked(Path::new(crate::cgroup::ROOT), &name, mem)?;
                FsCgroup::Local(t, g)
            }
        };
        let (busy, _) = self.wait_idle();
        let started_unix = unix_now();
        let wire0 = if local {
            None
        } else {
            Some(topo.client_counters(link)?)
        };
        let cpu_t0 = target.map(|t| t.cpu_seconds()).transpose()?;
        let cpu_d0 = daemon.and_then(|p| topo.client.process_cpu_seconds(p).ok());
        // A kernel initiator's work is the client machine's (see clients.rs).
        let machine0 = if kernel { Some(crate::clients::machine_cpu_seconds(&topo.client)?) } else { None };
        let (prog, args) = crate::fs::command(w, &fsp, &topo.client.lab_exe(&self.exe), &dir, raw_dev);
        // Room for making the file sets and Bonnie++'s passes over a slow link.
        let timeout = Duration::from_secs(fsp.runtime_s as u64 + 600);
        let run = match (&cg, remote) {
            (FsCgroup::Remote(g), Some(h)) => crate::remote_fs::run_in_cgroup(h, g, &dir, self.fsync.wrapper(), &prog, &args, w.name(), timeout),
            (FsCgroup::Local(_, g), _) => {
                // eatmydata execs the workload: the PID (cgroup, rusage) stays its.
                let mut cmd = match self.fsync.wrapper() {
                    Some(wrapper) => {
                        let mut c = Command::new(wrapper);
                        c.arg(&prog);
                        c
                    }
                    None => Command::new(&prog),
                };
                cmd.args(&args).current_dir(&dir);
                crate::runner::run_workload(cmd, w.name(), timeout, Some(&g.procs_file()))
            }
            (FsCgroup::Remote(_), None) => unreachable!("a remote cgroup is made for an ssh client only"),
        };
        let machine1 = if kernel { Some(crate::clients::machine_cpu_seconds(&topo.client)?) } else { None };
        let cpu_t1 = target.map(|t| t.cpu_seconds()).transpose()?;
        let cpu_d1 = daemon.and_then(|p| topo.client.process_cpu_seconds(p).ok());
        let wire1 = if local {
            None
        } else {
            Some(topo.client_counters(link)?)
        };
        let (ooms, peak) = match (cg, remote) {
            (FsCgroup::Remote(g), Some(h)) => g.finish(h)?,
            (FsCgroup::Local(t, g), _) => {
                let v = (g.oom_kills(), g.peak_bytes());
                registry().release(t)?;
                v
            }
            (FsCgroup::Remote(_), None) => unreachable!("a remote cgroup is made for an ssh client only"),
        };
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
        let delta = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => Some(b - a),
            _ => None,
        };
        Ok(crate::fs::FsSample {
            subject: key.clone(),
            link: self.shape.clone(),
            mtu: if local { None } else { Some(link.mtu) },
            client_mem: mem,
            workload: w.name().into(),
            repeat: rep,
            result,
            elapsed_s: f.elapsed_s,
            workload_cpu_s: f.cpu_s,
            // A kernel initiator's: the client machine's CPU beside the
            // workload's own (what the kernel did for it: initiator, block
            // layer, the file system's writeback).
            attach_cpu_s: match (machine0, machine1) {
                (Some(a), Some(b)) => Some(((b.0 + b.1) - (a.0 + a.1) - f.cpu_s).max(0.0)),
                _ => delta(cpu_d0, cpu_d1),
            },
            target_cpu_s: delta(cpu_t0, cpu_t1),
            wire: match (wire0, wire1) {
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
    fn print_fs_rows(&self, first: usize) {
        for line in bw_lab_report::rows::fs_rows(&self.results.fs[first..]) {
            self.say(&line);
        }
    }

    fn run_baseline(&mut self) -> anyhow::Result<()> {
        for (suite, w, runtime, repeats) in self.jobs() {
            let mut samples = vec![];
            for rep in 1..=repeats {
                if interrupted() {
                    anyhow::bail!("interrupted");
                }
                self.progress
                    .set_message(format!("local fio {} #{rep}", w.name));
                let (busy, waited) = self.wait_idle();
                let started_unix = unix_now();
                let machine0 = self.meter.start()?;
                match crate::runner::run_fio(
                    &self.backing,
                    &w,
                    runtime,
                    self.plan.params.size_bytes,
                ) {
                    Ok(bench) => {
                        let machine_cpu = self.meter.finish(machine0)?;
                        let s = Sample {
                            subject: SubjectKey::LocalFio,
                            mtu: None,
                            link: bw_lab_results::default_link(),
                            suite,
                            workload: w.clone(),
                            repeat: rep,
                            bench,
                            target_cpu_s: None,
                            wire: None,
                            busy_before: busy,
                            idle_wait_s: waited,
                            started_unix,
                            factors: Default::default(),
                            machine_cpu,
                        };
                        samples.push(s.clone());
                        self.results.samples.push(s);
                    }
                    Err(e) => {
                        if interrupted() {
                            anyhow::bail!("interrupted");
                        }
                        self.results.failures.push(Failure {
                            subject: SubjectKey::LocalFio.to_string(),
                            mtu: None,
                            workload: w.name.clone(),
                            reason: format!("{e:#}"),
                        });
                        self.say(&format!("lab: local fio {} failed: {e:#}", w.name));
                    }
                }
                self.progress.inc(1);
            }
            self.print_case_row(&SubjectKey::LocalFio, None, suite, &w, samples);
            self.save()?;
        }
        Ok(())
    }

    fn print_table_header(&self) {
        self.say(&bw_lab_report::rows::table_header());
    }

    fn print_case_row(
        &self,
        key: &SubjectKey,
        mtu: Option<u32>,
        suite: Suite,
        w: &Workload,
        samples: Vec<Sample>,
    ) {
        if samples.is_empty() {
            return;
        }
        let case = Case {
            key: bw_lab_results::accounting::CaseKey {
                suite,
                link: if mtu.is_some() {
                    self.shape.clone()
                } else {
                    bw_lab_results::default_link()
                },
                mtu,
                workload: w.name.clone(),
                subject: key.clone(),
                factors: samples[0].factors.clone(),
            },
            workload: w.clone(),
            samples,
        };
        self.say(&bw_lab_report::rows::case_row(&case));
    }
}
