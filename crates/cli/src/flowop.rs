//! `blockwire flowop`: a filebench-style personality (`flowop::NAMES`) on a
//! directory, with ops/s, MiB/s and latency per flowop.
//! The lab's fs suite runs it inside a memory cgroup on a mounted volume.

use bw_workload::flowop::{self, Options, Scale, Stop};
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args)]
pub struct FlowopArgs {
    // `flowop::NAMES`, listed by hand: cli_basics checks the list.
    /// webserver, fileserver, varmail, oltp or oltp-direct.
    pub personality: String,
    /// Directory to run in (created if missing; the file sets stay there).
    pub dir: PathBuf,
    /// Seconds of the measured phase.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub runtime: f64,
    /// Stop after each thread ran its flowops N times (instead of --runtime).
    #[arg(long, value_name = "N")]
    pub loops: Option<u64>,
    /// Divide the personality's file counts by N (1 = filebench's defaults).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub files_scale: usize,
    /// Divide the personality's thread instances by N.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub threads_scale: usize,
    /// Write the prepared files back and drop them from the page cache before measuring.
    #[arg(long)]
    pub drop_cache: bool,
    /// Seed for file choice and append sizes.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: FlowopArgs) -> anyhow::Result<()> {
    let scale = Scale { files: a.files_scale.max(1), threads: a.threads_scale.max(1) };
    let p = flowop::personality(&a.personality, scale).ok_or_else(|| {
        anyhow::anyhow!("unknown personality {:?} ({})", a.personality, flowop::NAMES.join(", "))
    })?;
    anyhow::ensure!(a.runtime > 0.0 || a.loops.is_some(), "--runtime must be positive");
    let stop = match a.loops {
        Some(n) => Stop::Loops(n),
        None => Stop::After(Duration::from_secs_f64(a.runtime)),
    };
    let r = flowop::run(&a.dir, &p, Options { stop, seed: a.seed, drop_cache: a.drop_cache })?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    println!(
        "{} in {}: {:.0} ops/s, {:.1} MiB/s over {:.1} s (file sets made in {:.1} s)",
        r.personality,
        a.dir.display(),
        r.ops_per_s,
        r.mib_per_s,
        r.elapsed_s,
        r.prepare_s
    );
    println!("{:<28} {:>10} {:>10} {:>10} {:>10} {:>10}", "flowop", "ops", "ops/s", "MiB/s", "mean µs", "p99 µs");
    for (name, s) in &r.flowops {
        println!(
            "{:<28} {:>10} {:>10.0} {:>10.1} {:>10.1} {:>10.1}",
            name,
            s.count,
            s.count as f64 / r.elapsed_s.max(1e-9),
            s.bytes as f64 / 1048576.0 / r.elapsed_s.max(1e-9),
            s.mean_lat_us(),
            s.lat_p99_ns as f64 / 1e3
        );
    }
    for (name, n) in &r.errors {
        println!("{name}: {n} failed");
    }
    Ok(())
}
