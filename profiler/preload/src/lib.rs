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
