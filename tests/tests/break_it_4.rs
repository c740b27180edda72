//! Break-it pass 4 (a demanding new user, docs/reliability.md): `memsight estimate`'s fit line
//! says whether the model fits, and sizes beyond what 64 bits hold, or a device of no memory, are
//! refused rather than printed as figures.

use memsight_e2e::run_memsight;

fn estimate(args: &[&str]) -> (i32, String, String) {
    let mut a = vec!["estimate"];
    a.extend(args);
    let r = run_memsight(&a, None);
    (r.code, r.out, r.err)
}

const GPT2: [&str; 6] = ["--layers", "12", "--hidden", "768", "--heads", "12"];

#[test]
fn the_fit_line_says_fits_or_not_and_the_margin_in_percent() {
    let mut fits = GPT2.to_vec();
    fits.extend(["--device-memory", "16GiB"]);
    let (code, out, err) = estimate(&fits);
    assert_eq!(code, 0, "{err}");
    let line = out
        .lines()
        .find(|l| l.contains("device 16.00 GiB"))
        .unwrap_or_default();
    assert!(
        line.contains("15% headroom: fits · largest micro-batch that fits: ")
            && line.contains("(keeping 1.5% more for the estimate's own error)"),
        "{line}"
    );
    let mut small = GPT2.to_vec();
    small.extend(["--device-memory", "1GiB"]);
    let (_, out, _) = estimate(&small);
    assert!(
        out.contains("headroom: does NOT fit · largest micro-batch that fits: 0"),
        "{out}"
    );
}

#[test]
fn a_device_of_no_memory_is_refused() {
    let mut a = GPT2.to_vec();
    a.extend(["--device-memory", "0"]);
    let (code, _, err) = estimate(&a);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--device-memory must be more than 0"), "{err}");
}

#[test]
fn sizes_beyond_64_bits_are_refused_not_printed_as_16_eib() {
    let cases: [&[&str]; 2] = [
        &[
            "--layers", "1000000", "--hidden", "1000000", "--heads", "1000",
        ],
        &[
            "--layers",
            "12",
            "--hidden",
            "768",
            "--heads",
            "12",
            "--seq",
            "100000000",
            "--batch",
            "100000000",
            "--attention",
            "efficient",
        ],
    ];
    for args in cases {
        for json in [false, true] {
            let mut a = args.to_vec();
            if json {
                a.push("--json");
            }
            let (code, out, err) = estimate(&a);
            assert_eq!(code, 2, "{args:?}: {out}{err}");
            assert!(err.contains("more than 16 EiB"), "{err}");
            assert!(
                !out.contains("16.00 EiB") && !out.contains("18446744073709551615"),
                "{out}"
            );
        }
    }
    // The same through --hf-config: the sequence and batch of a real config.
    let dir = std::env::temp_dir().join(format!("memsight-break-it-4-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("config.json");
    std::fs::write(
        &cfg,
        r#"{"architectures":["LlamaForCausalLM"],"model_type":"llama","vocab_size":32000,
           "hidden_size":4096,"intermediate_size":11008,"num_hidden_layers":32,
           "num_attention_heads":32}"#,
    )
    .unwrap();
    let cfg = cfg.to_str().unwrap();
    for json in [false, true] {
        let mut a = vec![
            "--hf-config",
            cfg,
            "--seq",
            "100000000",
            "--batch",
            "100000000",
        ];
        if json {
            a.push("--json");
        }
        let (code, out, err) = estimate(&a);
        assert_eq!(code, 2, "{out}{err}");
        assert!(err.contains("more than 16 EiB"), "{err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `memsight top` (no terminal here: it says it cannot open one once it found the sidecar, and
/// "no sidecar" when it did not) of `pid`.
fn top_says(pid: u32) -> String {
    let r = run_memsight(&["top", &pid.to_string()], None);
    r.err
}

/// `memsight run … &` then `memsight top $!`: `$!` is memsight's own pid, and the sidecar is
/// named by the job's first process, its child — `top` said "no sidecar".
#[test]
fn top_with_the_pid_of_memsight_run_itself_opens_its_job() {
    let dir = std::env::temp_dir().join(format!("memsight-break-it-4-top-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut run = std::process::Command::new(memsight_e2e::memsight_bin())
        .args(["run", "--report"])
        .arg(dir.join("r.json"))
        .args(["--", "sleep", "600"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let children = format!("/proc/{0}/task/{0}/children", run.id());
    let job = || {
        std::fs::read_to_string(&children)
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
    };
    // The job's own pid opens its sidecar once the sidecar is up.
    let up = memsight_e2e::wait_until(60, || {
        job().is_some_and(|j| top_says(j).contains("cannot open the terminal"))
    });
    let said = top_says(run.id());
    if let Some(j) = job() {
        // SAFETY: ending the job this test started.
        unsafe { libc::kill(j as i32, libc::SIGKILL) };
    }
    let _ = run.wait();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(up, "the job's sidecar never came up");
    assert!(said.contains("cannot open the terminal"), "{said}");
}

/// A job of one process: the summary's tree total said "total (1 processes)".
#[test]
fn a_one_process_tree_total_says_one_process() {
    let dir = std::env::temp_dir().join(format!("memsight-break-it-4-sum-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let r = dir.join("r.json");
    let r = r.to_str().unwrap();
    let run = run_memsight(&["run", "--report", r, "--", "sleep", "0.5"], None);
    assert_eq!(run.code, 0, "{}", run.err);
    let md = run_memsight(&["summary", r, "--format", "markdown"], None);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(md.code, 0, "{}", md.err);
    assert!(md.out.contains("**total (1 process)**"), "{}", md.out);
}

/// `plan --gpus 18446744073709551615` panicked (`capacity overflow`: the plan holds every GPU);
/// a count past one machine's is refused with the reason.
#[test]
fn plan_refuses_a_gpu_count_past_one_machine_without_a_panic() {
    use memsight::devices::DevicePeak;
    use memsight::Report;
    let dir = std::env::temp_dir().join(format!("memsight-break-it-4-plan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tui/tests/fixtures/gpt-report.json");
    let mut r = Report::load(&fixture).unwrap();
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
    for gpus in ["18446744073709551615", "100000000000"] {
        let out = run_memsight(&["plan", "--gpus", gpus, "--gpu-memory", "80GiB", j], None);
        assert_eq!(out.code, 2, "{gpus}: {}{}", out.out, out.err);
        assert!(out.err.contains("the plan lists every GPU"), "{}", out.err);
    }
    let out = run_memsight(
        &["plan", "--gpus", "65536", "--gpu-memory", "80GiB", j],
        None,
    );
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(out.code, 0, "{}", out.err);
}
