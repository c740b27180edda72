//! The "done when": an external binary using only the public contract reports its known
//! peak within 1%, sees a C malloc in jemalloc's statistics, returns to baseline, and its report
//! passes `memsight check` just above its peak and fails just below. Also the CLI's bad-input path.

use memsight_e2e::{memsight_bin, run_memsight, scratch};
use std::collections::HashMap;
use std::process::Command;

fn run_job(report: &std::path::Path) -> HashMap<String, i64> {
    let out = Command::new(env!("CARGO_BIN_EXE_contract_job"))
        .arg(report)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "job failed:\n{stdout}\n{stderr}");
    // The snapshot block a person sees at start and end.
    assert!(
        stderr.contains("Allocated")
            && stderr.contains("System RSS")
            && stderr.contains("Available"),
        "{stderr}"
    );
    assert!(stderr.contains("report written to"), "{stderr}");
    stdout
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.parse().unwrap()))
        .collect()
}

fn check(report: &std::path::Path, args: &[&str]) -> (i32, String, String) {
    let mut a = vec![std::ffi::OsStr::new("check"), report.as_os_str()];
    a.extend(args.iter().map(std::ffi::OsStr::new));
    let r = run_memsight(&a, None);
    (r.code, r.out, r.err)
}

#[test]
fn contract_job_peak_malloc_baseline_and_budget_gate() {
    let dir = scratch("contract");
    let report = dir.join("report.json");
    let v = run_job(&report);
    let mib100 = 100i64 << 20;

    let held = v["live_with_100MiB"] - v["baseline_live"];
    assert!((held - mib100).abs() < mib100 / 100, "live grew by {held}");
    let peak = v["peak_after_100MiB"] - v["baseline_live"];
    assert!(
        (peak - mib100).abs() < mib100 / 100,
        "peak above baseline {peak} not within 1% of 100 MiB"
    );
    // jemalloc's `stats.allocated` counts objects resting in thread caches as allocated, so a
    // cache flush between the two reads moves it by a few KiB either way.
    assert!(
        v["jemalloc_allocated_delta_malloc"] >= (64 << 20) - (64 << 10),
        "C malloc not in jemalloc stats: {v:?}"
    );
    assert!(
        v["jemalloc_allocated_delta_free"] < 1 << 20,
        "C free not in jemalloc stats: {v:?}"
    );
    assert!(
        (v["final_live"] - v["baseline_live"]).abs() < 64 << 10,
        "no return to baseline: {v:?}"
    );

    let r = memsight::Report::load(&report).unwrap();
    assert_eq!(r.peaks.heap_peak_bytes as i64, v["report_peak"]);
    // `reset_peak()` before `finish()` resets what the program reads, never the report's peak.
    assert!(
        v["peak_after_reset"] - v["baseline_live"] < 1 << 20,
        "reset_peak did not reset the peak the program reads: {v:?}"
    );
    let reported = v["report_peak"] - v["baseline_live"];
    assert!(
        (reported - mib100).abs() < mib100 / 100,
        "report peak above baseline {reported} not within 1% of 100 MiB after reset_peak"
    );
    assert_eq!(r.peaks.heap_peak_step, Some(1));
    assert_eq!(r.peaks.heap_peak_phase.as_deref(), Some("hold-100MiB"));
    // The sampler saw the C malloc too.
    assert!(r
        .timeline
        .iter()
        .any(|s| s.jemalloc.is_some_and(|j| j.allocated >= 64 << 20)));

    let p = r.peaks.heap_peak_bytes;
    let above = format!("{}", p + p / 100);
    let below = format!("{}", p - p / 100);
    let (code, out, _) = check(&report, &["--max-host-peak", &above]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("every budget holds"));
    let (code, out, _) = check(&report, &["--max-host-peak", &below]);
    assert_eq!(code, 1);
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(
        out.starts_with("host peak 1")
            && out.contains("exceeds budget")
            && out.contains("(peaked at step 1, phase hold-100MiB)"),
        "{out}"
    );

    // The same budgets from a file, with a flag overriding one of them.
    let budget = dir.join("budget.toml");
    std::fs::write(
        &budget,
        format!("version = 1\nmax_host_peak = \"{below}\"\nmax_rss_peak = \"64GiB\"\n"),
    )
    .unwrap();
    assert_eq!(check(&report, &["--budget", budget.to_str().unwrap()]).0, 1);
    assert_eq!(
        check(
            &report,
            &[
                "--budget",
                budget.to_str().unwrap(),
                "--max-host-peak",
                &above
            ]
        )
        .0,
        0
    );

    // Summaries a CI step would publish.
    let md = Command::new(memsight_bin())
        .args(["summary", "--format", "markdown"])
        .arg(&report)
        .output()
        .unwrap();
    let md = String::from_utf8(md.stdout).unwrap();
    assert!(
        md.contains("| process heap | 100.") && md.contains("hold-100MiB"),
        "{md}"
    );
    let svg = dir.join("t.svg");
    let st = Command::new(memsight_bin())
        .args(["summary", "--format", "svg", "-o"])
        .arg(&svg)
        .arg(&report)
        .status()
        .unwrap();
    assert!(st.success());
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("polyline") && svg.contains("process heap"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn check_gives_exit_2_and_a_clear_message_on_bad_input() {
    let dir = scratch("badinput");
    let cases: Vec<(&str, &[u8], &str)> = vec![
        ("truncated.json", b"{\"schema_version\": 1, \"job\": {", "truncated report: the JSON ends early"),
        ("garbage.json", b"\x00\x01garbage", "not a JSON report"),
        ("v9.json", b"{\"schema_version\": 9}", "report schema version 9 is not supported by this memsight (reads version 1); upgrade memsight"),
    ];
    for (name, body, msg) in cases {
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        let (code, out, err) = check(&p, &["--max-host-peak", "1GiB"]);
        assert_eq!(code, 2, "{name}: {out}{err}");
        assert!(
            err.starts_with("memsight check: ") && err.contains(msg),
            "{name}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
    let (code, _, err) = check(&dir.join("missing.json"), &["--max-host-peak", "1GiB"]);
    assert_eq!(code, 2);
    assert!(err.contains("No such file or directory"), "{err}");
    let (code, _, err) = check(&dir.join("missing.json"), &["--max-host-peak", "lots"]);
    assert_eq!(code, 2);
    assert!(err.contains("invalid size \"lots\""), "{err}");
    let (code, _, err) = check(&dir.join("missing.json"), &[]);
    assert_eq!(code, 2);
    assert!(err.contains("no budget given"), "{err}");
    let bad_budget = dir.join("b.toml");
    std::fs::write(&bad_budget, "version = 1\nmax_heap = \"1GiB\"\n").unwrap();
    let (code, _, err) = check(
        &dir.join("missing.json"),
        &["--budget", bad_budget.to_str().unwrap()],
    );
    assert_eq!(code, 2);
    assert!(err.contains("unknown field `max_heap`"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn help_describes_the_command_as_it_is() {
    let r = run_memsight(&["--help"], None);
    assert_eq!(r.code, 0, "{}", r.err);
    assert!(!r.out.contains("later"), "{}", r.out);
    for verb in ["run", "attach", "view", "top", "check", "diagnose", "merge"] {
        assert!(
            r.out.lines().any(|l| l.trim_start().starts_with(verb)),
            "{verb} not in\n{}",
            r.out
        );
    }
}

#[test]
fn a_run_says_where_its_report_went_once() {
    let dir = scratch("said-once");
    let report = dir.join("r.json");
    let r = run_memsight(
        &[
            "run",
            "--report",
            report.to_str().unwrap(),
            "--",
            env!("CARGO_BIN_EXE_stepping_job"),
            "exit",
            "0",
            "3",
        ],
        None,
    );
    assert_eq!(r.code, 0, "{}", r.err);
    assert_eq!(r.err.matches("report written to").count(), 1, "{}", r.err);
}
