//! results.json -> results.csv, results-fs.csv and report.html. `analysis`
//! decides (what to pick, by how much, with intervals), `findings` checks
//! the studies' claims, `html` renders the page from them, section by
//! section, with maud (`svg` draws its charts, `route` the route suite's
//! section); `csv` writes the raw rows. The terminal summary (`summary`)
//! prints the same analysis.
//!
//! The report reads only the records (`bw-lab-results`): a report
//! regenerated from a results.json says what the run's own report said.

pub mod analysis;
pub mod context;
pub mod csv;
pub mod factors;
pub mod findings;
pub mod html;
pub mod resumed;
pub mod route;
pub mod rows;
pub mod summary;
pub mod svg;
#[cfg(test)]
mod test_samples;

pub use analysis::{answer_rows, decide, recommendations, Decision, Quantity, Recommendation};
pub use findings::{findings, Finding};
pub use summary::print_recommendations;

use bw_lab_results::Results;
use std::path::Path;

/// Everything a run's output directory holds besides results.json, from it alone.
pub fn write_all(out: &Path, r: &Results) -> anyhow::Result<()> {
    std::fs::write(out.join("results.csv"), csv::csv(r))?;
    if !r.fs.is_empty() {
        std::fs::write(out.join("results-fs.csv"), csv::fs_csv(r))?;
    }
    std::fs::write(out.join("report.html"), html::page(r))?;
    Ok(())
}

pub fn html(r: &Results) -> String {
    html::page(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bw_lab_results::accounting::Metric;
    use bw_lab_results::*;
    use bw_lab_results::net::WireCounters;

    /// The subject a key in results.json names.
    fn key(name: &str) -> SubjectKey {
        name.parse().unwrap()
    }

    fn sample(
        subject: &str,
        mtu: Option<u32>,
        workload: &str,
        rep: u32,
        iops: f64,
        cpu: f64,
    ) -> Sample {
        let wl = bw_lab_results::micro_workloads()
            .into_iter()
            .find(|w| w.name == workload)
            .unwrap();
        let ios = (iops * 2.0) as u64;
        Sample {
            subject: key(subject),
            mtu,
            link: "none".into(),
            suite: Suite::Micro,
            workload: wl.clone(),
            repeat: rep,
            bench: BenchResult {
                iops,
                bw_bytes: iops * wl.bs as f64,
                lat_ns: Latency {
                    p50: 1e9 / iops,
                    p99: 3e9 / iops,
                    p999: 5e9 / iops,
                    mean: 1.1e9 / iops,
                },
                cpu_user_s: cpu / 2.0,
                cpu_sys_s: cpu / 2.0,
                ios,
                bytes: ios * wl.bs,
                runtime_s: 2.0,
                errors: 0,
            },
            target_cpu_s: mtu.map(|_| cpu),
            wire: mtu.map(|_| WireCounters {
                rx_bytes: ios * (wl.bs + 200),
                tx_bytes: ios * 100,
                rx_packets: ios * 3,
                tx_packets: ios * 3,
            }),
            busy_before: 0.01,
            idle_wait_s: 0.3,
            started_unix: 0.0,
            factors: Default::default(),
            machine_cpu: vec![],
        }
    }

    /// `--offload none,stateless --digest none,crc32c,crc32c-soft` over
    /// iSCSI and NVMe/TCP: no offload costs 1.5x the whole-machine CPU and
    /// 10% of the throughput; software CRC32C costs 1.3x the CPU and 40% of
    /// the throughput on iSCSI (and nothing on NVMe/TCP).
    fn results_with_factors() -> Results {
        let mut r = Results { format: FORMAT, ..Default::default() };
        r.params.mtus = vec![1500];
        r.params.repeat = 3;
        r.params.offloads = vec!["none".into(), "stateless".into()];
        r.params.digests = vec!["none".into(), "crc32c".into(), "crc32c-soft".into()];
        for (k, p) in [("blockwire-iscsi", "iscsi"), ("blockwire-nvme", "nvme")] {
            r.subjects.push(Subject::new(key(k), p, "blockwire", "blockwire"));
        }
        for (rep, jitter) in [(1, 0.98), (2, 1.0), (3, 1.02)] {
            for offload in ["none", "stateless"] {
                for digest in ["", "crc32c", "crc32c-soft"] {
                    for subject in ["blockwire-iscsi", "blockwire-nvme"] {
                        for w in ["seqread-1m", "randread-4k-qd1", "randread-4k-qd32"] {
                            let soft_crc = digest == "crc32c-soft" && subject == "blockwire-iscsi";
                            let slow = if offload == "none" { 0.9 } else { 1.0 } * if soft_crc { 0.6 } else { 1.0 };
                            let mut s = sample(subject, Some(1500), w, rep, 1000.0 * slow * jitter, 1.0);
                            let mut cpu = 2.0 * if offload == "none" { 1.5 } else { 1.0 };
                            if soft_crc {
                                cpu *= 1.3;
                            }
                            s.machine_cpu = vec![MachineCpu { hosts: vec!["t".into(), "c".into()], busy_s: cpu * jitter * slow + 0.1, idle_s: 0.1 }];
                            s.factors = Factors { offload: offload.parse().unwrap(), digest: digest.parse().unwrap(), ..Default::default() };
                            r.samples.push(s);
                        }
                    }
                }
            }
        }
        r
    }

    /// `--fs ext4,btrfs --fsync honour,ignore` with the local baseline and
    /// an NFS subject: locally btrfs keeps 40% of the raw device's IOPS and
    /// ext4 75%; over NFS the two are within 2%.
    fn results_with_fs_factors() -> Results {
        let mut r = Results { format: FORMAT, ..Default::default() };
        r.params.repeat = 3;
        r.params.fs_kinds = vec!["ext4".into(), "btrfs".into()];
        r.params.fsyncs = vec!["honour".into(), "ignore".into()];
        r.params.fs = results().params.fs;
        r.subjects.push(Subject::new(key("ganesha-nfs"), "nfs", "nfs-ganesha", "the kernel"));
        for rep in 1..=3u32 {
            let jitter = [0.98, 1.0, 1.02][rep as usize - 1];
            for fs in ["", "btrfs"] {
                for fsync in ["", "ignore"] {
                    let factors = bw_lab_results::fs::FsFactors { fs: fs.into(), fsync: fsync.into() };
                    let keep = if fs == "btrfs" { 0.4 } else { 0.75 };
                    for (subject, w, iops) in [
                        (bw_lab_results::fs::LOCAL, "iogen-direct", 80_000.0 * keep),
                        (bw_lab_results::fs::LOCAL, "iogen-raw", 80_000.0),
                        (key("ganesha-nfs"), "iogen-direct", if fs == "btrfs" { 9_900.0 } else { 10_000.0 }),
                    ] {
                        let mut s = fs_sample(&subject, w, rep, iogen(iops * jitter));
                        s.factors = factors.clone();
                        r.fs.push(s);
                    }
                }
            }
        }
        r
    }

    /// The golden data: five subjects (one unavailable) and the local
    /// baselines, micro and sweep samples over three repeats, fs samples.
    fn results() -> Results {
        let mut r = Results {
            format: FORMAT,
            ..Default::default()
        };
        r.params.mtus = vec![1500];
        r.params.repeat = 3;
        r.params.sweep_numjobs = vec![1, 4];
        r.params.sweep_iodepth = vec![1, 16];
        r.subjects = subjects();
        r.samples = micro_and_sweep_samples();
        r.fs = fs_samples();
        r.params.fs = Some(fs_params());
        r
    }

    fn subjects() -> Vec<Subject> {
        let mut subjects = vec![];
        for (k, p, t) in [
            ("blockwire-aoe", "aoe", "blockwire"),
            ("blockwire-iscsi", "iscsi", "blockwire"),
            ("ganesha-nfs", "nfs", "ganesha"),
            ("local-fio", "local", "tmpfs file"),
        ] {
            subjects.push(Subject::new(key(k), p, t, "blockwire"));
        }
        subjects.push(Subject {
            unavailable: Some("blockwire serve exited: nvme not built yet".into()),
            ..Subject::new(key("blockwire-nvme"), "nvme", "blockwire", "blockwire")
        });
        subjects.push(Subject::new(bw_lab_results::fs::LOCAL, "local", "loop", "kernel"));
        subjects
    }

    fn micro_and_sweep_samples() -> Vec<Sample> {
        let mut samples = vec![];
        for (rep, jitter) in [(1, 0.98), (2, 1.0), (3, 1.02)] {
            for w in ["seqread-1m", "randread-4k-qd1", "randrw75-4k-qd16"] {
                samples.push(sample(
                    "blockwire-aoe",
                    Some(1500),
                    w,
                    rep,
                    20_000.0 * jitter,
                    1.0,
                ));
                // iSCSI: clearly slower on seq read, same on random reads.
                let iops = if w == "seqread-1m" {
                    15_000.0
                } else {
                    20_000.0 * (2.0 - jitter)
                };
                samples
                    .push(sample("blockwire-iscsi", Some(1500), w, rep, iops, 1.3));
                samples
                    .push(sample("local-fio", None, w, rep, 90_000.0 * jitter, 0.5));
                // NFS (an image file through nfs://): random reads at half of iSCSI's.
                if w == "randread-4k-qd1" {
                    samples.push(sample("ganesha-nfs", Some(1500), w, rep, 10_000.0 * jitter, 2.0));
                }
            }
            let mut s = sample(
                "blockwire-aoe",
                Some(1500),
                "randread-4k-qd1",
                rep,
                1000.0,
                1.0,
            );
            s.suite = Suite::Sweep;
            s.workload = bw_lab_results::sweep_workload(4, 16);
            samples.push(s);
        }
        samples
    }

    fn fs_samples() -> Vec<bw_lab_results::fs::FsSample> {
        let mut fs = vec![];
        // fs: varmail at 256 MiB, AoE clearly ahead of iSCSI; the local
        // baseline; IOgen on local ext4 and on the raw device.
        for rep in 1..=3u32 {
            let jitter = [0.98, 1.0, 1.02][rep as usize - 1];
            fs.push(fs_sample("blockwire-aoe", "varmail", rep, flow(1300.0 * jitter)));
            fs.push(fs_sample("blockwire-iscsi", "varmail", rep, flow(1000.0 * jitter)));
            // PostMark: iSCSI and NFS equal within the noise (the interval says inconclusive or equal).
            for (subject, tx) in [("blockwire-iscsi", 5000), ("ganesha-nfs", 4900 + 100 * rep as u64)] {
                let pm = bw_lab_results::fs::PostmarkResult { transactions: tx, created: 1000, ..Default::default() };
                fs.push(fs_sample(subject, "postmark", rep, bw_lab_results::fs::FsResult::Postmark(pm)));
            }
            fs.push(fs_sample(&bw_lab_results::fs::LOCAL, "varmail", rep, flow(4000.0 * jitter)));
            fs.push(fs_sample(&bw_lab_results::fs::LOCAL, "iogen-direct", rep, iogen(60_000.0 * jitter)));
            fs.push(fs_sample(&bw_lab_results::fs::LOCAL, "iogen-raw", rep, iogen(80_000.0 * jitter)));
        }
        fs
    }

    fn fs_params() -> bw_lab_results::fs::FsParams {
        bw_lab_results::fs::FsParams {
            workloads: vec!["varmail".into(), "iogen-direct".into(), "iogen-raw".into()],
            client_mem: vec![256 << 20],
            cgroup: "v1".into(),
            repeat: 3,
            runtime_s: 2,
            flowop_scale: vec![("varmail".into(), 4, 1)],
            postmark_files: 1000,
            postmark_transactions: 5000,
            bonnie_size: 64 << 20,
            iogen_size: 64 << 20,
            iogen_jobs: 4,
            iogen_bs: 8192,
            iogen_read_pct: 70,
        }
    }

    fn flow(ops_per_s: f64) -> bw_lab_results::fs::FsResult {
        let mut f = bw_workload_report::FlowReport { personality: "varmail".into(), elapsed_s: 2.0, ops: (ops_per_s * 2.0) as u64, ops_per_s, mib_per_s: ops_per_s / 100.0, ..Default::default() };
        f.flowops.insert("filereader:fsync".into(), bw_workload_report::OpStats { count: 100, bytes: 0, lat_total_ns: (1e11 / ops_per_s) as u64, lat_max_ns: 1, lat_p50_ns: 1, lat_p99_ns: 2 });
        bw_lab_results::fs::FsResult::Flowop(f)
    }

    fn iogen(iops: f64) -> bw_lab_results::fs::FsResult {
        bw_lab_results::fs::FsResult::Iogen(bw_lab_results::fs::IogenResult { iops, ios: (iops * 2.0) as u64, response_us: 1e6 / iops, runtime_s: 2.0, ..Default::default() })
    }

    fn fs_sample(subject: &(impl ToString + ?Sized), workload: &str, repeat: u32, result: bw_lab_results::fs::FsResult) -> bw_lab_results::fs::FsSample {
        let subject = key(&subject.to_string());
        let local = subject == bw_lab_results::fs::LOCAL;
        bw_lab_results::fs::FsSample {
            subject,
            link: "none".into(),
            mtu: if local { None } else { Some(1500) },
            client_mem: 256 << 20,
            workload: workload.into(),
            repeat,
            result,
            elapsed_s: 2.1,
            workload_cpu_s: 0.5,
            attach_cpu_s: if local { None } else { Some(0.4) },
            target_cpu_s: if local { None } else { Some(0.3) },
            wire: if local { None } else { Some(WireCounters { rx_bytes: 1 << 20, tx_bytes: 1 << 20, rx_packets: 100, tx_packets: 100 }) },
            peak_mem_bytes: Some(200 << 20),
            busy_before: 0.0,
            started_unix: 0.0,
            factors: Default::default(),
        }
    }

    /// Every finding of a run, one line each, as the report's table says it.
    fn findings_text(r: &Results) -> String {
        findings(r)
            .iter()
            .map(|f| format!("{} | {} | {} | {} | {} | {}\n", f.study, f.claim, f.compared, f.measured, f.verdict.word(), f.why))
            .collect()
    }

    /// The recorded results plus a route run over two MPLS datapaths and
    /// VXLAN, two protocols, three rounds.
    fn results_with_route() -> Results {
        let mut r = results();
        let mut route = bw_lab_results::route::RouteResults {
            paths: ["direct", "mpls-bpf", "mpls-userspace", "vxlan"].map(String::from).to_vec(),
            protocols: vec!["aoe".into(), "iscsi".into()],
            mtu: 9000,
            rounds: 3,
            ..Default::default()
        };
        let mut k = 0.0;
        for round in 0..3 {
            for (w, _) in bw_lab_results::route::WORKLOADS {
                for (p, base) in [("aoe", 1000.0), ("iscsi", 900.0)] {
                    k += 1.0;
                    let j = 1.0 + ((k * 7.0f64) % 5.0 - 2.0) / 100.0;
                    for (path, keep) in [("direct", 1.0), ("mpls-bpf", 0.9), ("mpls-userspace", 0.6), ("vxlan", 0.8)] {
                        route.samples.push(crate::test_samples::route_sample(round, path, p, w, base * keep * j));
                    }
                }
            }
        }
        r.route = Some(route);
        // NVMe/TCP against local, and Bonnie++'s cached block writes.
        r.subjects.iter_mut().find(|s| s.key == key("blockwire-nvme")).unwrap().unavailable = None;
        for (rep, jitter) in [(1, 0.98), (2, 1.0), (3, 1.02)] {
            r.samples.push(sample("blockwire-nvme", Some(1500), "randrw75-4k-qd16", rep, 9_000.0 * jitter, 1.0));
            for (subject, kib_s) in [("blockwire-aoe", 300_000.0), ("blockwire-iscsi", 360_000.0)] {
                let bonnie = bw_lab_results::fs::BonnieResult { block_write_kib_s: Some(kib_s * jitter), ..Default::default() };
                r.fs.push(fs_sample(subject, "bonnie", rep, bw_lab_results::fs::FsResult::Bonnie(bonnie)));
            }
        }
        r
    }

    /// One subject at two MTUs: less CPU per op at the larger.
    fn results_at_two_mtus() -> Results {
        let mut r = results();
        r.params.mtus = vec![1500, 9000];
        r.samples.retain(|s| s.subject != key("blockwire-iscsi") && s.subject != key("blockwire-aoe"));
        r.subjects.retain(|s| s.key == key("blockwire-aoe"));
        for (rep, jitter) in [(1, 0.97), (2, 1.0), (3, 1.03), (4, 0.99), (5, 1.01)] {
            for (w, small, big) in [("seqread-1m", 1.0, 0.66), ("seqwrite-1m", 2.2, 1.65)] {
                r.samples.push(sample("blockwire-aoe", Some(1500), w, rep, 1000.0, small * jitter));
                r.samples.push(sample("blockwire-aoe", Some(9000), w, rep, 1000.0, big / jitter));
            }
        }
        r
    }

    /// The findings, word for word, of fixed results: what the studies'
    /// claims say for a full run, for one without the route suite and the
    /// fs suite, and for an empty one (every claim not applicable, and why).
    /// `FINDINGS_GOLDEN_WRITE=1` rewrites the file after a deliberate change.
    /// A run with the kernel's targets and an external NAS: vblade and
    /// LIO (through blockwire's client and the kernel initiators), nvmet
    /// with the local baseline, LIO against the NAS's NFS export.
    fn results_with_kernel_targets() -> Results {
        let mut r = Results { format: FORMAT, ..Default::default() };
        r.params.mtus = vec![1500];
        r.params.repeat = 3;
        for (k, p, t) in [("vblade-aoe", "aoe", "vblade"), ("lio-iscsi", "iscsi", "lio"), ("kernel-aoe@vblade", "aoe", "vblade"), ("kernel-iscsi@lio", "iscsi", "lio"), ("nvmet-nvme", "nvme", "nvmet"), ("nas-nfs", "nfs", "nas"), ("local-fio", "local", "tmpfs file")] {
            r.subjects.push(Subject { external: t == "nas", ..Subject::new(key(k), p, t, "blockwire") });
        }
        for (rep, jitter) in [(1, 0.98), (2, 1.0), (3, 1.02)] {
            // AoE as fast as iSCSI on random reads, 30% ahead on sequential ones.
            for (subject, seq) in [("vblade-aoe", 1300.0), ("lio-iscsi", 1000.0), ("kernel-aoe@vblade", 1300.0), ("kernel-iscsi@lio", 1000.0)] {
                r.samples.push(sample(subject, Some(1500), "seqread-1m", rep, seq * jitter, 1.0));
                r.samples.push(sample(subject, Some(1500), "randread-4k-qd1", rep, 5000.0 * jitter, 1.0));
            }
            r.samples.push(sample("nas-nfs", Some(1500), "randread-4k-qd1", rep, 2500.0 * jitter, 1.0));
            r.samples.push(sample("nvmet-nvme", Some(1500), "randread-4k-qd32", rep, 50_000.0 * jitter, 1.0));
            r.samples.push(sample("local-fio", None, "randread-4k-qd32", rep, 100_000.0 * jitter, 1.0));
        }
        r
    }

    #[test]
    fn kernel_targets_and_external_subjects_are_judged_by_the_studies() {
        let fs = findings::findings(&results_with_kernel_targets());
        let find = |compared: &str| fs.iter().find(|f| f.compared.starts_with(compared)).unwrap_or_else(|| panic!("no finding on {compared}: {fs:#?}"));
        let seq = find("vblade-aoe / lio-iscsi, seqread-1m");
        assert_eq!((seq.study, seq.verdict), (1, findings::Verdict::Reproduced), "{seq:?}");
        assert_eq!(find("vblade-aoe / lio-iscsi, randread-4k-qd1").verdict, findings::Verdict::Reproduced, "equal on random reads");
        assert_eq!(find("kernel-aoe@vblade / kernel-iscsi@lio, seqread-1m").verdict, findings::Verdict::Reproduced, "the kernel initiators' pair too");
        let nfs = find("lio-iscsi / nas-nfs");
        assert_eq!((nfs.study, nfs.verdict), (2, findings::Verdict::Reproduced), "LIO 2x the NAS on random reads: {nfs:?}");
        let half = find("nvmet-nvme / local fio");
        assert_eq!((half.study, half.verdict), (4, findings::Verdict::Reproduced), "nvmet at half of local: {half:?}");
        // No kernel target in the run: no kernel pair, no new line.
        assert!(!findings::findings(&results()).iter().any(|f| f.compared.contains("lio") || f.compared.contains("nvmet")));
    }

    #[test]
    fn the_terminal_folds_what_a_run_cannot_judge_into_a_line_per_study() {
        let fs = findings::findings(&results());
        let lines = summary::findings_lines(&fs);
        let judged = fs.iter().filter(|f| f.verdict != findings::Verdict::NotApplicable).count();
        let folded: Vec<&String> = lines.iter().filter(|l| l.starts_with("[not applicable]")).collect();
        assert_eq!(lines.len(), judged + folded.len(), "{lines:#?}");
        let studies_with_na: std::collections::BTreeSet<u8> = fs.iter().filter(|f| f.verdict == findings::Verdict::NotApplicable).map(|f| f.study).collect();
        assert_eq!(folded.len(), studies_with_na.len(), "one line per study: {folded:#?}");
        for f in fs.iter().filter(|f| f.verdict == findings::Verdict::NotApplicable) {
            assert!(folded.iter().any(|l| l.contains(&format!("study {}:", f.study)) && l.contains(&f.why)), "what run would judge it: {}", f.why);
        }
        assert!(judged > 0 && folded.len() < fs.len() - judged, "fewer lines than findings");
    }

    #[test]
    fn findings_of_fixed_results_word_for_word() {
        let mut no_route_no_fs = results();
        no_route_no_fs.fs.clear();
        no_route_no_fs.params.fs = None;
        let text = [
            ("full run with the route suite", results_with_route()),
            ("two MTUs", results_at_two_mtus()),
            ("no route, no fs", no_route_no_fs),
            ("offload and digest factors", results_with_factors()),
            ("file-system factors", results_with_fs_factors()),
            ("empty", Results::default()),
        ]
            .into_iter()
            .map(|(name, r)| format!("# {name}\n{}", findings_text(&r)))
            .collect::<String>();
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/findings.txt");
        if std::env::var_os("FINDINGS_GOLDEN_WRITE").is_some() {
            std::fs::write(path, &text).unwrap();
        }
        let golden = std::fs::read_to_string(path).unwrap();
        for (i, (got, want)) in text.lines().zip(golden.lines()).enumerate() {
            assert_eq!(got, want, "line {} of testdata/findings.txt", i + 1);
        }
        assert_eq!(text.lines().count(), golden.lines().count());
    }

    /// results.json of a run that was not resumed, byte for byte (the
    /// fixed results with the route suite, as `Results::save` writes them):
    /// what a resumed run adds (`resumed`) is absent here, and nothing else
    /// moved. `RESULTS_GOLDEN_WRITE=1` rewrites the file after a deliberate
    /// change of the format.
    #[test]
    fn results_json_of_a_run_not_resumed_byte_for_byte() {
        let dir = std::env::temp_dir().join(format!("bw-report-golden-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let r = results_with_route();
        assert!(r.resumed.is_none());
        r.save(&dir.join("results.json")).unwrap();
        let text = std::fs::read_to_string(dir.join("results.json")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/results.json");
        if std::env::var_os("RESULTS_GOLDEN_WRITE").is_some() {
            std::fs::write(path, &text).unwrap();
        }
        let golden = std::fs::read_to_string(path).unwrap();
        for (i, (got, want)) in text.lines().zip(golden.lines()).enumerate() {
            assert_eq!(got, want, "line {} of testdata/results.json", i + 1);
        }
        assert_eq!(text, golden);
        // And it reads back as it was.
        assert_eq!(serde_json::from_str::<Results>(&golden).unwrap(), r);
    }

    /// iSCSI and NVMe/TCP at 4 KiB QD32, NVMe/TCP's client costing `nvme_client`
    /// times its target per op, with the machine `busy` (share of its two
    /// CPUs in use over each run).
    fn results_client_bound(nvme_client: f64, busy: f64) -> Results {
        let mut r = Results { format: FORMAT, ..Default::default() };
        r.params.mtus = vec![1500];
        r.params.repeat = 3;
        r.machine.cpus = 2;
        for (k, p) in [("blockwire-iscsi", "iscsi"), ("blockwire-nvme", "nvme")] {
            r.subjects.push(Subject::new(key(k), p, "blockwire", "blockwire"));
        }
        for (rep, jitter) in [(1, 0.98), (2, 1.0), (3, 1.02)] {
            for (subject, iops, client) in [("blockwire-iscsi", 100_000.0, 1.2), ("blockwire-nvme", 120_000.0, nvme_client)] {
                let mut s = sample(subject, Some(1500), "randread-4k-qd32", rep, iops * jitter, 1.0);
                s.bench.cpu_user_s = client / 2.0;
                s.bench.cpu_sys_s = client / 2.0;
                // 2 s runs on 2 CPUs: 4 CPU-seconds in all.
                s.machine_cpu = vec![MachineCpu { hosts: vec!["t".into(), "c".into()], busy_s: 4.0 * busy, idle_s: 0.1 }];
                r.samples.push(s);
            }
        }
        r
    }

    /// A comparison is flagged where a subject's client spends more than
    /// twice its target's CPU per op and the machine's CPUs were full, in
    /// the terminal summary and the report, and nowhere else.
    #[test]
    fn a_comparison_bound_by_the_client_is_flagged() {
        let flagged = |r: &Results| -> Vec<String> { recommendations(r).iter().flat_map(|rec| rec.client_bound.iter().map(|c| c.subject.clone())).collect() };
        let r = results_client_bound(2.5, 0.97);
        assert_eq!(flagged(&r), vec!["blockwire-nvme".to_string()]);
        let lines = summary::client_bound_lines(&recommendations(&r));
        assert!(lines.len() == 2 && lines[1].contains("randread-4k-qd32") && lines[1].contains("2.5x its target's") && lines[1].contains("97% busy"), "{lines:?}");
        let page = html::page(&r);
        assert!(page.contains("Where the client is the bottleneck") && page.contains("blockwire-nvme: its client spent"), "in the report");
        // Not when the machine had CPU to spare, nor at 1.5x, nor without
        // whole-machine figures.
        for r in [results_client_bound(2.5, 0.6), results_client_bound(1.5, 0.97)] {
            assert!(flagged(&r).is_empty());
            assert!(!html::page(&r).contains("Where the client is the bottleneck"));
        }
        let mut r = results_client_bound(2.5, 0.97);
        r.samples.iter_mut().for_each(|s| s.machine_cpu.clear());
        assert!(flagged(&r).is_empty());
    }

    #[test]
    fn the_offload_section_shows_every_setting_and_whole_machine_cpu() {
        let page = html::page(&results_with_factors());
        assert!(page.contains("<section id=\"offload\">"), "the section is there");
        for setting in ["offload none", "offload stateless, digest crc32c", "offload none, digest crc32c-soft"] {
            assert!(page.contains(setting), "{setting}");
        }
        assert!(page.contains("seqread-1m: machine CPU s/GB") && page.contains("randread-4k-qd32: machine CPU µs/op"), "both charts");
        assert!(!html::page(&results()).contains("<section id=\"offload\">"), "not without factors");
    }

    #[test]
    fn the_file_system_section_compares_settings_against_raw() {
        let page = html::page(&results_with_fs_factors());
        assert!(page.contains("<section id=\"fs-factor\">"));
        assert!(page.contains("iogen-direct by file system") && page.contains("raw device (local)"));
        for setting in ["ext4, fsync ignored", "btrfs"] {
            assert!(page.contains(setting), "{setting}");
        }
        assert!(!html::page(&results()).contains("<section id=\"fs-factor\">"), "not without --fs/--fsync");
    }

    #[test]
    fn decisions_respect_the_noise() {
        let e = |n: &str, v: &[f64]| (n.to_string(), v.to_vec());
        let iops = Quantity::of(Metric::Iops);
        let a = [100.0, 101.0, 99.0, 100.5, 99.5];
        let b = [80.0, 81.0, 79.0, 80.5, 79.5];
        let c = [99.0, 102.0, 98.0, 101.0, 100.0];
        let d = decide(&iops, &[e("a", &a), e("b", &b)]).unwrap();
        assert_eq!(d.winner.as_deref(), Some("a"));
        assert!(d.text.starts_with("a: 25% more IOPS ("), "{}", d.text);
        assert!(d.text.ends_with(" than b"), "{}", d.text);
        let d = decide(&iops, &[e("a", &a), e("b", &b), e("c", &c)]).unwrap();
        assert_eq!(d.winner, None, "a and c are within the noise: {}", d.text);
        assert!(d.text.starts_with("within the noise: a vs c: 0% more IOPS ("), "{}", d.text);
        assert_eq!(d.pick(), "tie: a ≈ c");
        // Lower is better for latency: b wins, told as a saving.
        let d = decide(&Quantity::of(Metric::LatP50Us), &[e("a", &a), e("b", &b)]).unwrap();
        assert_eq!(d.winner.as_deref(), Some("b"));
        assert!(d.text.starts_with("b: 20% less median latency ("), "{}", d.text);
        // Single runs: never a winner.
        let d = decide(&iops, &[e("x", &[10.0]), e("y", &[5.0])]).unwrap();
        assert_eq!(d.winner, None);
        assert!(d.text.contains("no winner claimed"), "{}", d.text);
        assert_eq!(d.pick(), "x leads (single runs: untested)");
        // One subject with a value (bonnie++ timed its seeks for one only):
        // nothing was compared, and the answer table says so.
        let d = decide(&iops, &[e("x", &a), e("y", &[])]).unwrap();
        assert_eq!((d.winner.clone(), d.pick()), (None, "only x measured".to_string()));
    }

    #[test]
    fn recommendations_and_findings_from_recorded_results() {
        let r = results();
        let recs = recommendations(&r);
        let micro: Vec<&Recommendation> = recs.iter().filter(|x| x.suite == "micro").collect();
        assert_eq!(micro.len(), 3);
        let seq = micro.iter().find(|x| x.workload == "seqread-1m").unwrap();
        assert_eq!(seq.throughput.as_ref().unwrap().winner.as_deref(), Some("blockwire-aoe"));
        assert!(seq.vs_local.as_ref().unwrap().contains("22%"), "{:?}", seq.vs_local);
        let rnd = micro.iter().find(|x| x.workload == "randread-4k-qd1").unwrap();
        assert_eq!(rnd.throughput.as_ref().unwrap().winner, None);
        let cpu = seq.cpu.as_ref().unwrap();
        assert_eq!(cpu.winner.as_deref(), Some("blockwire-aoe"));
        // fs: one row per (link, memory limit, workload row), the local
        // baseline only as the "vs local" reference.
        let var = recs.iter().find(|x| x.suite == "fs" && x.workload.starts_with("fs varmail")).unwrap();
        assert_eq!(var.client_mem, Some(256 << 20));
        assert!(var.scenario.ends_with("client mem 256 MiB"), "{}", var.scenario);
        assert_eq!(var.throughput.as_ref().unwrap().winner.as_deref(), Some("blockwire-aoe"));
        assert!(var.vs_local.as_ref().unwrap().contains("32% of local ext4"), "{:?}", var.vs_local);
        let f = findings(&r);
        let by = |claim: &str, compared: &str| f.iter().find(|x| x.claim.starts_with(claim) && x.compared.contains(compared)).unwrap_or_else(|| panic!("no finding {claim} / {compared}"));
        assert_eq!(by("AoE about 20% faster", "blockwire-aoe / blockwire-iscsi").verdict, findings::Verdict::Reproduced);
        assert_eq!(by("AoE and iSCSI equal", "blockwire-aoe").verdict, findings::Verdict::Reproduced);
        // No 1gbit link in this run: said so, not guessed.
        let g = by("AoE about 20% faster", "link 1gbit");
        assert_eq!(g.verdict, findings::Verdict::NotApplicable);
        assert!(g.why.contains("--link 1gbit"), "{}", g.why);
        let v = by("AoE about 11% ahead of iSCSI on varmail", "blockwire-aoe");
        assert_eq!(v.verdict, findings::Verdict::Reproduced, "{v:?}");
        assert!(v.measured.starts_with("AoE/iSCSI ops/s 1.30 ("), "{}", v.measured);
        assert_eq!(by("AoE about 19% ahead of iSCSI on oltp", "oltp").verdict, findings::Verdict::NotApplicable);
        let cost = by("a file system costs a lot locally", "local ext4");
        assert_eq!(cost.verdict, findings::Verdict::Reproduced);
        assert!(cost.measured.starts_with("IOPS ext4/raw 0.75 ("), "{}", cost.measured);
        assert!(f.iter().any(|x| x.study == 5 && x.verdict == findings::Verdict::NotApplicable));
        // A wide interval decides nothing; a narrow one around 1 says "equal".
        let mut wide = results();
        for s in wide.fs.iter_mut().filter(|s| s.subject == key("blockwire-aoe") && s.workload == "varmail") {
            if s.repeat == 2 {
                s.result = flow(300.0);
            }
        }
        let f = findings(&wide);
        let v = f.iter().find(|x| x.claim.contains("varmail") && x.compared.contains("blockwire-aoe")).unwrap();
        assert_eq!(v.verdict, findings::Verdict::Inconclusive, "{v:?}");
    }

    /// Reads and writes cost about 2x apart per op; both a third lower at
    /// the larger MTU in every repeat is a reproduced MTU finding (pooled,
    /// the two levels widened the interval into "within the noise").
    #[test]
    fn a_larger_mtu_is_judged_per_workload() {
        let r = results_at_two_mtus();
        let f = findings(&r);
        let cpu = f.iter().find(|x| x.claim.contains("larger MTU") && x.compared.starts_with("CPU per op")).unwrap();
        assert_eq!(cpu.verdict, findings::Verdict::Reproduced, "{cpu:?}");
        assert_eq!(cpu.measured, "blockwire-aoe 0.66/0.75", "{cpu:?}");
    }

    #[test]
    fn html_is_self_contained_with_charts_and_sections() {
        let mut r = results();
        r.subjects[0].unavailable = None;
        let page = html(&r);
        assert!(page.contains("<svg class=\"chart\""));
        assert!(page.contains("heatmap"));
        for id in ["answer", "subjects", "findings", "recommendation", "micro", "sweep", "fs", "overhead", "method"] {
            assert!(page.contains(&format!("<section id=\"{id}\">")), "no {id} section");
        }
        assert!(!page.contains("<section id=\"net\">"), "net did not run: no section");
        assert!(page.contains("unavailable: blockwire serve exited: nvme not built yet"));
        assert!(page.contains("iSCSI/TCP/IP"));
        assert!(page.contains("personalities at client mem 256 MiB"));
        for forbidden in ["http://", "https://", "src=", "<link", "@import", "docs/", ".md"] {
            let without_ns = page.replace("http://www.w3.org/2000/svg", "");
            assert!(!without_ns.contains(forbidden), "external reference {forbidden}");
        }
        assert!(!page.contains("NaN"));
        // Text from the results is escaped by the template.
        r.aborted = Some("<script>alert(1)</script>".into());
        let page = html(&r);
        assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;") && !page.contains("<script>alert"));
        // The same results always render the same page.
        assert_eq!(html(&r), page);
        let c = csv::csv(&r);
        let lines: Vec<&str> = c.lines().collect();
        assert_eq!(lines.len(), r.samples.len() + 1);
        let cols = lines[0].split(',').count();
        assert!(lines.iter().all(|l| l.split(',').count() == cols));
        let f = csv::fs_csv(&r);
        let cols = f.lines().next().unwrap().split(',').count();
        assert!(f.lines().all(|l| l.split(',').count() == cols));
        assert_eq!(analysis::sample_counts(&r)["blockwire-aoe"], 12 + 3);
    }

    /// The rows printed while the lab runs, from the same cases the
    /// report analyses.
    #[test]
    fn terminal_rows_of_recorded_results() {
        let r = results();
        let header = rows::table_header();
        assert!(header.starts_with("subject") && header.contains("IOPS (mean±sd)"));
        let cases = analysis::micro_cases(&r);
        let case = cases.values().find(|c| c.key.mtu.is_some()).unwrap();
        let row = rows::case_row(case);
        assert!(row.starts_with(&format!("{:<16} {:>5} {:<18}", case.key.subject, case.key.mtu.unwrap(), case.workload.name)), "{row}");
        let iops = case.summary(Metric::Iops).unwrap();
        assert!(row.contains(&format!("{:.0}±{:.0}", iops.mean, iops.stddev)), "{row}");
        assert!(!row.contains("I/O errors"), "{row}");
        let fs = rows::fs_rows(&r.fs);
        assert!(!fs.is_empty() && fs.iter().all(|l| l.contains("  client mem ")), "{fs:?}");
    }

    /// results.json of every fixed run reads back and writes out byte for
    /// byte the same: the typed keys (`SubjectKey`, `Suite`) keep the names
    /// the lab always wrote, so old files load and re-saving changes nothing.
    #[test]
    fn results_json_round_trips_byte_for_byte() {
        for r in [results_with_route(), results_at_two_mtus(), results_with_factors(), results_with_fs_factors(), Results::default()] {
            let text = serde_json::to_string_pretty(&r).unwrap();
            let back: Results = serde_json::from_str(&text).unwrap();
            assert_eq!(serde_json::to_string_pretty(&back).unwrap(), text);
        }
        let text = serde_json::to_string_pretty(&results()).unwrap();
        for name in ["\"subject\": \"local-fio\"", "\"subject\": \"local-fs\"", "\"subject\": \"blockwire-aoe\"", "\"key\": \"ganesha-nfs\"", "\"suite\": \"sweep\""] {
            assert!(text.contains(name), "{name}");
        }
    }

    #[test]
    fn results_with_fs_samples_round_trip_through_json() {
        let r = results();
        let text = serde_json::to_string_pretty(&r).unwrap();
        assert!(text.contains("\"kind\": \"flowop\""), "fs results are tagged by kind");
        let back: Results = serde_json::from_str(&text).unwrap();
        // Exactly: the bootstrap's seed comes from the values' bits, so a
        // re-render from results.json needs every float as it was.
        assert!(back == r, "results changed through JSON");
        // Results of an older lab (no fs, no link shapes) still load.
        let mut old: serde_json::Value = serde_json::from_str(&text).unwrap();
        old.as_object_mut().unwrap().remove("fs");
        old["params"].as_object_mut().unwrap().remove("link_shapes");
        old["params"].as_object_mut().unwrap().remove("fs");
        let back: Results = serde_json::from_value(old).unwrap();
        assert!(back.fs.is_empty() && back.params.fs.is_none());
    }
}
