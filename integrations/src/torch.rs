//! libtorch (tch 0.24, torch 2.11.0) through the C++ shim in `csrc/`: the CPU tensor hook (every
//! tensor storage allocation and free, counted in [`memsight::devices::tensors`]), the accelerator's
//! caching-allocator statistics as a [`DeviceSource`], the CUDA OOM observer, and what tch lacks
//! (autocast with a dtype on CPU and CUDA, backward with explicit grad outputs, empty cache).

use crate::alloc_conf;
use memsight::collect::SourceStatus;
use memsight::devices::{self, DeviceOom, DeviceSample, DeviceSource};
use std::ffi::c_char;
use std::sync::OnceLock;
use tch::{Device, Kind, Tensor};

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Stat {
    current: i64,
    peak: i64,
    allocated: i64,
    freed: i64,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RawDeviceStats {
    allocated_bytes: Stat,
    reserved_bytes: Stat,
    active_bytes: Stat,
    inactive_split_bytes: Stat,
    requested_bytes: Stat,
    num_alloc_retries: i64,
    num_ooms: i64,
    num_device_alloc: i64,
    num_device_free: i64,
    free_bytes: u64,
    total_bytes: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct AutocastState {
    enabled: i32,
    dtype: i32,
}

#[cfg(memsight_cuda)]
#[repr(C)]
struct OomInfo {
    device: i64,
    requested_bytes: u64,
    total_bytes: u64,
    free_bytes: u64,
    reserved_bytes: u64,
    stats_allocated_bytes: u64,
    inactive_split_bytes: u64,
    largest_free_block_bytes: u64,
    has_stats: i32,
    has_snapshot: i32,
}

extern "C" {
    fn ms_last_error(buf: *mut c_char, len: usize) -> usize;
    fn ms_install_cpu_allocator(on_alloc: extern "C" fn(u64), on_free: extern "C" fn(u64)) -> i32;
    fn ms_accelerator(device_type: *mut i32, device_count: *mut i32) -> i32;
    fn ms_accel_init(device: i8) -> i32;
    fn ms_accel_stats(device: i8, out: *mut RawDeviceStats) -> i32;
    fn ms_accel_reset_peak(device: i8) -> i32;
    fn ms_accel_empty_cache() -> i32;
    fn ms_autocast_enter(device_type: i32, dtype: i32, prev: *mut AutocastState) -> i32;
    fn ms_autocast_exit(device_type: i32, prev: *const AutocastState) -> i32;
    fn ms_autocast_query(device_type: i32, dtype: *mut i32) -> i32;
    fn ms_backward(
        outputs: *const *mut torch_sys::C_tensor,
        grads: *const *mut torch_sys::C_tensor,
        n: usize,
        keep_graph: i32,
    ) -> i32;
}

#[cfg(memsight_cuda)]
extern "C" {
    fn ms_cuda_attach(cb: extern "C" fn(*const OomInfo)) -> i32;
    fn ms_cuda_segment_map(device: i64, out: *mut RawSegmentMap, max: usize) -> i64;
}

/// Cells per segment in the segment map (the shim's kCells).
const SEGMENT_CELLS: usize = 32;
/// Segments kept per sample (the largest).
const MAX_SEGMENTS: usize = 48;

#[repr(C)]
#[derive(Clone, Copy)]
struct RawSegmentMap {
    bytes: u64,
    allocated_bytes: u64,
    cells: [u8; SEGMENT_CELLS],
}

/// c10::DeviceType::CUDA.
const CUDA_DEVICE_TYPE: i32 = 1;
/// c10::DeviceType::CPU.
const CPU_DEVICE_TYPE: i32 = 0;

/// A libtorch call that failed, with libtorch's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TorchError(pub String);

impl std::fmt::Display for TorchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TorchError {}

fn last_error() -> String {
    let mut buf = vec![0u8; 1024];
    // SAFETY: the buffer is writable for its length; the shim NUL-terminates within it.
    let n = unsafe { ms_last_error(buf.as_mut_ptr().cast(), buf.len()) };
    buf.truncate(n.min(buf.len() - 1));
    String::from_utf8_lossy(&buf).into_owned()
}

fn check(rc: i32) -> Result<(), TorchError> {
    if rc < 0 {
        Err(TorchError(last_error()))
    } else {
        Ok(())
    }
}

extern "C" fn on_tensor_alloc(bytes: u64) {
    devices::tensors::tensor_alloc(bytes);
}

extern "C" fn on_tensor_free(bytes: u64) {
    devices::tensors::tensor_free(bytes);
}

static CPU_HOOK: OnceLock<Result<(), String>> = OnceLock::new();

/// Installs the CPU tensor hook (once; later calls return the first result). Install it before
/// creating tensors: tensors made earlier keep libtorch's default deleter and are not counted.
pub fn install_cpu_hook() -> Result<(), String> {
    CPU_HOOK
        .get_or_init(|| {
            // SAFETY: the callbacks only touch atomics and live for the whole program.
            let rc = unsafe { ms_install_cpu_allocator(on_tensor_alloc, on_tensor_free) };
            check(rc).map_err(|e| e.0)?;
            devices::tensors::enable();
            Ok(())
        })
        .clone()
}

/// The visible accelerator: (c10 device type, device count), or `None` without one.
fn accelerator() -> Option<(i32, i32)> {
    let (mut ty, mut n) = (0, 0);
    // SAFETY: plain out-parameters.
    let rc = unsafe { ms_accelerator(&mut ty, &mut n) };
    (rc == 1).then_some((ty, n))
}

/// Number of CUDA devices libtorch sees (0 without a driver or device).
pub fn cuda_device_count() -> usize {
    match accelerator() {
        Some((CUDA_DEVICE_TYPE, n)) => n.max(0) as usize,
        _ => 0,
    }
}

/// One device's caching-allocator statistics, as memsight's device sample (`None` without that
/// device, or before its CUDA context exists — libtorch throws "did you call init?" then).
pub fn device_stats(index: usize) -> Option<DeviceSample> {
    let mut raw = RawDeviceStats::default();
    // SAFETY: `raw` is a repr(C) mirror of the shim's struct.
    let rc = unsafe { ms_accel_stats(index as i8, &mut raw) };
    if rc != 0 {
        return None;
    }
    let u = |v: i64| Some(v.max(0) as u64);
    Some(DeviceSample {
        index: index as u32,
        backend: "libtorch-cuda".into(),
        name: None,
        total_bytes: Some(raw.total_bytes),
        free_bytes: Some(raw.free_bytes),
        used_bytes: None,
        allocated_bytes: u(raw.allocated_bytes.current),
        reserved_bytes: u(raw.reserved_bytes.current),
        active_bytes: u(raw.active_bytes.current),
        inactive_split_bytes: u(raw.inactive_split_bytes.current),
        requested_bytes: u(raw.requested_bytes.current),
        peak_allocated_bytes: u(raw.allocated_bytes.peak),
        peak_reserved_bytes: u(raw.reserved_bytes.peak),
        alloc_retries: u(raw.num_alloc_retries),
        ooms: u(raw.num_ooms),
        utilization_pct: None,
        processes: Vec::new(),
        segments: Vec::new(),
    })
}

/// Initialises CUDA on `device` so its statistics can be read (creates the CUDA context), and
/// attaches the OOM observer, which can only attach once CUDA is initialised.
pub fn init_device(index: usize) -> Result<(), TorchError> {
    // SAFETY: no pointers.
    check(unsafe { ms_accel_init(index as i8) })?;
    attach_oom_observer();
    Ok(())
}

/// Attaches the CUDA OOM observer once the caching allocator exists (after CUDA's lazy
/// initialisation: its per-device allocators hold the observers, and before they exist an
/// attached observer is dropped). Called by `init_device` and by the sampler at its first read of
/// device statistics; attaches once.
fn attach_oom_observer() {
    #[cfg(memsight_cuda)]
    {
        static ATTACHED: std::sync::Once = std::sync::Once::new();
        ATTACHED.call_once(|| {
            // SAFETY: the callback lives for the whole program and never unwinds.
            if let Err(e) = check(unsafe { ms_cuda_attach(on_cuda_oom) }) {
                eprintln!("memsight: CUDA OOM observer not attached: {e}");
            }
        });
    }
}

/// Restarts the allocator's peak statistics of `device` at their current values.
pub fn reset_peak(index: usize) -> Result<(), TorchError> {
    // SAFETY: no pointers.
    check(unsafe { ms_accel_reset_peak(index as i8) })
}

/// Returns the CUDA caching allocator's unused cached blocks to the driver (torch.cuda.empty_cache);
/// false when there is no accelerator.
pub fn empty_cache() -> Result<bool, TorchError> {
    // SAFETY: no pointers.
    let rc = unsafe { ms_accel_empty_cache() };
    check(rc)?;
    Ok(rc == 0)
}

/// The largest segments of `device` for the segment map (empty where the CUDA part is compiled
/// out or the snapshot fails).
pub fn segment_map(device: usize) -> Vec<memsight::devices::SegmentMap> {
    #[cfg(memsight_cuda)]
    {
        let mut raw = vec![
            RawSegmentMap {
                bytes: 0,
                allocated_bytes: 0,
                cells: [0; SEGMENT_CELLS],
            };
            MAX_SEGMENTS
        ];
        // SAFETY: `raw` has room for MAX_SEGMENTS repr(C) entries.
        let n = unsafe { ms_cuda_segment_map(device as i64, raw.as_mut_ptr(), raw.len()) };
        raw.truncate(n.max(0) as usize);
        raw.into_iter()
            .map(|r| memsight::devices::SegmentMap {
                bytes: r.bytes,
                allocated_bytes: r.allocated_bytes,
                cells: r.cells.to_vec(),
            })
            .collect()
    }
    #[cfg(not(memsight_cuda))]
    {
        let _ = (device, SEGMENT_CELLS, MAX_SEGMENTS);
        Vec::new()
    }
}

/// True where the CUDA part (OOM observer, segment snapshot) was compiled in.
pub const CUDA_COMPILED: bool = cfg!(memsight_cuda);

fn device_type(device: Device) -> i32 {
    match device {
        Device::Cuda(_) => CUDA_DEVICE_TYPE,
        _ => CPU_DEVICE_TYPE,
    }
}

/// Runs `f` under autocast on `device`'s type with `dtype` (bf16 on CPU or CUDA; f16 on CUDA):
/// matmuls and linear layers run in `dtype`; LayerNorm, softmax and losses stay fp32 (autocast's
/// own op lists). Nestable; the previous state is restored, also when `f` panics.
pub fn autocast<T>(device: Device, dtype: Kind, f: impl FnOnce() -> T) -> Result<T, TorchError> {
    let ty = device_type(device);
    // c10::ScalarType codes of the dtypes autocast supports.
    let code = match dtype {
        Kind::Half => 5,
        Kind::Float => 6,
        Kind::BFloat16 => 15,
        other => {
            return Err(TorchError(format!(
                "autocast supports Half, BFloat16 and Float, not {other:?}"
            )))
        }
    };
    let mut prev = AutocastState::default();
    // SAFETY: `prev` is a repr(C) out-parameter.
    check(unsafe { ms_autocast_enter(ty, code, &mut prev) })?;
    struct Restore(i32, AutocastState);
    impl Drop for Restore {
        fn drop(&mut self) {
            // SAFETY: restores the state saved above.
            unsafe { ms_autocast_exit(self.0, &self.1) };
        }
    }
    let _restore = Restore(ty, prev);
    Ok(f())
}

/// Whether autocast is on for `device`'s type, with its dtype code.
pub fn autocast_enabled(device: Device) -> bool {
    let mut dtype = 0;
    // SAFETY: plain out-parameter.
    unsafe { ms_autocast_query(device_type(device), &mut dtype) == 1 }
}

/// `torch::autograd::backward(outputs, grads)`: accumulates d(Σ outputs·grads)/d(leaf) into every
/// leaf's `.grad` — what a per-block activation checkpoint needs to continue the backward pass.
pub fn backward(outputs: &[&Tensor], grads: &[&Tensor]) -> Result<(), TorchError> {
    if outputs.len() != grads.len() {
        return Err(TorchError(format!(
            "backward: {} outputs but {} grad outputs",
            outputs.len(),
            grads.len()
        )));
    }
    let outs: Vec<*mut torch_sys::C_tensor> =
        outputs.iter().map(|t| t.as_ptr().cast_mut()).collect();
    let gs: Vec<*mut torch_sys::C_tensor> = grads.iter().map(|t| t.as_ptr().cast_mut()).collect();
    // SAFETY: both arrays hold `n` live tensor pointers borrowed for the call.
    check(unsafe { ms_backward(outs.as_ptr(), gs.as_ptr(), outs.len(), 0) })
}

/// The libtorch CUDA caching allocator as a memsight device source.
struct CudaSource {
    devices: usize,
    note: String,
    ticks: u64,
}

/// The segment map is taken every this many samples (it walks the allocator's snapshot).
const SEGMENT_MAP_EVERY: u64 = 10;

impl DeviceSource for CudaSource {
    fn name(&self) -> &str {
        "libtorch-cuda"
    }

    fn status(&self) -> SourceStatus {
        SourceStatus {
            name: "libtorch-cuda".into(),
            available: true,
            detail: self.note.clone(),
        }
    }

    fn sample(&mut self, out: &mut Vec<DeviceSample>) {
        let with_segments = self.ticks.is_multiple_of(SEGMENT_MAP_EVERY);
        self.ticks += 1;
        // Devices whose CUDA context does not exist yet are skipped (reading would throw).
        out.extend((0..self.devices).filter_map(|i| {
            let mut s = device_stats(i)?;
            attach_oom_observer();
            if with_segments {
                s.segments = segment_map(i);
            }
            Some(s)
        }));
    }
}

#[cfg(memsight_cuda)]
extern "C" fn on_cuda_oom(info: *const OomInfo) {
    // SAFETY: the shim passes a pointer to a live struct for the duration of the call.
    let Some(i) = (unsafe { info.as_ref() }) else {
        return;
    };
    let device = i.device.max(0) as u32;
    let oom = DeviceOom {
        device,
        requested_bytes: i.requested_bytes,
        total_bytes: i.total_bytes,
        free_bytes: i.free_bytes,
        allocated_bytes: (i.has_stats != 0).then_some(i.stats_allocated_bytes),
        reserved_bytes: (i.has_stats != 0).then_some(i.reserved_bytes),
        inactive_split_bytes: (i.has_stats != 0).then_some(i.inactive_split_bytes),
        largest_free_block_bytes: (i.has_snapshot != 0).then_some(i.largest_free_block_bytes),
        processes: other_processes(device),
        ..Default::default()
    };
    // The observer must not unwind into C++.
    let _ = std::panic::catch_unwind(|| devices::record_oom(oom));
}

#[cfg(all(memsight_cuda, feature = "nvml"))]
fn other_processes(device: u32) -> Vec<memsight::devices::DeviceProcess> {
    crate::nvml::processes(device)
}

#[cfg(all(memsight_cuda, not(feature = "nvml")))]
fn other_processes(_device: u32) -> Vec<memsight::devices::DeviceProcess> {
    Vec::new()
}

static INSTALLED: OnceLock<Vec<SourceStatus>> = OnceLock::new();

/// Installs the CPU tensor hook, registers the CUDA allocator as a device source and attaches the
/// OOM observer — each, where it cannot work, registered absent with the reason. Once.
pub fn install() -> Vec<SourceStatus> {
    INSTALLED.get_or_init(install_once).clone()
}

fn install_once() -> Vec<SourceStatus> {
    let mut out = Vec::new();
    out.push(match install_cpu_hook() {
        Ok(()) => {
            let s = SourceStatus {
                name: "libtorch-cpu".into(),
                available: true,
                detail: "c10::SetCPUAllocator hook: every CPU tensor storage allocation and free"
                    .into(),
            };
            devices::note_source(s.clone());
            s
        }
        Err(e) => crate::absent("libtorch-cpu", &format!("SetCPUAllocator failed: {e}")),
    });
    let conf = match alloc_conf::read() {
        Some((var, v)) => format!("{var}={v}"),
        None => "allocator config: defaults (no PYTORCH_ALLOC_CONF)".into(),
    };
    match accelerator() {
        Some((CUDA_DEVICE_TYPE, n)) if n > 0 => {
            let note = format!(
                "{n} CUDA device(s); {conf}; OOM observer {}",
                if CUDA_COMPILED {
                    "attached once CUDA starts"
                } else {
                    "compiled out (no CUDA headers at build time)"
                }
            );
            devices::register(Box::new(CudaSource {
                devices: n as usize,
                note: note.clone(),
                ticks: 0,
            }));
            out.push(SourceStatus {
                name: "libtorch-cuda".into(),
                available: true,
                detail: note,
            });
        }
        Some((CUDA_DEVICE_TYPE, _)) => out.push(crate::absent(
            "libtorch-cuda",
            "libtorch has CUDA but sees no device (no driver, or CUDA_VISIBLE_DEVICES hides them)",
        )),
        Some((ty, _)) => out.push(crate::absent(
            "libtorch-cuda",
            &format!("the accelerator is not CUDA (c10 device type {ty})"),
        )),
        None => out.push(crate::absent(
            "libtorch-cuda",
            if tch::utils::has_cuda() {
                "libtorch has CUDA but sees no device (no driver, or CUDA_VISIBLE_DEVICES hides them)"
            } else {
                "this libtorch has no CUDA support (CPU-only build, or libtorch_cuda not linked)"
            },
        )),
    }
    out
}
