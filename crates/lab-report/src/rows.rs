//! The rows the lab prints while it runs, one as each case completes: the
//! micro and sweep table (`table_header`, `case_row`) and the fs suite's
//! headline rows. What it prints after the run is `summary`.

use bw_lab_results::accounting::{Case, Metric};
use bw_lab_results::fs::FsSample;
use bw_lab_results::SubjectKey;
use bw_lab_results::stats::Summary;
use std::collections::BTreeMap;

/// The header of the micro and sweep table.
pub fn table_header() -> String {
    format!(
        "{:<16} {:>5} {:<18} {:>19} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "subject", "MTU", "workload", "IOPS (mean±sd)", "MiB/s", "p99 µs", "tgt µs/op", "ini µs/op", "wire B/op"
    )
}

/// One case's row: IOPS mean ± sd over its repetitions, the other metrics'
/// means ("-" where a metric was not measured), its I/O errors if any.
pub fn case_row(case: &Case) -> String {
    let m = |metric: Metric| case.summary(metric).map(|s| s.mean);
    let f = |v: Option<f64>, prec: usize| v.map(|x| format!("{x:.prec$}")).unwrap_or_else(|| "-".into());
    let iops = case.summary(Metric::Iops).map(|s| format!("{:.0}±{:.0}", s.mean, s.stddev)).unwrap_or_else(|| "-".into());
    let errors = case.errors();
    format!(
        "{:<16} {:>5} {:<18} {:>19} {:>9} {:>9} {:>9} {:>9} {:>9}{}",
        case.key.subject,
        case.key.mtu.map(|m| m.to_string()).unwrap_or_else(|| "local".into()),
        case.workload.name,
        iops,
        f(m(Metric::MibPerS), 1),
        f(m(Metric::LatP99Us), 0),
        f(m(Metric::TargetCpuUsPerOp), 1),
        f(m(Metric::InitiatorCpuUsPerOp), 1),
        f(m(Metric::WireBytesPerOp), 0),
        if errors > 0 { format!("  ({errors} I/O errors)") } else { String::new() }
    )
}

/// The fs suite's rows for `samples`: each row's headline, mean ± sd over
/// the repetitions, per subject and client memory limit.
pub fn fs_rows(samples: &[FsSample]) -> Vec<String> {
    let mut rows: BTreeMap<(String, u64, SubjectKey), Vec<f64>> = BTreeMap::new();
    let mut units: BTreeMap<String, &'static str> = BTreeMap::new();
    for s in samples {
        for m in s.measures().into_iter().filter(|m| m.headline) {
            units.insert(m.row.clone(), m.unit);
            rows.entry((m.row, s.client_mem, s.subject.clone())).or_default().push(m.value);
        }
    }
    rows.into_iter()
        .map(|((row, mem, subject), v)| {
            let text = Summary::of(&v).map(|s| format!("{:.0}±{:.0}", s.mean, s.stddev)).unwrap_or_default();
            format!(
                "{:<16} {:>5} {:<18} {:>19} {}  client mem {}M",
                subject,
                "fs",
                row,
                text,
                units.get(&row).copied().unwrap_or(""),
                mem >> 20
            )
        })
        .collect()
}
