//! `memsight diagnose` as a user runs it: a messy training log with several OOMs, JSON output,
//! standard input, a report whose leak slope changes the verdict, and bad input.

use memsight_e2e::{run_memsight, scratch};

const FRAGMENTED: &str = "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 546.00 MiB. GPU 0 has a total capacity of 15.77 GiB of which 514.19 MiB is free. Process 562167 has 15.25 GiB memory in use. Of the allocated memory 13.73 GiB is allocated by PyTorch, with 46.00 MiB allocated in private pools (e.g., CUDA Graphs), and 736.86 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (\nhttps://pytorch.org/docs/stable/notes/cuda.html#environment-variables)";
const CONTENDED: &str = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 42.00 MiB. GPU 0 has a total capacity of 47.27 GiB of which 9.38 MiB is free. Process 3053273 has 29.04 GiB memory in use. Process 3120922 has 14.74 GiB memory in use. Including non-PyTorch memory, this process has 3.14 GiB memory in use. Of the allocated memory 2.92 GiB is allocated by PyTorch, and 34.62 MiB is reserved by PyTorch but unallocated.";
const KILLED: &str = "[18026.221140] Memory cgroup out of memory: Killed process 140339 (python3) total-vm:120832kB, anon-rss:15596kB, file-rss:8924kB, shmem-rss:0kB, UID:0 pgtables:276kB oom_score_adj:-997";
const CAPACITY: &str = "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 496.00 MiB. GPU 0 has a total capacty of 14.75 GiB of which 235.06 MiB is free. Process 20398 has 14.52 GiB memory in use. Of the allocated memory 14.06 GiB is allocated by PyTorch, and 330.42 MiB is reserved by PyTorch but unallocated.";

fn log() -> String {
    format!(
        "epoch 1 step 10 loss 2.31\n{FRAGMENTED}\nTraceback (most recent call last):\n  File \"train.py\", line 9\nstep 11 loss 2.29\n{CONTENDED}\n{KILLED}\n"
    )
}

fn diagnose(args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
    let mut a = vec!["diagnose"];
    a.extend(args);
    let r = run_memsight(&a, stdin);
    (r.code, r.out, r.err)
}

#[test]
fn a_log_with_three_ooms_gets_three_verdicts_in_order() {
    let dir = scratch("diagnose-text");
    let path = dir.join("train.log");
    std::fs::write(&path, log()).unwrap();
    let (code, out, err) = diagnose(&[path.to_str().unwrap()], None);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("3 out-of-memory messages"), "{out}");
    let verdicts: Vec<&str> = out.lines().filter(|l| l.contains("verdict:")).collect();
    assert_eq!(verdicts.len(), 3, "{out}");
    assert!(
        verdicts[0].contains("FRAGMENTATION") && verdicts[0].contains("736.86 MiB"),
        "{out}"
    );
    assert!(
        verdicts[1].contains("CONTENTION") && verdicts[1].contains("43.78 GiB"),
        "{out}"
    );
    assert!(
        verdicts[2].contains("HOST_OOM") && verdicts[2].contains("python3"),
        "{out}"
    );
    // The first remedy for fragmentation is the allocator setting, with its saving.
    let first = out
        .lines()
        .find(|l| l.trim_start().starts_with("1."))
        .unwrap();
    assert!(
        first.contains("expandable_segments:True") && first.contains("736.86 MiB"),
        "{first}"
    );
    assert!(out.contains("line 2 · torch_cuda_oom_new"), "{out}");
}

#[test]
fn json_output_has_kind_facts_verdict_and_ranked_remedies() {
    let (code, out, err) = diagnose(&["--json", "-"], Some(&log()));
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let f = v["findings"].as_array().unwrap();
    assert_eq!(f.len(), 3);
    assert_eq!(f[0]["kind"], "torch_cuda_oom_new");
    assert_eq!(f[0]["facts"]["requested_bytes"], 572522496u64);
    assert_eq!(f[0]["facts"]["private_pools_bytes"], 48234496u64);
    assert_eq!(f[0]["verdict"], "fragmentation");
    assert_eq!(f[0]["remedies"][0]["id"], "expandable_segments");
    assert_eq!(f[0]["remedies"][0]["saving_bytes"], 772653711u64);
    assert_eq!(f[1]["verdict"], "contention");
    assert_eq!(f[1]["remedies"][0]["id"], "concurrency_plan");
    assert_eq!(f[2]["kind"], "linux_oom_killer");
    assert_eq!(f[2]["facts"]["scope"], "memcg");
    assert_eq!(f[2]["verdict"], "host_oom");
}

#[test]
fn allocator_setting_already_in_effect_is_said_so() {
    let (code, out, _) = diagnose(
        &["--alloc-conf", "expandable_segments:True", "--json"],
        Some(FRAGMENTED),
    );
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let r = &v["findings"][0]["remedies"][0];
    assert_eq!(r["id"], "max_split_size_mb");
    assert!(r["action"].as_str().unwrap().contains("already set"), "{r}");
}

#[test]
fn a_report_with_a_growing_heap_turns_capacity_into_leak() {
    let dir = scratch("diagnose-leak");
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/report.example.json");
    let mut report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(example).unwrap()).unwrap();
    report["leak"]["slope_bytes_per_step"] = serde_json::json!(8.0 * 1048576.0);
    report["leak"]["confidence"] = serde_json::json!(0.97);
    let path = dir.join("report.json");
    std::fs::write(&path, report.to_string()).unwrap();

    let (code, out, _) = diagnose(&["--json"], Some(CAPACITY));
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["findings"][0]["verdict"], "capacity");

    let (code, out, err) = diagnose(&["--report", path.to_str().unwrap()], Some(CAPACITY));
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("LEAK") && out.contains("8.00 MiB per step"),
        "{out}"
    );
}

#[test]
fn no_oom_and_bad_input_have_their_own_exit_codes() {
    let (code, out, _) = diagnose(&[], Some("step 1 loss 2.3\nstep 2 loss 2.2\n"));
    assert_eq!(code, 1);
    assert!(
        out.contains("no out-of-memory message found in standard input"),
        "{out}"
    );

    let (code, _, err) = diagnose(&["/nonexistent/train.log"], None);
    assert_eq!(code, 2);
    assert!(err.contains("cannot read /nonexistent/train.log"), "{err}");

    let dir = scratch("diagnose-bad-report");
    let bad = dir.join("report.json");
    std::fs::write(&bad, "{\"schema_version\": 1").unwrap();
    let (code, _, err) = diagnose(&["--report", bad.to_str().unwrap()], Some(CAPACITY));
    assert_eq!(code, 2);
    assert!(err.starts_with("memsight diagnose: "), "{err}");

    // Binary junk around a message is tolerated.
    let mut junk = vec![0xffu8, 0xfe, 0x00, b'\n'];
    junk.extend_from_slice(KILLED.as_bytes());
    std::fs::write(dir.join("junk.log"), &junk).unwrap();
    let (code, out, _) = diagnose(&[dir.join("junk.log").to_str().unwrap()], None);
    assert_eq!(code, 0, "{out}");
}

/// 1,000 lines of ordinary training logs (progress bars, loss lines, NCCL INFO, DeepSpeed and vLLM
/// memory reports, warnings that mention memory harmlessly; the library's no-false-positive test
/// reads the same file): the binary finds no memory failure and says so with exit code 1, as a
/// file, on standard input and with `--json`.
#[test]
fn ordinary_training_logs_have_no_memory_failure_and_exit_1() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../profiler/analysis/tests/fixtures/ordinary-training.log"
    );
    let log = std::fs::read_to_string(path).unwrap();
    assert_eq!(log.lines().count(), 1000);

    let (code, out, err) = diagnose(&[path], None);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains(&format!("no out-of-memory message found in {path}")),
        "{out}"
    );
    assert!(!out.contains("verdict:"), "{out}");

    let (code, out, _) = diagnose(&[], Some(&log));
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("no out-of-memory message found in standard input"),
        "{out}"
    );

    let (code, out, err) = diagnose(&["--json", path], None);
    assert_eq!(code, 1, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v, serde_json::json!({"findings": []}), "{out}");
}

#[test]
fn json_output_holds_sizes_of_2_pow_64_bytes_and_more() {
    // 16777216.00 TiB = 2^64 bytes: past u64, which once made `--json` panic (exit 101).
    let msg = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 16777216.00 TiB. GPU 0 has a total capacity of 79.19 GiB of which 20.81 MiB is free. Including non-PyTorch memory, this process has 17179869184.00 GiB memory in use. Of the allocated memory 40.10 GiB is allocated by PyTorch, and 12.00 MiB is reserved by PyTorch but unallocated.";
    let (code, out, err) = diagnose(&["--json"], Some(msg));
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("\"requested_bytes\": 18446744073709551616"),
        "{out}"
    );
    assert!(
        out.contains("\"this_process_bytes\": 18446744073709551616"),
        "{out}"
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["findings"][0]["verdict"], "request_exceeds_device");
    assert_eq!(v["findings"][0]["remedies"][0]["id"], "fix_size");
    // The text form too.
    let (code, out, _) = diagnose(&[], Some(msg));
    assert_eq!(code, 0);
    assert!(out.contains("REQUEST_EXCEEDS_DEVICE"), "{out}");
}

/// A vLLM engine's OOM (github.com/Sandermage/genesis-vllm-patches/issues/1).
const VLLM: &str = "(EngineCore pid=229) ERROR 04-19 12:21:04 [core.py:1134] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 72.00 MiB. GPU 0 has a total capacity of 31.33 GiB of which 2.56 MiB is free. Including non-PyTorch memory, this process has 31.28 GiB memory in use. Of the allocated memory 29.83 GiB is allocated by PyTorch, with 18.00 MiB allocated in private pools (e.g., CUDA Graphs), and 711.09 MiB is reserved by PyTorch but unallocated.";

#[test]
fn remedies_are_ranked_for_the_workload_the_log_shows() {
    // vLLM: a vLLM setting first, no training changes.
    let (code, out, err) = diagnose(&["--json"], Some(VLLM));
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let f = &v["findings"][0];
    assert_eq!(f["workload"], "vllm");
    assert_eq!(f["verdict"], "fragmentation");
    assert_eq!(f["remedies"][0]["id"], "vllm_gpu_memory_utilization");
    let ids: Vec<&str> = f["remedies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert!(ids.contains(&"expandable_segments"), "{ids:?}");
    assert!(
        !ids.contains(&"checkpointing") && !ids.contains(&"micro_batch"),
        "{ids:?}"
    );
    let (_, text, _) = diagnose(&[], Some(VLLM));
    let first = text
        .lines()
        .find(|l| l.trim_start().starts_with("1."))
        .unwrap();
    assert!(first.contains("--gpu-memory-utilization"), "{first}");

    // The same kind of message in a training log: a training change first.
    let training =
        format!("  File \"train.py\", line 40, in <module>\n    loss.backward()\n{CAPACITY}\n");
    let (_, out, _) = diagnose(&["--json"], Some(&training));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["findings"][0]["workload"], "training");
    assert_eq!(v["findings"][0]["remedies"][0]["id"], "checkpointing");

    // A Rust program gets Rust remedies, not data-loader workers.
    let (_, out, _) = diagnose(
        &["--json"],
        Some("memory allocation of 23400000000 bytes failedAborted"),
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let f = &v["findings"][0];
    assert_eq!(f["workload"], "rust");
    assert_eq!(f["remedies"][0]["id"], "rust_stream");
    assert!(!out.contains("data_loader"), "{out}");
}

#[test]
fn a_memory_cgroup_kill_of_a_child_is_one_event_and_not_the_machine() {
    // github.com/apache/doris/issues/3525: the kernel selected 24984 and killed 18177.
    let log = "May  8 14:05:27 doris-03 kernel: Memory cgroup out of memory: Kill process 24984 (palo_be) score 968 or sacrifice child\nMay  8 14:05:27 doris-03 kernel: Killed process 18177 (palo_be), UID 0, total-vm:70347780kB, anon-rss:45563572kB, file-rss:0kB, shmem-rss:0kB\n";
    let (code, out, _) = diagnose(&[], Some(log));
    assert_eq!(code, 0);
    assert!(out.contains("1 out-of-memory message"), "{out}");
    assert!(
        out.contains("memory cgroup") && !out.contains("machine ran out"),
        "{out}"
    );
    assert!(out.contains("killed its child 18177"), "{out}");
}

/// The report `memsight run` wrote for tests/tests/tree_jobs/dataloader_oom.py in a 900 MiB
/// memory cgroup, whose DataLoader worker (pid 17887) the OOM killer ended; (its path, the
/// post-mortem finding's evidence).
fn worker_oom_report(name: &str) -> (String, &'static str) {
    let dir = scratch(name);
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/report.example.json");
    let mut report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(example).unwrap()).unwrap();
    let evidence = "worker (pid 17887) (1.14 GiB resident at the kill (kernel), 1.11 GiB resident at its last own sample, 106.66 MiB unique when last sampled, its own heap peak 864.60 MiB): the memory cgroup (limit 900.00 MiB) hit its limit and the kernel killed python; the machine itself may have had memory free";
    report["post_mortem"] = serde_json::json!({
        "cause": "oom_killed",
        "description": "worker (pid 17887) failed first: killed by the OOM killer at 1.14 GiB resident (the kernel's figure) at step 0 (1.14 GiB resident at the kill (kernel), 1.11 GiB resident at its last own sample, 106.66 MiB unique when last sampled, its own heap peak 864.60 MiB); then the job: exited with code 1; last sample 42 ms before the end",
        "exit_code": 1,
        "cgroup_oom_kills": 1,
        "records_dropped": 0,
        "findings": [{
            "kind": "linux_oom_killer",
            "verdict": "host_oom",
            "evidence": evidence,
            "remedies": [
                "use fewer data-loader workers and a smaller prefetch factor",
                "raise the container/cgroup memory limit, or lower host memory per process (pin_memory off, smaller shuffle buffers)"
            ]
        }]
    });
    let command = serde_json::json!(["/venv/bin/python", "dataloader_oom.py"]);
    report["processes"] = serde_json::json!([
        {"pid": 17877, "ppid": 17876, "role": "main", "command": command,
         "heap_peak_bytes": 112103424u64, "last_step": 0,
         "end": {"kind": "exited", "code": 1, "unix_ms": 1795785352700u64, "description": "exited with code 1"}},
        {"pid": 17887, "ppid": 17877, "role": "worker", "command": command,
         "heap_peak_bytes": 906601608u64, "rss_peak_bytes": 1192071168u64,
         "last_pss_bytes": 210884608u64, "last_uss_bytes": 111841280u64, "last_step": 0,
         "end": {"kind": "oom_killed", "unix_ms": 1795785351670u64, "description": "killed by the OOM killer at 1.14 GiB resident (the kernel's figure)"}}
    ]);
    report["device_ooms"] = serde_json::json!([]);
    // The job's memory cgroup, as its samples saw it: 900 MiB, reached at the kill.
    for (i, sample) in report["timeline"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .enumerate()
    {
        sample["cgroup"] = serde_json::json!({"version": 2, "usage": (800u64 << 20) + i as u64, "limit": 900u64 << 20});
    }
    let path = dir.join("r.json");
    std::fs::write(&path, report.to_string()).unwrap();
    (path.to_str().unwrap().to_string(), evidence)
}

/// A report whose DataLoader worker the OOM killer ended ([`worker_oom_report`]): `diagnose --report`
/// with no log judges its post-mortem — the verdict naming the worker, and a worker's remedies —
/// instead of finding nothing.
#[test]
fn a_report_with_an_oom_killed_worker_gets_its_verdict_and_worker_remedies() {
    let (path, evidence) = worker_oom_report("diagnose-worker-oom");
    let path = path.as_str();
    let (code, out, err) = diagnose(&["--report", path], Some(""));
    assert_eq!(code, 0, "{out}{err}");
    assert!(!out.contains("no out-of-memory"), "{out}");
    assert!(out.contains("from the report · linux_oom_killer"), "{out}");
    assert!(out.contains("HOST_OOM — worker (pid 17887)"), "{out}");
    assert!(
        out.contains("pid 17887") && out.contains("role worker"),
        "{out}"
    );
    assert!(
        out.contains("use fewer data-loader workers and a smaller prefetch factor"),
        "{out}"
    );
    assert!(out.contains("numpy arrays"), "{out}");
    assert!(out.contains("persistent_workers=True"), "{out}");

    let (code, out, err) = diagnose(&["--report", path, "--json"], Some(""));
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let f = &v["findings"][0];
    assert_eq!(f["kind"], "linux_oom_killer");
    assert_eq!(f["verdict"], "host_oom");
    assert_eq!(f["evidence"], evidence);
    assert_eq!(f["facts"]["pid"], 17887);
    assert_eq!(f["facts"]["last_uss_bytes"], 111841280u64);
    let ids: Vec<&str> = f["remedies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        [
            "data_loader",
            "worker_copy_on_read",
            "persistent_workers",
            "memory_limit"
        ]
    );
}

/// A log diagnosed with the report of the run that wrote it: the job ran under memsight, so "run
/// the job under memsight" is not among the remedies (it is without a report).
#[test]
fn a_log_diagnosed_with_its_run_s_report_is_not_told_to_run_under_memsight() {
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/report.example.json");
    let (code, out, err) = diagnose(&[], Some(KILLED));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("run the job under memsight"), "{out}");
    let (code, out, err) = diagnose(&["--report", example.to_str().unwrap()], Some(KILLED));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("verdict:"), "{out}");
    assert!(!out.contains("run the job under memsight"), "{out}");
}

/// A log whose kernel line kills a process the report's post-mortem judged (`diagnose LOG
/// --report R`): one finding, the log's line and facts joined with what only the sidecar saw — the
/// process's role, the cgroup's limit, the kernel's figure — and a worker's remedies; a kill of
/// another pid in the same log stays the log's alone.
#[test]
fn a_log_s_oom_kill_of_a_process_the_report_judged_is_joined_with_its_post_mortem() {
    let (path, evidence) = worker_oom_report("diagnose-join-log");
    let log = "step 3 loss 1.2\n[ 512.100] Memory cgroup out of memory: Killed process 17887 (python) total-vm:2811136kB, anon-rss:1164128kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:2600kB oom_score_adj:0\n[ 600.200] Out of memory: Killed process 4242 (java) total-vm:9811136kB, anon-rss:8164128kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:2600kB oom_score_adj:0\n";
    let (code, out, err) = diagnose(&["--report", &path, "--json"], Some(log));
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let found = v["findings"].as_array().unwrap();
    assert_eq!(found.len(), 2, "{out}");
    let joined = &found[0];
    assert_eq!(joined["line"], 2, "{joined}");
    assert_eq!(joined["kind"], "linux_oom_killer", "{joined}");
    assert_eq!(joined["evidence"], evidence, "{joined}");
    assert_eq!(joined["facts"]["pid"], 17887, "{joined}");
    assert_eq!(
        joined["facts"]["anon_rss_bytes"],
        1164128u64 * 1024,
        "{joined}"
    );
    assert_eq!(joined["facts"]["role"], "worker", "{joined}");
    assert_eq!(
        joined["facts"]["memory_limit_bytes"],
        900u64 << 20,
        "{joined}"
    );
    assert_eq!(joined["remedies"][0]["id"], "data_loader", "{joined}");
    let other = &found[1];
    assert_eq!(other["facts"]["pid"], 4242, "{other}");
    assert!(other["facts"].get("role").is_none(), "{other}");
    assert_ne!(other["evidence"], evidence, "{other}");

    let (code, out, _) = diagnose(&["--report", &path], Some(log));
    assert_eq!(code, 0);
    assert!(out.contains("2 out-of-memory messages"), "{out}");
    assert!(out.contains("HOST_OOM — worker (pid 17887)"), "{out}");
    assert!(
        out.contains("use fewer data-loader workers and a smaller prefetch factor"),
        "{out}"
    );
}
