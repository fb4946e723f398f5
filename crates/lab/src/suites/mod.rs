//! What every suite is to the lab: planned from the command line, estimated,
//! run case by case into the results' samples. [`run_and_report`] is the one
//! way a suite runs: its cases, then results.json and the report (also after
//! a failure or an interrupt, with what was measured), then the cleanup.


pub mod bench;
pub mod fs;
pub mod net;
pub mod route;
pub mod runner;

use crate::cleanup::{interrupted, registry};
use bw_lab_results::{utc_now, Results};
use std::path::Path;

pub trait Suite {
    /// What it will run and about how long it takes, printed before it
    /// starts (None: it says nothing).
    fn estimate(&self) -> Option<String>;
    /// Run every case, recording samples in [`Suite::results`] as it goes.
    fn run_cases(&mut self) -> anyhow::Result<()>;
    /// What it recorded (all of it once `run_cases` returned).
    fn results(&mut self) -> &mut Results;
    /// Once the cases are over, before the results are written.
    fn finish(&mut self) {}
    /// After the results are written and everything is cleaned up: where
    /// they are, and what they say (`ok`: the run completed).
    fn print_outcome(&self, ok: bool);
}

/// Run `suite`, then write OUT/results.json and the report whatever the
/// outcome, and clean up everything the run left.
pub fn run_and_report(suite: &mut dyn Suite, out: &Path) -> anyhow::Result<()> {
    if let Some(e) = suite.estimate() {
        crate::cleanup::say(&e);
    }
    // A suite that catches the interrupt in its workload may return
    // normally; the run is still cut short and must say so. A panic (a bug,
    // or a write to a terminal that hung up) is an ending too: what was
    // measured is saved and everything is undone as after Ctrl-C.
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| suite.run_cases()));
    let outcome = ran
        .unwrap_or_else(|p| {
            let why = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
            Err(anyhow::anyhow!("the lab crashed: {why}"))
        })
        .and_then(|()| {
            if interrupted() {
                anyhow::bail!("{}", crate::cleanup::stop_reason())
            }
            Ok(())
        });
    let results = suite.results();
    results.finished_utc = utc_now();
    if let Err(e) = &outcome {
        results.aborted = Some(if interrupted() { crate::cleanup::stop_reason() } else { format!("{e:#}") });
    }
    suite.finish();
    let results = suite.results();
    let saved = results
        .save(&out.join("results.json"))
        .and_then(|_| bw_lab_report::write_all(out, results));
    crate::hosts::ssh::set_ending();
    let errors = registry().cleanup_all();
    for e in &errors {
        crate::cleanup::say(&format!("lab: cleanup: {e}"));
    }
    if let Some(kept) = crate::hosts::local_state::close() {
        crate::cleanup::say(&format!("lab: what could not be undone is listed in {}: the next run undoes it", kept.display()));
    }
    suite.print_outcome(outcome.is_ok() && saved.is_ok());
    outcome?;
    saved
}
