//! The allocator path never allocates: a counting inner allocator sees exactly the calls the
//! program made, no more, less the heap-sampled ones (served by the sampled arena, whose sampler
//! allocates nothing either) — and the tracker's counts agree with it.
//!
//! The inner allocator counts per thread, so the test harness's own threads cannot disturb the
//! first property; the tracker's counts are process-wide, so their agreement is taken from the
//! first of a few rounds in which no other thread allocated.

#![cfg(feature = "jemalloc")]

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::hint::black_box;
use tikv_jemallocator::Jemalloc;

thread_local! {
    static INNER_ALLOCS: Cell<u64> = const { Cell::new(0) };
    static INNER_FREES: Cell<u64> = const { Cell::new(0) };
}

/// Counts the calls it forwards to jemalloc. It calls jemalloc directly: an inner allocator that
/// went through `malloc` would be counted a second time by memsight's own `malloc`.
struct Counting;

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = INNER_ALLOCS.try_with(|c| c.set(c.get() + 1));
        Jemalloc.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let _ = INNER_FREES.try_with(|c| c.set(c.get() + 1));
        Jemalloc.dealloc(ptr, layout)
    }
}

fn inner() -> (u64, u64) {
    (INNER_ALLOCS.with(Cell::get), INNER_FREES.with(Cell::get))
}

#[global_allocator]
static ALLOC: memsight::Allocator<Counting> = memsight::Allocator::wrap(Counting);

#[test]
fn tracking_adds_no_allocation_of_its_own() {
    let mut agreed = false;
    for _ in 0..5 {
        // First use on a new thread claims a slot; that must not allocate either.
        let t = std::thread::spawn(|| {
            let (a0, f0) = inner();
            let taken0 = memsight::alloc::sampling::counts().taken;
            let s0 = memsight::stats();
            for i in 0..10_000u32 {
                let b = black_box(Box::new(i));
                drop(b);
            }
            let big: Vec<u64> = black_box(vec![1; 1 << 20]);
            drop(big);
            let s1 = memsight::stats();
            let (a1, f1) = inner();
            let sampled = memsight::alloc::sampling::counts().taken - taken0;
            (
                a1 - a0 + sampled,
                f1 - f0 + sampled,
                s1.allocations - s0.allocations,
                s1.deallocations - s0.deallocations,
            )
        });
        let (inner_allocs, inner_frees, counted_allocs, counted_frees) = t.join().unwrap();
        assert_eq!(
            inner_allocs, 10_001,
            "the inner allocator saw extra allocations"
        );
        assert_eq!(inner_frees, 10_001, "the inner allocator saw extra frees");
        assert!(counted_allocs >= inner_allocs && counted_frees >= inner_frees);
        if counted_allocs == inner_allocs && counted_frees == inner_frees {
            agreed = true;
            break;
        }
    }
    assert!(
        agreed,
        "the tracker's counts never matched the inner allocator's"
    );
}
