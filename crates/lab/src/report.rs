//! results.json -> results.csv and report.html (one self-contained file:
//! inline SVG and CSS, one tiny inline script that only marks the charts as
//! rendered for automated checks). Also the recommendation text, shared by
//! the report and the terminal.

use crate::accounting::{cases, Case, CaseKey, Metric};
use crate::results::{Results, Sample};
use crate::stats::{advantage, describe_advantage, ratio_of_means, Summary, Verdict};
use crate::svg::{self, esc, Bar};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

/// Header cost per frame from study 3 (docs/studies.md), for comparison.
pub const STUDIES_HEADER_TABLE: [(&str, u32); 7] = [
    ("AoE", 32),
    ("AoE/MPLS", 50),
    ("AoE/GRE/IP", 80),
    ("AoE/L2TP/UDP/IP", 86),
    ("iSCSI/TCP/IP", 102),
    ("iSCSI/MPLS", 120),
    ("FCIP/iFCP", 82),
];

pub fn write_all(out: &Path, r: &Results) -> anyhow::Result<()> {
    std::fs::write(out.join("results.csv"), csv(r))?;
    std::fs::write(out.join("report.html"), html(r))?;
    Ok(())
}

// ---------------------------------------------------------------- CSV

pub fn csv(r: &Results) -> String {
    let mut s = String::new();
    let derived: Vec<Metric> = Metric::ALL.to_vec();
    s.push_str("subject,protocol,target,initiator,mtu,suite,workload,rw,bs,iodepth,numjobs,rwmixread,repeat,");
    s.push_str("iops,bw_bytes,lat_p50_ns,lat_p99_ns,lat_p999_ns,lat_mean_ns,ios,bytes,runtime_s,errors,");
    s.push_str("initiator_cpu_user_s,initiator_cpu_sys_s,target_cpu_s,wire_rx_bytes,wire_tx_bytes,wire_rx_frames,wire_tx_frames,");
    s.push_str("busy_before,idle_wait_s,started_unix");
    for m in &derived {
        s.push(',');
        s.push_str(m.key());
    }
    s.push('\n');
    let opt = |v: Option<f64>| v.map(|x| format!("{x}")).unwrap_or_default();
    for x in &r.samples {
        let subj = r.subject(&x.subject);
        let w = &x.workload;
        let b = &x.bench;
        let wire = x.wire;
        let _ = write!(
            s,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},",
            x.subject,
            subj.map(|s| s.protocol.as_str()).unwrap_or(""),
            subj.map(|s| s.target.as_str()).unwrap_or(""),
            subj.map(|s| s.initiator.as_str()).unwrap_or(""),
            x.mtu.map(|m| m.to_string()).unwrap_or_default(),
            x.suite,
            w.name,
            w.rw,
            w.bs,
            w.iodepth,
            w.numjobs,
            w.rwmixread.map(|m| m.to_string()).unwrap_or_default(),
            x.repeat
        );
        let _ = write!(
            s,
            "{},{},{},{},{},{},{},{},{},{},",
            b.iops, b.bw_bytes, b.lat_ns.p50, b.lat_ns.p99, b.lat_ns.p999, b.lat_ns.mean, b.ios, b.bytes, b.runtime_s, b.errors
        );
        let _ = write!(
            s,
            "{},{},{},{},{},{},{},{},{},{}",
            b.cpu_user_s,
            b.cpu_sys_s,
            opt(x.target_cpu_s),
            wire.map(|w| w.rx_bytes.to_string()).unwrap_or_default(),
            wire.map(|w| w.tx_bytes.to_string()).unwrap_or_default(),
            wire.map(|w| w.rx_packets.to_string()).unwrap_or_default(),
            wire.map(|w| w.tx_packets.to_string()).unwrap_or_default(),
            x.busy_before,
            x.idle_wait_s,
            x.started_unix
        );
        for m in &derived {
            s.push(',');
            s.push_str(&opt(m.of(x)));
        }
        s.push('\n');
    }
    s
}

// ---------------------------------------------------------------- decisions

/// The throughput metric of a workload: MiB/s for 1 MiB sequential, IOPS otherwise.
pub fn throughput_metric(c: &Case) -> Metric {
    if c.workload.is_sequential() { Metric::MibPerS } else { Metric::Iops }
}

/// A comparison between the best subject and the others on one metric.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub metric: Metric,
    /// `Some(subject)` only when it is significantly better than every other.
    pub winner: Option<String>,
    /// Best by mean (even when not a winner).
    pub leader: String,
    /// Subjects within the noise of the leader (empty when there is a winner).
    pub tied: Vec<String>,
    /// The leader's advantage over the runner-up, with its interval.
    pub margin: Option<String>,
    pub text: String,
}

impl Decision {
    /// What to pick, for the answer table: the winner, or the tie.
    pub fn pick(&self) -> String {
        match &self.winner {
            Some(w) => w.clone(),
            None if self.tied.is_empty() => format!("{} (untested)", self.leader),
            None => format!("tie: {} ≈ {}", self.leader, self.tied.join(" ≈ ")),
        }
    }
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() { f64::NAN } else { v.iter().sum::<f64>() / v.len() as f64 }
}

/// Decide among `entries` (subject, the metric's value per repetition). The
/// best by mean is named the winner only when its advantage over *every*
/// other subject is clear: the whole 95% interval of the ratio of means
/// beyond the 5% practical threshold (see `stats`). The text always states
/// the advantage over the runner-up with its interval.
pub fn decide(metric: Metric, entries: &[(String, Vec<f64>)]) -> Option<Decision> {
    let mut sorted: Vec<&(String, Vec<f64>)> = entries.iter().filter(|(_, v)| !v.is_empty()).collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(|a, b| {
        let o = mean(&a.1).total_cmp(&mean(&b.1));
        if metric.higher_is_better() { o.reverse() } else { o }
    });
    let (best, bv) = sorted[0];
    if sorted.len() == 1 {
        return Some(Decision { metric, winner: None, leader: best.clone(), tied: vec![], margin: None, text: format!("only {best} measured") });
    }
    let hib = metric.higher_is_better();
    let noun = metric.noun();
    let (second, sv) = sorted[1];
    let verdicts: Vec<(&String, Verdict)> = sorted[1..].iter().map(|(n, v)| (n, advantage(hib, bv, v))).collect();
    let tied: Vec<String> = verdicts.iter().filter(|(_, v)| !matches!(v, Verdict::Clear(_))).map(|(n, _)| n.to_string()).collect();
    let (winner, margin, text) = match verdicts[0].1 {
        Verdict::Untestable => {
            let f = if hib { mean(bv) / mean(sv) } else { mean(sv) / mean(bv) };
            (None, None, format!("{best} leads {second} by {f:.2}x on {noun}, but single runs have no known spread: no winner claimed (use --repeat 5)"))
        }
        Verdict::Clear(ci) | Verdict::WithinNoise(ci) => {
            let margin = format!("{} than {second}", describe_advantage(hib, noun, ci));
            if tied.is_empty() {
                (Some(best.clone()), Some(margin.clone()), format!("{best}: {margin}"))
            } else {
                (None, Some(margin.clone()), format!("within the noise: {best} vs {}: {margin}", tied.join(", ")))
            }
        }
    };
    let tied = if winner.is_some() || verdicts[0].1 == Verdict::Untestable { vec![] } else { tied };
    Some(Decision { metric, winner, leader: best.clone(), tied, margin, text })
}

/// Networked cases of one (suite, mtu, workload), by subject.
fn group_by_workload(all: &BTreeMap<CaseKey, Case>) -> BTreeMap<(String, String, Option<u32>, String), Vec<&Case>> {
    let mut g: BTreeMap<(String, String, Option<u32>, String), Vec<&Case>> = BTreeMap::new();
    for c in all.values() {
        g.entry((c.key.suite.clone(), c.key.link.clone(), c.key.mtu, c.key.workload.clone())).or_default().push(c);
    }
    g
}

/// The first link shape of the run: the sections that show one scenario
/// per MTU (charts, tables, findings) show this one.
fn first_link(r: &Results) -> String {
    r.params.links.first().cloned().unwrap_or_else(crate::results::default_link)
}

/// "MTU 1500" or "MTU 1500, 1gbit" with the iperf3 ceiling when measured.
fn scenario(r: &Results, link: &str, mtu: u32) -> String {
    let mut s = format!("MTU {mtu}");
    if link != "none" {
        s.push_str(&format!(", {link}"));
    }
    if let Some((bps, _)) = crate::net::ceiling(&r.net, link, mtu) {
        s.push_str(&format!(" (net {:.0} MiB/s)", bps / 8.0 / 1_048_576.0));
    }
    s
}

/// Per MTU and micro workload: decisions on throughput, latency (p50) and
/// total CPU per op among the networked subjects, plus the share of local.
pub struct Recommendation {
    pub mtu: u32,
    pub link: String,
    /// "MTU 1500, 1gbit (net 112 MiB/s)": the scenario and its network ceiling.
    pub scenario: String,
    pub workload: String,
    pub throughput: Option<Decision>,
    pub latency: Option<Decision>,
    pub cpu: Option<Decision>,
    pub vs_local: Option<String>,
}

pub fn recommendations(r: &Results) -> Vec<Recommendation> {
    let all = cases(&r.samples);
    let local: BTreeMap<String, &Case> = all
        .values()
        .filter(|c| c.key.mtu.is_none() && c.key.suite == "micro")
        .map(|c| (c.key.workload.clone(), c))
        .collect();
    let mut out = vec![];
    for ((suite, link, mtu, workload), cs) in group_by_workload(&all) {
        let (Some(mtu), true) = (mtu, suite == "micro") else { continue };
        let entries = |m: Metric| -> Vec<(String, Vec<f64>)> { cs.iter().map(|c| (c.key.subject.clone(), c.values(m))).collect() };
        let tm = throughput_metric(cs[0]);
        let throughput = decide(tm, &entries(tm));
        let vs_local = throughput.as_ref().and_then(|d| {
            let lc = local.get(&workload)?.summary(tm)?;
            let best = cs.iter().find(|c| c.key.subject == d.leader)?.summary(tm)?;
            Some(format!("{} reaches {:.0}% of local fio", d.leader, best.mean / lc.mean * 100.0))
        });
        out.push(Recommendation {
            mtu,
            scenario: scenario(r, &link, mtu),
            link,
            workload,
            throughput,
            latency: decide(Metric::LatP50Us, &entries(Metric::LatP50Us)),
            cpu: decide(Metric::TotalCpuUsPerOp, &entries(Metric::TotalCpuUsPerOp)),
            vs_local,
        });
    }
    out
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

pub fn print_recommendations(r: &Results) {
    let recs = recommendations(r);
    if recs.is_empty() {
        return;
    }
    println!("\nAnswer: what to pick, by how much (95% interval; a winner only when the whole interval is more than 5% ahead of every other subject)");
    let rows = answer_rows(&recs);
    let head = ["scenario", "workload", "fastest", "by", "least CPU/op", "by"];
    let widths: Vec<usize> =
        (0..6).map(|i| rows.iter().map(|r| r[i].chars().count()).chain([head[i].len()]).max().unwrap_or(0)).collect();
    let line = |cells: &[&str]| {
        let s: Vec<String> = cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        println!("  {}", s.join("  ").trim_end());
    };
    line(&head);
    for r in &rows {
        line(&r.iter().map(String::as_str).collect::<Vec<_>>());
    }
    println!("\nRecommendation in detail (throughput, median latency, CPU per op)");
    for rec in recs {
        println!("  {} {}:", rec.scenario, rec.workload);
        for (what, d) in [("throughput", &rec.throughput), ("latency", &rec.latency), ("CPU/op", &rec.cpu)] {
            if let Some(d) = d {
                println!("    {what:<10} {}", d.text);
            }
        }
        if let Some(v) = rec.vs_local {
            println!("    {:<10} {v}", "vs local");
        }
    }
}

// ---------------------------------------------------------------- findings (study 1, docs/studies.md)

/// Are two cases apart on `metric` by more than the practical threshold,
/// with 95% confidence?
fn clearly_apart(a: &Case, b: &Case, metric: Metric) -> bool {
    ratio_of_means(&a.values(metric), &b.values(metric)).is_some_and(|ci| ci.apart())
}

/// Geometric mean of `a/b` ratios of `metric` over the micro workloads both
/// subjects ran at `mtu`, with how many were significantly apart.
#[allow(clippy::too_many_arguments)]
fn ratio_over_workloads(all: &BTreeMap<CaseKey, Case>, link: &str, mtu: u32, a: &str, b: &str, metric: Metric, only: Option<&str>) -> Option<(f64, usize, usize)> {
    let mut logs = vec![];
    let mut significant = 0;
    for c in all.values().filter(|c| c.key.suite == "micro" && c.key.link == link && c.key.mtu == Some(mtu) && c.key.subject == a) {
        if only.is_some_and(|w| w != c.key.workload) {
            continue;
        }
        let key_b = CaseKey { subject: b.to_string(), ..c.key.clone() };
        let Some(cb) = all.get(&key_b) else { continue };
        let (Some(sa), Some(sb)) = (c.summary(metric), cb.summary(metric)) else { continue };
        if sa.mean > 0.0 && sb.mean > 0.0 {
            logs.push((sa.mean / sb.mean).ln());
            significant += clearly_apart(c, cb, metric) as usize;
        }
    }
    if logs.is_empty() {
        return None;
    }
    Some(((logs.iter().sum::<f64>() / logs.len() as f64).exp(), significant, logs.len()))
}

pub struct Finding {
    pub claim: &'static str,
    pub pair: String,
    pub measured: String,
    pub verdict: String,
}

pub fn findings(r: &Results) -> Vec<Finding> {
    let all = cases(&r.samples);
    let mut out = vec![];
    let mtus = &r.params.mtus;
    let Some(&mtu) = mtus.first() else { return out };
    let pairs = [("blockwire-aoe", "blockwire-iscsi"), ("vblade-aoe", "tgt-iscsi")];
    let links = if r.params.links.is_empty() { vec![crate::results::default_link()] } else { r.params.links.clone() };
    for (link, (aoe, iscsi)) in links.iter().flat_map(|l| pairs.iter().map(move |p| (l, *p))) {
        let link = link.as_str();
        let pair = format!("{aoe} vs {iscsi} (MTU {mtu}, link {link})");
        let judge = |ratio: f64, sig: usize, n: usize, want_above: Option<f64>| -> String {
            match want_above {
                _ if sig == 0 => format!("inconclusive or equal: no workload significantly apart ({n} compared)"),
                Some(th) if ratio > th => "reproduced".into(),
                Some(_) => "not reproduced".into(),
                None => "n/a".into(),
            }
        };
        if let Some((x, sig, n)) = ratio_over_workloads(&all, link, mtu, aoe, iscsi, Metric::MibPerS, Some("seqread-1m")) {
            out.push(Finding {
                claim: "AoE ~20% faster on uncached sequential reads",
                pair: pair.clone(),
                measured: format!("AoE/iSCSI MiB/s = {x:.2}"),
                verdict: judge(x, sig, n, Some(1.05)),
            });
        }
        if let Some((x, sig, _)) = ratio_over_workloads(&all, link, mtu, aoe, iscsi, Metric::Iops, Some("randread-4k-qd1")) {
            out.push(Finding {
                claim: "equal on uncached random reads (disk seek dominated there; here RAM, so protocol cost shows)",
                pair: pair.clone(),
                measured: format!("AoE/iSCSI IOPS = {x:.2}"),
                verdict: if sig == 0 { "reproduced (within noise)".into() } else { "not reproduced (differ significantly)".into() },
            });
        }
        if let Some((x, sig, n)) = ratio_over_workloads(&all, link, mtu, iscsi, aoe, Metric::TotalCpuUsPerOp, None) {
            out.push(Finding {
                claim: "iSCSI uses ~19% more CPU per operation",
                pair: pair.clone(),
                measured: format!("iSCSI/AoE CPU µs/op = {x:.2} (geo-mean over {n} micro workloads, {sig} significant)"),
                verdict: judge(x, sig, n, Some(1.0)),
            });
        }
        if let Some((x, sig, n)) = ratio_over_workloads(&all, link, mtu, iscsi, aoe, Metric::WireBytesPerOp, None) {
            out.push(Finding {
                claim: "iSCSI uses ~3% more network bytes per operation",
                pair: pair.clone(),
                measured: format!("iSCSI/AoE wire bytes/op = {x:.3} (geo-mean over {n}, {sig} significant)"),
                verdict: judge(x, sig, n, Some(1.0)),
            });
        }
    }
    out.push(Finding {
        claim: "iSCSI faster on cached writes (client write-back)",
        pair: "all".into(),
        measured: "not measured".into(),
        verdict: "n/a: blockwire's initiators have no client cache, so there is no cached variant to run".into(),
    });
    if mtus.len() >= 2 {
        let (small, big) = (mtus[0], *mtus.last().unwrap_or(&mtus[0]));
        for subj in r.subjects.iter().filter(|s| s.protocol != "local") {
            for (metric, what) in [(Metric::TotalCpuUsPerOp, "CPU/op"), (Metric::WireBytesPerOp, "bytes/op")] {
                let mut logs = vec![];
                let mut sig = 0;
                for w in ["seqread-1m", "seqwrite-1m"] {
                    let k = |m: u32| CaseKey { suite: "micro".into(), link: first_link(r), mtu: Some(m), workload: w.into(), subject: subj.key.clone() };
                    let (Some(a), Some(b)) = (all.get(&k(big)), all.get(&k(small))) else { continue };
                    let (Some(sa), Some(sb)) = (a.summary(metric), b.summary(metric)) else { continue };
                    if sa.mean > 0.0 && sb.mean > 0.0 {
                        logs.push((sa.mean / sb.mean).ln());
                        sig += clearly_apart(a, b, metric) as usize;
                    }
                }
                if logs.is_empty() {
                    continue;
                }
                let x = (logs.iter().sum::<f64>() / logs.len() as f64).exp();
                out.push(Finding {
                    claim: "larger MTU lowers CPU and bytes per operation",
                    pair: format!("{} {what}, MTU {big} vs {small} (seq 1 MiB)", subj.key),
                    measured: format!("ratio {x:.3}"),
                    verdict: if sig == 0 {
                        "inconclusive (within noise)".into()
                    } else if x < 1.0 {
                        "reproduced".into()
                    } else {
                        "not reproduced".into()
                    },
                });
            }
        }
    }
    out
}

// ---------------------------------------------------------------- HTML

const CSS: &str = r#"
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1280px;padding:0 16px;color:#222}
h1{font-size:24px}h2{font-size:19px;margin-top:32px;border-bottom:1px solid #ccc}h3{font-size:16px}
table{border-collapse:collapse;margin:8px 0;font-size:12.5px}td,th{border:1px solid #ddd;padding:3px 7px;text-align:right;vertical-align:top}
th{background:#f4f4f4}td.l,th.l{text-align:left}.win{color:#1a7f37;font-weight:600}.tie{color:#777}
.charts{display:flex;flex-wrap:wrap;gap:12px}.chart{background:#fff;border:1px solid #e4e4e4}
.chart .title{font-size:13px;font-weight:600}.chart .small{font-size:10.5px}.chart .grid{stroke:#eee}.chart .axis{stroke:#444}
.chart .whisker{stroke:#000;stroke-width:1}.note{color:#555;font-size:13px}.warn{background:#fff4e5;border:1px solid #f0c36d;padding:8px}
code{background:#f4f4f4;padding:0 3px}
"#;

/// Marks the document once every chart has a non-empty laid-out box, so a
/// headless browser's DOM dump shows the charts really rendered.
const CHECK_SCRIPT: &str = r#"
var bwErrors=0;window.addEventListener('error',function(){bwErrors++;});
window.addEventListener('load',function(){var s=document.querySelectorAll('svg.chart'),ok=0;
for(var i=0;i<s.length;i++){var b=s[i].getBBox();if(b.width>0&&b.height>0&&s[i].querySelectorAll('rect').length>0)ok++;}
var d=document.body;d.setAttribute('data-charts',String(s.length));d.setAttribute('data-charts-rendered',String(ok));d.setAttribute('data-errors',String(bwErrors));});
"#;

fn subject_colors(r: &Results) -> BTreeMap<String, String> {
    r.subjects
        .iter()
        .enumerate()
        .map(|(i, s)| (s.key.clone(), svg::PALETTE[i % svg::PALETTE.len()].to_string()))
        .collect()
}

fn bar_of(s: Summary) -> Bar {
    Bar { mean: s.mean, lo: (s.mean - s.stddev).max(0.0), hi: s.mean + s.stddev }
}

fn fmt_summary(s: Option<Summary>) -> String {
    match s {
        None => "–".into(),
        Some(s) if s.n < 2 => svg::short(s.mean),
        Some(s) => format!("{} ±{} <span class=\"tie\">[{}–{}]</span>", svg::short(s.mean), svg::short(s.stddev), svg::short(s.min), svg::short(s.max)),
    }
}

pub fn html(r: &Results) -> String {
    let all = cases(&r.samples);
    let colors = subject_colors(r);
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>blockwire lab report</title><style>{CSS}</style><script>{CHECK_SCRIPT}</script></head><body>"
    );
    let _ = write!(h, "<h1>blockwire lab: AoE, iSCSI and NVMe/TCP side by side</h1>");
    let _ = write!(
        h,
        "<p class=\"note\">Run {} → {} on {} ({} CPUs, {} GiB RAM, kernel {}). blockwire {}; {}; {}; {}.</p>",
        esc(&r.started_utc),
        esc(&r.finished_utc),
        esc(&r.machine.cpu_model),
        r.machine.cpus,
        r.machine.mem_total_bytes >> 30,
        esc(&r.machine.kernel),
        esc(&r.software.blockwire),
        esc(&r.software.tgt),
        esc(&r.software.vblade),
        esc(&r.software.fio)
    );
    if let Some(a) = &r.aborted {
        let _ = write!(h, "<p class=\"warn\">This run did not finish ({}); the report shows what was measured before.</p>", esc(a));
    }
    // The answer first.
    let recs = recommendations(r);
    if !recs.is_empty() {
        h.push_str("<h2 id=\"answer\">Answer: what to pick, and by how much</h2>");
        h.push_str("<p class=\"note\">Ratio of means with its 95% bootstrap interval. A subject is named only when the whole interval puts it more than 5% ahead of every other subject; otherwise the leaders are a tie.</p>");
        h.push_str("<table><tr><th class=l>scenario</th><th class=l>workload</th><th class=l>fastest</th><th class=l>by</th><th class=l>least CPU per op</th><th class=l>by</th></tr>");
        for row in answer_rows(&recs) {
            h.push_str("<tr>");
            for (i, c) in row.iter().enumerate() {
                let class = if (i == 2 || i == 4) && !c.starts_with("tie") { "l win" } else { "l" };
                let _ = write!(h, "<td class=\"{class}\">{}</td>", esc(c));
            }
            h.push_str("</tr>");
        }
        h.push_str("</table>");
    }
    let p = &r.params;
    let _ = write!(
        h,
        "<p class=\"note\">Parameters: protocols {:?}, peers {:?}, MTU {:?}, suites {:?}, {} repetitions, volume {} MiB, {} s per micro run, {} s per sweep point{}.</p>",
        p.protocols, p.peers, p.mtus, p.suites, p.repeat, p.size_bytes >> 20, p.runtime_s, p.sweep_runtime_s,
        if p.quick { ", --quick" } else { "" }
    );

    // Subjects.
    h.push_str("<h2>Subjects</h2><table><tr><th class=l>subject</th><th class=l>protocol</th><th class=l>target</th><th class=l>initiator</th><th class=l>status</th></tr>");
    for s in &r.subjects {
        let status = match &s.unavailable {
            Some(why) => format!("unavailable: {}", esc(why)),
            None => "measured".into(),
        };
        let _ = write!(
            h,
            "<tr><td class=l><span style=\"color:{}\">■</span> {}</td><td class=l>{}</td><td class=l>{}</td><td class=l>{}</td><td class=l>{}</td></tr>",
            colors.get(&s.key).map(|c| c.as_str()).unwrap_or("#000"),
            esc(&s.key),
            esc(&s.protocol),
            esc(&s.target),
            esc(&s.initiator),
            status
        );
    }
    h.push_str("</table>");

    // Recommendation.
    h.push_str("<h2 id=\"recommendation\">Recommendation</h2>");
    h.push_str("<p class=\"note\">Per workload, among the networked subjects: the best by mean wins only if the 95% bootstrap interval of its advantage over <em>every</em> other subject lies beyond 5%. Subjects were interleaved within each repetition (order rotated between repetitions), so all saw the same machine state. Latency is the median (p50); CPU is target + initiator CPU time per operation.</p>");
    if recs.is_empty() {
        h.push_str("<p>No micro-suite results to compare.</p>");
    }
    let mut by_mtu: BTreeMap<(String, u32), Vec<&Recommendation>> = BTreeMap::new();
    for rec in &recs {
        by_mtu.entry((rec.link.clone(), rec.mtu)).or_default().push(rec);
    }
    for (_, recs) in by_mtu {
        let _ = write!(h, "<h3>{}</h3>", esc(&recs[0].scenario));
        let _ = write!(h, "<table><tr><th class=l>workload</th><th class=l>throughput</th><th class=l>latency</th><th class=l>CPU per op</th><th class=l>best vs local</th></tr>");
        for rec in recs {
            let cell = |d: &Option<Decision>| match d {
                Some(d) if d.winner.is_some() => format!("<td class=\"l win\">{}</td>", esc(&d.text)),
                Some(d) => format!("<td class=\"l tie\">{}</td>", esc(&d.text)),
                None => "<td class=l>–</td>".into(),
            };
            let _ = write!(
                h,
                "<tr><td class=l>{}</td>{}{}{}<td class=l>{}</td></tr>",
                esc(&rec.workload),
                cell(&rec.throughput),
                cell(&rec.latency),
                cell(&rec.cpu),
                esc(rec.vs_local.as_deref().unwrap_or("–"))
            );
        }
        h.push_str("</table>");
    }

    // Findings.
    let fs = findings(r);
    if !fs.is_empty() {
        h.push_str("<h2>Findings of the AoE vs iSCSI study, checked</h2><table><tr><th class=l>claim</th><th class=l>compared</th><th class=l>measured</th><th class=l>verdict</th></tr>");
        for f in fs {
            let _ = write!(
                h,
                "<tr><td class=l>{}</td><td class=l>{}</td><td class=l>{}</td><td class=l>{}</td></tr>",
                esc(f.claim),
                esc(&f.pair),
                esc(&f.measured),
                esc(&f.verdict)
            );
        }
        h.push_str("</table><p class=\"note\">The macro findings (oltp, varmail) need filebench personalities on a file system, which the lab does not run.</p>");
    }

    // Charts per MTU.
    let micro_mtus: Vec<Option<u32>> = {
        let mut v: Vec<Option<u32>> = all.keys().filter(|k| k.suite == "micro").map(|k| k.mtu).collect();
        v.dedup();
        v.sort();
        v.dedup();
        v
    };
    let subjects_in = |mtu: Option<u32>| -> Vec<String> {
        r.subjects
            .iter()
            .map(|s| s.key.clone())
            .filter(|k| all.keys().any(|c| c.suite == "micro" && &c.subject == k && (c.mtu == mtu || c.mtu.is_none())))
            .collect()
    };
    for mtu in micro_mtus.iter().filter(|m| m.is_some()) {
        let mtu_v = mtu.unwrap_or(0);
        let subjects = subjects_in(*mtu);
        let series: Vec<(String, String)> = subjects
            .iter()
            .map(|k| (if k == "local-fio" { "local fio (no network)".to_string() } else { k.clone() }, colors.get(k).cloned().unwrap_or_default()))
            .collect();
        let _ = write!(h, "<h2>Micro benchmarks at MTU {mtu_v}</h2><p class=\"note\">Bars: mean; whiskers: ±1 stddev over the repetitions. The local fio baseline (grey context, no network) appears where it applies.</p>");
        let mut workloads: Vec<(String, bool)> = all
            .values()
            .filter(|c| c.key.suite == "micro" && c.key.mtu == *mtu)
            .map(|c| (c.key.workload.clone(), c.workload.is_sequential()))
            .collect();
        workloads.sort_by_key(|(name, _)| crate::plan::micro_workloads().iter().position(|w| &w.name == name).unwrap_or(99));
        workloads.dedup();
        let charts: [(Metric, Option<Metric>, &str); 6] = [
            (Metric::MibPerS, Some(Metric::Iops), "throughput"),
            (Metric::LatP50Us, None, "latency p50"),
            (Metric::LatP99Us, None, "latency p99"),
            (Metric::TotalCpuUsPerOp, None, "CPU/op, target+initiator"),
            (Metric::CpuMsPerMib, None, "CPU/MiB, target+initiator"),
            (Metric::WireBytesPerOp, None, "wire bytes/op, sent+received"),
        ];
        for (seq_metric, rand_metric, title) in charts {
            h.push_str("<div class=\"charts\">");
            for seq in [true, false] {
                let metric = if seq { seq_metric } else { rand_metric.unwrap_or(seq_metric) };
                let groups: Vec<String> = workloads.iter().filter(|(_, s)| *s == seq).map(|(n, _)| n.clone()).collect();
                if groups.is_empty() {
                    continue;
                }
                let values: Vec<Vec<Option<Bar>>> = groups
                    .iter()
                    .map(|g| {
                        subjects
                            .iter()
                            .map(|subj| {
                                let key = CaseKey {
                                    suite: "micro".into(),
                                    link: if subj == "local-fio" { "none".into() } else { first_link(r) },
                                    mtu: if subj == "local-fio" { None } else { *mtu },
                                    workload: g.clone(),
                                    subject: subj.clone(),
                                };
                                all.get(&key).and_then(|c| c.summary(metric)).map(bar_of)
                            })
                            .collect()
                    })
                    .collect();
                if values.iter().flatten().all(|v| v.is_none()) {
                    continue;
                }
                let t = format!("{title}: {}", if seq { "seq 1 MiB" } else { "random 4 KiB" });
                h.push_str(&svg::grouped_bars(&t, metric.label(), &groups, &series, &values));
            }
            h.push_str("</div>");
        }
    }

    // Full tables.
    h.push_str("<h2>All micro results</h2><p class=\"note\">mean ±stddev [min–max] over the repetitions; CPU from /proc/PID/stat (target) and the client's own getrusage (initiator).</p>");
    h.push_str("<table><tr><th class=l>subject</th><th>MTU</th><th class=l>workload</th><th>n</th><th>IOPS</th><th>MiB/s</th><th>p50 µs</th><th>p99 µs</th><th>p99.9 µs</th><th>target CPU µs/op</th><th>initiator CPU µs/op</th><th>CPU ms/MiB</th><th>wire B/op</th><th>frames/op</th><th>I/O errors</th><th>machine busy before (median)</th></tr>");
    for c in all.values().filter(|c| c.key.suite == "micro") {
        let _ = write!(
            h,
            "<tr><td class=l>{}</td><td>{}</td><td class=l>{}</td><td>{}</td>",
            esc(&c.key.subject),
            c.key.mtu.map(|m| m.to_string()).unwrap_or_else(|| "local".into()),
            esc(&c.key.workload),
            c.samples.len()
        );
        for m in [
            Metric::Iops,
            Metric::MibPerS,
            Metric::LatP50Us,
            Metric::LatP99Us,
            Metric::LatP999Us,
            Metric::TargetCpuUsPerOp,
            Metric::InitiatorCpuUsPerOp,
            Metric::CpuMsPerMib,
            Metric::WireBytesPerOp,
            Metric::FramesPerOp,
        ] {
            let _ = write!(h, "<td>{}</td>", fmt_summary(c.summary(m)));
        }
        let mut busy: Vec<f64> = c.samples.iter().map(|x| x.busy_before).collect();
        busy.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
        let median = busy.get(busy.len() / 2).copied().unwrap_or(0.0);
        let _ = write!(h, "<td>{}</td><td>{:.0}%</td></tr>", c.errors(), median * 100.0);
    }
    h.push_str("</table>");

    // Sweep heat maps.
    let sweep_subjects: Vec<String> = r
        .subjects
        .iter()
        .map(|s| s.key.clone())
        .filter(|k| all.keys().any(|c| c.suite == "sweep" && &c.subject == k))
        .collect();
    if !sweep_subjects.is_empty() {
        let rows: Vec<String> = p.sweep_numjobs.iter().map(|j| j.to_string()).collect();
        let cols: Vec<String> = p.sweep_iodepth.iter().map(|d| d.to_string()).collect();
        let _ = write!(
            h,
            "<h2>Sweep: 4 KiB random 75% read, numjobs × iodepth</h2><p class=\"note\">Per MTU (link {}), {} s per point, mean of the repetitions. Bright = good in both maps. The local fio baseline has no MTU and is shown under each.</p>",
            esc(&first_link(r)),
            p.sweep_runtime_s
        );
        let link = first_link(r);
        for &mtu in &p.mtus {
            let _ = write!(h, "<h3>MTU {mtu}</h3>");
            for subj in &sweep_subjects {
                h.push_str("<div class=\"charts\">");
                for (metric, name) in [(Metric::Iops, "IOPS"), (Metric::LatP99Us, "latency p99 µs")] {
                    let values: Vec<Vec<Option<f64>>> = p
                        .sweep_numjobs
                        .iter()
                        .map(|&j| {
                            p.sweep_iodepth
                                .iter()
                                .map(|&d| {
                                    all.values()
                                        .find(|c| {
                                            c.key.suite == "sweep"
                                                && &c.key.subject == subj
                                                && (c.key.mtu.is_none() || (c.key.mtu == Some(mtu) && c.key.link == link))
                                                && c.workload.numjobs == j
                                                && c.workload.iodepth == d
                                        })
                                        .and_then(|c| c.summary(metric))
                                        .map(|s| s.mean)
                                })
                                .collect()
                        })
                        .collect();
                    if values.iter().flatten().all(|v| v.is_none()) {
                        continue;
                    }
                    h.push_str(&svg::heatmap(&format!("{subj} MTU {mtu}: {name}"), "numjobs", "iodepth", &rows, &cols, &values, metric.higher_is_better()));
                }
                h.push_str("</div>");
            }
        }
    }

    // Overhead.
    h.push_str(&overhead_section(r, &all));
    h.push_str(&net_section(r));
    h.push_str(&crate::route::report::section(r.route.as_ref()));

    // Method notes.
    let _ = write!(
        h,
        "<h2>How this was measured</h2><ul class=\"note\">\
<li><b>Backing:</b> {}. Every target (blockwire serve, tgtd, vblade) and the local fio baseline use this same tmpfs file, so the only difference between subjects is the protocol and the implementation, not the storage. (A private RAM disk for blockwire would skip the kernel's tmpfs read/write path that the peers pay, favouring blockwire.)</li>\
<li><b>Topology:</b> two network namespaces joined by one veth pair per MTU; every target runs in the target namespace for the whole link (blockwire serve exports AoE, iSCSI and NVMe/TCP at once; tgt and vblade listen on their own port and shelf), and the subjects take turns: each workload runs every subject once per repetition, in an order rotated between repetitions, so slow drifts of the machine hit all subjects alike. The initiator is always <code>blockwire bench</code> in the client namespace. TSO/GSO/GRO are {} on the veths, so frames have real MTU sizes.</li>\
<li><b>Cache:</b> blockwire's initiators have no page cache or write-back cache, so the studies' <em>cached</em> variants do not apply and are not run; every result here is uncached.</li>\
<li><b>CPU:</b> target CPU = utime+stime delta of the target process (all threads) from /proc/PID/stat across the bench run (includes its connection setup); initiator CPU = user+system time the bench reports for itself; fio's from getrusage of the fio process and its jobs.</li>\
<li><b>Wire:</b> bytes and frames = rx+tx deltas of the client-side veth counters over the bench run, Ethernet header included, no preamble/FCS; they include the login/discovery of each run. Header bytes per frame = (wire bytes − payload bytes) / frames, ACKs and requests included.</li>\
<li><b>Idle:</b> before each run the lab waits until the machine is less than {:.0}% busy (from /proc/stat, at most {:.0} s per run and {:.0} s per lab run in total, so a shared machine cannot stretch the run); the busy share before each run is stored with the sample in results.json and its median per case is shown in the results table.</li>\
<li><b>Sweep:</b> runs at every MTU and link; the heat maps show the first link.</li>\
<li><b>Local fio latency</b> for mixed loads: p50 of the dominant direction, p99/p99.9 the worse of read and write.</li></ul>",
        esc(&p.backing),
        if p.veth_offloads_off { "off" } else { "left ON (ethtool failed)" },
        p.idle_threshold * 100.0,
        p.idle_max_wait_s,
        p.idle_budget_s
    );

    if !r.failures.is_empty() {
        h.push_str("<h2>Failures</h2><table><tr><th class=l>subject</th><th>MTU</th><th class=l>workload</th><th class=l>reason</th></tr>");
        for f in &r.failures {
            let _ = write!(
                h,
                "<tr><td class=l>{}</td><td>{}</td><td class=l>{}</td><td class=l>{}</td></tr>",
                esc(&f.subject),
                f.mtu.map(|m| m.to_string()).unwrap_or_default(),
                esc(if f.workload.is_empty() { "(start)" } else { &f.workload }),
                esc(&f.reason)
            );
        }
        h.push_str("</table>");
    }
    h.push_str("</body></html>\n");
    h
}

/// The net suite: iperf3 rate and CPU per link shape, MTU and stream count.
fn net_section(r: &Results) -> String {
    let mut h = String::new();
    if r.net.is_empty() {
        return h;
    }
    let _ = write!(
        h,
        "<h2 id=\"net\">Network first: iperf3 between the namespaces</h2><p class=\"note\">TCP, {} s per run, mean over the repetitions (min–max in grey). CPU: iperf3's own share of one CPU on the sending client and the receiving server. A shaped link is tc tbf on both veth ends; the rate reached is what the row shows. The best row per link and MTU is the ceiling shown beside the protocols in the answer table.</p>",
        r.params.net_runtime_s
    );
    h.push_str("<table><tr><th class=l>link</th><th>MTU</th><th>streams</th><th>Gbit/s</th><th>MiB/s</th><th>retransmits</th><th>client CPU %</th><th>server CPU %</th></tr>");
    let mut keys: Vec<(String, u32, u32)> = r.net.iter().map(|s| (s.link.clone(), s.mtu, s.streams)).collect();
    keys.sort();
    keys.dedup();
    for (link, mtu, streams) in keys {
        let v: Vec<&crate::net::NetSample> = r.net.iter().filter(|s| s.link == link && s.mtu == mtu && s.streams == streams).collect();
        let n = v.len() as f64;
        let mean = |f: &dyn Fn(&crate::net::NetSample) -> f64| v.iter().map(|s| f(s)).sum::<f64>() / n;
        let (lo, hi) = v.iter().fold((f64::MAX, 0.0f64), |(lo, hi), s| (lo.min(s.bits_per_s), hi.max(s.bits_per_s)));
        let _ = write!(
            h,
            "<tr><td class=l>{}</td><td>{mtu}</td><td>{streams}</td><td>{:.2} <span class=\"tie\">[{:.2}–{:.2}]</span></td><td>{:.0}</td><td>{:.0}</td><td>{:.0}</td><td>{:.0}</td></tr>",
            esc(&link),
            mean(&|s| s.bits_per_s) / 1e9,
            lo / 1e9,
            hi / 1e9,
            mean(&|s| s.bits_per_s) / 8.0 / 1_048_576.0,
            mean(&|s| s.retransmits as f64),
            mean(&|s| s.client_cpu_pct),
            mean(&|s| s.server_cpu_pct)
        );
    }
    h.push_str("</table>");
    h
}

fn overhead_section(r: &Results, all: &BTreeMap<CaseKey, Case>) -> String {
    let mut h = String::new();
    h.push_str("<h2>Header overhead per frame</h2><p class=\"note\">Measured on the 1 MiB sequential cases: non-payload bytes per frame (Ethernet/IP/TCP/protocol headers, requests, ACKs) and payload share of the wire. Next to it, the per-frame header cost the MPLS study lists (docs/studies.md, study 3).</p><div class=\"charts\"><table><tr><th class=l>subject</th><th>MTU</th><th>read: header B/frame</th><th>read: frames/MiB</th><th>read: payload share</th><th>write: header B/frame</th><th>write: payload share</th></tr>");
    let mut any = false;
    for s in r.subjects.iter().filter(|s| s.protocol != "local") {
        for &mtu in &r.params.mtus {
            let get = |w: &str| all.get(&CaseKey { suite: "micro".into(), link: first_link(r), mtu: Some(mtu), workload: w.into(), subject: s.key.clone() });
            let (rd, wr) = (get("seqread-1m"), get("seqwrite-1m"));
            if rd.is_none() && wr.is_none() {
                continue;
            }
            any = true;
            let hb = |c: Option<&Case>| c.and_then(|c| c.summary(Metric::HeaderBytesPerFrame)).map(|s| format!("{:.1}", s.mean)).unwrap_or("–".into());
            let share = |c: Option<&Case>| {
                c.and_then(|c| {
                    let payload: u64 = c.samples.iter().map(|x| x.bench.bytes).sum();
                    let wire: u64 = c.samples.iter().filter_map(|x| x.wire.map(|w| w.bytes())).sum();
                    if wire > 0 { Some(format!("{:.1}%", payload as f64 / wire as f64 * 100.0)) } else { None }
                })
                .unwrap_or("–".into())
            };
            let frames_per_mib = rd
                .and_then(|c| c.summary(Metric::FramesPerOp))
                .map(|s| format!("{:.0}", s.mean))
                .unwrap_or("–".into());
            let _ = write!(
                h,
                "<tr><td class=l>{}</td><td>{mtu}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&s.key),
                hb(rd),
                frames_per_mib,
                share(rd),
                hb(wr),
                share(wr)
            );
        }
    }
    if !any {
        h.push_str("<tr><td class=l colspan=7>no sequential cases measured</td></tr>");
    }
    h.push_str("</table><table><tr><th class=l>study 3: encapsulation</th><th>header B/frame</th></tr>");
    for (name, b) in STUDIES_HEADER_TABLE {
        let _ = write!(h, "<tr><td class=l>{name}</td><td>{b}</td></tr>");
    }
    h.push_str("</table></div>");
    h
}

/// Quick textual check used by tests: sample count per subject.
pub fn sample_counts(samples: &[Sample]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for s in samples {
        *m.entry(s.subject.clone()).or_insert(0) += 1;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::*;

    fn sample(subject: &str, mtu: Option<u32>, workload: &str, rep: u32, iops: f64, cpu: f64) -> Sample {
        let wl = crate::plan::micro_workloads().into_iter().find(|w| w.name == workload).unwrap();
        let ios = (iops * 2.0) as u64;
        Sample {
            subject: subject.into(),
            mtu,
            link: "none".into(),
            suite: "micro".into(),
            workload: wl.clone(),
            repeat: rep,
            bench: BenchResult {
                iops,
                bw_bytes: iops * wl.bs as f64,
                lat_ns: Latency { p50: 1e9 / iops, p99: 3e9 / iops, p999: 5e9 / iops, mean: 1.1e9 / iops },
                cpu_user_s: cpu / 2.0,
                cpu_sys_s: cpu / 2.0,
                ios,
                bytes: ios * wl.bs,
                runtime_s: 2.0,
                errors: 0,
            },
            target_cpu_s: mtu.map(|_| cpu),
            wire: mtu.map(|_| WireCounters { rx_bytes: ios * (wl.bs + 200), tx_bytes: ios * 100, rx_packets: ios * 3, tx_packets: ios * 3 }),
            busy_before: 0.01,
            idle_wait_s: 0.3,
            started_unix: 0.0,
        }
    }

    fn results() -> Results {
        let mut r = Results { format: FORMAT, ..Default::default() };
        r.params.mtus = vec![1500];
        r.params.repeat = 3;
        r.params.sweep_numjobs = vec![1, 4];
        r.params.sweep_iodepth = vec![1, 16];
        for (k, p, t) in [("blockwire-aoe", "aoe", "blockwire"), ("blockwire-iscsi", "iscsi", "blockwire"), ("local-fio", "local", "tmpfs file")] {
            r.subjects.push(Subject { key: k.into(), protocol: p.into(), target: t.into(), initiator: "blockwire".into(), unavailable: None });
        }
        r.subjects.push(Subject {
            key: "blockwire-nvme".into(),
            protocol: "nvme".into(),
            target: "blockwire".into(),
            initiator: "blockwire".into(),
            unavailable: Some("blockwire serve exited: nvme not built yet".into()),
        });
        for (rep, jitter) in [(1, 0.98), (2, 1.0), (3, 1.02)] {
            for w in ["seqread-1m", "randread-4k-qd1", "randrw75-4k-qd16"] {
                r.samples.push(sample("blockwire-aoe", Some(1500), w, rep, 20_000.0 * jitter, 1.0));
                // iSCSI: clearly slower on seq read, same on random reads.
                let iops = if w == "seqread-1m" { 15_000.0 } else { 20_000.0 * (2.0 - jitter) };
                r.samples.push(sample("blockwire-iscsi", Some(1500), w, rep, iops, 1.3));
                r.samples.push(sample("local-fio", None, w, rep, 90_000.0 * jitter, 0.5));
            }
            let mut s = sample("blockwire-aoe", Some(1500), "randread-4k-qd1", rep, 1000.0, 1.0);
            s.suite = "sweep".into();
            s.workload = crate::plan::sweep_workload(4, 16);
            r.samples.push(s);
        }
        r
    }

    #[test]
    fn decisions_respect_the_noise() {
        let e = |n: &str, v: &[f64]| (n.to_string(), v.to_vec());
        let a = [100.0, 101.0, 99.0, 100.5, 99.5];
        let b = [80.0, 81.0, 79.0, 80.5, 79.5];
        let c = [99.0, 102.0, 98.0, 101.0, 100.0];
        let d = decide(Metric::Iops, &[e("a", &a), e("b", &b)]).unwrap();
        assert_eq!(d.winner.as_deref(), Some("a"));
        assert!(d.text.starts_with("a: 25% more IOPS ("), "{}", d.text);
        assert!(d.text.ends_with(" than b"), "{}", d.text);
        let d = decide(Metric::Iops, &[e("a", &a), e("b", &b), e("c", &c)]).unwrap();
        assert_eq!(d.winner, None, "a and c are within the noise: {}", d.text);
        assert!(d.text.starts_with("within the noise: a vs c: 0% more IOPS ("), "{}", d.text);
        // Lower is better for latency: b wins, told as a saving.
        let d = decide(Metric::LatP50Us, &[e("a", &a), e("b", &b)]).unwrap();
        assert_eq!(d.winner.as_deref(), Some("b"));
        assert!(d.text.starts_with("b: 20% less median latency ("), "{}", d.text);
        // Single runs: never a winner.
        let d = decide(Metric::Iops, &[e("x", &[10.0]), e("y", &[5.0])]).unwrap();
        assert_eq!(d.winner, None);
        assert!(d.text.contains("no winner claimed"), "{}", d.text);
    }

    #[test]
    fn recommendations_and_findings_from_recorded_results() {
        let r = results();
        let recs = recommendations(&r);
        assert_eq!(recs.len(), 3);
        let seq = recs.iter().find(|x| x.workload == "seqread-1m").unwrap();
        assert_eq!(seq.throughput.as_ref().unwrap().winner.as_deref(), Some("blockwire-aoe"));
        assert!(seq.vs_local.as_ref().unwrap().contains("22%"), "{:?}", seq.vs_local);
        let rnd = recs.iter().find(|x| x.workload == "randread-4k-qd1").unwrap();
        assert_eq!(rnd.throughput.as_ref().unwrap().winner, None);
        // AoE needs less CPU per op in every case (1.0 vs 1.3 s over the same ops... per op).
        let cpu = recs.iter().find(|x| x.workload == "seqread-1m").unwrap().cpu.as_ref().unwrap();
        assert_eq!(cpu.winner.as_deref(), Some("blockwire-aoe"));
        let fs = findings(&r);
        let seqf = fs.iter().find(|f| f.claim.starts_with("AoE ~20%") && f.pair.starts_with("blockwire")).unwrap();
        assert_eq!(seqf.verdict, "reproduced");
        let rndf = fs.iter().find(|f| f.claim.starts_with("equal on")).unwrap();
        assert!(rndf.verdict.starts_with("reproduced"), "{}", rndf.verdict);
    }

    #[test]
    fn html_is_self_contained_with_charts() {
        let r = results();
        let page = html(&r);
        assert!(page.contains("<svg class=\"chart\""));
        assert!(page.contains("heatmap"));
        assert!(page.contains("id=\"recommendation\""));
        assert!(page.contains("unavailable: blockwire serve exited: nvme not built yet"));
        assert!(page.contains("iSCSI/TCP/IP"));
        for forbidden in ["http://", "https://", "src=", "<link", "@import"] {
            let without_ns = page.replace("http://www.w3.org/2000/svg", "");
            assert!(!without_ns.contains(forbidden), "external reference {forbidden}");
        }
        assert!(!page.contains("NaN"));
        let c = csv(&r);
        let lines: Vec<&str> = c.lines().collect();
        assert_eq!(lines.len(), r.samples.len() + 1);
        let cols = lines[0].split(',').count();
        assert!(lines.iter().all(|l| l.split(',').count() == cols));
        assert_eq!(sample_counts(&r.samples)["blockwire-aoe"], 12);
    }
}
