//! Verdicts and remedies for PyTorch DataLoader workers that died: PyTorch's own reports
//! (`DataLoader worker (pid N) is killed by signal: Killed`, `… Bus error` with its shared-memory
//! note, `DataLoader worker (pid(s) A, B) exited unexpectedly`) and the kernel's OOM kill of a
//! process that is a worker (a post-mortem's role, PyTorch's `pt_data_worker` process name).

use super::facts::{Fact, Facts};
use super::remedy::{self, Remedy};
use super::verdict::{v, Verdict, VerdictKind};

/// Where to confirm that a SIGKILL was the OOM killer's.
const CONFIRM: &str = "confirm with the kernel's log (`dmesg -T | grep -i -E 'out of memory|killed process'`, or `journalctl -k`), whose `Killed process` line names the worker and its size";

/// The verdict for PyTorch's report of a dead worker (`reporter` `dataloader`).
pub(crate) fn judge(f: &Facts) -> (Verdict, Vec<Remedy>) {
    let who = workers(f);
    match f.str("signal") {
        Some("Bus error") => (
            v(
                VerdictKind::HostOom,
                format!("{who} died of SIGBUS: the shared memory (/dev/shm) through which workers hand batches to the main process ran out"),
            ),
            vec![
                shared_memory(),
                remedy::data_loader(),
                remedy::profile_host(),
            ],
        ),
        Some(_) => (
            v(
                VerdictKind::HostOom,
                format!("{who} was killed with SIGKILL: on Linux that is almost always the kernel's or the container's OOM killer, because host memory ran out; {CONFIRM}"),
            ),
            worker_remedies(None, None),
        ),
        None if f.str("platform") == Some("windows") => (
            v(
                VerdictKind::Undetermined,
                format!("{who} died without a Python error, on Windows, where workers are spawned: one that dies as it starts most often failed to import the script or unpickle the dataset; one that dies later may have run out of memory (the paging file). The message states no cause"),
            ),
            vec![
                remedy::framework(
                    "worker_error",
                    "run once with num_workers=0 to see the worker's own error, and start the training from under `if __name__ == \"__main__\":`",
                    "a spawned worker re-imports the script and unpickles the dataset; an error there ends it before it can report",
                ),
                remedy::data_loader(),
                remedy::profile_host(),
            ],
        ),
        None => (
            v(
                VerdictKind::HostOom,
                format!("{who} died without a Python error; the message states no signal, and on Linux such a death is most often the OOM killer's SIGKILL (or a SIGBUS when /dev/shm runs out); {CONFIRM}"),
            ),
            worker_remedies(None, None),
        ),
    }
}

/// `a DataLoader worker (pid 7)`, `DataLoader workers (pids 7, 8)`, `a DataLoader worker`.
fn workers(f: &Facts) -> String {
    match (f.bytes("pid"), f.get("pids")) {
        (_, Some(Fact::Ints(ps))) if ps.len() > 1 => format!(
            "DataLoader workers (pids {})",
            ps.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        (Some(p), _) => format!("a DataLoader worker (pid {p})"),
        _ => "a DataLoader worker".into(),
    }
}

/// Whether the process the kernel killed is a DataLoader worker: a post-mortem's role
/// (`worker`, `worker of rank 1`) or the name PyTorch gives its workers.
pub(crate) fn is_worker(f: &Facts) -> bool {
    f.str("role").is_some_and(|r| r.starts_with("worker"))
        || f.str("process_name") == Some("pt_data_worker")
}

/// Remedies for a worker killed for memory, best first.
pub(crate) fn worker_remedies(limit: Option<u128>, usage: Option<u128>) -> Vec<Remedy> {
    vec![
        remedy::data_loader(),
        remedy::framework(
            "worker_copy_on_read",
            "keep the dataset's large tables in numpy arrays, Arrow or pandas columns (or open them lazily in __getitem__ or worker_init_fn), not in Python lists and dicts of objects",
            "a forked worker shares its parent's memory copy-on-write, but Python's reference counting writes to every object a worker reads, so each worker slowly copies the lists and dicts it touches",
        ),
        remedy::framework(
            "persistent_workers",
            "with persistent_workers=True keep num_workers low and watch the workers' memory across epochs",
            "persistent workers are not restarted each epoch, so what each one has copied or cached stays for the whole run",
        ),
        remedy::memory_limit(limit, usage),
        remedy::profile_host(),
    ]
}

/// More shared memory for the workers' batches.
fn shared_memory() -> Remedy {
    remedy::framework(
        "shared_memory",
        "give the job more shared memory: docker run --shm-size=16g (or --ipc=host), a Kubernetes emptyDir with medium: Memory mounted at /dev/shm; or fewer DataLoader workers and a smaller prefetch_factor",
        "Docker gives a container 64 MiB of /dev/shm unless told otherwise",
    )
}
