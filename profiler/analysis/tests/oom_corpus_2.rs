//! Issue 39: memory failures recognised whatever wrote them. `fixtures/oom-corpus-2` holds real
//! messages split by a seeded hash of their id into a tuning half, checked exactly here, and a
//! held-out half, checked against the issue's thresholds (found, every fact, verdict). Also: every
//! family the issue names is found with facts and a verdict, and a thousand lines of ordinary
//! training logs hold no memory failure.

use memsight_analysis::diagnose::{diagnose, find_ooms, Context};
use serde_json::{json, Value};
use std::path::PathBuf;

fn cases(half: &str) -> Vec<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/oom-corpus-2")
        .join(format!("{half}.jsonl"));
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// How one case fares: found (a finding of its kind), every fact (exactly one finding, its facts
/// equal), verdict (the first finding's verdict, workload and first remedy, where named); a
/// negative case (kind `none`) is found, with every fact, when there is no finding at all.
struct Outcome {
    found: bool,
    facts: bool,
    verdict: Option<bool>,
    detail: String,
}

fn outcome(case: &Value) -> Outcome {
    let text = case["text"].as_str().unwrap();
    let found: Vec<Value> = diagnose(text, &Context::default())
        .iter()
        .map(|d| serde_json::from_str(&serde_json::to_string(d).unwrap()).unwrap())
        .collect();
    // A negative case (kind `none`: a text that looks like a memory failure and is not one) is
    // found, with every fact, when the reader reports nothing for it.
    let negative = case["kind"] == "none";
    let of_kind = (negative && found.is_empty()) || found.iter().any(|d| d["kind"] == case["kind"]);
    let facts = (negative && found.is_empty())
        || (found.len() == 1
            && found[0]["kind"] == case["kind"]
            && found[0]["facts"] == case["expected"]);
    let verdict = ["verdict", "workload", "first_remedy"]
        .iter()
        .any(|w| case.get(*w).is_some())
        .then(|| {
            found.first().is_some_and(|d| {
                [
                    ("verdict", &d["verdict"]),
                    ("workload", &d["workload"]),
                    ("first_remedy", &d["remedies"][0]["id"]),
                ]
                .iter()
                .all(|(w, got)| case.get(*w).is_none_or(|want| want == *got))
            })
        });
    let got: Vec<String> = found
        .iter()
        .map(|d| format!("{} {} {}", d["kind"], d["facts"], d["verdict"]))
        .collect();
    Outcome {
        found: of_kind,
        facts,
        verdict,
        detail: format!(
            "{}: got {got:?}, expected {} {} {}",
            case["id"], case["kind"], case["expected"], case["verdict"]
        ),
    }
}

#[test]
fn the_tuning_half_gets_every_fact_and_verdict() {
    let cases = cases("tune");
    let outcomes: Vec<Outcome> = cases.iter().map(outcome).collect();
    println!("{}", figures("tune", &outcomes));
    let wrong: Vec<String> = outcomes
        .into_iter()
        .filter(|o| !o.found || !o.facts || o.verdict == Some(false))
        .map(|o| o.detail)
        .collect();
    assert!(cases.len() >= 60, "only {} tuning cases", cases.len());
    assert!(
        wrong.is_empty(),
        "{} wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

#[test]
fn the_held_out_half_meets_the_issue_thresholds() {
    meets_thresholds(&["heldout"]);
}

/// The blind sets (49 and 22 messages written after the first held-out measurement, then 8, 9,
/// 13, 8 and 8, each measured once before the reader saw them) meet the same thresholds; the five
/// small ones together.
#[test]
fn the_blind_sets_meet_the_issue_thresholds() {
    meets_thresholds(&["blind"]);
    meets_thresholds(&["blind-2"]);
    meets_thresholds(&["blind-3", "blind-4", "blind-5", "blind-6", "blind-7"]);
}

/// Blind sets 8 (61 messages), 9 (63) and 10 (81), each committed before the reader ever ran on
/// them: measured and printed (found, every fact, verdicts, and each miss), not asserted.
#[test]
fn the_eighth_to_tenth_blind_sets_are_measured() {
    for file in ["blind-8", "blind-9", "blind-10"] {
        let outcomes: Vec<Outcome> = cases(file).iter().map(outcome).collect();
        println!("{}", figures(file, &outcomes));
        for o in outcomes
            .iter()
            .filter(|o| !o.found || !o.facts || o.verdict == Some(false))
        {
            println!(
                "miss [found {} facts {} verdict {:?}] {}",
                o.found, o.facts, o.verdict, o.detail
            );
        }
    }
}

/// What a blind set's tuning half is held to once its misses were fixed: every message found with
/// exactly its facts, or (set 13, whose last facts were judged label questions) every message
/// found and at least this share of them with exactly their facts.
#[derive(Clone, Copy)]
enum TuningBar {
    EveryFact,
    FoundAndFacts(f64),
}

/// Blind set `set` (committed before the reader ran on it), split by
/// `fnv1a64("issue39-blind{set}:" + id)` (odd: held out) into `blind-{set}-tune.jsonl` and
/// `blind-{set}-heldout.jsonl`: checks each case sits in the half its seeded hash names, measures
/// and prints both halves (figures and every miss) and only then holds the tuning half to `bar`;
/// the held-out half is only measured, so that it stays a measurement rather than a target.
fn blind_set_is_split_by_its_seed_and_measured(set: u32, bar: TuningBar) {
    let mut tuning_misses: Vec<String> = Vec::new();
    for (half, odd) in [("tune", false), ("heldout", true)] {
        let file = format!("blind-{set}-{half}");
        let cases = cases(&file);
        assert!(!cases.is_empty(), "{file} has no cases");
        for c in &cases {
            let id = c["id"].as_str().unwrap();
            assert_eq!(
                fnv1a(&format!("issue39-blind{set}:{id}")) % 2 == 1,
                odd,
                "{id} is in {file}"
            );
        }
        let outcomes: Vec<Outcome> = cases.iter().map(outcome).collect();
        println!("{}", figures(&file, &outcomes));
        for o in outcomes
            .iter()
            .filter(|o| !o.found || !o.facts || o.verdict == Some(false))
        {
            println!(
                "miss {file} [found {} facts {} verdict {:?}] {}",
                o.found, o.facts, o.verdict, o.detail
            );
        }
        if odd {
            continue;
        }
        match bar {
            TuningBar::EveryFact => tuning_misses.extend(
                outcomes
                    .iter()
                    .filter(|o| !o.found || !o.facts)
                    .map(|o| o.detail.clone()),
            ),
            TuningBar::FoundAndFacts(share) => {
                tuning_misses.extend(
                    outcomes
                        .iter()
                        .filter(|o| !o.found)
                        .map(|o| o.detail.clone()),
                );
                let facts = outcomes.iter().filter(|o| o.facts).count() as f64;
                if facts / (outcomes.len() as f64) < share {
                    tuning_misses.push(format!(
                        "{file}: every fact in {facts} of {}, below {share}",
                        outcomes.len()
                    ));
                }
            }
        }
    }
    // Both halves are printed before the tuning half is checked, so that a run on a reader that
    // misses tuning cases still measures the held-out half.
    assert!(tuning_misses.is_empty(), "{}", tuning_misses.join("\n"));
}

/// Blind set 11's tuning-half wordings, one mechanism each, from their real messages (ids in
/// `blind-11-tune.jsonl`).
#[test]
fn blind_set_eleven_wordings_keep_their_facts() {
    // diffusers-8358: XLA's PJRT client on TPU.
    let (kind, facts, verdict, _) = one("#XlaRuntimeError: RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to allocate 4.39G. That was not possible. There are 2.30G free.; (0x0x0_HBM0)");
    assert_eq!(
        (kind.as_str(), verdict.as_str()),
        ("jax_xla_oom", "capacity")
    );
    assert_eq!(
        facts,
        json!({"requested_bytes": 4713726607_i64, "free_bytes": 2469606195_i64})
    );
    // seurat-9901: a word between the modal and `allocate`.
    let (kind, facts, verdict, _) =
        one("0 % ~calculating error: cannot not allocate vector of size 847.6 Gb");
    assert_eq!(
        (kind.as_str(), verdict.as_str()),
        ("generic_oom", "host_oom")
    );
    assert_eq!(facts, json!({"requested_bytes": 910103570022_i64}));
    // crc-353: PHP's request wrapped onto the next line as a parenthesized clause.
    let (_, facts, _, _) = one("Fatal error: Allowed memory size of 134217728 bytes exhausted\n(tried to allocate 20480 bytes) in\n/home/username/myproject/vendor/nikic/php-parser/lib/PhpParser/Lexer.php on line 88");
    assert_eq!(
        facts,
        json!({"memory_limit_bytes": 134217728, "requested_bytes": 20480})
    );
    // cryostat-716: a pod YAML's spec (limits, requests) before its status.
    let (_, facts, _, _) = one("  containers:\n    - resources:\n        limits:\n          cpu: '1'\n          memory: 256Mi\n        requests:\n          cpu: 100m\n          memory: 64Mi\n....\nlastState:\n        terminated:\n          exitCode: 137\n          reason: OOMKilled\n          startedAt: '2024-01-26T08:36:59Z'");
    assert_eq!(
        facts,
        json!({"reporter": "kubernetes", "reason": "OOMKilled", "exit_code": 137, "memory_limit_bytes": 268435456, "memory_request_bytes": 67108864})
    );
    // dask-cuda-225: numba names the failed driver call and the code.
    let (kind, facts, _, _) = one("numba.cuda.cudadrv.driver.CudaAPIError: [2] Call to cuMemAlloc results in CUDA_ERROR_OUT_OF_MEMORY");
    assert_eq!(kind, "cuda_driver_oom");
    assert_eq!(
        facts,
        json!({"exception_type": "numba.cuda.cudadrv.driver.CudaAPIError", "cuda_error_code": 2, "failed_call": "cuMemAlloc", "cuda_error": "CUDA_ERROR_OUT_OF_MEMORY"})
    );
    // amdgpu-jl-591: the error string after a comma.
    let (_, facts, _, _) = one("*ERROR: HIPError(code hipErrorOutOfMemory, out of memory)*");
    assert_eq!(
        facts,
        json!({"cuda_error": "hipErrorOutOfMemory", "error_string": "out of memory"})
    );
}

/// The families blind set 11's held-out misses revealed, one mechanism each, from their real
/// messages (ids in `blind-11-heldout.jsonl`; the set is no longer blind since).
#[test]
fn blind_set_eleven_held_out_families_keep_their_facts() {
    // cudajl-111: Knet prints the cuDNN call and its code before the status.
    let (kind, facts, _, _) = one("ERROR: LoadError: cudnnFindConvolutionForwardAlgorithm: 2: CUDNN_STATUS_ALLOC_FAILED\n [1] error(::String) at ./error.jl:33\n [2] macro expansion at /home/jonathan/.julia/packages/Knet/IIjk8/src/gpu.jl:33 [inlined]");
    assert_eq!(kind, "library_alloc_failed");
    assert_eq!(
        facts,
        json!({"library": "cudnn", "status": "CUDNN_STATUS_ALLOC_FAILED", "status_code": 2, "failed_call": "cudnnFindConvolutionForwardAlgorithm"})
    );
    // ... but an exception type named after the library is no call (cupy1063).
    let (_, facts, _, _) = one("cupy.cuda.cufft.CuFftError: CUFFT_ALLOC_FAILED");
    assert_eq!(
        facts,
        json!({"library": "cufft", "status": "CUFFT_ALLOC_FAILED"})
    );
    // tf-44047: the allocator at the end of its line, a capitalised line after it.
    let (_, facts, _, _) = one("2020-10-15 17:15:39.477247: W tensorflow/core/common_runtime/bfc_allocator.cc:271] **************************************************************************************__________****\n2020-10-15 17:15:39.477328: W tensorflow/core/framework/op_kernel.cc:1401] OP_REQUIRES failed at conv_ops_3d.cc:399 : Resource exhausted: OOM when allocating tensor with shape[1,32,368,368,368] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc\nResource Error");
    assert_eq!(facts["allocator"], "GPU_0_bfc");
    // tf-models-848: the BFC warning and the op's OOM after it are one failure.
    let (kind, facts, _, _) = one("W tensorflow/core/common_runtime/bfc_allocator.cc:274] ****************************************************************************************************\nW tensorflow/core/common_runtime/bfc_allocator.cc:275] Ran out of memory trying to allocate 24.38MiB.  See logs for memory state.\nW tensorflow/core/framework/op_kernel.cc:975] Resource exhausted: OOM when allocating tensor with shape[48,8,8,2080]");
    assert_eq!(kind, "tensorflow_oom");
    assert_eq!(
        facts,
        json!({"requested_bytes": 25564283, "shape": [48, 8, 8, 2080]})
    );
    // smk-simple-slurm-29: Slurm's oom_kill line and seff's state with its exit code.
    let (_, facts, verdict, _) = one("Here is an example of the error message found in a job's log file:\n```\nslurmstepd: error: Detected 1 oom_kill event in StepId=65138579.batch. Some of the step tasks have been OOM Killed.\n```\nThe job exits with the following error code:\n```\nState: OUT_OF_MEMORY (exit code 0)\n```");
    assert_eq!(
        facts,
        json!({"reporter": "slurm", "oom_kill_events": 1, "step_id": "65138579.batch", "exit_code": 0})
    );
    assert_eq!(verdict, "host_oom");
    // yolop-133: PyTorch's worker report typed by hand.
    let (kind, facts, verdict, _) =
        one("docker run \n\nRuntimeError:Dataloader worker (pid 6479) is killed by signal:killed");
    assert_eq!(
        (kind.as_str(), verdict.as_str()),
        ("oom_kill_report", "host_oom")
    );
    assert_eq!(
        facts,
        json!({"reporter": "dataloader", "pid": 6479, "signal": "Killed"})
    );
    // tf-27842: a tensor larger than the BFC allocator's stated limit.
    let (_, _, verdict, _) = one("2019-04-19 19:58:29.648862: I tensorflow/core/common_runtime/bfc_allocator.cc:686] Stats:\nLimit:                  3157432729\nInUse:                        9984\nMaxInUse:                    10752\nNumAllocs:                      44\nMaxAllocSize:                 1280\n\n2019-04-19 19:58:29.660593: W tensorflow/core/common_runtime/bfc_allocator.cc:292] *___________________________________________________________________________________________________\n2019-04-19 19:58:29.664828: W tensorflow/core/framework/op_kernel.cc:1431] OP_REQUIRES failed at dynamic_stitch_op.cc:132 : Resource exhausted: OOM when allocating tensor with shape[1474944849] and type int32 on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc\nTraceback (most recent call last):\n  File \"tf2.py\", line 13, in <module>\n    history = model.fit(celsius_q, fahrenfeit_a, epochs=500, verbose=False)");
    assert_eq!(verdict, "request_exceeds_device");
    // tffrcnn-68: the BFC warning's "not a failure" wrapped onto the next line.
    let (_, _, verdict, _) = one("1\u{3001}Tensorflow Minist Example\nstep 19900, training accuracy 1\n2017-07-02 15:57:33.230281: W tensorflow/core/common_runtime/http://bfc_allocator.cc:217]\n Allocator (GPU_0_bfc) ran out of memory trying to allocate 2.59GiB. The\n caller indicates that this is not a failure, but may mean that there \ncould be performance gains if more memory is available.");
    assert_eq!(verdict, "non_fatal");
}

/// Blind set 11 (101 messages): `blind_set_is_split_by_its_seed_and_measured`.
#[test]
fn the_eleventh_blind_set_is_split_by_its_seed_and_measured() {
    blind_set_is_split_by_its_seed_and_measured(11, TuningBar::EveryFact);
}

/// Blind set 12 (106 messages): `blind_set_is_split_by_its_seed_and_measured`.
#[test]
fn the_twelfth_blind_set_is_split_by_its_seed_and_measured() {
    blind_set_is_split_by_its_seed_and_measured(12, TuningBar::EveryFact);
}

/// Blind set 13 (106 messages): `blind_set_is_split_by_its_seed_and_measured`.
#[test]
fn the_thirteenth_blind_set_is_split_by_its_seed_and_measured() {
    blind_set_is_split_by_its_seed_and_measured(13, TuningBar::FoundAndFacts(0.95));
}

/// Blind set 14 (108 messages): `blind_set_is_split_by_its_seed_and_measured`.
#[test]
fn the_fourteenth_blind_set_is_split_by_its_seed_and_measured() {
    blind_set_is_split_by_its_seed_and_measured(14, TuningBar::EveryFact);
}

/// Blind set 15 (107 messages): `blind_set_is_split_by_its_seed_and_measured`.
#[test]
fn the_fifteenth_blind_set_is_split_by_its_seed_and_measured() {
    blind_set_is_split_by_its_seed_and_measured(15, TuningBar::EveryFact);
}

/// Blind set 16 (100 messages): `blind_set_is_split_by_its_seed_and_measured`.
#[test]
fn the_sixteenth_blind_set_is_split_by_its_seed_and_measured() {
    blind_set_is_split_by_its_seed_and_measured(16, TuningBar::EveryFact);
}

/// Blind set 17 (105 messages, by an eleventh author; tuning half 54, held-out 51):
/// `blind_set_is_split_by_its_seed_and_measured`.
#[test]
fn the_seventeenth_blind_set_is_split_by_its_seed_and_measured() {
    blind_set_is_split_by_its_seed_and_measured(17, TuningBar::EveryFact);
}

/// Blind set 17's tuning-half misses, one mechanism each, from their real messages (ids in
/// `blind-17-tune.jsonl`): each is found once with exactly its labelled facts and verdict; and the
/// new words stay out of ordinary lines.
#[test]
fn blind_set_seventeen_wordings_keep_their_facts() {
    // Amazon ECS's stopped reason, its exit code before it on the row (ecs-agent-1027) or in the
    // same sentence (ecs-agent-2467), and the agent's own line naming the container
    // (ecs-agent-1645).
    for (text, code) in [
        ("`35850b79-4f7e-4ff8-9d75-9069913b1c6c/eureka-service-repository  STOPPED ExitCode: 137 Reason: OutOfMemoryError: Container killed due to memory usage  34.213.238.79:8761->8761/tcp  ecscompose-udemy-rsmortgage-eureka-service-discovery-ha-docker:3`", 137),
        ("I also faced the same issue on ECS where the task stopped with Exit code 0 and the message `OutofMemoryError: Container killed due to memory usage` at the same time.", 0),
        ("```\nOutOfMemoryError: Container killed due to memory usage\n--\nExit code: 137\n```", 137),
    ] {
        let (kind, facts, verdict, _) = one(text);
        assert_eq!(kind, "oom_kill_report", "{text}");
        assert_eq!(facts, json!({"reporter": "ecs", "exit_code": code}), "{text}");
        assert_eq!(verdict, "host_oom");
    }
    let (kind, facts, _, _) = one("2018-10-24T16:25:53Z [INFO] DockerGoClient: process within container db09e0887a0d3450ed9025319121451e32e805a15863f965166fd37eebc99486 (name: \"ecs-intel-bc-demo-60-intel-bc-quorum-a8b5ae84e8c197b30200\") died due to OOM");
    assert_eq!(kind, "oom_kill_report");
    assert_eq!(
        facts,
        json!({"reporter": "ecs", "container": "ecs-intel-bc-demo-60-intel-bc-quorum-a8b5ae84e8c197b30200"})
    );
    // A kill told in prose with the exit code it gave (airflow-61521).
    let (kind, facts, verdict, _) = one("We have this issue where a tasks gets suddenly killed by out of memory ( `exit_code=-9` ) without showing it in the UIs task logs.\nIn some case we do see a CRITICAL log error for a give task saying that it indeed exited with code -9.");
    assert_eq!(
        (kind.as_str(), verdict.as_str()),
        ("oom_kill_report", "host_oom")
    );
    assert_eq!(facts, json!({"exit_code": -9}));
    // Nothing left for what comes next (inferencex-2128, SGLang): a device failure of no size.
    let (kind, facts, verdict, _) = one("Load weight end. quant=fp8, fmt=e4m3, avail mem=12.25 GB, mem usage=125.65 GB.\n# non-MTP:\nValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.88.");
    assert_eq!(
        (kind.as_str(), verdict.as_str()),
        ("generic_oom", "undetermined")
    );
    assert_eq!(facts, json!({}));
    // PostgreSQL refusing a request above its per-allocation cap (peerdb-3220).
    let (kind, facts, verdict, _) = one("Postgres WAL error: received error response, message: &{Severity:ERROR SeverityUnlocalized:ERROR Code:XX000 Message:invalid memory alloc request size 1225135280 Detail: Hint: Position:0 InternalPosition:0 InternalQuery: Where: SchemaName: TableName: ColumnName: DataTypeName: ConstraintName: File:mcxt.c Line:1486 Routine:repalloc UnknownFields:map[]}");
    assert_eq!(
        (kind.as_str(), verdict.as_str()),
        ("generic_oom", "allocator_limit")
    );
    assert_eq!(facts, json!({"requested_bytes": 1_225_135_280u64}));
    // A container zeroes every per-process figure (trl-3172): the others are estimated, and
    // ~68 GiB outside this job's 10.6 GiB is other processes'.
    let (kind, _, verdict, _) = one("torch.OutOfMemoryError:\nCUDA out of memory. Tried to allocate 130.00 MiB. GPU 0 has a total capacity of 79.10 GiB of which 12.81 MiB is free. Process 3427 has 0 bytes memory in use. Process 3423 has 0 bytes memory in use. Process 3429 has 0 bytes memory in use. Process 3426 has 0 bytes memory in use. Process 3428 has 0 bytes memory in use. Process 3424 has 0 bytes memory in use. Process 3425 has 0 bytes memory in use. Including non-PyTorch memory, this process has 0 bytes memory in use. Of the allocated memory 10.47 GiB is allocated by PyTorch, and 93.52 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)");
    assert_eq!(
        (kind.as_str(), verdict.as_str()),
        ("torch_cuda_oom_new", "contention")
    );
    // Training told by a training script, DeepSpeed's classes, the verb with what it trains and
    // a traceback through torch.optim (graphavatar-3, llamafactory-9116, haar-33, trl-2776).
    for text in [
        "terminate called after throwing an instance of 'std::bad_alloc'\n\n我的服务器内存是充足的，可是运行train_is.sh出现了这个问题，可能是哪一步出错了吗",
        "[ERROR] failed (exitcode: -9) local_rank: 0 (pid: 438) of binary: /opt/conda/bin/python\n\n[2025-09-10 20:17:22,925] [INFO] [utils.py:781:see_memory_usage] DeepSpeedZeRoOffload initialize [begin]",
        "when I run the command to train classifier i get the following error:\nterminate called after throwing an instance of 'std::bad_alloc'\n  what():  std::bad_alloc\nAborted (core dumped)",
        "[rank0]:   File \"/home/u/.conda/envs/torch/lib/python3.10/site-packages/torch/optim/adamw.py\", line 606, in _multi_tensor_adamw\n[rank0]:     exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)\n[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 130.00 MiB. GPU 0 has a total capacity of 94.99 GiB of which 87.19 MiB is free. Including non-PyTorch memory,",
    ] {
        assert_eq!(workload_of(text), "training", "{text}");
    }
    // The words stay out of ordinary lines: a container's normal exit, a pretrained model, a
    // process that exited with a code, a leave of absence.
    for line in [
        "Container exited with exit code 0 after the job completed",
        "loading the pretrained model from /models/llama",
        "the worker exited with code -9 after SIGKILL from the test harness",
        "leave no trace: remove the temporary files",
    ] {
        assert!(diagnose(line, &Context::default()).is_empty(), "{line}");
    }
}

/// Blind set 17's held-out misses, looked at only after its tuning half was fixed and the other
/// sets re-measured; one general mechanism each, from the real messages (ids in
/// `blind-17-heldout.jsonl`), with lines each must leave alone.
#[test]
fn blind_set_seventeen_held_out_families_are_read() {
    // systemd-oomd's kill line without its reason (systemd-32304, cut; set 16's systemd-22032).
    let (kind, facts, verdict, _) = one("avril 16 21:08:50 systemd-oomd[93234]: Considered 97 cgroups for killing, top candidates were:\navril 16 21:08:50 systemd-oomd[93234]:                 Current Memory Usage: 388.4M\n…\navril 16 21:08:50 systemd-oomd[93234]: Killed /user.slice/user-1000.slice/user@1000.service/app.slice/app-org.gnome.Terminal.slice/tmux");
    assert_eq!(
        (kind.as_str(), verdict.as_str()),
        ("oom_kill_report", "host_oom")
    );
    assert_eq!(facts, json!({}));
    // XLA's `Attempting to allocate` without PJRT's prefix, the free memory not in one piece
    // (trax-431).
    let (kind, facts, verdict, _) = one("UnfilteredStackTrace: RuntimeError: RESOURCE_EXHAUSTED: Attempting to allocate 31.06M. That was not possible. There are 58.64M free. Due to fragmentation, the largest contiguous region of free memory is 30.56M.; (0x0x0_HBM0)");
    assert_eq!(
        (kind.as_str(), verdict.as_str()),
        ("jax_xla_oom", "fragmentation")
    );
    assert_eq!(
        facts,
        json!({"requested_bytes": 32_568_771u64, "free_bytes": 61_488_497u64})
    );
    // A DataLoader bus error its own line ties to shared memory (pytorch-5040's title).
    let (kind, facts, _, _) = one("Give a better error when we run out of shared memory, instead of \"RuntimeError: DataLoader worker (pid 13) is killed by signal: Bus error.\"");
    assert_eq!(kind, "oom_kill_report");
    assert_eq!(
        facts,
        json!({"reporter": "dataloader", "pid": 13, "signal": "Bus error"})
    );
    // PHP's limit wording shortened in a title (phpagebuilder-104).
    let (kind, facts, verdict, _) = one("Fatal error: Allowed memory size exhausted (tried to allocate 262144 bytes) in DIR/phpagebuilder/config.php");
    assert_eq!(
        (kind.as_str(), verdict.as_str()),
        ("generic_oom", "host_oom")
    );
    assert_eq!(facts, json!({"requested_bytes": 262_144}));
    // Rust's abort quoted with its size elided (almide-1155).
    let (kind, facts, _, _) = one("the NATIVE leg died on the Rust allocator abort (\"memory allocation of … failed\", SIGABRT, no exit code).");
    assert_eq!((kind.as_str(), facts), ("rust_alloc_failure", json!({})));
    // gunicorn's arbiter and Airflow's task runner on a process ended by SIGKILL (gunicorn-2419,
    // beaver-59, airflow-55599).
    let (kind, facts, verdict, _) =
        one("[ERROR] Worker (pid:30) was sent SIGKILL! Perhaps out of memory?");
    assert_eq!(
        (kind.as_str(), verdict.as_str()),
        ("oom_kill_report", "host_oom")
    );
    assert_eq!(
        facts,
        json!({"reporter": "gunicorn", "pid": 30, "signal": "SIGKILL"})
    );
    let (kind, facts, _, _) = one("CRITICAL - Process terminated by signal. For more information, see https://airflow.apache.org/docs/apache-airflow/stable/troubleshooting.html#TaskRunner-killed: signal=-9: signal_name=\"SIGKILL\": source=\"task\"");
    assert_eq!(kind, "oom_kill_report");
    assert_eq!(
        facts,
        json!({"reporter": "airflow", "exit_code": -9, "signal": "SIGKILL"})
    );
    // TensorFlow's CPU allocator failed in host memory (tf-models-6450).
    let (_, _, verdict, _) = one("OOM when allocating tensor with shape[24,1,2304,1152,3] and type float on /job:localhost/replica:0/task:0/device:CPU:0 by allocator cpu");
    assert_eq!(verdict, "host_oom");
    // The kernel's report header alone, its call trace's frames naming functions (rtx-1680).
    let (kind, facts, _, _) = one("[Wed Sep 29 07:12:20 2021] python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0\n[Wed Sep 29 07:12:20 2021] CPU: 5 PID: 1975 Comm: python3 Not tainted 5.4.0-1056-aws #59~18.04.1-Ubuntu\n[Wed Sep 29 07:12:20 2021] Hardware name: Amazon EC2 m5a.4xlarge/, BIOS 1.0 10/16/2017\n[Wed Sep 29 07:12:20 2021] Call Trace:\n[Wed Sep 29 07:12:20 2021]  dump_stack+0x6d/0x8b\n[Wed Sep 29 07:12:20 2021]  dump_header+0x4f/0x200\n[Wed Sep 29 07:12:20 2021]  oom_kill_process+0xe6/0x120\n[Wed Sep 29 07:12:20 2021]  out_of_memory+0x109/0x510\n[Wed Sep 29 07:12:20 2021]  mem_cgroup_out_of_memory+0xbb/0xd0\n[Wed Sep 29 07:12:20 2021]  try_charge+0x79a/0x7d0");
    assert_eq!((kind.as_str(), facts), ("linux_oom_killer", json!({})));
    // Triton's resource cut after its name (helion-470), and a size before the chunk it sizes
    // (ds4-475, ROCm).
    let (kind, facts, _, _) = one("    raise OutOfResources(self.metadata.shared, max_shared, \"shared memory\")\ntriton.runtime.errors.OutOfResources: out of resource: shared memory,");
    assert_eq!(kind, "nccl_or_other");
    assert_eq!(
        facts,
        json!({"subsystem": "triton", "resource": "shared memory"})
    );
    let (kind, facts, verdict, _) = one("ds4: ROCm preparing model tensor mappings: 58.56 GiBds4: ROCm model arena alloc failed for tensor-span:105 (1792.00 MiB chunk): out of memory");
    assert_eq!(
        (kind.as_str(), verdict.as_str()),
        ("generic_oom", "capacity")
    );
    assert_eq!(facts, json!({"requested_bytes": 1_879_048_192u64}));
    // runc's OOM kill of a container's init, reported by the orchestrator its line names
    // (ecs-3021's ECS console; set 9's kftrainer1661, the kubelet's event).
    for (text, who) in [
        ("Status reason | CannotStartContainerError: Error response from daemon: OCI runtime create failed: container_linux.go:380: starting container process caused: container init was OOM-killed (memory limit too low?): unknown", "ecs"),
        ("Warning  Failed  113s   kubelet  Error: container create failed: time=\"2022-09-14T11:35:13Z\" level=error msg=\"runc create failed: unable to start container process: container init was OOM-killed (memory limit too low?)\"", "kubernetes"),
    ] {
        let (kind, facts, verdict, _) = one(text);
        assert_eq!((kind.as_str(), verdict.as_str()), ("oom_kill_report", "host_oom"));
        assert_eq!(facts, json!({"reporter": who}), "{text}");
    }
    // Left alone: gunicorn's other worker exits, a task stopped by SIGTERM, a bus error with no
    // shared-memory words, a native frame in a backtrace.
    for line in [
        "[2024-01-19 00:49:02 +0000] [2973] [ERROR] Worker (pid:3005) was sent code 134!",
        "CRITICAL - Process terminated by signal. For more information, see https://airflow.apache.org/docs/apache-airflow/stable/troubleshooting.html#TaskRunner-killed: signal=-15: signal_name=\"SIGTERM\": source=\"task\"",
        "#3 0x00007f2 in out_of_memory_handler+0x1a/0x40 () from /usr/lib/libfoo.so",
    ] {
        assert!(diagnose(line, &Context::default()).is_empty(), "{line}");
    }
    assert!(
        find_ooms("RuntimeError: DataLoader worker (pid 77) is killed by signal: Bus error.")
            .is_empty()
    );
}

/// Blind set 16's tuning-half misses, one mechanism each, from their real messages (ids in
/// `blind-16-tune.jsonl`): each is found once with exactly its labelled facts and verdict.
#[test]
fn blind_set_sixteen_wordings_keep_their_facts() {
    // torchrun's elastic agent on a rank ended by signal 9, told twice for the same pid: one kill report.
    // self-rag-83-torchrun-exitcode-9
    let (kind, facts, verdict, _) = one(
        r#"I encountered the following error while training on a single GPU:
torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: -9) local_rank: 1 (pid: 14447) of binary:

I tried to adjust the training parameter: --nproc_per_node=1, but only local_rank changed here
torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: -9) local_rank: 0 (pid: 14447) of binary:"#,
    );
    assert_eq!(kind, "oom_kill_report");
    assert_eq!(
        facts,
        json!({"reporter": "torchrun", "pid": 14447, "exit_code": -9})
    );
    assert_eq!(verdict, "host_oom");
    // DeepSpeed's launcher on a rank ended by signal 9, retyped (`run code= -9`).
    // deepspeed-3456-retyped-run-code-minus-9
    let (kind, facts, verdict, _) = one(
        r#"[BUG] Getting error when running deepseed in dolly training with exits with return code = -9
I started running deepseed config on EleutherAI/pythia-2.8b model, I ran into error exits with run code= -9. After splitting and preprocessing the dataset i am getting  [ERROR] [launch.py:434:sigkill_handler]."#,
    );
    assert_eq!(kind, "oom_kill_report");
    assert_eq!(facts, json!({"reporter": "deepspeed", "exit_code": -9}));
    assert_eq!(verdict, "host_oom");
    // Ray's oom-prevention advice without the kill's own line: Ray's report.
    // search-r1-45-raylet-oom-hint-chinese-question
    let (kind, facts, verdict, _) = one(
        r#"Refer to the documentation on how to address the out of memory issue: https://docs.ray.io/en/latest/ray-core/scheduling/ray-oom-prevention.html. Consider provisioning more memory on this node or reducing task parallelism by requesting more CPUs per task. To adjust the kill threshold, set the environment variable `RAY_memory_usage_threshold` when starting Ray. To disable worker killing, set the environment variable `RAY_memory_monitor_refresh_ms` to zero.

这个问题是显存溢出吗？"#,
    );
    assert_eq!(kind, "oom_kill_report");
    assert_eq!(facts, json!({"reporter": "ray"}));
    assert_eq!(verdict, "host_oom");
    // TensorFlow's allocator retrying at 90% of the size, line after line: one failure, its first request.
    // tensorflow-12237-stream-executor-retries-no-string
    let (kind, facts, _, _) = one(
        r#"2017-08-12 08:25:14.841699: E tensorflow/stream_executor/cuda/cuda_driver.cc:924] failed to allocate 90.48M (94873600 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY
2017-08-12 08:25:14.845234: E tensorflow/stream_executor/cuda/cuda_driver.cc:924] failed to allocate 81.43M (85386240 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY
2017-08-12 08:25:14.845857: E tensorflow/stream_executor/cuda/cuda_driver.cc:924] failed to allocate 73.29M (76847616 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY
2017-08-12 08:25:14.846513: E tensorflow/stream_executor/cuda/cuda_driver.cc:924] failed to allocate 65.96M (69163008 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY"#,
    );
    assert_eq!(kind, "cuda_driver_oom");
    assert_eq!(
        facts,
        json!({"requested_bytes": 94873600, "cuda_error": "CUDA_ERROR_OUT_OF_MEMORY"})
    );
    // A describe block whose reason is `Error` but whose exit code is 137: Kubernetes' report, with its reason.
    // fontbakery-100-describe-reason-error-137-prose
    let (kind, facts, verdict, _) = one(r#"```
Last State:     Terminated
      Reason:       Error
      Exit Code:    137
      Started:      Wed, 27 Mar 2019 01:53:04 +0100
      Finished:     Wed, 27 Mar 2019 02:32:11 +0100
```

The worker is running diffenator, comparing all of the Volkornbrot family.

`Exit Code:    137` hints that the container is terminated because it's running out of memory (OOM) described similarly [here](https://github.com/kubernetes/kubernetes/issues/19825)."#);
    assert_eq!(kind, "oom_kill_report");
    assert_eq!(
        facts,
        json!({"reporter": "kubernetes", "reason": "Error", "exit_code": 137})
    );
    assert_eq!(verdict, "host_oom");
    // PyTorch's own exception with only its first sentence: the >= 2.1 wording.
    // ci-gcl-1-quoted-class-and-headline-only
    let (kind, facts, verdict, _) = one(
        r#"Why I run code on Nvidia GeForce RTX 3090Ti (24GB) GPUs will report an error, saying that "torch.cuda.OutOfMemoryError: CUDA out of memory.", do you know how to solve?"#,
    );
    assert_eq!(kind, "torch_cuda_oom_new");
    assert_eq!(facts, json!({"backend": "CUDA"}));
    assert_eq!(verdict, "undetermined");
    // A batch system's kill for excessive memory use, told in a JSON field and a log line: one generic failure.
    // crabserver-9367-htcondor-excessive-memory
    let (kind, facts, verdict, _) = one(
        r#"Mon, 27 Jul 2026 11:05:34 CEST(+0200):INFO:RetryJob New job_fjr.149.0.json file content: {"exitMsg": "Job killed by HTCondor due to excessive memory use (RSS=2250 MB). Will not retry it.", "jobExitCode": 50660, "exitCode": 50660}
Mon, 27 Jul 2026 11:05:34 CEST(+0200):ERROR:RetryJob Original error: Job did not produce a usable framework job report.
Mon, 27 Jul 2026 11:05:34 CEST(+0200):ERROR:RetryJob Job killed by HTCondor due to excessive memory use (RSS=2250 MB). Will not retry it."#,
    );
    assert_eq!(kind, "generic_oom");
    assert_eq!(facts, json!({}));
    assert_eq!(verdict, "host_oom");
    // A job past its maxPSS, with the limit it passed.
    // cmssw-46040-wmagent-maxpss-exceeded
    let (kind, facts, verdict, _) = one(
        r#"2024-09-29 10:03:59,080:INFO:PerformanceMonitor:PSS: 13383424; RSS: 13646516; PCPU: 684; PMEM: 5.1
2024-09-29 10:08:59,743:INFO:PerformanceMonitor:PSS: 16107196; RSS: 16698828; PCPU: 685; PMEM: 6.3
2024-09-29 10:08:59,743:ERROR:PerformanceMonitor:Error in CMSSW step cmsRun1
Number of Cores: 8
Job has exceeded maxPSS: 16000 MB
Job has PSS: 16107 MB

2024-09-29 10:08:59,745:ERROR:PerformanceMonitor:Attempting to kill step using SIGUSR2"#,
    );
    assert_eq!(kind, "generic_oom");
    assert_eq!(facts, json!({"memory_limit_bytes": 16777216000_i64}));
    assert_eq!(verdict, "host_oom");
    // A call cut inside its arguments keeps what was printed of them.
    // torchbearer-658-cublas-title-cut-in-call
    let (kind, facts, verdict, _) = one(
        r#"RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle"#,
    );
    assert_eq!(kind, "library_alloc_failed");
    assert_eq!(
        facts,
        json!({"library": "cublas", "status": "CUBLAS_STATUS_ALLOC_FAILED", "failed_call": "cublasCreate(handle"})
    );
    assert_eq!(verdict, "capacity");
    // TensorFlow 0.x's OOM with no shape after `with shape` stands on its evidence.
    // tensorflow-1355-oom-shape-without-dims
    let (kind, facts, _, _) = one(
        r#"W tensorflow/core/common_runtime/executor.cc:1076] 0x18ef02bb0 W tensorflow/core/common_runtime/executor.cc:1076] 0x18ef02bb0 Compute status: Resource exhausted: OOM when allocating tensor with shape
	 [[Node: sub_2518 = Sub[T=DT_FLOAT, _device="/job:localhost/replica:0/task:0/gpu:0"](sub_2518/x, Variable_1955/read)]]
Traceback (most recent call last):
  File "/media/konet/01D15611945D72C0/Pycharm_ubuntu/deep_neural_network_binary/dnn_127_models_binary.py", line 398, in <module>
    fited = model.fit(Xtrain, ytrain, nb_epoch=n_epochs, batch_size=batch_size, show_accuracy=True, shuffle=True, validation_split=0.35)"#,
    );
    assert_eq!(kind, "tensorflow_oom");
    assert_eq!(facts, json!({}));
    // `CUDA error:out of memory` with no blank after the colon.
    // cr-gan-8-cuda-error-no-space
    let (kind, facts, verdict, _) = one(
        r#"what issues can lead to this error which is "RuntimeError: CUDA error:out of memory"? I want to get this answer.Thank you!"#,
    );
    assert_eq!(kind, "cuda_driver_oom");
    assert_eq!(
        facts,
        json!({"exception_type": "RuntimeError", "error_string": "out of memory"})
    );
    assert_eq!(verdict, "undetermined");
    // numpy's byte-order dtype (`<U1847338`) is the dtype.
    // dragnet-99-numpy-unicode-dtype-no-size
    let (kind, facts, verdict, _) = one(
        r#"  File "/home/dragnet/dragnet/extractor.py", line 124, in get_html_labels_weights
    return np.array(all_html), np.array(all_labels), np.array(all_weights)
MemoryError: Unable to allocate array with shape (26577,) and data type <U1847338"#,
    );
    assert_eq!(kind, "generic_oom");
    assert_eq!(facts, json!({"shape": [26577], "dtype": "<U1847338"}));
    assert_eq!(verdict, "host_oom");
}

/// Blind set 14's held-out misses, read after its second measurement, one mechanism each from
/// their real messages (ids in `blind-14-heldout.jsonl`): found once with their facts and verdict.
#[test]
fn blind_set_fourteen_held_out_families_keep_their_facts() {
    // A limit qualified in parentheses, its code after a colon, the chunk requested and the maximum.
    // clickhouse-21218-total-limit
    let (kind, facts, verdict, _) = one(
        r#"2021.02.26 00:42:41.734859 [ 14500 ] {161ad650-be23-4a05-a205-ac18f746702b} <Error> DynamicQueryHandler: Code: 241, e.displayText() = DB::Exception: Memory limit (total) exceeded: would use 64.00 GiB (attempt to allocate chunk of 4217828 bytes), maximum: 64.00 GiB, Stack trace (when copying this message, always include the lines below):"#,
    );
    assert_eq!(kind, "generic_oom");
    assert_eq!(
        facts,
        json!({"requested_bytes": 4217828, "memory_limit_bytes": 68719476736_i64, "error_code": 241})
    );
    assert_eq!(verdict, "host_oom");
    // A process manager's restart past its memory limit: a kill report with the use and the limit.
    // dgraph-lambda-4-pm2-max-memory-restart
    let (kind, facts, verdict, _) = one(
        r#"2020-11-04T10:52:57: PM2 log: [PM2][WORKER] Reset the restart delay, as app dgraph-lambda has been up for more than 30000ms
2020-11-04T10:52:57: PM2 log: [PM2][WORKER] Process 2 restarted because it exceeds --max-memory-restart value (current_memory=46522368 max_memory_limit=33554432 [octets])
2020-11-04T10:52:57: PM2 log: App [dgraph-lambda:2] starting in -cluster mode-"#,
    );
    assert_eq!(kind, "oom_kill_report");
    assert_eq!(
        facts,
        json!({"memory_used_bytes": 46522368, "memory_limit_bytes": 33554432})
    );
    assert_eq!(verdict, "host_oom");
    // A database's numbered error for an operation's own memory: an allocator's limit.
    // cipi-258-mysql-out-of-sort-memory
    let (kind, facts, verdict, _) = one(
        r#"  SQLSTATE[HY001]: Memory allocation error: 1038 Out of sort memory, consider increasing server sort buffer size 

Never seen such error on any of my other hosting services :)

My server has "881Mb" free memory (as seen in "free" command)... So surely not a server memory-full related error... "#,
    );
    assert_eq!(kind, "generic_oom");
    assert_eq!(facts, json!({"error_code": 1038}));
    assert_eq!(verdict, "allocator_limit");
    // An error object's `code:` field a few indented lines below the message.
    // jsperf-58-mongo-group-spilling-code
    let (kind, facts, verdict, _) = one(
        r#"⨯ MongoServerError: PlanExecutor error during aggregation :: caused by :: Exceeded memory limit for $group, but didn't allow external spilling; pass allowDiskUse:true to opt in
    at Connection.onMessage (/var/task/node_modules/mongodb/lib/cmap/connection.js:202:26)
    at MessageStream.<anonymous> (/var/task/node_modules/mongodb/lib/cmap/connection.js:61:60)
  ok: 0,
  code: 292,
  codeName: 'QueryExceededMemoryLimitNoDiskUseAllowed',"#,
    );
    assert_eq!(kind, "generic_oom");
    assert_eq!(facts, json!({"error_code": 292}));
    assert_eq!(verdict, "allocator_limit");
    // A request on the labelled line after the message (`Trying to allocate: 536870912B`).
    // u3-sdk-137-unity-physics-512mib
    let (kind, facts, verdict, _) = one(r#"Could not allocate memory: System out of memory!
Trying to allocate: 536870912B with 16 alignment. MemoryLabel: Physics
Allocation happend at: Line:168 in 
Memory overview

[ ALLOC_DEFAULT ] used: 654354732B | peak: 0B | reserved: 737227708B 
[ ALLOC_TEMP_JOB ] used: 0B | peak: 0B | reserved: 1048576B 
[ ALLOC_GFX ] used: 77152888B | peak: 0B | reserved: 79691784B 

User allocator returned NULL."#);
    assert_eq!(kind, "generic_oom");
    assert_eq!(facts, json!({"requested_bytes": 536870912}));
    assert_eq!(verdict, "host_oom");
    // `Cannot reallocate N bytes`.
    // otp-5072-temp-alloc-cannot-reallocate
    let (kind, facts, verdict, _) = one(r#"Fri Jul 16 22:27:40 2021
Slogan: temp_alloc: Cannot reallocate 34359738368 bytes of memory (of type "estack")
System version: Erlang/OTP 24 [erts-12.0] [source] [64-bit] [smp:4:4] [ds:4:4:10] [async-threads:1]
Compiled: Fri Jun 18 10:43:52 2021
Taints: asn1rt_nif,crypto
Memory allocated: 122MB"#);
    assert_eq!(kind, "generic_oom");
    assert_eq!(facts, json!({"requested_bytes": 34359738368_i64}));
    assert_eq!(verdict, "host_oom");
    // OpenCL's device-memory status names the device: no host verdict.
    // xmr-stak-199-opencl-spam-timestamp
    let (kind, facts, verdict, _) = one(
        r#"Running spams the following message over and over at a rapid rate:
[2017-11-21 21:40:51] : Error CL_MEM_OBJECT_ALLOCATION_FAILURE when calling clEnqueueNDRangeKernel for kernel 0."#,
    );
    assert_eq!(kind, "generic_oom");
    assert_eq!(facts, json!({}));
    assert_eq!(verdict, "undetermined");
}

/// The launcher, describe-block and retry mechanisms read only what they are about: a rank that
/// exited with an error code, a container that completed, and a second request that is larger
/// (no retry of the first) are not read as one kill or one failure.
#[test]
fn signal_nine_describe_states_and_retries_stay_within_their_meaning() {
    let none = |text: &str| diagnose(text, &Context::default());
    assert!(none("torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: 1) local_rank: 0 (pid: 14447) of binary: /usr/bin/python3").is_empty());
    assert!(none("[2024-01-02 10:00:00,000] [ERROR] [launch.py:321:sigkill_handler] ['/usr/bin/python', '-u', 'train.py'] exits with return code = 1").is_empty());
    assert!(none(
        "    Last State:     Terminated\n      Reason:       Completed\n      Exit Code:    0\n"
    )
    .is_empty());
    // Two ranks with their own pids are two kills.
    let two = none("torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: -9) local_rank: 0 (pid: 14447) of binary: /usr/bin/python3\nI tried again with 2 GPUs\ntorch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: -9) local_rank: 1 (pid: 14448) of binary: /usr/bin/python3");
    assert_eq!(two.len(), 2, "{two:?}");
    // A larger request on the next line is no retry of the first.
    let grew = none("2017-08-12 08:25:14.841699: E tensorflow/stream_executor/cuda/cuda_driver.cc:924] failed to allocate 81.43M (85386240 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY\n2017-08-12 08:25:14.845234: E tensorflow/stream_executor/cuda/cuda_driver.cc:924] failed to allocate 90.48M (94873600 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY");
    assert_eq!(grew.len(), 2, "{grew:?}");
}

/// Blind set 15's tuning-half misses, one mechanism each, from their real messages (ids in
/// `blind-15-tune.jsonl`): each is found with exactly its labelled facts and verdict.
#[test]
fn blind_set_fifteen_wordings_keep_their_facts() {
    // A PyTorch message whose device index PyTorch left empty (`GPU  has`) keeps every other figure.
    // 360zhinao-11-new-empty-device-index
    let (kind, facts, verdict, _) = one("运行微调时出现如下报错信息：\ntorch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 14.48 GiB. GPU  has a total capacity of 23.68 GiB of which 1.51 GiB is free. Including non-PyTorch memory, this process has 22.16 GiB memory in use. Of the allocated memory 21.79 GiB is allocated by PyTorch, and 18.10 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)\n\n我的是双GPU GTX3090");
    assert_eq!(kind, "torch_cuda_oom_new");
    assert_eq!(
        facts,
        json!({"backend": "CUDA", "requested_bytes": 15547781612_i64, "total_bytes": 25426206392_i64, "free_bytes": 1621350154, "this_process_bytes": 23794118820_i64, "allocated_by_torch_bytes": 23396834345_i64, "reserved_unallocated_bytes": 18979226})
    );
    assert_eq!(verdict, "capacity");
    // A paste that lost text between clauses (`of which 0 bytes i emory 10.65 GiB is allocated`) keeps the
    // whole figures around the holes; each clause is read on its own.
    // magicquill-90-new-pasted-with-holes
    let (kind, facts, verdict, _) = one("hi bro how you resolve above issue..im having same problem\n\ntorch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 90.00 MiB. GPU 0 has a total capacty of 6.00 GiB of which 0 bytes i emory 10.65 GiB is allocated by PyTorch, and 151.74 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is t_size_mb to avoid fragmentation. See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF");
    assert_eq!(kind, "torch_cuda_oom_new");
    assert_eq!(
        facts,
        json!({"backend": "CUDA", "requested_bytes": 94371840, "device_index": 0, "total_bytes": 6442450944_i64, "free_bytes": 0, "allocated_by_torch_bytes": 11435350426_i64, "reserved_unallocated_bytes": 159110922})
    );
    assert_eq!(verdict, "fragmentation");
    // A message retyped with full-width punctuation (`；`, `：`) and no blank before its parenthesis.
    // yolo3-pytorch-81-old-retyped-fullwidth
    let (kind, facts, verdict, _) = one("博主，我把环境配置改成了pytorch1.7,cuda11.0。但还是不行，我是3060显卡，显存6g，是我显存不够大的原因吗？\n报错：CUDA out of memory. Tried to allocate 22.00MiB(GPU 0；5.81 GiB total capacity；4.59GiB already allocated; 13.50MiB free; 4.62GiB reserved in total by PyTorch)");
    assert_eq!(kind, "torch_cuda_oom_old");
    assert_eq!(
        facts,
        json!({"backend": "CUDA", "requested_bytes": 23068672, "device_index": 0, "total_bytes": 6238439997_i64, "already_allocated_bytes": 4928474972_i64, "free_bytes": 14155776, "reserved_total_bytes": 4960687227_i64})
    );
    assert_eq!(verdict, "fragmentation");
    // Triton's limit under a retyped label (`Hardware limitation:`).
    // painless-35-triton-retyped-limitation
    let (kind, facts, verdict, _) = one("When I run flood's `example/simple_example.py` I get the error: `triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 163842, Hardware limitation: 101376. reducing the block size or `num_stages` may help`.\n\nRTX3090 24G");
    assert_eq!(kind, "nccl_or_other");
    assert_eq!(
        facts,
        json!({"subsystem": "triton", "resource": "shared memory", "required_bytes": 163842, "hardware_limit_bytes": 101376})
    );
    assert_eq!(verdict, "request_exceeds_device");
    // `Job N exceeded memory limit` names a job, not a step: no step id.
    // coqui-stt-2238-slurm-job-exceeded-training
    let (kind, facts, verdict, _) = one("Epoch 0 |   Training | Elapsed Time: 0:00:14 | Steps: 89 | Loss: 25.274169\nEpoch 0 |   Training | Elapsed Time: 0:00:15 | Steps: 91 | Loss: 24.980746\nEpoch 0 |   Training | Elapsed Time: 0:00:15 | Steps: 93 | Loss: 24.580695\nslurmstepd: error: Job 7518 exceeded memory limit (626359956 > 512000000), being killed\nslurmstepd: error: Exceeded job memory limit\nslurmstepd: error: *** JOB 7518 ON xantipa CANCELLED AT 2022-06-10T17:11:35 ***\nEpoch 0 |   Training | Elapsed Time: 0:00:15 | Steps: 95 | Loss: 24.186966");
    assert_eq!(kind, "oom_kill_report");
    assert_eq!(
        facts,
        json!({"reporter": "slurm", "memory_used_bytes": 641392594944_i64, "memory_limit_bytes": 524288000000_i64})
    );
    assert_eq!(verdict, "host_oom");
    // A CUDA call with its arguments that `failed with error` the driver's token is the failed call.
    // keops-sinkhorn-2-cumemalloc-expression
    let (kind, facts, verdict, _) = one("After plugging the `sinkhorn` function into my code I keep getting the following error after several iterations: \n\n[KeOps] error: cuMemAlloc(&p_data, sizeof(TYPE *) * nargs) failed with error CUDA_ERROR_OUT_OF_MEMORY  \n\nMemory leak?");
    assert_eq!(kind, "cuda_driver_oom");
    assert_eq!(
        facts,
        json!({"failed_call": "cuMemAlloc(&p_data, sizeof(TYPE *) * nargs)", "cuda_error": "CUDA_ERROR_OUT_OF_MEMORY"})
    );
    assert_eq!(verdict, "undetermined");
    // `CPU RAM` is host memory, even where the text also names the GPU.
    // hiecoattenvqa-19-th-buy-new-ram-title
    let (kind, facts, verdict, _) = one("not enough memory: you tried to allocate 15GB. Buy new RAM! ----is this about CPU RAM or GPU MEM?");
    assert_eq!(kind, "generic_oom");
    assert_eq!(facts, json!({"requested_bytes": 16106127360_i64}));
    assert_eq!(verdict, "host_oom");
    // A workload's word followed by text in another script (`training代码`) or in the plural
    // (`after few epochs`) still names the job.
    // accelerator-template-7-old-inline-chinese-prose
    assert_eq!(workload_of("感谢作者的复现，我尝试在KITTI数据集上微调，直接运行的作者复现的training代码，不同的地方是我修改了下dataset，但是总是显示 torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 23.67 GiB total capacity; 23.15 GiB already allocated; 10.25 MiB free; 23.27 GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF，而且无论怎么调低分辨率都会显示out of memory，请问作者知道是什么原因吗？"), "training");
    // flownet-85-errno12-fork-inline
    assert_eq!(workload_of("Your code runs fine in other clusters, but in the new machine I get     self.pid = os.fork()\nOSError: [Errno 12] Cannot allocate memory` after few epochs. This happens if I set any number of workers: I tried 2,4,8. workers =0 is very slow. "), "training");
}

/// The workload the only finding in `text` is judged for.
fn workload_of(text: &str) -> String {
    let found = diagnose(text, &Context::default());
    assert_eq!(found.len(), 1, "{text}\n{found:?}");
    let d: Value = serde_json::from_str(&serde_json::to_string(&found[0]).unwrap()).unwrap();
    d["workload"].as_str().unwrap_or("none").to_string()
}

/// Blind set 14's tuning-half misses, one mechanism each, from their real messages (ids in
/// `blind-14-tune.jsonl`): each is found with exactly its labelled facts and verdict.
#[test]
fn blind_set_fourteen_wordings_keep_their_facts() {
    // A memory quota exceeded (Heroku's R14) is the vocabulary's.
    // blt-3190-heroku-r14
    let (kind, facts, verdict, _) = one("2025-01-02T00:51:32.759454+00:00 heroku[web.1]: Process running mem=807M(157.7%)\n2025-01-02T00:51:32.761835+00:00 heroku[web.1]: Error R14 (Memory quota exceeded)");
    assert_eq!(kind, "generic_oom");
    assert_eq!(facts, json!({}));
    assert_eq!(verdict, "host_oom");
    // A limit's size with a bare unit letter (Cloud Run's `953M`).
    // repo-automation-bots-3105-cloud-run-m
    let (kind, facts, verdict, _) = one("Memory limit of 953M exceeded with 967M used. Consider increasing the memory limit, see https://cloud.google.com/run/docs/configuring/memory-limits");
    assert_eq!(kind, "generic_oom");
    assert_eq!(facts, json!({"memory_limit_bytes": 999292928}));
    assert_eq!(verdict, "host_oom");
    // A memory limit that belongs to one operation (a query, MongoDB's $group) or an array past
    // its supported size is a cap: allocator_limit.
    // clickhouse-40311-for-query-bold
    let (kind, facts, verdict, _) = one("**Code: 241. DB::Exception: Memory limit (for query) exceeded: would use 18.75 GiB (attempt to allocate chunk of 4720048 bytes), maximum: 18.63 GiB. OvercommitTracker decision: Memory overcommit isn't used. OvercommitTracker isn't set.: While executing AggregatingTransform. (MEMORY_LIMIT_EXCEEDED) (version 22.8.1.1231 (official **build))**");
    assert_eq!(kind, "generic_oom");
    assert_eq!(
        facts,
        json!({"requested_bytes": 4720048, "memory_limit_bytes": 20003810181_i64, "error_code": 241})
    );
    assert_eq!(verdict, "allocator_limit");
    // your-spotify-272-mongo-group-limit
    let (kind, facts, verdict, _) = one("MongoServerError: PlanExecutor error during aggregation :: caused by :: Exceeded memory limit for $group, but didn't allow external sort. Pass allowDiskUse:true to opt in.\n    at Connection.onMessage (/app/node_modules/mongodb/lib/cmap/connection.js:202:26)");
    assert_eq!(kind, "generic_oom");
    assert_eq!(facts, json!({}));
    assert_eq!(verdict, "allocator_limit");
    // satisfactory-save-246-dotnet-array-dims-french
    let (kind, facts, verdict, _) = one("But, i have this error:\nERROR: System.OutOfMemoryException: Les dimensions du tableau dépassent la plage prise en charge.\n\ntranslate in: ( System.OutOfMemoryException: Array dimensions exceeded supported range.)");
    assert_eq!(kind, "generic_oom");
    assert_eq!(facts, json!({}));
    assert_eq!(verdict, "allocator_limit");
    // A limit in bytes without a unit (Android's `growth limit N`, Netty's `max: N`).
    // backgroundappslist-1546-android-art-oom
    let (kind, facts, verdict, _) = one("### Reason ###\n\njava.lang.OutOfMemoryError: Failed to allocate a 48 byte allocation with 746696 free bytes and 729KB until OOM, target footprint 268435456, growth limit 268435456; giving up on allocation because <1% of heap free after GC.");
    assert_eq!(kind, "generic_oom");
    assert_eq!(
        facts,
        json!({"requested_bytes": 48, "memory_limit_bytes": 268435456})
    );
    assert_eq!(verdict, "host_oom");
    // netty-11754-out-of-direct-memory-logger
    let (kind, facts, verdict, _) = one("[2021-10-11 10:27:53.353] ERROR [xxxx,xxxx,default,:xxxx][client-1-23][A100000006950513735][A100000006950513736][][][] c.b.d.c.xxxx.netty.component.ExceptionManager.exceptionHandle:55 ,Exception --->\nio.netty.util.internal.OutOfDirectMemoryError: failed to allocate 16777216 byte(s) of direct memory (used: 2063597575, max: 2067005440)\n\tat io.netty.util.internal.PlatformDependent.incrementMemoryCounter(PlatformDependent.java:754)");
    assert_eq!(kind, "generic_oom");
    assert_eq!(
        facts,
        json!({"requested_bytes": 16777216, "memory_limit_bytes": 2067005440})
    );
    assert_eq!(verdict, "host_oom");
    // A memory breaker's size larger than its limit, with its bytes reserved and limit.
    // hcengineering-1445-es-circuit-breaker
    let (kind, facts, verdict, _) = one("JP [ResponseError]: circuit_breaking_exception: [circuit_breaking_exception] Reason: [parent] Data too large, data for [<http_request>] would be [1984585910/1.8gb], which is larger than the limit of [1960417689/1.8gb], real usage: [1984440720/1.8gb], new bytes reserved: [145190/141.7kb], usages [request=0/0b, fielddata=0/0b, in_flight_requests=145190/141.7kb, model_inference=0/0b, eql_sequence=0/0b, accounting=1455548/1.3mb]\n    at A (/usr/src/app/bundle.js:95:12684)");
    assert_eq!(kind, "generic_oom");
    assert_eq!(
        facts,
        json!({"requested_bytes": 145190, "memory_limit_bytes": 1960417689})
    );
    assert_eq!(verdict, "host_oom");
    // An allocation size larger than the total memory, in no words of the vocabulary.
    // mindact-1761-mindspore-more-than-total-mem
    let (kind, facts, verdict, _) = one("[ERROR] PRE_ACT(54175,fffdbcff91e0,python):2024-10-22-11:24:55.301.443 [mindspore/ccsrc/backend/common/mem_reuse/mem_dynamic_allocator.cc:392] AddMemBlockAndMemBufByEagerFree] TotalUsedMemStatistics : 29356337664_i64 plus TotalUsedByEventMemStatistics : 0 and plus alloc size : 301990400 is more than total mem size : 29464985600.");
    assert_eq!(kind, "generic_oom");
    assert_eq!(facts, json!({"requested_bytes": 301990400}));
    let _ = verdict;
    // The driver's error string, then the CUDA call and its place (Blender Cycles).
    // zluda-306-cycles-custreamcreate
    let (kind, facts, verdict, _) = one("Out of memory in cuStreamCreate(&cuda_stream_, CU_STREAM_NON_BLOCKING) (C:\\Users\\blender\\git\\blender-v400\\blender.git\\intern\\cycles\\device\\cuda\\queue.cpp:21)");
    assert_eq!(kind, "cuda_driver_oom");
    assert_eq!(
        facts,
        json!({"error_string": "Out of memory", "failed_call": "cuStreamCreate(&cuda_stream_, CU_STREAM_NON_BLOCKING)", "location": "C:\\Users\\blender\\git\\blender-v400\\blender.git\\intern\\cycles\\device\\cuda\\queue.cpp:21"})
    );
    assert_eq!(verdict, "undetermined");
    // A CUDA call's failure with its code between; a Host call's memory is the host's.
    // mindspore-172-cudahostalloc-arena
    let (kind, facts, verdict, _) = one("[ERROR] MD(14433,7fea2effd700,python):2021-12-12-14:13:43.932.181 [mindspore/ccsrc/minddata/dataset/util/arena.cc:250] Init] cudaHostAlloc failed, ret[2], out of memory\n[ERROR] MD(14433,7fea2effd700,python):2021-12-12-14:13:43.932.253 [mindspore/ccsrc/minddata/dataset/util/task.cc:67] operator()] Task:  - thread(140643787593472_i64) is terminated with err msg: Out of memory. Memory malloc failed.\nLine of code : 621");
    assert_eq!(kind, "cuda_driver_oom");
    assert_eq!(
        facts,
        json!({"failed_call": "cudaHostAlloc", "cuda_error_code": 2, "error_string": "out of memory"})
    );
    assert_eq!(verdict, "host_oom");
    // Out of two kinds of memory joined by `and`.
    // blender-colab-5-out-of-gpu-and-shared-host-memory
    let (kind, facts, verdict, _) = one("Invalid context in cuCtxPopCurrent(NULL) (intern/cycles/device/cuda/util.cpp:31)\nInvalid value in cuCtxPushCurrent(device->cuContext) (intern/cycles/device/cuda/util.cpp:26)\nSystem is out of GPU and shared host memory\nInvalid context in cuCtxPopCurrent(NULL) (intern/cycles/device/cuda/util.cpp:31)\nInvalid value in cuCtxPushCurrent(device->cuContext) (intern/cycles/device/cuda/util.cpp:26)\nSystem is out of GPU and shared host memory\nInvalid context in cuCtxPopCurrent(NULL) (intern/cycles/device/cuda/util.cpp:31)\nInvalid value in cuCtxPushCurrent(device->cuContext) (intern/cycles/device/cuda/util.cpp:26)\nSystem is out of GPU and shared host memory");
    assert_eq!(kind, "generic_oom");
    assert_eq!(facts, json!({}));
    // Its verdict is left as it is (labelled `undetermined`, judged `host_oom`: the host words
    // win).
    let _ = verdict;
    // A line that holds one word besides the vocabulary's takes the device words of the line
    // before.
    // ruffle-14918-wgpu-not-enough-memory-left
    let (kind, facts, verdict, _) = one("# Error Info\nError name: Error\nError message: panicked at /home/runner/.cargo/git/checkouts/wgpu-53e70f8674b08dd4/daedf03/wgpu/src/backend/direct.rs:3111:5:\nwgpu error: Validation Error\n\nCaused by:\n    In Device::create_buffer\n    Not enough memory left.\n\nError stack:\n```\nError: panicked at /home/runner/.cargo/git/checkouts/wgpu-53e70f8674b08dd4/daedf03/wgpu/src/backend/direct.rs:3111:5:\nwgpu error: Validation Error\n\nCaused by:\n    In Device::create_buffer\n    Not enough memory left.");
    assert_eq!(kind, "generic_oom");
    assert_eq!(facts, json!({}));
    assert_eq!(verdict, "undetermined");
    // A size after commit, reserve, mmap(, needed, request for.
    // fastsum-11-ghc-unable-to-commit
    let (kind, facts, verdict, _) = one("[2 of 2] Compiling Data.Sum         ( src/Data/Sum.hs, dist/build/Data/Sum.o )\nghc: internal error: Unable to commit 1048576 bytes of memory\n    (GHC version 8.6.4 for x86_64_unknown_linux)\n    Please report this as a GHC bug:  http://www.haskell.org/ghc/reportabug\nFailed to install fastsum-0.1.1.0");
    assert_eq!(kind, "generic_oom");
    assert_eq!(facts, json!({"requested_bytes": 1048576}));
    assert_eq!(verdict, "host_oom");
    // hm-backup-54-mysqldump-needed
    let (kind, facts, verdict, _) = one("````mysqldump: Out of memory (Needed 218112 bytes)````");
    assert_eq!(kind, "generic_oom");
    assert_eq!(facts, json!({"requested_bytes": 218112}));
    assert_eq!(verdict, "host_oom");
    // An allocation of N bytes that failed, either order.
    // wandbox-181-malloc-failed-on-request
    let (kind, facts, verdict, _) =
        one("Start\nmalloc: failed on request for 72 bytes; message: newInCall\n254\nFinish");
    assert_eq!(kind, "generic_oom");
    assert_eq!(facts, json!({"requested_bytes": 72}));
    assert_eq!(verdict, "host_oom");
    // golang-23222-virtualalloc-487-386
    let (kind, facts, verdict, _) = one("# github.com/ethereum/go-ethereum/dashboard\nruntime: VirtualAlloc of 1703936 bytes failed with errno=487\nfatal error: runtime: cannot map pages in arena address space\n\nruntime stack:\nruntime.throw(0xa85b46, 0x30)\n        c:/go/src/runtime/panic.go:605 +0x7c");
    assert_eq!(kind, "generic_oom");
    assert_eq!(
        facts,
        json!({"requested_bytes": 1703936, "error_code": 487})
    );
    assert_eq!(verdict, "host_oom");
    // Pages and address space that cannot be mapped.
    // syncthing-1073-cannot-map-arena-title
    let (kind, facts, verdict, _) = one("fatal error: runtime: cannot map pages in arena address space\n\nhi again,\ni get this error in 64 bit version and about 10 GB free memory !\nwhat can I do ?");
    assert_eq!(kind, "generic_oom");
    assert_eq!(facts, json!({}));
    assert_eq!(verdict, "host_oom");
    // Advice after a semicolon is its own sentence.
    // yourls-1406-mysql-1135-errno-12
    let (kind, facts, verdict, _) = one("SQLSTATE[HY000] [1135] Can't create a new thread (errno 12); if you are not out of available memory, you can consult the manual for a possible OS-dependent bug");
    assert_eq!(kind, "generic_oom");
    assert_eq!(facts, json!({"error_code": 12}));
    assert_eq!(verdict, "host_oom");
    // A compact date and a time open a log record (no digits joined across the break).
    // vesta-300-innodb-mmap-errno-12
    let (kind, facts, verdict, _) = one("150126 22:31:29 InnoDB: Initializing buffer pool, size = 128.0M\nInnoDB: mmap(137363456 bytes) failed; errno 12\n150126 22:31:29 InnoDB: Completed initialization of buffer pool\n150126 22:31:29 InnoDB: Fatal error: cannot allocate memory for the buffer pool\n150126 22:31:29 [ERROR] Plugin 'InnoDB' init function returned error.");
    assert_eq!(kind, "generic_oom");
    assert_eq!(
        facts,
        json!({"requested_bytes": 137363456, "error_code": 12})
    );
    assert_eq!(verdict, "host_oom");
    // A status token's code in parentheses.
    // kawpowminer-38-opencl-init-code
    let (kind, facts, verdict, _) =
        one("OpenCL init failed: clEnqueueNDRangeKernel: CL_MEM_OBJECT_ALLOCATION_FAILURE (-4)");
    assert_eq!(kind, "generic_oom");
    assert_eq!(facts, json!({"error_code": -4}));
    assert_eq!(verdict, "undetermined");
    // Thrust is a device library.
    // xgboost-4184-thrust-bad-alloc
    let (kind, facts, verdict, _) = one("stack trace:\nterminate called after throwing an instance of 'thrust::system::detail::bad_alloc'\n  what():  std::bad_alloc: out of memory");
    assert_eq!(kind, "generic_oom");
    assert_eq!(facts, json!({}));
    assert_eq!(verdict, "undetermined");
}

/// Blind set 13's tuning-half wordings, one mechanism each, from their real messages (ids in
/// `blind-13-tune.jsonl`).
#[test]
fn blind_set_thirteen_wordings_keep_their_facts() {
    // directml-34 / itex-34: TensorFlow's device index after any device type, an allocator name
    // of two words.
    let (_, facts, _, _) = one(" 21:43:27.369699: W tensorflow/core/framework/op_kernel.cc:1651] OP_REQUIRES failed at dml_kernel_context.cc:174 : Resource exhausted: OOM when allocating tensor with shape[16,128,98,98] and type float on /job:localhost/replica:0/task:0/device:DML:0 by allocator DmlAllocato.");
    assert_eq!(facts["device_index"], json!(0));
    let (_, facts, _, _) = one("ResourceExhaustedError: {{function_node __wrapped__AddV2_device_/job:localhost/replica:0/task:0/device:XPU:0}} OOM when allocating tensor with shape[3,3,2560,1280] and type float on /job:localhost/replica:0/task:0/device:XPU:0 by allocator Simple allocator [Op:AddV2]");
    assert_eq!(
        (&facts["allocator"], &facts["device_index"]),
        (&json!("Simple allocator"), &json!(0))
    );
    // directml-361: DirectML is a device.
    let (_, _, verdict, _) = one("[W dml_heap_allocator.cc:97] DML allocator out of memory!\nTraceback (most recent call last):\n  File \"/home/fnz/workspace/direct-ml/main.py\", line 9, in <module>\n    tensor1=tensor1.to(dml)\nRuntimeError: Unknown error -2147024882");
    assert_eq!(verdict, "undetermined");
    // imllib-spark-12: a device word only where a word starts (`tpu` is not in `input`); wgpu-9545:
    // a capital starts one inside an identifier (`kIOGPUCommandBuffer…`).
    let (_, _, verdict, _) = one("I tried to give an input with 600 fields and 13953 features and 2 factors. The size of input file is 41.1 MB. I encountered the \" java.lang.OutOfMemoryError: Java heap space\" .");
    assert_eq!(verdict, "host_oom");
    let (_, _, verdict, _) = one("Execution of the command buffer was aborted due to an error during execution. Insufficient Memory (00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory)");
    assert_eq!(verdict, "undetermined");
    // mlc-llm-974 / node-postgres-383: a code given as a field of the error; PostgreSQL's
    // `Failed on request of size N`.
    let (_, facts, _, _) = one("iconda\\envs\\mlc-llm-build\\conda-bld\\mlc-chat-cli-nightly-package_1694754606949\\work\\3rdparty\\tvm\\src\\runtime\\vulkan\\vulkan_buffer.cc:61: InternalError: Check failed: (__e == VK_SUCCESS) is false: Vulkan Error, code=-2: VK_ERROR_OUT_OF_DEVICE_MEMORY\nStack trace not available when DMLC_LOG_STACK_TRACE is disabled at compile time.");
    assert_eq!(facts, json!({"error_code": -2}));
    let (_, facts, _, _) = one("I'm seeing an error coming back from pg in production: \n{ [Error: out of memory] severity: 'ERROR', code: '53200', detail: 'Failed on request of size 16.', file: 'aset.c', line: '767', routine: 'AllocSetAlloc' }");
    assert_eq!(facts, json!({"requested_bytes": 16, "error_code": 53200}));
    // golang-11789: a negative size is an overflowed size computation.
    let (_, facts, verdict, _) =
        one("runtime: out of memory: cannot allocate -8410442019078995968-byte block");
    assert_eq!(
        (facts, verdict.as_str()),
        (json!({}), "request_exceeds_device")
    );
    // trt-inference-117: TensorRT's CUDA check with the code before its string, printed twice.
    let (kind, facts, _, _) = one("[08/03/2022-23:18:05] [E] [TRT] ../rtSafe/safeRuntime.cpp (25) - Cuda Error in allocate: 2 (out of memory)\n[08/03/2022-23:18:05] [E] [TRT] ../rtSafe/safeRuntime.cpp (25) - Cuda Error in allocate: 2 (out of memory)\nbuild engine done");
    assert_eq!(kind, "cuda_driver_oom");
    assert_eq!(
        facts,
        json!({"failed_call": "allocate", "cuda_error_code": 2, "error_string": "out of memory"})
    );
    // axolotl-998: a process figure above the whole device (2^64) holds nothing.
    let (_, _, verdict, _) = one("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacty of 24.00 GiB of which 0 bytes is free. Including non-PyTorch memory, this process has 17179869184.00 GiB memory in use. Process 2954422 has 17179869184.00 GiB memory in use. Of the allocated memory 23.01 GiB is allocated by PyTorch, and 121.23 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF");
    assert_eq!(verdict, "fragmentation");
    // ultralytics-843: a cut message's exception type tells its wording.
    let (kind, _, _, _) = one("```\nRuntimeError: CUDA out of memory. Tried to allocate 1.33 GiB \nTraceback (most recent call last):\n  File \"/opt/conda/bin/yolo\", line 33, in <module>");
    assert_eq!(kind, "torch_cuda_oom_old");
    // comfyui-4852 / comfyui-4880: the async backend's header under an error report's exception
    // type; its device index on its own line only.
    let (kind, facts, _, _) = one("# ComfyUI Error Report\n## Error Details\n- **Node Type:** KSampler\n- **Exception Type:** torch.OutOfMemoryError\n- **Exception Message:** Allocation on device \n## Stack Trace");
    assert_eq!((kind.as_str(), facts), ("torch_cuda_oom_async", json!({})));
    let (_, facts, _, _) = one("torch.OutOfMemoryError: Allocation on device \n\n2024-09-11 11:23:11,827 - root - ERROR - Got an OOM, unloading all loaded models.");
    assert_eq!(facts, json!({}));
    // habana-13 / emscripten-4760: an allocation of a stated size that failed; memory that could
    // not grow, with the setting's current value as its limit (advice after the report, in its
    // own sentence, does not make it advice).
    let (_, facts, _, _) = one("RuntimeError: FATAL ERROR :: MODULE:SYNHELPER workspace Allocation of size ::14493741952 failed");
    assert_eq!(facts, json!({"requested_bytes": 14493741952_i64}));
    let (_, facts, verdict, _) = one("Cannot enlarge memory arrays. Either (1) compile with  -s TOTAL_MEMORY=X  with X higher than the current value 67108864, (2) compile with  -s ALLOW_MEMORY_GROWTH=1  which adjusts the size at runtime but prevents some optimizations, (3) set Module.TOTAL_MEMORY to a higher value before the program runs, or if you want malloc to return NULL (0) instead of this abort, compile with  -s ABORTING_MALLOC=0 ");
    assert_eq!(
        (facts, verdict.as_str()),
        (json!({"memory_limit_bytes": 67108864}), "host_oom")
    );
}

/// Blind set 12's tuning-half wordings, one mechanism each, from their real messages (ids in
/// `blind-12-tune.jsonl`).
#[test]
fn blind_set_twelve_wordings_keep_their_facts() {
    // ccxt-25493: Go's runtime gives the block it could not get as an adjective.
    let (_, facts, verdict, _) = one("``` text\n\nruntime: out of memory: cannot allocate 4194304-byte block (6776643584 in use)\nfatal error: out of memory\nruntime stack:\nruntime.throw({0xe34ed8?, 0xc00008fe00?})\n\truntime/panic.go:1073 +0x48 fp=0xc00008fc50 sp=0xc00008fc20 pc=0x480768");
    assert_eq!(facts, json!({"requested_bytes": 4194304}));
    assert_eq!(verdict, "host_oom");
    // laerx-37: markdown italics around PHP's message.
    let (_, facts, _, _) = one("We are encountering a memory exhaustion issue in the project. Specifically, the error message is:\n\n_Allowed memory size of 536870912 bytes exhausted (tried to allocate 203427840 bytes)_");
    assert_eq!(
        facts,
        json!({"requested_bytes": 203427840, "memory_limit_bytes": 536870912})
    );
    // bitnami-27091: `OOMKilled` in prose is Kubernetes' reason.
    let (kind, facts, verdict, _) =
        one("### What do you see instead?\n\nThe pods are getting restarted with OOMKilled error");
    assert_eq!(
        (kind.as_str(), verdict.as_str()),
        ("oom_kill_report", "host_oom")
    );
    assert_eq!(
        facts,
        json!({"reporter": "kubernetes", "reason": "OOMKilled"})
    );
    // llm-pdf-translator-9: ONNX Runtime's arena failure cut by an issue title.
    let (kind, facts, _, _) = one("/onnxruntime_src/onnxruntime/core/framework/bfc_arena.cc:376 void* onnxruntime::BFCArena::AllocateRawInternal(size_t, bool, onnxruntime::Stream*, bool, onnxruntime::WaitNotificationFn) Failed to alloc");
    assert_eq!(kind, "nccl_or_other");
    assert_eq!(facts, json!({"subsystem": "onnxruntime"}));
    // db-benchmark-144: a 72-column terminal cut words in two; the nanny names the worker killed.
    let (kind, facts, verdict, _) = one("distributed.nanny - WARNING - Worker exceeded 95% memory budget. Restarti\nng\ndistributed.nanny - WARNING - Worker process 8999 was killed by unknown s\nignal\ndistributed.nanny - WARNING - Restarting worker");
    assert_eq!(
        (kind.as_str(), verdict.as_str()),
        ("oom_kill_report", "host_oom")
    );
    assert_eq!(facts, json!({"pid": 8999}));
    // torch-xla-1735: XLA on TPU reserving program memory, with its HBM report.
    let (kind, facts, verdict, _) = one("RuntimeError: Resource exhausted: From /job:tpu_worker/replica:0/task:0:\nAttempting to reserve 3.95G at the bottom of memory. That was not possible. There are 1.92G free, 0B reserved, and 1.92G reservable.; \nHBM capacity 8.00G:\n       Top-of-Memory reserved:  529.00M (     554,696,704 bytes)\n          Currently allocated:    6.08G (   6,532,939,776 bytes)\n          Program requirement:    3.95G (   4,237,689,856 bytes)\n                               ------------\n      Available after request:   -2.55G (  -2,735,391,744 bytes)\n; attempting reservation for program memory");
    assert_eq!(
        (kind.as_str(), verdict.as_str()),
        ("jax_xla_oom", "capacity")
    );
    assert_eq!(
        facts,
        json!({"requested_bytes": 4237689856_i64, "free_bytes": 2061584302_i64, "total_bytes": 8589934592_i64})
    );
}

/// Blind set 12's held-out families, measured twice and then fixed (set 12 is no longer blind),
/// one mechanism each, from their real messages (ids in `blind-12-heldout.jsonl`).
#[test]
fn blind_set_twelve_held_out_families_are_read() {
    // verl-302: a reader's words in any case (a title retyped in lower case).
    let (kind, facts, verdict, _) =
        one("cuda error: out of memory at /workspace/csrc/cumem_allocator.cpp:62");
    assert_eq!(
        (kind.as_str(), verdict.as_str()),
        ("cuda_driver_oom", "contention")
    );
    assert_eq!(
        facts,
        json!({"error_string": "out of memory", "location": "/workspace/csrc/cumem_allocator.cpp:62"})
    );
    // mmdet-6993: the DataLoader's bus error in lower case, a comma for its period.
    let (kind, facts, verdict, _) = one("I train models \"without\" using docker but I meet \"unexpected bus error encountered in worker, This might be caused by insufficient shared memory (shm)\"");
    assert_eq!(
        (kind.as_str(), verdict.as_str()),
        ("oom_kill_report", "host_oom")
    );
    assert_eq!(
        facts,
        json!({"reporter": "dataloader", "signal": "Bus error"})
    );
    // booru-112: the exception's string logged again, without its type, after the traceback is
    // the same failure; the same full message again further on is a second one.
    let told = "RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1.\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n\nInterrogate Request!\nNetwork:  [interrogator_network: \"BLIP\"\n]\nFile size:  20132\nUnloading interrogator blip2-opt-6.7b\nException processing item!\nException string: 'CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1.\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n'";
    let (_, facts, _, _) = one(told);
    assert_eq!(
        facts,
        json!({"exception_type": "RuntimeError", "error_string": "out of memory"})
    );
    let twice = "RuntimeError: CUDA error: out of memory\nstep 2 loss 1.9\nTraceback (most recent call last):\n  File \"train.py\", line 1\nRuntimeError: CUDA error: out of memory";
    assert_eq!(diagnose(twice, &Context::default()).len(), 2);
    // helios-62: Ascend's graph engine states its size and device as `key:value` pairs in the
    // traceback lines under the logger's header; the header's `[PID: N]` is the logger's.
    let (kind, facts, verdict, _) = one("ERROR 04-09 21:56:46 [diffusion_engine.py:82] [PID: 210907] 2026-04-09-21:56:40.384.694 Memory_Allocation_Failure(EL0004): Failed to allocate memory requested by GE module.\nERROR 04-09 21:56:46 [diffusion_engine.py:82]         Possible Cause: Available memory is insufficient.\nERROR 04-09 21:56:46 [diffusion_engine.py:82]         Solution: Close applications not in use.\nERROR 04-09 21:56:46 [diffusion_engine.py:82]         TraceBack (most recent call last):\nERROR 04-09 21:56:46 [diffusion_engine.py:82]         Call rtMalloc fail, purpose: page caching, type = 2, size:3221291008, device_id:0[FUNC:Alloc][FILE:device_allocator.cc][LINE:72]\nERROR 04-09 21:56:46 [diffusion_engine.py:82]         Call rtMalloc fail, purpose: page caching, type = 2, size:1610678272, device_id:0[FUNC:Alloc][FILE:device_allocator.cc][LINE:72]\nERROR 04-09 21:56:46 [diffusion_engine.py:82]         [Exec][Op]Execute op failed. op type = Conv2D, ge result = 4294967295[FUNC:ReportCallError][FILE:acl_op_executor_log_inner.cpp][LINE:124]");
    assert_eq!(
        (kind.as_str(), verdict.as_str()),
        ("generic_oom", "capacity")
    );
    assert_eq!(
        facts,
        json!({"requested_bytes": 3221291008_i64, "device_index": 0})
    );
    // diffsynth-300: a request larger than any accelerator, on a device the text does not size.
    let (_, _, verdict, _) = one("但是报错torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1263.35 GiB. 这里一千多g过于离谱");
    assert_eq!(verdict, "request_exceeds_device");
    // torch-xla-3470: more free than the request, yet not reservable in one piece.
    let (_, _, verdict, _) = one("2022-04-04 00:27:49.642380: E tensorflow/compiler/xla/xla_client/xla_util.cc:88]   (1) RESOURCE_EXHAUSTED: Attempting to reserve 6.48G at the bottom of memory. That was not possible. There are 6.78G free, 0B reserved, and 3.33G reservable.");
    assert_eq!(verdict, "fragmentation");
}

/// Blind set 13's held-out misses, fixed in the generic layer so that families never seen gain
/// too (ids in `blind-13-heldout.jsonl`; set 13 is no longer blind since).
#[test]
fn blind_set_thirteen_held_out_families_are_read_by_the_generic_layer() {
    // optimum-habana-1469: an allocation that failed for a size (`size::N`); DEVMEM is device
    // memory, and `[Rank:0]` is no device.
    let (kind, facts, verdict, _) = one("RuntimeError: [Rank:0] FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed for size::234881024 (224)MB");
    assert_eq!(
        (kind.as_str(), facts, verdict.as_str()),
        (
            "generic_oom",
            json!({"requested_bytes": 234881024}),
            "capacity"
        )
    );
    // directml-579: a size a few words after `allocate`.
    let (_, facts, verdict, _) = one("RuntimeError: Could not allocate tensor with 234881024 bytes. There is not enough GPU video memory available!");
    assert_eq!(
        (facts, verdict.as_str()),
        (json!({"requested_bytes": 234881024}), "capacity")
    );
    // llamacpp-6987: a line that is only `out of memory` ends the line before it (Metal's).
    let (_, _, verdict, _) =
        one("ggml_metal_graph_compute: command buffer 6 failed with status 5\nout of memory");
    assert_eq!(verdict, "undetermined");
    // cpm-paddle-7: the vocabulary in the reporter's language, its size and device read around
    // the English tokens.
    let (_, facts, verdict, _) = one("GPU 0上出现内存不足错误。无法在GPU 0上分配50.000000MB内存，已分配11.999512 GB内存，可用内存仅为0.000000B。\n这提示不对劲啊？是我哪里弄错了吗");
    assert_eq!(
        (facts, verdict.as_str()),
        (
            json!({"requested_bytes": 52428800, "device_index": 0}),
            "capacity"
        )
    );
    // trtllm-1670: the same thread repeating its warning pair is one failure; comfyui-7481: the
    // same message under an issue template's two headings is one.
    let nccl = "VM-0-16-ubuntu:392:494 [2] enqueue.cc:43 NCCL WARN Cuda failure 'out of memory'\n\nVM-0-16-ubuntu:392:494 [2] enqueue.cc:54 NCCL WARN Cuda failure 'invalid resource handle'\n\nVM-0-16-ubuntu:392:494 [2] enqueue.cc:43 NCCL WARN Cuda failure 'out of memory'\n\nVM-0-16-ubuntu:392:494 [2] enqueue.cc:54 NCCL WARN Cuda failure 'invalid resource handle'";
    assert_eq!(diagnose(nccl, &Context::default()).len(), 1);
    let template = "### Expected Behavior\n\n[enforce fail at alloc_cpu.cpp:115] data. DefaultCPUAllocator: not enough memory: you tried to allocate 3376447488 bytes.\n\n### Actual Behavior\n\n[enforce fail at alloc_cpu.cpp:115] data. DefaultCPUAllocator: not enough memory: you tried to allocate 3376447488 bytes.";
    assert_eq!(diagnose(template, &Context::default()).len(), 1);
    // easydiffusion-289 (blind set 9): a title that states the cause, then the full message in
    // the body, is one failure with the full message's facts.
    let (_, facts, _, _) = one("DefaultCPUAllocator: not enough memory\n\nExtend: RuntimeError: [enforce fail at C:\\cb\\pytorch_1000000000000\\work\\c10\\core\\impl\\alloc_cpu.cpp:81] data. DefaultCPUAllocator: not enough memory: you tried to allocate 151781376 bytes.");
    assert_eq!(facts["requested_bytes"], json!(151781376));
    // sygil-905: PyTorch's CPU allocator's message cut after its cause.
    let (kind, facts, verdict, _) = one("### What happened?\n\nDefaultCPUAllocator: not enough memory\n\nI have 16G ram, looks like not enough");
    assert_eq!(
        (kind.as_str(), facts, verdict.as_str()),
        ("torch_cpu_oom", json!({}), "host_oom")
    );
    // mlx-3849: an allocator's own limit passed (a count of buffers, not bytes).
    let (_, facts, verdict, _) = one("I encountered the following error while running an MLX workload:\n\n    [metal::malloc] Resource limit (499000) exceeded.\n");
    assert_eq!((facts, verdict.as_str()), (json!({}), "allocator_limit"));
    // cudajl-2292: an out-of-memory error type in camel case (`OutOfGPUMemoryError`), in any
    // case, even as a stack frame's constructor.
    let (_, facts, verdict, _) = one("Unhandled Task ERROR: StackOverflowError:\nStacktrace:\n     [6] CUDA.OutOfGPUMemoryError(sz::Int64)\n       @ CUDA C:\\Users\\nicho\\.julia\\packages\\CUDA\\htRwP\\src\\pool.jl:338\n     [7] CUDA.OutOfGPUMemoryError()\n       @ CUDA C:\\Users\\nicho\\.julia\\packages\\CUDA\\htRwP\\src\\pool.jl:333");
    assert_eq!((facts, verdict.as_str()), (json!({}), "undetermined"));
    // exposed-594 / tbase-153: a label line right after the report (`DETAIL:`, `HINT:`, in any
    // language, also after the logger's header) goes on with it; `request size (currently N
    // bytes)`; the logger's `[27068,…]` is no pid.
    let (_, facts, verdict, _) = one("org.jetbrains.exposed.exceptions.ExposedSQLException: org.postgresql.util.PSQLException: FATAL: out of memory\nПодробности: Failed on request of size 12288 in memory context \"TopMemoryContext\".\nSQL: [Failed on expanding args for SELECT: org.jetbrains.exposed.sql.Query@27ec0435]");
    assert_eq!(
        (facts, verdict.as_str()),
        (json!({"requested_bytes": 12288}), "host_oom")
    );
    let (_, facts, _, _) = one("2025-01-08 15:22:04.363 CST [27068,coord(0.0)] FATAL:  could not map anonymous shared memory: 无法分配内存\n2025-01-08 15:22:04.363 CST [27068,coord(0.0)] HINT:  This error usually means that PostgreSQL's request for a shared memory segment exceeded available memory, swap space, or huge pages. To reduce the request size (currently 2495567072 bytes), reduce PostgreSQL's shared memory usage, perhaps by reducing shared_buffers or max_connections.\n2025-01-08 15:22:04.363 CST [27068,coord(0.0)] LOG:  database system is shut down");
    assert_eq!(facts, json!({"requested_bytes": 2495567072_i64}));
    // fastq-bio-5: a message whose quote and bracket are still open goes on over the next lines
    // (the setting's current value is its limit).
    let (_, facts, verdict, _) = one("uncaught exception: abort(\"Cannot enlarge memory arrays.\nEither (1) compile with  -s TOTAL_MEMORY=X  with X higher than the current value 16777216,\n(2) compile with  -s ALLOW_MEMORY_GROWTH=1  which allows increasing the size at runtime,\nor (3) if you want malloc to return NULL (0) instead of this abort, compile with  -s ABORTING_MALLOC=0 \").\nBuild with -s ASSERTIONS=1 for more info.");
    assert_eq!(
        (facts, verdict.as_str()),
        (json!({"memory_limit_bytes": 16777216}), "host_oom")
    );
}

/// The generic layer's verdict from what a message of an unknown family states: a request above
/// all the memory it names, one refused with more than it free, device words or host words.
#[test]
fn the_generic_verdict_follows_the_stated_figures() {
    // A made-up runtime's wordings (no family reads them): the generic layer judges them.
    let (_, facts, verdict, _) =
        one("FooRT error: failed to allocate 40 GiB on gpu:1, total memory: 24 GiB");
    assert_eq!(
        (facts, verdict.as_str()),
        (
            json!({"requested_bytes": 42949672960_i64, "device_index": 1}),
            "request_exceeds_device"
        )
    );
    let (_, _, verdict, _) =
        one("FooRT error: failed to allocate 2 GiB on GPU 0 (out of memory): 6 GiB free");
    assert_eq!(verdict, "fragmentation");
    let (_, _, verdict, _) =
        one("FooRT error: failed to allocate 2 GiB of host memory (out of memory): 1 GiB free");
    assert_eq!(verdict, "host_oom");
}

/// One line of figures: cases, found, every fact, verdicts (of the cases that name one).
fn figures(file: &str, outcomes: &[Outcome]) -> String {
    let n = outcomes.len();
    let found = outcomes.iter().filter(|o| o.found).count();
    let facts = outcomes.iter().filter(|o| o.facts).count();
    let judged = outcomes.iter().filter(|o| o.verdict.is_some()).count();
    let verdicts = outcomes.iter().filter(|o| o.verdict == Some(true)).count();
    let pct = |a: usize, b: usize| 100.0 * a as f64 / b.max(1) as f64;
    format!(
        "{file}: {n} cases; found {found}/{n} ({:.1}%), every fact {facts}/{n} ({:.1}%), verdicts {verdicts}/{judged} ({:.1}%)",
        pct(found, n),
        pct(facts, n),
        pct(verdicts, judged)
    )
}

fn meets_thresholds(files: &[&str]) {
    let file = files.join("+");
    let cases: Vec<Value> = files.iter().flat_map(|f| cases(f)).collect();
    let outcomes: Vec<Outcome> = cases.iter().map(outcome).collect();
    println!("{}", figures(&file, &outcomes));
    let n = outcomes.len() as f64;
    let found = outcomes.iter().filter(|o| o.found).count() as f64;
    let facts = outcomes.iter().filter(|o| o.facts).count() as f64;
    let judged = outcomes.iter().filter(|o| o.verdict.is_some()).count() as f64;
    let verdicts = outcomes.iter().filter(|o| o.verdict == Some(true)).count() as f64;
    let misses: Vec<&str> = outcomes
        .iter()
        .filter(|o| !o.found || !o.facts || o.verdict == Some(false))
        .map(|o| o.detail.as_str())
        .collect();
    let summary = format!(
        "found {found}/{n}, facts {facts}/{n}, verdicts {verdicts}/{judged}; misses:\n{}",
        misses.join("\n")
    );
    assert!(cases.len() >= 20, "only {} {file} cases", cases.len());
    assert!(found / n >= 0.97, "{summary}");
    assert!(facts / n >= 0.95, "{summary}");
    assert!(verdicts / judged >= 0.90, "{summary}");
}

/// FNV-1a, 64-bit: the split's seeded hash (see the corpus README).
/// Blind set 18 (83 messages, by a twelfth author; tuning half 34, held-out 49):
/// `blind_set_is_split_by_its_seed_and_measured`. Every tuning message is found; one
/// (fixwikihub-numpy-ndarray-prefix, a page's bulleted list of symptoms whose last bullet reads as
/// a second kill report) is judged a label question, so the tuning half is held to every message
/// found and 97% of them with exactly their facts.
#[test]
fn the_eighteenth_blind_set_is_split_by_its_seed_and_measured() {
    blind_set_is_split_by_its_seed_and_measured(18, TuningBar::FoundAndFacts(0.97));
}

/// Blind set 19 (88 messages, by a thirteenth author; tuning half 44, held-out 44, 26 of them
/// negative cases that must give no finding): `blind_set_is_split_by_its_seed_and_measured`.
#[test]
fn the_nineteenth_blind_set_is_split_by_its_seed_and_measured() {
    blind_set_is_split_by_its_seed_and_measured(19, TuningBar::EveryFact);
}

/// Blind set 19's tuning-half misses, one mechanism each, from their real messages (ids in
/// `blind-19-tune.jsonl`): each is found once with its labelled facts and verdict, and the look-
/// alikes stay no failure.
#[test]
fn blind_set_nineteen_wordings_keep_their_facts() {
    // A library's exception type ending in MemoryError, bare (arrow-2549) and with the C
    // allocator's call and size (img2dataset-443).
    let (kind, facts, verdict, _) = one("  File \"pyarrow/error.pxi\", line 85, in pyarrow.lib.check_status\npyarrow.lib.ArrowMemoryError");
    assert_eq!(
        (kind.as_str(), verdict.as_str()),
        ("generic_oom", "host_oom")
    );
    assert_eq!(facts, json!({}));
    let (_, facts, _, _) =
        one("    raise value\npyarrow.lib.ArrowMemoryError: realloc of size 2172846080 failed");
    assert_eq!(facts, json!({"requested_bytes": 2172846080u64}));
    // std::bad_alloc as MSVC words it, with the code a caller adds (dotnet-ml-3615, lightgbm-4612).
    let (_, facts, verdict, _) =
        one("Get an exception  with an error code -1 and an error message of 'bad allocation'.");
    assert_eq!(facts, json!({"error_code": -1}));
    assert_eq!(verdict, "host_oom");
    let (kind, _, verdict, _) = one("LightGBMError: bad allocation\n\nI have 32GB RAM, so how could a dataset of this size not fit into memory?");
    assert_eq!(
        (kind.as_str(), verdict.as_str()),
        ("generic_oom", "host_oom")
    );
    // A userspace OOM killer's low-memory state and the kill it leads to (earlyoom-205).
    let (kind, facts, verdict, _) = one("mem avail:    21 of   950 MiB ( 2.27%), swap free:   81 of 1023 MiB ( 7.95%)\nlow memory! at or below SIGTERM limits: mem 10.00%, swap 15.00%\nsending SIGTERM to process 397 uid 61876 \"earlyoom\": badness 0, VmRSS 1 MiB");
    assert_eq!(
        (kind.as_str(), verdict.as_str()),
        ("oom_kill_report", "host_oom")
    );
    assert_eq!(facts, json!({"pid": 397, "process_memory_bytes": 1048576}));
    // Rust's abort with its size masked (nextpolish2-4).
    let (kind, facts, _, _) =
        one("constantly got the error of \"memory allocation of xxx bytes failed\".");
    assert_eq!(kind, "rust_alloc_failure");
    assert_eq!(facts, json!({}));
    for negative in [
        // A low-memory state with no kill after it, and systemd starting earlyoom (earlyoom-269).
        "low memory! at or below SIGTERM limits: mem 10 %, swap 10 %\nmem avail:  9700 of 13855 MiB (70 %)",
        "mars 27 18:46:05 user-G3-3779-pro systemd[1]: Started Early OOM Daemon.",
        // An allocation that failed for another cause than memory (triton-3174).
        "        CPU_PINNED: failed to allocate pinned system memory: CUDA driver version is insufficient for CUDA runtime version\n        CPU_PINNED_POOL: failed to allocate pinned system memory: no pinned memory pool",
    ] {
        let found = diagnose(negative, &Context::default());
        assert!(found.is_empty(), "{negative}\n{found:?}");
    }
    // ... while a cause that is memory's keeps the failure.
    let (kind, _, _, _) = one("failed to allocate 2.12G (2282521344 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY: out of memory");
    assert_eq!(kind, "cuda_driver_oom");
}

/// The families blind set 19's held-out misses revealed, one mechanism each, from their real
/// messages (ids in `blind-19-heldout.jsonl`; the set is no longer blind since).
#[test]
fn blind_set_nineteen_held_out_families_are_read() {
    // The kernel's page allocation failure (systemd-36434).
    let (kind, _, verdict, _) = one("[638074.104526] kernel: kswapd0: page allocation failure: order:0, mode:0x40cc0(GFP_KERNEL|__GFP_COMP), nodemask=(null),cpuset=/,mems_allowed=0");
    assert_eq!(
        (kind.as_str(), verdict.as_str()),
        ("generic_oom", "host_oom")
    );
    // Java's `error=N` (openj9-14353).
    let (_, facts, _, _) = one("win2012-x86-1 CreateProcess error=1455, The paging file is too small for this operation to complete");
    assert_eq!(facts, json!({"error_code": 1455}));
    // A size labelled `byte size`, and a runtime that falls back or retries another way
    // (triton-1765, fooocus-1032).
    let (_, facts, verdict, _) = one("Failed to allocate CUDA memory with byte size 78643200 on GPU 0: CNMEM_STATUS_OUT_OF_MEMORY, falling back to pinned system memory");
    assert_eq!(
        facts,
        json!({"requested_bytes": 78643200, "device_index": 0})
    );
    assert_eq!(verdict, "non_fatal");
    let (_, _, verdict, _) = one(
        "Warning: Ran out of memory when regular VAE decoding, retrying with tiled VAE decoding.",
    );
    assert_eq!(verdict, "non_fatal");
    // A failure to lock memory is the lock limit: only the kill counts (earlyoom-131).
    let found = diagnose("Could not lock memory - continuing anyway: Cannot allocate memory\nlow memory! at or below SIGTERM limits: mem 50 %, swap 10 %\nsending SIGTERM to process 12006 \"python3\": badness 209, VmRSS 2891 MiB", &Context::default());
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        found[0].facts.get("pid"),
        Some(&memsight_analysis::diagnose::Fact::Int(12006))
    );
    // A shell prompt's host name is no sign of training; an inference script is inference
    // (propainter-10).
    assert_eq!(
        workload_of("(propainter) [root@l-ai-training-server1.int.prod.ten.dm ProPainter]# python inference_propainter.py\nRuntimeError: [enforce fail at CPUAllocator.cpp:64] . DefaultCPUAllocator: can't allocate memory: you tried to allocate 10230727680 bytes. Error code 12 (Cannot allocate memory)"),
        "inference"
    );
    for negative in [
        // Docker's state without quotes (cloudcmd-440), a writer's denial (pytorch-7129), a
        // case considered (dask-2694).
        "`State:{\nExitCode:137,\nOOMKilled:false,\nStatus:\"exited\"\n}`",
        "Meanwhile I watched GPU memery with nvidia-smi, it's not a problem about OOM.",
        "* if they're running out of memory the nanny will kill them and return `KilledWorker`",
    ] {
        let found = diagnose(negative, &Context::default());
        assert!(found.is_empty(), "{negative}\n{found:?}");
    }
}

/// Blind set 18's tuning-half misses, one mechanism each, from their real messages (ids in
/// `blind-18-tune.jsonl`): each is found once with exactly its labelled facts and verdict; and the
/// new words stay out of ordinary lines.
#[test]
fn blind_set_eighteen_wordings_keep_their_facts() {
    // A CUDA error's place in parentheses, the closing one lost (lc0-927).
    let (kind, facts, _, _) = one("error CUDA error: out of memory (c:\\projects\\lc0\\src\\neural\\cuda\\network_cudnn.cc:442\n\nany idea what caused this?");
    assert_eq!(kind, "cuda_driver_oom");
    assert_eq!(
        facts,
        json!({"error_string": "out of memory", "location": "c:\\projects\\lc0\\src\\neural\\cuda\\network_cudnn.cc:442"})
    );
    // The driver call named before the status and a colon (dreyeve-23, libgpuarray).
    let (kind, facts, _, _) = one("pygpu.gpuarray.GpuArrayException: cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY: out of memory\nInputs types: [TensorType(int64, scalar), TensorType(int64, scalar)]");
    assert_eq!(kind, "cuda_driver_oom");
    assert_eq!(
        facts,
        json!({"exception_type": "pygpu.gpuarray.GpuArrayException", "failed_call": "cuMemAlloc", "cuda_error": "CUDA_ERROR_OUT_OF_MEMORY", "error_string": "out of memory"})
    );
    // A status's number before it (geti-1075, physical-ai-studio-440: Level Zero through SYCL).
    for text in [
        "    data_output = data.to(device, **kwargs)\nRuntimeError: Native API failed. Native API returns: 39 (UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY)",
        "terminate called after throwing an instance of 'sycl::_V1::exception'\n  what():  Enqueue process failed.\nlevel_zero backend failed with error: 39 (UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY)\nFatal Python error: Aborted",
    ] {
        let (kind, facts, verdict, _) = one(text);
        assert_eq!(
            (kind.as_str(), verdict.as_str()),
            ("generic_oom", "undetermined"),
            "{text}"
        );
        assert_eq!(facts, json!({"error_code": 39}), "{text}");
    }
    // An automatic batch-size search that gave up (accelerate-1934): a device failure of no size.
    let (kind, facts, verdict, _) =
        one("RuntimeError: No executable batch size found, reached zero.");
    assert_eq!(
        (kind.as_str(), verdict.as_str()),
        ("generic_oom", "undetermined")
    );
    assert_eq!(facts, json!({}));
    // The kubelet's CgroupOOM event in a describe block (k8s-100487).
    let (kind, facts, verdict, _) = one("Events:\n  Type     Reason     Age                From               Message\n  ----     ------     ----               ----               -------\n  Normal   Pulled     28s                kubelet            Successfully pulled image \"polinux/stress\" in 1.145060952s\n  Warning  CgroupOOM  28s                kubelet            Cgroup OOM encountered, victim process: stress, pid: 470521");
    assert_eq!(
        (kind.as_str(), verdict.as_str()),
        ("oom_kill_report", "host_oom")
    );
    assert_eq!(
        facts,
        json!({"reporter": "kubernetes", "reason": "CgroupOOM", "pid": 470521})
    );
    // XLA:TPU's TensorCore and SparseCore usage past the device (openxla-e1000).
    let (kind, facts, verdict, _) = one("RESOURCE_EXHAUSTED: TPU TensorCore Hbm usage: 34.82G, SparseCore Hbm usage 174.10G, exceeding available bytes: 95.74G");
    assert_eq!(
        (kind.as_str(), verdict.as_str()),
        ("jax_xla_oom", "capacity")
    );
    assert_eq!(facts, json!({"total_bytes": 102_800_042_230_u64}));
    // PyTorch's message cut inside the device clause, after a test's intent to cause it
    // (pytorch-177714): the device it names; the intent is no report.
    let (kind, facts, _, _) = one("Attempting to force OOM...\n  Allocated tensor 12: 11.00 GB total\n✓ OOM triggered at iteration 12: XPU out of memory. Tried to allocate 1024.00 MiB. GPU 0 has a");
    assert_eq!(kind, "torch_cuda_oom_new");
    assert_eq!(
        facts,
        json!({"backend": "XPU", "requested_bytes": 1_073_741_824_u64, "device_index": 0})
    );
    // A trainer that caught the failure and goes on with a smaller batch (dreambooth-852).
    let (kind, _, verdict, _) = one("OOM Detected, reducing batch/grad size to 12/1.");
    assert_eq!(
        (kind.as_str(), verdict.as_str()),
        ("generic_oom", "non_fatal")
    );
    // Advice to do so is no recovery.
    let (_, _, verdict, _) =
        one("RuntimeError: out of memory. Please try reducing the batch size to 4.");
    assert_ne!(verdict, "non_fatal");
    // Training told by a wish to train (easydiffusion-1027).
    assert_eq!(
        workload_of(
            "I try to train in SD-WebUI，but it alwasy tell me ’CUBLAS_STATUS_ALLOC_FAILED ‘"
        ),
        "training"
    );
    // The words stay out of ordinary lines.
    for line in [
        "Native API returns: 0 (UR_RESULT_SUCCESS)",
        "batch size found: 32 (reduced from 64)",
        "kubectl describe pod -n default memory-demo-2",
        "we force-pushed the branch to trigger the CI again",
    ] {
        assert!(diagnose(line, &Context::default()).is_empty(), "{line}");
    }
}

/// Blind set 18's held-out misses, looked at only after its tuning half was fixed and the other
/// sets re-measured; one general mechanism each, from the real messages (ids in
/// `blind-18-heldout.jsonl`), with lines each must leave alone.
#[test]
fn blind_set_eighteen_held_out_families_are_read() {
    // torchrun's ChildFailedError summary of a rank ended by signal 9 (cppo-6).
    let (kind, facts, verdict, _) = one("Root Cause (first observed failure):\n[0]:\n  time      : 2025-05-21_15:43:03\n  host      : mlxlab115rp2n7682d40d9-20250521025625-6dyyd3-8nir8b-worker\n  rank      : 0 (local_rank: 0)\n  exitcode  : -9 (pid: 14750)\n  error_file: <N/A>\n  traceback : Signal 9 (SIGKILL) received by PID 14750");
    assert_eq!(
        (kind.as_str(), verdict.as_str()),
        ("oom_kill_report", "host_oom")
    );
    assert_eq!(
        facts,
        json!({"reporter": "torchrun", "exit_code": -9, "pid": 14750})
    );
    // Every rank of one job logging NCCL's failure at once (megatron-bridge-771): one failure,
    // the first rank's.
    let found = diagnose("[2025-09-24 16:15:28] cw-dfw-h100-001-132-026:2999605:3004403 [0] include/alloc.h:228 NCCL WARN Cuda failure 2 'out of memory'\n\n[2025-09-24 16:15:28] cw-dfw-h100-001-132-026:3000032:3004399 [4] include/alloc.h:228 NCCL WARN Cuda failure 2 'out of memory'\n\n[2025-09-24 16:15:28] cw-dfw-h100-001-132-026:2999784:3004405 [3] include/alloc.h:228 NCCL WARN Cuda failure 2 'out of memory'", &Context::default());
    assert_eq!(found.len(), 1, "{found:?}");
    // PyTorch's headline without its period at a title's end (internlm-186), and its request
    // cut by a writer's ellipsis (coldfusion-peft).
    let (kind, facts, _, _) =
        one("[Bug] 使用8卡进行训练，报错：torch.cuda.OutOfMemoryError: CUDA out of memory");
    assert_eq!(kind, "torch_cuda_oom_new");
    assert_eq!(facts, json!({"backend": "CUDA"}));
    let (kind, facts, _, _) = one("Then, before the first epoch even starts, you hit the wall:  RuntimeError: CUDA out of memory. Tried to allocate... This is the single most common barrier.");
    assert_eq!(kind, "torch_cuda_oom_old");
    assert_eq!(facts, json!({"backend": "CUDA"}));
    // Exit 137 as a status code with its memory cause (bugbug-3906).
    let (kind, facts, _, _) = one("Status code 137 indicates OOM error in the docker container.");
    assert_eq!(kind, "oom_kill_report");
    assert_eq!(facts, json!({"exit_code": 137}));
    // The words in the other order, with a failed call's code (paddledetection-4179, Kunlun).
    let (kind, facts, _, _) = one("ioctl() fail, (705) Device memory not enough");
    assert_eq!(kind, "generic_oom");
    assert_eq!(facts, json!({"error_code": 705}));
    // More than there is (ddcap-39, Kaggle).
    let (kind, _, verdict, _) =
        one("Your notebook tried to allocate more memory than is available. It has restarted.");
    assert_eq!(
        (kind.as_str(), verdict.as_str()),
        ("generic_oom", "host_oom")
    );
    // Ray's report cut before its figures (llamafactory-9258).
    let (kind, facts, _, _) = one("Memory on the node (IP: 10.1.180.84, ID: ba65c80c8aec6b1c406693f640c53f85422d4d73b069747d69875d42) where the task (task ID: d221d26232c9bae05def6a6d00dbd292d4fc77cc01000000, name=head, rank=0,, pid=4503, memory used");
    assert_eq!(kind, "oom_kill_report");
    assert_eq!(facts, json!({"reporter": "ray", "pid": 4503}));
    // Inductor's autotuner warning from its own module, before its table (sam2-592).
    let (_, _, verdict, _) = one("W0306 14:40:15.993000 1719866 .venv/lib/python3.12/site-packages/torch/_inductor/select_algorithm.py:1517] [2/0] out of resource: shared memory, Required: 262144, Hardware limit: 101376. Reducing block sizes or `num_stages` may help.\nAUTOTUNE mm(16384x128, 128x256)");
    assert_eq!(verdict, "non_fatal");
    // XLA:TPU's allocation larger than the memory (openxla oom_debugging).
    let (kind, facts, verdict, _) = one("XlaRuntimeError: RESOURCE_EXHAUSTED: Allocation (size=107374182400) would exceed memory (size=17179869184) :: #allocation7 [shape = 'u8[327680,327680]{1,0:T(8,128)(4,1)}', space=hbm, size = 0xffffffffffffffff, tag = 'output of xor_convert_fusion@{}'] :: <no-hlo-instruction>");
    assert_eq!(
        (kind.as_str(), verdict.as_str()),
        ("jax_xla_oom", "request_exceeds_device")
    );
    assert_eq!(
        facts,
        json!({"requested_bytes": 107_374_182_400_u64, "total_bytes": 17_179_869_184_u64})
    );
    // Training in Chinese, a trainer's module, a backticked model name (uniem-136, composer-3397,
    // bugbug-3906).
    for text in [
        "在微调模型中，执行 run() 方法时，未指定 batch_size，会报错 RuntimeError: No executable batch size found, reached zero. 有点奇怪",
        "The `_is_cuda_oom` method in `trainer/trainer.py` detects CUDA OOM errors.\nIt seems the error I got has the message `CUDA error: out of memory`, so is not caught.",
        "Status code 137 indicates OOM error in the docker container. Currently, we train the `stepstoreproduce` model on a worker.",
    ] {
        assert_eq!(workload_of(text), "training", "{text}");
    }
    // The words stay out of ordinary lines, and ranks on different hosts stay apart.
    for line in [
        "the pool has more memory than the request needs",
        "exitcode  : 1 (pid: 14750)",
        "Status code 200 OK",
    ] {
        assert!(diagnose(line, &Context::default()).is_empty(), "{line}");
    }
    let found = diagnose("hosta:11:21 [0] include/alloc.h:228 NCCL WARN Cuda failure 2 'out of memory'\nhostb:12:22 [0] include/alloc.h:228 NCCL WARN Cuda failure 2 'out of memory'", &Context::default());
    assert_eq!(found.len(), 2, "{found:?}");
}

fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[test]
fn the_split_is_the_seeded_hash_of_the_id() {
    for (half, odd) in [("tune", false), ("heldout", true)] {
        for c in cases(half) {
            let id = c["id"].as_str().unwrap();
            assert_eq!(
                fnv1a(&format!("issue39-split:{id}")) % 2 == 1,
                odd,
                "{id} is in {half}"
            );
        }
    }
}

/// One diagnosis of `text`: (kind, facts, verdict, first remedy).
fn one(text: &str) -> (String, Value, String, String) {
    let found = diagnose(text, &Context::default());
    assert_eq!(found.len(), 1, "{text}\n{found:?}");
    let d: Value = serde_json::from_str(&serde_json::to_string(&found[0]).unwrap()).unwrap();
    (
        d["kind"].as_str().unwrap().to_string(),
        d["facts"].clone(),
        d["verdict"].as_str().unwrap().to_string(),
        d["remedies"][0]["id"].as_str().unwrap().to_string(),
    )
}

/// The families the issue names, each from a real message (source in the comment), with facts,
/// a verdict and the first remedy that fits it.
#[test]
fn every_family_the_issue_names_is_found_with_facts_and_a_verdict() {
    // Slurm, old wording: github.com/hafs-community/HAFS/issues/101.
    let (k, f, v, r) = one("slurmstepd: error: Detected 1 oom-kill event(s) in step 3495064.0 cgroup. Some of your processes may have been killed by the cgroup out-of-memory handler.");
    assert_eq!(
        (k.as_str(), v.as_str(), r.as_str()),
        ("oom_kill_report", "host_oom", "slurm_mem")
    );
    assert_eq!(f["step_id"], "3495064.0");
    // Slurm, new wording: github.com/chrisknewman/tusas/issues/149.
    let (_, f, v, _) = one("slurmstepd: error: Detected 1 oom_kill event in StepId=440575.0. Some of the step tasks have been OOM Killed.\nsrun: error: nid001277: tasks 1-3: Out Of Memory");
    assert_eq!(
        (f["oom_kill_events"].as_i64(), v.as_str()),
        (Some(1), "host_oom")
    );
    // Kubernetes, `kubectl get pods`: github.com/flyteorg/flyte/issues/3686.
    let (_, f, _, r) = one("NAME                              READY   STATUS      RESTARTS   AGE\nfc6b601ca7bb04acb911-n0-0-dn0-0   0/1     OOMKilled   0          126m");
    assert_eq!(
        (f["pod"].as_str(), r.as_str()),
        (Some("fc6b601ca7bb04acb911-n0-0-dn0-0"), "k8s_memory_limit")
    );
    // Kubernetes, `kubectl describe pod`: github.com/starburstdata/starburst-terraform/pull/1.
    let (_, f, _, _) = one("    State:          Terminated\n      Reason:       OOMKilled\n      Exit Code:    137\n    Restart Count:  5\n    Limits:\n      cpu:     100m\n      memory:  300Mi\n    Requests:\n      cpu:     100m\n      memory:  300Mi");
    assert_eq!(
        (f["exit_code"].as_i64(), f["memory_limit_bytes"].as_i64()),
        (Some(137), Some(300 << 20))
    );
    // cuBLAS: github.com/QwenLM/Qwen3/issues/873; cuDNN: github.com/microsoft/CNTK/issues/220.
    let (k, f, v, r) = one(
        "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    );
    assert_eq!(
        (k.as_str(), v.as_str(), r.as_str()),
        ("library_alloc_failed", "capacity", "library_workspace")
    );
    assert_eq!(f["failed_call"], "cublasCreate(handle)");
    let (_, f, _, _) = one("cuDNN failure 2: CUDNN_STATUS_ALLOC_FAILED ; GPU=0 ; hostname=PTNUWCL5099642 ; expr=finder(calgo, algoPerf)");
    assert_eq!(
        (f["library"].as_str(), f["device_index"].as_i64()),
        (Some("cudnn"), Some(0))
    );
    // NCCL inside a DistBackendError: github.com/NVIDIA/nccl/issues/1410 prints this shape with
    // `Cuda failure 1 'invalid argument'`; here with the out-of-memory failure NCCL prints the same way.
    let (k, f, v, r) = one("[rank7]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5\n[rank7]: ncclUnhandledCudaError: Call to CUDA function failed.\n[rank7]: Last error:\n[rank7]: Cuda failure 2 'out of memory'");
    assert_eq!(
        (k.as_str(), v.as_str(), r.as_str()),
        ("nccl_or_other", "capacity", "nccl_buffers")
    );
    assert_eq!(f["cuda_error_code"], 2);
    // vLLM's KV cache: github.com/QwenLM/Qwen3/issues/295.
    let (k, f, v, r) = one("ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be stored in KV cache (7344). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.");
    assert_eq!((k.as_str(), v.as_str()), ("vllm_kv_cache", "capacity"));
    assert_eq!(f["kv_cache_tokens"], 7344);
    assert!(r.starts_with("vllm_"), "{r}");
    // vLLM's cuMem allocation on wake-up: github.com/vllm-project/vllm/issues/13941.
    let (_, f, v, _) =
        one("RuntimeError: CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:62");
    assert_eq!(
        (f["location"].as_str(), v.as_str()),
        (Some("/workspace/csrc/cumem_allocator.cpp:62"), "contention")
    );
    // cudaMallocAsync: github.com/kijai/ComfyUI-SUPIR/issues/102.
    let (k, f, v, _) = one("Allocation on device 0 would exceed allowed memory. (out of memory)\nCurrently allocated : 23.05 GiB\nRequested : 25.00 MiB\nDevice limit : 23.99 GiB\nFree (according to CUDA): 0 bytes\nPyTorch limit (set by user-supplied memory fraction)\n: 17179869184.00 GiB");
    assert_eq!(
        (k.as_str(), v.as_str()),
        ("torch_cuda_oom_async", "capacity")
    );
    assert_eq!(f["requested_bytes"], 25 << 20);
    // DataLoader worker killed: github.com/dbolya/yolact/issues/680.
    let (k, f, v, r) =
        one("RuntimeError: DataLoader worker (pid 1620) is killed by signal: Killed.");
    assert_eq!(
        (k.as_str(), v.as_str(), r.as_str()),
        ("oom_kill_report", "host_oom", "data_loader")
    );
    assert_eq!(f["pid"], 1620);
    // A PyTorch CPU allocation failure is PyTorch's, not Rust's, and the machine was the limit:
    // github.com/JingyunLiang/VRT/issues/49.
    let (k, _, v, _) = one("RuntimeError: [enforce fail at alloc_cpu.cpp:73] . DefaultCPUAllocator: can't allocate memory: you tried to allocate 116813856768 bytes. Error code 12 (Cannot allocate memory)");
    assert_eq!((k.as_str(), v.as_str()), ("torch_cpu_oom", "host_oom"));
    // Context creation with nothing allocated yet: github.com/torch/cutorch/issues/441.
    let (_, _, v, _) = one("THCudaCheck FAIL file=/tmp/luarocks_cutorch-scm-1-3218/cutorch/lib/THC/THCGeneral.c line=176 error=2 : out of memory");
    assert_eq!(v, "contention");
    // A time-sliced GPU shared between pods: github.com/NVIDIA/k8s-device-plugin/issues/323.
    let (_, _, v, r) = one("I am currently using `Time-Slicing` to have different services sharing resources in my Tesla T4 GPU in Kubernetes.\n`RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 14.76 GiB total capacity; 4.37 GiB already allocated; 14.75 MiB free; 4.43 GiB reserved in total by PyTorch)`");
    assert_eq!((v.as_str(), r.as_str()), ("contention", "gpu_sharing"));
    // A markdown paste whose bold markers split the message: github.com/Comfy-Org/ComfyUI/issues/5886.
    let (k, _, _, _) = one("**CheckpointLoaderSimple\nAllocation on device 0 would exceed allowed memory. (out of memory)\nCurrently allocated : 5.96 GiB\nRequested : 12.50 MiB\nDevice limit : 12.00 GiB\nFree (according to CUDA): 5.00 GiB\nPyTorch limit (set by user-supplied memory fraction)\n: 17179869184.00 GiB**");
    assert_eq!(k, "torch_cuda_oom_async");
}

/// The per-process list of a recent PyTorch message keeps every process when a terminal wraps
/// it (github.com/awslabs/keys_values/issues/92, hard-wrapped at 100 and 120 columns).
#[test]
fn a_wrapped_per_process_list_keeps_its_processes() {
    let message = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 572.00 MiB. GPU 0 has a total capacity of 39.49 GiB of which 321.31 MiB is free. Process 3721648 has 414.00 MiB memory in use. Including non-PyTorch memory, this process has 37.46 GiB memory in use. Process 1374765 has 414.00 MiB memory in use. Process 1374763 has 414.00 MiB memory in use. Process 1374764 has 414.00 MiB memory in use. Of the allocated memory 36.04 GiB is allocated by PyTorch, and 321.37 MiB is reserved by PyTorch but unallocated.";
    for width in [100, 120] {
        let chars: Vec<char> = message.chars().collect();
        let wrapped = chars
            .chunks(width)
            .map(|c| c.iter().collect::<String>())
            .collect::<Vec<_>>()
            .join("\n");
        let found = find_ooms(&wrapped);
        assert_eq!(found.len(), 1, "{wrapped}");
        let f = serde_json::to_value(&found[0].facts).unwrap();
        assert_eq!(
            f["processes"].as_array().map(Vec::len),
            Some(4),
            "at {width}: {f}"
        );
    }
}

/// Blind set 8's general misses, each as a mechanism and not as its one message: PyTorch's message
/// cut after its free clause (an issue title: no period, or an ellipsis) keeps the device, total
/// and free memory; TensorFlow's BFC warning without its allocator's name is TensorFlow's, with
/// its size; a size given as a label (`requestedSpace: N B`), on the message's line or on the
/// indented line that continues it, is the request.
#[test]
fn cut_titles_old_bfc_wordings_and_labelled_sizes_keep_their_facts() {
    for tail in ["", " ...", "…", "\nSteps to reproduce: run train.py"] {
        let text = format!("torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of 63.98 GiB of which 1.50 GiB is free{tail}");
        let (k, f, _, _) = one(&text);
        assert_eq!(k, "torch_cuda_oom_new", "{text}");
        assert_eq!(
            (
                f["device_index"].as_i64(),
                f["total_bytes"].as_i64(),
                f["free_bytes"].as_i64()
            ),
            (Some(1), Some(68_698_001_900), Some(3 << 29)),
            "{text}"
        );
    }
    // Cut inside the free clause: only what is whole.
    let (_, f, _, _) = one("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 7.79 GiB of which 3.");
    assert_eq!(f["free_bytes"], Value::Null, "{f}");
    for text in [
        "W tensorflow/core/common_runtime/bfc_allocator.cc:274] Ran out of memory trying to allocate 1.5GiB.  See logs for memory state.",
        "2019-03-01 W bfc_allocator.cc:211] Allocator ran out of memory trying to allocate 1.5GiB. Current allocation summary follows.",
    ] {
        let (k, f, _, _) = one(text);
        assert_eq!(k, "tensorflow_oom", "{text}");
        assert_eq!(f["requested_bytes"], 3u64 << 29, "{text}");
    }
    for text in [
        "MyPoolAllocator: out of memory [requested size: 4096 bytes]",
        "ERROR: DeviceArena out of memory\n\t(requested_bytes=4096 B)",
    ] {
        let (k, f, _, _) = one(text);
        assert_eq!(k, "generic_oom", "{text}");
        assert_eq!(f["requested_bytes"], 4096, "{text}");
    }
    // An unindented next line is a record of its own: its size is not the request.
    let (_, f, _, _) = one("DeviceArena out of memory\nrequested 4096 B by the next job");
    assert_eq!(f["requested_bytes"], Value::Null, "{f}");
}

/// Blind set 9's general misses, each as a mechanism: Caffe2's enforce form of the cudaSuccess
/// check, THC's `err(N)`, an old-wording message whose `)` was lost before the reporter's next
/// paragraph, and a `kubectl get pods` row that ends at its STATUS column.
#[test]
fn caffe2_checks_thc_err_lost_parens_and_short_pod_rows_keep_their_facts() {
    let (k, f, _, _) = one("RuntimeError: [enforce fail at context_gpu.cu:343] error == cudaSuccess. 2 vs 0. Error at: /opt/caffe2/core/context_gpu.cu:343: out of memory");
    assert_eq!(k, "cuda_driver_oom");
    assert_eq!(
        (
            f["cuda_error_code"].as_i64(),
            f["location"].as_str(),
            f["exception_type"].as_str()
        ),
        (
            Some(2),
            Some("/opt/caffe2/core/context_gpu.cu:343"),
            Some("RuntimeError")
        )
    );
    let (k, f, _, _) =
        one("RuntimeError: cuda runtime err(2): out of memory at /x/THC/THCStorage.cu:58");
    assert_eq!(
        (k.as_str(), f["cuda_error_code"].as_i64()),
        ("cuda_driver_oom", Some(2))
    );
    let (_, f, _, _) = one("RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 3.95 GiB total capacity; 3.10 GiB already allocated; 2.00 MiB free; 3.20 GiB reserved in total by PyTorch\n\nI set batch size 2 and 4 (both fail).");
    assert_eq!(f["reserved_total_bytes"], 3_435_973_837u64, "{f}");
    for row in [
        "`default   trainer-0   0/1   OOMKilled`",
        "default   trainer-0   0/1   OOMKilled",
    ] {
        let (_, f, _, _) = one(row);
        assert_eq!(f["pod"], "trainer-0", "{row}");
    }
}

/// Blind set 10's general misses, each from its real message (source in the record of the same
/// id in `blind-10.jsonl`): PHP's memory limit, MXNet's and TensorRT-LLM's failed CUDA calls, R's
/// vector sizes, Windows' memory codes, OpenCV's status code, TensorRT's requested size, vLLM's
/// KV-cache error re-wrapped, Slurm's node-named daemon and srun's step, a word wrapped by
/// kubectl, Paddle's `BadAlloc`, and DeepSpeed naming the training workload in any case.
#[test]
fn blind_set_ten_wordings_keep_their_facts() {
    // faved-4: PHP's limit and request.
    let (k, f, v, _) = one("Fatal error: Allowed memory size of 134217728 bytes exhausted (tried to allocate 81513688 bytes) in /var/www/html/framework/responses/PageResponse.php on line 46");
    assert_eq!(
        (
            k.as_str(),
            f["memory_limit_bytes"].as_u64(),
            f["requested_bytes"].as_u64(),
            v.as_str()
        ),
        (
            "generic_oom",
            Some(134_217_728),
            Some(81_513_688),
            "host_oom"
        )
    );
    // friendica-13023: a terminal's padding splits `bytes`.
    let pad = " ".repeat(100);
    let (_, f, _, _) = one(&format!("[26-Apr-2023 10:59:07 UTC] PHP Fatal error:  Allowed memory size of 3221225472 b{pad}ytes exhausted (tried to allocate 20480 bytes) in /var/www/html/src/Database/Dat{pad}abase.php on line 588"));
    assert_eq!(f["memory_limit_bytes"], 3_221_225_472u64, "{f}");
    // mxnet-675 and insightface-1240: the failed call after a logger's header.
    let (k, f, _, _) = one("mxnet.base.MXNetError: [11:18:15] src/storage/./pooled_storage_manager.h:157: cudaMalloc failed: out of memory");
    assert_eq!(k, "cuda_driver_oom");
    assert_eq!(
        (
            f["exception_type"].as_str(),
            f["failed_call"].as_str(),
            f.get("location")
        ),
        (Some("mxnet.base.MXNetError"), Some("cudaMalloc"), None)
    );
    let (_, f, _, _) = one("`MXNetError: cudaMalloc retry failed: out of memory`");
    assert_eq!(f["failed_call"], "cudaMalloc");
    // tllm-backend-281: the failed expression and where it was checked.
    let (k, f, _, _) = one("[TensorRT-LLM][ERROR] CUDA runtime error in ::cudaMallocAsync(ptr, n, mCudaStream->get()): out of memory (/app/tensorrt_llm/cpp/tensorrt_llm/runtime/tllmBuffers.h:112)");
    assert_eq!(
        (
            k.as_str(),
            f["failed_call"].as_str(),
            f["location"].as_str()
        ),
        (
            "cuda_driver_oom",
            Some("::cudaMallocAsync(ptr, n, mCudaStream->get())"),
            Some("/app/tensorrt_llm/cpp/tensorrt_llm/runtime/tllmBuffers.h:112")
        )
    );
    // R: a vector's size in R's binary units, also with `can not` and the unit glued.
    let (_, f, v, _) = one("Error: cannot allocate vector of size 4.5 Gb");
    assert_eq!(
        (f["requested_bytes"].as_u64(), v.as_str()),
        (Some(4_831_838_208), "host_oom")
    );
    let (_, f, _, _) = one(
        "I am getting this error \" can not allocate vector of size 20.3Mb\" after running SAM",
    );
    assert_eq!(f["requested_bytes"], 21_286_093u64);
    // weclip-5 and diff-svc-24: Windows' commit limit in any language is host memory, though a
    // cuDNN library is being loaded.
    for line in [
        "OSError: [WinError 1455] 页面文件太小，无法完成操作。 Error loading \"D:\\Anaconda3\\lib\\site-packages\\torch\\lib\\cudnn_cnn_infer64_8.dll\" or one of its dependencies.",
        "OSError: [WinError 1455] The paging file is too small for this operation to complete. Error loading \"C:\\torch\\lib\\cudnn_adv_infer64_8.dll\" or one of its dependencies.",
    ] {
        let (k, f, v, _) = one(line);
        assert_eq!(
            (k.as_str(), f["error_code"].as_i64(), v.as_str()),
            ("generic_oom", Some(1455), "host_oom"),
            "{line}"
        );
    }
    // goresym-51: Go's failed VirtualAlloc, then its fatal error: one failure.
    let (_, f, _, _) = one("runtime: VirtualAlloc of 299704320 bytes failed with errno=1455\nfatal error: out of memory");
    assert_eq!(
        (f["requested_bytes"].as_u64(), f["error_code"].as_i64()),
        (Some(299_704_320), Some(1455))
    );
    // daformer-89: OpenCV's status code.
    let (_, f, _, _) = one("cv2.error: OpenCV(4.4.0) C:\\opencv\\modules\\core\\src\\alloc.cpp:73: error: (-4:Insufficient memory) Failed to allocate 6291456 bytes in function 'cv::OutOfMemoryError'");
    assert_eq!(
        (f["requested_bytes"].as_u64(), f["error_code"].as_i64()),
        (Some(6_291_456), Some(-4))
    );
    // optimum-nvidia-146: TensorRT's requested size.
    let (_, f, _, _) = one("[08/11/2024-06:10:36] [TRT] [E] [virtualMemoryBuffer.cpp::resizePhysical::151] Error Code 2: OutOfMemory (Requested size was 16654532608 bytes.)");
    assert_eq!(f["requested_bytes"], 16_654_532_608u64, "{f}");
    // kaito-2132: vLLM's KV-cache error re-wrapped, its `(` dropped.
    let (k, f, _, _) = one("ValueError: To serve at least one request with the model's max seq len (1048576),\n22.5 GiB KV cache is needed, which is larger than the available KV cache memory (17.39 GiB).\nBased on the available memory, the estimated maximum model length is 810208.");
    assert_eq!(
        (k.as_str(), f["estimated_max_model_len"].as_u64()),
        ("vllm_kv_cache", Some(810_208))
    );
    // openbabel-2658: the daemon names its node; the figures are kilobytes.
    let (k, f, _, _) = one("slurmstepd-falkor7: error: Step 1141810.0 exceeded memory limit (52917772 > 20971520), being killed\nsrun: Exceeded job memory limit");
    assert_eq!(
        (
            k.as_str(),
            f["step_id"].as_str(),
            f["memory_limit_bytes"].as_u64()
        ),
        (
            "oom_kill_report",
            Some("1141810.0"),
            Some(20_971_520 * 1024)
        )
    );
    // geofetch-13: srun names the step; slurmstepd's repeat is the same report.
    let (_, f, _, _) = one("slurmstepd: error: Exceeded job memory limit at some point.\nsrun: error: udc-ba26-19: task 0: Out Of Memory\nsrun: Terminating job step 2750598.0\nslurmstepd: error: Exceeded job memory limit at some point.");
    assert_eq!(f["step_id"], "2750598.0");
    // treetracker-49: kubectl wrapped `exceeds` inside the word.
    let (_, f, _, _) = one("Message:        The node was low on resource: memory. Container treetracker-pgpool was using 1275700Ki, which e\nxceeds its request of 0.");
    assert_eq!(f["memory_used_bytes"], 1_275_700u64 * 1024, "{f}");
    // paddle-42341: Paddle's allocation failure, camel case.
    let (k, _, _, _) = one("terminate called after throwing an instance of 'paddle::memory::allocation::BadAlloc'\n  what():");
    assert_eq!(k, "generic_oom");
    // gpt4llm-16: `DeepSpeed` names the training workload.
    let found = diagnose("OutOfMemoryError: CUDA out of memory. Tried to allocate 172.00 MiB (GPU 0; 79.35 GiB total capacity; 73.95 GiB already allocated; 12.19 MiB free; 76.80 GiB reserved in total by PyTorch)\n\nDeepSpeed: ZeRO3", &Context::default());
    let d: Value = serde_json::from_str(&serde_json::to_string(&found[0]).unwrap()).unwrap();
    assert_eq!(d["workload"], "training");
}

/// A deterministic stream of ordinary training-log lines: HF Trainer and Lightning progress,
/// loss lines, tqdm bars, NCCL INFO lines, DeepSpeed and vLLM memory reports, and warnings that
/// mention memory harmlessly.
fn ordinary_log(lines: usize) -> String {
    let templates: [&dyn Fn(u64) -> String; 27] = [
        &|i| {
            format!(
                "{{'loss': {:.4}, 'grad_norm': {:.3}, 'learning_rate': 4.{}e-05, 'epoch': {:.2}}}",
                2.0 + (i % 97) as f64 / 100.0,
                0.5 + (i % 13) as f64 / 10.0,
                i % 9,
                i as f64 / 1000.0
            )
        },
        &|i| {
            format!(
                " {:>3}%|{}{}| {}/1000 [01:{:02}<10:12,  1.44it/s]",
                i % 100,
                "█".repeat((i % 10) as usize),
                " ".repeat(10 - (i % 10) as usize),
                i % 1000,
                i % 60
            )
        },
        &|i| {
            format!("[2026-11-27 10:{:02}:{:02},123] [INFO] [logging.py:96:log_dist] [Rank 0] step={i}, skipped=0, lr=[4.5e-05], mom=[(0.9, 0.999)]", i % 60, i % 60)
        },
        &|i| {
            format!(
                "node01:12345:12{:03} [{}] NCCL INFO Channel {:02}/32 :    0   1   2   3",
                i % 1000,
                i % 8,
                i % 32
            )
        },
        &|i| {
            format!("node01:12345:12345 [{}] NCCL INFO comm 0x55d4a0{:04x} rank {} nranks 8 cudaDev {} busId 1000 commId 0x9a - Init COMPLETE", i % 8, i % 65536, i % 8, i % 8)
        },
        &|_| {
            "node01:12345:12345 [0] NCCL INFO 24 coll channels, 0 nvls channels, 32 p2p channels, 32 p2p channels per peer".to_string()
        },
        &|_| {
            "node01:12345:12345 [0] NCCL INFO cudaDriverVersion 12040 NCCL_SOCKET_IFNAME set by environment to eth0 Using network IB".to_string()
        },
        &|_| {
            "/usr/lib/python3/site-packages/torch/utils/data/dataloader.py:665: UserWarning: 'pin_memory' argument is set as true but no accelerator is found, then device pinned memory won't be used.".to_string()
        },
        &|_| {
            "xFormers 0.0.28 available: memory_efficient_attention enabled, using memory-efficient attention for the UNet".to_string()
        },
        &|i| {
            format!("step {i}: torch.cuda.max_memory_allocated={:.2} GiB max_memory_reserved={:.2} GiB memory_reserved=25.00 GiB", 20.0 + (i % 7) as f64, 24.0 + (i % 5) as f64)
        },
        &|i| {
            format!("[INFO] [utils.py:782:see_memory_usage] MA {:.2} GB         Max_MA 13.45 GB         CA 14.56 GB         Max_CA 15 GB", 12.0 + (i % 9) as f64 / 10.0)
        },
        &|_| {
            "[INFO] [utils.py:789:see_memory_usage] CPU Virtual Memory:  used = 45.67 GB, percent = 12.3%".to_string()
        },
        &|i| {
            format!(
                "Epoch {}/10: train_loss={:.4} val_loss={:.4} acc={:.4}",
                i % 10 + 1,
                0.4 + (i % 11) as f64 / 100.0,
                0.5,
                0.87
            )
        },
        &|_| {
            "Gradient checkpointing enabled to save memory; use_cache=True is incompatible with gradient checkpointing. Setting use_cache=False.".to_string()
        },
        &|_| {
            "INFO 11-27 10:00:01 [gpu_worker.py:227] Memory profiling takes 3.12 seconds. the current vLLM instance can use total_gpu_memory (79.19GiB) x gpu_memory_utilization (0.90) = 71.27GiB".to_string()
        },
        &|_| {
            "INFO 11-27 10:00:01 [gpu_worker.py:227] model weights take 13.50GiB; non_torch_memory takes 0.20GiB; PyTorch activation peak memory takes 1.20GiB; the rest of the memory reserved for KV Cache is 56.37GiB.".to_string()
        },
        &|_| {
            "INFO 11-27 10:00:02 [kv_cache_utils.py:634] GPU KV cache size: 461,104 tokens; Maximum concurrency for 8,192 tokens per request: 56.29x".to_string()
        },
        &|_| "Loading checkpoint shards: 100%|██████████| 4/4 [00:05<00:00,  1.30s/it]".to_string(),
        &|i| format!("Saving model checkpoint to ./out/checkpoint-{}", i * 10),
        &|_| {
            "DataLoader: num_workers=8, pin_memory=True, persistent_workers=True, prefetch_factor=2"
                .to_string()
        },
        &|_| {
            "Setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation and OOM on long sequences".to_string()
        },
        &|_| {
            "LOCAL_RANK: 0 - CUDA_VISIBLE_DEVICES: [0,1,2,3]; Trainable params: 7.2 M; Total estimated model params size (MB): 28".to_string()
        },
        &|i| {
            format!("wandb: 🚀 View run at https://wandb.ai/team/proj/runs/{i:08x}; peak GPU memory 34.5GB, host RSS 12.1GB")
        },
        &|_| {
            "[W reducer.cpp:1346] Warning: find_unused_parameters=True was specified in DDP constructor, but did not find any unused parameters in the forward pass.".to_string()
        },
        &|_| {
            "WARNING: Swap is not enabled on this node; out of memory errors may kill the training process without a traceback.".to_string()
        },
        &|_| {
            "INFO 11-27 10:00:03 [model_runner.py:1523] Capturing cudagraphs for decoding. This may lead to unexpected consequences if the model is not static. CUDA graphs can take additional 1~3 GiB memory per GPU. If you are running out of memory, consider decreasing `gpu_memory_utilization` or switching to eager mode.".to_string()
        },
        &|i| {
            format!("[WARNING] [stage3.py:2069:step] {} pytorch allocator cache flushes since last step. this happens when there is high memory pressure and is detrimental to performance.", i % 5 + 1)
        },
    ];
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    (0..lines as u64)
        .map(|i| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            templates[(state % templates.len() as u64) as usize](i)
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// No false positives: `memsight diagnose` reports "no out-of-memory message found" (exit 1)
/// exactly when `diagnose` finds nothing (`tests/tests/diagnose.rs` runs the binary on the same
/// log, `fixtures/ordinary-training.log`).
#[test]
fn a_thousand_lines_of_ordinary_training_logs_hold_no_memory_failure() {
    let log = ordinary_log(1000);
    assert_eq!(log.lines().count(), 1000);
    let found = diagnose(&log, &Context::default());
    assert!(found.is_empty(), "{found:#?}");
}

/// `fixtures/ordinary-training.log` is `ordinary_log(1000)` with a final newline; with
/// `MEMSIGHT_UPDATE_FIXTURES=1` this test writes it.
#[test]
fn the_ordinary_training_log_fixture_is_current() {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ordinary-training.log");
    let log = format!("{}\n", ordinary_log(1000));
    if std::env::var_os("MEMSIGHT_UPDATE_FIXTURES").is_some() {
        std::fs::write(&path, &log).unwrap();
    }
    let on_disk = std::fs::read_to_string(&path).unwrap();
    assert!(
        on_disk == log,
        "{} is stale: rerun with MEMSIGHT_UPDATE_FIXTURES=1",
        path.display()
    );
}

/// Real errors from the same public threads that are not memory failures give no finding: CUDA's
/// other errors, DataLoader workers killed by other signals, NCCL's other CUDA failures, a bare
/// SIGKILL exit with no memory cause, and warnings about leaks.
#[test]
fn real_errors_that_are_not_memory_failures_give_no_finding() {
    for text in [
        // github.com/Bing-su/adetailer/issues/391
        "RuntimeError: CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1.\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
        // github.com/oobabooga/textgen/issues/4170
        "    torch._C._cuda_emptyCache()\nRuntimeError: CUDA error: device-side assert triggered",
        // github.com/hustvl/Vim/issues/74
        "CUDA error: no kernel image is available for execution on the device\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
        // github.com/kvcache-ai/ktransformers/issues/816
        "RuntimeError: CUDA error: unknown error; Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
        // github.com/MhLiao/DB/issues/94, github.com/pytorch/pytorch/issues/4507
        "RuntimeError: DataLoader worker (pid 25902) is killed by signal: Segmentation fault",
        "RuntimeError: DataLoader worker (pid 23616) is killed by signal: Terminated.",
        // github.com/triton-inference-server/onnxruntime_backend/issues/95
        "tritonclient.utils.InferenceServerException: [StatusCode.INTERNAL] onnx runtime error 2: not enough space: expected 270080, got 261760",
        // github.com/pytorch/pytorch/issues/111187
        "ncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\nCuda failure 'invalid argument'",
        // github.com/kimbring2/AlphaStar_Implementation/issues/10 (no memory cause stated)
        "Process finished with exit code 137 (interrupted by signal 9: SIGKILL)",
        // github.com/EveryVoiceTTS/EveryVoice/issues/178
        "srun: error: ib12gpu-002: task 4: Exited with exit code 1",
        // github.com/studio-dots-ai/dots.ocr/issues/196
        "[rank0]:[W914 04:53:45.615225908 ProcessGroupNCCL.cpp:1476] Warning: WARNING: destroy_process_group() was not called before program exit, which can leak resources.",
        // github.com/PSLmodels/OG-Core/pull/496, github.com/PSLmodels/OG-USA/pull/108: Dask's
        // warnings before its nanny restarts a worker (a restart is a finding; these are not)
        "distributed.worker - WARNING - Memory use is high but worker has no data to store to disk.  Perhaps some other process is leaking memory?  Process memory: 3.35 GB -- Worker memory limit: 4.29 GB\ndistributed.worker - WARNING - Worker is at 85% memory usage. Pausing worker.  Process memory: 3.69 GB -- Worker memory limit: 4.29 GB",
        "2024-05-08 16:43:33,866 - distributed.worker.memory - WARNING - Unmanaged memory use is high. This may indicate a memory leak or the memory may not be released to the OS; see https://distributed.dask.org/en/latest/worker-memory.html#memory-not-released-back-to-the-os for more information. -- Unmanaged memory: 1.49 GiB -- Worker memory limit: 2.33 GiB",
        // github.com/systemd/systemd/issues/32304: systemd-oomd's candidates before it kills
        "avril 16 21:08:50 systemd-oomd[93234]: Considered 97 cgroups for killing, top candidates were:\navril 16 21:08:50 systemd-oomd[93234]:                 Memory Pressure Limit: 0.00%",
    ] {
        let found = diagnose(text, &Context::default());
        assert!(found.is_empty(), "{text}\n{found:#?}");
    }
}

/// A DataLoader worker that died of SIGBUS because shared memory ran out: the worker's line and
/// the main process's are one failure, with the shared-memory remedy first
/// (github.com/open-mmlab/mmsegmentation/issues/1356); a bus error with no shared-memory cause is
/// no finding.
#[test]
fn a_shared_memory_bus_error_is_one_dataloader_failure() {
    let (k, f, v, r) = one("ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).\nTraceback (most recent call last):\n    _error_if_any_worker_fails()\nRuntimeError: DataLoader worker (pid 7579) is killed by signal: Bus error. It is possible that dataloader's workers are out of shared memory. Please try to raise your shared memory limit.");
    assert_eq!(
        (k.as_str(), v.as_str(), r.as_str()),
        ("oom_kill_report", "host_oom", "shared_memory")
    );
    assert_eq!(f["pid"], 7579);
    assert_eq!(f["signal"], "Bus error");
    let found = diagnose(
        "RuntimeError: DataLoader worker (pid 31) is killed by signal: Bus error.",
        &Context::default(),
    );
    assert!(found.is_empty(), "{found:?}");
}

/// Wordings written to the formats their tools print (no public thread in the corpus had them):
/// Slurm's `OUT_OF_MEMORY` state with `seff`'s figures, a TPU's HBM, MLX's buffer cap, TensorRT's
/// request, and `docker inspect`'s `"OOMKilled": true` (while `false` is no finding).
#[test]
fn more_wordings_are_found_with_their_facts() {
    let (k, f, v, _) = one("Job ID: 4185932\nState: OUT_OF_MEMORY (exit code 0)\nMemory Utilized: 7.95 GB\nMemory Efficiency: 99.38% of 8.00 GB");
    assert_eq!((k.as_str(), v.as_str()), ("oom_kill_report", "host_oom"));
    assert_eq!(f["memory_limit_bytes"], 8u64 << 30);
    let (_, _, v, _) = one("4185932.batch      batch            OUT_OF_ME+      0:125");
    assert_eq!(v, "host_oom");
    let (k, f, v, _) = one("jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. Used 17.37G of 15.48G hbm. Exceeded hbm capacity by 1.89G.");
    assert_eq!((k.as_str(), v.as_str()), ("jax_xla_oom", "capacity"));
    assert_eq!(f["memory_space"], "hbm");
    let (_, f, v, _) = one("[metal::malloc] Attempting to allocate 40000000000 bytes which is greater than the maximum allowed buffer size of 28991029248 bytes.");
    assert_eq!(
        (f["requested_bytes"].as_i64(), v.as_str()),
        (Some(40_000_000_000), "allocator_limit")
    );
    let (_, f, _, _) = one("[TRT] [E] 2: [virtualMemoryBuffer.cpp::resizePhysical::144] Error Code 2: OutOfMemory (Requested size was 1073741824 bytes.)\n[TRT] Requested amount of GPU memory (1073741824 bytes) could not be allocated. There may not be enough free memory for allocation to succeed.");
    assert_eq!(f["requested_bytes"], 1_073_741_824);
    let (k, _, v, _) = one("        \"State\": {\n            \"Status\": \"exited\",\n            \"OOMKilled\": true,\n            \"ExitCode\": 137,");
    assert_eq!((k.as_str(), v.as_str()), ("oom_kill_report", "host_oom"));
    assert!(diagnose(
        "            \"OOMKilled\": false,\n            \"Dead\": false,",
        &Context::default()
    )
    .is_empty());
}
