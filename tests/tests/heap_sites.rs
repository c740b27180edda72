//! Allocation sites from memsight's heap sampler, end to end, in jobs linked without any feature: a
//! job with a function that holds 200 MiB at its peak and one that leaks a little each step runs
//! under `memsight run`; the report names the first as the top site (also in the flamegraph and the
//! pprof file) and the second as the site that grew; an `#[inline(never)]` function of another
//! crate is the innermost user frame of its samples, and C code's allocation (glibc's `strdup`)
//! belongs to the Rust function that called it; sampled totals are within 10% of the exact heap at
//! the peak; a SIGKILLed job still gets its sites; `memsight heap` reads the profiles and asks a
//! running job for one.

use memsight_e2e::{memsight_bin, run_memsight, scratch};
use prost::Message;
use serde_json::Value;
use std::io::Read;
use std::path::Path;
use std::process::Command;

const JOB: &str = env!("CARGO_BIN_EXE_sites_job");
const PROBE: &str = env!("CARGO_BIN_EXE_probe_sites");
const MIB: f64 = 1048576.0;

fn run_job(report: &Path, job_args: &[&str]) -> (i32, String, Value) {
    let out = Command::new(memsight_bin())
        .args(["run", "--interval", "20ms", "--report"])
        .arg(report)
        .arg("--")
        .arg(JOB)
        .args(job_args)
        .env("MEMSIGHT_HEAP_STEP_EVERY_MS", "0")
        .output()
        .expect("memsight runs");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let v: Value = serde_json::from_str(&std::fs::read_to_string(report).unwrap_or_default())
        .unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), err, v)
}

/// The pprof messages this test reads (an independent decoder: prost).
#[derive(Clone, PartialEq, Message)]
struct Profile {
    #[prost(message, repeated, tag = "1")]
    sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    sample: Vec<Sample>,
    #[prost(message, repeated, tag = "4")]
    location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    string_table: Vec<String>,
    #[prost(int64, tag = "12")]
    period: i64,
}
#[derive(Clone, PartialEq, Message)]
struct ValueType {
    #[prost(int64, tag = "1")]
    r#type: i64,
    #[prost(int64, tag = "2")]
    unit: i64,
}
#[derive(Clone, PartialEq, Message)]
struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    value: Vec<i64>,
}
#[derive(Clone, PartialEq, Message)]
struct Location {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(message, repeated, tag = "4")]
    line: Vec<Line>,
}
#[derive(Clone, PartialEq, Message)]
struct Line {
    #[prost(uint64, tag = "1")]
    function_id: u64,
    #[prost(int64, tag = "2")]
    line: i64,
}
#[derive(Clone, PartialEq, Message)]
struct Function {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(int64, tag = "2")]
    name: i64,
}

fn read_pprof(path: &Path) -> Profile {
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).expect("pprof file"))
        .read_to_end(&mut raw)
        .expect("gzip");
    Profile::decode(raw.as_slice()).expect("a pprof protobuf")
}

/// Bytes per function name in a pprof profile, counting each sample once per function in it.
fn pprof_bytes_under(p: &Profile, needle: &str) -> i64 {
    let space = p
        .sample_type
        .iter()
        .position(|t| p.string_table[t.r#type as usize] == "inuse_space")
        .expect("inuse_space");
    let name_of = |fid: u64| {
        let f = p.function.iter().find(|f| f.id == fid).expect("function");
        p.string_table[f.name as usize].as_str()
    };
    p.sample
        .iter()
        .filter(|s| {
            s.location_id.iter().any(|id| {
                let loc = p.location.iter().find(|l| l.id == *id).expect("location");
                loc.line
                    .iter()
                    .any(|l| name_of(l.function_id).contains(needle))
            })
        })
        .map(|s| s.value[space])
        .sum()
}

#[test]
fn the_report_names_the_function_holding_the_peak_and_the_one_that_leaks() {
    let dir = scratch("heap-sites");
    let report = dir.join("r.json");
    let (code, err, v) = run_job(&report, &["40"]);
    assert_eq!(code, 0, "{err}");
    let hp = &v["heap_profile"];
    let peak = &hp["at_peak"];
    let top = &peak["top_sites"][0];
    assert!(
        top["function"].as_str().unwrap().contains("hold_at_peak"),
        "{peak:#}"
    );
    let bytes = top["bytes"].as_f64().unwrap();
    // 200 MiB, estimated from 512 KiB samples of 4 MiB allocations.
    assert!((185.0 * MIB..=215.0 * MIB).contains(&bytes), "{bytes}");
    assert!(top["share"].as_f64().unwrap() > 0.8);
    assert!(top["file"].as_str().unwrap().ends_with("sites_job.rs"));

    // The flamegraph and the pprof file beside the report say the same.
    let svg = std::fs::read_to_string(dir.join(peak["flamegraph_file"].as_str().unwrap())).unwrap();
    assert!(svg.contains("hold_at_peak"));
    let pprof = read_pprof(&dir.join(peak["pprof_file"].as_str().unwrap()));
    assert_eq!(pprof.period, 524288);
    let held = pprof_bytes_under(&pprof, "hold_at_peak") as f64;
    assert!((held - bytes).abs() < 1.0 * MIB, "{held} vs {bytes}");

    // The leak view: what grew between the first and the last step profile.
    let grew = &hp["growth"]["sites"][0];
    assert!(
        grew["function"].as_str().unwrap().contains("leak_a_little"),
        "{:#}",
        hp["growth"]
    );
    // 38 steps × 256 KiB.
    let g = grew["grew_bytes"].as_f64().unwrap();
    assert!((4.0 * MIB..=16.0 * MIB).contains(&g), "{g}");
    let growth_svg =
        std::fs::read_to_string(dir.join(hp["growth"]["flamegraph_file"].as_str().unwrap()))
            .unwrap();
    assert!(growth_svg.contains("leak_a_little"));
    assert!(!growth_svg.contains("hold_at_peak"));

    // The leak tip names the site.
    let tips = v["tips"].as_array().unwrap();
    let leak = tips
        .iter()
        .find(|t| t["id"] == "leak-suspect")
        .expect("leak tip");
    assert!(
        leak["advice"].as_str().unwrap().contains("leak_a_little"),
        "{leak:#}"
    );

    // memsight heap reads the same profiles.
    let (first, out) = heap_top(&dir.join(peak["heap_file"].as_str().unwrap()));
    assert!(first.contains("hold_at_peak"), "{out}");
    let dumps = hp["dumps"].as_array().unwrap();
    let steps: Vec<_> = dumps.iter().filter(|d| d["kind"] == "step").collect();
    assert_eq!(
        steps.len(),
        2,
        "first and latest step profiles are kept: {dumps:#?}"
    );
    let a = dir.join(steps[0]["path"].as_str().unwrap());
    let b = dir.join(steps[1]["path"].as_str().unwrap());
    let r = run_memsight(
        &[
            std::ffi::OsStr::new("heap"),
            "diff".as_ref(),
            a.as_os_str(),
            b.as_os_str(),
        ],
        None,
    );
    assert_eq!(r.code, 0, "{}", r.err);
    assert!(
        r.out
            .lines()
            .nth(1)
            .unwrap_or_default()
            .contains("leak_a_little"),
        "{}",
        r.out
    );
}

/// A diff in which no site grew (a leak-free job: the usual case in CI) with `--flamegraph`: the
/// diff is still printed, the command succeeds, and the SVG asked for is written and says why it
/// has no frames (it was exit 2, "no sampled allocations to draw", with nothing printed).
#[test]
fn a_diff_where_nothing_grew_still_prints_and_draws() {
    let dir = scratch("heap-diff-flat");
    let report = dir.join("r.json");
    let (code, err, v) = run_job(&report, &["4"]);
    assert_eq!(code, 0, "{err}");
    let peak = dir.join(v["heap_profile"]["at_peak"]["heap_file"].as_str().unwrap());
    let svg = dir.join("growth.svg");
    let r = run_memsight(
        &[
            std::ffi::OsStr::new("heap"),
            "diff".as_ref(),
            peak.as_os_str(),
            peak.as_os_str(),
            "--flamegraph".as_ref(),
            svg.as_os_str(),
        ],
        None,
    );
    assert_eq!(r.code, 0, "{}", r.err);
    assert!(r.out.contains("no site grew"), "{}", r.out);
    let drawn = std::fs::read_to_string(&svg).expect("the flamegraph asked for is written");
    assert!(
        drawn.starts_with("<?xml") || drawn.starts_with("<svg"),
        "{drawn}"
    );
    assert!(drawn.contains("no site grew"), "{drawn}");
}

/// `memsight heap top PROFILE`: its first site row and its whole output.
fn heap_top(profile: &Path) -> (String, String) {
    let r = run_memsight(
        &[
            std::ffi::OsStr::new("heap"),
            "top".as_ref(),
            profile.as_os_str(),
        ],
        None,
    );
    assert_eq!(r.code, 0, "{}", r.err);
    let first = r.out.lines().nth(1).unwrap_or_default().to_string();
    (first, r.out)
}

/// The report's top sites at the peak: (function, bytes).
fn top_sites(v: &Value) -> Vec<(String, f64)> {
    v["heap_profile"]["at_peak"]["top_sites"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|s| {
                    (
                        s["function"].as_str().unwrap_or_default().to_string(),
                        s["bytes"].as_f64().unwrap_or(0.0),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_allocating_function_of_another_crate_and_c_codes_rust_caller_are_the_sites() {
    let dir = scratch("heap-sites-probe");
    let report = dir.join("r.json");
    let out = Command::new(memsight_bin())
        .args(["run", "--interval", "20ms", "--report"])
        .arg(&report)
        .args(["--", PROBE, "30"])
        .current_dir(&dir)
        .env("MEMSIGHT_HEAP_STEP_EVERY_MS", "0")
        .output()
        .expect("memsight runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let sites = top_sites(&v);
    let find = |name: &str| {
        sites
            .iter()
            .find(|(f, _)| f == name)
            .map(|(_, b)| *b)
            .unwrap_or_else(|| panic!("no site {name}: {sites:#?}"))
    };
    // The function whose code allocated, not the line that called it: the report's site is the
    // innermost user frame of the samples.
    assert_eq!(sites[0].0, "memsight_e2e::probe::hold_two_hundred_mib_here");
    assert!(
        (190.0 * MIB..=210.0 * MIB).contains(&sites[0].1),
        "{sites:#?}"
    );
    // C code's 64 MiB (strdup's malloc) belongs to the Rust function that called the C library.
    let c = find("memsight_e2e::probe::c_library_allocates_here");
    assert!((60.0 * MIB..=70.0 * MIB).contains(&c), "{sites:#?}");
    // A block made before the session started (sampling starts when the program loads), and
    // reallocated since, keeps its site.
    let before = find("probe_sites::main");
    assert!((60.0 * MIB..=70.0 * MIB).contains(&before), "{sites:#?}");
    // Sampled totals within 10% of the exact heap at the peak.
    let peak = &v["heap_profile"]["at_peak"];
    let (profiled, heap) = (
        peak["profiled_bytes"].as_f64().unwrap(),
        peak["heap_bytes"].as_f64().unwrap(),
    );
    assert!((profiled / heap - 1.0).abs() < 0.10, "{profiled} vs {heap}");
    // The leak.
    let grew = &v["heap_profile"]["growth"]["sites"][0];
    assert_eq!(grew["function"], "memsight_e2e::probe::leak_a_little_here");

    // The flamegraph: the function's frame is there, and nothing of the user's code is inside it.
    let svg = std::fs::read_to_string(dir.join(peak["flamegraph_file"].as_str().unwrap())).unwrap();
    assert!(svg.contains("memsight_e2e::probe::hold_two_hundred_mib_here"));
    assert!(svg.contains("memsight_e2e::probe::c_library_allocates_here"));
    assert!(
        svg.contains("strdup"),
        "C code's frames are in the flamegraph"
    );
    // memsight heap top: the same first site.
    let (first, out) = heap_top(&dir.join(peak["heap_file"].as_str().unwrap()));
    assert!(
        first.contains("memsight_e2e::probe::hold_two_hundred_mib_here (src/lib.rs:"),
        "{out}"
    );
}

#[test]
fn a_sigkilled_job_still_gets_its_sites() {
    let dir = scratch("heap-sites-kill");
    let report = dir.join("r.json");
    let (code, err, v) = run_job(&report, &["30", "kill"]);
    assert_eq!(code, 137, "{err}");
    let top = &v["heap_profile"]["at_peak"]["top_sites"][0];
    assert!(
        top["function"].as_str().unwrap().contains("hold_at_peak"),
        "{:#}",
        v["heap_profile"]
    );
}

#[test]
fn heap_profiling_can_be_left_off() {
    let dir = scratch("heap-sites-off");
    let report = dir.join("r.json");
    let r = run_memsight(
        &[
            "run",
            "--no-heap-profile",
            "--report",
            report.to_str().unwrap(),
            "--",
            JOB,
            "4",
        ],
        None,
    );
    assert_eq!(r.code, 0, "{}", r.err);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert!(v.get("heap_profile").is_none());
    let src = v["sources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "heap profile")
        .unwrap();
    assert!(
        src["detail"].as_str().unwrap().contains("sampling off"),
        "{src}"
    );
}

/// `MEMSIGHT_HEAP_SAMPLE` in the environment `memsight run` starts from is the job's setting, as
/// the README says (`MEMSIGHT_HEAP_SAMPLE=off` is `--no-heap-profile`); a flag given wins. `run`
/// overwrote it with `--heap-sample`'s default, 512 KiB.
#[test]
fn the_environments_heap_sample_is_kept_unless_a_flag_says_otherwise() {
    let dir = scratch("heap-sites-env");
    let report = dir.join("r.json");
    for (env, flags, says) in [
        ("off", &[][..], "sampling off"),
        ("64KiB", &[][..], "per 64.00 KiB"),
        ("off", &["--heap-sample", "1MiB"][..], "per 1.00 MiB"),
        ("64KiB", &["--no-heap-profile"][..], "sampling off"),
    ] {
        let mut args = vec!["run"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["--report", report.to_str().unwrap(), "--", JOB, "4"]);
        let r = memsight_e2e::run_memsight_env(&args, None, &[("MEMSIGHT_HEAP_SAMPLE", env)]);
        assert_eq!(r.code, 0, "{env} {flags:?}: {}", r.err);
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        let src = v["sources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == "heap profile")
            .unwrap();
        assert!(
            src["detail"].as_str().unwrap().contains(says),
            "MEMSIGHT_HEAP_SAMPLE={env} {flags:?}: {src}"
        );
    }
}

#[test]
fn a_running_job_writes_a_profile_when_asked() {
    let dir = scratch("heap-sites-ask");
    let report = dir.join("r.json");
    let mut job = Command::new(memsight_bin())
        .args(["run", "--interval", "20ms", "--report"])
        .arg(&report)
        .arg("--")
        .arg(JOB)
        .arg("300")
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("memsight runs");
    // The job is the sidecar's child: find it by its parent.
    let sidecar = job.id();
    let t = std::time::Instant::now();
    let pid = loop {
        let found = std::fs::read_to_string(format!("/proc/{sidecar}/task/{sidecar}/children"))
            .ok()
            .and_then(|c| {
                c.split_whitespace()
                    .next()
                    .and_then(|p| p.parse::<u32>().ok())
            });
        if let Some(p) = found {
            if memsight::wire::ring_of(p).is_ok() {
                break p;
            }
        }
        assert!(t.elapsed().as_secs() < 10, "the job did not start");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let r = run_memsight(&["heap", "dump", &pid.to_string()], None);
    assert_eq!(r.code, 0, "{}", r.err);
    let path = r.out.trim();
    assert!(path.ends_with("request-1.heap"), "{path}");
    let head = std::fs::read_to_string(path)
        .unwrap_or_else(|_| std::fs::read_to_string(Path::new(path)).unwrap_or_default());
    assert!(head.starts_with("heap_v2/"), "{path}");
    let r = run_memsight(&["heap", "sampling", "off", &pid.to_string()], None);
    assert_eq!(r.code, 0, "{}", r.err);
    let _ = job.wait();
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let kinds: Vec<&str> = v["heap_profile"]["dumps"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d["kind"].as_str())
        .collect();
    assert!(kinds.contains(&"request"), "{kinds:?}");
    // Sampling was switched off while it ran: no profile at the end.
    assert!(!kinds.contains(&"final"), "{kinds:?}");

    let r = run_memsight(&["heap", "dump", "999999999"], None);
    assert_eq!(r.code, 2);
    assert!(r.err.contains("999999999"), "{}", r.err);
}

#[test]
fn a_30_ms_spike_is_the_top_site_at_the_peak_under_memsight_run() {
    let dir = scratch("spike-linked");
    let report = dir.join("r.json");
    // The default interval and sampling rate: the spike lives a third of an interval.
    let out = Command::new(memsight_bin())
        .args(["run", "--report"])
        .arg(&report)
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_spike_job"))
        .output()
        .expect("memsight runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let at_peak = &v["heap_profile"]["at_peak"];
    assert_eq!(at_peak["step"], 123, "{at_peak}");
    let top = &at_peak["top_sites"][0];
    let bytes = top["bytes"].as_f64().unwrap();
    println!(
        "top site at the peak: {} {:.1} MiB",
        top["function"],
        bytes / MIB
    );
    assert!(
        top["function"]
            .as_str()
            .is_some_and(|f| f.ends_with("attention_spike")),
        "{at_peak:#}"
    );
    assert!(
        (bytes / (192.0 * MIB) - 1.0).abs() <= 0.05,
        "{:.1} MiB",
        bytes / MIB
    );
}
