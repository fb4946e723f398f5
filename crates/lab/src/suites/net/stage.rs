//! The net suite as a stage: on every link of a shape, before any target
//! starts, iperf3's rate with 1..8 streams, the ceiling every protocol on
//! that link is shown against.

use crate::stage::context::RunContext;
use crate::stage::hooks::Stage;
use crate::cleanup::interrupted;
use crate::suites::net::iperf::LinkShape;
use crate::network::topology::{Link, Topology};
use bw_lab_results::Failure;

pub struct NetStage;

impl Stage for NetStage {
    fn cases_before_targets(&self, _cx: &RunContext, at: &crate::resume::case::At, link: &Link) -> Vec<String> {
        vec![crate::resume::case::net(&at.shape, link.mtu)]
    }

    fn before_targets(&mut self, cx: &mut RunContext, topo: &Topology, shape: &LinkShape) -> anyhow::Result<()> {
        for link in &topo.links {
            run_net(cx, topo, link, shape)?;
        }
        Ok(())
    }
}

fn run_net(cx: &mut RunContext, topo: &Topology, link: &Link, shape: &LinkShape) -> anyhow::Result<()> {
    let runs = cx.plan().net_runs as u64;
    if !cx.begin_case(&crate::resume::case::net(&shape.name, link.mtu)) {
        cx.progress().inc(runs);
        return Ok(());
    }
    cx.progress().set_message(format!("iperf3 MTU {} link {}", link.mtu, shape.name));
    let repeats = runs / crate::suites::net::iperf::STREAMS.len() as u64;
    match crate::suites::net::iperf::run_net(topo, link, shape, cx.plan().params.net_runtime_s, repeats as u32) {
        Ok(samples) => {
            for n in crate::suites::net::iperf::STREAMS {
                let v: Vec<&crate::suites::net::iperf::NetSample> = samples.iter().filter(|s| s.streams == n).collect();
                if v.is_empty() {
                    continue;
                }
                let k = v.len() as f64;
                cx.say(&format!(
                    "{:<16} {:>5} {:<18} {:>12.2} Gbit/s  client CPU {:.0}%  server CPU {:.0}%  link {}",
                    "iperf3",
                    link.mtu,
                    format!("{n} stream(s)"),
                    v.iter().map(|s| s.bits_per_s).sum::<f64>() / k / 1e9,
                    v.iter().map(|s| s.client_cpu_pct).sum::<f64>() / k,
                    v.iter().map(|s| s.server_cpu_pct).sum::<f64>() / k,
                    shape.name
                ));
            }
            cx.push_net(samples);
        }
        Err(e) => {
            if interrupted() {
                anyhow::bail!("interrupted");
            }
            cx.say(&format!("lab: iperf3 at MTU {} link {} failed: {e:#}", link.mtu, shape.name));
            cx.push_failure(Failure {
                subject: bw_lab_results::FailureSubject::Iperf3,
                mtu: Some(link.mtu),
                workload: format!("net link {}", shape.name),
                reason: format!("{e:#}"),
            });
        }
    }
    cx.progress().inc(runs);
    cx.end_case();
    cx.save()
}
