//! What the report says, apart from how it looks: decisions between
//! subjects (a winner only when the 95% interval of its advantage lies
//! beyond the practical threshold), the recommendation per workload and
//! scenario (link, MTU, client memory), and the fs suite's cases. The HTML
//! sections and the terminal summary both render this.

use bw_lab_results::accounting::{cases, Case, CaseKey, Metric};
use bw_lab_results::fs::{FsFactors, FsSample};
use bw_lab_results::{LinkName, Sample, SubjectKey, Suite};
use bw_lab_results::Results;
use bw_lab_results::stats::{advantage, describe_advantage, mean_ci, Verdict};
use std::collections::BTreeMap;

/// The throughput metric of a workload: MiB/s for 1 MiB sequential, IOPS otherwise.
pub fn throughput_metric(c: &Case) -> Metric {
    if c.workload.is_sequential() {
        Metric::MibPerS
    } else {
        Metric::Iops
    }
}

/// What is being compared: its name in sentences, and which way is better.
#[derive(Debug, Clone, PartialEq)]
pub struct Quantity {
    pub noun: String,
    pub higher_is_better: bool,
}

impl Quantity {
    pub fn of(m: Metric) -> Quantity {
        Quantity { noun: m.noun().to_string(), higher_is_better: m.higher_is_better() }
    }
}

/// A comparison between the best subject and the others on one quantity.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub quantity: Quantity,
    /// `Some(subject)` only when it is significantly better than every other.
    pub winner: Option<String>,
    /// Best by mean (even when not a winner).
    pub leader: String,
    /// Subjects within the noise of the leader (empty when there is a winner).
    pub tied: Vec<String>,
    /// The leader's advantage over the runner-up, with its interval.
    pub margin: Option<String>,
    /// How many subjects had a value (1: nothing to compare, as when
    /// bonnie++ timed a test for one subject only).
    pub measured: usize,
    pub text: String,
}

impl Decision {
    /// What to pick, for the answer table: the winner, or the tie.
    pub fn pick(&self) -> String {
        match &self.winner {
            Some(w) => w.clone(),
            None if self.measured < 2 => format!("only {} measured", self.leader),
            None if self.tied.is_empty() => format!("{} leads (single runs: untested)", self.leader),
            None => format!("tie: {} ≈ {}", self.leader, self.tied.join(" ≈ ")),
        }
    }
}

pub fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        f64::NAN
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// Decide among `entries` (subject, the quantity's value per repetition).
/// The best by mean is named the winner only when its advantage over
/// *every* other subject is clear: the whole 95% interval of the ratio of
/// means beyond the 5% practical threshold (see `stats`). The text always
/// states the advantage over the runner-up with its interval.
pub fn decide(q: &Quantity, entries: &[(String, Vec<f64>)]) -> Option<Decision> {
    let mut sorted: Vec<&(String, Vec<f64>)> = entries.iter().filter(|(_, v)| !v.is_empty()).collect();
    if sorted.is_empty() {
        return None;
    }
    let hib = q.higher_is_better;
    sorted.sort_by(|a, b| {
        let o = mean(&a.1).total_cmp(&mean(&b.1));
        if hib {
            o.reverse()
        } else {
            o
        }
    });
    let (best, bv) = sorted[0];
    let measured = sorted.len();
    let only = |text: String| Decision { quantity: q.clone(), winner: None, leader: best.clone(), tied: vec![], margin: None, measured, text };
    if sorted.len() == 1 {
        return Some(only(format!("only {best} measured")));
    }
    let noun = q.noun.as_str();
    let (second, sv) = sorted[1];
    let verdicts: Vec<(&String, Verdict)> = sorted[1..].iter().map(|(n, v)| (n, advantage(hib, bv, v))).collect();
    let tied: Vec<String> =
        verdicts.iter().filter(|(_, v)| !matches!(v, Verdict::Clear(_))).map(|(n, _)| n.to_string()).collect();
    match verdicts[0].1 {
        Verdict::Untestable => {
            let f = if hib { mean(bv) / mean(sv) } else { mean(sv) / mean(bv) };
            Some(only(format!(
                "{best} leads {second} by {f:.2}x on {noun}, but single runs have no known spread: no winner claimed (use --repeat 5)"
            )))
        }
        Verdict::Clear(ci) | Verdict::WithinNoise(ci) => {
            let margin = format!("{} than {second}", describe_advantage(hib, noun, ci));
            let (winner, text, tied) = if tied.is_empty() {
                (Some(best.clone()), format!("{best}: {margin}"), vec![])
            } else {
                let text = format!("within the noise: {best} vs {}: {margin}", tied.join(", "));
                (None, text, tied)
            };
            Some(Decision { quantity: q.clone(), winner, leader: best.clone(), tied, margin: Some(margin), measured, text })
        }
    }
}

/// The first link shape of the run: sections that show one scenario per
/// MTU (micro charts, tables, heat maps) show this one.
pub fn first_link(r: &Results) -> LinkName {
    r.params.links.first().cloned().unwrap_or_default()
}

/// "MTU 1500" or "MTU 1500, 1gbit" with the iperf3 ceiling when measured.
pub fn scenario(r: &Results, link: &LinkName, mtu: u32) -> String {
    let mut s = format!("MTU {mtu}");
    if !link.is_none() {
        s.push_str(&format!(", {link}"));
    }
    if let Some((bps, _)) = bw_lab_results::net::ceiling(&r.net, link, mtu) {
        s.push_str(&format!(" (net {:.0} MiB/s)", bps / 8.0 / 1_048_576.0));
    }
    s
}

/// One row of the recommendation: a workload in a scenario, with the
/// decisions on speed, latency and CPU per operation among the networked
/// subjects, and how the fastest compares with the local baseline.
#[derive(Debug, Clone)]
pub struct Recommendation {
    /// `micro` or `fs`.
    pub suite: &'static str,
    pub link: LinkName,
    pub mtu: u32,
    /// The fs suite's client memory limit (bytes).
    pub client_mem: Option<u64>,
    /// "MTU 1500, 1gbit (net 112 MiB/s)[, client mem 256 MiB]".
    pub scenario: String,
    pub workload: String,
    pub throughput: Option<Decision>,
    pub latency: Option<Decision>,
    pub cpu: Option<Decision>,
    pub vs_local: Option<String>,
    /// Subjects whose client, not their target, bounds this comparison
    /// (see [`ClientBound`]); the micro suite's only.
    pub client_bound: Vec<ClientBound>,
}

/// A client's CPU per operation above this many times its target's, on a
/// machine whose CPUs were full, flags the comparison: the client bounds
/// what the target can show.
pub const CLIENT_BOUND_RATIO: f64 = 2.0;
/// The share of a machine's CPUs (anyone's work counted) above which they
/// count as full.
pub const CPUS_FULL: f64 = 0.9;

/// A subject whose initiator is the bottleneck of a comparison: with the
/// machine's CPUs full, the initiator spent over [`CLIENT_BOUND_RATIO`]
/// times its target's CPU per operation, so its throughput is the
/// client's and a verdict on it says more about the initiator (the lab's
/// instrument) than about the target.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientBound {
    pub subject: String,
    /// Means over the repetitions, µs per operation.
    pub client_us: f64,
    pub target_us: f64,
    /// The busiest machine's CPUs in use over the runs (mean share).
    pub busy: f64,
}

impl ClientBound {
    pub fn text(&self) -> String {
        format!(
            "{}: its client spent {:.1} µs of CPU per op, {:.1}x its target's {:.1}, with the machine's CPUs {:.0}% busy: the client bounds this result",
            self.subject,
            self.client_us,
            self.client_us / self.target_us,
            self.target_us,
            self.busy * 100.0
        )
    }
}

/// The share of the CPUs in use over `s`'s run on its busiest machine
/// (everyone's work, the idle baseline included): `None` without
/// whole-machine figures or a CPU count.
pub fn machine_busy_share(r: &Results, s: &Sample) -> Option<f64> {
    let runtime = s.bench.runtime_s;
    s.machine_cpu
        .iter()
        .filter_map(|m| {
            // A run across machines names each machine's hosts; on one
            // machine the run's own CPU count applies.
            let cpus = r
                .hosts
                .iter()
                .find(|h| m.hosts.iter().any(|n| h.address.contains(n.as_str())))
                .map_or(r.machine.cpus, |h| h.cpus);
            (cpus > 0 && runtime > 0.0).then(|| m.busy_s / (runtime * cpus as f64))
        })
        .max_by(f64::total_cmp)
}

/// Whether `c`'s client bounds it (see [`ClientBound`]).
pub fn client_bound(r: &Results, c: &Case) -> Option<ClientBound> {
    let client_us = mean(&c.values(Metric::InitiatorCpuUsPerOp));
    let target_us = mean(&c.values(Metric::TargetCpuUsPerOp));
    let busy: Vec<f64> = c.samples.iter().filter_map(|s| machine_busy_share(r, s)).collect();
    let busy = mean(&busy);
    (target_us > 0.0 && client_us > CLIENT_BOUND_RATIO * target_us && busy >= CPUS_FULL)
        .then(|| ClientBound { subject: c.key.subject.to_string(), client_us, target_us, busy })
}

/// The micro suite's recommendations, per (--offload/--digest setting, link, MTU, workload).
pub fn micro_recommendations(r: &Results) -> Vec<Recommendation> {
    // Every `--offload`/`--digest` setting gets its own answer: a run of
    // the offload study has no case at the defaults at all.
    let all = cases(&r.samples);
    let local: BTreeMap<String, &Case> =
        all.values().filter(|c| c.key.mtu.is_none() && c.key.suite == Suite::Micro).map(|c| (c.key.workload.clone(), c)).collect();
    let mut groups: BTreeMap<(String, LinkName, u32, String), Vec<&Case>> = BTreeMap::new();
    for c in all.values().filter(|c| c.key.suite == Suite::Micro) {
        if let Some(mtu) = c.key.mtu {
            groups.entry((c.key.factors.describe(), c.key.link.clone(), mtu, c.key.workload.clone())).or_default().push(c);
        }
    }
    let mut out = vec![];
    for ((setting, link, mtu, workload), cs) in groups {
        let entries = |m: Metric| -> Vec<(String, Vec<f64>)> { cs.iter().map(|c| (c.key.subject.to_string(), c.values(m))).collect() };
        let tm = throughput_metric(cs[0]);
        let throughput = decide(&Quantity::of(tm), &entries(tm));
        let vs_local = throughput.as_ref().and_then(|d| {
            let lc = local.get(&workload)?.summary(tm)?;
            let best = cs.iter().find(|c| c.key.subject.name() == d.leader)?.summary(tm)?;
            Some(format!("{} reaches {:.0}% of local fio", d.leader, best.mean / lc.mean * 100.0))
        });
        let scenario = match setting.as_str() {
            "" => scenario(r, &link, mtu),
            s => format!("{}, {s}", scenario(r, &link, mtu)),
        };
        out.push(Recommendation {
            suite: Suite::Micro.name(),
            scenario,
            link,
            mtu,
            client_mem: None,
            workload,
            throughput,
            latency: decide(&Quantity::of(Metric::LatP50Us), &entries(Metric::LatP50Us)),
            cpu: decide(&Quantity::of(Metric::TotalCpuUsPerOp), &entries(Metric::TotalCpuUsPerOp)),
            vs_local,
            client_bound: cs.iter().filter_map(|c| client_bound(r, c)).collect(),
        });
    }
    out
}

/// One fs case: a row (a workload or a part of one, e.g. `bonnie block
/// write`) on one subject at one client memory limit and link, with every
/// measure's values over the repetitions.
#[derive(Debug, Clone)]
pub struct FsCase {
    pub link: LinkName,
    pub mtu: Option<u32>,
    pub client_mem: u64,
    pub row: String,
    pub subject: SubjectKey,
    /// The file system and fsync setting (default: ext4, honoured).
    pub factors: FsFactors,
    /// measure name -> (unit, higher is better, headline, values).
    pub measures: BTreeMap<String, FsValues>,
}

#[derive(Debug, Clone)]
pub struct FsValues {
    pub unit: &'static str,
    pub higher_is_better: bool,
    pub headline: bool,
    pub values: Vec<f64>,
}

impl FsCase {
    pub fn headline(&self) -> Option<(&String, &FsValues)> {
        self.measures.iter().find(|(_, v)| v.headline)
    }
    pub fn values(&self, what: &str) -> Vec<f64> {
        self.measures.get(what).map(|v| v.values.clone()).unwrap_or_default()
    }
}

/// Key of an fs case. The local baseline's cases carry the link of the run
/// they were made in. Ordered by its fields in this order (the report's
/// row order).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct FsKey {
    pub link: LinkName,
    pub client_mem: u64,
    pub row: String,
    pub subject: SubjectKey,
    pub factors: FsFactors,
}

impl FsKey {
    /// A case at the default file system and fsync setting.
    pub fn new(link: &LinkName, client_mem: u64, row: &str, subject: &SubjectKey) -> FsKey {
        FsKey { link: link.clone(), client_mem, row: row.into(), subject: subject.clone(), factors: FsFactors::default() }
    }
}

/// The fs cases at the default file system (ext4, fsync honoured): the
/// sections and recommendations; [`fs_cases_all`] has every setting.
pub fn fs_cases(samples: &[FsSample]) -> BTreeMap<FsKey, FsCase> {
    fs_cases_all(samples).into_iter().filter(|(k, _)| k.factors.is_default()).collect()
}

/// The fs cases of every `--fs` and `--fsync` setting.
pub fn fs_cases_all(samples: &[FsSample]) -> BTreeMap<FsKey, FsCase> {
    let mut out: BTreeMap<FsKey, FsCase> = BTreeMap::new();
    for s in samples {
        for m in s.measures() {
            let key = FsKey { factors: s.factors.clone(), ..FsKey::new(&s.link, s.client_mem, &m.row, &s.subject) };
            let c = out.entry(key).or_insert_with(|| FsCase {
                link: s.link.clone(),
                mtu: s.mtu,
                client_mem: s.client_mem,
                row: m.row.clone(),
                subject: s.subject.clone(),
                factors: s.factors.clone(),
                measures: BTreeMap::new(),
            });
            c.mtu = c.mtu.or(s.mtu);
            c.measures
                .entry(m.what.clone())
                .or_insert_with(|| FsValues { unit: m.unit, higher_is_better: m.higher_is_better, headline: m.headline, values: vec![] })
                .values
                .push(m.value);
        }
    }
    out
}

/// "client mem 256 MiB" / "2 GiB".
pub fn mem_name(bytes: u64) -> String {
    if bytes >= 1 << 30 && bytes.is_multiple_of(1 << 30) {
        format!("{} GiB", bytes >> 30)
    } else {
        format!("{} MiB", bytes >> 20)
    }
}

/// The order rows appear in: the workloads' run order.
pub fn row_order(row: &str) -> usize {
    bw_lab_results::fs::ALL.iter().position(|w| row == w.name() || row.starts_with(w.name())).unwrap_or(99)
}

/// The fs suite's recommendations, per (link, memory limit, row): the
/// networked subjects compared on the row's headline, on its latency where
/// it has one, and on CPU per operation.
pub fn fs_recommendations(r: &Results) -> Vec<Recommendation> {
    let all = fs_cases(&r.fs);
    let mut groups: BTreeMap<(LinkName, u64, usize, String), Vec<&FsCase>> = BTreeMap::new();
    for c in all.values() {
        groups.entry((c.link.clone(), c.client_mem, row_order(&c.row), c.row.clone())).or_default().push(c);
    }
    let mut out = vec![];
    for ((link, mem, _, row), cs) in groups {
        let net: Vec<&&FsCase> = cs.iter().filter(|c| !c.subject.is_local()).collect();
        if net.is_empty() {
            continue;
        }
        let Some((hname, h)) = net[0].headline() else { continue };
        let decide_on = |what: &str, noun: String, hib: bool| {
            let entries: Vec<(String, Vec<f64>)> = net.iter().map(|c| (c.subject.to_string(), c.values(what))).collect();
            decide(&Quantity { noun, higher_is_better: hib }, &entries)
        };
        let throughput = decide_on(hname, hname.clone(), h.higher_is_better);
        // The latency that says most per row: response time, the slowest
        // flowop's mean, or Bonnie++'s worst request.
        let lat_name = net[0]
            .measures
            .iter()
            .filter(|(k, v)| v.unit == "µs" && !v.higher_is_better && k.as_str() != "CPU per op")
            .max_by(|a, b| mean(&a.1.values).total_cmp(&mean(&b.1.values)))
            .map(|(k, _)| k.clone());
        let latency = lat_name.and_then(|l| decide_on(&l, l.clone(), false));
        let cpu = decide_on("CPU per op", "CPU per op".into(), false);
        let vs_local = throughput.as_ref().and_then(|d| {
            let local = cs.iter().find(|c| c.subject == bw_lab_results::fs::LOCAL)?;
            let lv = mean(&local.values(hname));
            let best = mean(&net.iter().find(|c| c.subject.name() == d.leader)?.values(hname));
            (lv > 0.0).then(|| format!("{} reaches {:.0}% of local ext4", d.leader, best / lv * 100.0))
        });
        let mtu = net[0].mtu.unwrap_or(0);
        let mut sc = scenario(r, &link, mtu);
        sc.push_str(&format!(", client mem {}", mem_name(mem)));
        out.push(Recommendation {
            suite: "fs",
            link,
            mtu,
            client_mem: Some(mem),
            scenario: sc,
            workload: format!("fs {row} ({})", h.unit),
            throughput,
            latency,
            cpu,
            vs_local,
            client_bound: vec![],
        });
    }
    out
}

/// Every recommendation, micro first.
pub fn recommendations(r: &Results) -> Vec<Recommendation> {
    let mut v = micro_recommendations(r);
    v.extend(fs_recommendations(r));
    v
}

/// The answer first: per scenario and workload, what to pick for speed and
/// for CPU, and by how much. Rows: [scenario, workload, pick for speed,
/// margin, pick for CPU per op, margin].
pub fn answer_rows(recs: &[Recommendation]) -> Vec<[String; 6]> {
    let cell = |d: &Option<Decision>| match d {
        Some(d) => (d.pick(), d.margin.clone().unwrap_or_default()),
        None => ("-".into(), String::new()),
    };
    recs.iter()
        .map(|rec| {
            let (sp, sm) = cell(&rec.throughput);
            let (cp, cm) = cell(&rec.cpu);
            [rec.scenario.clone(), rec.workload.clone(), sp, sm, cp, cm]
        })
        .collect()
}

/// "1234 (1100–1350)": a mean with its 95% bootstrap interval.
pub fn with_interval(values: &[f64]) -> String {
    if values.is_empty() {
        return "–".into();
    }
    let m = mean(values);
    match mean_ci(values) {
        Some((lo, hi)) => format!("{} ({}–{})", crate::svg::short(m), crate::svg::short(lo), crate::svg::short(hi)),
        None => crate::svg::short(m),
    }
}

/// Sample count per subject (a quick check for tests).
pub fn sample_counts(r: &Results) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for s in &r.samples {
        *m.entry(s.subject.to_string()).or_insert(0) += 1;
    }
    for s in &r.fs {
        *m.entry(s.subject.to_string()).or_insert(0) += 1;
    }
    m
}

/// The micro and sweep cases at the lab's default factors (the sections
/// and recommendations; the offload study's cases have a section of their
/// own, [`factor_cases`]).
pub fn micro_cases(r: &Results) -> BTreeMap<CaseKey, Case> {
    cases(&r.samples).into_iter().filter(|(k, _)| k.factors.is_default()).collect()
}

/// Every networked case of a run that varied `--offload` or `--digest`
/// (empty otherwise).
pub fn factor_cases(r: &Results) -> BTreeMap<CaseKey, Case> {
    if r.params.offloads.is_empty() && r.params.digests.is_empty() {
        return BTreeMap::new();
    }
    cases(&r.samples).into_iter().filter(|(k, _)| k.mtu.is_some()).collect()
}
