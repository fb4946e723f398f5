//! The results as CSV: one row per micro/sweep sample (`results.csv`), and
//! one row per fs measure in long form (`results-fs.csv`).

use bw_lab_results::accounting::Metric;
use bw_lab_results::Results;
use std::fmt::Write;

pub fn csv(r: &Results) -> String {
    let mut s = String::new();
    let derived: Vec<Metric> = Metric::ALL.to_vec();
    s.push_str("subject,protocol,target,initiator,mtu,suite,workload,rw,bs,iodepth,numjobs,rwmixread,repeat,");
    s.push_str(
        "iops,bw_bytes,lat_p50_ns,lat_p99_ns,lat_p999_ns,lat_mean_ns,ios,bytes,runtime_s,errors,",
    );
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
            b.iops,
            b.bw_bytes,
            b.lat_ns.p50,
            b.lat_ns.p99,
            b.lat_ns.p999,
            b.lat_ns.mean,
            b.ios,
            b.bytes,
            b.runtime_s,
            b.errors
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

/// fs runs in long form: one row per (run, measure).
pub fn fs_csv(r: &Results) -> String {
    let mut s = String::from("subject,link,mtu,client_mem_bytes,workload,repeat,row,measure,unit,value,elapsed_s,workload_cpu_s,attach_cpu_s,target_cpu_s,peak_mem_bytes,busy_before,started_unix\n");
    let opt = |v: Option<f64>| v.map(|x| format!("{x}")).unwrap_or_default();
    for x in &r.fs {
        for m in x.measures() {
            let _ = writeln!(
                s,
                "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
                x.subject,
                x.link,
                x.mtu.map(|m| m.to_string()).unwrap_or_default(),
                x.client_mem,
                x.workload,
                x.repeat,
                m.row,
                m.what.replace(',', ";"),
                m.unit,
                m.value,
                x.elapsed_s,
                x.workload_cpu_s,
                opt(x.attach_cpu_s),
                opt(x.target_cpu_s),
                x.peak_mem_bytes.map(|b| b.to_string()).unwrap_or_default(),
                x.busy_before,
                x.started_unix
            );
        }
    }
    s
}
