//! The C allocation functions of the job this library is preloaded into. Each forwards to the
//! allocator the program would use without memsight — the next definition after this library,
//! glibc's normally, found with `dlsym(RTLD_NEXT)` — and counts the block's usable size (the same
//! figure on allocation and on free, so the process heap is exact) in memsight's counters.
//!
//! An allocation that reaches its thread's next heap-sample point (one per 512 KiB allocated on
//! average, while a session samples) is served instead from the sampler's own mappings, its stack
//! recorded ([`sampled`]); `free` tells such a block by its address, with one compare.
//!
//! Until the next allocator is found (`dlsym` may itself allocate), calls are served from a small
//! static arena whose blocks are never counted nor freed. Nothing here allocates, locks or panics;
//! `errno` is what the next allocator left (the counting keeps it).

use memsight::alloc::foreign;
use memsight::alloc::foreign::sampled;
use std::cell::Cell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

type Malloc = unsafe extern "C" fn(usize) -> *mut c_void;
type Free = unsafe extern "C" fn(*mut c_void);
type Calloc = unsafe extern "C" fn(usize, usize) -> *mut c_void;
type Realloc = unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void;
type Memalign = unsafe extern "C" fn(usize, usize) -> *mut c_void;
type PosixMemalign = unsafe extern "C" fn(*mut *mut c_void, usize, usize) -> i32;
type Usable = unsafe extern "C" fn(*mut c_void) -> usize;

/// The next allocator's functions, as addresses (0 until resolved).
struct Next {
    malloc: AtomicUsize,
    free: AtomicUsize,
    calloc: AtomicUsize,
    realloc: AtomicUsize,
    memalign: AtomicUsize,
    aligned_alloc: AtomicUsize,
    posix_memalign: AtomicUsize,
    valloc: AtomicUsize,
    pvalloc: AtomicUsize,
    usable: AtomicUsize,
}

static NEXT: Next = Next {
    malloc: AtomicUsize::new(0),
    free: AtomicUsize::new(0),
    calloc: AtomicUsize::new(0),
    realloc: AtomicUsize::new(0),
    memalign: AtomicUsize::new(0),
    aligned_alloc: AtomicUsize::new(0),
    posix_memalign: AtomicUsize::new(0),
    valloc: AtomicUsize::new(0),
    pvalloc: AtomicUsize::new(0),
    usable: AtomicUsize::new(0),
};

const UNRESOLVED: u8 = 0;
const RESOLVING: u8 = 1;
const RESOLVED: u8 = 2;
static STATE: AtomicU8 = AtomicU8::new(UNRESOLVED);

thread_local! {
    /// True on the thread that is resolving the next allocator (its nested calls use the arena).
    static RESOLVER: Cell<bool> = const { Cell::new(false) };
}

/// Finds the next allocator once. False while this thread is the one finding it.
#[inline(always)]
#[link_section = ".text.hot.memsight"]
fn ready() -> bool {
    STATE.load(Ordering::Acquire) == RESOLVED || resolve()
}

#[cold]
#[inline(never)]
#[link_section = ".text.hot.memsight"]
fn resolve() -> bool {
    if RESOLVER.with(Cell::get) {
        return false;
    }
    if STATE
        .compare_exchange(UNRESOLVED, RESOLVING, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        RESOLVER.with(|r| r.set(true));
        let slots: [(&AtomicUsize, &[u8]); 10] = [
            (&NEXT.malloc, b"malloc\0"),
            (&NEXT.free, b"free\0"),
            (&NEXT.calloc, b"calloc\0"),
            (&NEXT.realloc, b"realloc\0"),
            (&NEXT.memalign, b"memalign\0"),
            (&NEXT.aligned_alloc, b"aligned_alloc\0"),
            (&NEXT.posix_memalign, b"posix_memalign\0"),
            (&NEXT.valloc, b"valloc\0"),
            (&NEXT.pvalloc, b"pvalloc\0"),
            (&NEXT.usable, b"malloc_usable_size\0"),
        ];
        for (slot, name) in slots {
            // SAFETY: a NUL-terminated name; RTLD_NEXT looks past this library.
            let f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) };
            slot.store(f as usize, Ordering::Relaxed);
        }
        let required = [
            &NEXT.malloc,
            &NEXT.free,
            &NEXT.calloc,
            &NEXT.realloc,
            &NEXT.posix_memalign,
            &NEXT.usable,
        ];
        if required.iter().any(|f| f.load(Ordering::Relaxed) == 0) {
            const MSG: &[u8] = b"memsight: the allocator after the preloaded library lacks one of \
malloc, free, calloc, realloc, posix_memalign, malloc_usable_size\n";
            // SAFETY: writing a static buffer to stderr, then ending the process.
            unsafe {
                libc::write(2, MSG.as_ptr().cast(), MSG.len());
                libc::abort();
            }
        }
        RESOLVER.with(|r| r.set(false));
        STATE.store(RESOLVED, Ordering::Release);
        return true;
    }
    while STATE.load(Ordering::Acquire) != RESOLVED {
        std::hint::spin_loop();
    }
    true
}

/// The resolved function in `slot` as a `T`.
///
/// # Safety
/// `slot` holds a function of type `T` (or 0, for an optional one: the caller checks).
#[inline(always)]
unsafe fn next<T: Copy>(slot: &AtomicUsize) -> T {
    let addr = slot.load(Ordering::Relaxed);
    std::mem::transmute_copy::<usize, T>(&addr)
}

#[inline(always)]
unsafe fn usable(p: *mut c_void) -> usize {
    if boot::owns(p) {
        return boot::size(p);
    }
    next::<Usable>(&NEXT.usable)(p)
}

/// Counts a block just returned by the next allocator (or its refusal of `size` bytes).
#[inline(always)]
#[link_section = ".text.hot.memsight"]
unsafe fn counted(p: *mut c_void, size: usize) -> *mut c_void {
    if p.is_null() {
        // Only running out of memory is an allocation failure (a bad alignment is EINVAL).
        if *libc::__errno_location() == libc::ENOMEM {
            foreign::count_failure(size);
            sampled::alloc_failed(size);
        }
    } else {
        // glibc's malloc_usable_size leaves errno alone; the counting keeps it too.
        foreign::count_alloc(next::<Usable>(&NEXT.usable)(p));
    }
    p
}

/// `malloc(3)`.
#[no_mangle]
#[link_section = ".text.hot.memsight"]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    if !ready() {
        return boot::alloc(size, 16);
    }
    if let Some(p) = sample(size, 16, false) {
        return p;
    }
    counted(next::<Malloc>(&NEXT.malloc)(size), size)
}

/// `free(3)`.
#[no_mangle]
#[link_section = ".text.hot.memsight"]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if sampled::is_sampled(p) {
        return sampled::free_sampled(p);
    }
    if p.is_null() || boot::owns(p) {
        return;
    }
    if !ready() {
        return;
    }
    foreign::count_free(next::<Usable>(&NEXT.usable)(p));
    next::<Free>(&NEXT.free)(p)
}

/// C23's `free_sized`: glibc frees whatever the size; so does this.
#[no_mangle]
pub unsafe extern "C" fn free_sized(p: *mut c_void, _size: usize) {
    free(p)
}

/// C23's `free_aligned_sized`.
#[no_mangle]
pub unsafe extern "C" fn free_aligned_sized(p: *mut c_void, _align: usize, _size: usize) {
    free(p)
}

/// The obsolete `cfree`, still exported by glibc.
#[no_mangle]
pub unsafe extern "C" fn cfree(p: *mut c_void) {
    free(p)
}

/// `calloc(3)`.
#[no_mangle]
#[link_section = ".text.hot.memsight"]
pub unsafe extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    if !ready() {
        return match n.checked_mul(size) {
            Some(total) => boot::alloc(total, 16),
            None => std::ptr::null_mut(),
        };
    }
    if let Some(p) = n
        .checked_mul(size)
        .and_then(|total| sample(total, 16, true))
    {
        return p;
    }
    counted(
        next::<Calloc>(&NEXT.calloc)(n, size),
        n.saturating_mul(size),
    )
}

/// `realloc(3)`.
#[no_mangle]
#[link_section = ".text.hot.memsight"]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    if p.is_null() {
        return malloc(size);
    }
    if boot::owns(p) || !ready() {
        return boot::move_out(p, size);
    }
    if sampled::is_sampled(p) || !sampled::sample_fits(size) {
        return realloc_sampling(p, size);
    }
    realloc_plain(p, size)
}

/// `realloc` by the next allocator, counted.
#[inline(always)]
#[link_section = ".text.hot.memsight"]
unsafe fn realloc_plain(p: *mut c_void, size: usize) -> *mut c_void {
    let old = usable(p);
    let q = next::<Realloc>(&NEXT.realloc)(p, size);
    if !q.is_null() {
        foreign::count_realloc(old, usable(q));
    } else if size == 0 {
        // glibc frees the block and returns NULL for realloc(p, 0).
        foreign::count_free(old);
    } else {
        foreign::count_failure(size);
    }
    q
}

/// `realloc` of a sampled block, or of a size that reaches the thread's next sample point (a
/// reallocation is an allocation of `size` bytes in the sample stream, as the linked library and
/// jemalloc's profiler count it): due a sample, the block is (or stays) sampled, a sampled block
/// keeping its first stack; a sampled block not due moves to the next allocator.
#[cold]
#[inline(never)]
unsafe fn realloc_sampling(p: *mut c_void, size: usize) -> *mut c_void {
    let was_sampled = sampled::is_sampled(p);
    let due = size != 0 && sampled::realloc_due(size);
    if !was_sampled && !due {
        return realloc_plain(p, size);
    }
    if size == 0 {
        // As glibc's `realloc(p, 0)`: frees, returns null.
        free(p);
        return std::ptr::null_mut();
    }
    if was_sampled && due {
        let q = sampled::realloc_sampled(p, size);
        if !q.is_null() {
            return q;
        }
    }
    let mut q = if due {
        sampled::serve_sampled(size, 16, false)
    } else {
        std::ptr::null_mut()
    };
    if q.is_null() {
        q = counted(next::<Malloc>(&NEXT.malloc)(size), size);
    }
    if q.is_null() {
        return q;
    }
    let old = if was_sampled {
        sampled::usable(p)
    } else {
        usable(p)
    };
    std::ptr::copy_nonoverlapping(p.cast::<u8>(), q.cast::<u8>(), old.min(size));
    free(p);
    q
}

/// `reallocarray(3)`.
#[no_mangle]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void {
    match n.checked_mul(size) {
        Some(total) => realloc(p, total),
        None => {
            *libc::__errno_location() = libc::ENOMEM;
            std::ptr::null_mut()
        }
    }
}

/// An aligned allocation through the optional function in `slot`, counted.
#[inline(always)]
#[link_section = ".text.hot.memsight"]
unsafe fn aligned_via(slot: &AtomicUsize, align: usize, size: usize) -> *mut c_void {
    if !ready() {
        return boot::alloc(size, align);
    }
    if slot.load(Ordering::Relaxed) == 0 {
        *libc::__errno_location() = libc::ENOMEM;
        return std::ptr::null_mut();
    }
    if let Some(p) = aligned_sample(align, size) {
        return p;
    }
    counted(
        next::<Memalign>(slot)(align, size),
        aligned_need(align, size),
    )
}

/// The sampled block for an allocation of `size` bytes aligned to `align` (zeroed when `zero`)
/// that reaches the thread's next sample point; `None` (the next allocator serves it) when it does
/// not, or when the sampled range has no room.
#[inline(always)]
unsafe fn sample(size: usize, align: usize, zero: bool) -> Option<*mut c_void> {
    if sampled::sample_fits(size) {
        return None;
    }
    let p = sampled::alloc_sampled(size, align, zero);
    (!p.is_null()).then_some(p)
}

/// As [`sample`], for an aligned allocation (PyTorch's CPU tensors are `posix_memalign`ed);
/// `None` too for an alignment the sampled mappings do not take (not a power of two, or above
/// 1 MiB).
#[inline(always)]
unsafe fn aligned_sample(align: usize, size: usize) -> Option<*mut c_void> {
    if !align.is_power_of_two() || align > 1 << 20 {
        return None;
    }
    sample(size, align, false)
}

/// What an aligned request needs of the address space at worst, as its failure is recorded: a
/// 64-byte block aligned to 1 TiB is a 1 TiB request, not a 64-byte one.
#[inline(always)]
fn aligned_need(align: usize, size: usize) -> usize {
    size.saturating_add(align.saturating_sub(1))
}

/// `memalign(3)`.
#[no_mangle]
#[link_section = ".text.hot.memsight"]
pub unsafe extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    aligned_via(&NEXT.memalign, align, size)
}

/// `aligned_alloc(3)`.
#[no_mangle]
#[link_section = ".text.hot.memsight"]
pub unsafe extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    aligned_via(&NEXT.aligned_alloc, align, size)
}

/// `valloc(3)`.
#[no_mangle]
#[link_section = ".text.hot.memsight"]
pub unsafe extern "C" fn valloc(size: usize) -> *mut c_void {
    if !ready() || NEXT.valloc.load(Ordering::Relaxed) == 0 {
        return memalign(page_size(), size);
    }
    counted(next::<Malloc>(&NEXT.valloc)(size), size)
}

/// `pvalloc(3)`.
#[no_mangle]
pub unsafe extern "C" fn pvalloc(size: usize) -> *mut c_void {
    if !ready() || NEXT.pvalloc.load(Ordering::Relaxed) == 0 {
        let page = page_size();
        return match size.div_ceil(page).max(1).checked_mul(page) {
            Some(rounded) => memalign(page, rounded),
            None => {
                *libc::__errno_location() = libc::ENOMEM;
                std::ptr::null_mut()
            }
        };
    }
    counted(next::<Malloc>(&NEXT.pvalloc)(size), size)
}

/// `posix_memalign(3)`.
#[no_mangle]
#[link_section = ".text.hot.memsight"]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> i32 {
    if !ready() {
        let p = boot::alloc(size, align);
        if p.is_null() {
            return libc::ENOMEM;
        }
        *out = p;
        return 0;
    }
    if align.is_multiple_of(std::mem::size_of::<usize>()) {
        if let Some(p) = aligned_sample(align, size) {
            *out = p;
            return 0;
        }
    }
    let rc = next::<PosixMemalign>(&NEXT.posix_memalign)(out, align, size);
    if rc == 0 {
        counted(*out, size);
    } else if rc == libc::ENOMEM {
        foreign::count_failure(aligned_need(align, size));
    }
    rc
}

/// `malloc_usable_size(3)`.
#[no_mangle]
#[link_section = ".text.hot.memsight"]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    if sampled::is_sampled(p) {
        return sampled::usable(p);
    }
    if p.is_null() || !ready() && !boot::owns(p) {
        return 0;
    }
    usable(p)
}

/// glibc's public aliases of its allocator (`__libc_malloc`, …), which some libraries call
/// directly: the same functions as the standard names here, so that a sampled block never reaches
/// glibc's `free` and every block is counted once.
mod libc_aliases {
    use std::ffi::c_void;

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
    pub unsafe extern "C" fn __libc_memalign(align: usize, size: usize) -> *mut c_void {
        super::memalign(align, size)
    }
}

/// `dlclose(3)`: the heap sampler's stack walker stops reading the loaded objects' unwind tables
/// (one of them may go away) until its next refresh, then the C library's `dlclose` runs.
///
/// # Safety
/// The C contract of `dlclose`.
#[no_mangle]
pub unsafe extern "C" fn dlclose(handle: *mut c_void) -> std::ffi::c_int {
    static REAL: AtomicUsize = AtomicUsize::new(0);
    foreign::sampled::objects_unloading();
    let mut real = REAL.load(Ordering::Relaxed);
    if real == 0 {
        real = libc::dlsym(libc::RTLD_NEXT, c"dlclose".as_ptr()) as usize;
        REAL.store(real, Ordering::Relaxed);
    }
    if real == 0 || real == dlclose as *const () as usize {
        return -1;
    }
    let real: unsafe extern "C" fn(*mut c_void) -> std::ffi::c_int = std::mem::transmute(real);
    real(handle)
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if page > 0 {
        page as usize
    } else {
        4096
    }
}

/// The arena that serves calls made while the next allocator is being found.
mod boot {
    use std::ffi::c_void;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const SIZE: usize = 256 * 1024;
    const HEADER: usize = 16;

    #[repr(C, align(4096))]
    struct Arena([u8; SIZE]);
    static mut ARENA: Arena = Arena([0; SIZE]);
    static USED: AtomicUsize = AtomicUsize::new(0);

    fn base() -> usize {
        // SAFETY: only the address is taken.
        std::ptr::addr_of_mut!(ARENA) as usize
    }

    /// True for a block of the arena.
    pub(super) fn owns(p: *mut c_void) -> bool {
        let a = p as usize;
        a >= base() && a < base() + SIZE
    }

    /// A zeroed block of `size` bytes aligned to `align` (a power of two), or null.
    pub(super) fn alloc(size: usize, align: usize) -> *mut c_void {
        let align = align.max(HEADER);
        if !align.is_power_of_two() {
            return std::ptr::null_mut();
        }
        let mut used = USED.load(Ordering::Relaxed);
        loop {
            let start = (base() + used + HEADER).next_multiple_of(align);
            let Some(end) = start.checked_add(size) else {
                return std::ptr::null_mut();
            };
            if end > base() + SIZE {
                return std::ptr::null_mut();
            }
            match USED.compare_exchange(used, end - base(), Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => {
                    // SAFETY: [start - HEADER, end) lies in the arena and is this call's alone.
                    unsafe { ((start - HEADER) as *mut usize).write(size) };
                    return start as *mut c_void;
                }
                Err(now) => used = now,
            }
        }
    }

    /// The size a block of the arena was asked with.
    pub(super) fn size(p: *mut c_void) -> usize {
        // SAFETY: `p` is a block of the arena, preceded by its header.
        unsafe { ((p as usize - HEADER) as *const usize).read() }
    }

    /// `realloc` of an arena block: a new block (the arena's until the next allocator is found,
    /// then the next allocator's) with the old contents.
    pub(super) unsafe fn move_out(p: *mut c_void, size: usize) -> *mut c_void {
        let q = super::malloc(size);
        if !q.is_null() {
            let keep = if owns(p) { self::size(p).min(size) } else { 0 };
            std::ptr::copy_nonoverlapping(p.cast::<u8>(), q.cast::<u8>(), keep);
        }
        q
    }
}
