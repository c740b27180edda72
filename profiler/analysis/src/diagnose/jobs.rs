//! Reports of a process killed for memory by whatever runs it (`oom_kill_report`): Slurm's
//! `oom-kill event(s)` lines (old and new wording), Kubernetes' `OOMKilled` (`kubectl get pods`
//! rows, `kubectl describe pod` blocks and pod-status YAML) and the kubelet's `CgroupOOM` events,
//! PyTorch's `DataLoader worker (pid N) is killed by signal: Killed`, Ray's memory monitor, YARN's
//! container kills, and a distributed launcher's report of a rank it started that died of SIGKILL
//! (torchrun's elastic agent, DeepSpeed's launcher; gunicorn's arbiter, Airflow's task runner),
//! and Amazon ECS's stopped-task reason for a container its memory ended.

use super::facts::{Fact, Facts};
use super::scan::{
    compile, contains_any_case, each, floor, int_at, line_end, size_at, str_at, Pattern, Piece,
};
use super::size::exact_bytes;
use super::Kind;
use regex::Regex;
use std::sync::LazyLock;

static SLURM: Pattern = LazyLock::new(|| {
    compile(
        r"(?i)Detected ([0-9]+) oom[-_]kill events?(?:\(s\))? in (?:job )?(?:step |StepId=)([A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)?)",
    )
});
/// Older slurmstepd wordings: `Exceeded job memory limit`, `Step S exceeded memory limit (used >
/// limit), being killed` (kilobytes; `Job N exceeded …` names a job, not a step: no step id); the
/// daemon may name its node (`slurmstepd-falkor7:`).
static SLURM_LIMIT: Pattern = LazyLock::new(|| {
    compile(
        r"(?i)slurmstepd(?:-[\w.-]+)?: (?:error: )?(?:Exceeded (?:job|step) memory limit|(?:Job [0-9][0-9.]*|Step ([0-9][0-9.]*)) exceeded memory limit \(([0-9]+) > ([0-9]+)\), being killed)",
    )
});
/// Slurm's job state `OUT_OF_MEMORY` (`sacct` truncates it to `OUT_OF_ME+`), and `seff`'s
/// `Memory Utilized: X` / `Memory Efficiency: P% of Y` that follow it.
/// `seff` gives the state's exit code after it (`State: OUT_OF_MEMORY (exit code 0)`).
static SLURM_STATE: Pattern =
    LazyLock::new(|| compile(r"\bOUT_OF_ME(?:MORY\b|\+)(?:[\t\x20]*\(exit code ([0-9]+)\))?"));
static SEFF: Pattern =
    LazyLock::new(|| compile(r"Memory Utilized: {SIZE}\s+Memory Efficiency: [0-9.]+% of {SIZE}"));
/// Kubernetes' eviction of a pod from a node short of memory.
static K8S_EVICTED: Pattern = LazyLock::new(|| {
    compile(
        r"The node was low on resource: memory\.(?:[^\n]*? Container (\S+) was using ([0-9.]+[A-Za-z]*), (?:which exceeds its request of|request is) ([0-9.]+[A-Za-z]*))?",
    )
});
static SRUN: Pattern =
    LazyLock::new(|| compile(r"srun: error: (?:\S+: tasks? [0-9][0-9,-]*: )?Out Of Memory"));
/// srun ending the step whose memory ran out (`srun: Terminating job step 2750598.0`): the step.
static SRUN_STEP: Pattern =
    LazyLock::new(|| compile(r"srun: Terminating job step ([0-9]+(?:\.[A-Za-z0-9_]+)?)"));
static K8S_ROW: Pattern = LazyLock::new(|| {
    compile(
        r"(?m)^[\t\x20]*`?(?:[a-z0-9][a-z0-9-]*[\t\x20]+)?([A-Za-z0-9][\w./-]*)[\t\x20]+[0-9]+/[0-9]+[\t\x20]+OOMKilled(?:[\t\x20]+([0-9]+)|[\t\x20]*(?:`|$))",
    )
});
static K8S_REASON: Pattern =
    LazyLock::new(|| compile(r"(?m)^[\t\x20]*[Rr]eason:[\t\x20]*OOMKilled\b"));
/// A `kubectl describe pod` state whose reason is not `OOMKilled` but whose exit code is 137
/// (SIGKILL): Kubernetes says `Error` when the kernel killed a process other than the container's
/// first one for memory, so the block is the report, with the reason it gives.
static K8S_STATE_137: Pattern = LazyLock::new(|| {
    compile(
        r"(?m)^[\t\x20]*Reason:[\t\x20]*([A-Za-z]+)[\t\x20]*\r?\n[\t\x20]*Exit Code:[\t\x20]*137\b",
    )
});
/// The kubelet's own OOM events (`Warning  CgroupOOM  28s  kubelet  Cgroup OOM encountered,
/// victim process: stress, pid: 470521`; `SystemOOM` for the node's): the event's reason and the
/// process the kernel killed.
static K8S_OOM_EVENT: Pattern = LazyLock::new(|| {
    compile(r"\b(Cgroup|System) OOM encountered, victim process: [^,\n]+, pid: ([0-9]+)")
});
static K8S_EXIT: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"(?m)^[\t ]*(?:Exit Code|exitCode):[\t ]*(-?[0-9]+)").ok());
static K8S_RESTARTS: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"(?m)^[\t ]*(?:Restart Count|restartCount):[\t ]*([0-9]+)").ok());
/// PyTorch's report of a worker killed by a signal, also as typed by hand (`Dataloader worker
/// (pid 6479) is killed by signal:killed`): any case, any blanks after the colon.
static DATALOADER: Pattern = LazyLock::new(|| {
    compile(
        r"(?i)DataLoader (?:worker|process)(?: \(pid(?:\(s\))? (?:([0-9]+)|[^)\n]{0,20})\))?(?: exited)? is killed by signal:\s*(?:Killed(?::\s*9)?|(Bus error)(\.?(?: It is possible that dataloader's workers are out of shared memory))?)",
    )
});
/// The main process's check on dead workers (`torch/utils/data/dataloader.py`): `DataLoader worker
/// (pid(s) 18509, 18510) exited unexpectedly`; the C++ check's `… exited unexpectedly with exit
/// code N` is a worker that exited on its own, no memory failure.
static EXITED: Pattern = LazyLock::new(|| {
    compile(
        r"DataLoader worker \(pid(?:\(s\))? ([0-9]+(?:,\s*[0-9]+)*)\) exited unexpectedly( with exit code)?",
    )
});
/// A worker's death the text gives a cause other than memory: PyTorch's own lines for other
/// signals (`is killed by signal: Segmentation fault`, the worker's `Unexpected segmentation fault
/// encountered in worker`).
static OTHER_DEATH: Pattern = LazyLock::new(|| {
    compile(
        r"is killed by signal: (?:Segmentation fault|Aborted|Terminated|Floating point exception|Illegal instruction|Interrupt|Hangup|Quit)|Unexpected (?:segmentation fault|floating-point exception) encountered in worker",
    )
});
/// A Windows path in a traceback (`C:\ProgramData\…`, `D:\…\site-packages\torch`): workers there
/// are spawned, and one that dies at start is most often an import or pickling error.
static WINDOWS_PATH: Pattern =
    LazyLock::new(|| compile(r"\b[A-Za-z]:\\[A-Za-z_]|\\site-packages\\"));
/// How far before a worker's `exited unexpectedly` its cause is looked for (a traceback or two).
const DEATH_WINDOW: usize = 8192;
/// The worker's own report of a SIGBUS while its shared memory (`/dev/shm`) ran out, in any case
/// and with a comma for its period (retyped in an issue's title).
static SHM_BUS: Pattern = LazyLock::new(|| {
    compile(
        r"(?i)Unexpected bus error encountered in worker[.,] This might be caused by insufficient shared memory",
    )
});
static RAY_TASK: Pattern =
    LazyLock::new(|| compile(r"Task was killed due to the node running low on memory"));
static RAY_NODE: Pattern = LazyLock::new(|| {
    compile(
        r"Memory on the node \(IP: [^\n]*?where the task(?: \([^\n]*?pid=([0-9]+), memory used=([0-9.]+)\s?([KMGT]?B)\))? was running was ([0-9.]+)\s?([KMGT]?B) / ([0-9.]+)\s?([KMGT]?B)",
    )
});
/// Ray's report cut before its figures (`Memory on the node (IP: …) where the task (task ID: …,
/// name=head, rank=0,, pid=4503, memory used`): the process it killed.
static RAY_NODE_CUT: Pattern = LazyLock::new(|| {
    compile(r"Memory on the node \(IP: [^\n]*?where the task \([^\n]*?\bpid=([0-9]+)")
});
static RAY_RAYLET: Pattern = LazyLock::new(|| {
    compile(r"([0-9]+) Workers \(tasks / actors\) killed due to memory pressure \(OOM\)")
});
/// Ray's advice printed after its memory monitor killed workers (the raylet's
/// `Refer to the documentation on how to address the out of memory issue: …ray-oom-prevention…`):
/// part of that kill's report, and a report of its own when the kill's line was not pasted.
static RAY_ADVICE: Pattern =
    LazyLock::new(|| compile(r"address the out of memory issue: \S*ray-oom-prevention"));
/// torchrun's elastic agent on a rank that ended by signal 9 (`failed (exitcode: -9) local_rank: 0
/// (pid: 14447) of binary`): the rank was SIGKILLed, on Linux almost always by the OOM killer.
static TORCHRUN_SIGKILL: Pattern =
    LazyLock::new(|| compile(r"failed \(exitcode: -9\) local_rank: [0-9]+ \(pid: ([0-9]+)\)"));
/// torchrun's `ChildFailedError` summary of a rank that ended by signal 9 (`exitcode  : -9 (pid:
/// 14750)`, then `traceback : Signal 9 (SIGKILL) received by PID 14750`).
static TORCHRUN_SUMMARY: Pattern =
    LazyLock::new(|| compile(r"(?m)^[\t\x20]*exitcode[\t\x20]*: -9 \(pid: ([0-9]+)\)"));
/// DeepSpeed's launcher on a rank that ended by signal 9 (`[launch.py:434:sigkill_handler] […]
/// exits with return code = -9`), also retyped (`exits with run code= -9`).
static DEEPSPEED_SIGKILL: Pattern =
    LazyLock::new(|| compile(r"(?i)exits? with (?:return|run|exit) code\s?=\s?-9\b"));
/// Amazon ECS's stopped reason for a container that passed its memory limit (`OutOfMemoryError:
/// Container killed due to memory usage`, in the console, `ecs-cli ps` rows or retyped in any
/// case), and the ECS agent's own line for Docker's OOM event on a container (`DockerGoClient:
/// process within container <id> (name: "<name>") died due to OOM`).
static ECS_KILLED: Pattern =
    LazyLock::new(|| compile(r"(?i)OutOfMemoryError: Container killed due to memory usage"));
static ECS_AGENT: Pattern = LazyLock::new(|| {
    compile(r#"DockerGoClient: process within container \S+ \(name: "([^"\n]+)"\) died due to OOM"#)
});
/// runc killed for memory while it started a container's first process (`container init was
/// OOM-killed (memory limit too low?)`): reported by whatever runs the container, named by its own
/// words on the line (the kubelet's event, ECS's `CannotStartContainerError`).
static RUNC_INIT: Pattern = LazyLock::new(|| compile(r"container init was OOM-killed"));
/// An exit code stated beside a container's stopped reason (`ExitCode: 137`, `Exit Code\t137`,
/// `Exit code: 137`, `Exit code 0`).
static STATED_EXIT: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"(?i)\bexit ?code\b[\t :=|]*(-?[0-9]+)\b").ok());
/// How many lines after a stopped reason its exit code may come (the console's table row).
const EXIT_CODE_LINES: usize = 2;
/// gunicorn's arbiter on a worker it found ended by SIGKILL, with its own memory hint (`Worker
/// (pid:21) was sent SIGKILL! Perhaps out of memory?`).
static GUNICORN_SIGKILL: Pattern =
    LazyLock::new(|| compile(r"Worker \(pid:([0-9]+)\) was sent SIGKILL! Perhaps out of memory\?"));
/// Airflow on a task process ended by SIGKILL (Airflow 3's task runner: `Process terminated by
/// signal. … TaskRunner-killed: signal=-9: signal_name="SIGKILL"`; Airflow 2: `Task exited with
/// return code Negsignal.SIGKILL`).
static AIRFLOW_SIGKILL: Pattern = LazyLock::new(|| {
    compile(
        r"Process terminated by signal\.[^\n]*?signal=-9\b|Task exited with return code Negsignal\.SIGKILL",
    )
});
static YARN_LIMITS: Pattern = LazyLock::new(|| {
    compile(
        r"Container killed by YARN for exceeding memory limits\.? ([0-9.]+) ?([KMGTP]?B) of ([0-9.]+) ?([KMGTP]?B) (virtual|physical) memory used",
    )
});
static YARN_BEYOND: Pattern = LazyLock::new(|| {
    compile(
        r"(?:Container \[pid=([0-9]+),[^\]\n]*\] )?is running beyond (physical|virtual) memory limits\. Current usage: ([0-9.]+) ?([KMGTP]?B) of ([0-9.]+) ?([KMGTP]?B) (?:physical|virtual) memory used",
    )
});

pub(crate) fn find(text: &str, out: &mut Vec<Piece>) {
    // Each family only where its words occur: a plain substring search is far cheaper than a
    // regex over the whole log.
    let has = |w: &str| text.contains(w);
    if has("oom") || has("OOM") || has("Out Of Memory") || has("memory limit") || has("OUT_OF_ME") {
        slurm(text, out);
    }
    if has("OOMKilled") {
        kubernetes(text, out);
    }
    if has("Exit Code:") {
        killed_container(text, out);
    }
    if has(" OOM encountered, victim process") {
        kubelet_event(text, out);
    }
    if has("low on resource") {
        evicted(text, out);
    }
    if has("killed by signal")
        || contains_any_case(text, "unexpected bus error")
        || has("exited unexpectedly")
    {
        dataloader(text, out);
    }
    if has("Memory on the node")
        || has("running low on memory")
        || has("memory pressure")
        || has("ray-oom-prevention")
    {
        ray(text, out);
    }
    if has("memory limits") {
        yarn(text, out);
    }
    if has("-9") || has("SIGKILL") {
        launchers(text, out);
    }
    if contains_any_case(text, "container killed due to memory usage") || has("died due to OOM") {
        ecs(text, out);
    }
    if has("init was OOM-killed") {
        runc_init(text, out);
    }
}

/// runc's OOM kill of a container's init, with the orchestrator its line names as the reporter.
fn runc_init(text: &str, out: &mut Vec<Piece>) {
    each(&RUNC_INIT, text, |_, s, e| {
        let line = &text[text[..s].rfind('\n').map_or(0, |i| i + 1)..line_end(text, e)];
        let mut f = Facts::default();
        if line.contains("kubelet") {
            f.text("reporter", "kubernetes");
        } else if line.contains("CannotStartContainerError") {
            f.text("reporter", "ecs");
        }
        out.push(Piece::message(s, e, Kind::OomKillReport, f));
    });
}

/// Amazon ECS's report of a container ended for its memory: the stopped reason with the exit code
/// stated on its line (either side) or on the next lines, and the agent's log line naming the
/// container.
fn ecs(text: &str, out: &mut Vec<Piece>) {
    each(&ECS_KILLED, text, |_, s, e| {
        let mut f = reporter("ecs");
        let line = text[..s].rfind('\n').map_or(0, |i| i + 1);
        let mut to = line_end(text, e);
        for _ in 0..EXIT_CODE_LINES {
            if to < text.len() {
                to = line_end(text, to + 1);
            }
        }
        let code = |t: &str| {
            STATED_EXIT
                .as_ref()
                .and_then(|re| re.captures(t))
                .and_then(|c| int_at(&c, 1))
        };
        f.opt_int(
            "exit_code",
            code(&text[line..line_end(text, e)]).or_else(|| code(&text[e..to])),
        );
        out.push(Piece::message(s, e, Kind::OomKillReport, f));
    });
    each(&ECS_AGENT, text, |c, s, e| {
        let mut f = reporter("ecs");
        f.opt_text("container", str_at(c, 1));
        out.push(Piece::message(s, e, Kind::OomKillReport, f));
    });
}

/// A launcher's report of a rank it started that died of SIGKILL (torchrun, DeepSpeed; a server's
/// arbiter for its worker, gunicorn; a scheduler for its task, Airflow): the process was killed,
/// and on Linux nearly always by the kernel's or a cgroup's OOM killer.
fn launchers(text: &str, out: &mut Vec<Piece>) {
    each(&TORCHRUN_SIGKILL, text, |c, s, e| {
        let mut f = reporter("torchrun");
        f.int("exit_code", -9);
        f.opt_int("pid", int_at(c, 1));
        out.push(Piece::message(s, e, Kind::OomKillReport, f));
    });
    each(&TORCHRUN_SUMMARY, text, |c, s, e| {
        let mut f = reporter("torchrun");
        f.int("exit_code", -9);
        f.opt_int("pid", int_at(c, 1));
        out.push(Piece::message(s, e, Kind::OomKillReport, f));
    });
    each(&DEEPSPEED_SIGKILL, text, |_, s, e| {
        let mut f = reporter("deepspeed");
        f.int("exit_code", -9);
        out.push(Piece::message(s, e, Kind::OomKillReport, f));
    });
    each(&GUNICORN_SIGKILL, text, |c, s, e| {
        let mut f = reporter("gunicorn");
        f.opt_int("pid", int_at(c, 1));
        f.text("signal", "SIGKILL");
        out.push(Piece::message(s, e, Kind::OomKillReport, f));
    });
    each(&AIRFLOW_SIGKILL, text, |_, s, e| {
        let mut f = reporter("airflow");
        f.int("exit_code", -9);
        f.text("signal", "SIGKILL");
        out.push(Piece::message(s, e, Kind::OomKillReport, f));
    });
}

fn dataloader(text: &str, out: &mut Vec<Piece>) {
    // A worker killed by SIGBUS because shared memory ran out prints its own line, then the main
    // process its `killed by signal: Bus error` line, then (PyTorch ≥ 1.2) its `exited
    // unexpectedly` line: parts, so they join as one failure. A bus error the text does not tie
    // to shared memory is no evidence on its own.
    each(&DATALOADER, text, |c, s, e| {
        let mut f = reporter("dataloader");
        f.opt_int("pid", int_at(c, 1));
        if c.get(2).is_some() {
            f.text("signal", "Bus error");
            // PyTorch's hint, or the line's own words, tie the bus error to shared memory.
            let line = &text[text[..s].rfind('\n').map_or(0, |i| i + 1)..line_end(text, e)];
            let shm = c.get(3).is_some() || contains_any_case(line, "shared memory");
            out.push(Piece::part(s, e, Kind::OomKillReport, f, shm));
        } else {
            f.text("signal", "Killed");
            out.push(Piece::message(s, e, Kind::OomKillReport, f));
        }
    });
    each(&SHM_BUS, text, |_, s, e| {
        let mut f = reporter("dataloader");
        f.text("signal", "Bus error");
        out.push(Piece::part(s, e, Kind::OomKillReport, f, true));
    });
    if text.contains("exited unexpectedly") {
        exited(text, out);
    }
}

/// `DataLoader worker (pid(s) A, B) exited unexpectedly`: workers that died without a Python
/// error. It continues the `killed by signal` line before it (the same worker) or stands alone;
/// where the text before it gives another cause of death, it is no memory failure.
fn exited(text: &str, out: &mut Vec<Piece>) {
    each(&EXITED, text, |c, s, e| {
        if c.get(2).is_some() {
            return;
        }
        let from = floor(text, s.saturating_sub(DEATH_WINDOW));
        let before = &text[from..s];
        let found = |re: &Pattern| re.as_ref().is_some_and(|re| re.is_match(before));
        if found(&OTHER_DEATH) {
            return;
        }
        let pids: Vec<i128> = str_at(c, 1)
            .unwrap_or("")
            .split(',')
            .filter_map(|p| p.trim().parse().ok())
            .collect();
        let mut f = reporter("dataloader");
        match pids.as_slice() {
            [] => return,
            [one] => f.int("pid", *one),
            _ => f.set("pids", Fact::Ints(pids)),
        }
        if found(&WINDOWS_PATH) {
            f.text("platform", "windows");
        }
        out.push(Piece::part(s, e, Kind::OomKillReport, f, true));
    });
}

fn reporter(who: &str) -> Facts {
    let mut f = Facts::default();
    f.text("reporter", who);
    f
}

fn slurm(text: &str, out: &mut Vec<Piece>) {
    each(&SLURM, text, |c, s, e| {
        let mut f = reporter("slurm");
        f.opt_int("oom_kill_events", int_at(c, 1));
        f.opt_text("step_id", str_at(c, 2));
        out.push(Piece::message(s, e, Kind::OomKillReport, f));
    });
    // Its own report, or a step's report told again (slurmstepd repeats `Exceeded job memory
    // limit` after srun's lines).
    each(&SLURM_LIMIT, text, |c, s, e| {
        let mut f = reporter("slurm");
        f.opt_text("step_id", str_at(c, 1));
        f.opt_int("memory_used_bytes", int_at(c, 2).map(|k| k * 1024));
        f.opt_int("memory_limit_bytes", int_at(c, 3).map(|k| k * 1024));
        out.push(Piece::part(s, e, Kind::OomKillReport, f, true));
    });
    each(&SLURM_STATE, text, |c, s, e| {
        let mut f = reporter("slurm");
        f.opt_int("exit_code", int_at(c, 1));
        // The job's state after the step's oom_kill line is the same failure told again.
        out.push(Piece::part(s, e, Kind::OomKillReport, f, true));
    });
    each(&SEFF, text, |c, s, e| {
        let mut f = reporter("slurm");
        f.opt_int("memory_used_bytes", size_at(c, 1));
        f.opt_int("memory_limit_bytes", size_at(c, 3));
        out.push(Piece::part(s, e, Kind::OomKillReport, f, false));
    });
    // `srun: error: node: task 0: Out Of Memory` continues the step's report, or stands alone.
    each(&SRUN, text, |_, s, e| {
        out.push(Piece::part(
            s,
            e,
            Kind::OomKillReport,
            reporter("slurm"),
            true,
        ));
    });
    // Names the step of the report before it; alone it reports nothing.
    each(&SRUN_STEP, text, |c, s, e| {
        let mut f = reporter("slurm");
        f.opt_text("step_id", str_at(c, 1));
        out.push(Piece::part(s, e, Kind::OomKillReport, f, false));
    });
}

/// Lines of `text` around byte `at`: `before` lines up and `after` lines down (a pod's block).
fn around(text: &str, at: usize, before: usize, after: usize) -> (usize, usize) {
    let mut from = text[..at].rfind('\n').map_or(0, |i| i + 1);
    for _ in 0..before {
        match text[..from.saturating_sub(1)].rfind('\n') {
            Some(i) if from > 0 => from = i + 1,
            _ => {
                from = 0;
                break;
            }
        }
    }
    let mut to = line_end(text, at);
    for _ in 0..after {
        if to >= text.len() {
            break;
        }
        to = line_end(text, to + 1);
    }
    (from, to)
}

/// Indentation of the line starting at `at`.
fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// A Kubernetes quantity (`300Mi`, `2Gi`, `512M`, `1.5G`, `1000000`) in bytes.
fn quantity(q: &str) -> Option<i128> {
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(q.len());
    let (n, unit) = q.split_at(split);
    let dec = |mul: u128| -> Option<u128> {
        let (i, f) = n.split_once('.').unwrap_or((n, ""));
        let scale = 10u128.pow(u32::try_from(f.len()).ok()?);
        let v: u128 = format!("{i}{f}").parse().ok()?;
        Some((v.checked_mul(mul)? + scale / 2) / scale)
    };
    let bytes = match unit {
        "Ki" | "Mi" | "Gi" | "Ti" => exact_bytes(n, &format!("{unit}B"))?,
        "k" | "K" => dec(1_000)?,
        "M" => dec(1_000_000)?,
        "G" => dec(1_000_000_000)?,
        "T" => dec(1_000_000_000_000)?,
        "" => dec(1)?,
        _ => return None,
    };
    i128::try_from(bytes).ok()
}

/// The `memory:` quantity of the `Limits:` or `Requests:` block in `block`.
fn block_memory(block: &str, heading: &str) -> Option<i128> {
    let mut lines = block.lines();
    while let Some(l) = lines.next() {
        if l.trim() != heading {
            continue;
        }
        let depth = indent(l);
        for item in lines.by_ref() {
            if indent(item) <= depth || item.trim().is_empty() {
                break;
            }
            if let Some(q) = item.trim().strip_prefix("memory:") {
                return quantity(q.trim());
            }
        }
        return None;
    }
    None
}

fn kubernetes(text: &str, out: &mut Vec<Piece>) {
    each(&K8S_ROW, text, |c, s, e| {
        let mut f = reporter("kubernetes");
        f.text("reason", "OOMKilled");
        f.opt_text("pod", str_at(c, 1));
        f.opt_int("restarts", int_at(c, 2));
        out.push(Piece::message(s, e, Kind::OomKillReport, f));
    });
    // A `Reason: OOMKilled` line and its container's block (describe output or status YAML).
    each(&K8S_REASON, text, |_, s, e| {
        let mut f = reporter("kubernetes");
        f.text("reason", "OOMKilled");
        let (from, to) = around(text, s, 3, 14);
        let block = &text[from..to];
        let first = |re: &LazyLock<Option<Regex>>| {
            re.as_ref()
                .and_then(|re| re.captures(block))
                .and_then(|c| int_at(&c, 1))
        };
        f.opt_int("exit_code", first(&K8S_EXIT));
        f.opt_int("restarts", first(&K8S_RESTARTS));
        // Describe output lists the container's `Limits:`/`Requests:` after its last state; a pod
        // YAML's spec (`resources:` with lower-case `limits:`/`requests:`) comes before its status.
        let (spec, _) = around(text, s, 16, 0);
        let spec = &text[spec..s];
        let resource = |heading: &str| {
            block_memory(block, heading).or_else(|| block_memory(spec, &heading.to_lowercase()))
        };
        f.opt_int("memory_limit_bytes", resource("Limits:"));
        f.opt_int("memory_request_bytes", resource("Requests:"));
        out.push(Piece::part(s, e, Kind::OomKillReport, f, true));
    });
}

/// The kubelet's `CgroupOOM` / `SystemOOM` event: its reason and the process the kernel killed
/// (the pod a `kubectl describe` command names is not a fact of the block, as for `OOMKilled`).
fn kubelet_event(text: &str, out: &mut Vec<Piece>) {
    each(&K8S_OOM_EVENT, text, |c, s, e| {
        let mut f = reporter("kubernetes");
        if let Some(scope) = str_at(c, 1) {
            f.text("reason", format!("{scope}OOM"));
        }
        f.opt_int("pid", int_at(c, 2));
        out.push(Piece::message(s, e, Kind::OomKillReport, f));
    });
}

/// A container's last state killed by SIGKILL (exit code 137) under a reason other than
/// `OOMKilled`, which [`kubernetes`] reads with its block.
fn killed_container(text: &str, out: &mut Vec<Piece>) {
    each(&K8S_STATE_137, text, |c, s, e| {
        let Some(reason) = str_at(c, 1).filter(|r| *r != "OOMKilled") else {
            return;
        };
        let mut f = reporter("kubernetes");
        f.text("reason", reason);
        f.int("exit_code", 137);
        out.push(Piece::message(s, e, Kind::OomKillReport, f));
    });
}

fn evicted(text: &str, out: &mut Vec<Piece>) {
    each(&K8S_EVICTED, text, |c, s, e| {
        let mut f = reporter("kubernetes");
        f.text("reason", "Evicted");
        f.opt_text("container", str_at(c, 1));
        f.opt_int("memory_used_bytes", str_at(c, 2).and_then(quantity));
        f.opt_int("memory_request_bytes", str_at(c, 3).and_then(quantity));
        out.push(Piece::message(s, e, Kind::OomKillReport, f));
    });
}

fn ray(text: &str, out: &mut Vec<Piece>) {
    each(&RAY_TASK, text, |_, s, e| {
        out.push(Piece::message(s, e, Kind::OomKillReport, reporter("ray")));
    });
    each(&RAY_NODE, text, |c, s, e| {
        let mut f = reporter("ray");
        f.opt_int("pid", int_at(c, 1));
        f.opt_int("process_memory_bytes", size_at(c, 2));
        f.opt_int("node_memory_used_bytes", size_at(c, 4));
        f.opt_int("node_memory_total_bytes", size_at(c, 6));
        out.push(Piece::part(s, e, Kind::OomKillReport, f, true));
    });
    each(&RAY_NODE_CUT, text, |c, s, e| {
        // The whole report is read by RAY_NODE.
        if RAY_NODE
            .as_ref()
            .is_some_and(|re| re.find_at(text, s).is_some_and(|m| m.start() == s))
        {
            return;
        }
        let mut f = reporter("ray");
        f.opt_int("pid", int_at(c, 1));
        out.push(Piece::message(s, e, Kind::OomKillReport, f));
    });
    each(&RAY_RAYLET, text, |c, s, e| {
        let mut f = reporter("ray");
        f.opt_int("oom_kill_events", int_at(c, 1));
        out.push(Piece::message(s, e, Kind::OomKillReport, f));
    });
    each(&RAY_ADVICE, text, |_, s, e| {
        out.push(Piece::part(
            s,
            e,
            Kind::OomKillReport,
            reporter("ray"),
            true,
        ));
    });
}

fn yarn(text: &str, out: &mut Vec<Piece>) {
    each(&YARN_LIMITS, text, |c, s, e| {
        let mut f = reporter("yarn");
        f.opt_int("memory_used_bytes", size_at(c, 1));
        f.opt_int("memory_limit_bytes", size_at(c, 3));
        f.opt_text("memory_kind", str_at(c, 5));
        out.push(Piece::message(s, e, Kind::OomKillReport, f));
    });
    each(&YARN_BEYOND, text, |c, s, e| {
        let mut f = reporter("yarn");
        f.opt_int("pid", int_at(c, 1));
        f.opt_int("memory_used_bytes", size_at(c, 3));
        f.opt_int("memory_limit_bytes", size_at(c, 5));
        f.opt_text("memory_kind", str_at(c, 2));
        out.push(Piece::message(s, e, Kind::OomKillReport, f));
    });
}

#[cfg(test)]
mod tests {
    use super::quantity;

    #[test]
    fn kubernetes_quantities() {
        assert_eq!(quantity("300Mi"), Some(300 << 20));
        assert_eq!(quantity("2Gi"), Some(2 << 30));
        assert_eq!(quantity("512M"), Some(512_000_000));
        assert_eq!(quantity("1.5G"), Some(1_500_000_000));
        assert_eq!(quantity("1000"), Some(1000));
        assert_eq!(quantity("12parsecs"), None);
    }
}
