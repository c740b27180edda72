//! The job as the sidecar assembles it: every process that carries memsight writes a ring of its
//! own (named from the job's prefix), found here as it appears and followed until its writer is
//! gone; each member's end (the exit code it said, or none: a signal), its role in the tree (rank
//! N by its launcher's environment, a forked worker, the launcher above them, a helper), and the
//! principal process whose records viewers follow (the lowest rank, else the main process).

use crate::outputs::Outputs;
use crate::watch::Watch;
use memsight_format::clock::unix_ms;
use memsight_format::process::{ProcessInfo, RankSource, Role};
use memsight_format::wire::ring::RingReader;
use memsight_format::wire::Record;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// One measured process.
pub(crate) struct Member {
    pub ring: PathBuf,
    reader: Option<RingReader>,
    pub watch: Watch,
    pub pid: u32,
    pub info: ProcessInfo,
    pub command: Vec<String>,
    /// When its writer was seen gone (Unix ms).
    pub ended_unix_ms: Option<u64>,
    /// The exit code it said; `None` after it ended: a signal ended it.
    pub exit_code: Option<i32>,
    /// Its writer left while its process ran on: it exec'd another program (which, carrying
    /// memsight, is a member of its own).
    pub exec_d: bool,
    pub role: Option<Role>,
}

impl Member {
    /// Whether it runs part of its parent's work: forked from it without an exec (a DataLoader
    /// worker, a multiprocessing child), or started by Python's `multiprocessing` with the `spawn`
    /// method (a new program, but the same role: a DataLoader worker with
    /// `multiprocessing_context="spawn"`, a `Pool` under spawn). A `forkserver`'s children are
    /// forks of the server.
    pub(crate) fn is_worker(&self) -> bool {
        self.info.forked || memsight_format::process::is_spawned_worker(&self.command)
    }

    /// Whether its writer is gone (it ended or exec'd another program).
    pub(crate) fn ended(&self) -> bool {
        self.ended_unix_ms.is_some()
    }

    /// Its own peak heap: the highest live heap it sampled, and the run peak it last said
    /// (exact), less what a forked worker inherited.
    pub(crate) fn heap_peak(&self) -> u64 {
        let sampled = self
            .watch
            .timeline
            .samples()
            .iter()
            .map(|s| s.heap.run_peak_bytes.max(s.heap.live_bytes))
            .max()
            .unwrap_or(0);
        sampled.saturating_sub(self.info.inherited_bytes)
    }

    /// Its live heap at the last sample, less what a forked worker inherited.
    pub(crate) fn heap_now(&self) -> Option<u64> {
        self.watch
            .last()
            .map(|s| s.heap.live_bytes.saturating_sub(self.info.inherited_bytes))
    }

    /// Whether it ran training steps: a step past 0 in any sample (its own `step` calls, or the
    /// optimizer's under `memsight run`).
    fn trained(&self) -> bool {
        self.watch.timeline.samples().iter().any(|s| s.step > 0)
    }

    /// Whether it trains: it ran training steps, and for a forked or spawned child its own steps
    /// moved (a fork's samples keep the step it was forked at: a DataLoader worker forked at step
    /// 40 never steps; a multiprocessing child that trains — Hogwild, a `Pool` of trainers —
    /// does).
    fn trains(&self) -> bool {
        if !self.is_worker() {
            return self.trained();
        }
        let mut steps = self.watch.timeline.samples().iter().map(|s| s.step);
        let first = steps.next();
        steps.any(|s| Some(s) != first)
    }

    fn rank(&self) -> Option<(RankSource, u32)> {
        self.info.rank.map(|r| (r.source, r.rank))
    }
}

/// Every measured process of one job.
pub(crate) struct JobRings {
    dir: PathBuf,
    /// The rings' file-name prefix (`ring-<tag>`), each ring `<prefix>-p<pid>-<ns>.bin`.
    name_prefix: String,
    root: u32,
    pub members: Vec<Member>,
    /// The member whose records viewers get.
    pub principal: Option<usize>,
    /// Parents of the processes seen between the members (a `make` or `xargs` above the main
    /// process), kept once read.
    parents: HashMap<u32, u32>,
    /// The rings' directory's modification time at the last listing, and whether a ring found
    /// then could not be opened yet: unchanged, the directory is not listed again.
    listed: Option<std::time::SystemTime>,
    pending: bool,
}

/// How old a directory's modification time must be to be trusted as unchanged: file systems
/// stamp it with a coarse clock, so a ring created just after a listing, within the same tick,
/// can leave it as it was.
const STAMP_SETTLED: std::time::Duration = std::time::Duration::from_secs(1);

impl JobRings {
    /// Follows the rings `<prefix>-p*.bin` of the job whose first process is `root`.
    pub(crate) fn new(prefix: &Path, root: u32) -> Self {
        JobRings {
            dir: prefix.parent().map(Path::to_path_buf).unwrap_or_default(),
            name_prefix: prefix
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            root,
            members: Vec::new(),
            principal: None,
            parents: HashMap::new(),
            listed: None,
            pending: false,
        }
    }

    /// Opens the rings that appeared since the last call. The directory is listed only when its
    /// modification time moved (or is too recent to be trusted, or a ring found was incomplete).
    pub(crate) fn discover(&mut self) {
        let stamp = std::fs::metadata(&self.dir).and_then(|m| m.modified()).ok();
        let settled = stamp.is_some_and(|t| {
            std::time::SystemTime::now()
                .duration_since(t)
                .is_ok_and(|age| age >= STAMP_SETTLED)
        });
        if settled && stamp == self.listed && !self.pending {
            return;
        }
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        self.listed = stamp;
        self.pending = false;
        let want = format!("{}-p", self.name_prefix);
        let mut found: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| {
                let n = e.file_name();
                let n = n.to_string_lossy();
                n.starts_with(&want) && n.ends_with(".bin")
            })
            .map(|e| e.path())
            .filter(|p| !self.members.iter().any(|m| &m.ring == p))
            .collect();
        found.sort();
        for ring in found {
            let Ok(reader) = RingReader::open(&ring) else {
                // Not yet complete (its header is written last): tried again at the next poll.
                self.pending = true;
                continue;
            };
            let mut watch = Watch::new();
            watch.silent = true;
            watch.ring_start_unix_ms = Some(reader.info().start_unix_ms);
            self.members.push(Member {
                pid: reader.info().pid,
                ring,
                reader: Some(reader),
                watch,
                info: ProcessInfo::default(),
                command: Vec::new(),
                ended_unix_ms: None,
                exit_code: None,
                exec_d: false,
                role: None,
            });
        }
    }

    /// Reads every live member's new records and notes the ones whose writer is gone (asked only
    /// of a ring that had nothing new: a writer that just wrote is asked at the next poll).
    pub(crate) fn poll(&mut self, out: &Outputs) {
        for m in &mut self.members {
            let Some(r) = m.reader.as_mut() else { continue };
            let wrote = m.watch.poll(r, out);
            take_hello(&m.watch, &mut m.command, &mut m.info);
            if wrote {
                continue;
            }
            // The process is gone, or its ring's lock is free (an exec closed it). A forked
            // child (a DataLoader worker) shares its parent's lock until it exits: a parent
            // SIGKILLed under its live workers was seen to end only when the job did, and
            // another process was said to have failed first.
            let alive = still_runs(m.pid);
            if !alive || r.writer_gone(&m.ring) {
                m.watch.drain(r, true, out);
                m.exit_code = r.exit_code();
                // Asked again: a process that died after `alive` was read did not exec.
                m.exec_d = m.exit_code.is_none() && alive && still_runs(m.pid);
                m.ended_unix_ms = Some(unix_ms());
                m.reader = None;
                let _ = std::fs::remove_file(&m.ring);
            }
        }
        self.assign_roles();
        self.choose_principal(out);
        if let Some(i) = self.principal {
            let notes = self.annotations();
            out.processes(&notes);
            self.members[i].watch.notes = notes;
        }
    }

    /// Reads what every member left, once the job ended.
    pub(crate) fn finish(&mut self, out: &Outputs) {
        self.discover();
        for m in &mut self.members {
            if let Some(r) = m.reader.as_mut() {
                // A process that outlived the job's first one and still writes its ring (an
                // orphan that exits when its pipe closes, a daemon) is still running, not killed.
                let gone = !still_runs(m.pid) || r.writer_gone(&m.ring);
                m.watch.drain(r, gone, out);
                take_hello(&m.watch, &mut m.command, &mut m.info);
                if gone {
                    m.exit_code = r.exit_code();
                    m.ended_unix_ms.get_or_insert_with(unix_ms);
                }
                m.reader = None;
            }
            let _ = std::fs::remove_file(&m.ring);
        }
        self.assign_roles();
        self.choose_principal(out);
    }

    /// Removes the reports the members wrote beside their rings (read into the job's reports by
    /// now).
    pub(crate) fn remove_member_reports(&self) {
        for m in &self.members {
            let _ = std::fs::remove_file(m.ring.with_extension("json"));
        }
    }

    /// Whether the job's first process exec'd another program as its last measured image (its
    /// latest ring ended while the process ran on).
    pub(crate) fn root_exec_d(&self) -> bool {
        self.members
            .iter()
            .filter(|m| m.pid == self.root)
            .max_by_key(|m| m.watch.ring_start_unix_ms)
            .is_some_and(|m| m.exec_d)
    }

    /// Whether any member's ring is still being written.
    pub(crate) fn any_live(&self) -> bool {
        self.members.iter().any(|m| !m.ended())
    }

    /// The most specific rank source in the job (`RANK` over Slurm's): processes that carry only a
    /// less specific one started the ranks.
    fn rank_source(&self) -> Option<RankSource> {
        self.members
            .iter()
            .filter_map(|m| m.info.rank.map(|r| r.source))
            .max()
    }

    /// Gives each member its role. Rank N is the top-most process carrying rank N; below it, a
    /// fork is its worker and anything else its helper. Without ranks, the main process is the
    /// member that trains ([`Member::trains`]: a process that is not a fork whose step moved past
    /// 0, or a forked or spawned child whose own steps moved), else the largest heap of those that
    /// are not forks: a training loop's DataLoader workers started with `spawn`, or a tool it
    /// runs, can hold more than the loop itself, while the children that train in a Hogwild job
    /// are the job (the parent that started them is its launcher).
    fn assign_roles(&mut self) {
        let source = self.rank_source();
        let by_pid: HashMap<u32, usize> = self
            .members
            .iter()
            .enumerate()
            .map(|(i, m)| (m.pid, i))
            .collect();
        let rank_of = |m: &Member| m.rank().filter(|(s, _)| Some(*s) == source).map(|r| r.1);
        let parent_rank = |m: &Member| {
            by_pid
                .get(&m.info.ppid)
                .and_then(|&i| rank_of(&self.members[i]))
        };
        let superseded = self.superseded();
        let main = self
            .members
            .iter()
            .enumerate()
            .filter(|&(i, m)| (!m.is_worker() || m.trains()) && !superseded[i])
            .max_by_key(|(_, m)| (m.trains(), m.heap_peak(), std::cmp::Reverse(m.pid)))
            .map(|(i, _)| i);
        let roles: Vec<Role> = self
            .members
            .iter()
            .enumerate()
            .map(|(i, m)| match (rank_of(m), parent_rank(m)) {
                (Some(r), p) if p != Some(r) => Role::Rank { rank: r },
                (Some(r), _) if m.is_worker() => Role::Worker { rank: Some(r) },
                (Some(r), _) => Role::Helper { rank: Some(r) },
                // A child that trains is the job when nothing else does.
                (None, _) if source.is_none() && Some(i) == main => Role::Main,
                (None, _) if m.is_worker() => Role::Worker {
                    rank: parent_rank(m),
                },
                (None, _) if source.is_some() => Role::Launcher,
                (None, _) if Some(i) == main => Role::Main,
                (None, _) => Role::Helper { rank: None },
            })
            .collect();
        // Without ranks, a process above the main one started it.
        let main_pid = main.map(|i| self.members[i].pid);
        let above_main = main_pid.map_or_else(Vec::new, |p| self.ancestors(p));
        for (m, role) in self.members.iter_mut().zip(roles) {
            m.role = Some(match role {
                Role::Helper { rank: None } if above_main.contains(&m.pid) => Role::Launcher,
                r => r,
            });
        }
    }

    /// The pids above `pid`: its members' parents as they said them, then /proc's (remembered,
    /// for when they are gone).
    fn ancestors(&mut self, pid: u32) -> Vec<u32> {
        let mut out = Vec::new();
        let mut p = pid;
        for _ in 0..64 {
            let parent = self
                .members
                .iter()
                .find(|m| m.pid == p && m.info.ppid != 0)
                .map(|m| m.info.ppid)
                .or_else(|| self.parents.get(&p).copied())
                .or_else(|| parent_of(p));
            if let Some(q) = parent {
                self.parents.insert(p, q);
            }
            match parent {
                Some(q) if q > 1 && !out.contains(&q) => {
                    out.push(q);
                    p = q;
                }
                _ => break,
            }
        }
        out
    }

    /// For each member, whether it is an image its process replaced by exec'ing another program
    /// that carries memsight too (a wrapper, a pyenv shim, `srun` → `bash` → `python`): the later
    /// image (the latest ring of the same pid) is the process from then on. One pass over the
    /// members: a long job that ran thousands of short programs is polled at the same cost.
    pub(crate) fn superseded(&self) -> Vec<bool> {
        let key = |j: usize| (self.members[j].watch.ring_start_unix_ms, j);
        let mut latest: HashMap<u32, usize> = HashMap::with_capacity(self.members.len());
        for (j, m) in self.members.iter().enumerate() {
            latest
                .entry(m.pid)
                .and_modify(|k| {
                    if key(j) > key(*k) {
                        *k = j
                    }
                })
                .or_insert(j);
        }
        self.members
            .iter()
            .enumerate()
            .map(|(i, m)| latest.get(&m.pid) != Some(&i))
            .collect()
    }

    /// The lowest rank, else the main process; the one viewers follow. Of a process that exec'd,
    /// its latest image (a rank started through a wrapper or a shim is the program it runs).
    fn choose_principal(&mut self, out: &Outputs) {
        let superseded = self.superseded();
        let pick = self
            .members
            .iter()
            .enumerate()
            .filter_map(|(i, m)| {
                let later = superseded[i];
                match m.role {
                    Some(Role::Rank { rank }) => Some((0, rank, later, i)),
                    Some(Role::Main) => Some((1, 0, later, i)),
                    _ => None,
                }
            })
            .min()
            .map(|(_, _, _, i)| i);
        if pick == self.principal || pick.is_none() {
            return;
        }
        if let Some(old) = self.principal {
            self.members[old].watch.silent = true;
        }
        if let Some(new) = pick {
            let root = self.root;
            let m = &mut self.members[new];
            m.watch.silent = false;
            m.watch.add_trees_of(root);
            m.watch.replay(out);
            // Its failed allocations so far (none is a figure too: viewers and metrics show it).
            let failures = m
                .reader
                .as_ref()
                .map_or(m.watch.alloc_failures.0, |r| r.alloc_failures().0);
            out.alloc_failures(failures);
        }
        self.principal = pick;
    }

    /// The principal member.
    pub(crate) fn principal(&self) -> Option<&Member> {
        self.principal.map(|i| &self.members[i])
    }

    /// Each member's heap over time (its own: a forked worker's less what it inherited) and its
    /// end, as the job's heap adds them up (`memsight_format::report::job_heap_peak`).
    pub(crate) fn heap_series(&self) -> Vec<memsight_format::report::HeapSeries> {
        self.members
            .iter()
            .map(|m| memsight_format::report::HeapSeries {
                // Samples are timed from the ring's start: without it, none can be placed.
                samples: m
                    .watch
                    .ring_start_unix_ms
                    .map(|start| {
                        m.watch
                            .timeline
                            .samples()
                            .iter()
                            .map(|s| {
                                (
                                    start.saturating_add(s.t_ms),
                                    s.heap.live_bytes.saturating_sub(m.info.inherited_bytes),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                end_unix_ms: m.ended_unix_ms,
            })
            .collect()
    }

    /// Each member's heap and role by pid, for the process tree viewers and reports show.
    pub(crate) fn annotations(&self) -> HashMap<u32, (Option<u64>, String)> {
        self.members
            .iter()
            .filter(|m| !m.ended())
            .map(|m| {
                let role = m.role.map_or_else(|| "process".into(), |r| r.describe());
                (m.pid, (m.heap_now(), role))
            })
            .collect()
    }
}

/// Takes a member's greeting once it has one, and what it says of itself from its latest: a
/// process greets again when its environment came to name its rank after its session started
/// (Lightning's first rank is the script the user ran, which sets `LOCAL_RANK` before it starts
/// the others).
fn take_hello(watch: &Watch, command: &mut Vec<String>, info: &mut ProcessInfo) {
    if let Some(Record::Hello {
        command: c,
        process,
        ..
    }) = &watch.hello
    {
        if command.is_empty() {
            *command = c.clone();
        }
        if info != process {
            *info = process.clone();
        }
    }
}

/// Whether process `pid` still runs (exists and is not a zombie): a writer that left because the
/// job ended is the end, not a hand-over to outside sampling.
pub(crate) fn still_runs(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().to_string())
        })
        .is_some_and(|rest| !rest.starts_with('Z') && !rest.starts_with('X'))
}

fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}
