//! What every section of report.html renders from: the results and what
//! the analysis computes from them once ([`Ctx`]). Below the sections
//! (`html` and `factors` both render from it).

use crate::analysis::{self, FsCase, FsKey, Recommendation};
use crate::findings::{self, Finding};
use crate::svg;
use bw_lab_results::accounting::{Case, CaseKey};
use bw_lab_results::{Results, SubjectKey};
use std::collections::BTreeMap;

/// Everything a section may use, computed once.
pub struct Ctx<'a> {
    pub r: &'a Results,
    pub micro: BTreeMap<CaseKey, Case>,
    pub fs: BTreeMap<FsKey, FsCase>,
    pub recs: Vec<Recommendation>,
    pub findings: Vec<Finding>,
    /// Subject key -> chart colour.
    pub colors: BTreeMap<SubjectKey, String>,
}

impl<'a> Ctx<'a> {
    pub fn new(r: &'a Results) -> Ctx<'a> {
        let colors = r.subjects.iter().enumerate().map(|(i, s)| (s.key.clone(), svg::PALETTE[i % svg::PALETTE.len()].to_string())).collect();
        Ctx {
            r,
            micro: analysis::micro_cases(r),
            fs: analysis::fs_cases(&r.fs),
            recs: analysis::recommendations(r),
            findings: findings::findings(r),
            colors,
        }
    }
    pub fn color(&self, key: &SubjectKey) -> String {
        self.colors.get(key).cloned().unwrap_or_else(|| "#000".into())
    }
}
