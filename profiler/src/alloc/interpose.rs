//! The process's C allocation functions — `malloc`, `calloc`, `realloc`, `reallocarray`, `free`,
//! `posix_memalign`, `aligned_alloc`, `memalign`, `valloc`, `pvalloc`, `malloc_usable_size` —
//! defined here over jemalloc, so that C and C++ code (libtorch, oneDNN, the C++ runtime's
//! `operator new`, glibc itself) is served by the same jemalloc as Rust and counted in the process
//! heap (`super::process_heap`).
//!
//! A binary that links memsight with its `jemalloc` feature exports these symbols; the dynamic
//! linker then binds every shared library's calls to them (the interposition glibc supports, as
//! jemalloc's own unprefixed build does). Each function forwards to jemalloc (built with the
//! `_rjem_` prefix) and then checks its thread's jemalloc counter against the thread's mark — the
//! counting itself is jemalloc's, done on its fast path anyway. Nothing here allocates, locks,
//! blocks or panics.
//!
//! jemalloc built with a prefix reads its options from `_RJEM_MALLOC_CONF`; memsight's binaries
//! (and the documented `MALLOC_CONF`) use the plain name, which [`MALLOC_CONF_FROM_ENV`] hands to
//! jemalloc before anything in the process can allocate.

use super::process_heap::{after_alloc, after_free, after_realloc, alloc_fits};
use std::ffi::{c_char, c_int, c_void};
use tikv_jemalloc_sys as je;

/// What the counters' object refers to (`counters::LINK_INTERPOSE`), so that the linker takes
/// this module's object into every binary whose allocations reach the counters (an unreferenced
/// object of a library is otherwise left out, and glibc's functions would serve C code).
pub(crate) struct Linked {
    _malloc: unsafe extern "C" fn(usize) -> *mut c_void,
    _free: unsafe extern "C" fn(*mut c_void),
    _conf: extern "C" fn(c_int, *const *const c_char, *const *const c_char),
}

/// The functions [`Linked`] holds.
pub(crate) const LINKED: Linked = Linked {
    _malloc: malloc,
    _free: free,
    _conf: malloc_conf_from_env,
};

/// The page size; jemalloc's own is the same 4 KiB on every platform memsight supports.
const PAGE: usize = 4096;

/// jemalloc's last source of options (read after `_RJEM_MALLOC_CONF`, so it wins); weak in
/// jemalloc, defined here.
#[no_mangle]
#[used]
static mut _rjem_malloc_conf_2_conf_harder: *const c_char = std::ptr::null();

/// Runs before any shared library's initialiser (the executable's pre-initialisers come first),
/// so before the first allocation that initialises jemalloc.
#[used]
#[link_section = ".preinit_array"]
static MALLOC_CONF_FROM_ENV: extern "C" fn(c_int, *const *const c_char, *const *const c_char) =
    malloc_conf_from_env;

/// Hands `MALLOC_CONF` to the prefixed jemalloc. It reads the environment block the dynamic
/// linker passes: libc's own `environ` is set up only after the pre-initialisers ran.
extern "C" fn malloc_conf_from_env(_: c_int, _: *const *const c_char, envp: *const *const c_char) {
    const NAME: &[u8] = b"MALLOC_CONF=";
    if envp.is_null() {
        return;
    }
    // SAFETY: `envp` is the NULL-terminated array of NUL-terminated strings the process started
    // with; this runs single-threaded, before anything reads the variable it sets.
    unsafe {
        let mut e = envp;
        while !(*e).is_null() {
            let entry = std::ffi::CStr::from_ptr(*e).to_bytes();
            if entry.starts_with(NAME) {
                _rjem_malloc_conf_2_conf_harder = (*e).add(NAME.len());
                return;
            }
            e = e.add(1);
        }
    }
}

/// Runs the jemalloc call `call` that allocates about `size` bytes: straight (a tail call) when
/// the thread stays below its mark, else out of line, followed by the slow path.
#[inline(always)]
unsafe fn allocate<R>(size: usize, call: impl FnOnce() -> R) -> R {
    if alloc_fits(size) {
        call()
    } else {
        allocate_slow(call)
    }
}

/// [`allocate`]'s other branch.
#[cold]
#[inline(never)]
unsafe fn allocate_slow<R>(call: impl FnOnce() -> R) -> R {
    let r = call();
    after_alloc();
    r
}

/// `malloc(3)`.
///
/// # Safety
/// The C contract of `malloc`.
#[no_mangle]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    allocate(size, || je::malloc(size))
}

/// `calloc(3)`.
///
/// # Safety
/// The C contract of `calloc`.
#[no_mangle]
pub unsafe extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    allocate(n.saturating_mul(size), || je::calloc(n, size))
}

/// `free(3)`.
///
/// # Safety
/// The C contract of `free`: `p` is null or came from this family and is freed once.
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    je::free(p);
    after_free();
}

/// `realloc(3)`.
///
/// # Safety
/// The C contract of `realloc`.
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    let q = je::realloc(p, size);
    after_realloc();
    if q.is_null() && size != 0 {
        super::failed(size);
    }
    q
}

/// `reallocarray(3)`: `realloc` of `n × size` bytes, refused when that overflows.
///
/// # Safety
/// The C contract of `reallocarray`.
#[no_mangle]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void {
    match n.checked_mul(size) {
        Some(bytes) => realloc(p, bytes),
        None => {
            *libc::__errno_location() = libc::ENOMEM;
            std::ptr::null_mut()
        }
    }
}

/// `posix_memalign(3)`.
///
/// # Safety
/// The C contract of `posix_memalign`.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(
    out: *mut *mut c_void,
    alignment: usize,
    size: usize,
) -> c_int {
    allocate(size, || je::posix_memalign(out, alignment, size))
}

/// `aligned_alloc(3)`.
///
/// # Safety
/// The C contract of `aligned_alloc`.
#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(alignment: usize, size: usize) -> *mut c_void {
    allocate(size, || je::aligned_alloc(alignment, size))
}

/// `memalign(3)`: `aligned_alloc` without its size rule.
///
/// # Safety
/// The C contract of `memalign`.
#[no_mangle]
pub unsafe extern "C" fn memalign(alignment: usize, size: usize) -> *mut c_void {
    aligned_alloc(alignment, size)
}

/// `valloc(3)`: page-aligned.
///
/// # Safety
/// The C contract of `valloc`.
#[no_mangle]
pub unsafe extern "C" fn valloc(size: usize) -> *mut c_void {
    aligned_alloc(PAGE, size)
}

/// `pvalloc(3)`: page-aligned, rounded up to whole pages.
///
/// # Safety
/// The C contract of `pvalloc`.
#[no_mangle]
pub unsafe extern "C" fn pvalloc(size: usize) -> *mut c_void {
    match size.max(1).checked_next_multiple_of(PAGE) {
        Some(rounded) => aligned_alloc(PAGE, rounded),
        None => std::ptr::null_mut(),
    }
}

/// `malloc_usable_size(3)`.
///
/// # Safety
/// `p` is null or a live allocation of this family.
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    if p.is_null() {
        0
    } else {
        je::malloc_usable_size(p)
    }
}
