//! A fork in a tracked process: the child inherits the counters, keeps counting exactly, and can
//! still read jemalloc statistics (jemalloc's own fork handlers keep its locks sane).

use std::hint::black_box;

#[global_allocator]
static ALLOC: memsight::Allocator = memsight::Allocator::new();

#[test]
fn child_of_fork_keeps_exact_counts() {
    // Another thread allocating while we fork must not leave the child stuck.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s2 = stop.clone();
    let busy = std::thread::spawn(move || {
        while !s2.load(std::sync::atomic::Ordering::Relaxed) {
            drop(black_box(vec![0u8; 1000]));
        }
    });
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = std::panic::catch_unwind(|| {
            let base = memsight::stats().rust_live_bytes;
            let v = black_box(vec![1u8; 10 << 20]);
            let ok_alloc = memsight::stats().rust_live_bytes - base == 10 << 20;
            // jemalloc's own statistics exist only with the feature (they also see the block).
            let je = !cfg!(feature = "jemalloc")
                || memsight::snapshot()
                    .jemalloc
                    .map(|j| j.allocated >= 10 << 20)
                    .unwrap_or(false);
            drop(v);
            let ok_free = memsight::stats().rust_live_bytes == base;
            if ok_alloc && ok_free && je {
                0
            } else {
                1
            }
        })
        .unwrap_or(2);
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    let r = unsafe { libc::waitpid(pid, &mut status, 0) };
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    busy.join().unwrap();
    assert_eq!(r, pid);
    assert!(
        libc::WIFEXITED(status),
        "child did not exit normally: status {status}"
    );
    assert_eq!(libc::WEXITSTATUS(status), 0, "child saw wrong counts");
}
