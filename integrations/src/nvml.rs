//! NVML (loaded at run time; absent without a driver): per device name, total/used/free memory and
//! utilization; per process the GPU memory of every compute process, with NVML's host PIDs mapped
//! to our PID namespace through `NSpid` in /proc/*/status. Loaded once and cached.

use memsight::collect::SourceStatus;
use memsight::devices::{self, DeviceProcess, DeviceSample, DeviceSource};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::Nvml;
use std::collections::HashMap;
use std::sync::OnceLock;

static NVML: OnceLock<Result<Nvml, String>> = OnceLock::new();

fn nvml() -> Result<&'static Nvml, String> {
    NVML.get_or_init(|| Nvml::init().map_err(|e| format!("NVML unavailable: {e}")))
        .as_ref()
        .map_err(Clone::clone)
}

/// Host PID → PID in our namespace, from the last `NSpid` field of every visible process.
pub fn host_pid_map() -> HashMap<u32, u32> {
    let mut map = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return map;
    };
    for e in dir.flatten() {
        let Some(local) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        if let Some(line) = status.lines().find(|l| l.starts_with("NSpid:")) {
            // NSpid lists the PID in each namespace, outermost (host) first.
            if let Some(host) = line
                .split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u32>().ok())
            {
                map.insert(host, local);
            }
        }
    }
    map
}

/// The compute processes on `device`, marking the job itself.
pub fn processes(device: u32) -> Vec<DeviceProcess> {
    let Ok(n) = nvml() else {
        return Vec::new();
    };
    let Ok(d) = n.device_by_index(device) else {
        return Vec::new();
    };
    let Ok(procs) = d.running_compute_processes() else {
        return Vec::new();
    };
    let map = host_pid_map();
    let me = std::process::id();
    procs
        .into_iter()
        .map(|p| {
            let pid = map.get(&p.pid).copied();
            DeviceProcess {
                host_pid: p.pid,
                pid,
                used_bytes: match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                },
                is_job: pid == Some(me),
            }
        })
        .collect()
}

struct NvmlSource {
    count: u32,
}

impl DeviceSource for NvmlSource {
    fn name(&self) -> &str {
        "nvml"
    }

    fn status(&self) -> SourceStatus {
        SourceStatus {
            name: "nvml".into(),
            available: true,
            detail: format!("{} device(s) through libnvidia-ml", self.count),
        }
    }

    fn sample(&mut self, out: &mut Vec<DeviceSample>) {
        let Ok(n) = nvml() else { return };
        for i in 0..self.count {
            let Ok(d) = n.device_by_index(i) else {
                continue;
            };
            let mem = d.memory_info().ok();
            out.push(DeviceSample {
                index: i,
                backend: "nvml".into(),
                name: d.name().ok(),
                total_bytes: mem.as_ref().map(|m| m.total),
                free_bytes: mem.as_ref().map(|m| m.free),
                used_bytes: mem.as_ref().map(|m| m.used),
                utilization_pct: d.utilization_rates().ok().map(|u| u.gpu),
                processes: processes(i),
                ..Default::default()
            });
        }
    }
}

/// Registers NVML as a device source, or as absent with the reason (no driver, no device).
pub fn install() -> SourceStatus {
    let count = match nvml().and_then(|n| n.device_count().map_err(|e| e.to_string())) {
        Ok(c) if c > 0 => c,
        Ok(_) => return crate::absent("nvml", "NVML loaded but reports no device"),
        Err(e) => return crate::absent("nvml", &e),
    };
    let src = NvmlSource { count };
    let status = src.status();
    devices::register(Box::new(src));
    status
}
