//! The post-mortem a sidecar adds to a report: how the job ended (exit code, signal, OOM kill), how
//! old its last sample was, where memory peaked, and the diagnosis of any OOM message it printed.

use crate::timeline::PeakAt;
use serde::{Deserialize, Serialize};

/// How and why the job ended.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PostMortem {
    /// `exited`, `signaled`, `oom_killed` (SIGKILL with a cgroup OOM kill) or `out_of_memory`
    /// (an OOM message in the job's output).
    pub cause: String,
    /// One line for people.
    pub description: String,
    /// When a process of the job failed before the job did, the description says so first; this
    /// is what it then says of the job's own end (the description before that process was named).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_end: Option<String>,
    /// Exit code, when it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Signal number, when killed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Milliseconds between the last sample and the job's end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sample_age_ms: Option<u64>,
    /// Step and phase of the last sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sample: Option<PeakAt>,
    /// The sampled live heap where it first came within 0.5% of its highest value, and when (the
    /// rule the report's headline follows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heap_peak: Option<PeakAt>,
    /// cgroup OOM kills during the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup_oom_kills: Option<u64>,
    /// Flight-recorder records lost (overwritten or torn) before the sidecar read them.
    pub records_dropped: u64,
    /// OOM messages the job printed, judged.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<PostMortemFinding>,
}

/// One OOM message from the job's output, with its verdict.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PostMortemFinding {
    /// Message kind (`rust_alloc_failure`, `torch_cuda_oom_new`, …).
    pub kind: String,
    /// Verdict (`capacity`, `fragmentation`, …).
    pub verdict: String,
    /// The numbers behind it.
    pub evidence: String,
    /// Remedies, best first.
    pub remedies: Vec<String>,
}
