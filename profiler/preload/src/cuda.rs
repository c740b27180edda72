//! CUDA's injection entry point: with `memsight run --cupti`, `CUDA_INJECTION64_PATH` names this
//! library, so the CUDA driver calls [`InitializeInjection`] when the process initialises CUDA
//! (`cuInit`), before any device allocation. It subscribes to CUPTI's driver-API memory callbacks
//! (`memsight::devices::cupti`) in the process that owns the session, so every `cuMemAlloc`/
//! `cuMemFree`-family call of any library (candle, cudarc, CuPy, libtorch) is counted per device in
//! the job's samples and report, with no change to the program. Processes that do not own the
//! session (forked workers, programs the job starts: they inherit the variable, which the driver
//! reads only at `cuInit`, so it stays set in the job) load the library and are left alone.

use std::ffi::c_int;

/// Called by the CUDA driver (NVIDIA's injection interface); nonzero means success. The reason
/// CUPTI is unavailable (library not found, another subscriber) goes into the report's sources
/// and, once, to stderr.
#[no_mangle]
pub extern "C" fn InitializeInjection() -> c_int {
    if crate::job::measured_here() {
        let status = memsight::devices::cupti::install();
        if !status.available {
            eprintln!("memsight: cupti absent: {}", status.detail);
        }
    }
    1
}
