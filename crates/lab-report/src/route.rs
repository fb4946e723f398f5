//! The route suite's numbers, findings and report section. [`section`] takes
//! the route results and returns one self-contained HTML fragment (plain
//! tables, the lab's CSS classes), so it can be placed into any report
//! template; [`text_summary`] is the same for the terminal.

use bw_lab_results::route::{RouteResults, RouteSample, WORKLOADS};
use crate::findings::route_findings;
use std::fmt::Write;

/// `s` safe inside HTML text and attribute values.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The study's header bytes per frame (docs/studies.md, study 3).
pub const STUDY_HEADERS: [(&str, u32); 6] = [
    ("AoE", 32),
    ("AoE/MPLS", 50),
    ("AoE/GRE", 80),
    ("AoE/L2TP", 86),
    ("iSCSI/TCP", 102),
    ("iSCSI/MPLS", 120),
];

/// GRE and L2TP are not in this kernel: their header bytes per AoE data
/// frame by calculation (see docs/routing.md).
pub const CALCULATED_HEADERS: [(&str, u32, &str); 2] = [
    (
        "AoE/GRE",
        74,
        "gretap: Ethernet 14 + IPv4 20 + GRE 4 + inner Ethernet 14 + AoE/ATA 22",
    ),
    (
        "AoE/L2TP",
        86,
        "L2TPv3/UDP: Ethernet 14 + IPv4 20 + UDP 8 + L2TPv3 8 + inner Ethernet 14 + AoE/ATA 22",
    ),
];

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Samples of one case, by round.
fn find<'a>(
    r: &'a RouteResults,
    path: &str,
    proto: &str,
    w: &str,
    round: u32,
) -> Option<&'a RouteSample> {
    r.samples
        .iter()
        .find(|s| s.path == path && s.protocol == proto && s.workload == w && s.round == round)
}

fn rounds(r: &RouteResults) -> Vec<u32> {
    let mut v: Vec<u32> = r.samples.iter().map(|s| s.round).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Per-round values of `f` over the case's samples.
fn per_round(
    r: &RouteResults,
    path: &str,
    proto: &str,
    w: &str,
    f: impl Fn(&RouteSample) -> Option<f64>,
) -> Vec<f64> {
    rounds(r)
        .into_iter()
        .filter_map(|k| f(find(r, path, proto, w, k)?))
        .collect()
}

/// Median throughput of a case, bytes per second.
pub fn median_bw(r: &RouteResults, path: &str, proto: &str, w: &str) -> Option<f64> {
    median(per_round(r, path, proto, w, |s| Some(s.bw_bytes)))
}

/// Throughput lost against direct in each round (0.1 = 10% slower).
pub fn costs(r: &RouteResults, path: &str, proto: &str, w: &str) -> Vec<f64> {
    rounds(r)
        .into_iter()
        .filter_map(|k| {
            let d = find(r, "direct", proto, w, k)?.bw_bytes;
            let p = find(r, path, proto, w, k)?.bw_bytes;
            (d > 0.0).then(|| 1.0 - p / d)
        })
        .collect()
}

/// CPU per MiB the path adds over direct (same round), median, in ms.
pub fn forwarding_cpu_ms_per_mib(
    r: &RouteResults,
    path: &str,
    proto: &str,
    w: &str,
) -> Option<f64> {
    median(
        rounds(r)
            .into_iter()
            .filter_map(|k| {
                let d = find(r, "direct", proto, w, k)?.cpu_ms_per_mib();
                let p = find(r, path, proto, w, k)?.cpu_ms_per_mib();
                Some(p - d)
            })
            .collect(),
    )
}

fn path_label(p: &str) -> String {
    match p {
        "direct" => "direct".into(),
        "mpls-bpf" => "MPLS, BPF routers".into(),
        "mpls-userspace" => "MPLS, userspace routers".into(),
        "vxlan" => "VXLAN".into(),
        x => x.into(),
    }
}

/// The study's header figure for a measured (path, protocol), if it has one.
fn study_row(path: &str, proto: &str) -> Option<(&'static str, u32)> {
    let name = match (path, proto) {
        ("direct", "aoe") => "AoE",
        (p, "aoe") if p.starts_with("mpls") => "AoE/MPLS",
        ("direct", "iscsi") => "iSCSI/TCP",
        (p, "iscsi") if p.starts_with("mpls") => "iSCSI/MPLS",
        _ => return None,
    };
    STUDY_HEADERS.iter().find(|(n, _)| *n == name).copied()
}

fn cell(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map(f).unwrap_or_else(|| "–".into())
}

/// Lines for the terminal: speeds, CPU, headers, findings.
pub fn text_summary(r: &RouteResults) -> Vec<String> {
    let mut lines = vec![];
    for proto in &r.protocols {
        for (w, _) in WORKLOADS {
            let mut parts = vec![];
            for path in &r.paths {
                let Some(bw) = median_bw(r, path, proto, w) else {
                    continue;
                };
                let mut s = format!("{path} {:.1} MB/s", bw / 1e6);
                if path != "direct" {
                    if let Some(c) = median(costs(r, path, proto, w)) {
                        s.push_str(&format!(" ({:+.0}%)", -c * 100.0));
                    }
                    if let Some(f) = forwarding_cpu_ms_per_mib(r, path, proto, w) {
                        s.push_str(&format!(" +{f:.2} ms CPU/MiB"));
                    }
                }
                parts.push(s);
            }
            if !parts.is_empty() {
                lines.push(format!("route: {proto:5} {w:16} {}", parts.join(", ")));
            }
        }
    }
    for o in &r.overheads {
        lines.push(format!(
            "route: header bytes per data frame: {:14} {:5} {} B ({} frames; tshark: {} malformed){}",
            o.path,
            o.protocol,
            o.bytes_per_frame,
            o.frames,
            o.malformed,
            study_row(&o.path, &o.protocol)
                .map(|(n, b)| format!("; study {n}: {b} B"))
                .unwrap_or_default()
        ));
    }
    for f in route_findings(r) {
        lines.push(format!(
            "route: finding \"{}\": {}. {}: {}. {}",
            f.claim,
            f.verdict.word(),
            f.compared,
            f.measured,
            f.why
        ));
    }
    lines
}

/// The body of the report's route section (its title comes from the
/// report's section list); empty when the suite did not run.
pub fn section(r: Option<&RouteResults>) -> String {
    let Some(r) = r else {
        return String::new();
    };
    let mut h = String::new();
    setup_note(&mut h, r);
    findings_table(&mut h, r);
    throughput_table(&mut h, r);
    cpu_table(&mut h, r);
    headers_table(&mut h, r);
    h
}

/// How the paths were set up and run, and how busy the machine was.
fn setup_note(h: &mut String, r: &RouteResults) {
    let loads: Vec<f64> = r.samples.iter().map(|s| s.load1).collect();
    let _ = write!(
        h,
        "<p class=\"note\">Client and target in namespaces joined directly, across five MPLS routers (push, three swaps, pop; each router in its own namespace), or by a VXLAN tunnel; MTU {}; {} round(s); every case runs on all paths back to back, in an order rotated from case to case; {} s per bench run, copy = write then read back {} MiB. Medians over rounds; the cost is the median of the per-round throughput ratios to direct. Median 1-minute load average during the runs: {} (the machine was shared: single numbers swing).</p>",
        r.mtu,
        r.rounds,
        r.runtime_s,
        r.copy_bytes >> 20,
        cell(median(loads), |x| format!("{x:.1}"))
    );
}

/// Findings first: the same verdicts as the report's findings section.
fn findings_table(h: &mut String, r: &RouteResults) {
    let f = route_findings(r);
    if !f.is_empty() {
        h.push_str("<table><tr><th class=l>study 3 claim</th><th class=l>compared</th><th class=l>measured</th><th class=l>verdict</th><th class=l>why</th></tr>");
        for x in &f {
            let _ = write!(
                h,
                "<tr><td class=l>{}</td><td class=l>{}</td><td class=l>{}</td><td class=\"l {}\">{}</td><td class=l>{}</td></tr>",
                esc(&x.claim),
                esc(&x.compared),
                esc(&x.measured),
                x.verdict.class(),
                x.verdict.word(),
                esc(&x.why)
            );
        }
        h.push_str("</table>");
    }
}

/// Speed: median throughput per path, with the change against direct.
fn throughput_table(h: &mut String, r: &RouteResults) {
    h.push_str("<h3>Throughput (MB/s, median; change against direct)</h3><table><tr><th class=l>protocol</th><th class=l>workload</th>");
    for p in &r.paths {
        let _ = write!(h, "<th>{}</th>", esc(&path_label(p)));
    }
    h.push_str("</tr>");
    for proto in &r.protocols {
        for (w, _) in WORKLOADS {
            let _ = write!(
                h,
                "<tr><td class=l>{}</td><td class=l>{}</td>",
                esc(proto),
                w
            );
            for p in &r.paths {
                let bw = median_bw(r, p, proto, w);
                let c = if p == "direct" {
                    String::new()
                } else {
                    cell(median(costs(r, p, proto, w)), |c| {
                        format!(" ({:+.0}%)", -c * 100.0)
                    })
                };
                let _ = write!(
                    h,
                    "<td>{}{}</td>",
                    cell(bw, |b| format!("{:.0}", b / 1e6)),
                    c
                );
            }
            h.push_str("</tr>");
        }
    }
    h.push_str("</table>");
}

/// CPU per MiB moved, the forwarding share, and each router's.
fn cpu_table(h: &mut String, r: &RouteResults) {
    h.push_str("<h3>CPU</h3><p class=\"note\">CPU per MiB = client + target + router processes + ksoftirqd, per MiB moved (the BPF programs run inside those as softirq work). Forwarding = that minus the direct path's in the same round. Router µs/frame = router CPU (process time for userspace, program run time for BPF) per frame through the middle of the path, per router. Frames/MiB counted on the middle link.</p><table><tr><th class=l>protocol</th><th class=l>workload</th><th class=l>path</th><th>CPU ms/MiB</th><th>forwarding ms/MiB</th><th>router µs/frame</th><th>frames/MiB</th><th class=l>per router (share of a core)</th></tr>");
    for proto in &r.protocols {
        for (w, _) in WORKLOADS {
            for p in &r.paths {
                let cpu = median(per_round(r, p, proto, w, |s| Some(s.cpu_ms_per_mib())));
                if cpu.is_none() {
                    continue;
                }
                let fwd = (p != "direct")
                    .then(|| forwarding_cpu_ms_per_mib(r, p, proto, w))
                    .flatten();
                let us = median(per_round(r, p, proto, w, |s| s.router_us_per_frame()));
                let fpm = median(per_round(r, p, proto, w, |s| Some(s.frames_per_mib)));
                let last = rounds(r)
                    .into_iter()
                    .rev()
                    .find_map(|k| find(r, p, proto, w, k));
                let per: Vec<String> = last
                    .map(|s| {
                        s.routers
                            .iter()
                            .map(|x| {
                                format!(
                                    "{} {:.0}%",
                                    x.name,
                                    (x.process_s + x.bpf_s) / s.wall_s.max(1e-9) * 100.0
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let _ = write!(
                    h,
                    "<tr><td class=l>{}</td><td class=l>{}</td><td class=l>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=l>{}</td></tr>",
                    esc(proto),
                    w,
                    esc(&path_label(p)),
                    cell(cpu, |x| format!("{x:.2}")),
                    cell(fwd, |x| format!("{x:+.2}")),
                    cell(us, |x| format!("{x:.2}")),
                    cell(fpm, |x| format!("{x:.0}")),
                    esc(&per.join(", "))
                );
            }
        }
    }
    h.push_str("</table>");
}

/// Header bytes per data frame, measured and calculated, beside the study's.
fn headers_table(h: &mut String, r: &RouteResults) {
    h.push_str("<h3>Header bytes per data frame</h3><p class=\"note\">From tshark captures in the middle of each path during 1 MiB reads: the most common (frame length − data payload) over the data frames; no preamble or FCS. Beside it the study's figure. GRE and L2TP are not in this kernel: calculated below.</p><table><tr><th class=l>path</th><th class=l>protocol</th><th>measured B</th><th class=l>study</th><th>frames</th><th>malformed (tshark)</th></tr>");
    for o in &r.overheads {
        let _ = write!(
            h,
            "<tr><td class=l>{}</td><td class=l>{}</td><td>{}</td><td class=l>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&path_label(&o.path)),
            esc(&o.protocol),
            o.bytes_per_frame,
            study_row(&o.path, &o.protocol)
                .map(|(n, b)| format!("{n} {b} B"))
                .unwrap_or_else(|| "–".into()),
            o.frames,
            o.malformed
        );
    }
    for (name, b, how) in CALCULATED_HEADERS {
        let study = STUDY_HEADERS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(n, b)| format!("{n} {b} B"))
            .unwrap_or_default();
        let _ = write!(
            h,
            "<tr><td class=l colspan=2>{} (calculated: {})</td><td>{b}</td><td class=l>{}</td><td>–</td><td>–</td></tr>",
            esc(name),
            esc(how),
            esc(&study)
        );
    }
    h.push_str("</table>");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(round: u32, path: &str, proto: &str, w: &str, mbs: f64) -> RouteSample {
        crate::test_samples::route_sample(round, path, proto, w, mbs)
    }

    fn results(mpls_aoe: f64, mpls_iscsi: f64) -> RouteResults {
        let mut r = RouteResults {
            paths: vec!["direct".into(), "mpls-bpf".into()],
            protocols: vec!["aoe".into(), "iscsi".into()],
            rounds: 2,
            ..Default::default()
        };
        for round in 0..2 {
            for (w, _) in WORKLOADS {
                r.samples.push(sample(round, "direct", "aoe", w, 1000.0));
                r.samples.push(sample(round, "direct", "iscsi", w, 1000.0));
                r.samples
                    .push(sample(round, "mpls-bpf", "aoe", w, mpls_aoe));
                r.samples
                    .push(sample(round, "mpls-bpf", "iscsi", w, mpls_iscsi));
            }
        }
        r
    }

    #[test]
    fn section_is_empty_without_route_results_and_names_the_claims() {
        assert_eq!(section(None), "");
        let r = results(900.0, 850.0);
        let h = section(Some(&r));
        // (The section's heading and id come from report/html.rs's section list.)
        // The claims carry the verdicts of the report's findings section.
        use crate::findings::{Verdict, CLAIM_AOE_BEATS_ISCSI, CLAIM_MPLS_COST};
        let f = route_findings(&r);
        assert_eq!(f.iter().map(|x| x.verdict).collect::<Vec<_>>(), vec![Verdict::Reproduced; 2]);
        assert!(h.contains(CLAIM_MPLS_COST) && h.contains(CLAIM_AOE_BEATS_ISCSI));
        assert!(h.contains("<td class=\"l yes\">reproduced</td>"), "{h}");
        assert!(h.contains(&esc(&f[0].measured)), "{h}");
        assert!(h.contains("MPLS, BPF routers"));
        // Medians with the change against direct.
        assert!(h.contains("<td>900 (-10%)</td>"), "{h}");
        let text = text_summary(&r);
        assert!(text.iter().any(|l| l.contains("mpls-bpf 900.0 MB/s (-10%)")));
        assert!(
            text.iter().any(|l| l.starts_with(&format!("route: finding \"{CLAIM_MPLS_COST}\": reproduced."))),
            "{text:#?}"
        );
    }
}
