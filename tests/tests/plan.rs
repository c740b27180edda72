//! `memsight plan`: a report of a real CPU run (the reference GPT, tui fixture) has no device memory
//! and is refused with the reason; reports with device peaks are planned as hand arithmetic says;
//! bad input exits 2.

use memsight::devices::DevicePeak;
use memsight::Report;
use memsight_e2e::run_memsight;
use std::path::{Path, PathBuf};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tui/tests/fixtures/gpt-report.json")
}

#[test]
fn a_cpu_run_is_refused_with_the_reason() {
    let f = fixture();
    let r = run_memsight(
        &[
            "plan",
            "--gpus",
            "2",
            "--gpu-memory",
            "80GiB",
            f.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(r.code, 2, "{}", r.err);
    assert!(
        r.err
            .contains("gpt-report.json: the report has no device memory"),
        "{}",
        r.err
    );
}

#[test]
fn device_peaks_are_planned_as_by_hand() {
    // The real run's report, given the device peak a 30 GiB job would have on an 80 GiB GPU.
    let dir = std::env::temp_dir().join(format!("memsight-plan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut r = Report::load(&fixture()).unwrap();
    r.devices = vec![DevicePeak {
        index: 0,
        backend: "libtorch-cuda".into(),
        peak_reserved_bytes: Some(30 << 30),
        peak_allocated_bytes: Some(26 << 30),
        ..Default::default()
    }];
    let job = dir.join("job.json");
    r.save(&job).unwrap();
    let j = job.to_str().unwrap();
    // 3 GPUs × 80 GiB × 0.85 = 68 GiB each: two 30 GiB jobs per GPU; 5 jobs → "2,2,1".
    let mut args = vec!["plan", "--gpus", "3", "--gpu-memory", "80GiB"];
    args.extend([j; 5]);
    let out = run_memsight(&args, None);
    assert_eq!(out.code, 0, "{}", out.err);
    assert!(out.out.starts_with("--gpu-plan \"2,2,1\""), "{}", out.out);
    assert!(
        out.out
            .contains("GPU 0: 2 job(s), 60.00 GiB of 68.00 GiB usable"),
        "{}",
        out.out
    );
    assert!(
        out.out
            .contains("limited by #1 job.json (30.00 GiB: cuda:0 peak reserved"),
        "{}",
        out.out
    );
    // Seven jobs need 4 GPUs' worth: exit 1 and say which job found no room.
    let mut args = vec!["plan", "--gpus", "3", "--gpu-memory", "80GiB"];
    args.extend([j; 7]);
    let out = run_memsight(&args, None);
    assert_eq!(out.code, 1);
    assert!(
        out.out
            .contains("no GPU has 30.00 GiB left for #7 job.json"),
        "{}",
        out.out
    );
    // Bad input.
    let bad = run_memsight(&["plan", "--gpus", "0", "--gpu-memory", "80GiB", j], None);
    assert_eq!(bad.code, 2);
    assert!(bad.err.contains("--gpus must be at least 1"), "{}", bad.err);
    std::fs::remove_dir_all(&dir).unwrap();
}
