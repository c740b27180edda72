//! The testing API under cargo's parallel test runner: eight tests, each asserting its own peak
//! exactly while the others allocate at the same time (issue 38), plus a helper thread holding
//! 100 MiB during a measurement, C allocations, nesting and a leak.

use memsight::testing::{measure, Scope};
use std::hint::black_box;
use std::sync::mpsc;

#[global_allocator]
static ALLOC: memsight::Allocator = memsight::Allocator::new();

/// Allocates `mib` MiB in two blocks (the second while the first is live), touches every page,
/// frees both; returns the page sum so nothing is optimized away.
fn work(mib: usize) -> u64 {
    let mut a = vec![0u8; (mib << 20) / 2];
    let mut b = vec![0u8; (mib << 20) / 2];
    for i in (0..a.len()).step_by(4096) {
        a[i] = 1;
        b[i] = 2;
    }
    let s = black_box(&a)
        .iter()
        .step_by(4096)
        .map(|&x| x as u64)
        .sum::<u64>()
        + black_box(&b)
            .iter()
            .step_by(4096)
            .map(|&x| x as u64)
            .sum::<u64>();
    drop(black_box(a));
    drop(black_box(b));
    // A smaller block after the peak: the peak stays the two halves.
    let c = black_box(vec![3u8; 1 << 20]);
    s + c[0] as u64
}

fn assert_own_peak(mib: usize) {
    for _ in 0..5 {
        let (s, m) = measure(|| work(mib));
        assert!(s > 0);
        assert_eq!(m.peak_bytes, (mib << 20) as u64, "{m}");
        memsight::assert_no_leak!(m);
        assert_eq!(m.allocations, 3, "{m}");
        let heap = m.heap_peak_bytes.unwrap_or((mib << 20) as u64);
        assert!(
            heap >= (mib << 20) as u64 && heap < ((mib << 20) + (1 << 20)) as u64,
            "{m}"
        );
    }
}

#[test]
fn peak_of_2_mib() {
    assert_own_peak(2);
}
#[test]
fn peak_of_4_mib() {
    assert_own_peak(4);
}
#[test]
fn peak_of_8_mib() {
    assert_own_peak(8);
}
#[test]
fn peak_of_16_mib() {
    assert_own_peak(16);
}
#[test]
fn peak_of_24_mib() {
    assert_own_peak(24);
}
#[test]
fn peak_of_32_mib() {
    assert_own_peak(32);
}
#[test]
fn peak_of_48_mib() {
    assert_own_peak(48);
}
#[test]
fn peak_of_64_mib() {
    assert_own_peak(64);
}

#[test]
fn another_threads_100_mib_during_the_measurement_is_not_counted() {
    let (held_tx, held_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let helper = std::thread::spawn(move || {
        let big = black_box(vec![1u8; 100 << 20]);
        held_tx.send(()).unwrap();
        done_rx.recv().unwrap();
        drop(big);
    });
    let (_, m) = measure(|| {
        held_rx.recv().unwrap(); // the helper holds its 100 MiB from here …
        let v = black_box(vec![1u8; 3 << 20]);
        drop(v);
        done_tx.send(()).unwrap(); // … to here
    });
    helper.join().unwrap();
    memsight::assert_peak_between!(m, 3 << 20, (3 << 20) + 4096);
}

#[test]
fn c_allocations_are_in_the_process_heap_figures() {
    let (_, m) = measure(|| {
        // SAFETY: malloc and free of one block.
        unsafe {
            let p = libc::malloc(6 << 20).cast::<u8>();
            assert!(!p.is_null());
            for i in (0..6 << 20).step_by(4096) {
                p.add(i).write_volatile(1);
            }
            libc::free(p.cast());
        }
    });
    assert_eq!(m.peak_bytes, 0, "Rust's figures have no C bytes: {m}");
    if let Some(heap) = m.heap_peak_bytes {
        assert!((6 << 20..7 << 20).contains(&heap), "{m}");
    }
}

#[test]
fn scopes_nest_and_a_leak_shows() {
    let outer = Scope::start();
    let kept = black_box(vec![5u8; 1 << 20]);
    let (_, inner) = measure(|| black_box(vec![1u8; 10 << 20]).len());
    assert_eq!(inner.peak_bytes, 10 << 20, "{inner}");
    let m = outer.finish();
    assert_eq!(m.peak_bytes, 11 << 20, "{m}");
    assert_eq!(m.net_bytes, 1 << 20, "{m}");
    let r = std::panic::catch_unwind(|| memsight::assert_no_leak!(m));
    assert!(r.is_err(), "assert_no_leak! passed a 1 MiB leak");
    drop(kept);
}
