//! The report's heap-profile section as plain data: the profiles a job wrote, the sites holding the
//! bytes at the largest profiled heap, and what grew between two step profiles. Reading and
//! symbolizing the profiles is `memsight_analysis::heapprof`; writing them is `memsight::heapprof`.

use crate::units::fmt_bytes;
use serde::{Deserialize, Serialize};

/// What made the job write a profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DumpKind {
    /// The heap reached a new peak.
    Peak,
    /// A step boundary.
    Step,
    /// Asked for (`memsight heap dump`, `memsight_analysis::heapprof::dump`).
    Request,
    /// The session finished.
    Final,
}

/// One profile the job wrote.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DumpRecord {
    /// Why it was written.
    pub kind: DumpKind,
    /// The `heap_v2` file.
    pub path: String,
    /// Milliseconds since the session started.
    pub t_ms: u64,
    /// Training step at the time.
    pub step: u64,
    /// jemalloc's allocated bytes at the time (all of the process's heap, Rust and C++).
    pub heap_bytes: u64,
}

/// Where allocations were made: the function and the line of the allocating call.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SourceSite {
    /// Function (demangled).
    pub function: String,
    /// Source file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// Source line of the allocating call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
}

/// A call site and the bytes it holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Site {
    /// Where.
    #[serde(flatten)]
    pub at: SourceSite,
    /// Estimated live bytes held by allocations made here.
    pub bytes: u64,
    /// Share of the profile's live bytes (0–1).
    pub share: f64,
}

/// A site whose live bytes grew between two profiles.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SiteGrowth {
    /// Where.
    #[serde(flatten)]
    pub at: SourceSite,
    /// Live bytes in the earlier profile.
    pub from_bytes: u64,
    /// Live bytes in the later profile.
    pub to_bytes: u64,
    /// `to_bytes - from_bytes`.
    pub grew_bytes: i64,
}

impl Site {
    /// One text row: bytes, share, label.
    pub fn row(&self) -> String {
        format!(
            "{:>10}  {:>5.1}%  {}",
            fmt_bytes(self.bytes),
            self.share * 100.0,
            self.at.label()
        )
    }
}

impl SiteGrowth {
    /// One text row: growth, label.
    pub fn row(&self) -> String {
        format!(
            "{:>11}  {}",
            format!("+{}", fmt_bytes(self.grew_bytes.max(0) as u64)),
            self.at.label()
        )
    }
}

/// Longest function name a label shows (C++ template instantiations run to kilobytes).
const LABEL_FUNCTION_CHARS: usize = 100;

impl SourceSite {
    /// `function (file:line)`, the file shortened to its last two components and the function to
    /// 100 characters.
    pub fn label(&self) -> String {
        let mut function: String = self.function.chars().take(LABEL_FUNCTION_CHARS).collect();
        if function.len() < self.function.len() {
            function.push('…');
        }
        match (&self.file, self.line) {
            (Some(file), Some(line)) => format!("{function} ({}:{line})", short_path(file)),
            (Some(file), None) => format!("{function} ({})", short_path(file)),
            _ => function,
        }
    }
}

/// The last two components of a source path (`src/model.rs`).
pub fn short_path(file: &str) -> String {
    let parts: Vec<&str> = file.rsplit('/').take(2).collect();
    parts.into_iter().rev().collect::<Vec<_>>().join("/")
}

/// Sites listed in the report.
pub const TOP_SITES: usize = 10;

/// Where the heap was at one profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProfileView {
    /// Why the profile was written.
    pub kind: DumpKind,
    /// Milliseconds since the session started.
    pub t_ms: u64,
    /// Training step.
    pub step: u64,
    /// jemalloc's allocated bytes then.
    pub heap_bytes: u64,
    /// Live bytes the sampled stacks account for (an estimate from samples).
    pub profiled_bytes: u64,
    /// The sites holding the most bytes, largest first.
    pub top_sites: Vec<Site>,
    /// The jemalloc `heap_v2` dump.
    pub heap_file: String,
    /// The same profile as gzipped pprof (`pprof -top FILE`, speedscope).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pprof_file: Option<String>,
    /// Flamegraph SVG.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flamegraph_file: Option<String>,
}

/// What grew between two step profiles.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Growth {
    /// The earlier profile's step.
    pub from_step: u64,
    /// The later profile's step.
    pub to_step: u64,
    /// The sites that grew most, largest growth first.
    pub sites: Vec<SiteGrowth>,
    /// Flamegraph SVG of the growth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flamegraph_file: Option<String>,
}

/// The report's heap-profile section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HeapProfile {
    /// Mean bytes between samples.
    pub sample_bytes: u64,
    /// At the largest profiled heap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_peak: Option<ProfileView>,
    /// Growth between the first and latest step profiles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub growth: Option<Growth>,
    /// Every profile the job left on disk.
    pub dumps: Vec<DumpRecord>,
    /// What could not be done (files that could not be symbolized, outputs not written).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl HeapProfile {
    /// The site holding the most bytes at the peak.
    pub fn top_site(&self) -> Option<&Site> {
        self.at_peak.as_ref()?.top_sites.first()
    }

    /// Text lines for summaries: the top sites and the growth.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Some(p) = &self.at_peak {
            out.push_str(&format!(
                "Heap at its largest profiled point (step {}, {} allocated, {} in sampled stacks):\n",
                p.step,
                fmt_bytes(p.heap_bytes),
                fmt_bytes(p.profiled_bytes)
            ));
            for s in &p.top_sites {
                out.push_str(&format!("  {}\n", s.row()));
            }
        }
        if let Some(g) = &self.growth {
            out.push_str(&format!(
                "Grew from step {} to step {}:\n",
                g.from_step, g.to_step
            ));
            for s in &g.sites {
                out.push_str(&format!("  {}\n", s.row()));
            }
        }
        out
    }
}
