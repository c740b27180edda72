//! Of two moments that hold nearly the same heap — a forward's end and its backward's start — the
//! profile at the peak is the higher one's, in a linked job (the process heap's counters publish
//! near the session's peak to a few KiB, not 64 KiB per thread).

use std::hint::black_box;

#[global_allocator]
static ALLOC: memsight::Allocator = memsight::Allocator::new();

const HELD: usize = 24 << 20;

/// The first moment: 24 MiB, every page touched.
#[inline(never)]
fn forward_end() -> Vec<u8> {
    let mut v = vec![0u8; HELD];
    for i in (0..v.len()).step_by(4096) {
        v[i] = 1;
    }
    black_box(v)
}

/// The second moment's 24 MiB, every page touched.
#[inline(never)]
fn backward_start() -> Vec<u8> {
    let mut v = vec![0u8; HELD];
    for i in (0..v.len()).step_by(4096) {
        v[i] = 2;
    }
    black_box(v)
}

#[test]
fn of_two_nearly_equal_moments_the_higher_ones_sites_are_the_peaks() {
    let dir = std::env::temp_dir().join(format!("memsight-near-peak-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("r.json");
    let session = memsight::Session::builder()
        .report_path(&path)
        .quiet()
        .start()
        .unwrap();
    // The moments come after the session's start-up has settled (its own first work must not
    // land on either moment: the test turns on 20 KB).
    std::thread::sleep(std::time::Duration::from_millis(300));
    let first = forward_end();
    drop(black_box(first));
    let second = backward_start();
    // 20 KB more than the first moment, in blocks no larger than a C library's small ones.
    let more: Vec<Vec<u8>> = (0..20).map(|i| black_box(vec![i as u8; 1000])).collect();
    drop(black_box(more));
    drop(black_box(second));
    session.finish().unwrap();

    let mut report = memsight::Report::load(&path).unwrap();
    memsight_analysis::heapprof::complete(&mut report, &path);
    let at_peak = report
        .heap_profile
        .as_ref()
        .and_then(|h| h.at_peak.clone())
        .expect("no profile at the peak");
    let held_by = |f: &str| {
        at_peak
            .top_sites
            .iter()
            .filter(|s| s.at.label().contains(f))
            .map(|s| s.bytes)
            .sum::<u64>()
    };
    let (second, first) = (held_by("backward_start"), held_by("forward_end"));
    println!("at the peak: backward_start {second} B, forward_end {first} B");
    let want = HELD as f64;
    assert!(
        (second as f64 - want).abs() <= want * 0.05,
        "backward_start holds {second} B at the peak: {:?}",
        at_peak.top_sites
    );
    assert_eq!(
        first, 0,
        "forward_end's bytes are at the peak: {:?}",
        at_peak.top_sites
    );
    let _ = std::fs::remove_dir_all(&dir);
}
