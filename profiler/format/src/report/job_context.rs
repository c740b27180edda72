//! What the job that ran is, as far as its report tells: its language, whether it uses PyTorch,
//! its data-loader workers, its devices, whether it trained, and the memory it could have had.
//! Derived once from a report ([`JobContext::of`]) and handed to whatever gives advice, so that
//! advice fits the job (no "use fewer data-loader workers" for a job without any, no Rust
//! remedies for a Python job).

use super::Report;
use std::path::Path;

/// The language of the job's own code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Language {
    /// A Rust program that links memsight (its allocator is memsight's jemalloc).
    Rust,
    /// A Python program (its command runs a Python interpreter, a `.py` script or a Python
    /// launcher such as `torchrun`).
    Python,
    /// Another program memsight was preloaded into (C, C++).
    Native,
}

/// What the report knows of the job.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobContext {
    /// The job's language, when the report tells.
    pub language: Option<Language>,
    /// PyTorch is in the job: tensor statistics, a PyTorch device source (`torch-cuda`,
    /// `libtorch-cpu`), device OOMs caught by PyTorch's observer, or a PyTorch launcher.
    pub torch: bool,
    /// Data-loader and other forked workers seen (`None`: the report cannot tell, e.g. no
    /// process tree was read).
    pub workers: Option<usize>,
    /// Accelerators the report has figures of.
    pub devices: usize,
    /// The job marked training steps.
    pub training: bool,
    /// The job's command line (for the kind of program it runs: a server, a training script).
    pub command: Vec<String>,
    /// The machine's memory (`MemTotal`; with swap where the caller knows it).
    pub memory_bytes: Option<u64>,
    /// The memory cgroup's limit, when the job ran under one.
    pub limit_bytes: Option<u64>,
}

/// Programs that run Python code: interpreters and the launchers written in Python.
const PYTHON_PROGRAMS: [&str; 10] = [
    "python",
    "ipython",
    "pypy",
    "torchrun",
    "accelerate",
    "deepspeed",
    "pytest",
    "jupyter",
    "lightning",
    "vllm",
];

/// Whether `command` runs Python code.
fn runs_python(command: &[String]) -> bool {
    let Some(program) = command.first() else {
        return false;
    };
    let name = Path::new(program)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(program);
    PYTHON_PROGRAMS.iter().any(|p| name.starts_with(p))
        || command
            .iter()
            .take(4)
            .any(|a| a.ends_with(".py") && !a.starts_with('-'))
}

impl JobContext {
    /// What `r` tells of its job.
    pub fn of(r: &Report) -> JobContext {
        let source = |name: &str| r.sources.iter().find(|s| s.name == name);
        // A job that links memsight runs on its jemalloc (statistics in the samples) and counts
        // Rust's allocations apart; one it is preloaded into has neither.
        let linked = source("jemalloc").is_some_and(|s| s.available)
            || r.timeline
                .iter()
                .any(|s| s.jemalloc.is_some() || s.heap.rust_live_bytes > 0);
        let commands =
            std::iter::once(&r.job.command).chain(r.processes.iter().map(|p| &p.command));
        let python = commands.clone().any(|c| runs_python(c))
            || r.process_tree
                .iter()
                .flat_map(|t| &t.tree.processes)
                .any(|p| p.name.starts_with("python"));
        let language = if linked {
            Some(Language::Rust)
        } else if python {
            Some(Language::Python)
        } else if r.heap_measured() {
            Some(Language::Native)
        } else {
            None
        };
        let torch = r.peaks.tensor_peak_bytes.is_some()
            || r.timeline.iter().any(|s| s.tensors.is_some())
            || !r.device_ooms.is_empty()
            || r.sources.iter().any(|s| is_torch(&s.name))
            || r.devices.iter().any(|d| is_torch(&d.backend))
            || commands.clone().any(|c| {
                c.first()
                    .is_some_and(|p| p.ends_with("torchrun") || p.ends_with("lightning"))
            });
        let tree_workers = |roles: &mut dyn Iterator<Item = Option<&str>>| {
            roles
                .filter(|r| r.is_some_and(|r| r.starts_with("worker")))
                .count()
        };
        let sampled_trees = r
            .timeline
            .iter()
            .filter_map(|s| s.tree.as_ref())
            .chain(r.process_tree.as_ref().map(|t| &t.tree));
        let mut saw_tree = false;
        let mut workers = 0;
        for t in sampled_trees {
            saw_tree = true;
            workers = workers.max(tree_workers(
                &mut t.processes.iter().map(|p| p.role.as_deref()),
            ));
        }
        let rows = r
            .processes
            .iter()
            .filter(|p| matches!(p.role, Some(crate::process::Role::Worker { .. })))
            .count();
        let workers = (saw_tree || !r.processes.is_empty()).then_some(workers.max(rows));
        let mut devices: Vec<u32> = r.devices.iter().map(|d| d.index).collect();
        devices.sort_unstable();
        devices.dedup();
        let last =
            |f: &dyn Fn(&crate::Snapshot) -> Option<u64>| r.timeline.iter().rev().find_map(f);
        JobContext {
            language,
            torch,
            workers,
            devices: devices.len(),
            training: r.steps.len() > 1 || r.timeline.iter().any(|s| s.step > 0),
            command: r.job.command.clone(),
            memory_bytes: last(&|s| s.system.map(|m| m.total)),
            limit_bytes: r
                .peaks
                .cgroup_limit_bytes
                .or_else(|| last(&|s| s.cgroup.and_then(|c| c.limit))),
        }
    }

    /// Whether the job is Python's.
    pub fn python(&self) -> bool {
        self.language == Some(Language::Python)
    }

    /// How the job marks a training step, in its language.
    pub fn step_call(&self) -> &'static str {
        match self.language {
            Some(Language::Python) => "memsight.step(n)",
            Some(Language::Rust) => "memsight::step(n)",
            _ => "memsight.step(n) in Python, memsight::step(n) in Rust",
        }
    }

    /// What the process heap counts in this job, in its own terms.
    pub fn heap_words(&self) -> &'static str {
        match self.language {
            Some(Language::Python) => {
                "every `malloc` of the process: the interpreter's large objects, \
                 PyTorch/numpy CPU buffers and native libraries"
            }
            Some(Language::Native) => "every `malloc` and `new` of the process (C and C++)",
            Some(Language::Rust) | None => {
                "live heap of all code: Rust, C and C++ (`malloc`, `new`)"
            }
        }
    }

    /// The most memory one request could ever get: the cgroup's limit or the machine's memory,
    /// whichever is smaller.
    pub fn capacity_bytes(&self) -> Option<u64> {
        match (self.memory_bytes, self.limit_bytes) {
            (Some(m), Some(l)) => Some(m.min(l)),
            (m, l) => m.or(l),
        }
    }
}

/// Whether a source or backend name is PyTorch's (`torch-cuda`, `libtorch-cpu`).
fn is_torch(name: &str) -> bool {
    name.contains("torch")
}

#[cfg(test)]
mod tests {
    use super::{runs_python, JobContext, Language};
    use crate::report::Report;
    use crate::Snapshot;

    #[test]
    fn a_linked_job_rebuilt_from_its_ring_is_rust() {
        // No `jemalloc` source (a report rebuilt after the job died): its samples tell.
        let mut r = Report::default();
        r.job.command = vec!["./stepping_job".into(), "oom".into()];
        let mut s = Snapshot::default();
        s.heap.rust_live_bytes = 1 << 20;
        s.heap.allocations = 10;
        r.timeline.push(s);
        assert_eq!(JobContext::of(&r).language, Some(Language::Rust));
        r.timeline[0].heap.rust_live_bytes = 0;
        r.peaks.heap_peak_bytes = 1 << 20;
        assert_eq!(JobContext::of(&r).language, Some(Language::Native));
        r.job.command = vec!["python3".into(), "train.py".into()];
        assert_eq!(JobContext::of(&r).language, Some(Language::Python));
    }

    fn cmd(s: &str) -> Vec<String> {
        s.split(' ').map(str::to_string).collect()
    }

    #[test]
    fn python_programs_and_scripts() {
        for c in [
            "python3 -c x",
            "/venv/bin/python3.12 train.py",
            "torchrun --nproc-per-node 2 train.py",
            "./train.py --steps 3",
            "bash run.sh train.py",
        ] {
            assert!(runs_python(&cmd(c)), "{c}");
        }
        for c in [
            "./target/release/memsight-gpt train",
            "train_mlp 150",
            "sleep 1",
        ] {
            assert!(!runs_python(&cmd(c)), "{c}");
        }
    }
}
