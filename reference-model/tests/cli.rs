//! `memsight-gpt` as a user runs it: a short training run writes a report with tensor bytes from
//! the libtorch hook and a checkpoint that `generate` and `analyze` load; bad input exits 2 with a
//! one-line reason.

use std::process::Command;

fn gpt(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_memsight-gpt"))
        .args(args)
        .env("MEMSIGHT_RING", "off")
        .env_remove("MEMSIGHT_REPORT")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn train_report_checkpoint_generate_analyze() {
    let dir = std::env::temp_dir().join(format!("memsight-gpt-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let report = dir.join("r.json");
    let ckpt = dir.join("m.safetensors");
    let (code, out, err) = gpt(&[
        "train",
        "--steps",
        "6",
        "--batch-size",
        "4",
        "--seq-len",
        "64",
        "--eval-every",
        "3",
        "--report",
        report.to_str().unwrap(),
        "--save",
        ckpt.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out.trim(),
        report.to_str().unwrap(),
        "the last line is the report's path"
    );
    assert!(err.contains("memsight: libtorch-cpu on"), "{err}");
    assert!(err.contains("step     6 | val loss"), "{err}");
    let r = memsight::Report::load(&report).unwrap();
    let tensor_peak = r
        .peaks
        .tensor_peak_bytes
        .expect("tensor bytes from the libtorch hook");
    // At least the weights, gradients and two AdamW moments of 0.84 M fp32 parameters.
    assert!(tensor_peak > 4 * 842_496 * 4, "{tensor_peak}");
    for phase in ["train/forward", "train/backward", "train/optimizer", "eval"] {
        let p = r
            .phases
            .iter()
            .find(|p| p.path == phase)
            .unwrap_or_else(|| panic!("{phase}"));
        assert!(p.tensor_peak_bytes.unwrap_or(0) > 0, "{phase}");
    }
    assert!(ckpt.exists() && ckpt.with_extension("config.json").exists());

    // libtorch's tensor allocations are charged to the Rust code that asked for them.
    let heap = r.heap_profile.as_ref().expect("heap profile");
    let peak = heap.at_peak.as_ref().expect("profile at peak");
    let ours: Vec<_> = peak
        .top_sites
        .iter()
        .filter(|s| s.at.function.starts_with("memsight_gpt::"))
        .collect();
    let share: f64 = ours.iter().map(|s| s.share).sum();
    eprintln!("{}", heap.render());
    assert!(
        // The profiled peak can fall in model set-up (Linear::new, the optimizer's state) or in
        // the forward pass, depending on when the sampled peak profile is written.
        !ours.is_empty(),
        "{}",
        heap.render()
    );
    assert!(share > 0.05, "{}", heap.render());
    assert!(ours
        .iter()
        .all(|s| s.at.file.as_deref().is_some_and(|f| f.ends_with(".rs"))));

    let (code, out, err) = gpt(&[
        "generate",
        "--load",
        ckpt.to_str().unwrap(),
        "--tokens",
        "8",
        "--kv-cache",
        "grow",
        "--report",
        dir.join("g.json").to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("fn main() {"), "{out}");
    assert!(err.contains("kv cache (Grow)"), "{err}");

    let (code, _, err) = gpt(&[
        "analyze",
        "--load",
        ckpt.to_str().unwrap(),
        "--head-chunk",
        "2",
        "--sample-rows",
        "8",
        "--out",
        dir.join("maps").to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("loaded 1 of 4 blocks") && err.contains("4 heatmaps"),
        "{err}"
    );
    assert!(dir.join("maps/layer0-head3.pgm").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    for (args, want) in [
        (
            vec!["train", "--seq-len", "1"],
            "--seq-len 1 must be between 2 and the block size 128",
        ),
        (
            vec!["train", "--batch-size", "6", "--micro-batch", "4"],
            "--micro-batch 4 must divide --batch-size 6",
        ),
        (
            vec!["train", "--device", "tpu"],
            "--device tpu: expected cpu, cuda or cuda:N",
        ),
        (
            vec!["generate", "--load", "/nonexistent/m.safetensors"],
            "/nonexistent/m.config.json: No such file",
        ),
        (
            vec!["generate", "--prompt", ""],
            "--prompt must not be empty",
        ),
        (
            vec!["train", "--logits-to-keep", "200"],
            "--logits-to-keep 200 must be between 0 (all) and --seq-len 128",
        ),
        (
            vec!["train", "--vocab-size", "100"],
            "--vocab-size 100 must be at least 256",
        ),
        (
            vec!["train", "--lr", "0.001", "--min-lr", "0.01"],
            "--min-lr 0.01 must be between 0 and --lr 0.001",
        ),
        (
            vec!["train", "--init-from", "/nonexistent/m.safetensors"],
            "/nonexistent/m.config.json: No such file",
        ),
        (vec!["train", "--resume"], "--init-from <PATH.safetensors>"),
        (
            vec!["generate", "--temperature=-1"],
            "--temperature and --top-k must not be negative",
        ),
    ] {
        let (code, _, err) = gpt(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
