//! The inner allocator of `heap-profile` builds: jemalloc built with `--enable-prof`, with page-
//! aligned pointers freed through jemalloc's unsized `free`.
//!
//! Why: a prof-built jemalloc promotes every sampled allocation to page alignment, and the fast
//! path of a *sized* free (`sdallocx`, which Rust's deallocations use) sends every page-aligned
//! pointer to the slow path, because it might be sampled (`free_fastpath_nonfast_aligned` in
//! jemalloc 5.3's `jemalloc_internal_inlines_c.h`). Small objects land on page boundaries often —
//! 27% of the frees of an 8–4096-byte churn, 1.5% of a 32-byte one (counted over 10⁶ allocations) —
//! and each pays a full deallocation through the slow path. The unsized `free` looks the pointer
//! up in jemalloc's extent map instead, which tells a sampled object from a slab region and keeps
//! the rest on the fast path. Pointers that are not page-aligned are never sampled objects and
//! keep the sized free.

use std::alloc::{GlobalAlloc, Layout};

/// The alignment jemalloc gives sampled allocations (`PROF_SAMPLE_ALIGNMENT`, one page). With a
/// larger jemalloc page this sends a few more pointers to `free` than needed, which is still
/// correct: `free` accepts every jemalloc pointer.
const SAMPLE_ALIGNMENT: usize = 4096;

/// jemalloc (prof-built) with the page-aligned free redirected; see the module documentation.
#[derive(Clone, Copy, Debug, Default)]
pub struct SampledJemalloc;

// SAFETY: every call is forwarded to jemalloc; `free` accepts any pointer jemalloc returned,
// whatever its size or alignment.
unsafe impl GlobalAlloc for SampledJemalloc {
    #[inline(always)]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        tikv_jemallocator::Jemalloc.alloc(layout)
    }

    #[inline(always)]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        tikv_jemallocator::Jemalloc.alloc_zeroed(layout)
    }

    #[inline(always)]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if ptr as usize & (SAMPLE_ALIGNMENT - 1) == 0 {
            tikv_jemalloc_sys::free(ptr.cast());
        } else {
            tikv_jemallocator::Jemalloc.dealloc(ptr, layout)
        }
    }

    #[inline(always)]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        tikv_jemallocator::Jemalloc.realloc(ptr, layout, new_size)
    }
}
