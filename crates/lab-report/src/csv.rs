//! The results as CSV: one row per micro/sweep sample (`results.csv`), and
//! one row per fs measure in long form (`results-fs.csv`). Fields are
//! quoted where they need it (a flowop or subject name may hold a comma);
//! numbers are written as Rust prints them, as in results.json.

use bw_lab_results::accounting::Metric;
use bw_lab_results::Results;

/// The columns of `results.csv` before the derived metrics ([`Metric::key`]).
const SAMPLE_COLUMNS: [&str; 33] = [
    "subject",
    "protocol",
    "target",
    "initiator",
    "mtu",
    "suite",
    "workload",
    "rw",
    "bs",
    "iodepth",
    "numjobs",
    "rwmixread",
    "repeat",
    "iops",
    "bw_bytes",
    "lat_p50_ns",
    "lat_p99_ns",
    "lat_p999_ns",
    "lat_mean_ns",
    "ios",
    "bytes",
    "runtime_s",
    "errors",
    "initiator_cpu_user_s",
    "initiator_cpu_sys_s",
    "target_cpu_s",
    "wire_rx_bytes",
    "wire_tx_bytes",
    "wire_rx_frames",
    "wire_tx_frames",
    "busy_before",
    "idle_wait_s",
    "started_unix",
];

const FS_COLUMNS: [&str; 17] = [
    "subject",
    "link",
    "mtu",
    "client_mem_bytes",
    "workload",
    "repeat",
    "row",
    "measure",
    "unit",
    "value",
    "elapsed_s",
    "workload_cpu_s",
    "attach_cpu_s",
    "target_cpu_s",
    "peak_mem_bytes",
    "busy_before",
    "started_unix",
];

/// A value as a field: empty when absent.
fn opt<T: ToString>(v: Option<T>) -> String {
    v.map(|x| x.to_string()).unwrap_or_default()
}

/// Rows into CSV text (`\n` line ends, quoting only where needed).
fn write_rows(rows: impl IntoIterator<Item = Vec<String>>) -> String {
    let mut w = ::csv::WriterBuilder::new().from_writer(vec![]);
    for row in rows {
        w.write_record(&row).expect("a CSV row into memory");
    }
    String::from_utf8(w.into_inner().expect("CSV into memory")).expect("CSV of UTF-8 fields")
}

pub fn csv(r: &Results) -> String {
    let header = SAMPLE_COLUMNS.iter().map(|c| c.to_string()).chain(Metric::ALL.iter().map(|m| m.key().to_string()));
    let rows = r.samples.iter().map(|x| {
        let subj = r.subject(&x.subject);
        let w = &x.workload;
        let b = &x.bench;
        let wire = x.wire;
        let mut row = vec![
            x.subject.to_string(),
            opt(subj.map(|s| &s.protocol)),
            opt(subj.map(|s| &s.target)),
            opt(subj.map(|s| &s.initiator)),
            opt(x.mtu),
            x.suite.to_string(),
            w.name.clone(),
            w.rw.clone(),
            w.bs.to_string(),
            w.iodepth.to_string(),
            w.numjobs.to_string(),
            opt(w.rwmixread),
            x.repeat.to_string(),
            b.iops.to_string(),
            b.bw_bytes.to_string(),
            b.lat_ns.p50.to_string(),
            b.lat_ns.p99.to_string(),
            b.lat_ns.p999.to_string(),
            b.lat_ns.mean.to_string(),
            b.ios.to_string(),
            b.bytes.to_string(),
            b.runtime_s.to_string(),
            b.errors.to_string(),
            b.cpu_user_s.to_string(),
            b.cpu_sys_s.to_string(),
            opt(x.target_cpu_s),
            opt(wire.map(|w| w.rx_bytes)),
            opt(wire.map(|w| w.tx_bytes)),
            opt(wire.map(|w| w.rx_packets)),
            opt(wire.map(|w| w.tx_packets)),
            x.busy_before.to_string(),
            x.idle_wait_s.to_string(),
            x.started_unix.to_string(),
        ];
        row.extend(Metric::ALL.iter().map(|m| opt(m.of(x))));
        row
    });
    write_rows(std::iter::once(header.collect()).chain(rows))
}

/// fs runs in long form: one row per (run, measure).
pub fn fs_csv(r: &Results) -> String {
    let header = FS_COLUMNS.iter().map(|c| c.to_string()).collect();
    let rows = r.fs.iter().flat_map(|x| {
        x.measures().into_iter().map(move |m| {
            vec![
                x.subject.to_string(),
                x.link.to_string(),
                opt(x.mtu),
                x.client_mem.to_string(),
                x.workload.clone(),
                x.repeat.to_string(),
                m.row,
                m.what,
                m.unit.to_string(),
                m.value.to_string(),
                x.elapsed_s.to_string(),
                x.workload_cpu_s.to_string(),
                opt(x.attach_cpu_s),
                opt(x.target_cpu_s),
                opt(x.peak_mem_bytes),
                x.busy_before.to_string(),
                x.started_unix.to_string(),
            ]
        })
    });
    write_rows(std::iter::once(header).chain(rows))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bw_lab_results::fs::{FsResult, FsSample};
    use bw_workload_report::{FlowReport, OpStats};

    #[test]
    fn a_field_with_a_comma_is_quoted_not_mangled() {
        let mut flow = FlowReport { ops: 10, ops_per_s: 5.0, ..Default::default() };
        flow.flowops.insert("read,fsync".into(), OpStats { count: 1, lat_total_ns: 1000, ..Default::default() });
        let mut r = Results::default();
        r.fs.push(FsSample {
            subject: bw_lab_results::SubjectKey::served("blockwire", "iscsi"),
            link: "none".into(),
            mtu: Some(1500),
            client_mem: 1 << 20,
            workload: "varmail".into(),
            repeat: 1,
            result: FsResult::Flowop(flow),
            elapsed_s: 2.0,
            workload_cpu_s: 0.5,
            attach_cpu_s: None,
            target_cpu_s: Some(0.25),
            wire: None,
            peak_mem_bytes: None,
            busy_before: 0.0,
            started_unix: 1.5,
            factors: Default::default(),
        });
        let text = fs_csv(&r);
        let mut lines = text.lines();
        assert_eq!(lines.next().unwrap().split(',').count(), FS_COLUMNS.len());
        assert_eq!(lines.next().unwrap(), "blockwire-iscsi,none,1500,1048576,varmail,1,varmail,ops/s,ops/s,5,2,0.5,,0.25,,0,1.5");
        assert!(text.contains(",varmail,\"read,fsync mean\",µs,1,"), "{text}");
        let mut rd = ::csv::Reader::from_reader(text.as_bytes());
        assert!(rd.records().all(|x| x.unwrap().len() == FS_COLUMNS.len()));
    }
}
