//! memsight preloaded into a job that does not link it (a Python or C++ program), by `memsight run`
//! through `LD_PRELOAD`: the process heap counted exactly over the allocator the program already
//! uses ([`malloc`], and C++'s `new` and `delete` through it: [`cxx`]), the session with its flight recorder and report ([`job`]), and the C
//! interface the `memsight` Python package calls ([`ffi`]), and CUDA's injection entry point that
//! counts device memory through CUPTI under `memsight run --cupti` ([`cuda`]).
//!
//! Direction: `malloc` ← `cxx`; `malloc` ← `job` ← `ffi`, `cuda` (each uses only those before it); all sit on the
//! `memsight` crate, built without jemalloc.

mod credentials;
mod cuda;
mod cxx;
mod ffi;
mod job;
mod malloc;

/// The next definition of `name` after this library's (the C library's, or another preloaded
/// allocator's), looked up once into `slot`; 0 where there is none.
fn next_definition(slot: &std::sync::atomic::AtomicUsize, name: &std::ffi::CStr) -> usize {
    use std::sync::atomic::Ordering;
    let mut f = slot.load(Ordering::Relaxed);
    if f == 0 {
        // SAFETY: a NUL-terminated name; RTLD_NEXT finds the definition after this library's.
        f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
        slot.store(f, Ordering::Relaxed);
    }
    f
}
