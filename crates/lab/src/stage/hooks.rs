//! What a stage is to the run: the hooks the run calls, in its order
//! (see `crate::stage`).

use super::context::RunContext;
use super::link::LinkRun;
use crate::network::topology::Topology;

/// One suite of the storage run. Each hook defaults to nothing: a stage
/// takes part where it measures something.
pub trait Stage {
    /// Once, before the first link shape (what the stage keeps for the
    /// whole run: the fs suite's mount point and memory controller).
    fn setup(&mut self, _cx: &mut RunContext, _topo: &Topology) -> anyhow::Result<()> {
        Ok(())
    }
    /// Once per link shape, on every link, before any target starts (the
    /// network itself).
    fn before_targets(&mut self, _cx: &mut RunContext, _topo: &Topology, _shape: &crate::suites::net::iperf::LinkShape) -> anyhow::Result<()> {
        Ok(())
    }
    /// The cases [`Stage::before_targets`] measures on `link` at `at`
    /// (`crate::resume::case`).
    fn cases_before_targets(&self, _cx: &RunContext, _at: &crate::resume::case::At, _link: &crate::network::topology::Link) -> Vec<String> {
        vec![]
    }
    /// The cases [`Stage::on_link`] measures on `link` at `at` (`first`:
    /// the shape's first link and factor combination).
    fn cases_on_link(&self, _cx: &RunContext, _at: &crate::resume::case::At, _link: &crate::network::topology::Link, _first: bool) -> Vec<String> {
        vec![]
    }
    /// The cases [`Stage::after_links`] measures.
    fn cases_after_links(&self, _cx: &RunContext) -> Vec<String> {
        vec![]
    }
    /// Whether [`Stage::on_link`] measures anything (targets start only
    /// when some stage does).
    fn needs_targets(&self) -> bool {
        false
    }
    /// On one link with its targets started and its subjects live.
    fn on_link(&mut self, _cx: &mut RunContext, _run: &mut LinkRun) -> anyhow::Result<()> {
        Ok(())
    }
    /// Once, after every link: the local baseline.
    fn after_links(&mut self, _cx: &mut RunContext) -> anyhow::Result<()> {
        Ok(())
    }
    /// At the end of the run (also after a failure): undo what `setup` made.
    fn teardown(&mut self) -> anyhow::Result<()> {
        Ok(())
    }
}

