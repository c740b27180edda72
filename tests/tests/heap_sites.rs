//! Allocation sites from jemalloc's heap profiler, end to end: a job with a function that holds
//! 200 MiB at its peak and one that leaks a little each step runs under `memsight run`; the report
//! names the first as the top site (also in the flamegraph and the pprof file) and the second as
//! the site that grew; a SIGKILLed job still gets its sites; `memsight heap` reads the profiles and
//! asks a running job for one.

use memsight_e2e::{memsight_bin, run_memsight, scratch};
use prost::Message;
use serde_json::Value;
use std::io::Read;
use std::path::Path;
use std::process::Command;

const JOB: &str = env!("CARGO_BIN_EXE_sites_job");
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
    let peak_heap = dir.join(peak["heap_file"].as_str().unwrap());
    let r = run_memsight(
        &[
            std::ffi::OsStr::new("heap"),
            "top".as_ref(),
            peak_heap.as_os_str(),
        ],
        None,
    );
    assert_eq!(r.code, 0, "{}", r.err);
    let first = r.out.lines().nth(1).unwrap_or_default();
    assert!(first.contains("hold_at_peak"), "{}", r.out);
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
