//! A job that holds 100 MiB of Rust heap and 200 MiB from C `malloc` at step 3 (the Rust buffer
//! is freed first, the C one after), then resets the peak it reads back and finishes: its report
//! must hold the whole process heap's peak, 300 MiB, at step 3. Prints `key=value` checkpoints.

use std::hint::black_box;
use std::time::Duration;

#[global_allocator]
static ALLOC: memsight::Allocator = memsight::Allocator::new();

const MIB: usize = 1 << 20;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: whole_heap_job REPORT.json")?;
    let session = memsight::Session::builder()
        .interval(Duration::from_millis(20))
        .report_path(path)
        .start()?;
    println!("baseline_live={}", memsight::stats().live_bytes);
    for step in 0..5u64 {
        memsight::step(step);
        if step != 3 {
            continue;
        }
        let _g = memsight::phase("hold");
        let rust = black_box(vec![1u8; 100 * MIB]);
        // SAFETY: a plain C allocation, every page touched, freed below.
        let c = unsafe { libc::malloc(200 * MIB) }.cast::<u8>();
        if c.is_null() {
            return Err("malloc(200 MiB) failed".into());
        }
        unsafe { std::ptr::write_bytes(c, 1, 200 * MIB) };
        std::thread::sleep(Duration::from_millis(100));
        println!("live_holding={}", memsight::stats().live_bytes);
        drop(rust);
        unsafe { libc::free(black_box(c).cast()) };
    }
    memsight::reset_peak();
    println!("final_live={}", memsight::stats().live_bytes);
    let report = session.finish()?;
    println!("report_peak={}", report.peaks.heap_peak_bytes);
    println!("background_threads={}", jemalloc_background_threads());
    Ok(())
}

/// This process's threads named as jemalloc names its background threads.
fn jemalloc_background_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .filter_map(Result::ok)
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.trim() == "jemalloc_bg_thd")
                })
                .count()
        })
        .unwrap_or(0)
}
