//! report.html: one self-contained page (inline CSS and SVG, one tiny
//! inline script that only marks the charts as rendered for automated
//! checks), rendered with maud from the analysis. The page is a list of
//! sections ([`SECTIONS`]); a suite with results of its own adds one
//! entry there and a function that renders it (or `None` when it did not
//! run).

use crate::analysis::{self, first_link, mem_name, row_order, with_interval, FsCase, FsKey, Recommendation};
use crate::findings::{self, Finding};
use bw_lab_results::accounting::{Case, CaseKey, Metric};
use bw_lab_results::{LinkName, MicroWorkload, Results, SubjectKey, Suite};
use bw_lab_results::stats::{mean_ci, Summary};
use crate::context::Ctx;
use crate::svg::{self, Bar};
use maud::{html, Markup, PreEscaped, DOCTYPE};
use std::collections::BTreeMap;

/// Header cost per frame from the MPLS study, for comparison.
pub const STUDIES_HEADER_TABLE: [(&str, u32); 7] = [
    ("AoE", 32),
    ("AoE/MPLS", 50),
    ("AoE/GRE/IP", 80),
    ("AoE/L2TP/UDP/IP", 86),
    ("iSCSI/TCP/IP", 102),
    ("iSCSI/MPLS", 120),
    ("FCIP/iFCP", 82),
];

/// One part of the page.
pub struct Section {
    pub id: &'static str,
    pub title: &'static str,
    /// `None` when the run has nothing for this section.
    pub render: fn(&Ctx) -> Option<Markup>,
}

/// The page, in order. The answer leads; the detail follows.
pub const SECTIONS: &[Section] = &[
    Section { id: "answer", title: "Answer: what to pick, and by how much", render: answer },
    Section { id: "subjects", title: "Subjects", render: subjects },
    Section { id: "hosts", title: "Hosts", render: hosts },
    Section { id: "resumed", title: "A resumed run: which start measured what", render: crate::resumed::section },
    Section { id: "findings", title: "The studies' findings, checked", render: findings_section },
    Section { id: "recommendation", title: "Recommendation in detail", render: recommendation },
    Section { id: "net", title: "Network first: iperf3 between the namespaces", render: net },
    Section { id: "links", title: "Links", render: links },
    Section { id: "micro", title: "Micro benchmarks", render: micro },
    Section { id: "sweep", title: "Sweep: 4 KiB random 75% read, numjobs × iodepth", render: sweep },
    Section { id: "fs", title: "File systems: ext4 over each protocol, client memory limited", render: fs },
    Section { id: "fs-factor", title: "File systems compared: each against the raw device, locally and per protocol (study 4)", render: crate::factors::fs_section },
    Section { id: "offload", title: "Offloads and digests: CPU per unit of throughput (study 5)", render: crate::factors::section },
    Section { id: "overhead", title: "Header overhead per frame", render: overhead },
    Section { id: "route", title: "Routed paths: MPLS and VXLAN (study 3)", render: route },
    Section { id: "method", title: "How this was measured", render: method },
    Section { id: "failures", title: "Failures", render: failures },
];

const CSS: &str = r#"
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1280px;padding:0 16px;color:#222}
h1{font-size:24px}h2{font-size:19px;margin-top:32px;border-bottom:1px solid #ccc}h3{font-size:16px}
table{border-collapse:collapse;margin:8px 0;font-size:12.5px}td,th{border:1px solid #ddd;padding:3px 7px;text-align:right;vertical-align:top}
th{background:#f4f4f4}td.l,th.l{text-align:left}.win{color:#1a7f37;font-weight:600}.tie{color:#777}
.yes{color:#1a7f37;font-weight:600}.no{color:#b42318;font-weight:600}.na{color:#777}
.charts{display:flex;flex-wrap:wrap;gap:12px}.chart{background:#fff;border:1px solid #e4e4e4}
.chart .title{font-size:13px;font-weight:600}.chart .small{font-size:10.5px}.chart .grid{stroke:#eee}.chart .axis{stroke:#444}
.chart .whisker{stroke:#000;stroke-width:1}.note{color:#555;font-size:13px}.warn{background:#fff4e5;border:1px solid #f0c36d;padding:8px}
code{background:#f4f4f4;padding:0 3px}nav a{margin-right:10px}details{margin:6px 0}summary{cursor:pointer;color:#1f4f8f}
"#;

/// Marks the document once every chart has a non-empty laid-out box, so a
/// headless browser's DOM dump shows the charts really rendered.
const CHECK_SCRIPT: &str = r#"
var bwErrors=0;window.addEventListener('error',function(){bwErrors++;});
window.addEventListener('load',function(){var s=document.querySelectorAll('svg.chart'),ok=0;
for(var i=0;i<s.length;i++){var b=s[i].getBBox();if(b.width>0&&b.height>0&&s[i].querySelectorAll('rect').length>0)ok++;}
var d=document.body;d.setAttribute('data-charts',String(s.length));d.setAttribute('data-charts-rendered',String(ok));d.setAttribute('data-errors',String(bwErrors));});
"#;

pub fn page(r: &Results) -> String {
    let ctx = Ctx::new(r);
    let rendered: Vec<(&Section, Markup)> = SECTIONS.iter().filter_map(|s| (s.render)(&ctx).map(|m| (s, m))).collect();
    let m = &r.machine;
    let sw = &r.software;
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { "blockwire lab report" }
                style { (PreEscaped(CSS)) }
                script { (PreEscaped(CHECK_SCRIPT)) }
            }
            body {
                h1 { "blockwire lab: AoE, iSCSI and NVMe/TCP side by side" }
                p.note {
                    "Run " (r.started_utc) " → " (r.finished_utc) " on " (m.cpu_model) " (" (m.cpus) " CPUs, "
                    (m.mem_total_bytes >> 30) " GiB RAM, kernel " (m.kernel)
                    @if !r.params.tcp_congestion.is_empty() {
                        ", TCP congestion control " (r.params.tcp_congestion) " in the lab's namespaces"
                        @if !m.tcp_congestion.is_empty() && m.tcp_congestion != r.params.tcp_congestion { " (the system's: " (m.tcp_congestion) ")" }
                    }
                    @else if !m.tcp_congestion.is_empty() { ", TCP congestion control " (m.tcp_congestion) }
                    "). " (sw.blockwire) "; " @for p in &sw.peers { (p.version) "; " } (sw.fio) "."
                }
                @if let Some(a) = &r.aborted {
                    p.warn { "This run did not finish (" (a) "); the report shows what was measured before." }
                }
                nav { @for (s, _) in &rendered { a href=(format!("#{}", s.id)) { (s.title) } } }
                @for (s, body) in &rendered {
                    section id=(s.id) {
                        h2 { (s.title) }
                        (body)
                    }
                }
            }
        }
    }
    .into_string()
        + "\n"
}

/// The route suite renders its own body (its section: `crate::route::section`).
fn route(c: &Ctx) -> Option<Markup> {
    c.r.route.as_ref().map(|r| PreEscaped(crate::route::section(Some(r))))
}

fn answer(c: &Ctx) -> Option<Markup> {
    let p = &c.r.params;
    let rows = analysis::answer_rows(&c.recs);
    Some(html! {
        p.note { "Ratio of means with its 95% bootstrap interval. A subject is named only when the whole interval puts it more than 5% ahead of every other subject; otherwise the leaders are a tie. Micro rows: blockwire bench on the raw volume; fs rows: workloads on ext4 over blockwire mount, in a memory cgroup of the stated size." }
        @if rows.is_empty() {
            p { "No comparisons: no micro or fs results." }
        } @else {
            table {
                tr { th.l { "scenario" } th.l { "workload" } th.l { "fastest" } th.l { "by" } th.l { "least CPU per op" } th.l { "by" } }
                @for row in &rows {
                    tr {
                        @for (i, cell) in row.iter().enumerate() {
                            // A winner's cell is the bare subject name; ties,
                            // "only X measured" and untested leads have words.
                            @let pick = (i == 2 || i == 4) && cell != "-" && !cell.contains(' ');
                            td class=(if pick { "l win" } else { "l" }) { (cell) }
                        }
                    }
                }
            }
            @let bound: Vec<(&Recommendation, &analysis::ClientBound)> = c.recs.iter().flat_map(|r| r.client_bound.iter().map(move |b| (r, b))).collect();
            @if !bound.is_empty() {
                p.warn { "Where the client is the bottleneck (its CPU per operation over " (analysis::CLIENT_BOUND_RATIO) "x its target's, on a machine whose CPUs were full), a verdict says more about the initiator, the lab's instrument, than about the target:" }
                ul { @for (rec, b) in &bound { li { (rec.scenario) " " (rec.workload) ": " (b.text()) } } }
            }
        }
        p.note {
            "Clients: " (c.r.subjects.iter().map(|s| format!("{} by {}", s.key, s.initiator)).collect::<Vec<_>>().join("; ")) "."
        }
        p.note {
            "Parameters: protocols " (p.protocols.join(", ")) "; peers " (if p.peers.is_empty() { "none".to_string() } else { p.peers.join(", ") })
            "; MTU " (p.mtus.iter().map(|m| m.to_string()).collect::<Vec<_>>().join(", ")) "; links " (p.links.iter().map(LinkName::as_str).collect::<Vec<_>>().join(", "))
            "; suites " (p.suites.join(", ")) "; " (p.repeat) " repetitions; volume " (p.size_bytes >> 20) " MiB; "
            (p.runtime_s) " s per micro run, " (p.sweep_runtime_s) " s per sweep point"
            @if p.quick { "; --quick" } "."
        }
    })
}

/// The machines of a run across hosts, and the network between them.
fn hosts(c: &Ctx) -> Option<Markup> {
    let r = c.r;
    if r.hosts.is_empty() {
        return None;
    }
    let best = r.net.iter().map(|s| s.bits_per_s).fold(None, |a: Option<f64>, b| Some(a.map_or(b, |a| a.max(b))));
    Some(html! {
        table {
            tr { th.l { "role" } th.l { "host" } th.l { "CPU" } th { "CPUs" } th.l { "kernel" } th.l { "NIC" } th.l { "driver" } th { "speed" } th { "MTU" } th.l { "TCP congestion" } th.l { "emulated" } }
            @for h in &r.hosts {
                tr {
                    td.l { (h.role) } td.l { (h.address) } td.l { (h.cpu_model) } td { (h.cpus) } td.l { (h.kernel) }
                    td.l { (h.nic) } td.l { (h.nic_driver) }
                    td { @if let Some(s) = h.link_speed_mbps { (format!("{s} Mbit/s")) } @else { "-" } }
                    td { (h.mtu) } td.l { (h.tcp_congestion) }
                    td.l class=(if h.emulated { "no" } else { "" }) { (if h.emulated { "yes (a VM: its timings are the VM's)" } else { "no" }) }
                }
            }
        }
        p.note {
            "iperf3 between them: "
            @if let Some(b) = best { (format!("{:.2} Gbit/s (the net suite's best)", b / 1e9)) } @else { "not measured (the net suite did not run)" }
            @if r.ssh_commands > 0 { "; the run issued " (r.ssh_commands) " ssh commands over one multiplexed connection per host" } "."
        }
    })
}

fn subjects(c: &Ctx) -> Option<Markup> {
    Some(html! {
        table {
            tr { th.l { "subject" } th.l { "protocol" } th.l { "target" } th.l { "initiator" } th.l { "status" } }
            @for s in &c.r.subjects {
                tr {
                    td.l { span style=(format!("color:{}", c.color(&s.key))) { "■" } " " (s.key) }
                    td.l { (s.protocol) }
                    td.l {
                        @if s.external { "external: " }
                        (s.target) @if !s.target_datapath.is_empty() { " (" (s.target_datapath.join(", ")) " datapath)" }
                        @if let Some(id) = &s.identity { " (" (id) ")" }
                        @if let Some(x) = &s.settings { br; small { (x) } }
                    }
                    td.l { (s.initiator) }
                    td.l {
                        @match &s.unavailable { Some(why) => { "unavailable: " (why) }, None => { "measured" } }
                        @if !s.skipped.is_empty() { br; small { (s.skipped.join("; ")) } }
                    }
                }
            }
        }
    })
}

fn findings_section(c: &Ctx) -> Option<Markup> {
    if c.findings.is_empty() {
        return None;
    }
    Some(html! {
        p.note { "Five published comparisons shaped what the lab measures. Each finding the lab can check is checked on this run: reproduced, not reproduced, not applicable (and why), or inconclusive when nothing was apart by more than 5%. Ratios are ratios of means with their 95% bootstrap interval." }
        @for (n, text) in findings::STUDIES {
            p { b { "Study " (n) ". " } (text) }
            @let rows: Vec<&Finding> = c.findings.iter().filter(|f| f.study == n).collect();
            @if !rows.is_empty() {
                table {
                    tr { th.l { "finding" } th.l { "compared" } th.l { "measured" } th.l { "verdict" } th.l { "why" } }
                    @for f in rows {
                        tr { td.l { (f.claim) } td.l { (f.compared) } td.l { (f.measured) } td class=(format!("l {}", f.verdict.class())) { (f.verdict.word()) } td.l { (f.why) } }
                    }
                }
            }
        }
    })
}

fn decision_cell(d: &Option<analysis::Decision>) -> Markup {
    html! {
        @match d {
            Some(d) if d.winner.is_some() => td."l win" { (d.text) },
            Some(d) => td."l tie" { (d.text) },
            None => td.l { "–" },
        }
    }
}

fn recommendation(c: &Ctx) -> Option<Markup> {
    if c.recs.is_empty() {
        return None;
    }
    let mut by_scenario: BTreeMap<(&str, LinkName, u32, u64), Vec<&Recommendation>> = BTreeMap::new();
    for rec in &c.recs {
        by_scenario.entry((rec.suite, rec.link.clone(), rec.mtu, rec.client_mem.unwrap_or(0))).or_default().push(rec);
    }
    Some(html! {
        p.note { "Per workload, among the networked subjects: the best by mean wins only if the 95% bootstrap interval of its advantage over every other subject lies beyond 5%. Subjects were interleaved within each repetition (order rotated between repetitions), so all saw the same machine state. Micro latency is the median (p50); fs latency is the row's slowest mean (response time, the slowest flowop, or Bonnie++'s worst request). CPU is target + initiator CPU time per operation (for fs: the workload, the attach daemon and the target)." }
        @for (_, recs) in &by_scenario {
            h3 { (recs[0].suite) ": " (recs[0].scenario) }
            table {
                tr { th.l { "workload" } th.l { "throughput" } th.l { "latency" } th.l { "CPU per op" } th.l { "best vs local" } }
                @for rec in recs {
                    tr { td.l { (rec.workload) } (decision_cell(&rec.throughput)) (decision_cell(&rec.latency)) (decision_cell(&rec.cpu)) td.l { (rec.vs_local.as_deref().unwrap_or("–")) } }
                }
            }
            @for rec in recs {
                @for b in &rec.client_bound {
                    p.warn { (rec.workload) ": " (b.text()) }
                }
            }
        }
    })
}

fn net(c: &Ctx) -> Option<Markup> {
    let r = c.r;
    if r.net.is_empty() {
        return None;
    }
    let mut keys: Vec<(LinkName, u32, u32)> = r.net.iter().map(|s| (s.link.clone(), s.mtu, s.streams)).collect();
    keys.sort();
    keys.dedup();
    Some(html! {
        p.note { "TCP, " (r.params.net_runtime_s) " s per run, mean over the repetitions (95% interval in grey when repeated). CPU: iperf3's own share of one CPU on the sending client and the receiving server. The best row per link and MTU is the ceiling shown beside the protocols in the answer table." }
        table {
            tr { th.l { "link" } th { "MTU" } th { "streams" } th { "Gbit/s" } th { "MiB/s" } th { "retransmits" } th { "client CPU %" } th { "server CPU %" } }
            @for (link, mtu, streams) in &keys {
                @let v: Vec<&bw_lab_results::net::NetSample> = r.net.iter().filter(|s| &s.link == link && s.mtu == *mtu && s.streams == *streams).collect();
                @let bps: Vec<f64> = v.iter().map(|s| s.bits_per_s / 1e9).collect();
                @let avg = |f: &dyn Fn(&bw_lab_results::net::NetSample) -> f64| v.iter().map(|s| f(s)).sum::<f64>() / v.len().max(1) as f64;
                tr {
                    td.l { (link) } td { (mtu) } td { (streams) }
                    td { (format!("{:.2}", analysis::mean(&bps))) @if let Some((lo, hi)) = mean_ci(&bps) { " " span.tie { (format!("[{lo:.2}–{hi:.2}]")) } } }
                    td { (format!("{:.0}", avg(&|s| s.bits_per_s) / 8.0 / 1_048_576.0)) }
                    td { (format!("{:.0}", avg(&|s| s.retransmits as f64))) }
                    td { (format!("{:.0}", avg(&|s| s.client_cpu_pct))) }
                    td { (format!("{:.0}", avg(&|s| s.server_cpu_pct))) }
                }
            }
        }
    })
}

fn links(c: &Ctx) -> Option<Markup> {
    let r = c.r;
    let shapes: Vec<bw_lab_results::net::LinkShape> = if r.params.link_shapes.is_empty() {
        r.params.links.iter().filter_map(|l| bw_lab_results::net::parse_link(l.as_str()).ok()).collect()
    } else {
        r.params.link_shapes.clone()
    };
    if shapes.is_empty() {
        return None;
    }
    Some(html! {
        p.note { "A shaped link is tc tbf on both veth ends (egress of each), with a bucket of 4 ms of traffic (at least 64 KiB) and at most 20 ms of queue. The unshaped veth runs as fast as the CPUs move packets. Reached: the best iperf3 rate on that link and MTU (the net suite), and the best 1 MiB sequential read of any subject." }
        table {
            tr { th.l { "link" } th { "MTU" } th { "configured" } th { "tbf burst" } th { "iperf3 reached" } th { "of configured" } th.l { "best 1 MiB reader" } }
            @for s in &shapes {
                @for &mtu in &r.params.mtus {
                    @let ceiling = bw_lab_results::net::ceiling(&r.net, &s.name, mtu);
                    @let best = c.micro.values()
                        .filter(|k| k.key.suite == Suite::Micro && k.key.link == s.name && k.key.mtu == Some(mtu) && k.key.workload == MicroWorkload::SeqRead1m.name())
                        .filter_map(|k| k.summary(Metric::MibPerS).map(|m| (k.key.subject.clone(), m.mean)))
                        .max_by(|a, b| a.1.total_cmp(&b.1));
                    tr {
                        td.l { (s.name) } td { (mtu) }
                        td { @match s.bits_per_s { Some(b) => { (format!("{:.2} Gbit/s", b as f64 / 1e9)) }, None => { "unshaped" } } }
                        td { @match s.bits_per_s { Some(b) => { (format!("{} KiB", bw_lab_results::net::tbf_burst(b) / 1024)) }, None => { "–" } } }
                        td { @match ceiling { Some((bps, n)) => { (format!("{:.2} Gbit/s ({n} streams)", bps / 1e9)) }, None => { "–" } } }
                        td { @match (ceiling, s.bits_per_s) { (Some((bps, _)), Some(b)) => { (format!("{:.0}%", bps / b as f64 * 100.0)) }, _ => { "–" } } }
                        td.l { @match best { Some((who, mib)) => { (who) " " (format!("{mib:.0} MiB/s")) }, None => { "–" } } }
                    }
                }
            }
        }
    })
}

fn bar_of(s: Summary) -> Bar {
    Bar { mean: s.mean, lo: (s.mean - s.stddev).max(0.0), hi: s.mean + s.stddev }
}

fn fmt_summary(s: Option<Summary>) -> Markup {
    html! {
        @match s {
            None => { "–" },
            Some(s) if s.n < 2 => { (svg::short(s.mean)) },
            Some(s) => { (svg::short(s.mean)) " ±" (svg::short(s.stddev)) " " span.tie { "[" (svg::short(s.min)) "–" (svg::short(s.max)) "]" } },
        }
    }
}

fn micro(c: &Ctx) -> Option<Markup> {
    let r = c.r;
    let all = &c.micro;
    if !all.keys().any(|k| k.suite == Suite::Micro) {
        return None;
    }
    let link = first_link(r);
    let mut mtus: Vec<u32> = all.keys().filter(|k| k.suite == Suite::Micro).filter_map(|k| k.mtu).collect();
    mtus.sort();
    mtus.dedup();
    let charts: [(Metric, Option<Metric>, &str); 7] = [
        (Metric::MibPerS, Some(Metric::Iops), "throughput"),
        (Metric::LatP50Us, None, "latency p50"),
        (Metric::LatP99Us, None, "latency p99"),
        (Metric::TotalCpuUsPerOp, None, "CPU/op, target+initiator"),
        (Metric::CpuMsPerMib, None, "CPU/MiB, target+initiator"),
        (Metric::MachineCpuSPerGb, Some(Metric::MachineCpuUsPerOp), "whole-machine CPU, idle subtracted"),
        (Metric::WireBytesPerOp, None, "wire bytes/op, sent+received"),
    ];
    let order = |name: &str| bw_lab_results::micro_workloads().iter().position(|w| w.name == name).unwrap_or(99);
    let table_metrics = [
        Metric::Iops,
        Metric::MibPerS,
        Metric::LatP50Us,
        Metric::LatP99Us,
        Metric::LatP999Us,
        Metric::TargetCpuUsPerOp,
        Metric::InitiatorCpuUsPerOp,
        Metric::CpuMsPerMib,
        Metric::MachineCpuSPerGb,
        Metric::MachineCpuUsPerOp,
        Metric::WireBytesPerOp,
        Metric::FramesPerOp,
    ];
    Some(html! {
        p.note { "blockwire bench (queue depth and jobs as named) against each subject from the client namespace, and fio (io_uring) on the backing file as the local baseline. Bars: mean; whiskers: ±1 standard deviation over the repetitions. Charts show link " (link) "; the tables every link." }
        @for &mtu in &mtus {
            @let subjects: Vec<SubjectKey> = r.subjects.iter().map(|s| s.key.clone())
                .filter(|k| all.keys().any(|c| c.suite == Suite::Micro && &c.subject == k && (c.mtu == Some(mtu) || c.mtu.is_none()))).collect();
            @let series: Vec<(String, String)> = subjects.iter().map(|k| (if *k == SubjectKey::LocalFio { "local fio (no network)".to_string() } else { k.to_string() }, c.color(k))).collect();
            @let workloads: Vec<(String, bool)> = all.values().filter(|x| x.key.suite == Suite::Micro && x.key.mtu == Some(mtu))
                .map(|x| (x.key.workload.clone(), x.workload.is_sequential())).collect();
            @let workloads = { let mut w = workloads; w.sort_by_key(|(n, _)| order(n)); w.dedup(); w };
            h3 { "MTU " (mtu) }
            @for (seq_metric, rand_metric, title) in charts {
                div.charts {
                    @for seq in [true, false] {
                        @let metric = if seq { seq_metric } else { rand_metric.unwrap_or(seq_metric) };
                        @let groups: Vec<String> = workloads.iter().filter(|(_, s)| *s == seq).map(|(n, _)| n.clone()).collect();
                        @let values: Vec<Vec<Option<Bar>>> = groups.iter().map(|g| subjects.iter().map(|subj| {
                            let local = *subj == SubjectKey::LocalFio;
                            let key = CaseKey { suite: Suite::Micro, link: if local { LinkName::none() } else { link.clone() }, mtu: if local { None } else { Some(mtu) }, workload: g.clone(), subject: subj.clone(), factors: Default::default() };
                            all.get(&key).and_then(|x| x.summary(metric)).map(bar_of)
                        }).collect()).collect();
                        @if !groups.is_empty() && values.iter().flatten().any(|v| v.is_some()) {
                            (svg::grouped_bars(&format!("{title}: {}", if seq { "seq 1 MiB" } else { "random 4 KiB" }), metric.label(), &groups, &series, &values))
                        }
                    }
                }
            }
        }
        h3 { "All micro results" }
        p.note { "mean ±stddev [min–max] over the repetitions; target CPU from /proc/PID/stat, initiator CPU from the client's own getrusage; whole-machine CPU from /proc/stat (user, nice, system, irq, softirq, steal over all CPUs, the idle busy rate measured before the runs subtracted), the honest figure: the kernel charges softirq work by tick to whichever task runs, so per-process figures miss some of the network stack's work." }
        table {
            tr {
                th.l { "subject" } th.l { "link" } th { "MTU" } th.l { "workload" } th { "n" }
                @for m in table_metrics { th { (m.label()) } }
                th { "I/O errors" } th { "machine busy before (median)" }
            }
            @for x in all.values().filter(|x| x.key.suite == Suite::Micro) {
                @let busy: Vec<f64> = x.samples.iter().map(|s| s.busy_before).collect();
                @let busy = { let mut v = busy; v.sort_by(|a, b| a.total_cmp(b)); v };
                tr {
                    td.l { (x.key.subject) } td.l { (x.key.link) }
                    td { (x.key.mtu.map(|m| m.to_string()).unwrap_or_else(|| "local".into())) }
                    td.l { (x.key.workload) } td { (x.samples.len()) }
                    @for m in table_metrics { td { (fmt_summary(x.summary(m))) } }
                    td { (x.errors()) }
                    td { (format!("{:.0}%", busy.get(busy.len() / 2).copied().unwrap_or(0.0) * 100.0)) }
                }
            }
        }
    })
}

fn sweep(c: &Ctx) -> Option<Markup> {
    let r = c.r;
    let p = &r.params;
    let all = &c.micro;
    let subjects: Vec<SubjectKey> = r.subjects.iter().map(|s| s.key.clone()).filter(|k| all.keys().any(|x| x.suite == Suite::Sweep && &x.subject == k)).collect();
    if subjects.is_empty() {
        return None;
    }
    let rows: Vec<String> = p.sweep_numjobs.iter().map(|j| j.to_string()).collect();
    let cols: Vec<String> = p.sweep_iodepth.iter().map(|d| d.to_string()).collect();
    let link = first_link(r);
    Some(html! {
        p.note { "Per MTU (link " (link) "), " (p.sweep_runtime_s) " s per point, mean of the repetitions. Bright = good in both maps. The local fio baseline has no MTU and is shown under each." }
        @for &mtu in &p.mtus {
            h3 { "MTU " (mtu) }
            @for subj in &subjects {
                div.charts {
                    @for (metric, name) in [(Metric::Iops, "IOPS"), (Metric::LatP99Us, "latency p99 µs")] {
                        @let values: Vec<Vec<Option<f64>>> = p.sweep_numjobs.iter().map(|&j| p.sweep_iodepth.iter().map(|&d| {
                            all.values().find(|x| x.key.suite == Suite::Sweep && &x.key.subject == subj
                                && (x.key.mtu.is_none() || (x.key.mtu == Some(mtu) && x.key.link == link))
                                && x.workload.numjobs == j && x.workload.iodepth == d)
                                .and_then(|x| x.summary(metric)).map(|s| s.mean)
                        }).collect()).collect();
                        @if values.iter().flatten().any(|v| v.is_some()) {
                            (svg::heatmap(&format!("{subj} MTU {mtu}: {name}"), "numjobs", "iodepth", &rows, &cols, &values, metric.higher_is_better()))
                        }
                    }
                }
            }
        }
    })
}

/// A bar with the 95% interval of the mean as whiskers.
fn ci_bar(v: &[f64]) -> Option<Bar> {
    if v.is_empty() {
        return None;
    }
    let m = analysis::mean(v);
    let (lo, hi) = mean_ci(v).unwrap_or((m, m));
    Some(Bar { mean: m, lo, hi })
}

fn fs(c: &Ctx) -> Option<Markup> {
    let r = c.r;
    if r.fs.is_empty() {
        return None;
    }
    let p = r.params.fs.as_ref();
    let mut links: Vec<LinkName> = c.fs.values().map(|x| x.link.clone()).collect();
    links.sort_by_key(|l| r.params.links.iter().position(|x| x == l).unwrap_or(99));
    links.dedup();
    let subjects: Vec<SubjectKey> = r.subjects.iter().map(|s| s.key.clone()).filter(|k| c.fs.values().any(|x| &x.subject == k)).collect();
    let series: Vec<(String, String)> = subjects.iter().map(|k| (k.to_string(), c.color(k))).collect();
    let mut mems: Vec<u64> = c.fs.values().map(|x| x.client_mem).collect();
    mems.sort();
    mems.dedup();
    let mut rows: Vec<String> = c.fs.values().map(|x| x.row.clone()).collect();
    rows.sort_by_key(|x| (row_order(x), x.clone()));
    rows.dedup();
    let case = |link: &LinkName, mem: u64, row: &str, subj: &SubjectKey| c.fs.get(&FsKey::new(link, mem, row, subj));
    Some(html! {
        @if let Some(p) = p {
            p.note {
                "Each subject in turn (order rotated between " (p.repeat) " repetitions): " code { "blockwire mount URL MP --mkfs ext4" } " from the client namespace (the local baseline: ext4 on a loop device over the backing file), then every workload in a memory cgroup (" (p.cgroup) ") limited to "
                (p.client_mem.iter().map(|m| mem_name(*m)).collect::<Vec<_>>().join(" and "))
                "; the attach daemon stays outside the limit. Personalities (filebench's flowops, " (p.runtime_s) " s each after their file sets are made, written back and dropped from the cache): "
                @for (name, f, t) in &p.flowop_scale { (name) " (files ÷" (f) ", threads ÷" (t) ") " }
                ". PostMark: " (p.postmark_files) " files of 512 B–16 KiB in 10 directories, " (p.postmark_transactions) " transactions. Bonnie++: a "
                (p.bonnie_size >> 20) " MiB file, block tests (per-character tests skipped). IOgen-like: fio, " (p.iogen_jobs) " processes (psync) on one "
                (p.iogen_size >> 20) " MiB file, " (p.iogen_bs / 1024) " KiB random I/O, " (p.iogen_read_pct) "% reads, buffered (iogen) and O_DIRECT (iogen-direct); iogen-raw is the same on the local raw loop device. OOM kills are failed cases (see Failures)."
            }
        }
        @for link in &links {
            h3 { "link " (link) }
            div.charts {
                @for &mem in &mems {
                    @let groups: Vec<String> = rows.iter().filter(|x| bw_lab_results::fs::FsWorkload::parse(x).is_ok_and(|w| matches!(w, bw_lab_results::fs::FsWorkload::Flowop(_)))).cloned().collect();
                    @let values: Vec<Vec<Option<Bar>>> = groups.iter().map(|g| subjects.iter().map(|s| case(link, mem, g, s).and_then(|x| ci_bar(&x.values("ops/s")))).collect()).collect();
                    @if values.iter().flatten().any(|v| v.is_some()) {
                        (svg::grouped_bars(&format!("personalities at client mem {}", mem_name(mem)), "ops/s", &groups, &series, &values))
                    }
                }
            }
            p.note { "Headline of each row: mean (95% interval) over the repetitions; CPU per op counts the workload, the attach daemon and the target; wire bytes per op both directions of the client's veth." }
            table {
                tr {
                    th.l { "workload" } th.l { "subject" }
                    @for &mem in &mems { th { (mem_name(mem)) ": headline" } th { "CPU µs/op" } th { "wire B/op" } }
                }
                @for row in &rows {
                    @for s in &subjects {
                        @let cells: Vec<Option<&FsCase>> = mems.iter().map(|&m| case(link, m, row, s)).collect();
                        @if cells.iter().any(|x| x.is_some()) {
                            tr {
                                td.l { (row) } td.l { (s) }
                                @for x in &cells {
                                    @match x.and_then(|x| x.headline().map(|h| (x, h))) {
                                        Some((x, (name, v))) => {
                                            td { (with_interval(&v.values)) " " (name) }
                                            td { (with_interval(&x.values("CPU per op"))) }
                                            td { (with_interval(&x.values("wire bytes per op"))) }
                                        },
                                        None => { td { "–" } td { "–" } td { "–" } },
                                    }
                                }
                            }
                        }
                    }
                }
            }
            details {
                summary { "Latency and the other measures, per row and subject" }
                table {
                    tr { th.l { "workload" } th.l { "measure" } th.l { "subject" } @for &mem in &mems { th { (mem_name(mem)) } } }
                    @for row in &rows {
                        @let names: Vec<String> = subjects.iter().flat_map(|s| mems.iter().filter_map(|&m| case(link, m, row, s)))
                            .flat_map(|x| x.measures.iter().filter(|(_, v)| !v.headline).map(|(k, _)| k.clone())).collect();
                        @let names = { let mut v = names; v.sort(); v.dedup(); v };
                        @for name in &names {
                            @for s in &subjects {
                                @let cells: Vec<Option<&FsCase>> = mems.iter().map(|&m| case(link, m, row, s)).collect();
                                @if cells.iter().flatten().any(|x| x.measures.contains_key(name)) {
                                    tr {
                                        td.l { (row) } td.l { (name) } td.l { (s) }
                                        @for x in &cells {
                                            td { @match x.and_then(|x| x.measures.get(name)) { Some(v) => { (with_interval(&v.values)) " " (v.unit) }, None => { "–" } } }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    })
}

fn overhead(c: &Ctx) -> Option<Markup> {
    let r = c.r;
    let link = first_link(r);
    let mut rows = vec![];
    for s in r.subjects.iter().filter(|s| !s.key.is_local()) {
        for &mtu in &r.params.mtus {
            let get = |w: MicroWorkload| c.micro.get(&CaseKey { suite: Suite::Micro, link: link.clone(), mtu: Some(mtu), workload: w.name().into(), subject: s.key.clone(), factors: Default::default() });
            let (rd, wr) = (get(MicroWorkload::SeqRead1m), get(MicroWorkload::SeqWrite1m));
            if rd.is_some() || wr.is_some() {
                rows.push((s.key.clone(), mtu, rd, wr));
            }
        }
    }
    if rows.is_empty() {
        return None;
    }
    let hb = |x: Option<&Case>| x.and_then(|x| x.summary(Metric::HeaderBytesPerFrame)).map(|s| format!("{:.1}", s.mean)).unwrap_or("–".into());
    let share = |x: Option<&Case>| {
        x.and_then(|x| {
            let payload: u64 = x.samples.iter().map(|s| s.bench.bytes).sum();
            let wire: u64 = x.samples.iter().filter_map(|s| s.wire.map(|w| w.bytes())).sum();
            (wire > 0).then(|| format!("{:.1}%", payload as f64 / wire as f64 * 100.0))
        })
        .unwrap_or("–".into())
    };
    Some(html! {
        p.note { "Measured on the 1 MiB sequential cases: non-payload bytes per frame (Ethernet, IP, TCP and protocol headers, requests, ACKs) and the payload's share of the wire. Beside it, the header cost per frame the MPLS study lists for each encapsulation." }
        div.charts {
            table {
                tr { th.l { "subject" } th { "MTU" } th { "read: header B/frame" } th { "read: frames/MiB" } th { "read: payload share" } th { "write: header B/frame" } th { "write: payload share" } }
                @for (key, mtu, rd, wr) in &rows {
                    tr {
                        td.l { (key) } td { (mtu) } td { (hb(*rd)) }
                        td { (rd.and_then(|x| x.summary(Metric::FramesPerOp)).map(|s| format!("{:.0}", s.mean)).unwrap_or("–".into())) }
                        td { (share(*rd)) } td { (hb(*wr)) } td { (share(*wr)) }
                    }
                }
            }
            table {
                tr { th.l { "study 3: encapsulation" } th { "header B/frame" } }
                @for (name, b) in STUDIES_HEADER_TABLE { tr { td.l { (name) } td { (b) } } }
            }
        }
    })
}

/// What the method says of the veths' offloads.
fn link_offloads(p: &bw_lab_results::Params) -> &'static str {
    match (p.veth_offloads_off, p.veth_gro) {
        (false, _) => "The veths' offloads were left as they were (ethtool failed): frames may not have real MTU sizes.",
        (true, true) => "TSO and GSO are off on the veths, so frames on the link have real MTU sizes; GRO is on, as on a Linux host's NIC: the receiver merges frames after the link (on veth the receive runs in the sender's softirq and is charged to the sender: with GRO off the target paid for the client's per-frame receive).",
        (true, false) => "TSO, GSO and GRO are off on the veths: frames have real MTU sizes and the receiver handles each one on its own (the storage lab's default link before 2026-11-25).",
    }
}

fn method(c: &Ctx) -> Option<Markup> {
    let p = &c.r.params;
    let kernel = c.r.subjects.iter().any(|s| s.key.is_kernel());
    Some(html! {
        ul.note {
            li { b { "Backing: " } (p.backing) ". Every target (blockwire serve, tgtd, vblade), the local fio baseline and the local file-system baseline use this same tmpfs file, so the only difference between subjects is the protocol and the implementation, not the storage." }
            li { b { "Topology: " } "two network namespaces joined by one veth pair per MTU; every target runs in the target namespace for the whole link (blockwire serve exports AoE, iSCSI and NVMe/TCP at once; tgt and vblade listen on their own port and shelf), and the subjects take turns: each workload runs every subject once per repetition, in an order rotated between repetitions, so slow drifts of the machine hit all subjects alike. " (link_offloads(p)) }
            li { b { "Clients: " } "micro and sweep: " code { "blockwire bench" } " in the client namespace (no page cache: every result is uncached). fs: " code { "blockwire mount" } " (FUSE, a loop device with direct I/O, ext4) with the kernel's page cache in play, bounded by the workload's memory cgroup."
                @if kernel { " Kernel subjects (" code { "kernel-PROTOCOL@TARGET" } "): the client host's kernel initiator (open-iscsi, nvme-tcp, aoe) attached for the whole link, fio with direct I/O (libaio) on its block device with the same workload definitions; not in the fs suite." } }
            li { b { "CPU: " } "target CPU = utime+stime delta of the target process (all threads) from /proc/PID/stat across the run; initiator CPU = what the bench reports for itself, or for fs the workload's getrusage plus the attach daemon's /proc/PID/stat delta; fio's from getrusage of fio and its jobs."
                @if kernel { " For kernel subjects the initiator CPU is the whole client machine's from /proc/stat (user+nice, system+irq+softirq; fio included): a kernel initiator's work belongs to no process." } }
            li { b { "Wire: " } "bytes and frames = rx+tx deltas of the client-side veth over the run, Ethernet header included, no preamble/FCS; they include each run's login or discovery. Header bytes per frame = (wire bytes − payload bytes) / frames, ACKs and requests included." }
            li { b { "Idle: " } "before each run the lab waits until the machine is less than " (format!("{:.0}", p.idle_threshold * 100.0)) "% busy (from /proc/stat, at most " (format!("{:.0}", p.idle_max_wait_s)) " s per run and " (format!("{:.0}", p.idle_budget_s)) " s in total, so a shared machine cannot stretch the run); the busy share before each run is stored with it in results.json." }
            li { b { "Sweep: " } "runs at every MTU and link; the heat maps show the first link." }
            li { b { "Local fio latency " } "for mixed loads: p50 of the dominant direction, p99/p99.9 the worse of read and write." }
        }
    })
}

fn failures(c: &Ctx) -> Option<Markup> {
    if c.r.failures.is_empty() {
        return None;
    }
    Some(html! {
        table {
            tr { th.l { "subject" } th { "MTU" } th.l { "workload" } th.l { "reason" } }
            @for f in &c.r.failures {
                tr {
                    td.l { (f.subject) } td { (f.mtu.map(|m| m.to_string()).unwrap_or_default()) }
                    td.l { (if f.workload.is_empty() { "(start)" } else { f.workload.as_str() }) } td.l { (f.reason) }
                }
            }
        }
    })
}
