//! A storage run's start as part of a resumable run: at its beginning the
//! plan's cases are checked against the stored plan's and the start is
//! written down (a resumed one says what it keeps, what it measures again,
//! and what differs since the first start); links whose cases are all
//! finished are passed over without starting their targets; at its end the
//! start says how it ended, and a resumed run's results become the whole
//! run's (`super::book::Book::assemble`).

use super::record::StartEntry;
use super::stored_plan::StoredPlan;
use crate::stage::hooks::Stage;
use crate::stage::context::RunContext;
use crate::network::topology::{Link, Topology};

/// The start begins measuring: its cases checked against the stored
/// plan's (stored there by the first start), the start written down.
pub fn begin_start(cx: &mut RunContext, stored: Option<&mut StoredPlan>, topo: &Topology) -> anyhow::Result<()> {
    if let Some(stored) = stored {
        if stored.cases.is_empty() {
            stored.cases = cx.planned().to_vec();
            stored.save(cx.out_dir())?;
        } else if stored.cases != cx.planned() {
            let there: Vec<&String> = stored.cases.iter().filter(|c| !cx.planned().contains(c)).collect();
            let here: Vec<&String> = cx.planned().iter().filter(|c| !stored.cases.contains(c)).collect();
            anyhow::bail!(
                "--resume: this run's cases are not those of the stored plan (the hosts' MTU or NICs changed?): only there: {}; only here: {}",
                list(&there),
                list(&here)
            );
        }
    }
    let mut host_boots = vec![];
    for host in [&topo.target, &topo.client] {
        if let Some(b) = host.other_machine_boot_id() {
            host_boots.push((host.address(), b));
        }
    }
    let r = cx.results();
    let entry = StartEntry {
        n: 0,
        utc: r.started_utc.clone(),
        pid: std::process::id(),
        boot_id: crate::hosts::state_file::boot_id(),
        machine: r.machine.clone(),
        software: r.software.clone(),
        hosts: r.hosts.clone(),
        host_boots,
    };
    if cx.book().resumed() {
        for line in cx.book().summary(cx.planned(), &StartEntry { n: cx.book().start_number(), ..entry.clone() }) {
            cx.say(&line);
        }
        // What earlier starts recorded of the subjects (what they said of
        // themselves, what was unavailable), and what they measured.
        if let Some(earlier) = cx.book().restored_subjects().cloned() {
            for s in cx.results_mut().subjects.iter_mut() {
                if let Some(e) = earlier.iter().find(|e| e.key == s.key) {
                    *s = e.clone();
                }
            }
        }
        let so_far = cx.book().assemble(cx.results(), &[]);
        let r = cx.results_mut();
        (r.samples, r.fs, r.net, r.failures) = (so_far.samples, so_far.fs, so_far.net, so_far.failures);
    }
    cx.book_mut().begin_start(entry);
    Ok(())
}

fn list(v: &[&String]) -> String {
    if v.is_empty() {
        "none".into()
    } else {
        v.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
    }
}

/// Whether every case on `link` here (the current shape and factors) was
/// finished by an earlier start: its targets need not start.
pub fn link_done(cx: &mut RunContext, stages: &[Box<dyn Stage>], link: &Link, first: bool, digest: crate::network::offload::Digest, tls: crate::network::offload::Tls) -> bool {
    let at = cx.at();
    let cases = crate::stage::cases::on_link(stages, cx, &at, link, first);
    if cases.is_empty() || !cases.iter().all(|c| cx.book().is_done(c)) {
        return false;
    }
    let p = &cx.plan();
    let bench = p.subjects_for(digest, tls).len() as u64 * (p.micro.len() as u64 * p.params.repeat as u64 + p.sweep.len() as u64 * p.params.sweep_repeats() as u64);
    cx.progress().inc(bench + if first { p.fs_runs() } else { 0 });
    cx.say(&format!("lab: {}: all {} cases finished in an earlier start; its targets are not started", crate::resume::case::targets(&at, link.mtu).trim_start_matches("targets, "), cases.len()));
    true
}

/// The start ends: how, written down; a resumed run's results become the
/// whole run's.
pub fn end_start(cx: &mut RunContext) {
    if cx.book().began() {
        let how = cx.results().aborted.clone().unwrap_or_else(|| "completed".into());
        let ssh_commands = cx.results().ssh_commands;
        cx.book_mut().end(&how, ssh_commands);
    }
    if cx.book().resumed() {
        let whole = cx.results_to_save();
        *cx.results_mut() = whole;
    }
}
