//! What every stage of a storage run shares: the plan, the results being
//! recorded (and the record they go to as they are measured, which a
//! resumed run reads back: `crate::resume`), the progress bar, the backing
//! file, the hosts, and the link shape and factors being measured now.

use crate::plan::Plan;
use crate::network::topology::Remote;
use bw_lab_results::accounting::Case;
use bw_lab_results::{Failure, LinkName, Results, Sample, Suite, SubjectKey, Workload};
use crate::resume::book::Book;
use crate::resume::case::At;
use crate::resume::record::Entry;
use crate::hosts::machine_cpu::MachineMeter;
use crate::network::offload::{Digest, Offload, Tls};
use crate::subjects::clients::ClientKind;
use crate::subjects::Subject;
use indicatif::ProgressBar;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What the stages share, behind methods that say what each gives: the
/// plan and the paths are read-only once the run is set up; where the run
/// is now (link shape, factors) is set by the run's loop
/// (`crate::orchestrate`); results go in through the `push_*`, `record_*`
/// and `mark_*` methods so that the run's record (`Book`) sees each.
pub struct RunContext {
    plan: Plan,
    /// The blockwire binary the targets and clients run.
    exe: PathBuf,
    /// The run's output directory (results.json, report.html, the record).
    out: PathBuf,
    results: Results,
    /// The file every target serves (and the local baselines measure).
    backing: PathBuf,
    progress: ProgressBar,
    idle_spent: f64,
    /// The link shape being measured.
    shape: LinkName,
    /// The hosts of a run across machines (None: namespaces on this one).
    remote: Option<Remote>,
    /// The clients the subjects are measured with: on a remote client
    /// host `--clients`, narrowed to what it has; in one box blockwire's,
    /// and the kernel NFS client where this machine has one.
    clients: Vec<ClientKind>,
    /// The offload study's factors being measured, as recorded, and the
    /// digest and TLS settings they name.
    factors: bw_lab_results::Factors,
    digest: Digest,
    tls: Tls,
    /// Whole-machine CPU of the target and client hosts' machines.
    meter: MachineMeter,
    /// The run's record: what is measured goes there as it is, and a
    /// resumed run skips the cases earlier starts finished.
    book: Book,
    /// Every case of the plan, in run order (known once the run is set up).
    planned: Vec<String>,
}

impl RunContext {
    pub fn new(plan: Plan, exe: PathBuf, out: PathBuf, results: Results, progress: ProgressBar, backing: PathBuf) -> RunContext {
        RunContext {
            plan,
            exe,
            out,
            results,
            backing,
            progress,
            idle_spent: 0.0,
            shape: LinkName::none(),
            remote: None,
            clients: vec![ClientKind::Blockwire],
            factors: Default::default(),
            digest: Default::default(),
            tls: Default::default(),
            meter: Default::default(),
            book: Book::none(),
            planned: vec![],
        }
    }

    /// Where in the plan the run is now (link shape, factors).
    pub fn at(&self) -> At {
        At { shape: self.shape.clone(), factors: self.factors.clone() }
    }

    /// Begin `case`; false when an earlier start of a resumed run finished
    /// it (its samples are kept: skip it).
    pub fn begin_case(&mut self, case: &str) -> bool {
        self.book.begin(case)
    }

    /// The case begun last is whole (a resumed run keeps it).
    pub fn end_case(&mut self) {
        self.book.done();
    }

    pub fn push_sample(&mut self, s: Sample) {
        self.book.effect(Entry::Sample(s.clone()));
        self.results.samples.push(s);
    }

    pub fn push_fs(&mut self, s: bw_lab_results::fs::FsSample) {
        self.book.effect(Entry::Fs(s.clone()));
        self.results.fs.push(s);
    }

    pub fn push_net(&mut self, samples: Vec<bw_lab_results::net::NetSample>) {
        for s in samples {
            self.book.effect(Entry::Net(s.clone()));
            self.results.net.push(s);
        }
    }

    pub fn push_failure(&mut self, f: Failure) {
        self.book.effect(Entry::Failure(f.clone()));
        self.results.failures.push(f);
    }

    /// The results to write: this start's, or for a resumed run the whole
    /// run's, put together from its record.
    pub fn results_to_save(&self) -> Results {
        if self.book.resumed() {
            self.book.assemble(&self.results, &self.planned)
        } else {
            self.results.clone()
        }
    }

    pub fn say(&self, line: &str) {
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
    pub fn wait_idle(&mut self) -> (f64, f64) {
        let p = &self.plan.params;
        let left = (p.idle_budget_s - self.idle_spent).max(0.0);
        let max = p.idle_max_wait_s.min(left);
        let (busy, waited) = crate::hosts::proc::wait_idle(p.idle_threshold, Duration::from_secs_f64(max));
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

    pub fn save(&mut self) -> anyhow::Result<()> {
        self.book.subjects(&self.results.subjects);
        if self.book.resumed() {
            return self.results_to_save().save(&self.out.join("results.json"));
        }
        self.results.save(&self.out.join("results.json"))
    }

    /// The clients of the run.
    pub fn clients(&self) -> Vec<ClientKind> {
        self.clients.clone()
    }

    /// Clients this machine adds to a run in one box (the kernel NFS
    /// client's versions).
    pub fn add_clients(&mut self, more: impl IntoIterator<Item = ClientKind>) {
        self.clients.extend(more);
    }

    /// A run across machines: its hosts, and the clients its client host has.
    pub fn run_across(&mut self, hosts: Remote, clients: Vec<ClientKind>) {
        self.remote = Some(hosts);
        self.clients = clients;
    }

    /// The hosts of a run across machines (None: namespaces on this one).
    pub fn remote(&self) -> Option<&Remote> {
        self.remote.as_ref()
    }

    /// What the run will do.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The run measures at the NICs' MTU (between hosts): the plan's and
    /// the recorded parameters say so.
    pub fn measure_at_mtu(&mut self, mtu: u32) {
        self.plan.params.mtus = vec![mtu];
        self.results.params.mtus = vec![mtu];
    }

    /// The blockwire binary the targets and clients run.
    pub fn exe(&self) -> &Path {
        &self.exe
    }

    /// The run's output directory.
    pub fn out_dir(&self) -> &Path {
        &self.out
    }

    /// The file every target serves (and the local baselines measure).
    pub fn backing(&self) -> &Path {
        &self.backing
    }

    /// The backing file is on the target host, at `path`.
    pub fn set_backing(&mut self, path: PathBuf) {
        self.backing = path;
    }

    /// The run's progress bar (runs done, what runs now).
    pub fn progress(&self) -> &ProgressBar {
        &self.progress
    }

    /// The link shape being measured.
    pub fn link_shape(&self) -> &LinkName {
        &self.shape
    }

    pub fn set_link_shape(&mut self, name: &LinkName) {
        self.shape = name.clone();
    }

    /// The factors being measured, as a sample records them.
    pub fn factors(&self) -> &bw_lab_results::Factors {
        &self.factors
    }

    /// The digest setting being measured.
    pub fn digest(&self) -> Digest {
        self.digest
    }

    /// The TLS setting being measured.
    pub fn tls(&self) -> Tls {
        self.tls
    }

    /// Measure at these factors from now on.
    pub fn set_factors(&mut self, offload: Offload, digest: Digest, tls: Tls) {
        self.factors = crate::network::offload::recorded(offload, digest, tls);
        self.digest = digest;
        self.tls = tls;
    }

    /// Whole-machine CPU of the target and client hosts' machines.
    pub fn machine_meter(&self) -> &MachineMeter {
        &self.meter
    }

    pub fn set_machine_meter(&mut self, meter: MachineMeter) {
        self.meter = meter;
    }

    /// What the run has recorded so far (this start's).
    pub fn results(&self) -> &Results {
        &self.results
    }

    /// The results, for the run's setup and end (`crate::orchestrate`,
    /// `crate::resume::run`); a stage records through `push_*`,
    /// `record_*` and `mark_*`.
    pub fn results_mut(&mut self) -> &mut Results {
        &mut self.results
    }

    /// The record of subject `key`.
    pub fn subject_record_mut(&mut self, key: &SubjectKey) -> Option<&mut bw_lab_results::Subject> {
        self.results.subjects.iter_mut().find(|r| &r.key == key)
    }

    /// The run's record (`crate::resume`).
    pub fn book(&self) -> &Book {
        &self.book
    }

    pub fn book_mut(&mut self) -> &mut Book {
        &mut self.book
    }

    /// The record this run keeps (a fresh one, or a resumed run's).
    pub fn keep_book(&mut self, book: Book) {
        self.book = book;
    }

    /// Every case of the plan, in run order.
    pub fn planned(&self) -> &[String] {
        &self.planned
    }

    pub fn set_planned(&mut self, cases: Vec<String>) {
        self.planned = cases;
    }

    /// The AoE datapath target `s` uses, on every client's subject of it
    /// (each MTU's, when they differ).
    pub fn record_target_datapath(&mut self, s: Subject, datapath: &str) {
        for c in self.clients().into_iter().filter(|c| c.serves(s)) {
            let key = c.key(s);
            if let Some(r) = self.subject_record_mut(&key) {
                bw_lab_results::joined::add_once(&mut r.target_datapath, datapath);
            }
        }
    }

    /// How target `s` serves (a kernel target's version and settings), on
    /// every client's subject of it.
    pub fn record_settings(&mut self, s: Subject, settings: &str) {
        for c in self.clients().into_iter().filter(|c| c.serves(s)) {
            let key = c.key(s);
            if let Some(r) = self.subject_record_mut(&key) {
                r.settings = Some(settings.to_string());
            }
        }
    }

    /// Cases not run on subject `key`, and why: said once, kept on its record.
    pub fn note_skipped(&mut self, key: &SubjectKey, why: &str) {
        self.say(&format!("lab: {key}: {why}"));
        if let Some(r) = self.subject_record_mut(key) {
            // (said again by a resumed run's start)
            bw_lab_results::joined::add_once(&mut r.skipped, why);
        }
    }

    /// A target that did not start: every client's subject of it.
    pub fn mark_target_unavailable(&mut self, s: Subject, mtu: u32, reason: String) {
        for c in self.clients().into_iter().filter(|c| c.serves(s)) {
            self.mark_unavailable(&c.key(s), mtu, reason.clone());
        }
    }

    pub fn mark_unavailable(&mut self, key: &SubjectKey, mtu: u32, reason: String) {
        self.say(&format!("lab: {key} at MTU {mtu}: unavailable: {reason}"));
        if let Some(s) = self.subject_record_mut(key) {
            if s.unavailable.is_none() {
                s.unavailable = Some(reason.clone());
            }
        }
        self.push_failure(Failure { subject: key.clone().into(), mtu: Some(mtu), workload: String::new(), reason });
        // Its runs will not happen: keep the progress bar honest.
        let skipped = self.runs_per_subject(mtu);
        self.progress.inc(skipped);
    }

    /// The runs one networked subject makes at `mtu` (micro, sweep, and
    /// at the first MTU the fs suite's).
    pub fn runs_per_subject(&self, mtu: u32) -> u64 {
        let p = &self.plan.params;
        let fs = match &self.plan.fs {
            Some(f) if p.mtus.first() == Some(&mtu) => self.plan.fs_cases(false).len() as u64 * f.repeat as u64,
            _ => 0,
        };
        self.plan.micro.len() as u64 * p.repeat as u64 + self.plan.sweep.len() as u64 * p.sweep_repeats() as u64 + fs
    }

    /// A case's row in the terminal (none without samples).
    pub fn print_case_row(&self, key: &SubjectKey, mtu: Option<u32>, suite: Suite, w: &Workload, samples: Vec<Sample>) {
        if samples.is_empty() {
            return;
        }
        let case = Case {
            key: bw_lab_results::accounting::CaseKey {
                suite,
                link: if mtu.is_some() { self.shape.clone() } else { LinkName::none() },
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
