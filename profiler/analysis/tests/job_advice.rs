//! Issue 37: advice that fits the job that ran. The findings a post-mortem writes, judged with what
//! the report tells of the job (`JobContext`): no data-loader advice for a job without workers, no
//! Rust remedies for a Python job, a PyTorch CPU allocation failure with PyTorch remedies, and a
//! request larger than the machine as its own verdict. Asserted on the JSON a report carries.

use memsight_analysis::diagnose::{host_failure_kind, judge, Context, Facts, Finding, Kind};
use memsight_format::job_context::{JobContext, Language};
use serde_json::Value;

const GIB: u64 = 1 << 30;

fn python_job(torch: bool, workers: usize) -> JobContext {
    JobContext {
        language: Some(Language::Python),
        torch,
        workers: Some(workers),
        command: vec!["python3".into(), "train.py".into()],
        memory_bytes: Some(24 * GIB),
        ..JobContext::default()
    }
}

/// The finding as the post-mortem's JSON has it: kind, verdict, evidence, remedy ids.
fn judged(kind: Kind, facts: Facts, job: &JobContext) -> Value {
    let d = judge(
        Finding {
            kind,
            facts,
            line: 0,
        },
        &Context {
            job: Some(job.clone()),
            ..Context::default()
        },
    );
    serde_json::to_value(&d).unwrap()
}

fn ids(v: &Value) -> Vec<String> {
    v["remedies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_terabyte_tensor_on_the_cpu_is_pytorchs_and_can_never_fit() {
    let job = python_job(true, 0);
    let kind = host_failure_kind(&job);
    assert_eq!(kind, Kind::TorchCpuOom);
    let mut f = Facts::default();
    f.int("requested_bytes", 1u64 << 40);
    let v = judged(kind, f, &job);
    assert_eq!(v["kind"], "torch_cpu_oom", "{v}");
    assert_eq!(v["verdict"], "request_exceeds_memory", "{v}");
    let evidence = v["evidence"].as_str().unwrap();
    assert!(
        evidence.contains("1.00 TiB") && evidence.contains("24.00 GiB"),
        "{evidence}"
    );
    assert!(!evidence.contains("reached the machine"), "{evidence}");
    assert_eq!(ids(&v), ["check_size", "torch_chunk"], "{v}");
}

#[test]
fn a_request_above_the_cgroup_limit_can_never_fit_there() {
    let job = JobContext {
        limit_bytes: Some(2 * GIB),
        ..python_job(false, 0)
    };
    let mut f = Facts::default();
    f.int("requested_bytes", 3 * GIB);
    let v = judged(host_failure_kind(&job), f, &job);
    assert_eq!(v["kind"], "host_alloc_failure", "{v}");
    assert_eq!(v["verdict"], "request_exceeds_memory", "{v}");
    assert!(
        v["evidence"].as_str().unwrap().contains("cgroup's limit"),
        "{v}"
    );
}

#[test]
fn a_python_job_gets_no_rust_remedies_and_a_rust_program_keeps_them() {
    let mut f = Facts::default();
    f.int("requested_bytes", 64 << 20);
    for (job, rust) in [
        (python_job(false, 0), false),
        (python_job(true, 2), false),
        (
            JobContext {
                language: Some(Language::Rust),
                workers: Some(0),
                memory_bytes: Some(24 * GIB),
                ..JobContext::default()
            },
            true,
        ),
    ] {
        let v = judged(host_failure_kind(&job), f.clone(), &job);
        assert_eq!(v["verdict"], "host_oom", "{v}");
        let ids = ids(&v);
        assert_eq!(
            ids.iter().any(|i| i.starts_with("rust_")),
            rust,
            "{job:?}: {ids:?}"
        );
        assert_eq!(
            ids.iter().any(|i| i == "torch_host_memory"),
            job.torch,
            "{ids:?}"
        );
        assert_eq!(
            ids.iter().any(|i| i == "data_loader"),
            job.workers != Some(0),
            "{ids:?}"
        );
    }
}

#[test]
fn an_oom_kill_advises_fewer_workers_only_to_a_job_that_has_workers() {
    let kill = || {
        let mut f = Facts::default();
        f.int("pid", 4242);
        f.text("process_name", "python3");
        f.text("scope", "memcg");
        f.int("memory_limit_bytes", 256u64 << 20);
        f
    };
    let none = judged(Kind::LinuxOomKiller, kill(), &python_job(true, 0));
    assert!(!ids(&none).contains(&"data_loader".to_string()), "{none}");
    assert_eq!(ids(&none)[0], "memory_limit", "{none}");
    assert!(
        ids(&none).contains(&"torch_host_memory".to_string()),
        "{none}"
    );
    let four = judged(Kind::LinuxOomKiller, kill(), &python_job(true, 4));
    assert_eq!(ids(&four)[0], "data_loader", "{four}");
}

/// Break-it pass 8's F4: a failed host allocation under the process's address-space limit
/// (`RLIMIT_AS`) that left no room for it is the limit's doing (`allocator_limit`, raise the limit
/// or reserve less address space), not the machine's memory; with room left under the limit it
/// is judged as before.
#[test]
fn a_request_an_address_space_limit_refused_names_the_limit() {
    let job = python_job(true, 0);
    let mib = 1u64 << 20;
    let facts = |virtual_bytes: u64| {
        let mut f = Facts::default();
        f.int("requested_bytes", 128 * mib);
        f.int("address_space_limit_bytes", 3 * GIB);
        f.int("virtual_bytes", virtual_bytes);
        f
    };
    let v = judged(Kind::TorchCpuOom, facts(3 * GIB - 64 * mib), &job);
    assert_eq!(v["verdict"], "allocator_limit", "{v}");
    let evidence = v["evidence"].as_str().unwrap();
    assert!(
        evidence.contains("address-space limit") && evidence.contains("of 3.00 GiB"),
        "{evidence}"
    );
    assert_eq!(
        ids(&v),
        ["address_space_limit", "virtual_size", "torch_host_memory"],
        "{v}"
    );
    // 1 GiB mapped of 3 GiB: the limit had room, so it is not named.
    let v = judged(Kind::TorchCpuOom, facts(GIB), &job);
    assert_eq!(v["verdict"], "host_oom", "{v}");
}
