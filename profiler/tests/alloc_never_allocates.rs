//! The allocator path never allocates: a counting inner allocator sees exactly the calls the
//! program made, no more — and the tracker's counts agree with it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

static INNER_ALLOCS: AtomicU64 = AtomicU64::new(0);
static INNER_FREES: AtomicU64 = AtomicU64::new(0);

struct Counting;

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        INNER_ALLOCS.fetch_add(1, SeqCst);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        INNER_FREES.fetch_add(1, SeqCst);
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static ALLOC: memsight::Allocator<Counting> = memsight::Allocator::wrap(Counting);

#[test]
fn tracking_adds_no_allocation_of_its_own() {
    // First use on this thread claims a slot; that must not allocate either.
    let t = std::thread::spawn(|| {
        let (a0, f0) = (INNER_ALLOCS.load(SeqCst), INNER_FREES.load(SeqCst));
        let s0 = memsight::stats();
        for i in 0..10_000u32 {
            let b = black_box(Box::new(i));
            drop(b);
        }
        let big: Vec<u64> = black_box(vec![1; 1 << 20]);
        drop(big);
        let s1 = memsight::stats();
        let (a1, f1) = (INNER_ALLOCS.load(SeqCst), INNER_FREES.load(SeqCst));
        (
            a1 - a0,
            f1 - f0,
            s1.allocations - s0.allocations,
            s1.deallocations - s0.deallocations,
        )
    });
    let (inner_allocs, inner_frees, counted_allocs, counted_frees) = t.join().unwrap();
    assert_eq!(
        inner_allocs, 10_001,
        "the inner allocator saw extra allocations"
    );
    assert_eq!(inner_frees, 10_001);
    assert_eq!(counted_allocs, inner_allocs);
    assert_eq!(counted_frees, inner_frees);
}
