//! The micro and sweep suites as stages: each workload runs every live
//! subject once per repetition, one at a time, in an order rotated between
//! repetitions, so all subjects see the same machine state (this
//! machine's speed drifts by tens of percent over minutes, and measuring
//! subjects one after another turned that drift into false differences).
//! After the links, the same workloads with fio on the backing file: the
//! local, no-network baseline.

use crate::stage::link::{LiveSubject, MAX_CONSECUTIVE_FAILURES};
use crate::stage::context::RunContext;
use crate::stage::hooks::Stage;
use crate::stage::link::LinkRun;
use crate::cleanup::interrupted;
use crate::subjects::process::TargetProcess;
use crate::network::topology::{Link, Topology};
use bw_lab_results::net::WireCounters;
use bw_lab_results::{unix_now, Failure, Sample, SubjectKey, Suite, Workload};

/// Micro or sweep: the suite's workloads over the live subjects.
pub struct BenchStage {
    pub suite: Suite,
}

/// One workload of a suite: how long each run lasts and how often it repeats.
struct Job {
    workload: Workload,
    runtime_s: u32,
    repeats: u32,
}

impl BenchStage {
    fn jobs(&self, cx: &RunContext) -> Vec<Job> {
        let p = &cx.plan().params;
        let (workloads, runtime_s, repeats) = match self.suite {
            Suite::Micro => (&cx.plan().micro, p.runtime_s, p.repeat),
            Suite::Sweep => (&cx.plan().sweep, p.sweep_runtime_s, p.sweep_repeats()),
        };
        workloads.iter().map(|w| Job { workload: w.clone(), runtime_s, repeats }).collect()
    }
}

impl BenchStage {
    /// The case of workload `w` on a link (see `crate::resume::case`).
    fn case(&self, at: &crate::resume::case::At, mtu: u32, w: &Workload) -> String {
        crate::resume::case::bench(self.suite, &w.name, at, mtu)
    }
}

impl Stage for BenchStage {
    fn needs_targets(&self) -> bool {
        true
    }

    fn cases_on_link(&self, cx: &RunContext, at: &crate::resume::case::At, link: &Link, _first: bool) -> Vec<String> {
        self.jobs(cx).iter().map(|j| self.case(at, link.mtu, &j.workload)).collect()
    }

    fn cases_after_links(&self, cx: &RunContext) -> Vec<String> {
        if !cx.plan().baseline {
            return vec![];
        }
        self.jobs(cx).iter().map(|j| crate::resume::case::local(self.suite, &j.workload.name)).collect()
    }

    fn on_link(&mut self, cx: &mut RunContext, run: &mut LinkRun) -> anyhow::Result<()> {
        let (topo, link) = (run.topo, run.link);
        let per_subject = cx.runs_per_subject(link.mtu);
        let suite = self.suite;
        let (procs, live) = (&mut run.procs, &mut run.live);
        let n = live.len();
        // The write cases a subject may not take (an external block subject
        // without --allow-writes), named once per subject.
        let mut skipped: Vec<Vec<String>> = vec![vec![]; n];
        for Job { workload: w, runtime_s, repeats } in self.jobs(cx) {
            if !cx.begin_case(&self.case(&cx.at(), link.mtu, &w)) {
                // Finished by an earlier start of this run: kept.
                for s in live.iter_mut().filter(|s| !s.gave_up) {
                    cx.progress().inc(repeats as u64);
                    s.done += repeats as u64;
                }
                continue;
            }
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
                            cx.progress().inc(repeats as u64);
                            live[i].done += repeats as u64;
                        }
                        continue;
                    }
                    if let Some(target) = live[i].proc.map(|p| &mut procs[p]) {
                        if !target.alive() {
                            let why = format!("{} died: {}", target.name, target.log_tail());
                            live[i].give_up(cx, per_subject, link.mtu, &w.name, why, false);
                            continue;
                        }
                    }
                    cx.progress().set_message(format!("{key} MTU {} {} #{rep}", link.mtu, w.name));
                    let case = Networked { topo, link, suite, workload: &w, rep, runtime_s, target: live[i].proc.map(|p| &procs[p]) };
                    match case.run(cx, &live[i]) {
                        Ok(s) => {
                            live[i].consecutive_failures = 0;
                            samples[i].push(s.clone());
                            cx.push_sample(s);
                        }
                        Err(e) => {
                            if interrupted() {
                                anyhow::bail!("interrupted");
                            }
                            live[i].consecutive_failures += 1;
                            cx.push_failure(Failure {
                                subject: key.clone().into(),
                                mtu: Some(link.mtu),
                                workload: w.name.clone(),
                                reason: format!("{e:#}"),
                            });
                            cx.say(&format!("lab: {key} {} run {rep} failed: {e:#}", w.name));
                        }
                    }
                    cx.progress().inc(1);
                    live[i].done += 1;
                    if live[i].consecutive_failures >= MAX_CONSECUTIVE_FAILURES {
                        let reason = format!("gave up after {MAX_CONSECUTIVE_FAILURES} failed runs in a row");
                        live[i].give_up(cx, per_subject, link.mtu, &w.name, reason, true);
                    }
                }
            }
            for (s, got) in live.iter().zip(samples) {
                if !got.is_empty() {
                    cx.print_case_row(&s.key, Some(link.mtu), suite, &w, got);
                }
            }
            cx.end_case();
            cx.save()?;
        }
        for (s, cases) in live.iter().zip(skipped) {
            if let Some(why) = s.subject.external().and_then(|e| e.skipped_writes(&cases)) {
                cx.note_skipped(&s.key, &why);
            }
        }
        Ok(())
    }

    /// fio on the backing file, every workload of the suite.
    fn after_links(&mut self, cx: &mut RunContext) -> anyhow::Result<()> {
        if !cx.plan().baseline {
            return Ok(());
        }
        let suite = self.suite;
        for Job { workload: w, runtime_s, repeats } in self.jobs(cx) {
            if !cx.begin_case(&crate::resume::case::local(suite, &w.name)) {
                cx.progress().inc(repeats as u64);
                continue;
            }
            let mut samples = vec![];
            for rep in 1..=repeats {
                if interrupted() {
                    anyhow::bail!("interrupted");
                }
                cx.progress().set_message(format!("local fio {} #{rep}", w.name));
                let (busy, waited) = cx.wait_idle();
                let started_unix = unix_now();
                let machine0 = cx.machine_meter().start()?;
                match crate::suites::runner::run_fio(cx.backing(), &w, runtime_s, cx.plan().params.size_bytes) {
                    Ok(bench) => {
                        let machine_cpu = cx.machine_meter().finish(machine0)?;
                        let s = Sample {
                            subject: SubjectKey::LocalFio,
                            mtu: None,
                            link: bw_lab_results::LinkName::none(),
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
                        cx.push_sample(s);
                    }
                    Err(e) => {
                        if interrupted() {
                            anyhow::bail!("interrupted");
                        }
                        cx.push_failure(Failure {
                            subject: SubjectKey::LocalFio.into(),
                            mtu: None,
                            workload: w.name.clone(),
                            reason: format!("{e:#}"),
                        });
                        cx.say(&format!("lab: local fio {} failed: {e:#}", w.name));
                    }
                }
                cx.progress().inc(1);
            }
            cx.print_case_row(&SubjectKey::LocalFio, None, suite, &w, samples);
            cx.end_case();
            cx.save()?;
        }
        Ok(())
    }
}

/// Which record layer each end of a TLS connection had: the target's
/// (blockwire serve's log says; nvmet's are always the kernel's, after
/// tlshd's handshake) and blockwire's client's (its report says), each a
/// datapath of the subject as blockwire's client measures it (`s`).
fn record_tls(cx: &mut RunContext, s: &LiveSubject, target: Option<&TargetProcess>, described: &str) {
    use crate::subjects::{blockwire, Subject};
    let client = blockwire::client_tls(described);
    let target_side = match s.subject {
        Subject::Blockwire(_) => target.and_then(|t| blockwire::tls_records(&t.log_tail())),
        _ => client.as_ref().map(|(suite, _)| format!("TLS {suite} ktls records (tlshd handshake)")),
    };
    if let Some(r) = cx.subject_record_mut(&s.key) {
        for d in target_side.into_iter().chain(client.map(|(_, layer)| format!("client {layer} records"))) {
            bw_lab_results::joined::add_once(&mut r.target_datapath, &d);
        }
    }
}

/// One run of a workload on a networked subject.
struct Networked<'a> {
    topo: &'a Topology,
    link: &'a Link,
    suite: Suite,
    workload: &'a Workload,
    rep: u32,
    runtime_s: u32,
    /// None: an external subject (no target of the lab's, not on its link).
    target: Option<&'a TargetProcess>,
}

/// Whether workload `w` writes (sequential or random writes, or a mix).
fn writes(w: &Workload) -> bool {
    w.rw != "read" && w.rw != "randread"
}

impl Networked<'_> {
    fn run(&self, cx: &mut RunContext, s: &LiveSubject) -> anyhow::Result<Sample> {
        let Networked { topo, link, suite, workload: w, rep, runtime_s: runtime, target } = *self;
        let (busy, waited) = cx.wait_idle();
        let started_unix = unix_now();
        let wire0 = target.map(|_| topo.client_counters(link)).transpose()?;
        let cpu0 = target.map(|t| t.cpu_seconds()).transpose()?;
        let machine0 = cx.machine_meter().start()?;
        let bench = if s.kernel.is_some() {
            // `url` is the block device; the initiator's work is the kernel's.
            let m0 = crate::subjects::clients::machine_cpu_seconds(&topo.client)?;
            let mut b = crate::suites::runner::run_fio_on_device(&topo.client, &s.url, w, runtime, cx.plan().params.size_bytes)?;
            let m1 = crate::subjects::clients::machine_cpu_seconds(&topo.client)?;
            (b.cpu_user_s, b.cpu_sys_s) = ((m1.0 - m0.0).max(0.0), (m1.1 - m0.1).max(0.0));
            b
        } else {
            let client = if target.is_some() { topo.client.clone() } else { crate::stage::link::external_client(topo) };
            let mut extra = cx.digest().bench_args().to_vec();
            let mut url = s.url.clone();
            let tls = cx.tls() == crate::network::offload::Tls::On && s.subject.serves_tls();
            if tls {
                url += "?tls";
                extra.extend(crate::subjects::blockwire::tls_bench_args());
            }
            let (b, described) = crate::suites::runner::run_bench(cx.exe(), &client, &url, w, runtime, cx.plan().params.size_bytes, &extra)?;
            if tls {
                record_tls(cx, s, target, &described);
            }
            b
        };
        let machine_cpu = cx.machine_meter().finish(machine0)?;
        let cpu1 = target.map(|t| t.cpu_seconds()).transpose()?;
        let wire1 = target.map(|_| topo.client_counters(link)).transpose()?;
        Ok(Sample {
            subject: s.key.clone(),
            mtu: Some(link.mtu),
            link: cx.link_shape().clone(),
            suite,
            workload: w.clone(),
            repeat: rep,
            bench,
            target_cpu_s: cpu0.zip(cpu1).map(|(a, b)| b - a),
            wire: wire0.zip(wire1).map(|(a, b)| WireCounters::delta(&a, &b)),
            busy_before: busy,
            idle_wait_s: waited,
            started_unix,
            factors: cx.factors().clone(),
            machine_cpu,
        })
    }
}
