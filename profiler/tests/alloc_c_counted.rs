//! C allocations are the process heap too: the `malloc` family, and glibc's own calls to it
//! (`strdup`), count in the process heap with Rust's allocations, at the usable size, and return
//! to the baseline when freed; Rust's share does not move; the peak holds what a thread allocated
//! and freed before anything read the counters.

#![cfg(feature = "jemalloc")]

use std::hint::black_box;

#[global_allocator]
static ALLOC: memsight::Allocator = memsight::Allocator::new();

const MIB: usize = 1 << 20;

extern "C" {
    /// Not in the `libc` crate; glibc declares it in <stdlib.h>.
    fn valloc(size: usize) -> *mut libc::c_void;
}

/// What the test harness's own threads may allocate meanwhile (they count: it is the process heap).
const NOISE: u64 = 64 << 10;

/// Whether `a` is within [`NOISE`] of `b`.
fn near(a: u64, b: u64) -> bool {
    a.abs_diff(b) <= NOISE
}

/// Live bytes (process, Rust) now.
fn live() -> (u64, u64) {
    let s = memsight::stats();
    (s.live_bytes, s.rust_live_bytes)
}

/// One test: the harness's threads would otherwise allocate between the readings.
#[test]
fn c_allocations_count_in_the_process_heap() {
    the_malloc_family_is_counted_and_returns_to_baseline();
    glibc_s_own_allocations_are_counted();
    the_peak_holds_allocations_freed_before_any_read();
}

/// The peak is published by the allocating thread itself (its mark), not by a reader: a thread
/// that allocates 64 MiB — from C, then from Rust — and frees it before anything reads the
/// counters still leaves the peak 64 MiB above the baseline.
fn the_peak_holds_allocations_freed_before_any_read() {
    for from_c in [true, false] {
        memsight::reset_peak();
        let base = memsight::stats().live_bytes;
        std::thread::spawn(move || {
            if from_c {
                // SAFETY: a plain C allocation, freed once.
                unsafe { libc::free(black_box(libc::malloc(64 * MIB))) };
            } else {
                drop(black_box(Vec::<u8>::with_capacity(64 * MIB)));
            }
        })
        .join()
        .unwrap();
        let peak = memsight::stats().peak_bytes;
        assert!(
            peak + NOISE >= base + 64 * MIB as u64,
            "from C: {from_c}: peak {peak} is not 64 MiB above the baseline {base}"
        );
    }
}

fn the_malloc_family_is_counted_and_returns_to_baseline() {
    // SAFETY: plain C allocations, each freed once.
    unsafe {
        let (base, rust_base) = live();
        let a = libc::malloc(3 * MIB);
        let b = libc::calloc(MIB, 2);
        let mut c: *mut libc::c_void = std::ptr::null_mut();
        assert_eq!(libc::posix_memalign(&mut c, 4096, MIB), 0);
        let d = libc::aligned_alloc(64, MIB);
        let e = libc::memalign(128, MIB);
        let f = valloc(MIB);
        for p in [a, b, c, d, e, f] {
            assert!(!p.is_null());
            std::ptr::write_bytes(p.cast::<u8>(), 1, MIB);
        }
        let usable: usize = [a, b, c, d, e, f]
            .iter()
            .map(|&p| libc::malloc_usable_size(p))
            .sum();
        assert!(usable >= 9 * MIB, "usable {usable}");
        let (held, rust_held) = live();
        assert!(
            near(held - base, usable as u64),
            "process heap while holding: {}",
            held - base
        );
        assert!(
            near(rust_held, rust_base),
            "Rust's share moved: {rust_held} vs {rust_base}"
        );

        // realloc grows by the change in usable size.
        let ua = libc::malloc_usable_size(a);
        let g = libc::realloc(black_box(a), 6 * MIB);
        assert!(!g.is_null());
        let grown = libc::malloc_usable_size(g);
        let after = live().0 - base;
        assert!(
            near(after, (usable - ua + grown) as u64),
            "after realloc: {after}"
        );
        for p in [g, b, c, d, e, f] {
            libc::free(black_box(p));
        }
        let (end, rust_end) = live();
        assert!(near(end, base), "not back to baseline: {end} vs {base}");
        assert!(near(rust_end, rust_base));
    }
}

fn glibc_s_own_allocations_are_counted() {
    let (base, _) = live();
    let s = std::ffi::CString::new("x".repeat(1 << 20)).unwrap();
    // SAFETY: strdup returns a malloc'ed copy, freed below.
    let dup = unsafe { libc::strdup(s.as_ptr()) };
    assert!(!dup.is_null());
    let (held, _) = live();
    // The CString (Rust) and glibc's copy (C, through memsight's malloc).
    let copy = unsafe { libc::malloc_usable_size(dup.cast()) };
    assert!(
        held - base + NOISE >= (1 << 20) + copy as u64,
        "strdup's copy ({copy} B) not counted: {}",
        held - base
    );
    unsafe { libc::free(dup.cast()) };
    drop(s);
    assert!(near(live().0, base));
}
