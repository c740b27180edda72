//! `memsight run --cupti`: the device memory of a program that does not link memsight, whatever
//! library allocates it, through CUPTI's driver-API callbacks (the CUDA driver loads the preloaded
//! library as its injection library). Without a GPU, what can be checked is how the job is set up;
//! the measurement itself runs an unmodified candle training program (integrations/candle-probe,
//! built where a CUDA toolkit is and named by `MEMSIGHT_CANDLE_PROBE`) and skips, saying why,
//! without a GPU or that program.

use memsight_e2e::{preload_built, run_memsight, scratch};
use serde_json::Value;
use std::path::PathBuf;

const MIB: u64 = 1 << 20;

#[test]
fn cupti_names_the_preloaded_library_as_cudas_injection_library_and_never_overrides_another() {
    if !preload_built() {
        return;
    }
    let dir = scratch("cupti-env");
    let report = dir.join("r.json");
    let show = ["sh", "-c", "printf '%s' \"$CUDA_INJECTION64_PATH\""];
    let mut args = vec!["run", "--cupti", "--report", report.to_str().unwrap(), "--"];
    args.extend(show);
    let r = run_memsight(&args, None);
    assert_eq!(r.code, 0, "{}{}", r.out, r.err);
    assert!(
        r.out.ends_with("libmemsight_preload.so"),
        "the job's CUDA_INJECTION64_PATH: {:?}",
        r.out
    );

    // Without --cupti nothing is injected: CUPTI has one subscriber per process, which PyTorch's
    // profiler wants.
    let mut plain = vec!["run", "--report", report.to_str().unwrap(), "--"];
    plain.extend(show);
    let r = run_memsight(&plain, None);
    assert_eq!((r.code, r.out.as_str()), (0, ""), "{}", r.err);

    // A profiler's own injection library is left in place, and the user told why.
    let out = std::process::Command::new(memsight_e2e::memsight_bin())
        .args(&args)
        .env(
            "CUDA_INJECTION64_PATH",
            "/opt/nsight/libToolsInjection64.so",
        )
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(stdout, "/opt/nsight/libToolsInjection64.so");
    assert!(
        stderr.contains("CUDA_INJECTION64_PATH is already set"),
        "{stderr}"
    );

    // --cupti works through the preloaded library: with --no-preload it is refused.
    let r = run_memsight(&["run", "--cupti", "--no-preload", "--", "true"], None);
    assert_eq!(r.code, 2, "{}{}", r.out, r.err);
    assert!(r.err.contains("--no-preload"), "{}", r.err);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The candle program and a GPU, or why the measurement cannot run here.
fn candle_on_a_gpu() -> Option<PathBuf> {
    let Some(probe) = std::env::var_os("MEMSIGHT_CANDLE_PROBE").map(PathBuf::from) else {
        println!(
            "SKIP: MEMSIGHT_CANDLE_PROBE is not set (build integrations/candle-probe where a CUDA \
             toolkit is; docs/gpu.md)"
        );
        return None;
    };
    let gpu = std::process::Command::new("nvidia-smi")
        .arg("-L")
        .output()
        .is_ok_and(|o| o.status.success() && !o.stdout.is_empty());
    if !gpu {
        println!("SKIP: no NVIDIA GPU here (nvidia-smi -L lists none)");
        return None;
    }
    Some(probe)
}

/// The `cupti` backend's reserved bytes on cuda:0 in each sample of the report's timeline.
fn cupti_series(report: &Value) -> Vec<u64> {
    report["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| {
            s["devices"].as_array()?.iter().find_map(|d| {
                (d["backend"] == "cupti" && d["index"] == 0)
                    .then(|| d["reserved_bytes"].as_u64())?
            })
        })
        .collect()
}

#[test]
fn an_unmodified_candle_program_has_its_device_memory_counted_through_cupti() {
    if !preload_built() {
        return;
    }
    let Some(probe) = candle_on_a_gpu() else {
        return;
    };
    let dir = scratch("cupti-candle");
    let report = dir.join("r.json");
    // Batches 256, 512, 1024 (doubling every 10 steps) through an MLP 1024 → 4096 → 1024 with AdamW.
    let r = run_memsight(
        &[
            "run".as_ref(),
            "--cupti".as_ref(),
            "--interval".as_ref(),
            "50ms".as_ref(),
            "--report".as_ref(),
            report.as_os_str(),
            "--".as_ref(),
            probe.as_os_str(),
            "--steps".as_ref(),
            "30".as_ref(),
        ],
        None,
    );
    assert_eq!(r.code, 0, "{}{}", r.out, r.err);
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let source = report["sources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "cupti")
        .unwrap_or_else(|| panic!("no cupti source: {}", report["sources"]));
    assert_eq!(source["available"], true, "{source}");
    let peak = report["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["backend"] == "cupti")
        .and_then(|d| d["peak_reserved_bytes"].as_u64())
        .unwrap_or_else(|| panic!("no cupti device peak: {}", report["devices"]));
    // Weights, gradients and AdamW's two moments: 4 × 8.4 M fp32 values = 134 MB, before any
    // activation; a whole H100 is far more than this program can hold.
    assert!(
        (128 * MIB..4096 * MIB).contains(&peak),
        "cupti peak {} MiB",
        peak / MIB
    );
    let series = cupti_series(&report);
    assert!(series.len() >= 6, "{} cupti samples", series.len());
    let third = series.len() / 3;
    let first = series[..third].iter().max().unwrap();
    let last = series[2 * third..].iter().max().unwrap();
    assert!(
        last > first,
        "the batch doubled twice but the driver-level count did not grow: {} → {} MiB",
        first / MIB,
        last / MIB
    );
    println!(
        "cupti: peak {} MiB, first third at most {} MiB, last third at most {} MiB, {} samples",
        peak / MIB,
        first / MIB,
        last / MIB,
        series.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
