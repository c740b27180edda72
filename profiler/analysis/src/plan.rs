//! The per-GPU concurrency planner (seed 003's `--gpu-plan "2,2,2,2,1,1,1"`): from measured job
//! reports, how many jobs to run on each GPU. Each job needs its device peak — the caching
//! allocator's peak reserved bytes (which already hold its fragmentation), or peak allocated plus
//! the worst sampled fragmentation, or the driver's peak used — and each GPU offers its memory
//! minus the headroom (default 15%). Jobs are placed largest first on the GPU with the most room
//! left (so load spreads evenly); the plan names the job that limits each GPU.

use memsight_format::device::DevicePeak;
use memsight_format::report::Report;
use memsight_format::units::fmt_bytes;
use serde::Serialize;

/// Default share of each GPU kept free.
pub const DEFAULT_HEADROOM: f64 = 0.15;

/// One job to place.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PlanJob {
    /// Name (the report's file name or command).
    pub name: String,
    /// Device memory it needs at its peak.
    pub need_bytes: u64,
    /// How the need was derived.
    pub basis: String,
}

/// Jobs on one GPU.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GpuPlan {
    /// GPU index.
    pub gpu: usize,
    /// Indices into the plan's jobs.
    pub jobs: Vec<usize>,
    /// Bytes those jobs need together.
    pub used_bytes: u64,
    /// Usable bytes (memory minus headroom).
    pub capacity_bytes: u64,
}

/// The plan.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    /// The jobs, in input order.
    pub jobs: Vec<PlanJob>,
    /// Per GPU.
    pub gpus: Vec<GpuPlan>,
    /// `"2,2,1"`: jobs per GPU.
    pub gpu_plan: String,
}

/// Why a plan cannot be made.
#[derive(Clone, Debug, PartialEq)]
pub enum PlanError {
    /// A report has no device memory.
    NoDeviceData(String),
    /// A job needs more than one GPU offers.
    TooLarge {
        job: String,
        need: u64,
        capacity: u64,
    },
    /// All GPUs are full.
    NoRoom { job: String, need: u64 },
    /// Bad arguments.
    Invalid(String),
}

impl std::fmt::Display for PlanError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PlanError::NoDeviceData(j) => write!(
                f,
                "{j}: the report has no device memory (run the job with a GPU backend: memsight-integrations)"
            ),
            PlanError::TooLarge { job, need, capacity } => write!(
                f,
                "{job} needs {} at its peak but one GPU offers {} after headroom: it does not fit alone",
                fmt_bytes(*need),
                fmt_bytes(*capacity)
            ),
            PlanError::NoRoom { job, need } => write!(
                f,
                "no GPU has {} left for {job}: add GPUs or run fewer jobs",
                fmt_bytes(*need)
            ),
            PlanError::Invalid(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for PlanError {}

/// The device memory a job needs, from its worst device, and how it was derived: the larger of
/// what the driver counted for the job itself (NVML per process, CUDA context included) and its
/// allocator's reservation. NVML's device-wide figure counts every process on the device, so it
/// is used only when nothing describes the job alone (measured on an H100: two jobs' device-wide
/// peak was 25.1 GiB while one of them held 17.8 GiB, docs/gpu.md).
pub fn job_need(devices: &[DevicePeak]) -> Option<(u64, String)> {
    let own = devices
        .iter()
        .filter_map(|d| {
            let allocator = if let Some(r) = d.peak_reserved_bytes {
                Some((
                    r,
                    format!("cuda:{} peak reserved (includes fragmentation)", d.index),
                ))
            } else {
                d.peak_allocated_bytes.map(|a| {
                    let frag = d.peak_fragmentation.unwrap_or(0.0).clamp(0.0, 0.99);
                    let need = (a as f64 / (1.0 - frag)).ceil() as u64;
                    (
                        need,
                        format!(
                            "cuda:{} peak allocated / (1 − fragmentation {frag:.2})",
                            d.index
                        ),
                    )
                })
            };
            let driver = d.peak_job_used_bytes.map(|u| {
                (
                    u,
                    format!(
                        "cuda:{} peak used by the job (NVML: with its CUDA context)",
                        d.index
                    ),
                )
            });
            [allocator, driver]
                .into_iter()
                .flatten()
                .max_by_key(|(n, _)| *n)
        })
        .max_by_key(|(n, _)| *n);
    own.or_else(|| {
        devices
            .iter()
            .filter_map(|d| {
                d.peak_used_bytes.map(|u| {
                    (
                        u,
                        format!(
                            "cuda:{} peak used by every process (NVML; the job's own share is unknown)",
                            d.index
                        ),
                    )
                })
            })
            .max_by_key(|(n, _)| *n)
    })
}

/// A job from its report.
pub fn job_from_report(name: &str, r: &Report) -> Result<PlanJob, PlanError> {
    let (need, basis) =
        job_need(&r.devices).ok_or_else(|| PlanError::NoDeviceData(name.to_string()))?;
    Ok(PlanJob {
        name: name.to_string(),
        need_bytes: need,
        basis,
    })
}

/// The most GPUs one plan places jobs on.
pub const MAX_GPUS: usize = 65_536;

/// Places `jobs` on `gpus` GPUs of `gpu_memory` bytes, keeping `headroom` of each free.
pub fn plan(
    jobs: Vec<PlanJob>,
    gpus: usize,
    gpu_memory: u64,
    headroom: f64,
) -> Result<Plan, PlanError> {
    // The plan holds (and `--gpu-plan` lists) every GPU: a count past what one machine's launcher
    // places is a typo, and would only exhaust memory building it.
    if gpus == 0 {
        return Err(PlanError::Invalid("--gpus must be at least 1".into()));
    }
    if gpus > MAX_GPUS {
        return Err(PlanError::Invalid(format!(
            "--gpus {gpus} is more than {MAX_GPUS}: the plan lists every GPU of one machine"
        )));
    }
    if !(0.0..1.0).contains(&headroom) {
        return Err(PlanError::Invalid(format!(
            "--headroom {headroom} must be at least 0 and below 1"
        )));
    }
    let capacity = (gpu_memory as f64 * (1.0 - headroom)).floor() as u64;
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    // Largest first; ties in input order.
    order.sort_by_key(|&i| (std::cmp::Reverse(jobs[i].need_bytes), i));
    let mut plan: Vec<GpuPlan> = (0..gpus)
        .map(|g| GpuPlan {
            gpu: g,
            capacity_bytes: capacity,
            ..Default::default()
        })
        .collect();
    for i in order {
        let j = &jobs[i];
        if j.need_bytes > capacity {
            return Err(PlanError::TooLarge {
                job: j.name.clone(),
                need: j.need_bytes,
                capacity,
            });
        }
        // The GPU with the most room left that fits (lowest index on ties).
        let best = plan
            .iter_mut()
            .filter(|g| g.used_bytes.saturating_add(j.need_bytes) <= capacity)
            .max_by_key(|g| (capacity - g.used_bytes, std::cmp::Reverse(g.gpu)));
        match best {
            Some(g) => {
                g.jobs.push(i);
                g.used_bytes += j.need_bytes;
            }
            None => {
                return Err(PlanError::NoRoom {
                    job: j.name.clone(),
                    need: j.need_bytes,
                })
            }
        }
    }
    let gpu_plan = plan
        .iter()
        .map(|g| g.jobs.len().to_string())
        .collect::<Vec<_>>()
        .join(",");
    Ok(Plan {
        jobs,
        gpus: plan,
        gpu_plan,
    })
}

impl Plan {
    /// The human-readable plan: per GPU its jobs, use and what limits it.
    pub fn render(&self) -> String {
        let mut s = format!("--gpu-plan \"{}\"\n\n", self.gpu_plan);
        for g in &self.gpus {
            let names: Vec<&str> = g.jobs.iter().map(|&i| self.jobs[i].name.as_str()).collect();
            s += &format!(
                "GPU {}: {} job(s), {} of {} usable ({}){}\n",
                g.gpu,
                g.jobs.len(),
                fmt_bytes(g.used_bytes),
                fmt_bytes(g.capacity_bytes),
                if names.is_empty() {
                    "idle".to_string()
                } else {
                    names.join(", ")
                },
                match g
                    .jobs
                    .iter()
                    .max_by_key(|&&i| (self.jobs[i].need_bytes, std::cmp::Reverse(i)))
                {
                    Some(&i) => format!(
                        "; limited by {} ({}: {})",
                        self.jobs[i].name,
                        fmt_bytes(self.jobs[i].need_bytes),
                        self.jobs[i].basis
                    ),
                    None => String::new(),
                }
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn job(name: &str, gib: u64) -> PlanJob {
        PlanJob {
            name: name.into(),
            need_bytes: gib * GIB,
            basis: "test".into(),
        }
    }

    #[test]
    fn seed_003_style_plan_by_hand() {
        // 7 GPUs of 80 GiB with 15% headroom: 68 GiB usable each. Eleven 30 GiB jobs: two fit
        // per GPU (60 ≤ 68, 90 > 68); spreading puts one on each of the 7 GPUs, then the last 4
        // on GPUs 0–3 → "2,2,2,2,1,1,1".
        let jobs: Vec<PlanJob> = (0..11).map(|i| job(&format!("job{i}"), 30)).collect();
        let p = plan(jobs, 7, 80 * GIB, DEFAULT_HEADROOM).unwrap();
        assert_eq!(p.gpu_plan, "2,2,2,2,1,1,1");
        assert_eq!(p.gpus[0].capacity_bytes, (80.0 * GIB as f64 * 0.85) as u64);
        assert_eq!(p.gpus[0].used_bytes, 60 * GIB);
        // A twelfth and thirteenth fit (GPUs 4, 5), a job of 40 GiB no longer does anywhere.
        let mut more: Vec<PlanJob> = (0..13).map(|i| job(&format!("job{i}"), 30)).collect();
        more.push(job("big", 40));
        assert_eq!(
            plan(more, 7, 80 * GIB, DEFAULT_HEADROOM),
            Err(PlanError::NoRoom {
                job: "job12".into(),
                need: 30 * GIB
            })
        );
        assert!(matches!(
            plan(vec![job("huge", 70)], 1, 80 * GIB, DEFAULT_HEADROOM),
            Err(PlanError::TooLarge { .. })
        ));
    }

    #[test]
    fn need_comes_from_reserved_or_allocated_and_fragmentation() {
        let d = |reserved, allocated, frag| DevicePeak {
            peak_reserved_bytes: reserved,
            peak_allocated_bytes: allocated,
            peak_fragmentation: frag,
            ..Default::default()
        };
        assert_eq!(job_need(&[d(Some(10), Some(8), Some(0.2))]).unwrap().0, 10);
        // 75 allocated at 25% fragmentation: 100 reserved.
        assert_eq!(job_need(&[d(None, Some(75), Some(0.25))]).unwrap().0, 100);
        assert_eq!(job_need(&[]), None);
    }

    #[test]
    fn nvml_s_device_wide_figure_never_stands_for_the_job_when_its_own_is_known() {
        // Job a of the H100 run: its allocator reserved 17.08 GiB, NVML counted 17.80 GiB for
        // the process, and 25.14 GiB on the device with job b beside it.
        let mib = 1 << 20;
        let devices = [
            DevicePeak {
                backend: "nvml".into(),
                peak_used_bytes: Some(25_746 * mib),
                peak_others_bytes: 7_504 * mib,
                peak_job_used_bytes: Some(18_228 * mib),
                ..Default::default()
            },
            DevicePeak {
                backend: "libtorch-cuda".into(),
                peak_reserved_bytes: Some(17_486 * mib),
                peak_allocated_bytes: Some(17_020 * mib),
                ..Default::default()
            },
        ];
        let (need, basis) = job_need(&devices).unwrap();
        assert_eq!(need, 18_228 * mib);
        assert!(basis.contains("used by the job"), "{basis}");
        // Only the device-wide figure: used, and said to be device-wide.
        let only = [DevicePeak {
            peak_used_bytes: Some(25_746 * mib),
            ..Default::default()
        }];
        let (need, basis) = job_need(&only).unwrap();
        assert_eq!(need, 25_746 * mib);
        assert!(basis.contains("every process"), "{basis}");
    }
}
