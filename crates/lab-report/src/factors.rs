//! The offload study's section (study 5): per protocol, what `--offload`
//! and `--digest` did to throughput, latency and CPU per unit of
//! throughput, with whole-machine CPU (/proc/stat) beside the processes'.

use crate::context::Ctx;
use crate::svg::{self, Bar};
use bw_lab_results::accounting::{Case, Metric};
use bw_lab_results::stats::mean_ci;
use bw_lab_results::{MicroWorkload, SubjectKey, Suite};
use maud::{html, Markup};

/// The workloads the charts show: one throughput-bound, one per-op.
const CHARTED: [(MicroWorkload, Metric); 2] = [(MicroWorkload::SeqRead1m, Metric::MachineCpuSPerGb), (MicroWorkload::RandRead4kQd32, Metric::MachineCpuUsPerOp)];

fn ci_bar(v: &[f64]) -> Option<Bar> {
    if v.is_empty() {
        return None;
    }
    let m = crate::analysis::mean(v);
    let (lo, hi) = mean_ci(v).unwrap_or((m, m));
    Some(Bar { mean: m, lo, hi })
}

fn cell(c: &Case, m: Metric) -> String {
    let v = c.values(m);
    if v.is_empty() { "–".into() } else { svg::short(crate::analysis::mean(&v)) }
}

fn setting(c: &Case) -> String {
    let d = c.key.factors.describe();
    if d.is_empty() { "defaults".into() } else { d }
}

pub fn section(c: &Ctx) -> Option<Markup> {
    let all = crate::analysis::factor_cases(c.r);
    if all.is_empty() {
        return None;
    }
    let link = crate::analysis::first_link(c.r);
    let mtu = c.r.params.mtus.first().copied();
    let here: Vec<&Case> = all.values().filter(|x| x.key.suite == Suite::Micro && x.key.link == link && x.key.mtu == mtu).collect();
    let mut settings: Vec<_> = here.iter().map(|x| x.key.factors.clone()).collect();
    settings.sort();
    settings.dedup();
    let mut subjects: Vec<SubjectKey> = here.iter().map(|x| x.key.subject.clone()).collect();
    subjects.sort();
    subjects.dedup();
    Some(html! {
        p.note {
            "Each setting was measured in turn on the same link, targets restarted between settings. "
            "Offloads (" code { "--offload" } "): " b { "none" } " switches checksums, scatter-gather, TSO, GSO and GRO off on both ends; "
            b { "stateless" } " switches them on. On veth an offload skips work rather than moving it to hardware (no checksum is computed, one 64 KiB "
            "super-frame crosses instead of ~45), so the difference bounds from above what a stateless-offload NIC saves. "
            "Digests (" code { "--digest" } "): " b { "crc32c" } " computes iSCSI HeaderDigest/DataDigest and NVMe/TCP HDGST/DDGST with the CPU's CRC "
            "instruction, " b { "crc32c-soft" } " with portable tables on both ends (a CPU or NIC without CRC help); only blockwire's iSCSI and NVMe/TCP run with digests. "
            "TLS (" code { "--tls" } "): " b { "on" } " runs NVMe/TCP over TLS 1.3 with a PSK (blockwire's target, and nvmet's with tlshd making its handshakes); "
            "the subject's datapaths say which record layer each end's connections had (user: encrypted in blockwire's processes; ktls: by the kernel; "
            "\"client\": the initiator's end). "
            "There is no TCP offload engine or iSCSI HBA here: what they would take off the CPU (TCP or iSCSI state) cannot be emulated."
        }
        p.note {
            b { "Whole-machine CPU" } " is the /proc/stat delta over the run (user, nice, system, irq, softirq, steal; all CPUs) minus the machine's idle busy rate "
            "measured before the runs, per machine the lab's hosts run on. It is the honest figure: the kernel charges softirq work (the network stack's receive "
            "path) by tick to whichever task happens to run, so the per-process figures (target + initiator) miss some of it and count some of others'."
        }
        div.charts {
            @for (w, m) in CHARTED {
                @let groups: Vec<String> = subjects.iter().map(|s| s.to_string()).collect();
                @let series: Vec<(String, String)> = settings.iter().enumerate().map(|(i, f)| (if f.is_default() { "defaults".to_string() } else { f.describe() }, svg::PALETTE[i % svg::PALETTE.len()].to_string())).collect();
                @let values: Vec<Vec<Option<Bar>>> = subjects.iter().map(|s| settings.iter().map(|f| here.iter().find(|x| &x.key.subject == s && x.key.workload == w.name() && &x.key.factors == f).and_then(|x| ci_bar(&x.values(m)))).collect()).collect();
                @if values.iter().flatten().any(|v| v.is_some()) {
                    (svg::grouped_bars(&format!("{w}: {}", m.label()), m.label(), &groups, &series, &values))
                }
            }
        }
        table {
            tr {
                th.l { "subject" } th.l { "workload" } th.l { "setting" } th { "MiB/s" } th { "IOPS" } th { "latency p50 (µs)" }
                th { "CPU ms/MiB (processes)" } th { "machine CPU s/GB" } th { "CPU µs/op (processes)" } th { "machine CPU µs/op" }
            }
            @for x in &here {
                tr {
                    td.l { (x.key.subject) } td.l { (x.key.workload) } td.l { (setting(x)) }
                    td { (cell(x, Metric::MibPerS)) } td { (cell(x, Metric::Iops)) } td { (cell(x, Metric::LatP50Us)) }
                    td { (cell(x, Metric::CpuMsPerMib)) } td { (cell(x, Metric::MachineCpuSPerGb)) }
                    td { (cell(x, Metric::TotalCpuUsPerOp)) } td { (cell(x, Metric::MachineCpuUsPerOp)) }
                }
            }
        }
    })
}

/// A group of an fs row's chart: its label, and the subject and row its
/// cases are filed under.
struct FsGroup<'a> {
    label: String,
    subject: SubjectKey,
    row: &'a str,
}

/// The subjects of an fs row's chart, and the local raw device after them
/// when `raw_ref` and it was measured.
fn fs_groups<'a>(here: &[&crate::analysis::FsCase], row: &'a str, raw_ref: bool) -> Vec<FsGroup<'a>> {
    let subjects: std::collections::BTreeSet<&SubjectKey> = here.iter().filter(|x| x.row == row).map(|x| &x.subject).collect();
    let mut groups: Vec<FsGroup> = subjects.into_iter().map(|s| FsGroup { label: s.to_string(), subject: s.clone(), row }).collect();
    if raw_ref && here.iter().any(|x| x.row == RAW_ROW && x.subject == bw_lab_results::fs::LOCAL) {
        groups.push(FsGroup { label: "raw device (local)".into(), subject: bw_lab_results::fs::LOCAL, row: RAW_ROW });
    }
    groups
}

/// The local baseline's row on the raw loop device (no file system).
const RAW_ROW: &str = "iogen-raw";

/// The file-system factor's section (study 4): each fs workload's headline
/// per subject and `--fs`/`--fsync` setting, with the local raw device as
/// the reference for the IOgen-like job.
pub fn fs_section(c: &Ctx) -> Option<Markup> {
    let p = &c.r.params;
    if p.fs_kinds.is_empty() && p.fsyncs.is_empty() {
        return None;
    }
    let all = crate::analysis::fs_cases_all(&c.r.fs);
    let mem = p.fs.as_ref().and_then(|f| f.client_mem.first().copied()).unwrap_or(0);
    let link = crate::analysis::first_link(c.r);
    let here: Vec<&crate::analysis::FsCase> = all.values().filter(|x| x.client_mem == mem && x.link == link && x.headline().is_some()).collect();
    if here.is_empty() {
        return None;
    }
    let mut settings: Vec<_> = here.iter().map(|x| x.factors.clone()).collect();
    settings.sort();
    settings.dedup();
    let mut rows: Vec<String> = here.iter().map(|x| x.row.clone()).filter(|r| r != RAW_ROW).collect();
    rows.sort_by_key(|r| crate::analysis::row_order(r));
    rows.dedup();
    let series: Vec<(String, String)> = settings.iter().enumerate().map(|(i, f)| (f.describe(), svg::PALETTE[i % svg::PALETTE.len()].to_string())).collect();
    Some(html! {
        p.note {
            "Each setting made its own file system on every subject in turn (" code { "--fs" } ", " code { "--fsync" } "). "
            b { "ext4" } ": mkfs.ext4's defaults. " b { "ext4-tuned" } ": inode tables and journal zeroed at mkfs rather than by a kernel thread during the runs, "
            "a journal of an eighth of the volume (fewer checkpoints), noatime (reads write no inode updates); none of these risks data. "
            b { "xfs" } ": defaults. " b { "btrfs" } ": copy-on-write with data checksums, the labelled stand-in for ZFS (this kernel has no ZFS). "
            b { "btrfs-nodatacow" } ": data overwritten in place (so without data checksums). "
            b { "fsync ignored" } ": eatmydata makes fsync, fdatasync, sync and O_SYNC no-ops for the workload programs (LD_PRELOAD), the analogue of ZFS sync=disabled: "
            "what a crash would lose is not measured. "
            b { "Over NFS" } " the setting is the server's file system, under ganesha's export: an " code { "nfs://" } " image's own file system "
            "(as a VM guest's) stays ext4, and a kernel NFS mount's files lie on the setting's file system directly."
        }
        div.charts {
            @for row in &rows {
                @let raw_ref = row.starts_with("iogen");
                @let groups = fs_groups(&here, row, raw_ref);
                @let labels: Vec<String> = groups.iter().map(|g| g.label.clone()).collect();
                @let values: Vec<Vec<Option<Bar>>> = groups.iter().map(|g| settings.iter().map(|f| {
                    here.iter().find(|x| x.subject == g.subject && x.row == g.row && &x.factors == f).and_then(|x| x.headline().map(|(_, v)| v.values.clone())).and_then(|v| ci_bar(&v))
                }).collect()).collect();
                @let unit = here.iter().find(|x| &x.row == row).and_then(|x| x.headline().map(|(n, v)| format!("{n} ({})", v.unit))).unwrap_or_default();
                @if values.iter().flatten().any(|v| v.is_some()) {
                    (svg::grouped_bars(&format!("{row} by file system"), &unit, &labels, &series, &values))
                }
            }
        }
    })
}
