//! The report's section on a resumed run (`blockwire lab --resume`): its
//! starts (when, which process and boot, how each ended, what differed
//! from the first), and which start measured each case.

use crate::context::Ctx;
use maud::{html, Markup};

pub fn section(c: &Ctx) -> Option<Markup> {
    let res = c.r.resumed.as_ref()?;
    let short = |b: &str| b.chars().take(8).collect::<String>();
    // Consecutive cases from one start, as one row.
    let mut runs: Vec<(u32, Vec<&str>)> = vec![];
    for case in &res.cases {
        match runs.last_mut() {
            Some((s, v)) if *s == case.start => v.push(&case.case),
            _ => runs.push((case.start, vec![&case.case])),
        }
    }
    Some(html! {
        p {
            "This run took " (res.starts.len()) " starts. A case (one workload or setting on every subject, with all its repetitions) "
            "comes whole from one start: what a start measured of a case it did not finish was set aside, and a later start measured that case again."
        }
        table {
            tr { th { "start" } th.l { "began (UTC)" } th.l { "ended" } th.l { "process" } th { "cases measured" } th { "kept from earlier starts" } th.l { "set aside" } th.l { "since the first start" } }
            @for s in &res.starts {
                tr {
                    td { (s.n) } td.l { (s.started_utc) } td.l { (s.ended) }
                    td.l { "PID " (s.pid) " on " (s.hostname) ", boot " (short(&s.boot_id)) }
                    td { (s.cases_measured) } td { (s.cases_skipped) }
                    td.l {
                        @if s.set_aside.is_empty() { "-" }
                        @for a in &s.set_aside { (a.case) " (" (a.samples) " samples)" br; }
                    }
                    td.l class=(if s.differences.is_empty() { "" } else { "no" }) {
                        @if s.differences.is_empty() { @if s.n == 1 { "-" } @else { "the same machines" } }
                        @for d in &s.differences { (d) br; }
                    }
                }
            }
        }
        table {
            tr { th { "start" } th.l { "cases (in run order)" } }
            @for (start, cases) in &runs {
                tr {
                    td { @if *start == 0 { "none (not measured)" } @else { (start) } }
                    td.l { (cases.join("; ")) }
                }
            }
        }
    })
}
