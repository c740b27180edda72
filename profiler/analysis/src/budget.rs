//! Budgets for `memsight check`: parsed from flags and a versioned TOML file, checked against a
//! report, each violation one line with the value, the budget and where the peak happened.

use memsight_format::units::{fmt_bytes, parse_size};
use memsight_format::Report;
use serde::Deserialize;
use std::fmt;
use std::path::Path;

/// The budget file format version this build reads.
pub const BUDGET_VERSION: u32 = 1;

/// Limits a report must stay within. `None` means "not checked".
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Budgets {
    /// Peak live process heap bytes (all code: Rust, C, C++).
    pub max_host_peak: Option<u64>,
    /// Peak RSS bytes.
    pub max_rss_peak: Option<u64>,
    /// Peak PSS total of the process tree (the job and its workers): its real footprint.
    pub max_tree_pss: Option<u64>,
    /// jemalloc (resident − allocated) / resident at peak resident.
    pub max_fragmentation: Option<f64>,
    /// Live-heap growth per step (leak slope), bytes.
    pub max_leak_per_step: Option<u64>,
    /// Peak live tensor bytes (libtorch CPU tensors).
    pub max_tensor_peak: Option<u64>,
    /// Per device: peak allocator reserved, else peak driver-reported used.
    pub max_device_peak: Option<u64>,
    /// Per device: highest sampled (reserved − allocated) / reserved.
    pub max_device_fragmentation: Option<f64>,
    /// Per device: caching-allocator retries (cache flushes under pressure).
    pub max_alloc_retries: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BudgetFile {
    version: u32,
    max_host_peak: Option<String>,
    max_rss_peak: Option<String>,
    max_tree_pss: Option<String>,
    max_fragmentation: Option<f64>,
    max_leak_per_step: Option<String>,
    max_tensor_peak: Option<String>,
    max_device_peak: Option<String>,
    max_device_fragmentation: Option<f64>,
    max_alloc_retries: Option<u64>,
}

/// A budget file that cannot be used.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetError(pub String);

impl fmt::Display for BudgetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BudgetError {}

impl Budgets {
    /// Reads a budget file (TOML, `version = 1`): a regular file of at most
    /// [`memsight_format::input::MAX_BUDGET_BYTES`].
    pub fn load(path: &Path) -> Result<Budgets, BudgetError> {
        use memsight_format::input;
        let text = input::read_to_string(path, input::MAX_BUDGET_BYTES)
            .map_err(|e| BudgetError(format!("{}: {e}", path.display())))?;
        Self::parse(&text).map_err(|e| BudgetError(format!("{}: {}", path.display(), e.0)))
    }

    /// Parses budget TOML text.
    pub fn parse(text: &str) -> Result<Budgets, BudgetError> {
        let f: BudgetFile =
            toml::from_str(text).map_err(|e| BudgetError(e.message().to_string()))?;
        if f.version != BUDGET_VERSION {
            return Err(BudgetError(format!(
                "budget file version {} is not supported (this memsight reads version {BUDGET_VERSION})",
                f.version
            )));
        }
        let size = |field: &str, v: Option<String>| -> Result<Option<u64>, BudgetError> {
            v.map(|s| parse_size(&s).map_err(|e| BudgetError(format!("{field}: {e}"))))
                .transpose()
        };
        let b = Budgets {
            max_host_peak: size("max_host_peak", f.max_host_peak)?,
            max_rss_peak: size("max_rss_peak", f.max_rss_peak)?,
            max_tree_pss: size("max_tree_pss", f.max_tree_pss)?,
            max_fragmentation: f.max_fragmentation,
            max_leak_per_step: size("max_leak_per_step", f.max_leak_per_step)?,
            max_tensor_peak: size("max_tensor_peak", f.max_tensor_peak)?,
            max_device_peak: size("max_device_peak", f.max_device_peak)?,
            max_device_fragmentation: f.max_device_fragmentation,
            max_alloc_retries: f.max_alloc_retries,
        };
        b.validate()?;
        Ok(b)
    }

    /// Checks ranges that a size parser cannot (fragmentation is a ratio in [0, 1]).
    pub fn validate(&self) -> Result<(), BudgetError> {
        for (name, v) in [
            ("max_fragmentation", self.max_fragmentation),
            ("max_device_fragmentation", self.max_device_fragmentation),
        ] {
            match v {
                Some(r) if !(0.0..=1.0).contains(&r) => {
                    return Err(BudgetError(format!(
                        "{name} must be a ratio between 0 and 1, got {r}"
                    )))
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Overrides every budget that `other` sets (flags over file).
    pub fn merge(self, other: Budgets) -> Budgets {
        Budgets {
            max_host_peak: other.max_host_peak.or(self.max_host_peak),
            max_rss_peak: other.max_rss_peak.or(self.max_rss_peak),
            max_tree_pss: other.max_tree_pss.or(self.max_tree_pss),
            max_fragmentation: other.max_fragmentation.or(self.max_fragmentation),
            max_leak_per_step: other.max_leak_per_step.or(self.max_leak_per_step),
            max_tensor_peak: other.max_tensor_peak.or(self.max_tensor_peak),
            max_device_peak: other.max_device_peak.or(self.max_device_peak),
            max_device_fragmentation: other
                .max_device_fragmentation
                .or(self.max_device_fragmentation),
            max_alloc_retries: other.max_alloc_retries.or(self.max_alloc_retries),
        }
    }

    /// True when no budget is set.
    pub fn is_empty(&self) -> bool {
        *self == Budgets::default()
    }

    /// Every budget the report breaks (or cannot show it keeps), one line each.
    pub fn check(&self, r: &Report) -> Vec<String> {
        let mut out = Vec::new();
        let p = &r.peaks;
        if let Some(max) = self.max_host_peak {
            if !r.heap_measured() {
                out.push(format!(
                    "host peak: {} (budget {})",
                    Report::HEAP_NOT_MEASURED,
                    fmt_bytes(max)
                ));
            } else {
                let host = r.host_peak();
                if host.bytes > max {
                    out.push(format!(
                        "host peak {}{} exceeds budget {}{}",
                        fmt_bytes(host.bytes),
                        if host.of_job {
                            " (the job's processes' heaps at one moment)"
                        } else {
                            ""
                        },
                        fmt_bytes(max),
                        if !host.of_job && r.heap_peaked_outside_marks() {
                            format!(" (peaked {})", memsight_format::report::OUTSIDE_MARKS)
                        } else {
                            location(host.step, host.phase.as_deref())
                        }
                    ));
                }
            }
        }
        if let Some(max) = self.max_rss_peak {
            // The job's: another of its processes (a program a launcher started, a rank) counts
            // where its RSS rose higher than this report's process's.
            match r.rss_peak() {
                Some(v) if v.bytes > max => {
                    let at = p.rss_peak_sample.as_ref();
                    out.push(match v.other {
                        Some((_, whose)) => format!(
                            "rss peak {} of {whose} exceeds budget {}",
                            fmt_bytes(v.bytes),
                            fmt_bytes(max)
                        ),
                        None => format!(
                            "rss peak {} exceeds budget {}{}",
                            fmt_bytes(v.bytes),
                            fmt_bytes(max),
                            location(at.map(|a| a.step), at.and_then(|a| a.phase.as_deref()))
                        ),
                    });
                }
                Some(_) => {}
                None => out.push("rss peak cannot be checked: the report has no RSS (process source unavailable)".into()),
            }
        }
        if let Some(max) = self.max_tree_pss {
            match r.process_tree.as_ref().filter(|t| t.tree.total_pss.is_some()) {
                Some(t) if t.at.bytes > max => out.push(format!(
                    "process tree PSS {} exceeds budget {} ({} processes){}",
                    fmt_bytes(t.at.bytes),
                    fmt_bytes(max),
                    t.tree.processes.len(),
                    location(Some(t.at.step), t.at.phase.as_deref())
                )),
                Some(_) => {}
                None => out.push("process tree PSS cannot be checked: the report has no PSS (smaps_rollup unreadable, or a report of an older memsight)".into()),
            }
        }
        if let Some(max) = self.max_fragmentation {
            match &r.fragmentation {
                Some(f) if f.resident_ratio > max => out.push(format!(
                    "fragmentation {:.3} exceeds budget {max:.3} ({} resident, {} allocated){}",
                    f.resident_ratio,
                    fmt_bytes(f.resident_bytes),
                    fmt_bytes(f.allocated_bytes),
                    location(Some(f.at.step), f.at.phase.as_deref())
                )),
                Some(_) => {}
                None => out.push(
                    "fragmentation cannot be checked: the report has no jemalloc statistics (only a job that links memsight's jemalloc, a Rust job, has them: leave max_fragmentation out of a Python job's budget)".into(),
                ),
            }
        }
        if let Some(max) = self.max_leak_per_step {
            match &r.leak {
                Some(l) if l.slope_bytes_per_step > max as f64 => out.push(format!(
                    "leak {}/step exceeds budget {}/step (confidence {:.0}%, over {} steps after {} warm-up steps)",
                    fmt_bytes(l.slope_bytes_per_step as u64),
                    fmt_bytes(max),
                    l.confidence * 100.0,
                    l.steps_used,
                    l.warmup_steps
                )),
                Some(_) => {}
                None => out.push(format!(
                    "leak per step cannot be checked: fewer than 5 steps after warm-up were recorded (call {} once per step)",
                    memsight_format::job_context::JobContext::of(r).step_call()
                )),
            }
        }
        self.check_tensors_and_devices(r, &mut out);
        out
    }

    fn check_tensors_and_devices(&self, r: &Report, out: &mut Vec<String>) {
        let p = &r.peaks;
        if let Some(max) = self.max_tensor_peak {
            match p.tensor_peak_bytes {
                Some(v) if v > max => {
                    out.push(format!(
                        "tensor peak {} exceeds budget {}{}",
                        fmt_bytes(v),
                        fmt_bytes(max),
                        location(p.tensor_peak_step, p.tensor_peak_phase.as_deref())
                    ));
                }
                Some(_) => {}
                None => out.push("tensor peak cannot be checked: the report has no tensor bytes (no libtorch hook was installed: a tch job's; leave max_tensor_peak out of a Python job's budget)".into()),
            }
        }
        let device_budgets = self.max_device_peak.is_some()
            || self.max_device_fragmentation.is_some()
            || self.max_alloc_retries.is_some();
        if device_budgets && r.devices.is_empty() {
            out.push("device budgets cannot be checked: the report has no device memory (no GPU backend delivered data; see its sources)".into());
            return;
        }
        for d in &r.devices {
            let who = format!("cuda:{} ({})", d.index, d.backend);
            if let (Some(max), Some(v)) = (self.max_device_peak, d.footprint()) {
                if v > max {
                    let what = if d.peak_reserved_bytes.is_some() {
                        "reserved"
                    } else {
                        "used"
                    };
                    out.push(format!(
                        "{who} peak {what} {} exceeds budget {}",
                        fmt_bytes(v),
                        fmt_bytes(max)
                    ));
                }
            }
            if let (Some(max), Some(v)) = (self.max_device_fragmentation, d.peak_fragmentation) {
                if v > max {
                    out.push(format!(
                        "{who} fragmentation {v:.3} exceeds budget {max:.3} (reserved − allocated over reserved)"
                    ));
                }
            }
            if let (Some(max), Some(v)) = (self.max_alloc_retries, d.alloc_retries) {
                if v > max {
                    out.push(format!(
                        "{who} allocator retries {v} exceed budget {max} (each one flushed the cache and synchronised)"
                    ));
                }
            }
        }
    }
}

/// Where a peak happened, for a violation line: " (peaked at step 12, phase train/backward)".
fn location(step: Option<u64>, phase: Option<&str>) -> String {
    match (step, phase) {
        (Some(s), Some(ph)) => format!(" (peaked at step {s}, phase {ph})"),
        (Some(s), None) => format!(" (peaked at step {s})"),
        (None, Some(ph)) => format!(" (peaked in phase {ph})"),
        (None, None) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_file() {
        let b = Budgets::parse("version = 1\nmax_host_peak = \"4GiB\"\nmax_fragmentation = 0.3\n")
            .unwrap();
        assert_eq!(b.max_host_peak, Some(4 << 30));
        assert_eq!(b.max_fragmentation, Some(0.3));
        assert_eq!(b.max_rss_peak, None);
    }

    #[test]
    fn rejects_bad_files_with_exact_errors() {
        let e = |t: &str| Budgets::parse(t).unwrap_err().0;
        assert_eq!(
            e("version = 2\n"),
            "budget file version 2 is not supported (this memsight reads version 1)"
        );
        assert_eq!(e("version = 1\nmax_host_peek = \"1GiB\"\n"), "unknown field `max_host_peek`, expected one of `version`, `max_host_peak`, `max_rss_peak`, `max_tree_pss`, `max_fragmentation`, `max_leak_per_step`, `max_tensor_peak`, `max_device_peak`, `max_device_fragmentation`, `max_alloc_retries`");
        assert_eq!(
            e("version = 1\nmax_host_peak = \"lots\"\n"),
            "max_host_peak: invalid size \"lots\": expected a number (examples: 512MiB, 4GiB, 100MB, 1048576)"
        );
        assert_eq!(
            e("version = 1\nmax_fragmentation = 3.0\n"),
            "max_fragmentation must be a ratio between 0 and 1, got 3"
        );
        assert_eq!(e("max_host_peak = \"1GiB\"\n"), "missing field `version`");
    }

    #[test]
    fn gates_tensor_and_device_memory() {
        use memsight_format::device::DevicePeak;
        let b = Budgets::parse(
            "version = 1\nmax_tensor_peak = \"1GiB\"\nmax_device_peak = \"70GiB\"\n\
             max_device_fragmentation = 0.3\nmax_alloc_retries = 0\n",
        )
        .unwrap();
        let mut r = Report::default();
        assert_eq!(
            b.check(&r),
            vec![
                "tensor peak cannot be checked: the report has no tensor bytes (no libtorch hook was installed: a tch job's; leave max_tensor_peak out of a Python job's budget)",
                "device budgets cannot be checked: the report has no device memory (no GPU backend delivered data; see its sources)",
            ]
        );
        r.peaks.tensor_peak_bytes = Some(3 << 30);
        r.peaks.tensor_peak_step = Some(12);
        r.peaks.tensor_peak_phase = Some("train/backward".into());
        r.devices.push(DevicePeak {
            index: 0,
            backend: "libtorch-cuda".into(),
            peak_reserved_bytes: Some(75 << 30),
            peak_allocated_bytes: Some(50 << 30),
            peak_fragmentation: Some(0.4),
            alloc_retries: Some(3),
            ..Default::default()
        });
        assert_eq!(
            b.check(&r),
            vec![
                "tensor peak 3.00 GiB exceeds budget 1.00 GiB (peaked at step 12, phase train/backward)",
                "cuda:0 (libtorch-cuda) peak reserved 75.00 GiB exceeds budget 70.00 GiB",
                "cuda:0 (libtorch-cuda) fragmentation 0.400 exceeds budget 0.300 (reserved − allocated over reserved)",
                "cuda:0 (libtorch-cuda) allocator retries 3 exceed budget 0 (each one flushed the cache and synchronised)",
            ]
        );
        assert_eq!(
            Budgets::parse("version = 1\nmax_device_fragmentation = 1.5\n")
                .unwrap_err()
                .0,
            "max_device_fragmentation must be a ratio between 0 and 1, got 1.5"
        );
    }
}
