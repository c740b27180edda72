//! Reentrancy: an inner allocator that itself allocates through the global allocator nests
//! cleanly — no deadlock, and every nested allocation is counted exactly.

#![cfg(feature = "jemalloc")]

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::hint::black_box;
use tikv_jemallocator::Jemalloc;

/// Forwards to jemalloc directly (through `malloc` it would also be counted by memsight's own
/// `malloc`), allocating through the global allocator from inside.
struct Reentrant;

thread_local! {
    static NESTED: Cell<bool> = const { Cell::new(false) };
}

unsafe impl GlobalAlloc for Reentrant {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() >= 4096 && !NESTED.with(|n| n.replace(true)) {
            // Allocate (and free) through the *global* allocator from inside the inner one.
            let v: Vec<u8> = black_box(vec![7u8; 100]);
            drop(v);
            NESTED.with(|n| n.set(false));
        }
        Jemalloc.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        Jemalloc.dealloc(ptr, layout)
    }
}

#[global_allocator]
static ALLOC: memsight::Allocator<Reentrant> = memsight::Allocator::wrap(Reentrant);

#[test]
fn nested_allocations_from_the_inner_allocator_are_counted() {
    // Heap-sampled blocks are served by the sampled arena, without the inner allocator (and its
    // nested allocation): sampling off, every call reaches it.
    memsight::heapprof::control::set_sampling(false).unwrap();
    let before = memsight::stats();
    for _ in 0..1000 {
        let big: Vec<u8> = black_box(Vec::with_capacity(8192));
        drop(big);
    }
    let after = memsight::stats();
    // 1000 big allocations, each with one nested 100-byte allocation.
    assert_eq!(after.allocations - before.allocations, 2000);
    assert_eq!(after.deallocations - before.deallocations, 2000);
    assert_eq!(
        after.bytes_allocated - before.bytes_allocated,
        1000 * (8192 + 100)
    );
    assert_eq!(after.rust_live_bytes, before.rust_live_bytes);
}
