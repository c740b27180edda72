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

use super::process_heap::{after_alloc, after_free, after_realloc, alloc_fits, c_stream_fits};
use super::{sample_heap, sampling};
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicPtr, Ordering::Relaxed};
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

/// The system's page size (from the auxiliary vector: no system call).
fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as usize,
        _ => 4096,
    }
}

/// jemalloc's last source of options (read after `_RJEM_MALLOC_CONF`, so it wins): a C string
/// pointer, weak in jemalloc, defined here (an `AtomicPtr` has the pointer's layout).
#[no_mangle]
#[used]
static _rjem_malloc_conf_2_conf_harder: AtomicPtr<c_char> = AtomicPtr::new(std::ptr::null_mut());

/// Runs before any shared library's initialiser (the executable's pre-initialisers come first),
/// so before the first allocation that initialises jemalloc.
#[used]
#[link_section = ".preinit_array"]
static MALLOC_CONF_FROM_ENV: extern "C" fn(c_int, *const *const c_char, *const *const c_char) =
    malloc_conf_from_env;

/// Hands `MALLOC_CONF` to the prefixed jemalloc, then starts the heap sampler as
/// `MEMSIGHT_HEAP_SAMPLE` says — before the shared libraries' initialisers run, so that what they
/// allocate (libtorch's operator registries: tens of MiB that stay live) is sampled too, as library
/// start-up. It reads the environment block the dynamic loader passes: libc's own `environ` is set
/// up only after the pre-initialisers ran.
extern "C" fn malloc_conf_from_env(_: c_int, _: *const *const c_char, envp: *const *const c_char) {
    super::process_heap::note_preinit();
    if envp.is_null() {
        super::process_heap::start_jemalloc();
        return;
    }
    if let Some(conf) = env_value(envp, b"MALLOC_CONF=") {
        _rjem_malloc_conf_2_conf_harder.store(conf.cast_mut(), Relaxed);
    }
    super::process_heap::start_jemalloc();
    // The program started again by a session to symbolize its heap profiles (`heapprof::apart`):
    // it serves that request and exits, before any library's initialiser runs.
    #[cfg(feature = "symbolize")]
    if env_value(envp, SYMBOLIZING_CHILD).is_some() {
        serve_symbolizing_child();
    }
    let rate = env_value(envp, b"MEMSIGHT_HEAP_SAMPLE=")
        // SAFETY: a NUL-terminated string of the environment block.
        .map(|v| {
            unsafe { std::ffi::CStr::from_ptr(v) }
                .to_str()
                .unwrap_or("")
        });
    sampling::start_at_load(rate);
}

/// The environment entry of the symbolizing child (`process_heap::SYMBOLIZING_CHILD_ENV`, then `=`).
#[cfg(feature = "symbolize")]
const SYMBOLIZING_CHILD: &[u8] = b"MEMSIGHT_SYMBOLIZE_CHILD=";
#[cfg(feature = "symbolize")]
const _: () = {
    let name = super::process_heap::SYMBOLIZING_CHILD_ENV.as_bytes();
    assert!(name.len() + 1 == SYMBOLIZING_CHILD.len());
    let mut i = 0;
    while i < name.len() {
        assert!(name[i] == SYMBOLIZING_CHILD[i]);
        i += 1;
    }
};

/// Serves the request of a session that started this program again to symbolize its heap
/// profiles: reads it from standard input, writes the report's section to standard output, and
/// ends the process — before any library's initialiser runs.
#[cfg(feature = "symbolize")]
fn serve_symbolizing_child() -> ! {
    use std::io::{Read, Write};
    use std::os::fd::FromRawFd;
    let answer = std::panic::catch_unwind(|| {
        // SAFETY: the descriptors the session set up as this process's standard input and output;
        // each is owned here once.
        let mut input = unsafe { std::fs::File::from_raw_fd(0) };
        let mut request = Vec::new();
        input.read_to_end(&mut request).ok()?;
        let (dumps, report_dir): super::process_heap::SymbolizeRequest =
            serde_json::from_slice(&request).ok()?;
        let section = memsight_analysis::heapprof::summarize(&dumps, &report_dir);
        let json = serde_json::to_vec(&section).ok()?;
        // SAFETY: as above.
        let mut output = unsafe { std::fs::File::from_raw_fd(1) };
        output.write_all(&json).ok()
    });
    let code = i32::from(!matches!(answer, Ok(Some(()))));
    // SAFETY: ends the child at once, running no initialiser or exit handler of the program's.
    unsafe { libc::_exit(code) }
}

/// The value of the environment entry starting with `name` (`NAME=`), as a C string pointer.
fn env_value(envp: *const *const c_char, name: &[u8]) -> Option<*const c_char> {
    // SAFETY: `envp` is the NULL-terminated array of NUL-terminated strings the process started
    // with; this runs single-threaded.
    unsafe {
        let mut e = envp;
        while !(*e).is_null() {
            let entry = std::ffi::CStr::from_ptr(*e).to_bytes();
            if entry.starts_with(name) {
                return Some((*e).add(name.len()));
            }
            e = e.add(1);
        }
    }
    None
}

/// Runs the jemalloc call `call` that allocates `size` bytes aligned to `align` (zeroed when
/// `zero`): straight (a tail call) when the thread stays below its mark and its next heap-sample
/// point, else out of line, where the allocation may be sampled, followed by the slow path.
#[inline(always)]
unsafe fn allocate(
    size: usize,
    align: usize,
    zero: bool,
    call: impl FnOnce() -> *mut c_void,
) -> *mut c_void {
    if alloc_fits(size) {
        call()
    } else {
        allocate_slow(size, align, zero, call)
    }
}

/// [`allocate`]'s other branch (huge requests take it too: a refused one is recorded).
#[cold]
#[inline(never)]
unsafe fn allocate_slow(
    size: usize,
    align: usize,
    zero: bool,
    call: impl FnOnce() -> *mut c_void,
) -> *mut c_void {
    if sampling::c_due(size) {
        let p = sampling::alloc(size, align, zero);
        if !p.is_null() {
            after_alloc();
            return p.cast();
        }
    }
    let r = call();
    after_alloc();
    if r.is_null() {
        sampling::c_failed(size);
        super::failed(size);
    }
    r
}

/// Whether `alignment` is one `posix_memalign` and `aligned_alloc` accept: a power of two (and, for
/// `posix_memalign`, a multiple of a pointer's size).
fn valid_alignment(alignment: usize) -> bool {
    alignment.is_power_of_two()
}

/// `malloc(3)`.
///
/// # Safety
/// The C contract of `malloc`.
#[no_mangle]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    allocate(size, 1, false, || je::malloc(size))
}

/// `calloc(3)`.
///
/// # Safety
/// The C contract of `calloc`.
#[no_mangle]
pub unsafe extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    match n.checked_mul(size) {
        Some(bytes) => allocate(bytes, 1, true, || je::calloc(n, size)),
        None => allocate_slow(usize::MAX, 1, true, || je::calloc(n, size)),
    }
}

/// `free(3)`.
///
/// # Safety
/// The C contract of `free`: `p` is null or came from this family and is freed once.
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if sample_heap::contains(p.cast()) {
        sampling::free(p.cast());
    } else {
        je::free(p);
    }
    after_free();
}

/// `realloc(3)`.
///
/// # Safety
/// The C contract of `realloc`.
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    if sample_heap::contains(p.cast()) || !c_stream_fits(size) {
        return realloc_slow(p, size);
    }
    let q = je::realloc(p, size);
    after_realloc();
    if q.is_null() && size != 0 {
        super::failed(size);
    }
    q
}

/// `realloc` of a sampled block, or one whose size reaches the thread's next heap-sample point
/// (counted as an allocation of `size` bytes, as jemalloc's profiler counts a reallocation): a
/// block due a sample is (or stays) in the sampled arena, its first stack kept; a sampled block
/// not due moves out of it.
#[cold]
#[inline(never)]
unsafe fn realloc_slow(p: *mut c_void, size: usize) -> *mut c_void {
    let was_sampled = sample_heap::contains(p.cast());
    let due = size != 0 && sampling::c_due(size);
    if !was_sampled && !due {
        let q = je::realloc(p, size);
        after_realloc();
        if q.is_null() && size != 0 {
            super::failed(size);
        }
        return q;
    }
    if size == 0 {
        // As jemalloc's (and glibc's) `realloc(p, 0)`: frees, returns null.
        free(p);
        return std::ptr::null_mut();
    }
    // A reallocation is a new allocation of `size` bytes in the C stream (as jemalloc's profiler
    // counts it), so a sampled block stays sampled only when this one is due too.
    if was_sampled && due {
        let q = sampling::realloc(p.cast(), sampling::usable(p.cast()), size, 1);
        if !q.is_null() {
            after_realloc();
            return q.cast();
        }
    }
    let mut q: *mut c_void = if due && !was_sampled {
        sampling::alloc(size, 1, false).cast()
    } else {
        std::ptr::null_mut()
    };
    if q.is_null() {
        q = je::malloc(size);
    }
    if q.is_null() {
        super::failed(size);
        return q;
    }
    if !p.is_null() {
        let old = if was_sampled {
            sampling::usable(p.cast())
        } else {
            je::malloc_usable_size(p)
        };
        std::ptr::copy_nonoverlapping(p.cast::<u8>(), q.cast::<u8>(), old.min(size));
        free(p);
    }
    after_realloc();
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
    if !valid_alignment(alignment) || alignment < std::mem::size_of::<*mut c_void>() {
        return libc::EINVAL;
    }
    let p = allocate(size, alignment, false, || {
        let mut p = std::ptr::null_mut();
        match je::posix_memalign(&mut p, alignment, size) {
            0 => p,
            _ => std::ptr::null_mut(),
        }
    });
    if p.is_null() {
        return libc::ENOMEM;
    }
    *out = p;
    0
}

/// `aligned_alloc(3)`.
///
/// # Safety
/// The C contract of `aligned_alloc`.
#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(alignment: usize, size: usize) -> *mut c_void {
    if !valid_alignment(alignment) {
        return je::aligned_alloc(alignment, size);
    }
    allocate(size, alignment, false, || {
        je::aligned_alloc(alignment, size)
    })
}

/// `memalign(3)`, as glibc's: an alignment that is not a power of two is rounded up to one, and
/// one below a pointer's size serves as `malloc`.
///
/// # Safety
/// The C contract of `memalign`.
#[no_mangle]
pub unsafe extern "C" fn memalign(alignment: usize, size: usize) -> *mut c_void {
    if alignment <= std::mem::size_of::<*mut c_void>() {
        return malloc(size);
    }
    match alignment.checked_next_power_of_two() {
        Some(a) => aligned_alloc(a, size),
        None => {
            *libc::__errno_location() = libc::EINVAL;
            std::ptr::null_mut()
        }
    }
}

/// `valloc(3)`: page-aligned.
///
/// # Safety
/// The C contract of `valloc`.
#[no_mangle]
pub unsafe extern "C" fn valloc(size: usize) -> *mut c_void {
    aligned_alloc(page(), size)
}

/// `pvalloc(3)`: page-aligned, rounded up to whole pages.
///
/// # Safety
/// The C contract of `pvalloc`.
#[no_mangle]
pub unsafe extern "C" fn pvalloc(size: usize) -> *mut c_void {
    let page = page();
    match size.max(1).checked_next_multiple_of(page) {
        Some(rounded) => aligned_alloc(page, rounded),
        None => {
            *libc::__errno_location() = libc::ENOMEM;
            std::ptr::null_mut()
        }
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

/// `dlclose(3)`: the heap sampler's stack walker stops reading the loaded objects' unwind tables
/// (one of them may go away) until its next refresh, then the C library's `dlclose` runs.
///
/// # Safety
/// The C contract of `dlclose`.
#[no_mangle]
pub unsafe extern "C" fn dlclose(handle: *mut c_void) -> c_int {
    static NEXT: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
    sampling::objects_unloading();
    let mut next = NEXT.load(Relaxed);
    if next.is_null() {
        next = libc::dlsym(libc::RTLD_NEXT, c"dlclose".as_ptr());
        NEXT.store(next, Relaxed);
    }
    if next.is_null() || next == dlclose as *mut c_void {
        return -1;
    }
    let real: unsafe extern "C" fn(*mut c_void) -> c_int = std::mem::transmute(next);
    real(handle)
}

/// glibc's public aliases of its allocator (`__libc_malloc`, …), which some libraries call
/// directly: the same functions, so that no pointer reaches glibc's allocator.
mod libc_aliases {
    use std::ffi::{c_int, c_void};

    /// `__libc_malloc`.
    ///
    /// # Safety
    /// As `malloc`.
    #[no_mangle]
    pub unsafe extern "C" fn __libc_malloc(size: usize) -> *mut c_void {
        super::malloc(size)
    }

    /// `__libc_calloc`.
    ///
    /// # Safety
    /// As `calloc`.
    #[no_mangle]
    pub unsafe extern "C" fn __libc_calloc(n: usize, size: usize) -> *mut c_void {
        super::calloc(n, size)
    }

    /// `__libc_realloc`.
    ///
    /// # Safety
    /// As `realloc`.
    #[no_mangle]
    pub unsafe extern "C" fn __libc_realloc(p: *mut c_void, size: usize) -> *mut c_void {
        super::realloc(p, size)
    }

    /// `__libc_free`.
    ///
    /// # Safety
    /// As `free`.
    #[no_mangle]
    pub unsafe extern "C" fn __libc_free(p: *mut c_void) {
        super::free(p)
    }

    /// `__libc_memalign`.
    ///
    /// # Safety
    /// As `memalign`.
    #[no_mangle]
    pub unsafe extern "C" fn __libc_memalign(alignment: usize, size: usize) -> *mut c_void {
        super::memalign(alignment, size)
    }

    /// `__posix_memalign`.
    ///
    /// # Safety
    /// As `posix_memalign`.
    #[no_mangle]
    pub unsafe extern "C" fn __posix_memalign(
        out: *mut *mut c_void,
        alignment: usize,
        size: usize,
    ) -> c_int {
        super::posix_memalign(out, alignment, size)
    }
}
