//! What every suite is to the lab: planned from the command line, estimated,
//! run case by case into the results' samples. [`run_and_report`] is the one
//! way a suite runs: its cases, then results.json and the report (also after
//! a failure or an interrupt, with what was measured), then the cleanup.

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
        eprintln!("{e}");
    }
    // A suite that catches the interrupt in its workload may return
    // normally; the run is still cut short and must say so.
    let outcome = suite.run_cases().and_then(|()| {
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
    crate::ssh::set_ending();
    for e in registry().cleanup_all() {
        eprintln!("lab: cleanup: {e}");
    }
    suite.print_outcome(outcome.is_ok() && saved.is_ok());
    outcome?;
    saved
}
