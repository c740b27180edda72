//! A fork while other threads are inside the heap sampler leaves the child able to sample: with
//! every allocation sampled and a thread allocating without pause, 300 children each allocate
//! 256 KiB (past the point where a thread takes up a new rate), check that they sampled, and exit —
//! none hangs on a lock the parent's other thread held (without the fork handlers, one does).

#[global_allocator]
static ALLOC: memsight::Allocator = memsight::Allocator::new();

#[cfg(feature = "jemalloc")]
#[test]
fn children_forked_mid_sample_can_sample() {
    use std::hint::black_box;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    std::env::set_var("MEMSIGHT_HEAP_SAMPLE", "1");
    memsight::heapprof::control::configure_from_env().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let busy = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let v: Vec<Vec<u8>> = (0..64).map(|i| vec![i as u8; 100 + i * 64]).collect();
                drop(black_box(v));
            }
        })
    };
    for _ in 0..300 {
        // SAFETY: the child only allocates, frees and exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let before = memsight::alloc::sampling::counts().taken;
            let v: Vec<Vec<u8>> = (0..32).map(|i| vec![i as u8; 8000 + i]).collect();
            drop(black_box(v));
            let after = memsight::alloc::sampling::counts().taken;
            // SAFETY: leaves the child at once, without the parent's exit handlers.
            unsafe { libc::_exit(if after > before { 0 } else { 3 }) };
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mut status = 0;
            // SAFETY: waits for our own child without blocking.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r == pid {
                assert!(
                    libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                    "child ended with status {status}"
                );
                break;
            }
            if Instant::now() > deadline {
                // SAFETY: our own child.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                panic!("a forked child hung in the sampler");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    stop.store(true, Ordering::Relaxed);
    busy.join().unwrap();
}

#[cfg(not(feature = "jemalloc"))]
#[test]
fn children_forked_mid_sample_can_sample() {
    eprintln!("skipped: memsight was built without its `jemalloc` feature (no heap sampler)");
}
