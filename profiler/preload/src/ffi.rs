//! The C interface of the preloaded library, called by the `memsight` Python package
//! (integrations/python) through ctypes. Every function is a no-op outside the process that owns
//! the session (a forked worker), returns rather than panics on bad input, and takes strings as
//! NUL-terminated UTF-8 and structured data as JSON in the report's own types.

use crate::job::measured_here;
use memsight::collect::SourceStatus;
use memsight::devices::{self, DeviceLines, DeviceOom, DeviceSample, DeviceSource};
use std::ffi::{c_char, c_int, CStr, CString};
use std::sync::{Arc, Mutex};

/// The interface's version; the Python package refuses another.
#[no_mangle]
pub extern "C" fn memsight_abi_version() -> u32 {
    1
}

/// 1 when this process is measured (its steps and phases are recorded), else 0.
#[no_mangle]
pub extern "C" fn memsight_active() -> c_int {
    c_int::from(measured_here())
}

/// Marks the start of training step `n`.
#[no_mangle]
pub extern "C" fn memsight_step(n: u64) {
    if measured_here() {
        crate::job::marked();
        memsight::step(n);
    }
}

/// Marks the end of training (the interpreter is starting to exit): the peaks so far become the
/// report's training window and what follows is the `shutdown` phase. Returns 1 the first time,
/// else 0.
#[no_mangle]
pub extern "C" fn memsight_training_end() -> c_int {
    c_int::from(measured_here() && memsight::end_training_by("interpreter exit"))
}

/// Opens a phase named `name` inside the current one; returns the handle to close it with
/// [`memsight_phase_exit`] (null when nothing was opened).
///
/// # Safety
/// `name` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn memsight_phase_enter(name: *const c_char) -> *mut memsight::PhaseGuard {
    match text(name) {
        Some(name) if measured_here() => {
            crate::job::marked();
            Box::into_raw(Box::new(memsight::phase(&name)))
        }
        _ => std::ptr::null_mut(),
    }
}

/// Closes a phase opened by [`memsight_phase_enter`] (and those opened inside it).
///
/// # Safety
/// `guard` is null or a handle from [`memsight_phase_enter`], closed once.
#[no_mangle]
pub unsafe extern "C" fn memsight_phase_exit(guard: *mut memsight::PhaseGuard) {
    if guard.is_null() {
        return;
    }
    let guard = Box::from_raw(guard);
    if measured_here() {
        drop(guard);
    } else {
        // A forked child leaving a phase its parent opened: nothing of the parent's is closed.
        std::mem::forget(guard);
    }
}

/// The current snapshot as JSON (the report's snapshot type), to be released with
/// [`memsight_string_free`]; null outside the owning process.
#[no_mangle]
pub extern "C" fn memsight_snapshot_json() -> *mut c_char {
    if !measured_here() {
        return std::ptr::null_mut();
    }
    serde_json::to_string(&memsight::snapshot())
        .ok()
        .and_then(|s| CString::new(s).ok())
        .map_or(std::ptr::null_mut(), CString::into_raw)
}

/// Releases a string returned by this library.
///
/// # Safety
/// `s` is null or a string from this library, released once.
#[no_mangle]
pub unsafe extern "C" fn memsight_string_free(s: *mut c_char) {
    if !s.is_null() {
        drop(CString::from_raw(s));
    }
}

/// Replaces what device source `source` (`torch-cuda`, `nvml`, …) reports from now on with
/// `samples_json`, a JSON array of device samples; the session's sampler takes them at each
/// sample. Returns 0, or -1 on bad input.
///
/// # Safety
/// Both are null or NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn memsight_device_push(
    source: *const c_char,
    samples_json: *const c_char,
) -> c_int {
    let (Some(name), Some(json)) = (text(source), text(samples_json)) else {
        return -1;
    };
    let Ok(samples) = serde_json::from_str::<Vec<DeviceSample>>(&json) else {
        return -1;
    };
    if measured_here() {
        *pushed(&name).lock().unwrap_or_else(|e| e.into_inner()) = samples;
    }
    0
}

/// Records that device backend `source` gives nothing on this machine, and why.
///
/// # Safety
/// Both are null or NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn memsight_device_absent(
    source: *const c_char,
    why: *const c_char,
) -> c_int {
    let (Some(name), Some(why)) = (text(source), text(why)) else {
        return -1;
    };
    if measured_here() {
        devices::register_absent(&name, &why);
    }
    0
}

/// Records a device out-of-memory (JSON of the report's device OOM type; its time, step and
/// phase are filled in here) in the report and at once in the flight recorder.
///
/// # Safety
/// `oom_json` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn memsight_device_oom(oom_json: *const c_char) -> c_int {
    let Some(oom) = text(oom_json).and_then(|j| serde_json::from_str::<DeviceOom>(&j).ok()) else {
        return -1;
    };
    if measured_here() {
        devices::record_oom(oom);
    }
    0
}

/// Records a device's allocated memory at its peak so far by Python line (JSON of the report's
/// device-lines type; its time is filled in here), replacing the device's earlier record, in the
/// report and at once in the flight recorder. Returns 0, or -1 on bad input.
///
/// # Safety
/// `lines_json` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn memsight_device_lines(lines_json: *const c_char) -> c_int {
    let Some(lines) = text(lines_json).and_then(|j| serde_json::from_str::<DeviceLines>(&j).ok())
    else {
        return -1;
    };
    if measured_here() {
        devices::record_lines(lines);
    }
    0
}

/// Records Python's small-object arenas as CPython counts them (JSON of the report's
/// `python_arenas` type), replacing an earlier reading. Returns 0, or -1 on bad input.
///
/// # Safety
/// `arenas_json` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn memsight_python_arenas(arenas_json: *const c_char) -> c_int {
    let Some(arenas) = text(arenas_json)
        .and_then(|j| serde_json::from_str::<memsight::pymalloc::PythonArenas>(&j).ok())
    else {
        return -1;
    };
    if measured_here() {
        memsight::pymalloc::record(arenas);
    }
    0
}

/// The string at `p`, when it is one.
unsafe fn text(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    CStr::from_ptr(p).to_str().ok().map(str::to_owned)
}

type Samples = Arc<Mutex<Vec<DeviceSample>>>;

/// The pushed sources so far, by name.
static PUSHED: Mutex<Vec<(String, Samples)>> = Mutex::new(Vec::new());

/// The samples of pushed source `name`, registered with the session's sampler on first use.
fn pushed(name: &str) -> Samples {
    let mut all = PUSHED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, s)) = all.iter().find(|(n, _)| n == name) {
        return s.clone();
    }
    let samples = Samples::default();
    all.push((name.to_owned(), samples.clone()));
    devices::register(Box::new(Pushed {
        name: name.to_owned(),
        samples: samples.clone(),
    }));
    samples
}

/// A device source whose samples come from the job (the Python package polling PyTorch).
struct Pushed {
    name: String,
    samples: Samples,
}

impl DeviceSource for Pushed {
    fn name(&self) -> &str {
        &self.name
    }

    fn status(&self) -> SourceStatus {
        SourceStatus {
            name: self.name.clone(),
            available: true,
            detail: "pushed by the job (memsight Python package)".into(),
        }
    }

    fn sample(&mut self, out: &mut Vec<DeviceSample>) {
        out.extend(
            self.samples
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .cloned(),
        );
    }
}

/// Turns on Python frames in sampled stacks (`memsight::pyframes::enable`): called by the
/// `memsight` package from a Python function named `caller`, whose frame the reader must find
/// innermost. 1: on; 0: off (the reason, when `why` is not null, as a string to free with
/// `memsight_string_free`).
///
/// # Safety
/// `caller` is a NUL-terminated string; `why` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn memsight_python_frames(
    caller: *const c_char,
    why: *mut *mut c_char,
) -> c_int {
    if caller.is_null() {
        return 0;
    }
    let caller = CStr::from_ptr(caller).to_string_lossy();
    match memsight::pyframes::enable(&caller) {
        Ok(()) => 1,
        Err(e) => {
            if !why.is_null() {
                *why = CString::new(e).map_or(std::ptr::null_mut(), CString::into_raw);
            }
            0
        }
    }
}

/// Turns Python frames off: the interpreter is exiting (the `memsight` package calls it as
/// finalization starts; thread states go away after it).
#[no_mangle]
pub extern "C" fn memsight_python_frames_off() {
    memsight::pyframes::disable();
}

/// The calling thread's stack as a sample would record it — native frames (libgcc's unwinder)
/// interleaved with Python's — as text, one frame per line, innermost first (`file:line function`
/// or an address); a string to free with `memsight_string_free`. For the package's tests.
#[no_mangle]
pub extern "C" fn memsight_python_stack() -> *mut c_char {
    let mut native = NativeStack {
        frames: [0; 128],
        len: 0,
    };
    // SAFETY: `one_frame` writes only into `native`, which outlives the walk.
    unsafe { _Unwind_Backtrace(one_frame, (&mut native as *mut NativeStack).cast()) };
    let text = memsight::pyframes::stack_text(&native.frames[..native.len]);
    CString::new(text).map_or(std::ptr::null_mut(), CString::into_raw)
}

struct NativeStack {
    frames: [usize; 128],
    len: usize,
}

extern "C" {
    fn _Unwind_Backtrace(
        trace: extern "C" fn(*mut std::ffi::c_void, *mut std::ffi::c_void) -> c_int,
        arg: *mut std::ffi::c_void,
    ) -> c_int;
    fn _Unwind_GetIP(ctx: *mut std::ffi::c_void) -> usize;
}

extern "C" fn one_frame(ctx: *mut std::ffi::c_void, arg: *mut std::ffi::c_void) -> c_int {
    // SAFETY: `arg` is the NativeStack passed above; `ctx` is the unwinder's frame context.
    let s = unsafe { &mut *arg.cast::<NativeStack>() };
    let ip = unsafe { _Unwind_GetIP(ctx) };
    if ip == 0 || s.len == s.frames.len() {
        return 5; // _URC_END_OF_STACK
    }
    s.frames[s.len] = ip;
    s.len += 1;
    0 // _URC_NO_REASON
}
