//! The terminal summary after a run: the answer table, each
//! recommendation in detail, and the studies' findings, from the same
//! analysis as the report.

use crate::analysis::{answer_rows, recommendations};
use bw_lab_results::Results;

/// Print the answer and the recommendation in detail (the terminal summary).
pub fn print_recommendations(r: &Results) {
    let recs = recommendations(r);
    if !recs.is_empty() {
        print_answer(recs);
    }
    let fs = crate::findings::findings(r);
    if !fs.is_empty() {
        println!("\nFindings of the studies, checked (report.html has every one)");
        for line in findings_lines(&fs) {
            println!("  {line}");
        }
    }
}

/// The findings as the terminal shows them: each judged one on its line,
/// and per study one line for those this run could not judge, saying what
/// run would (the reasons, each once).
pub fn findings_lines(fs: &[crate::findings::Finding]) -> Vec<String> {
    use crate::findings::Verdict;
    let mut out = vec![];
    for (study, _) in crate::findings::STUDIES {
        let of_study: Vec<&crate::findings::Finding> = fs.iter().filter(|f| f.study == study).collect();
        for f in of_study.iter().filter(|f| f.verdict != Verdict::NotApplicable) {
            out.push(format!("[{}] {} — {}: {} ({})", f.verdict.word(), f.claim, f.compared, f.measured, f.why));
        }
        let na: Vec<&&crate::findings::Finding> = of_study.iter().filter(|f| f.verdict == Verdict::NotApplicable).collect();
        if na.is_empty() {
            continue;
        }
        let mut why: Vec<&str> = vec![];
        for f in &na {
            if !why.contains(&f.why.as_str()) {
                why.push(&f.why);
            }
        }
        out.push(format!("[not applicable] study {study}: {} more finding(s) need another run: {}", na.len(), why.join("; ")));
    }
    out
}

fn print_answer(recs: Vec<crate::analysis::Recommendation>) {
    println!("\nAnswer: what to pick, by how much (95% interval; a winner only when the whole interval is more than 5% ahead of every other subject)");
    let rows = answer_rows(&recs);
    let head = ["scenario", "workload", "fastest", "by", "least CPU/op", "by"];
    let widths: Vec<usize> =
        (0..6).map(|i| rows.iter().map(|r| r[i].chars().count()).chain([head[i].len()]).max().unwrap_or(0)).collect();
    let line = |cells: &[&str]| {
        let s: Vec<String> = cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        println!("  {}", s.join("  ").trim_end());
    };
    line(&head);
    for r in &rows {
        line(&r.iter().map(String::as_str).collect::<Vec<_>>());
    }
    for l in client_bound_lines(&recs) {
        println!("{l}");
    }
    println!("\nRecommendation in detail (throughput, latency, CPU per op)");
    for rec in recs {
        println!("  {} {}:", rec.scenario, rec.workload);
        for (what, d) in [("throughput", &rec.throughput), ("latency", &rec.latency), ("CPU/op", &rec.cpu)] {
            if let Some(d) = d {
                println!("    {what:<10} {}", d.text);
            }
        }
        if let Some(v) = rec.vs_local {
            println!("    {:<10} {v}", "vs local");
        }
        for c in &rec.client_bound {
            println!("    {:<10} {}", "client", c.text());
        }
    }
}

/// Below the answer: the comparisons a subject's client bounds, each
/// with why (empty when none).
pub fn client_bound_lines(recs: &[crate::analysis::Recommendation]) -> Vec<String> {
    let flagged: Vec<String> = recs
        .iter()
        .flat_map(|rec| rec.client_bound.iter().map(move |c| format!("  {} {}: {}", rec.scenario, rec.workload, c.text())))
        .collect();
    if flagged.is_empty() {
        return flagged;
    }
    let head = format!(
        "\nWhere the client is the bottleneck (its CPU per op over {}x its target's, on a machine whose CPUs were full), a verdict says more about the initiator than the target:",
        crate::analysis::CLIENT_BOUND_RATIO
    );
    std::iter::once(head).chain(flagged).collect()
}
