//! A job written against exactly the public contract of the README: it holds a known 100 MiB
//! buffer, then a 64 MiB C `malloc`, frees both, resets the peak it reads back, and writes its
//! report to the path in argv[1].
//! It prints one `key=value` line per checkpoint for the test to read.

use std::hint::black_box;
use std::time::Duration;

#[global_allocator]
static ALLOC: memsight::Allocator = memsight::Allocator::new();

/// jemalloc's allocated bytes now (Rust and C alike); 0 when jemalloc statistics are unavailable.
fn jemalloc_allocated() -> u64 {
    memsight::snapshot()
        .jemalloc
        .map(|j| j.allocated)
        .unwrap_or(0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: contract_job REPORT.json")?;
    let session = memsight::Session::builder()
        .interval(Duration::from_millis(20))
        .report_path(path)
        .start()?;
    let base = memsight::stats();
    println!("baseline_live={}", base.live_bytes);
    memsight::reset_peak();

    memsight::step(1);
    {
        let _g = memsight::phase("hold-100MiB");
        let mut v = vec![0u8; 100 << 20];
        for i in (0..v.len()).step_by(4096) {
            v[i] = 1;
        }
        black_box(&v);
        std::thread::sleep(Duration::from_millis(100));
        let s = memsight::stats();
        println!("live_with_100MiB={}", s.live_bytes);
    }
    let s = memsight::stats();
    println!("peak_after_100MiB={}", s.peak_bytes);

    memsight::step(2);
    let before = jemalloc_allocated();
    let p = unsafe { libc::malloc(64 << 20) } as *mut u8;
    if p.is_null() {
        return Err("malloc(64 MiB) failed".into());
    }
    unsafe { std::ptr::write_bytes(p, 1, 64 << 20) };
    let during = jemalloc_allocated();
    println!(
        "jemalloc_allocated_delta_malloc={}",
        during as i64 - before as i64
    );
    unsafe { libc::free(black_box(p) as *mut libc::c_void) };
    let after = jemalloc_allocated();
    println!(
        "jemalloc_allocated_delta_free={}",
        after as i64 - before as i64
    );

    let end = memsight::stats();
    println!("final_live={}", end.live_bytes);
    println!(
        "allocations={} deallocations={}",
        end.allocations, end.deallocations
    );
    // As the README's snippet does: the program resets the peak it reads back; the report keeps
    // the run's.
    memsight::reset_peak();
    println!("peak_after_reset={}", memsight::stats().peak_bytes);
    let report = session.finish()?;
    println!("report_peak={}", report.peaks.heap_peak_bytes);
    Ok(())
}
