//! One process measured by `memsight run` (the sidecar): memsight-gpt and the PyTorch peer alike
//! run under it, so both are read by the same instrument — process heap (memsight-gpt's own
//! allocator; the preloaded library's exact count of glibc's malloc in Python), RSS, per-phase
//! peaks from the report's phases and timeline — each over its own baseline, the heap and RSS the
//! job recorded from the session's snapshot when training started.

use super::variants::Variant;
use super::Options;
use memsight::Report;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A phase's peaks.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PhasePeak {
    /// Highest live process heap inside the phase (exact).
    pub heap_bytes: Option<u64>,
    /// Highest live tensor bytes inside the phase (libtorch CPU hook; none for the peer on a CPU:
    /// PyTorch exposes no exact count of CPU tensor bytes).
    pub tensor_bytes: Option<u64>,
    /// Highest RSS sampled inside the phase.
    pub rss_bytes: Option<u64>,
}

/// One process's measurement.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Measured {
    /// Live process heap when training started (the session's snapshot, read by the job).
    pub baseline_heap_bytes: Option<u64>,
    /// RSS at the same moment.
    pub baseline_rss_bytes: Option<u64>,
    /// Peak live process heap over the run.
    pub heap_peak_bytes: u64,
    /// Peak RSS (the kernel's high-water mark).
    pub rss_peak_bytes: Option<u64>,
    /// RSS at the last sample (after the final cleanup, where a cleanup switch is on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_end_bytes: Option<u64>,
    /// Peak live CPU tensor bytes (libtorch hook).
    pub tensor_peak_bytes: Option<u64>,
    /// Peak device reserved bytes (CUDA runs).
    pub device_peak_bytes: Option<u64>,
    /// Peak device allocated bytes: the caching allocator's exact peak of live tensor bytes
    /// (CUDA runs; the peer's through `memsight.torch`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_allocated_peak_bytes: Option<u64>,
    /// The training steps' peaks (phase `train`).
    #[serde(default)]
    pub train: PhasePeak,
    /// The evaluation's peaks (phase `eval`).
    #[serde(default)]
    pub eval: PhasePeak,
    /// Median step time.
    pub step_ms: f64,
    /// Final training loss.
    pub final_loss: f64,
    /// Last validation loss.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_loss: Option<f64>,
}

impl Measured {
    /// The measured tensor peak the estimate is compared with: the device allocator's peak on a
    /// GPU, the libtorch CPU hook's on the CPU.
    pub fn measured_peak_bytes(&self) -> Option<u64> {
        self.device_allocated_peak_bytes.or(self.tensor_peak_bytes)
    }

    /// The training tensor peak: the device allocator's job-wide peak on a GPU (its phases carry
    /// no device peaks), the libtorch hook's peak in phase `train` on the CPU.
    pub fn train_peak(&self) -> Option<u64> {
        self.device_allocated_peak_bytes.or(self.train.tensor_bytes)
    }

    /// The evaluation's tensor peak (CPU runs only).
    pub fn eval_peak(&self) -> Option<u64> {
        match self.device_allocated_peak_bytes {
            Some(_) => None,
            None => self.eval.tensor_bytes,
        }
    }

    /// What a phase added to the process heap over the baseline.
    pub fn heap_increment(&self, phase: &PhasePeak) -> Option<u64> {
        Some(phase.heap_bytes?.saturating_sub(self.baseline_heap_bytes?))
    }

    /// What the run added to RSS over the baseline (the high-water mark's increment).
    pub fn rss_increment(&self) -> Option<u64> {
        Some(
            self.rss_peak_bytes?
                .saturating_sub(self.baseline_rss_bytes?),
        )
    }
}

/// What a job writes with `--summary-json` (memsight-gpt) or `--json` (the peer).
#[derive(Deserialize)]
struct Summary {
    final_loss: f64,
    step_ms_median: f64,
    #[serde(default)]
    val_loss: Option<f64>,
    #[serde(default)]
    baseline_heap_bytes: Option<u64>,
    #[serde(default)]
    baseline_rss_bytes: Option<u64>,
}

/// A phase's peaks from a report: the phase's own statistics, and the highest RSS of the samples
/// taken inside it or a phase nested in it.
pub fn phase_peak(r: &Report, name: &str) -> PhasePeak {
    let stats = r.phases.iter().find(|p| p.path == name);
    let nested = format!("{name}/");
    let rss = r
        .timeline
        .iter()
        .filter(|s| {
            s.phase
                .as_deref()
                .is_some_and(|p| p == name || p.starts_with(&nested))
        })
        .filter_map(|s| s.process.as_ref().map(|p| p.rss))
        .max();
    PhasePeak {
        heap_bytes: stats.map(|p| p.peak_bytes),
        tensor_bytes: stats.and_then(|p| p.tensor_peak_bytes),
        rss_bytes: rss,
    }
}

/// A job to run under `memsight run`.
pub struct Job {
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Its environment additions.
    pub env: Vec<(String, String)>,
}

/// `memsight run` for `job`, writing its report to `report`: sampling every 20 ms (short phases
/// get samples), heap sampling off (the peer has no allocation sites; the step times compare).
/// The job's own environment (allocator settings) goes through `env`, a launcher `run` sees
/// through, so that it reaches the job and not the sidecar.
pub fn under_memsight(o: &Options, job: &Job, report: &Path) -> Command {
    let mut cmd = Command::new(&o.memsight);
    cmd.args(["run", "--interval", "20ms", "--no-heap-profile", "--report"])
        .arg(report)
        .arg("--");
    if !job.env.is_empty() {
        cmd.arg("env")
            .args(job.env.iter().map(|(k, v)| format!("{k}={v}")));
    }
    cmd.arg(&job.program)
        .args(&job.args)
        .env("MEMSIGHT_RING", "off")
        .env("MEMSIGHT_QUIET", "1");
    cmd
}

/// Runs `cmd` to its end or for at most `limit`, its output into `log`; Ok(true) when it exited
/// with success, Ok(false) when it failed or was killed at the limit.
pub fn run_bounded(
    mut cmd: Command,
    log: &Path,
    limit: std::time::Duration,
) -> Result<bool, String> {
    let file = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = file.try_clone().map_err(|e| e.to_string())?;
    let mut child = cmd
        .stdout(file)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("{:?}: {e}", cmd.get_program()))?;
    let start = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            return Ok(status.success());
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            eprintln!("killed after {} s", limit.as_secs());
            return Ok(false);
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// The last lines of a run's log (for a failure's message).
pub fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join("\n")
}

/// Runs `job` under memsight (a second time if the first run fails: the failure is printed) and
/// reads its report and summary.
pub fn run_measured(o: &Options, job: &Job, files: &str, what: &str) -> Result<Measured, String> {
    let report = o.out.join(format!("{files}.report.json"));
    let summary = o.out.join(format!("{files}.summary.json"));
    let log = o.out.join(format!("{files}.log"));
    let mut last = String::new();
    for attempt in 0..2 {
        let ok = run_bounded(under_memsight(o, job, &report), &log, o.run_limit)?;
        if ok && summary.exists() {
            let m = read_measured(&report, &summary);
            remove_files(o, files);
            return m;
        }
        last = log_tail(&log);
        eprintln!("{what}: run {} failed: {last}", attempt + 1);
    }
    remove_files(o, files);
    Err(format!("{what}: {last}"))
}

fn read_measured(report: &Path, summary: &Path) -> Result<Measured, String> {
    let s: Summary = serde_json::from_slice(
        &std::fs::read(summary).map_err(|e| format!("{}: {e}", summary.display()))?,
    )
    .map_err(|e| format!("{}: {e}", summary.display()))?;
    let r = Report::load(report).map_err(|e| e.to_string())?;
    Ok(Measured {
        baseline_heap_bytes: s.baseline_heap_bytes,
        baseline_rss_bytes: s.baseline_rss_bytes,
        heap_peak_bytes: r.peaks.heap_peak_bytes,
        rss_peak_bytes: r.peaks.rss_peak_bytes,
        rss_end_bytes: r
            .timeline
            .iter()
            .rev()
            .find_map(|s| s.process.as_ref().map(|p| p.rss)),
        tensor_peak_bytes: r.peaks.tensor_peak_bytes,
        device_peak_bytes: r.devices.iter().filter_map(|d| d.footprint()).max(),
        device_allocated_peak_bytes: r
            .devices
            .iter()
            .filter_map(|d| d.peak_allocated_bytes)
            .max(),
        train: phase_peak(&r, "train"),
        eval: phase_peak(&r, "eval"),
        step_ms: s.step_ms_median,
        final_loss: s.final_loss,
        val_loss: s.val_loss,
    })
}

/// Removes a run's report, summary and heap-profile files (the table keeps their numbers).
pub fn remove_files(o: &Options, files: &str) {
    for ext in ["report.json", "summary.json", "log"] {
        let _ = std::fs::remove_file(o.out.join(format!("{files}.{ext}")));
    }
    let _ = std::fs::remove_dir_all(o.out.join(format!("{files}.report.heap")));
}

/// memsight-gpt `train` for a variant: quiet, naive attention unless the variant says otherwise,
/// evaluation at the end only, the ablation's base flags, then the variant's.
pub fn ours(o: &Options, v: &Variant, files: &str) -> Result<Job, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let summary = o.out.join(format!("{files}.summary.json"));
    let mut args: Vec<String> = ["train", "--quiet", "--preset", &o.preset_name()]
        .into_iter()
        .map(String::from)
        .collect();
    args.extend(common_args(o));
    args.extend(["--eval-every".into(), "0".into()]);
    args.extend(o.base_args.iter().cloned());
    args.extend(v.args.iter().map(|a| a.to_string()));
    args.push("--summary-json".into());
    args.push(summary.display().to_string());
    Ok(Job {
        program: exe,
        args,
        env: v
            .env
            .iter()
            .map(|(k, val)| (k.to_string(), val.to_string()))
            .collect(),
    })
}

/// The PyTorch peer (peer/gpt.py) for a variant, with the same flags and the peer's environment.
pub fn peer(o: &Options, python: &Path, v: &Variant, files: &str) -> Job {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("peer/gpt.py");
    let summary = o.out.join(format!("{files}.summary.json"));
    let mut args = vec![
        script.display().to_string(),
        "--quiet".into(),
        "--preset".into(),
        o.preset_name(),
    ];
    args.extend(common_args(o));
    args.extend(o.base_args.iter().cloned());
    args.extend(v.args.iter().map(|a| a.to_string()));
    args.push("--json".into());
    args.push(summary.display().to_string());
    Job {
        program: python.to_path_buf(),
        args,
        env: v
            .peer_env
            .iter()
            .map(|(k, val)| (k.to_string(), val.to_string()))
            .collect(),
    }
}

fn common_args(o: &Options) -> Vec<String> {
    [
        "--device",
        &o.device,
        "--steps",
        &o.steps.to_string(),
        "--attention",
        "naive",
    ]
    .into_iter()
    .map(String::from)
    .collect()
}
