//! Framework-agnostic device memory: CUPTI's driver-API callbacks on the `cuMemAlloc`/`cuMemFree`
//! family count what every library in the process (candle, cudarc, CuPy, raw driver code) holds
//! from the CUDA driver, with no wrapper in the program's code. Exact live bytes and peak per
//! device, counted in the callbacks (atomics and a fixed table: no allocation, no lock), sampled as
//! the `cupti` device backend: `reserved_bytes` is what the process holds from the driver.
//!
//! It lives in the in-process crate, not in `memsight-integrations` with the other backends, because
//! the preloaded library (`memsight run --cupti`, for programs that do not link memsight) needs it
//! too, and that library cannot depend on the integrations crate (whose workspace builds memsight
//! with jemalloc's `malloc` family). `memsight_integrations::cupti` re-exports it.
//!
//! CUPTI is loaded at run time (`libcupti.so.13`/`.12`/`libcupti.so`, or `MEMSIGHT_CUPTI_LIB`),
//! so nothing links it; the layouts below are CUPTI's stable ABI (`cupti_callbacks.h`,
//! `cupti_driver_cbid.h`, the driver's `*_params` structs), declared here because no maintained
//! crate binds CUPTI's callback API. CUPTI allows one subscriber per process: under PyTorch's or
//! Nsight's profiler this backend is absent with CUPTI's reason.

use super::{register, register_absent, DeviceSample, DeviceSource};
use crate::collect::SourceStatus;
use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;

/// Devices counted (CUDA ordinals 0..MAX_DEVICES).
pub const MAX_DEVICES: usize = 16;
/// Live allocations the table can hold; more are counted in `untracked` and not subtracted.
const SLOTS: usize = 1 << 16;

const DOMAIN_DRIVER_API: u32 = 1;
const API_EXIT: u32 = 1;
const CUDA_SUCCESS: u32 = 0;

// Driver API callback ids (cupti_driver_cbid.h; append-only across CUDA releases).
const MEM_ALLOC_V2: u32 = 243;
const MEM_ALLOC_PITCH_V2: u32 = 244;
const MEM_FREE_V2: u32 = 245;
const MEM_ALLOC_MANAGED: u32 = 371;
const MEM_CREATE: u32 = 549;
const MEM_RELEASE: u32 = 550;
const MEM_ALLOC_ASYNC: u32 = 598;
const MEM_ALLOC_ASYNC_PTSZ: u32 = 599;
const MEM_FREE_ASYNC: u32 = 600;
const MEM_FREE_ASYNC_PTSZ: u32 = 601;
const MEM_ALLOC_FROM_POOL_ASYNC: u32 = 611;
const MEM_ALLOC_FROM_POOL_ASYNC_PTSZ: u32 = 612;

const ALLOCS: [u32; 8] = [
    MEM_ALLOC_V2,
    MEM_ALLOC_PITCH_V2,
    MEM_ALLOC_MANAGED,
    MEM_CREATE,
    MEM_ALLOC_ASYNC,
    MEM_ALLOC_ASYNC_PTSZ,
    MEM_ALLOC_FROM_POOL_ASYNC,
    MEM_ALLOC_FROM_POOL_ASYNC_PTSZ,
];
const FREES: [u32; 4] = [
    MEM_FREE_V2,
    MEM_RELEASE,
    MEM_FREE_ASYNC,
    MEM_FREE_ASYNC_PTSZ,
];

/// `CUpti_CallbackData`.
#[repr(C)]
struct CallbackData {
    callback_site: u32,
    function_name: *const c_char,
    function_params: *const c_void,
    function_return_value: *mut c_void,
    symbol_name: *const c_char,
    context: *mut c_void,
    context_uid: u32,
    correlation_data: *mut u64,
    correlation_id: u32,
}

/// The first fields of the driver's `cuMemAlloc*_params` (every variant starts with the pointer's
/// address, then its size), `cuMemAllocPitch_v2_params` and `cuMemCreate_params`.
#[repr(C)]
struct AllocParams {
    dptr: *mut u64,
    bytesize: usize,
}
#[repr(C)]
struct PitchParams {
    dptr: *mut u64,
    pitch: *mut usize,
    width: usize,
    height: usize,
}
/// `cuMemFree_v2_params`, `cuMemFreeAsync_params`, `cuMemRelease_params`: the pointer or handle.
#[repr(C)]
struct FreeParams {
    dptr: u64,
}

type CallbackFunc = unsafe extern "C" fn(*mut c_void, u32, u32, *const c_void);
type Subscribe = unsafe extern "C" fn(*mut *mut c_void, CallbackFunc, *mut c_void) -> u32;
type EnableCallback = unsafe extern "C" fn(u32, *mut c_void, u32, u32) -> u32;
type GetDeviceId = unsafe extern "C" fn(*mut c_void, *mut u32) -> u32;
type GetResultString = unsafe extern "C" fn(u32, *mut *const c_char) -> u32;

/// Per-device counters, updated in the callbacks.
struct Counters {
    live: [AtomicU64; MAX_DEVICES],
    peak: [AtomicU64; MAX_DEVICES],
    allocations: [AtomicU64; MAX_DEVICES],
    frees: [AtomicU64; MAX_DEVICES],
}

/// The live table: address (or VMM handle) → (size, device). Open addressing with linear probes;
/// a removed entry becomes a tombstone that later inserts reuse and lookups step over.
struct Table {
    keys: Vec<AtomicU64>,
    sizes: Vec<AtomicU64>,
    devices: Vec<AtomicU64>,
    untracked: AtomicU64,
}

/// A slot never used: lookups stop here.
const EMPTY: u64 = 0;
/// A slot whose entry was removed.
const TOMBSTONE: u64 = u64::MAX;

struct Cupti {
    get_device_id: GetDeviceId,
    counters: Counters,
    table: Table,
}

static CUPTI: OnceLock<Cupti> = OnceLock::new();

fn slot(key: u64) -> usize {
    (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as usize % SLOTS
}

impl Table {
    fn insert(&self, key: u64, size: u64, device: usize) -> bool {
        let start = slot(key);
        for i in 0..SLOTS {
            let s = (start + i) % SLOTS;
            let k = self.keys[s].load(Relaxed);
            if (k == EMPTY || k == TOMBSTONE)
                && self.keys[s]
                    .compare_exchange(k, key, Relaxed, Relaxed)
                    .is_ok()
            {
                self.sizes[s].store(size, Relaxed);
                self.devices[s].store(device as u64, Relaxed);
                return true;
            }
        }
        self.untracked.fetch_add(1, Relaxed);
        false
    }

    /// Removes `key`; its (size, device).
    fn remove(&self, key: u64) -> Option<(u64, usize)> {
        let start = slot(key);
        for i in 0..SLOTS {
            let s = (start + i) % SLOTS;
            match self.keys[s].load(Relaxed) {
                EMPTY => return None,
                k if k == key => {
                    let found = (
                        self.sizes[s].load(Relaxed),
                        self.devices[s].load(Relaxed) as usize,
                    );
                    self.keys[s].store(TOMBSTONE, Relaxed);
                    return Some(found);
                }
                _ => {}
            }
        }
        None
    }
}

unsafe extern "C" fn on_driver_call(
    _user: *mut c_void,
    domain: u32,
    cbid: u32,
    data: *const c_void,
) {
    let (Some(c), Some(d)) = (CUPTI.get(), (data as *const CallbackData).as_ref()) else {
        return;
    };
    if domain != DOMAIN_DRIVER_API || d.callback_site != API_EXIT || d.function_params.is_null() {
        return;
    }
    let ok = (d.function_return_value as *const u32)
        .as_ref()
        .is_some_and(|&r| r == CUDA_SUCCESS);
    if !ok {
        return;
    }
    if ALLOCS.contains(&cbid) {
        let (key, size) = if cbid == MEM_ALLOC_PITCH_V2 {
            let p = &*(d.function_params as *const PitchParams);
            let pitch = p.pitch.as_ref().copied().unwrap_or(p.width);
            (
                p.dptr.as_ref().copied(),
                pitch.saturating_mul(p.height) as u64,
            )
        } else {
            let p = &*(d.function_params as *const AllocParams);
            (p.dptr.as_ref().copied(), p.bytesize as u64)
        };
        let mut dev = 0u32;
        if (c.get_device_id)(d.context, &mut dev) != 0 || dev as usize >= MAX_DEVICES {
            dev = 0;
        }
        let dev = dev as usize;
        if let Some(key) = key.filter(|&k| k != EMPTY && k != TOMBSTONE) {
            if c.table.insert(key, size, dev) {
                let live = c.counters.live[dev].fetch_add(size, Relaxed) + size;
                c.counters.peak[dev].fetch_max(live, Relaxed);
                c.counters.allocations[dev].fetch_add(1, Relaxed);
            }
        }
    } else if FREES.contains(&cbid) {
        let p = &*(d.function_params as *const FreeParams);
        if let Some((size, dev)) = c.table.remove(p.dptr) {
            c.counters.live[dev].fetch_sub(size, Relaxed);
            c.counters.frees[dev].fetch_add(1, Relaxed);
        }
    }
}

/// (live, peak, allocations, frees) that CUPTI saw on `device` since `install`.
pub fn counted(device: usize) -> Option<(u64, u64, u64, u64)> {
    let c = CUPTI.get()?;
    let k = &c.counters;
    (device < MAX_DEVICES).then(|| {
        (
            k.live[device].load(Relaxed),
            k.peak[device].load(Relaxed),
            k.allocations[device].load(Relaxed),
            k.frees[device].load(Relaxed),
        )
    })
}

/// Allocations not counted because the live table was full (their frees are not subtracted).
pub fn untracked() -> u64 {
    CUPTI.get().map_or(0, |c| c.table.untracked.load(Relaxed))
}

struct CuptiSource;

impl DeviceSource for CuptiSource {
    fn name(&self) -> &str {
        "cupti"
    }

    fn status(&self) -> SourceStatus {
        SourceStatus {
            name: "cupti".into(),
            available: true,
            detail:
                "CUPTI driver-API callbacks: every cuMemAlloc/cuMemFree-family call of the process"
                    .into(),
        }
    }

    fn sample(&mut self, out: &mut Vec<DeviceSample>) {
        for d in 0..MAX_DEVICES {
            let Some((live, peak, allocs, _)) = counted(d) else {
                return;
            };
            if allocs == 0 {
                continue;
            }
            out.push(DeviceSample {
                index: d as u32,
                backend: "cupti".into(),
                reserved_bytes: Some(live),
                peak_reserved_bytes: Some(peak),
                ..Default::default()
            });
        }
    }
}

fn open_cupti() -> Result<*mut c_void, String> {
    let names: Vec<String> = match std::env::var("MEMSIGHT_CUPTI_LIB") {
        Ok(p) => vec![p],
        Err(_) => ["libcupti.so.13", "libcupti.so.12", "libcupti.so"]
            .map(String::from)
            .to_vec(),
    };
    let names_c: Vec<CString> = names
        .iter()
        .filter_map(|n| CString::new(n.as_str()).ok())
        .collect();
    // One already loaded (libtorch_cuda of a cu12 build loads libcupti.so.12) before loading
    // another: two CUPTIs in one process would not share their one subscriber.
    for flags in [libc::RTLD_NOLOAD, 0] {
        for c in &names_c {
            // SAFETY: a NUL-terminated name; the handle is kept for the whole program.
            let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL | flags) };
            if !h.is_null() {
                return Ok(h);
            }
        }
    }
    Err(format!(
        "CUPTI not found ({}; set MEMSIGHT_CUPTI_LIB or LD_LIBRARY_PATH to the nvidia-cuda-cupti \
         package's lib folder)",
        names.join(", ")
    ))
}

fn symbol<T: Copy>(h: *mut c_void, name: &CStr) -> Result<T, String> {
    // SAFETY: `h` is a live dlopen handle and `name` NUL-terminated.
    let p = unsafe { libc::dlsym(h, name.as_ptr()) };
    if p.is_null() {
        return Err(format!("CUPTI lacks {}", name.to_string_lossy()));
    }
    // SAFETY: T is the function pointer type of that symbol (CUPTI's ABI).
    Ok(unsafe { std::mem::transmute_copy(&p) })
}

fn subscribe() -> Result<(), String> {
    let h = open_cupti()?;
    let sub: Subscribe = symbol(h, c"cuptiSubscribe")?;
    let enable: EnableCallback = symbol(h, c"cuptiEnableCallback")?;
    let result_string: GetResultString = symbol(h, c"cuptiGetResultString")?;
    let why = |rc: u32| {
        let mut s: *const c_char = std::ptr::null();
        // SAFETY: CUPTI writes a pointer to a static string.
        unsafe { result_string(rc, &mut s) };
        // SAFETY: null or a static NUL-terminated string.
        match unsafe { s.as_ref() } {
            Some(_) => unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned(),
            None => format!("CUPTI error {rc}"),
        }
    };
    let new = || Cupti {
        get_device_id: symbol(h, c"cuptiGetDeviceId").unwrap_or(no_device_id),
        counters: Counters {
            live: std::array::from_fn(|_| AtomicU64::new(0)),
            peak: std::array::from_fn(|_| AtomicU64::new(0)),
            allocations: std::array::from_fn(|_| AtomicU64::new(0)),
            frees: std::array::from_fn(|_| AtomicU64::new(0)),
        },
        table: Table {
            keys: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            sizes: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            devices: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            untracked: AtomicU64::new(0),
        },
    };
    // The table exists before the first callback can run.
    CUPTI.get_or_init(new);
    let mut handle: *mut c_void = std::ptr::null_mut();
    // SAFETY: the callback and its state live for the whole program.
    let rc = unsafe { sub(&mut handle, on_driver_call, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(format!("cuptiSubscribe: {}", why(rc)));
    }
    for cbid in ALLOCS.iter().chain(&FREES) {
        // SAFETY: a subscriber CUPTI returned; the ids are driver-API callback ids.
        let rc = unsafe { enable(1, handle, DOMAIN_DRIVER_API, *cbid) };
        if rc != 0 {
            return Err(format!("cuptiEnableCallback({cbid}): {}", why(rc)));
        }
    }
    Ok(())
}

unsafe extern "C" fn no_device_id(_ctx: *mut c_void, _dev: *mut u32) -> u32 {
    1
}

/// Subscribes to CUPTI's driver-API memory callbacks and registers the `cupti` device source, or
/// reports it absent with the reason. Allocations made before this call are not seen (install
/// before the first device allocation).
pub fn install() -> SourceStatus {
    static INSTALLED: OnceLock<SourceStatus> = OnceLock::new();
    INSTALLED.get_or_init(install_once).clone()
}

fn install_once() -> SourceStatus {
    match subscribe() {
        Ok(()) => {
            let s = CuptiSource;
            let status = s.status();
            register(Box::new(s));
            status
        }
        Err(why) => {
            register_absent("cupti", &why);
            SourceStatus {
                name: "cupti".into(),
                available: false,
                detail: why,
            }
        }
    }
}
