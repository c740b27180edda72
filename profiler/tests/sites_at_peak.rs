//! Sites at the exact peak (issue 38): a 192 MiB spike that lives 30 ms at one step of a 200-step
//! loop, at the default 100 ms sampling interval, is the top site of the report's profile at the
//! peak at 192 MiB ± 5% — the sampled set live at the instant of the peak, not a periodic profile.

use std::hint::black_box;
use std::time::Duration;

#[global_allocator]
static ALLOC: memsight::Allocator = memsight::Allocator::new();

/// The spike: 192 MiB, every page touched, held 30 ms.
#[inline(never)]
fn attention_spike() -> u64 {
    let mut v = vec![0u8; 192 << 20];
    for i in (0..v.len()).step_by(4096) {
        v[i] = 1;
    }
    std::thread::sleep(Duration::from_millis(30));
    black_box(&v)
        .iter()
        .step_by(1 << 20)
        .map(|&x| x as u64)
        .sum()
}

/// A training step's ordinary work: 8 MiB of activations, freed.
#[inline(never)]
fn ordinary_step() -> u64 {
    let acts = black_box(vec![1u8; 8 << 20]);
    acts[4096] as u64
}

#[test]
fn the_spike_is_the_top_site_at_the_peak_at_full_size() {
    let dir = std::env::temp_dir().join(format!("memsight-peak-sites-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("r.json");
    let session = memsight::Session::builder()
        .report_path(&path)
        .quiet()
        .start()
        .unwrap();
    let mut kept = Vec::new();
    for n in 0..200u64 {
        session.step(n);
        black_box(ordinary_step());
        if n == 123 {
            black_box(attention_spike());
        }
        kept.push(black_box(vec![2u8; 64 << 10]));
        std::thread::sleep(Duration::from_millis(1));
    }
    let counts = memsight::alloc::sampling::counts();
    session.finish().unwrap();
    drop(kept);

    let mut report = memsight::Report::load(&path).unwrap();
    memsight_analysis::heapprof::complete(&mut report, &path);
    let at_peak = report
        .heap_profile
        .as_ref()
        .and_then(|h| h.at_peak.clone())
        .expect("no profile at the peak");
    let top = &at_peak.top_sites[0];
    let want = (192u64 << 20) as f64;
    assert!(
        top.at.label().contains("attention_spike"),
        "top site {} ({} bytes), sites {:?}; sampler {counts:?}, peak {} MiB",
        top.at.label(),
        top.bytes,
        at_peak.top_sites,
        report.peaks.heap_peak_bytes >> 20
    );
    assert!(
        (top.bytes as f64 - want).abs() <= want * 0.05,
        "the spike's site holds {} MiB",
        top.bytes >> 20
    );
    assert_eq!(at_peak.step, 123, "the peak's step");
    let _ = std::fs::remove_dir_all(&dir);
}
