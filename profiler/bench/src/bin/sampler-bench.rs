//! Cost of one snapshot (allocator totals + jemalloc epoch and stats + /proc status + meminfo +
//! cgroup), through a running session's kept-open collectors. Prints the median and p90.

use std::time::{Duration, Instant};

#[global_allocator]
static ALLOC: memsight::Allocator = memsight::Allocator::new();

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let session = memsight::Session::builder()
        .interval(Duration::from_secs(3600))
        .quiet()
        .start()?;
    // Some threads and arenas in use, as in a real job.
    let hs: Vec<_> = (0..4)
        .map(|_| std::thread::spawn(|| std::hint::black_box(vec![0u8; 1 << 20]).len()))
        .collect();
    for h in hs {
        let _ = h.join();
    }
    let mut t: Vec<f64> = (0..2000)
        .map(|_| {
            let s = Instant::now();
            std::hint::black_box(memsight::snapshot());
            s.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    t.sort_by(f64::total_cmp);
    println!(
        "snapshot cost: median {:.1} µs, p90 {:.1} µs (target ≤ 50 µs)",
        t[t.len() / 2],
        t[t.len() * 9 / 10]
    );
    session.finish()?;
    Ok(())
}
