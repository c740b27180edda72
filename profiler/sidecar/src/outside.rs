//! Sampling a job from outside, for jobs without a flight recorder (`attach` to any process, `run`
//! of a job that does not link memsight): /proc status and the memory cgroup, each sample fed
//! into the [`Watch`] as the job's own snapshots would be (which adds the process tree to both).

use crate::outputs::Outputs;
use crate::watch::Watch;
use memsight::collect::{command_line, HostCollector, SourceStatus};
use memsight_format::heap::HeapStats;
use memsight_format::snapshot::Snapshot;
use memsight_format::wire::Record;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The readers of one process and when the next sample is due.
pub(crate) struct Outside {
    pid: u32,
    host: HostCollector,
    started: Instant,
    next: Instant,
    interval: Duration,
    /// The sources' statuses at the last sample kept (one taken as the process vanished would say
    /// its status is unreadable).
    kept_sources: Option<Vec<SourceStatus>>,
    /// The process's command line as last read (wrappers such as pyenv shims or `env` exec into
    /// the real program, so it is read again at each sample).
    pub command: Vec<OsString>,
    /// The step its samples are at (the last step its ring told, when it takes over from one).
    step: u64,
}

impl Outside {
    /// Opens the readers of process `pid`; the first sample is due at once.
    pub(crate) fn open(pid: u32, interval: Duration) -> Self {
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        let now = Instant::now();
        Outside {
            pid,
            host: HostCollector::open(&proc_dir, Path::new("/proc"), Path::new("/"), false),
            started: now,
            next: now,
            interval,
            kept_sources: None,
            command: command_line(pid),
            step: 0,
        }
    }

    /// Goes on from a flight recorder that stopped while the process lives (it `exec`'d a program
    /// without the session): samples on the ring's time axis (`elapsed_ms` since its start), at
    /// the ring's last step.
    pub(crate) fn after_ring(mut self, elapsed_ms: u64, step: u64) -> Self {
        let now = Instant::now();
        self.started = now
            .checked_sub(Duration::from_millis(elapsed_ms))
            .unwrap_or(now);
        self.step = step;
        self
    }

    /// Takes a sample into `watch` when one is due. A sample taken as the process vanished says
    /// nothing and is left out.
    pub(crate) fn tick(&mut self, watch: &mut Watch, out: &Outputs) {
        if let Some(s) = self.due() {
            watch.take(vec![Record::Snapshot(Box::new(s))], out);
        }
    }

    /// A sample, when one is due and the process could still be read.
    pub(crate) fn due(&mut self) -> Option<Snapshot> {
        let now = Instant::now();
        if now < self.next {
            return None;
        }
        self.next += self.interval;
        if self.next < now {
            self.next = now + self.interval;
        }
        let s = Snapshot::new(
            self.started.elapsed().as_millis() as u64,
            self.step,
            None,
            HeapStats::default(),
            self.host.sample(),
        );
        s.process.as_ref()?;
        let now = command_line(self.pid);
        if !now.is_empty() {
            self.command = now;
        }
        self.kept_sources = Some(self.host.sources());
        Some(s)
    }

    /// Which sources could be read, and why not, as of the last sample kept.
    pub(crate) fn sources(&self) -> Vec<SourceStatus> {
        self.kept_sources
            .clone()
            .unwrap_or_else(|| self.host.sources())
    }
}
