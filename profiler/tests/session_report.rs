//! A session over a small training-shaped loop: the report attributes the peak to the right step
//! and phase, measures phases, finds a per-step leak, and round-trips through JSON.

use std::hint::black_box;
use std::time::Duration;

#[global_allocator]
static ALLOC: memsight::Allocator = memsight::Allocator::new();

fn touch(mut v: Vec<u8>) -> Vec<u8> {
    for i in (0..v.len()).step_by(4096) {
        v[i] = 1;
    }
    black_box(v)
}

#[test]
fn report_attributes_peaks_phases_steps_and_leak() {
    let dir = std::env::temp_dir().join(format!("memsight-session-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("report.json");
    let session = memsight::Session::builder()
        .interval(Duration::from_millis(5))
        .report_path(&path)
        .quiet()
        .start()
        .unwrap();
    assert!(matches!(
        memsight::Session::builder().start(),
        Err(memsight::SessionError::AlreadyRunning)
    ));

    let mut leaked: Vec<Vec<u8>> = Vec::new();
    for step in 0..30u64 {
        memsight::step(step);
        let _train = memsight::phase("train");
        let acts = {
            let _f = memsight::phase("forward");
            touch(vec![0u8; 8 << 20])
        };
        {
            let _b = memsight::phase("backward");
            // Step 17's backward is the biggest: 40 MiB of gradients on top of 8 MiB activations.
            let grads = touch(vec![0u8; if step == 17 { 40 << 20 } else { 16 << 20 }]);
            drop(grads);
        }
        drop(acts);
        leaked.push(touch(vec![0u8; 256 << 10])); // 256 KiB kept every step
        std::thread::sleep(Duration::from_millis(2));
    }
    let measured = memsight::monitor("eval").finish().unwrap();
    assert_eq!(measured.path, "eval");

    let report = session.finish().unwrap();
    let p = &report.peaks;
    assert_eq!(p.heap_peak_step, Some(17));
    assert_eq!(p.heap_peak_phase.as_deref(), Some("train/backward"));
    let base = p.heap_peak_bytes - (48 << 20);
    assert!(
        base < 20 << 20,
        "peak {} not ≈ 48 MiB above a small baseline",
        p.heap_peak_bytes
    );

    let fwd = report
        .phases
        .iter()
        .find(|x| x.path == "train/forward")
        .unwrap();
    assert_eq!(fwd.count, 30);
    assert!(
        fwd.max_rise_bytes >= 8 << 20 && fwd.max_rise_bytes < 9 << 20,
        "{fwd:?}"
    );
    // Forward keeps its activations until after backward; the sampler thread's own small
    // allocations during the phase are process-wide memory too, hence the tolerance (64 KiB was
    // exceeded by 14 KiB on a loaded machine, where more samples fall inside the phases).
    assert!(
        (fwd.net_bytes - 30 * (8 << 20)).abs() < 128 << 10,
        "{fwd:?}"
    );
    let train = report.phases.iter().find(|x| x.path == "train").unwrap();
    assert!(train.net_bytes >= 30 * (256 << 10));

    let leak = report.leak.as_ref().expect("30 steps give a leak estimate");
    assert!(
        (leak.slope_bytes_per_step - (256 << 10) as f64).abs() < 8192.0,
        "{leak:?}"
    );
    assert!(
        report.tips.iter().any(|t| t.id == "leak-suspect"),
        "{:?}",
        report.tips
    );
    assert!(report.tips.iter().any(|t| t.id == "peak-in-backward"));

    assert_eq!(
        report
            .steps
            .iter()
            .find(|s| s.step == 17)
            .unwrap()
            .peak_bytes,
        p.heap_peak_bytes
    );
    assert!(
        report.timeline.len() >= 10,
        "sampler at 5 ms produced {} samples",
        report.timeline.len()
    );
    assert!(report.timeline.windows(2).all(|w| w[0].t_ms <= w[1].t_ms));
    assert!(report
        .histogram
        .iter()
        .any(|b| b.min_bytes == 32 << 20 && b.count >= 1));
    assert!(report
        .sources
        .iter()
        .any(|s| s.name == "process" && s.available));
    assert!(report
        .sources
        .iter()
        .any(|s| s.name == "jemalloc" && s.available));
    assert!(p.rss_peak_bytes.unwrap() >= 48 << 20);

    let leak_tip = report.tips.iter().find(|t| t.id == "leak-suspect").unwrap();
    assert!(
        leak_tip.advice.contains("Phase train kept the most memory"),
        "{}",
        leak_tip.advice
    );
    let loaded = memsight::Report::load(&path).unwrap();
    assert!(
        loaded == report,
        "the report did not round-trip through JSON"
    );
    black_box(leaked);
    std::fs::remove_dir_all(&dir).unwrap();
}
