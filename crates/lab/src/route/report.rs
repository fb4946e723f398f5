//! The route suite's numbers, findings and report section. [`section`] takes
//! the route results and returns one self-contained HTML fragment (plain
//! tables, the lab's CSS classes), so it can be placed into any report
//! template; [`text_summary`] is the same for the terminal.

use super::suite::{RouteResults, RouteSample, WORKLOADS};
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

/// The study's claims about MPLS this suite checks.
pub const CLAIM_COST: &str = "MPLS costs 9-13%";
pub const CLAIM_AOE_BEATS_ISCSI: &str = "AoE over MPLS beats iSCSI over MPLS";
/// The study's cost range, with two points of measuring noise on top.
const STUDY_COST_MAX: f64 = 0.15;

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

/// AoE throughput over iSCSI throughput on `path`, per round.
pub fn aoe_over_iscsi(r: &RouteResults, path: &str, w: &str) -> Vec<f64> {
    rounds(r)
        .into_iter()
        .filter_map(|k| {
            let a = find(r, path, "aoe", w, k)?.bw_bytes;
            let i = find(r, path, "iscsi", w, k)?.bw_bytes;
            (i > 0.0).then(|| a / i)
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

fn mpls_paths(r: &RouteResults) -> Vec<String> {
    r.paths
        .iter()
        .filter(|p| p.starts_with("mpls"))
        .cloned()
        .collect()
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Reproduced,
    Partly,
    NotReproduced,
    NotMeasured,
}

impl Status {
    pub fn text(self) -> &'static str {
        match self {
            Status::Reproduced => "reproduced",
            Status::Partly => "partly reproduced",
            Status::NotReproduced => "not reproduced",
            Status::NotMeasured => "not measured",
        }
    }
}

/// One of the study's claims, checked on one MPLS datapath.
#[derive(Debug, Clone)]
pub struct Finding {
    pub claim: &'static str,
    pub path: String,
    pub status: Status,
    pub detail: String,
}

fn fmt_range(v: &[f64], pct: bool) -> String {
    let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    if pct {
        format!("{:.0} to {:.0}%", lo * 100.0, hi * 100.0)
    } else {
        format!("{lo:.2} to {hi:.2}")
    }
}

/// The claims, marked from the numbers.
pub fn findings(r: &RouteResults) -> Vec<Finding> {
    let mut out = vec![];
    for path in mpls_paths(r) {
        // Cost: median per case over rounds, every protocol and workload.
        let mut medians = vec![];
        let mut cases = vec![];
        for proto in &r.protocols {
            for (w, _) in WORKLOADS {
                if let Some(m) = median(costs(r, &path, proto, w)) {
                    medians.push(m);
                    cases.push(format!("{proto} {w} {:.0}%", m * 100.0));
                }
            }
        }
        let within = medians.iter().filter(|c| **c <= STUDY_COST_MAX).count();
        let status = if medians.is_empty() {
            Status::NotMeasured
        } else if within == medians.len() {
            Status::Reproduced
        } else if within > 0 {
            Status::Partly
        } else {
            Status::NotReproduced
        };
        let detail = if medians.is_empty() {
            "needs the direct path and this path in the same rounds".into()
        } else {
            format!(
                "throughput lost against direct, median over rounds per case: {} ({} of {} cases within {:.0}%); {}",
                fmt_range(&medians, true),
                within,
                medians.len(),
                STUDY_COST_MAX * 100.0,
                cases.join(", ")
            )
        };
        out.push(Finding {
            claim: CLAIM_COST,
            path: path.clone(),
            status,
            detail,
        });

        // AoE against iSCSI, every workload, every round.
        let mut parts = vec![];
        let mut wins = 0;
        let mut n = 0;
        for (w, _) in WORKLOADS {
            let v = aoe_over_iscsi(r, &path, w);
            if let Some(m) = median(v.clone()) {
                n += 1;
                let all_above = v.iter().all(|x| *x > 1.0);
                if all_above {
                    wins += 1;
                }
                let rounds: Vec<String> = v.iter().map(|x| format!("{x:.2}")).collect();
                parts.push(format!("{w} {m:.2} (rounds {})", rounds.join(", ")));
            }
        }
        let status = match (n, wins) {
            (0, _) => Status::NotMeasured,
            (n, w) if w == n => Status::Reproduced,
            (_, 0) => Status::NotReproduced,
            _ => Status::Partly,
        };
        out.push(Finding {
            claim: CLAIM_AOE_BEATS_ISCSI,
            path: path.clone(),
            status,
            detail: if n == 0 {
                "needs AoE and iSCSI over this path".into()
            } else {
                format!(
                    "AoE/iSCSI throughput: {}; AoE ahead in every round in {wins} of {n} workloads",
                    parts.join("; ")
                )
            },
        });
    }
    out
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
    for f in findings(r) {
        lines.push(format!(
            "route: finding \"{}\" over {}: {}. {}",
            f.claim,
            f.path,
            f.status.text(),
            f.detail
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

    // Findings first.
    let f = findings(r);
    if !f.is_empty() {
        h.push_str("<table><tr><th class=l>study 3 claim</th><th class=l>path</th><th class=l>here</th><th class=l>numbers</th></tr>");
        for x in &f {
            let class = if x.status == Status::Reproduced {
                "l win"
            } else {
                "l"
            };
            let _ = write!(
                h,
                "<tr><td class=l>{}</td><td class=l>{}</td><td class=\"{class}\">{}</td><td class=l>{}</td></tr>",
                esc(x.claim),
                esc(&path_label(&x.path)),
                x.status.text(),
                esc(&x.detail)
            );
        }
        h.push_str("</table>");
    }

    // Speed.
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

    // CPU.
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

    // Headers.
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
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::cpu::CpuAccount;

    fn sample(round: u32, path: &str, proto: &str, w: &str, mbs: f64) -> RouteSample {
        RouteSample {
            round,
            path: path.into(),
            protocol: proto.into(),
            workload: w.into(),
            bw_bytes: mbs * 1e6,
            iops: 0.0,
            mean_lat_us: 0.0,
            wall_s: 1.0,
            bytes: mbs * 1e6,
            frames_per_mib: 200.0,
            routers: vec![],
            cpu: CpuAccount {
                client_s: 0.1,
                target_s: 0.1,
                ..Default::default()
            },
            load1: 3.0,
        }
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
    fn claims_are_marked_from_the_numbers() {
        // 10% and 12% slower than direct, AoE ahead: both claims hold.
        let f = findings(&results(900.0, 880.0));
        assert_eq!(f[0].claim, CLAIM_COST);
        assert_eq!(f[0].status, Status::Reproduced, "{}", f[0].detail);
        assert_eq!(f[1].status, Status::Reproduced, "{}", f[1].detail);
        // 60% slower, iSCSI ahead: neither.
        let f = findings(&results(300.0, 400.0));
        assert_eq!(f[0].status, Status::NotReproduced);
        assert_eq!(f[1].status, Status::NotReproduced);
        assert!(f[1].detail.contains("0.75"), "{}", f[1].detail);
        // AoE within the study's cost, iSCSI not.
        let f = findings(&results(900.0, 500.0));
        assert_eq!(f[0].status, Status::Partly);
    }

    #[test]
    fn section_is_empty_without_route_results_and_names_the_claims() {
        assert_eq!(section(None), "");
        let r = results(900.0, 880.0);
        let h = section(Some(&r));
        // (The section's heading and id come from report/html.rs's section list.)
        assert!(h.contains(CLAIM_COST) && h.contains("reproduced"));
        assert!(h.contains("MPLS, BPF routers"));
        // Medians with the change against direct.
        assert!(h.contains("<td>900 (-10%)</td>"), "{h}");
        assert!(text_summary(&r)
            .iter()
            .any(|l| l.contains("mpls-bpf 900.0 MB/s (-10%)")));
    }
}
