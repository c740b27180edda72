//! With the `heap-profile` feature, page-aligned pointers are freed through jemalloc's unsized
//! `free` (sampled objects are page-aligned). With every allocation sampled, objects of a
//! page-sized class (all page-aligned) and small ones are allocated and freed through memsight's
//! allocator: jemalloc's profile sees them while they live and drops them when they are freed, and
//! memsight's live bytes return to where they were.

#[global_allocator]
static ALLOC: memsight::Allocator = memsight::Allocator::new();

#[cfg(feature = "heap-profile")]
#[test]
fn sampled_page_aligned_objects_are_freed_and_unaccounted() {
    use memsight::heapprof::control;
    use memsight_analysis::heapprof::dump::HeapDump;
    use std::hint::black_box;

    let dir = std::env::temp_dir().join(format!("memsight-sampled-free-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let profiled = |name: &str| {
        let path = dir.join(name);
        control::dump(&path).unwrap();
        HeapDump::read(&path).unwrap().total_bytes()
    };
    // Every allocation sampled (one sample per byte on average).
    std::env::set_var("MEMSIGHT_HEAP_SAMPLE", "1");
    assert_eq!(control::configure_from_env().unwrap(), Some(1));
    // The thread's next sample was drawn at the old rate (mean 512 KiB away): allocate past it, so
    // that every allocation below is sampled.
    for _ in 0..256 {
        drop(black_box(vec![0u8; 64 * 1024]));
    }

    let live_before = memsight::stats().rust_live_bytes;
    let profiled_before = profiled("before.heap");
    let pages: Vec<Vec<u8>> = (0..1000).map(|i| vec![i as u8; 4096]).collect();
    let small: Vec<Vec<u8>> = (0..1000).map(|i| vec![i as u8; 100]).collect();
    assert!(pages
        .iter()
        .all(|p| (p.as_ptr() as usize).is_multiple_of(4096)));
    let profiled_held = profiled("held.heap");
    let live_held = memsight::stats().rust_live_bytes;
    drop(black_box(pages));
    drop(black_box(small));
    let profiled_after = profiled("after.heap");
    let live_after = memsight::stats().rust_live_bytes;
    let _ = std::fs::remove_dir_all(&dir);

    let held = 1000.0 * (4096.0 + 100.0);
    assert!(
        profiled_held - profiled_before >= 0.95 * held,
        "profile before {profiled_before}, holding {profiled_held}"
    );
    assert!(
        (profiled_after - profiled_before).abs() < 64.0 * 1024.0,
        "profile before {profiled_before}, after freeing {profiled_after}"
    );
    assert!(live_held - live_before >= held as u64);
    assert!(
        live_after.abs_diff(live_before) < 64 * 1024,
        "memsight live bytes {live_before} before, {live_after} after"
    );
}

#[cfg(not(feature = "heap-profile"))]
#[test]
fn sampled_page_aligned_objects_are_freed_and_unaccounted() {
    eprintln!(
        "skipped: memsight was built without its `heap-profile` feature (make test enables it)"
    );
}
