//! The storage run: set up the topology and the backing file, then for
//! each link shape let every stage measure the network, and for each
//! link start every target once and run the stages that measure subjects
//! on them (see `crate::stage`: net, micro, sweep, fs), recording raw
//! samples as it goes; the local baselines run once after the links.

use crate::cleanup::{registry, Token};
use crate::hosts::host::Host;
use crate::plan::Plan;
use crate::stage::{LinkRun, RunContext, Stage};
use crate::network::topology::Topology;
use bw_lab_results::{utc_now, Results, Subject as SubjectRecord, SubjectKey, FORMAT};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;
use std::time::Duration;

pub struct LabRun {
    /// What the stages share.
    pub cx: RunContext,
    /// The plan's suites, in run order.
    stages: Vec<Box<dyn Stage>>,
    /// The plan as stored beside the record (`crate::resume`).
    pub stored: Option<crate::resume::stored_plan::StoredPlan>,
}

/// The storage suites (net, micro, sweep, fs) run as one: they share the
/// targets started per link, and every case takes turns over the subjects.
impl crate::suites::Suite for LabRun {
    fn estimate(&self) -> Option<String> {
        let plan = &self.cx.plan();
        Some(format!(
            "lab: {} runs planned ({} subjects, MTU {:?}, repeat {}), {}, output in {}",
            plan.total_runs(),
            plan.subjects().len() + plan.baseline as usize,
            plan.params.mtus,
            plan.params.repeat,
            plan.estimate().describe(),
            self.cx.out_dir().display()
        ))
    }

    fn run_cases(&mut self) -> anyhow::Result<()> {
        self.run_inner()
    }

    fn results(&mut self) -> &mut Results {
        self.cx.results_mut()
    }

    fn finish(&mut self) {
        self.cx.progress().finish_and_clear();
        self.cx.results_mut().ssh_commands = crate::hosts::ssh::invocations();
        crate::resume::run::end_start(&mut self.cx);
        if self.cx.remote().is_some() {
            let cases = self.cx.results().samples.len() + self.cx.results().fs.len() + self.cx.results().net.len();
            crate::cleanup::say(&format!("lab: {} ssh commands for {cases} samples", self.cx.results().ssh_commands));
        }
    }

    fn print_outcome(&self, ok: bool) {
        let report = self.cx.out_dir().join("report.html");
        if report.exists() {
            crate::cleanup::say(&format!("lab: results: {}", self.cx.out_dir().join("results.json").display()));
            crate::cleanup::say(&format!("lab: report:  {}", report.display()));
        }
        if let Some(res) = &self.cx.results().resumed {
            let by: Vec<String> = res.starts.iter().map(|s| format!("start {} measured {} cases ({})", s.n, s.cases_measured, s.ended)).collect();
            crate::cleanup::say(&format!("lab: a resumed run: {} (report.html says which)", by.join("; ")));
        }
        if ok {
            bw_lab_report::print_recommendations(self.cx.results());
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
        results.machine = crate::hosts::proc::machine_info();
        results.software = crate::subjects::software(&exe);
        let progress = ProgressBar::new(plan.total_runs());
        progress.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} runs, ~{eta} left  {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        let backing = PathBuf::from(format!("/dev/shm/bwlab-{}.img", std::process::id()));
        let stages = crate::stage::for_plan(&plan);
        LabRun { cx: RunContext::new(plan, exe, out, results, progress, backing), stages, stored: None }
    }

    fn run_inner(&mut self) -> anyhow::Result<()> {
        let cx = &mut self.cx;
        let (backing_token, beside_tokens) = fill_backing(cx)?;
        let topo = set_up_topology(cx)?;
        record_subjects(cx, &topo);
        for stage in &mut self.stages {
            stage.setup(cx, &topo)?;
        }
        let planned = crate::stage::cases::planned(&self.stages, cx, &topo.links);
        cx.set_planned(planned);
        crate::resume::run::begin_start(cx, self.stored.as_mut(), &topo)?;
        cx.save()?;
        cx.progress().enable_steady_tick(Duration::from_millis(200));
        cx.say(&bw_lab_report::rows::table_header());
        self.run_links(&topo)?;
        for stage in &mut self.stages {
            stage.after_links(&mut self.cx)?;
        }
        self.cx.progress().finish_and_clear();
        topo.teardown()?;
        let mut r = Ok(());
        for stage in &mut self.stages {
            r = r.and(stage.teardown());
        }
        r?;
        for t in beside_tokens {
            registry().release(t)?;
        }
        registry().release(backing_token)?;
        Ok(())
    }

    /// Every link shape in turn: shape the links, let the stages measure
    /// the network, then the subjects at every factor combination.
    fn run_links(&mut self, topo: &Topology) -> anyhow::Result<()> {
        let links = topo.links.clone();
        let measures_subjects = self.stages.iter().any(|s| s.needs_targets());
        for shape in self.cx.plan().links.clone() {
            // Shape every veth pair, then measure the network before storage.
            let mut qdiscs = vec![];
            // A real NIC is shaped only with --allow-nic-changes (the plan
            // refuses shapes between hosts without it).
            for link in &links {
                qdiscs.extend(crate::suites::net::iperf::apply_shape(topo, link, &shape)?);
            }
            self.cx.set_link_shape(&shape.name);
            for stage in &mut self.stages {
                stage.before_targets(&mut self.cx, topo, &shape)?;
            }
            if measures_subjects {
                let r = self.run_factors(topo);
                // Put the offloads back (and check them) even after a failure.
                let restored = topo.restore_offloads();
                r?;
                restored?;
                if !self.cx.plan().params.offloads.is_empty() {
                    self.cx.say(&format!("lab: offloads restored and checked on {} link ends", 2 * links.len()));
                }
            }
            for t in qdiscs {
                registry().release(t)?;
            }
        }
        Ok(())
    }

    /// Every (offload, digest) combination on every link; the fs suite
    /// runs at the first combination only (its cases carry no factors).
    fn run_factors(&mut self, topo: &Topology) -> anyhow::Result<()> {
        let cx = &mut self.cx;
        for (n, (offload, digest, tls)) in cx.plan().factor_combinations().into_iter().enumerate() {
            if offload != crate::network::offload::Offload::MtuFrames {
                topo.set_offload(offload)?;
            }
            cx.set_factors(offload, digest, tls);
            if cx.plan().factor_combinations().len() > 1 {
                let off = if offload.name().is_empty() { "default" } else { offload.name() };
                cx.say(&format!("lab: offload {off}, digest {}, tls {}", digest.name(), tls.name()));
            }
            for (i, link) in topo.links.iter().enumerate() {
                let first = i == 0 && n == 0;
                if crate::resume::run::link_done(cx, &self.stages, link, first, digest, tls) {
                    continue;
                }
                let mut run = LinkRun::start(cx, topo, link, first);
                // The idle baseline, with the targets up but nothing asked of them.
                let mut r = crate::hosts::machine_cpu::MachineMeter::new(&[&topo.target, &topo.client]).map(|m| cx.set_machine_meter(m));
                for stage in &mut self.stages {
                    if r.is_err() {
                        break;
                    }
                    r = stage.on_link(cx, &mut run);
                }
                run.stop(cx);
                r?;
            }
        }
        Ok(())
    }

}

/// Make the backing file (here, or on the target host) and track the
/// files serve keeps beside it; the tokens release them.
fn fill_backing(cx: &mut RunContext) -> anyhow::Result<(Token, Vec<Token>)> {
    let size = cx.plan().params.size_bytes;
    if let Some(path) = cx.remote().map(|r| r.target.run_path("/dev/shm", "backing.img")) {
        cx.set_backing(path);
    }
    let backing = cx.backing().to_path_buf();
    let on = cx.remote().map(|r| format!(" on {}", r.target.name())).unwrap_or_default();
    cx.say(&format!(
        "lab: filling backing file {}{on} ({} MiB) ...",
        backing.display(),
        size >> 20
    ));
    // Without a remote target, the target's namespace shares this
    // machine's files.
    let target = cx.remote().map_or(Host::Local, |r| r.target.clone());
    let backing_token = target.fill_random(&backing, size)?;
    // serve keeps a file volume's reservations beside it (FILE.pr and
    // its lock, bw_reservation::FileStore) where only root may write,
    // as /dev/shm is in some guests: they go with the backing file.
    let mut beside_tokens = Vec::new();
    for suffix in [".pr", ".pr.lock"] {
        let mut p = backing.clone().into_os_string();
        p.push(suffix);
        let p = PathBuf::from(p);
        beside_tokens.push(target.track_file(&p)?);
    }
    cx.results_mut().params.backing = format!(
        "{}{on} ({} MiB, tmpfs) shared by every target{}",
        backing.display(),
        size >> 20,
        if cx.remote().is_some() { "" } else { " and the local baseline" }
    );
    Ok((backing_token, beside_tokens))
}

/// The namespaces and veths of a run in one box, or the hosts' NICs of a
/// run across machines (whose MTU the run then measures at).
fn set_up_topology(cx: &mut RunContext) -> anyhow::Result<Topology> {
    let connected = cx.remote().map(Topology::connect).transpose()?;
    let topo = match connected {
        None => {
            cx.say("lab: creating namespaces and veth pairs ...");
            let cc = Some(cx.plan().params.tcp_congestion.clone()).filter(|c| !c.is_empty());
            if let (Some(cc), bw_net::tcp::Congestion::Auto) = (&cc, &cx.plan().tcp_congestion) {
                cx.say(&format!(
                    "lab: TCP congestion control {cc} in the namespaces: the system's {} paces by timer on links without a qdisc (--tcp-congestion system keeps it)",
                    cx.results().machine.tcp_congestion
                ));
            }
            Topology::setup(&cx.plan().params.mtus, cc.as_deref())?
        }
        Some(t) => {
            let l = &t.links[0];
            cx.say(&format!(
                "lab: target {} ({}, {}) <- client {} ({}, {}), MTU {}",
                t.target.name(), l.target_ip, l.target_if, t.client.name(), l.client_ip, l.client_if, l.mtu
            ));
            // The run measures at the NICs' MTU (or the one --mtu set).
            cx.measure_at_mtu(l.mtu);
            for (role, host, nic) in [("target", &t.target, &l.target_if), ("client", &t.client, &l.client_if)] {
                let info = crate::hosts::remote::host_info(host, role, nic)?;
                if info.emulated {
                    cx.say(&format!("lab: the {role} host {} is a virtual machine (hypervisor flag): its timings are the VM's", host.name()));
                }
                cx.results_mut().hosts.push(info);
            }
            t
        }
    };
    cx.results_mut().params.veth_offloads_off = topo.offloads_off;
    cx.results_mut().params.veth_gro = topo.receives_through_napi();
    Ok(topo)
}

/// The run's subjects, each client's of each target, and the local
/// baselines, as records with nothing measured yet.
fn record_subjects(cx: &mut RunContext, topo: &Topology) {
    if cx.remote().is_none() && cx.plan().subjects().iter().any(|s| s.address().serves_files()) {
        // In one box the kernel NFS client needs no initiator of its
        // own: where this machine has one, it measures the file peers.
        if crate::subjects::kernel_nfs::available_here() {
            cx.add_clients(crate::subjects::kernel_nfs::VERSIONS.map(crate::subjects::clients::ClientKind::KernelNfs));
        } else {
            cx.say("lab: this machine has no kernel NFS client (mount.nfs and the nfs module): the peers serving files are measured through nfs:// alone");
        }
    }
    let clients = cx.clients();
    let subjects = cx
        .plan()
        .subjects()
        .into_iter()
        .flat_map(|s| clients.iter().filter(move |c| c.serves(s)).map(move |c| (s, *c)))
        .map(|(s, c)| SubjectRecord {
            // The user's own storage, shown as such.
            external: s.external().is_some(),
            ..SubjectRecord::new(c.key(s), s.address().protocol_name(), s.target_name(), &c.initiator(s, &topo.client))
        })
        .collect();
    cx.results_mut().subjects = subjects;
    if cx.plan().baseline && !(cx.plan().micro.is_empty() && cx.plan().sweep.is_empty()) {
        cx.results_mut().subjects.push(SubjectRecord::new(SubjectKey::LocalFio, "local", "tmpfs file", "fio (io_uring)"));
    }
    if cx.plan().fs.is_some() && cx.plan().baseline {
        cx.results_mut().subjects.push(SubjectRecord::new(crate::suites::fs::workloads::LOCAL, "local", "ext4 on a loop device over the backing file", "the kernel (no network)"));
    }
}

