//! Every case of a storage run, in the order the run measures them, from
//! the stages' own names for their cases (`Stage::cases_*`): the loops here
//! are the run's (`crate::orchestrate`: per link shape the net stage on
//! every link; per factor combination and link the stages measuring
//! subjects; the local baselines last). A resumed run checks its plan
//! against this list and skips a link whose cases are all finished.

use super::context::RunContext;
use super::hooks::Stage;
use crate::resume::case::At;
use crate::network::topology::Link;
use bw_lab_results::{Factors, LinkName};

/// The run's place at `shape` and factor combination `(offload, digest, tls)`.
pub fn at(shape: &LinkName, offload: crate::network::offload::Offload, digest: crate::network::offload::Digest, tls: crate::network::offload::Tls) -> At {
    At { shape: shape.clone(), factors: crate::network::offload::recorded(offload, digest, tls) }
}

/// Every case the stages measure over `links`, in run order.
pub fn planned(stages: &[Box<dyn Stage>], cx: &RunContext, links: &[Link]) -> Vec<String> {
    let mut v = vec![];
    let measures_subjects = stages.iter().any(|s| s.needs_targets());
    for shape in &cx.plan().links {
        let plain = At { shape: shape.name.clone(), factors: Factors::default() };
        for s in stages {
            for l in links {
                v.extend(s.cases_before_targets(cx, &plain, l));
            }
        }
        if measures_subjects {
            for (n, (o, d, t)) in cx.plan().factor_combinations().into_iter().enumerate() {
                for (i, l) in links.iter().enumerate() {
                    v.extend(on_link(stages, cx, &at(&shape.name, o, d, t), l, i == 0 && n == 0));
                }
            }
        }
    }
    for s in stages {
        v.extend(s.cases_after_links(cx));
    }
    v
}

/// The cases the stages measure on one link (`first`: the shape's first
/// link and factor combination, where the fs suite runs).
pub fn on_link(stages: &[Box<dyn Stage>], cx: &RunContext, at: &At, link: &Link, first: bool) -> Vec<String> {
    stages.iter().flat_map(|s| s.cases_on_link(cx, at, link, first)).collect()
}
