//! The storage suites as stages over one run: net, micro, sweep and fs,
//! each a [`Stage`] over the shared [`RunContext`] (plan, results,
//! progress, the link shape and factors being measured).
//!
//! What makes subjects comparable is kept by the one loop that drives the
//! stages (`crate::orchestrate`), not by the stages: per link shape the
//! net stage measures every link first; then on each link the targets
//! start once ([`LinkRun::start`]) and every stage that measures subjects
//! runs on them in order (micro and sweep take turns over all live
//! subjects, the order rotated per repetition; fs gives each subject a
//! turn after them, on the same targets); the targets stop; after every
//! link the stages' local baselines run once. Rows print in that order.

pub mod cases;
pub mod context;
pub mod hooks;
pub mod link;

pub use context::RunContext;
pub use hooks::Stage;
pub use link::LinkRun;

/// The stages a plan runs, in run order: net, micro, sweep, fs.
pub fn for_plan(plan: &crate::plan::Plan) -> Vec<Box<dyn Stage>> {
    let mut v: Vec<Box<dyn Stage>> = vec![];
    if plan.net_runs > 0 {
        v.push(Box::new(crate::suites::net::stage::NetStage));
    }
    if !plan.micro.is_empty() {
        v.push(Box::new(crate::suites::bench::stage::BenchStage { suite: bw_lab_results::Suite::Micro }));
    }
    if !plan.sweep.is_empty() {
        v.push(Box::new(crate::suites::bench::stage::BenchStage { suite: bw_lab_results::Suite::Sweep }));
    }
    if plan.fs.is_some() {
        v.push(Box::new(crate::suites::fs::stage::FsStage::default()));
    }
    v
}
