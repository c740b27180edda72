//! The process's C allocation functions — `malloc`, `calloc`, `realloc`, `free`, `posix_memalign`,
//! `aligned_alloc`, `memalign`, `valloc`, `pvalloc`, `malloc_usable_size` — defined here, so that C
//! and C++ code (libtorch, oneDNN, the C++ runtime's `operator new`, glibc itself) is counted in the
//! same per-thread counters as Rust's allocations, and served by the same jemalloc.
//!
//! A binary that links memsight with its `jemalloc` feature exports these symbols; the dynamic
//! linker then binds every shared library's calls to them (the interposition glibc supports). C
//! allocations are counted at their usable size (jemalloc's size class, computed inline for
//! `malloc`/`calloc` and asked of `nallocx` for aligned ones; `malloc_usable_size` on free), so an
//! allocation and its free always count the same bytes; a free is then handed to jemalloc with its size (`sdallocx`), which spares jemalloc
//! the lookup this path already made. Like the Rust path, nothing here allocates, locks, blocks or
//! panics, and a call made while the counters register a thread counts in the shared block.

use super::counters;
use std::ffi::{c_int, c_void};
use tikv_jemalloc_sys as je;

/// What the counters' object refers to (`counters::LINK_INTERPOSE`), so that the linker takes
/// this module's object into every binary whose allocations reach the counters (an unreferenced
/// object of a library is otherwise left out, and glibc's functions would serve C code).
pub(crate) struct Linked {
    _malloc: unsafe extern "C" fn(usize) -> *mut c_void,
    _free: unsafe extern "C" fn(*mut c_void),
}

/// The functions [`Linked`] holds.
pub(crate) const LINKED: Linked = Linked {
    _malloc: malloc,
    _free: free,
};

/// `MALLOCX_ALIGN(a)` for a power-of-two `a`.
fn align_flag(alignment: usize) -> c_int {
    alignment.trailing_zeros() as c_int
}

/// The page size; jemalloc's own is the same 4 KiB on every platform memsight supports.
const PAGE: usize = 4096;

/// jemalloc's usable size for a plain `malloc(size)` (its size class: 8, then steps of 16 up to
/// 128, then four classes per doubling — the same rule for small and large classes), computed
/// inline instead of asking `nallocx`; 0 when no class holds it. A test checks it against
/// jemalloc's own answer.
#[inline(always)]
pub(crate) fn size_class(size: usize) -> usize {
    if size <= 8 {
        8
    } else if size <= 128 {
        (size + 15) & !15
    } else if size > 1 << 62 {
        0
    } else {
        let lg = usize::BITS - 1 - (size - 1).leading_zeros();
        let delta = 1usize << (lg - 2);
        (size + delta - 1) & !(delta - 1)
    }
}

/// Calls `alloc`, counting `usable` bytes: before the call when the counters' fast path takes it
/// (taken back if the allocation fails), else after.
#[inline(always)]
unsafe fn counted(usable: usize, alloc: impl FnOnce() -> *mut c_void) -> *mut c_void {
    let p = if counters::alloc_fast(usable) {
        let p = alloc();
        if p.is_null() {
            counters::alloc_failed_after_count(usable);
        }
        p
    } else {
        let p = alloc();
        if !p.is_null() {
            counters::on_alloc(usable);
        }
        p
    };
    if !p.is_null() {
        counters::note_c(usable, false);
    }
    p
}

/// Allocates `size` bytes with jemalloc `flags` (an alignment, or zeroing), counted at usable size.
#[inline(always)]
unsafe fn alloc_counted(size: usize, flags: c_int) -> *mut c_void {
    let size = size.max(1);
    let usable = je::nallocx(size, flags);
    if usable == 0 {
        // Too large for any size class: jemalloc refuses it the same way.
        return std::ptr::null_mut();
    }
    counted(usable, || je::mallocx(size, flags))
}

/// `malloc(3)`, counted.
///
/// # Safety
/// The C contract of `malloc`.
#[no_mangle]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    match size_class(size) {
        0 => std::ptr::null_mut(),
        usable => counted(usable, || je::malloc(size)),
    }
}

/// `calloc(3)`, counted.
///
/// # Safety
/// The C contract of `calloc`.
#[no_mangle]
pub unsafe extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    match n.checked_mul(size).map(size_class) {
        None | Some(0) => std::ptr::null_mut(),
        Some(usable) => counted(usable, || je::calloc(n, size)),
    }
}

/// `free(3)`, counted.
///
/// # Safety
/// The C contract of `free`: `p` is null or came from this family and is freed once.
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    let usable = je::malloc_usable_size(p);
    counters::note_c(usable, true);
    if counters::dealloc_fast(usable) {
        je::sdallocx(p, usable, 0)
    } else {
        je::sdallocx(p, usable, 0);
        counters::on_dealloc(usable);
    }
}

/// `realloc(3)`, counted: the change in usable size as bytes allocated or freed.
///
/// # Safety
/// The C contract of `realloc`.
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    if p.is_null() {
        return malloc(size);
    }
    let old = je::malloc_usable_size(p);
    let q = je::realloc(p, size);
    if !q.is_null() {
        let new = je::malloc_usable_size(q);
        counters::on_realloc(old, new);
        counters::note_c(old.abs_diff(new), new < old);
    } else if size == 0 {
        // jemalloc freed it (the C standard allows either behaviour for a zero size).
        counters::on_dealloc(old);
        counters::note_c(old, true);
    } else {
        super::failed(size);
    }
    q
}

/// `posix_memalign(3)`, counted.
///
/// # Safety
/// The C contract of `posix_memalign`.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(
    out: *mut *mut c_void,
    alignment: usize,
    size: usize,
) -> c_int {
    if !alignment.is_power_of_two() || alignment < std::mem::size_of::<*mut c_void>() {
        return libc::EINVAL;
    }
    let p = alloc_counted(size, align_flag(alignment));
    if p.is_null() {
        return libc::ENOMEM;
    }
    *out = p;
    0
}

/// `aligned_alloc(3)`, counted.
///
/// # Safety
/// The C contract of `aligned_alloc`.
#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(alignment: usize, size: usize) -> *mut c_void {
    if !alignment.is_power_of_two() {
        return std::ptr::null_mut();
    }
    alloc_counted(size, align_flag(alignment))
}

/// `memalign(3)`, counted.
///
/// # Safety
/// The C contract of `memalign`.
#[no_mangle]
pub unsafe extern "C" fn memalign(alignment: usize, size: usize) -> *mut c_void {
    aligned_alloc(alignment, size)
}

/// `valloc(3)`, counted: page-aligned.
///
/// # Safety
/// The C contract of `valloc`.
#[no_mangle]
pub unsafe extern "C" fn valloc(size: usize) -> *mut c_void {
    alloc_counted(size, align_flag(PAGE))
}

/// `pvalloc(3)`, counted: page-aligned, rounded up to whole pages.
///
/// # Safety
/// The C contract of `pvalloc`.
#[no_mangle]
pub unsafe extern "C" fn pvalloc(size: usize) -> *mut c_void {
    match size.max(1).checked_next_multiple_of(PAGE) {
        Some(rounded) => alloc_counted(rounded, align_flag(PAGE)),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_are_jemalloc_s() {
        let mut sizes: Vec<usize> = (1..=20_000).collect();
        for lg in 14..40 {
            let b = 1usize << lg;
            sizes.extend([b - 1, b, b + 1, b + b / 8, b + b / 3, b + b / 2 + 7]);
        }
        for s in sizes {
            // SAFETY: nallocx has no preconditions beyond a non-zero size.
            let want = unsafe { je::nallocx(s, 0) };
            assert_eq!(size_class(s), want, "size {s}");
        }
    }
}
