//! `memsight estimate` reproduces the seeds' arithmetic exactly, fits a device, rejects bad input,
//! and lands within ±10% of real PyTorch training steps (a quick run of
//! `scripts/estimate-validate.py`; skipped with a reason when the torch venv is missing).

use memsight_e2e::run_memsight;

fn estimate(args: &[&str]) -> (i32, String, String) {
    let mut a = vec!["estimate"];
    a.extend(args);
    let r = run_memsight(&a, None);
    (r.code, r.out, r.err)
}

fn json(args: &[&str]) -> serde_json::Value {
    let mut a = args.to_vec();
    a.push("--json");
    let (code, out, err) = estimate(&a);
    assert_eq!(code, 0, "{err}");
    serde_json::from_str::<serde_json::Value>(&out).unwrap()["estimate"].clone()
}

#[test]
fn seed_000_scores_naive_and_efficient() {
    let shape = [
        "--layers", "12", "--hidden", "768", "--heads", "12", "--seq", "2048", "--batch", "4",
        "--dtype", "fp32",
    ];
    assert_eq!(
        json(&shape)["attention_scores_bytes_per_layer"],
        805_306_368u64
    );
    let mut eff = shape.to_vec();
    eff.extend(["--attention", "efficient"]);
    assert_eq!(
        json(&eff)["attention_scores_bytes_per_layer"],
        25_165_824u64
    );
}

#[test]
fn seed_002_32k_tokens_is_128_gib_of_scores_per_layer() {
    let e = json(&[
        "--layers", "32", "--hidden", "4096", "--heads", "32", "--seq", "32768",
    ]);
    assert_eq!(e["attention_scores_bytes_per_layer"], 137_438_953_472u64);
    let (_, out, _) = estimate(&[
        "--layers", "32", "--hidden", "4096", "--heads", "32", "--seq", "32768",
    ]);
    assert!(out.contains("128.00 GiB"), "{out}");
}

#[test]
fn seeds_003_004_weights() {
    assert_eq!(
        json(&["--params", "33e9", "--dtype", "fp16"])["weights_bytes"],
        66_000_000_000u64
    );
    assert_eq!(
        json(&["--params", "1.3B", "--dtype", "bf16"])["weights_bytes"],
        2_600_000_000u64
    );
    let (_, out, _) = estimate(&["--params", "33e9", "--dtype", "fp16"]);
    assert!(out.contains("66.00 GB"), "{out}");
}

#[test]
fn the_largest_micro_batch_fits_and_one_more_does_not() {
    let base = ["--preset", "gpt2", "--device-memory", "16GiB"];
    let m = json(&base)["max_micro_batch"].as_u64().unwrap();
    assert!(m > 1);
    let fits = |b: u64| {
        let b = b.to_string();
        let mut a = base.to_vec();
        a.extend(["--batch", &b]);
        json(&a)["fits"].as_bool().unwrap()
    };
    assert!(fits(m));
    assert!(!fits(m + 1));
}

#[test]
fn bad_input_is_a_clear_error() {
    for (args, msg) in [
        (vec![], "describe the model"),
        (vec!["--preset", "gpt5"], "unknown preset `gpt5`"),
        (
            vec!["--layers", "12", "--hidden", "768"],
            "give all of --layers, --hidden and --heads",
        ),
        (
            vec!["--layers", "12", "--hidden", "770", "--heads", "12"],
            "not a multiple of --heads",
        ),
        (
            vec!["--preset", "gpt2", "--headroom", "1.5"],
            "--headroom 1.5",
        ),
        (vec!["--preset", "gpt2", "--batch", "0"], "--batch must be"),
        (vec!["--params", "lots"], "not a parameter count"),
        (vec!["--preset", "gpt2", "--quant-bits", "3"], "8 or 4"),
        (
            vec!["--preset", "gpt2", "--dropout", "1.5"],
            "--dropout 1.5",
        ),
        (
            vec!["--preset", "gpt2", "--optimizer-impl", "magic"],
            "foreach, per-tensor or fused",
        ),
        (
            vec!["--preset", "gpt2", "--device", "tpu"],
            "use cpu or cuda",
        ),
        (
            vec!["--preset", "gpt2", "--grad-accumulation", "0"],
            "--grad-accumulation must be",
        ),
    ] {
        let (code, _, err) = estimate(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(msg), "{args:?}: {err}");
    }
}

/// Runs the validation harness (`scripts/estimate-validate.py ARGS`) with the venv's `python`:
/// its output and standard output as text.
fn harness(python: &std::path::Path, args: &[&std::ffi::OsStr]) -> (std::process::Output, String) {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/estimate-validate.py");
    let out = std::process::Command::new(python)
        .arg(&script)
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out, text)
}

#[test]
fn the_estimate_is_within_10_percent_of_real_pytorch_steps() {
    let Some(python) = memsight_e2e::torch_python() else {
        println!("skipped: no torch venv (run scripts/setup.sh; make build does)");
        return;
    };
    let memsight = memsight_e2e::memsight_bin();
    let (out, text) = harness(
        &python,
        &[
            "--grid".as_ref(),
            "quick".as_ref(),
            "--memsight".as_ref(),
            memsight.as_os_str(),
        ],
    );
    println!("{text}");
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("5 of 5 within ±10%"), "{text}");
}

#[test]
fn the_harness_measures_known_tensors_exactly() {
    let Some(python) = memsight_e2e::torch_python() else {
        println!("skipped: no torch venv (run scripts/setup.sh; make build does)");
        return;
    };
    let (out, text) = harness(&python, &["--self-test".as_ref()]);
    assert!(out.status.success() && text.contains(": ok"), "{text}");
}

#[test]
fn the_loop_switches_are_inputs() {
    let base = [
        "--layers", "4", "--hidden", "256", "--heads", "8", "--vocab", "50257", "--seq", "256",
        "--batch", "4",
    ];
    let with = |extra: &[&str]| {
        let mut a = base.to_vec();
        a.extend(extra);
        json(&a)
    };
    let kept = with(&[]);
    let dropped = with(&["--drop-logits"]);
    let x = 4 * 256 * 50257u64;
    assert_eq!(kept["logits_bytes"], 16 * x);
    assert_eq!(dropped["logits_bytes"], 12 * x);
    assert_eq!(kept["peak_moment"], "loss backward start");
    // Dropout adds masks: more per layer on CPU (input dtype) than on CUDA (1-byte bools).
    let per_layer = |e: &serde_json::Value| e["activations_per_layer_bytes"].as_u64().unwrap();
    let cuda = per_layer(&with(&["--dropout", "0.1"]));
    let cpu = per_layer(&with(&["--dropout", "0.1", "--device", "cpu"]));
    assert!(per_layer(&kept) < cuda && cuda < cpu, "{cuda} {cpu}");
    // The optimizer's transient: foreach √v of every parameter, none fused.
    let p = kept["params"].as_u64().unwrap();
    assert_eq!(
        with(&["--optimizer-impl", "foreach"])["optimizer_transient_bytes"],
        4 * p
    );
    assert_eq!(
        with(&["--optimizer-impl", "fused"])["optimizer_transient_bytes"],
        0
    );
    // Accumulation keeps the gradients alive at the loss head.
    let head = |e: &serde_json::Value| {
        e["moments"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == "loss backward start")
            .unwrap()["bytes"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(
        head(&with(&["--grad-accumulation", "4"])) - head(&kept),
        kept["gradients_bytes"].as_u64().unwrap()
    );
}

#[test]
fn a_preset_keeps_its_position_table_under_seq() {
    let full = json(&["--preset", "gpt2"]);
    let short = json(&["--preset", "gpt2", "--seq", "128"]);
    assert_eq!(full["params"], 124_439_808u64);
    assert_eq!(short["params"], 124_439_808u64);
}

/// A small configuration whose largest micro-batch on a 64 MiB device (15% headroom) is 5: its
/// estimated peak is 7% under the budget and batch 6's 9% over, so a run confirms both.
#[rustfmt::skip]
const CHECKED: [&str; 16] = [
    "--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "8192", "--seq", "64",
    "--device", "cpu", "--device-memory", "64MiB", "--headroom", "0.15",
];

#[test]
fn check_batch_runs_the_largest_micro_batch_and_one_more() {
    let Some(python) = memsight_e2e::torch_python() else {
        println!("skipped: no torch venv (run scripts/setup.sh; make build does)");
        return;
    };
    let mut a = CHECKED.to_vec();
    let py = python.to_string_lossy().into_owned();
    a.extend(["--check-batch", "--python", &py, "--json"]);
    let (code, out, err) = estimate(&a);
    assert_eq!(code, 0, "{out}\n{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let largest = v["estimate"]["max_micro_batch"].as_u64().unwrap();
    let runs = v["check_batch"]["runs"].as_array().unwrap();
    println!(
        "{}",
        serde_json::to_string_pretty(&v["check_batch"]).unwrap()
    );
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0]["batch"], largest);
    assert_eq!(runs[1]["batch"], largest + 1);
    assert_eq!(runs[0]["suggested"], true);
    assert_eq!(runs[0]["fits"], true, "the suggested micro-batch must fit");
    assert_eq!(
        runs[1]["fits"], false,
        "one more is estimated 9% over the budget"
    );
    for r in runs {
        assert!(r["error"].as_f64().unwrap().abs() <= 0.10, "{r}");
        assert!(r["measured_bytes"].as_u64().unwrap() > 0);
    }
    assert_eq!(v["check_batch"]["ok"], true);
}

#[test]
fn check_batch_says_what_it_cannot_run() {
    // Each fails before anything runs (exit 2), with or without the torch venv.
    let missing = ["--check-batch", "--python", "/nonexistent/torch/bin/python"];
    for (extra, msg) in [
        (vec!["--check-batch"], "needs --device-memory"),
        (missing.to_vec(), "/nonexistent/torch/bin/python is missing"),
        (
            [missing.as_slice(), &["--logits-to-keep", "8"]].concat(),
            "cannot run this configuration (--logits-to-keep)",
        ),
        (
            [missing.as_slice(), &["--dtype", "bf16"]].concat(),
            "--dtype bf16/fp16 weights",
        ),
    ] {
        let mut a: Vec<&str> = if msg.contains("device-memory") {
            CHECKED[..12].to_vec()
        } else {
            CHECKED.to_vec()
        };
        a.extend(extra);
        let (code, out, err) = estimate(&a);
        assert_eq!(code, 2, "{a:?}: {out}{err}");
        assert!(err.contains(msg), "{a:?}: {err}");
        assert!(out.is_empty(), "nothing printed before the error: {out}");
    }
    let (code, _, err) = estimate(&["--params", "1B", "--device-memory", "8GiB", "--check-batch"]);
    assert_eq!(code, 2);
    assert!(err.contains("needs the model's shape"), "{err}");
}

#[test]
fn hf_config_counts_transformers_parameters_and_says_three_figures() {
    let cfg = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../profiler/analysis/tests/fixtures/hf-configs/llama.json"
    );
    // The count transformers builds from this config (params.json there).
    let e = json(&["--hf-config", cfg, "--seq", "128"]);
    assert_eq!(e["params"], 220_480u64);
    let f = &e["figures"];
    let fig = |k: &str| f[k].as_u64().unwrap();
    assert!(fig("allocated") <= fig("reserved") && fig("reserved") < fig("nvidia_smi"));
    let (code, out, err) = estimate(&[
        "--hf-config",
        cfg,
        "--seq",
        "128",
        "--lora-rank",
        "8",
        "--quant",
        "nf4-dq",
        "--device-memory",
        "8GiB",
    ]);
    assert_eq!(code, 0, "{err}");
    for said in [
        "ALLOCATED peak",
        "RESERVED",
        "NVIDIA-SMI shows",
        "assumptions",
        "largest micro-batch that fits",
    ] {
        assert!(out.contains(said), "no `{said}` in:\n{out}");
    }
    let (code, _, err) = estimate(&["--hf-config", cfg, "--quant", "nf4"]);
    assert_eq!(code, 2);
    assert!(err.contains("--lora-rank"), "{err}");
}

/// The bytes of the term named `name` in an `--hf-config` estimate's JSON.
fn term(e: &serde_json::Value, name: &str) -> u64 {
    e["terms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == name)
        .unwrap_or_else(|| panic!("no term `{name}` in {e}"))["bytes"]
        .as_u64()
        .unwrap()
}

#[test]
fn hf_config_quant_head_dequant_bytes_and_fused_qkv_are_flags() {
    let cfg = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../profiler/analysis/tests/fixtures/hf-configs/llama.json"
    );
    let qlora = [
        "--hf-config",
        cfg,
        "--seq",
        "128",
        "--lora-rank",
        "8",
        "--quant",
        "nf4",
    ];
    let with = |extra: &[&str]| {
        let mut a = qlora.to_vec();
        a.extend(extra);
        json(&a)
    };
    let base = with(&[]);
    let weights = "weights (with quantisation constants and adapters)";
    let dequant = "dequantised weight (largest linear)";
    // The untied head quantised like the blocks: fewer weight bytes.
    assert!(
        term(&with(&["--quant-head"]), weights) < term(&base, weights),
        "--quant-head must quantise the head"
    );
    // Quantised from fp16, run in bf16 (Lightning Fabric): the dequantised weight costs 2 + 2
    // bytes per weight where the default is 2.
    assert_eq!(
        term(&with(&["--dequant-bytes", "4"]), dequant),
        2 * term(&base, dequant)
    );
    // One LoRA dropout for q, k and v: a block keeps fewer dropped copies of its input.
    let lora_all = ["--lora-targets", "all-linear", "--lora-dropout"];
    let mut fused = lora_all.to_vec();
    fused.push("--fused-qkv");
    let kept = "activations kept";
    assert!(
        term(&with(&fused), kept) < term(&with(&lora_all), kept),
        "--fused-qkv must keep one dropped copy for q, k and v"
    );
    // The printed estimate says what the flags set.
    let mut all = qlora.to_vec();
    all.extend([
        "--quant-head",
        "--dequant-bytes",
        "4",
        "--lora-dropout",
        "--fused-qkv",
    ]);
    let (code, out, err) = estimate(&all);
    assert_eq!(code, 0, "{err}");
    for said in [
        "LM head quantised with the blocks",
        "dequantised at 4 bytes per weight",
        "q, k and v fused (one LoRA dropout)",
    ] {
        assert!(out.contains(said), "no `{said}` in:\n{out}");
    }
    // The --help text says what each flag is for.
    let (code, out, _) = estimate(&["--help"]);
    assert_eq!(code, 0);
    for said in ["--quant-head", "--dequant-bytes", "--fused-qkv", "LitGPT"] {
        assert!(out.contains(said), "no `{said}` in --help:\n{out}");
    }
    // Bad values and flags without what they describe: exit 2 with a reason, nothing printed.
    for (extra, msg) in [
        (&["--dequant-bytes", "0"][..], "byte count per weight"),
        (&["--dequant-bytes", "two"][..], "byte count per weight"),
        (&["--dequant-bytes", "9"][..], "byte count per weight"),
    ] {
        let mut a = qlora.to_vec();
        a.extend(extra);
        let (code, out, err) = estimate(&a);
        assert_eq!(code, 2, "{a:?}: {out}{err}");
        assert!(err.contains(msg), "{a:?}: {err}");
        assert!(
            out.is_empty(),
            "{a:?}: nothing printed before the error: {out}"
        );
    }
    let unquantised = [
        "--hf-config",
        cfg,
        "--lora-rank",
        "8",
        "--quant",
        "none",
        "--quant-head",
    ];
    let (code, out, err) = estimate(&unquantised);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("describe quantised weights"), "{err}");
    assert!(out.is_empty(), "nothing printed before the error: {out}");
    for (a, needs) in [
        (&["--hf-config", cfg, "--quant-head"][..], "--quant"),
        (&["--hf-config", cfg, "--dequant-bytes", "4"][..], "--quant"),
        (&["--hf-config", cfg, "--fused-qkv"][..], "--lora-rank"),
    ] {
        let (code, _, err) = estimate(a);
        assert_eq!(code, 2, "{a:?}: {err}");
        assert!(err.contains(needs), "{a:?}: {err}");
    }
}

/// `--lora-targets` names that match no module of the model (a typo) are refused, with the names
/// the model has, as peft refuses them; it was an estimate of 0 trainable parameters, exit 0. A
/// list where some names match estimates those and says which names matched nothing.
#[test]
fn lora_targets_that_match_no_module_are_said() {
    let cfg = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../profiler/analysis/tests/fixtures/hf-configs/llama.json"
    );
    let (code, out, err) = estimate(&[
        "--hf-config",
        cfg,
        "--lora-rank",
        "16",
        "--lora-targets",
        "q_prj",
    ]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("q_prj"), "{err}");
    assert!(err.contains("q_proj"), "the model's own names: {err}");
    assert!(out.is_empty(), "nothing printed before the error: {out}");

    let (code, out, err) = estimate(&[
        "--hf-config",
        cfg,
        "--lora-rank",
        "16",
        "--lora-targets",
        "q_proj,v_prj",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("v_prj"), "{err}");
    let only_q = json(&[
        "--hf-config",
        cfg,
        "--lora-rank",
        "16",
        "--lora-targets",
        "q_proj",
    ]);
    let (_, json_out, _) = estimate(&[
        "--hf-config",
        cfg,
        "--lora-rank",
        "16",
        "--lora-targets",
        "q_proj,v_prj",
        "--json",
    ]);
    let with_typo =
        serde_json::from_str::<serde_json::Value>(&json_out).unwrap()["estimate"].clone();
    assert_eq!(only_q, with_typo, "the names that match are estimated");
    assert!(!out.is_empty());
}
