//! A run that took more than one start (`blockwire lab --resume DIR`): each
//! start (when, which process and boot, how it ended, what differed from the
//! first), and for every case of the plan the start whose samples the
//! results hold. A case is one workload (or setting) measured on every
//! subject with all its repetitions, so a case's repetitions always come
//! from one start; the samples of a case a start did not finish are set
//! aside and the case is measured again whole.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Resumed {
    pub starts: Vec<Start>,
    /// Every case of the plan, in run order, and the start that measured it.
    pub cases: Vec<CaseOrigin>,
}

/// One start of the run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Start {
    /// 1 for the first start.
    pub n: u32,
    pub started_utc: String,
    /// `completed`, the reason it stopped (`interrupted by SIGHUP ...`), or
    /// that it ended without a word (SIGKILL, a crash, a power cut).
    pub ended: String,
    pub pid: u32,
    pub boot_id: String,
    pub hostname: String,
    /// What differed from the first start: a new boot, the kernel, the
    /// CPU, the software, a host of the run (empty for the first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub differences: Vec<String>,
    /// Cases whose samples in the results are this start's.
    pub cases_measured: u32,
    /// Cases finished in earlier starts, not run again by this one.
    pub cases_skipped: u32,
    /// Cases this start did not finish: their samples are set aside.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub set_aside: Vec<SetAside>,
}

/// A case a start began and did not finish.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SetAside {
    pub case: String,
    /// Its samples that start had taken (not in the results).
    pub samples: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CaseOrigin {
    pub case: String,
    /// The start that measured it (0: none did; the run did not finish).
    pub start: u32,
}
