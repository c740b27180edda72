//! Cost of one snapshot (allocator totals + jemalloc epoch and stats + /proc status + meminfo +
//! cgroup), through a running session's kept-open collectors. Prints the median and p90, then the
//! median of each source on its own so a regression can be placed.

use std::path::Path;
use std::time::{Duration, Instant};

#[global_allocator]
static ALLOC: memsight::Allocator = memsight::Allocator::new();

/// Median and p90 in µs of `f` over `n` runs.
fn time<T>(n: usize, mut f: impl FnMut() -> T) -> (f64, f64) {
    let mut t: Vec<f64> = (0..n)
        .map(|_| {
            let s = Instant::now();
            std::hint::black_box(f());
            s.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    t.sort_by(f64::total_cmp);
    (t[n / 2], t[n * 9 / 10])
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let session = memsight::Session::builder()
        .interval(Duration::from_secs(3600))
        .quiet()
        .start()?;
    // Some threads and arenas in use, as in a real job.
    let hs: Vec<_> = (0..std::env::var("T")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4))
        .map(|_| std::thread::spawn(|| std::hint::black_box(vec![0u8; 1 << 20]).len()))
        .collect();
    for h in hs {
        let _ = h.join();
    }
    let (median, p90) = time(2000, memsight::snapshot);
    println!("snapshot cost: median {median:.1} µs, p90 {p90:.1} µs (target ≤ 50 µs)");

    // A sampler tick also records the snapshot in the flight recorder (JSON into a ring slot).
    let ring =
        std::env::temp_dir().join(format!("memsight-sampler-bench-{}.bin", std::process::id()));
    let _ = std::fs::remove_file(&ring);
    if let Ok(w) = memsight::wire::ring::RingWriter::create(&ring, std::process::id(), 0, 100) {
        let (median, p90) = time(2000, || {
            w.append(&memsight::wire::Record::Snapshot(Box::new(
                memsight::snapshot(),
            )))
        });
        println!(
            "sampler tick (snapshot + flight recorder): median {median:.1} µs, p90 {p90:.1} µs"
        );
        let s = memsight::snapshot();
        let (median, _) = time(2000, || {
            w.append(&memsight::wire::Record::Snapshot(Box::new(s.clone())))
        });
        println!("  of which the flight-recorder append {median:>6.1}");
        let _ = std::fs::remove_file(&ring);
    }

    use memsight::collect::{CgroupReader, JemallocReader, ProcessReader, SystemReader};
    let proc_dir = Path::new("/proc/self");
    println!("per source (median µs):");
    println!(
        "  allocator counters {:>6.1}",
        time(2000, memsight::stats).0
    );
    if let Ok(r) = JemallocReader::open() {
        println!("  jemalloc           {:>6.1}", time(2000, || r.read()).0);
    }
    if let Ok(r) = ProcessReader::open(proc_dir) {
        println!("  /proc statm/status {:>6.1}", time(2000, || r.read()).0);
    }
    if let Ok(r) = SystemReader::open(Path::new("/proc")) {
        println!("  /proc/meminfo      {:>6.1}", time(2000, || r.read()).0);
    }
    if let Ok(r) = CgroupReader::discover(proc_dir, Path::new("/")) {
        println!("  cgroup             {:>6.1}", time(2000, || r.read()).0);
    }
    session.finish()?;
    Ok(())
}
