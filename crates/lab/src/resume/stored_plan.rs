//! The plan a run was started with, kept beside its record in
//! `OUT/plan.json`: the lab's options as given (what `--resume DIR` alone
//! runs again), what they made (parameters, subjects, hosts), and once the
//! run knows them every case in run order. A resumed run must be the same
//! plan: options given with `--resume` that make another plan are refused,
//! with what differs named.

use serde::{Deserialize, Serialize};
use std::path::Path;

pub const FILE: &str = "plan.json";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredPlan {
    /// The lab's options as given, without `--out` and `--resume`.
    pub argv: Vec<String>,
    /// What they made: `params`, `subjects`, `hosts`.
    pub plan: serde_json::Value,
    /// Every case of the plan in run order (empty until the run knew them:
    /// between hosts the MTU is the NICs').
    #[serde(default)]
    pub cases: Vec<String>,
}

impl StoredPlan {
    pub fn load(dir: &Path) -> anyhow::Result<StoredPlan> {
        let path = dir.join(FILE);
        let text = std::fs::read_to_string(&path).map_err(|e| {
            anyhow::anyhow!("{}: {e}: not the output directory of a lab run (or one from before runs could be resumed)", path.display())
        })?;
        serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{} is damaged: {e}", path.display()))
    }

    /// Written whole or not at all.
    pub fn save(&self, dir: &Path) -> anyhow::Result<()> {
        let path = dir.join(FILE);
        let tmp = dir.join(format!("{FILE}.tmp"));
        std::fs::write(&tmp, serde_json::to_vec_pretty(self)?)?;
        std::fs::rename(&tmp, &path)?;
        Ok(())
    }

    /// What differs between this plan and `other` (empty: the same plan).
    /// The pacing parameters are not compared: a resumed run may wait
    /// for an idle machine more or less than the first did.
    pub fn differences(&self, other: &serde_json::Value) -> Vec<String> {
        let unpaced = |v: &serde_json::Value| {
            let mut v = v.clone();
            if let Some(params) = v.get_mut("params").and_then(|p| p.as_object_mut()) {
                for k in PACING_PARAMS {
                    params.remove(*k);
                }
            }
            v
        };
        let mut out = vec![];
        diff("", &unpaced(&self.plan), &unpaced(other), &mut out);
        out
    }
}

/// Options that pace a run without changing what it measures. Given with
/// `--resume DIR` they apply to the resumed run, on top of the options
/// stored there, and do not make another plan.
pub const PACING: &[&str] = &["--idle-wait"];
/// The plan's parameters the pacing options set.
const PACING_PARAMS: &[&str] = &["idle_budget_s"];

/// `argv` without the pacing options (and their values): empty when
/// `--resume DIR` was given nothing that could make another plan.
pub fn plan_options(argv: &[String]) -> Vec<String> {
    without_options(argv, PACING)
}

/// Each leaf that differs between `a` (the stored plan) and `b` (this
/// one), as `path: A there, B here`.
fn diff(path: &str, a: &serde_json::Value, b: &serde_json::Value, out: &mut Vec<String>) {
    use serde_json::Value;
    if let (Value::Object(x), Value::Object(y)) = (a, b) {
        let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
        for k in keys {
            let p = match path {
                "" | "params" => k.clone(),
                _ => format!("{path}.{k}"),
            };
            diff(&p, x.get(k).unwrap_or(&Value::Null), y.get(k).unwrap_or(&Value::Null), out);
        }
    } else if a != b {
        out.push(format!("{path}: {} in the stored plan, {} in this one", show(a), show(b)));
    }
}

fn show(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Null => "none".into(),
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(a) if a.iter().all(|x| x.is_string() || x.is_number()) => {
            let items: Vec<String> = a.iter().map(show).collect();
            if items.is_empty() { "none".into() } else { items.join(",") }
        }
        // (a suite's settings where the other plan has none of that suite)
        serde_json::Value::Object(_) => "its settings".into(),
        other => other.to_string(),
    }
}

/// This process's lab options as given on its command line (after `lab`),
/// without `--out` and `--resume`.
pub fn argv() -> Vec<String> {
    let args: Vec<String> = std::env::args().collect();
    let Some(at) = args.iter().position(|a| a == "lab") else { return vec![] };
    without_options(&args[at + 1..], &["--out", "--resume"])
}

/// `args` without the options `names`, each with its value (`--name V`
/// or `--name=V`).
fn without_options(args: &[String], names: &[&str]) -> Vec<String> {
    let mut out = vec![];
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if names.contains(&a.as_str()) {
            it.next();
        } else if !names.iter().any(|n| a.strip_prefix(n).is_some_and(|v| v.starts_with('='))) {
            out.push(a.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_difference_is_named() {
        let stored = StoredPlan {
            argv: vec![],
            plan: serde_json::json!({"params": {"protocols": ["nvme"], "repeat": 3, "fs": {"repeat": 3}}, "subjects": ["blockwire-nvme"]}),
            cases: vec![],
        };
        assert!(stored.differences(&stored.plan.clone()).is_empty());
        let other = serde_json::json!({"params": {"protocols": ["iscsi", "nvme"], "repeat": 3, "fs": {"repeat": 2}}, "subjects": ["blockwire-iscsi", "blockwire-nvme"]});
        let mut paced = stored.plan.clone();
        paced["params"]["idle_budget_s"] = serde_json::json!(0.0);
        assert!(stored.differences(&paced).is_empty(), "the idle wait is pacing, not the plan");
        assert_eq!(
            stored.differences(&other),
            [
                "fs.repeat: 3 in the stored plan, 2 in this one",
                "protocols: nvme in the stored plan, iscsi,nvme in this one",
                "subjects: blockwire-nvme in the stored plan, blockwire-iscsi,blockwire-nvme in this one",
            ]
        );
    }

    #[test]
    fn pacing_options_are_not_plan_options() {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(plan_options(&v(&["--idle-wait", "0"])).is_empty());
        assert!(plan_options(&v(&["--idle-wait=5"])).is_empty());
        assert_eq!(plan_options(&v(&["--idle-wait", "0", "--quick"])), v(&["--quick"]));
    }
}
