//! The sampler's per-thread records: with every allocation sampled, blocks allocated on threads
//! that then exit, and freed by another thread (or still live), are in the profile exactly while
//! they live; the sampler's live count comes back to where it was; a profile written while other
//! threads sample and free at full speed is readable and its totals stay within what was live.

#[global_allocator]
static ALLOC: memsight::Allocator = memsight::Allocator::new();

#[cfg(feature = "jemalloc")]
#[test]
fn blocks_of_exited_threads_are_profiled_until_freed_by_another() {
    use memsight::alloc::sampling;
    use memsight::heapprof::control;
    use memsight_analysis::heapprof::dump::HeapDump;
    use std::hint::black_box;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let dir = std::env::temp_dir().join(format!("memsight-sampled-threads-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let opened = Arc::new(memsight_format::safe_dir::Dir::open(&dir).unwrap());
    let profiled = |name: &str| {
        control::dump(&opened, name.as_ref()).unwrap();
        HeapDump::read(&dir.join(name)).unwrap().total_bytes()
    };
    // Every allocation sampled.
    std::env::set_var("MEMSIGHT_HEAP_SAMPLE", "1");
    assert_eq!(control::configure_from_env().unwrap(), Some(1));

    let live_before = sampling::counts().live;
    let bytes_before = profiled("before.heap");
    // Eight threads each allocate 500 blocks of 10 KiB (Rust) and 500 of 3 KiB (C), hand them over
    // and exit.
    let handed: Vec<(Vec<Vec<u8>>, Vec<usize>)> = (0..8)
        .map(|t| {
            std::thread::spawn(move || {
                let rust: Vec<Vec<u8>> = (0..500).map(|i| vec![(t + i) as u8; 10_240]).collect();
                // SAFETY: C blocks, each freed once below.
                let c: Vec<usize> = (0..500)
                    .map(|_| unsafe { libc::malloc(3072) } as usize)
                    .collect();
                (rust, c)
            })
        })
        .map(|h| h.join().unwrap())
        .collect();
    let held = profiled("held.heap");
    let want = (8 * 500 * (10_240 + 3072)) as f64;
    assert!(
        held >= bytes_before + want,
        "the exited threads' blocks are in the profile: {held} bytes, want {bytes_before} + {want}"
    );
    assert!(sampling::counts().live >= live_before + 8000);

    // Meanwhile two threads churn sampled blocks and free each other's, while profiles are
    // written.
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(64);
    let producer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                if tx.send(vec![i as u8; 100 + (i % 5000) as usize]).is_err() {
                    break;
                }
            }
        })
    };
    let consumer = std::thread::spawn(move || {
        let mut n = 0u64;
        while let Ok(v) = rx.recv() {
            n += black_box(v)[0] as u64;
        }
        n
    });
    for i in 0..20 {
        let b = profiled(&format!("churn-{i}.heap"));
        assert!(
            b >= held,
            "a profile during churn holds what is live: {b} < {held}"
        );
    }
    stop.store(true, Ordering::Relaxed);
    producer.join().unwrap();
    black_box(consumer.join().unwrap());

    // The main thread frees everything the exited threads allocated.
    for (rust, c) in handed {
        drop(rust);
        for p in c {
            // SAFETY: allocated by `malloc` above, freed once.
            unsafe { libc::free(p as *mut libc::c_void) };
        }
    }
    let after = profiled("after.heap");
    assert!(
        after < bytes_before + 65_536.0,
        "freed blocks leave the profile: {after} bytes, {bytes_before} before"
    );
    let live = sampling::counts().live;
    assert!(
        live < live_before + 100,
        "the sampler's live count returns: {live}, {live_before} before"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
