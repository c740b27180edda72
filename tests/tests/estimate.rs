//! `memsight estimate` reproduces the seeds' arithmetic exactly, fits a device, and rejects bad input.

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
    ] {
        let (code, _, err) = estimate(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(msg), "{args:?}: {err}");
    }
}
