//! Sampled blocks are served by the sampled arena and recognised when freed: with every allocation
//! sampled, Rust blocks of several sizes and alignments and C blocks (`malloc`, `calloc`,
//! `posix_memalign`, `realloc`) show in the profile while they live and leave it when freed; blocks
//! reallocated into and out of the arena keep their contents; memsight's live bytes return to where
//! they were.

#[global_allocator]
static ALLOC: memsight::Allocator = memsight::Allocator::new();

/// The tests set the process's sampling rate: one at a time.
#[cfg(feature = "jemalloc")]
static RATE: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[cfg(feature = "jemalloc")]
#[test]
fn sampled_blocks_are_profiled_while_live_and_forgotten_when_freed() {
    use memsight::heapprof::control;
    use memsight_analysis::heapprof::dump::HeapDump;
    use std::hint::black_box;

    let _rate = RATE.lock().unwrap_or_else(|e| e.into_inner());
    let dir = std::env::temp_dir().join(format!("memsight-sampled-free-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let opened = std::sync::Arc::new(memsight_format::safe_dir::Dir::open(&dir).unwrap());
    let profiled = |name: &str| {
        let path = dir.join(name);
        control::dump(&opened, name.as_ref()).unwrap();
        HeapDump::read(&path).unwrap().total_bytes()
    };
    // Every allocation sampled (one sample per byte on average).
    std::env::set_var("MEMSIGHT_HEAP_SAMPLE", "1");
    assert_eq!(control::configure_from_env().unwrap(), Some(1));
    assert_eq!(control::sampling(), Some(true));

    let live_before = memsight::stats().live_bytes;
    let profiled_before = profiled("before.heap");
    let pages: Vec<Vec<u8>> = (0..1000).map(|i| vec![i as u8; 4096]).collect();
    let small: Vec<Vec<u8>> = (0..1000).map(|i| vec![i as u8; 100]).collect();
    let aligned = std::alloc::Layout::from_size_align(3000, 4096).unwrap();
    // SAFETY: a non-zero layout; freed below with the same layout.
    let page_aligned = unsafe { std::alloc::alloc(aligned) };
    assert!(!page_aligned.is_null() && (page_aligned as usize).is_multiple_of(4096));
    // SAFETY: C allocations, each freed once below.
    let c_blocks = unsafe {
        let m = libc::malloc(5000).cast::<u8>();
        let z = libc::calloc(10, 700).cast::<u8>();
        let mut a = std::ptr::null_mut();
        assert_eq!(libc::posix_memalign(&mut a, 256, 9000), 0);
        assert!((a as usize).is_multiple_of(256));
        std::ptr::write_bytes(m, 7, 5000);
        assert!((0..7000).all(|i| *z.add(i) == 0));
        let r = libc::realloc(m.cast(), 20_000).cast::<u8>();
        assert!(
            (0..5000).all(|i| *r.add(i) == 7),
            "realloc kept the contents"
        );
        [r, z, a.cast()]
    };
    let profiled_held = profiled("held.heap");
    let live_held = memsight::stats().live_bytes;
    // A Rust block grown by realloc keeps its contents, wherever it moved.
    let mut grown = vec![3u8; 1000];
    grown.resize(300_000, 4);
    assert!(grown[..1000].iter().all(|&b| b == 3) && grown[1000..].iter().all(|&b| b == 4));
    drop(black_box(grown));
    drop(black_box(pages));
    drop(black_box(small));
    // SAFETY: allocated above with these layouts / by the C allocator.
    unsafe {
        std::alloc::dealloc(page_aligned, aligned);
        for p in c_blocks {
            libc::free(p.cast());
        }
    }
    let profiled_after = profiled("after.heap");
    let live_after = memsight::stats().live_bytes;
    let _ = std::fs::remove_dir_all(&dir);

    let held = 1000.0 * (4096.0 + 100.0) + 3000.0 + 20_000.0 + 7000.0 + 9000.0;
    assert!(
        profiled_held - profiled_before >= 0.99 * held,
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

#[cfg(not(feature = "jemalloc"))]
#[test]
fn sampled_blocks_are_profiled_while_live_and_forgotten_when_freed() {
    eprintln!("skipped: memsight was built without its `jemalloc` feature (no heap sampler)");
}

/// A failed huge allocation does not push the thread's next sample point past bytes it never
/// allocated; an unloaded object sends walks to libgcc's unwinder until the walker is refreshed.
#[cfg(feature = "jemalloc")]
#[test]
fn failures_and_unloads_leave_the_sampler_working() {
    use memsight::alloc::sampling;
    use std::hint::black_box;

    let _rate = RATE.lock().unwrap_or_else(|e| e.into_inner());
    std::env::set_var("MEMSIGHT_HEAP_SAMPLE", "64KiB");
    memsight::heapprof::control::configure_from_env().unwrap();
    let sample_some = || {
        let before = sampling::counts().taken;
        for _ in 0..64 {
            drop(black_box(vec![1u8; 64 << 10]));
        }
        sampling::counts().taken - before
    };
    assert!(sample_some() > 0);
    let mut v: Vec<u8> = Vec::new();
    assert!(v.try_reserve_exact(1 << 46).is_err(), "64 TiB was granted");
    assert!(
        sample_some() > 0,
        "a failed 64 TiB request stopped sampling"
    );

    // SAFETY: loads and unloads a library of the C library's own, which runs no code of ours.
    unsafe {
        let h = libc::dlopen(c"libutil.so.1".as_ptr(), libc::RTLD_NOW);
        assert!(!h.is_null(), "dlopen libutil.so.1");
        assert_eq!(libc::dlclose(h), 0);
    }
    let slow = sampling::counts().slow_walks;
    assert!(sample_some() > 0);
    assert!(
        sampling::counts().slow_walks > slow,
        "after dlclose the walker must not read the objects' tables"
    );
    sampling::refresh_walker();
    let slow = sampling::counts().slow_walks;
    assert!(sample_some() > 0);
    assert_eq!(
        sampling::counts().slow_walks,
        slow,
        "refreshed, the walker walks again"
    );
}
