//! The bookkeeping that makes a run resumable: every case begun, every
//! sample and failure as it is measured, every case finished goes into the
//! run's record (`super::record`), and a resumed run reads it back: the
//! cases finished in earlier starts are not run again, and the results are
//! put together from the record ([`Book::assemble`]): for each case the
//! samples of the start that finished it, in the plan's order, so a resumed
//! run writes the results.json, CSV and report an uninterrupted one would
//! have (and says which start measured what).

use super::case::is_case;
use super::record::{Entry, Record, StartEntry};
use bw_lab_results::resumed::{CaseOrigin, Resumed, SetAside, Start};
use bw_lab_results::{Results, Subject};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

pub struct Book {
    /// None: this run keeps no record (nothing to resume it from).
    record: Option<Record>,
    /// Every entry: earlier starts' (read back) and this start's.
    entries: Vec<Entry>,
    /// The number of this start (1 for a run's first).
    start: u32,
    /// The cases earlier starts finished (kept, not run again).
    done_before: BTreeSet<String>,
    /// The case begun and not finished yet.
    open: Option<String>,
    /// The subjects' records last written.
    subjects: Option<Vec<Subject>>,
    /// Bytes of a line an earlier start's end cut short, set aside.
    pub torn_bytes: usize,
    /// A write to the record failed (said once).
    failed: bool,
    /// This start wrote its [`Entry::Start`].
    began: bool,
}

impl Book {
    /// A run that keeps no record.
    pub fn none() -> Book {
        Book { record: None, entries: vec![], start: 1, done_before: BTreeSet::new(), open: None, subjects: None, torn_bytes: 0, failed: false, began: false }
    }

    /// A new run's record in `dir`.
    pub fn fresh(dir: &Path) -> anyhow::Result<Book> {
        Ok(Book { record: Some(Record::create(dir)?), ..Book::none() })
    }

    /// The record of the run in `dir`, read back to go on with it.
    pub fn reopen(dir: &Path) -> anyhow::Result<Book> {
        let (record, read) = Record::reopen(dir)?;
        let replayed = replay(&read.entries);
        let start = replayed.starts.iter().map(|s| s.n).max().unwrap_or(0) + 1;
        let done_before = replayed.finished.iter().map(|f| f.case.clone()).collect();
        let subjects = replayed.subjects.clone();
        Ok(Book { record: Some(record), entries: read.entries, start, done_before, open: None, subjects, torn_bytes: read.torn_bytes, failed: false, began: false })
    }

    /// Whether this start goes on with a run an earlier start began.
    pub fn resumed(&self) -> bool {
        self.start > 1
    }

    pub fn start_number(&self) -> u32 {
        self.start
    }

    /// Whether an earlier start finished `case`.
    pub fn is_done(&self, case: &str) -> bool {
        self.done_before.contains(case)
    }

    /// The subjects' records as the earlier starts left them.
    pub fn restored_subjects(&self) -> Option<&Vec<Subject>> {
        self.subjects.as_ref().filter(|_| self.resumed())
    }

    fn write(&mut self, e: Entry) {
        if let Some(r) = &mut self.record {
            if let Err(err) = r.append(&e) {
                if !self.failed {
                    crate::cleanup::say(&format!("lab: {err:#}: this run cannot be resumed past here"));
                    self.failed = true;
                }
            }
        }
        self.entries.push(e);
    }

    pub fn begin_start(&mut self, s: StartEntry) {
        self.write(Entry::Start(StartEntry { n: self.start, ..s }));
        self.began = true;
    }

    /// Whether this start wrote its beginning (it got as far as measuring).
    pub fn began(&self) -> bool {
        self.began
    }

    /// Begin `case`; false when an earlier start finished it (it is kept,
    /// and not run again). A link's targets starting ([`super::case::targets`])
    /// always begins: what it records is replaced by this start's.
    pub fn begin(&mut self, case: &str) -> bool {
        if is_case(case) && self.is_done(case) {
            return false;
        }
        self.open = Some(case.to_string());
        self.write(Entry::Begin { case: case.to_string() });
        true
    }

    /// The case begun last is whole.
    pub fn done(&mut self) {
        if let Some(case) = self.open.take() {
            self.write(Entry::Done { case });
        }
    }

    /// A sample, an iperf3 run or a failure, as it is measured.
    pub fn effect(&mut self, e: Entry) {
        if self.open.is_none() {
            log::warn!("a result outside any case: {e:?}");
        }
        self.write(e);
    }

    /// The subjects' records, when they changed since last written.
    pub fn subjects(&mut self, now: &[Subject]) {
        if self.subjects.as_deref() != Some(now) {
            self.subjects = Some(now.to_vec());
            self.write(Entry::Subjects(now.to_vec()));
        }
    }

    /// The start ends by itself (`how`: completed, or why it stopped).
    pub fn end(&mut self, how: &str, ssh_commands: u64) {
        self.write(Entry::End { how: how.to_string(), ssh_commands });
    }

    /// The results of the whole run so far: `base` (this start's) with its
    /// samples, fs and net runs and failures taken from the record, each
    /// case from the start that finished it, in the plan's order, and the
    /// case this start is measuring now after them; the run's first start
    /// and machine; and which start measured what (`planned`: every case).
    pub fn assemble(&self, base: &Results, planned: &[String]) -> Results {
        let rp = replay(&self.entries);
        let mut r = base.clone();
        r.samples.clear();
        r.fs.clear();
        r.net.clear();
        r.failures.clear();
        for f in &rp.finished {
            apply(&mut r, &f.effects);
        }
        if let Some(open) = rp.unfinished.last().filter(|u| u.start == self.start && self.open.as_ref() == Some(&u.case)) {
            apply(&mut r, &open.effects);
        }
        if let Some(first) = rp.starts.first() {
            r.started_utc = first.utc.clone();
            r.machine = first.machine.clone();
            r.software = first.software.clone();
            if !first.hosts.is_empty() {
                r.hosts = first.hosts.clone();
            }
        }
        r.ssh_commands = base.ssh_commands + rp.ends.iter().filter(|(n, _)| **n != self.start).map(|(_, e)| e.1).sum::<u64>();
        let by_case: BTreeMap<&str, u32> = rp.finished.iter().map(|f| (f.case.as_str(), f.start)).collect();
        let still_running = base.finished_utc.is_empty();
        let starts = rp
            .starts
            .iter()
            .map(|s| Start {
                n: s.n,
                started_utc: s.utc.clone(),
                ended: match rp.ends.get(&s.n) {
                    Some((how, _)) => how.clone(),
                    None if s.n == self.start && still_running => "still running".into(),
                    None if s.n == self.start => base.aborted.clone().unwrap_or_else(|| "completed".into()),
                    None => "ended without a word (killed, crashed, or the machine went down)".into(),
                },
                pid: s.pid,
                boot_id: s.boot_id.clone(),
                hostname: s.machine.hostname.clone(),
                differences: rp.starts.first().map(|f| differences(f, s)).unwrap_or_default(),
                cases_measured: rp.finished.iter().filter(|f| f.start == s.n && is_case(&f.case)).count() as u32,
                cases_skipped: rp.skipped_at.get(&s.n).copied().unwrap_or(0),
                set_aside: rp
                    .unfinished
                    .iter()
                    .filter(|u| u.start == s.n && is_case(&u.case))
                    .filter(|u| !(u.start == self.start && self.open.as_ref() == Some(&u.case)))
                    .map(|u| SetAside { case: u.case.clone(), samples: u.samples() })
                    .collect(),
            })
            .collect();
        let cases = planned.iter().map(|c| CaseOrigin { case: c.clone(), start: by_case.get(c.as_str()).copied().unwrap_or(0) }).collect();
        r.resumed = Some(Resumed { starts, cases });
        r
    }

    /// What the terminal says as a resumed start begins: what is kept,
    /// what runs again, what differs.
    pub fn summary(&self, planned: &[String], now: &StartEntry) -> Vec<String> {
        let rp = replay(&self.entries);
        let kept = planned.iter().filter(|c| self.is_done(c)).count();
        let mut lines = vec![format!(
            "lab: resuming (start {}): {kept} of {} cases finished in earlier starts are kept and not run again; {} to measure",
            self.start,
            planned.len(),
            planned.len() - kept
        )];
        for u in rp.unfinished.iter().filter(|u| is_case(&u.case) && !self.is_done(&u.case)) {
            lines.push(format!("lab: {} was cut short in start {} ({} samples set aside): it is measured again whole", u.case, u.start, u.samples()));
        }
        if let Some(first) = rp.starts.first() {
            let d = differences(first, now);
            if !d.is_empty() {
                lines.push(format!("lab: since the first start: {}", d.join("; ")));
            }
        }
        if self.torn_bytes > 0 {
            lines.push(format!("lab: the record's last line was cut short by the end of the last start ({} bytes): set aside", self.torn_bytes));
        }
        lines
    }
}

/// One start's attempt at a case.
struct Instance {
    case: String,
    start: u32,
    effects: Vec<Entry>,
}

impl Instance {
    fn samples(&self) -> u32 {
        self.effects.iter().filter(|e| matches!(e, Entry::Sample(_) | Entry::Fs(_) | Entry::Net(_))).count() as u32
    }
}

/// What a record says, read in order.
struct Replayed {
    starts: Vec<StartEntry>,
    /// Start -> how it ended and its ssh commands (starts that said so).
    ends: BTreeMap<u32, (String, u64)>,
    /// Per case, the last start's attempt that finished it, in the order
    /// the cases were first finished (the plan's: each start runs the plan
    /// in order, skipping what is finished).
    finished: Vec<Instance>,
    /// Attempts not finished, in record order.
    unfinished: Vec<Instance>,
    /// Start -> the cases finished before it began.
    skipped_at: BTreeMap<u32, u32>,
    subjects: Option<Vec<Subject>>,
}

fn replay(entries: &[Entry]) -> Replayed {
    let mut rp = Replayed { starts: vec![], ends: BTreeMap::new(), finished: vec![], unfinished: vec![], skipped_at: BTreeMap::new(), subjects: None };
    let mut start = 0;
    let mut open: Option<Instance> = None;
    let close = |open: &mut Option<Instance>, rp: &mut Replayed| {
        if let Some(i) = open.take() {
            rp.unfinished.push(i);
        }
    };
    for e in entries {
        match e {
            Entry::Start(s) => {
                close(&mut open, &mut rp);
                start = s.n;
                let finished = rp.finished.iter().filter(|f| is_case(&f.case)).count() as u32;
                rp.skipped_at.insert(s.n, finished);
                rp.starts.push(s.clone());
            }
            Entry::Begin { case } => {
                close(&mut open, &mut rp);
                open = Some(Instance { case: case.clone(), start, effects: vec![] });
            }
            Entry::Sample(_) | Entry::Fs(_) | Entry::Net(_) | Entry::Failure(_) => {
                if let Some(i) = &mut open {
                    i.effects.push(e.clone());
                }
            }
            Entry::Done { case } => {
                if let Some(i) = open.take_if(|i| &i.case == case) {
                    match rp.finished.iter_mut().find(|f| f.case == i.case) {
                        // Measured again (a link's targets started again): the latest counts.
                        Some(f) => *f = i,
                        None => rp.finished.push(i),
                    }
                }
            }
            Entry::Subjects(s) => rp.subjects = Some(s.clone()),
            Entry::End { how, ssh_commands } => {
                close(&mut open, &mut rp);
                rp.ends.insert(start, (how.clone(), *ssh_commands));
            }
        }
    }
    close(&mut open, &mut rp);
    rp
}

/// Add a case's records to the results, as the run pushed them.
fn apply(r: &mut Results, effects: &[Entry]) {
    for e in effects {
        match e {
            Entry::Sample(s) => r.samples.push(s.clone()),
            Entry::Fs(s) => r.fs.push(s.clone()),
            Entry::Net(s) => r.net.push(s.clone()),
            Entry::Failure(f) => r.failures.push(f.clone()),
            _ => {}
        }
    }
}

/// What differs in start `s` from the first start `first`: the machine,
/// its boot, the software, the hosts of the run.
pub fn differences(first: &StartEntry, s: &StartEntry) -> Vec<String> {
    let mut d = vec![];
    if s.n == first.n {
        return d;
    }
    let (a, b) = (&first.machine, &s.machine);
    if a.hostname != b.hostname {
        d.push(format!("another machine: {} then, {} now", a.hostname, b.hostname));
    }
    if first.boot_id != s.boot_id {
        d.push(format!("a new boot of {}", b.hostname));
    }
    let mut changed = |what: &str, x: String, y: String| {
        if x != y {
            d.push(format!("{what}: {x} then, {y} now"));
        }
    };
    changed("kernel", a.kernel.clone(), b.kernel.clone());
    changed("CPU", format!("{} x {}", a.cpus, a.cpu_model), format!("{} x {}", b.cpus, b.cpu_model));
    changed("memory", format!("{} MiB", a.mem_total_bytes >> 20), format!("{} MiB", b.mem_total_bytes >> 20));
    changed("TCP congestion control", a.tcp_congestion.clone(), b.tcp_congestion.clone());
    changed("blockwire", first.software.blockwire.clone(), s.software.blockwire.clone());
    changed("fio", first.software.fio.clone(), s.software.fio.clone());
    for p in &s.software.peers {
        if let Some(q) = first.software.peers.iter().find(|q| q.peer == p.peer) {
            changed(&p.peer, q.version.clone(), p.version.clone());
        }
    }
    for h in &s.hosts {
        if let Some(g) = first.hosts.iter().find(|g| g.role == h.role) {
            let who = format!("the {} host {}", h.role, h.address);
            changed(&format!("{who}'s kernel"), g.kernel.clone(), h.kernel.clone());
            changed(&format!("{who}'s CPU"), format!("{} x {}", g.cpus, g.cpu_model), format!("{} x {}", h.cpus, h.cpu_model));
            changed(&format!("{who}'s NIC"), format!("{} ({}, MTU {})", g.nic, g.nic_driver, g.mtu), format!("{} ({}, MTU {})", h.nic, h.nic_driver, h.mtu));
        }
    }
    for (addr, boot) in &s.host_boots {
        if first.host_boots.iter().any(|(a, b)| a == addr && b != boot) {
            d.push(format!("a new boot of {addr}"));
        }
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use bw_lab_results::{Failure, MachineInfo, Sample, SubjectKey, Suite, Workload};

    fn start(n: u32, boot: &str, kernel: &str) -> StartEntry {
        StartEntry {
            n,
            utc: format!("2026-11-25T0{n}:00:00Z"),
            pid: 100 + n,
            boot_id: boot.into(),
            machine: MachineInfo { hostname: "lab1".into(), kernel: kernel.into(), cpus: 2, ..Default::default() },
            software: Default::default(),
            hosts: vec![],
            host_boots: vec![],
        }
    }

    fn sample(workload: &str, rep: u32, iops: f64) -> Entry {
        Entry::Sample(Sample {
            subject: SubjectKey::served("blockwire", "nvme"),
            mtu: Some(1500),
            link: "none".into(),
            suite: Suite::Micro,
            workload: Workload { name: workload.into(), rw: "randread".into(), bs: 4096, iodepth: 1, numjobs: 1, rwmixread: None },
            repeat: rep,
            bench: bw_lab_results::BenchResult { iops, ..Default::default() },
            target_cpu_s: None,
            wire: None,
            busy_before: 0.0,
            idle_wait_s: 0.0,
            started_unix: 0.0,
            factors: Default::default(),
            machine_cpu: vec![],
        })
    }

    /// Start 1 finishes case a, is killed in case b (one sample taken);
    /// start 2 (a new boot, a new kernel) keeps a, measures b whole and c:
    /// the results hold a's samples from start 1 and b's from start 2 only,
    /// in the plan's order, and say so.
    #[test]
    fn a_resumed_run_keeps_finished_cases_and_sets_the_cut_one_aside() {
        let dir = std::env::temp_dir().join(format!("bwlab-book-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let planned: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let mut b1 = Book::fresh(&dir).unwrap();
        b1.begin_start(start(0, "boot-1", "6.1"));
        assert!(b1.begin("targets, link none, MTU 1500"));
        b1.effect(Entry::Failure(Failure { subject: SubjectKey::served("tgt", "iscsi").into(), mtu: Some(1500), workload: String::new(), reason: "not installed".into() }));
        b1.done();
        assert!(b1.begin("a"));
        b1.effect(sample("a", 1, 10.0));
        b1.effect(sample("a", 2, 11.0));
        b1.done();
        assert!(b1.begin("b"));
        b1.effect(sample("b", 1, 99.0));
        drop(b1); // killed

        let mut b2 = Book::reopen(&dir).unwrap();
        assert!(b2.resumed() && b2.start_number() == 2);
        let now = start(0, "boot-2", "6.2");
        let said = b2.summary(&planned, &StartEntry { n: 2, ..now.clone() }).join("\n");
        assert!(said.contains("1 of 3 cases finished in earlier starts are kept"), "{said}");
        assert!(said.contains("b was cut short in start 1 (1 samples set aside)"), "{said}");
        assert!(said.contains("a new boot of lab1") && said.contains("kernel: 6.1 then, 6.2 now"), "{said}");
        b2.begin_start(now);
        // The link's targets start again: their record replaces start 1's.
        assert!(b2.begin("targets, link none, MTU 1500"));
        b2.effect(Entry::Failure(Failure { subject: SubjectKey::served("tgt", "iscsi").into(), mtu: Some(1500), workload: String::new(), reason: "still not installed".into() }));
        b2.done();
        assert!(!b2.begin("a"), "a finished case is measured again");
        assert!(b2.begin("b"));
        b2.effect(sample("b", 1, 20.0));
        b2.effect(sample("b", 2, 21.0));
        b2.done();
        assert!(b2.begin("c"));
        b2.effect(sample("c", 1, 30.0));
        b2.done();
        let base = Results { finished_utc: "2026-11-25T03:00:00Z".into(), ..Default::default() };
        let r = b2.assemble(&base, &planned);
        let got: Vec<(String, f64)> = r.samples.iter().map(|s| (s.workload.name.clone(), s.bench.iops)).collect();
        assert_eq!(got, [("a".into(), 10.0), ("a".into(), 11.0), ("b".into(), 20.0), ("b".into(), 21.0), ("c".into(), 30.0)]);
        assert_eq!(r.failures.len(), 1, "the targets' failure twice: {:?}", r.failures);
        assert_eq!(r.failures[0].reason, "still not installed");
        assert_eq!(r.started_utc, "2026-11-25T00:00:00Z", "the first start's");
        let res = r.resumed.unwrap();
        let origin: Vec<(&str, u32)> = res.cases.iter().map(|c| (c.case.as_str(), c.start)).collect();
        assert_eq!(origin, [("a", 1), ("b", 2), ("c", 2)]);
        assert_eq!(res.starts.len(), 2);
        let (s1, s2) = (&res.starts[0], &res.starts[1]);
        assert_eq!((s1.cases_measured, s1.cases_skipped, s2.cases_measured, s2.cases_skipped), (1, 0, 2, 1));
        assert_eq!(s1.set_aside, vec![SetAside { case: "b".into(), samples: 1 }]);
        assert!(s1.ended.contains("without a word") && s2.ended == "completed", "{s1:?} {s2:?}");
        assert!(s2.differences.iter().any(|d| d.contains("new boot")), "{s2:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
