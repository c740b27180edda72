//! What the viewer knows: the job, its timeline and statistics, fed by wire records (live) or by a
//! report (replay). Never imports ratatui: views render this, input becomes intents.

pub mod backoff;
pub mod connection;
pub mod headline;

use memsight::{PhaseStats, StepStats};
use memsight_format::report::leak::LeakEstimate;
use memsight_format::report::tips::Tip;
use memsight_format::report::{Fragmentation, HistogramBucket, PostMortem, Report};
use memsight_format::timeline::{raise_resident, PeakAt, Timeline};
use memsight_format::wire::Record;
use memsight_format::Snapshot;

/// Most snapshots kept for the charts (the sidecar keeps the bounded full history).
pub const MAX_SAMPLES: usize = 20_000;

/// Where the data comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A sidecar's socket.
    Live {
        /// Its path.
        socket: String,
        /// Connected now.
        connected: bool,
    },
    /// A finished run's report.
    Replay {
        /// The report file.
        path: String,
    },
}

/// Everything the screens show.
#[derive(Clone, Debug)]
pub struct ViewerState {
    /// Live or replay.
    pub source: Source,
    /// The job's pid.
    pub pid: u32,
    /// The job's command line.
    pub command: Vec<String>,
    /// Snapshots, oldest first.
    pub timeline: Vec<Snapshot>,
    /// Records this viewer missed: it read too slowly, or the sidecar lost them from the job's ring
    /// (the sidecar's `dropped` notices).
    pub dropped: u64,
    /// Per-phase statistics (the report's; live: the job's latest).
    pub phases: Vec<PhaseStats>,
    /// Per-step statistics (reports; live: derived from snapshots).
    pub steps: Vec<StepStats>,
    /// Size histogram (the report's; live: the job's latest, wire 1.4).
    pub histogram: Vec<HistogramBucket>,
    /// Tips (the report's; live: derived from the live report).
    pub tips: Vec<Tip>,
    /// Leak slope (reports; live: re-estimated from sampled step ends whenever a step ends).
    pub leak: Option<LeakEstimate>,
    /// How the job ended, once it has.
    pub ended: Option<String>,
    /// Why a live viewer is not connected (and whether it keeps trying).
    pub down: Option<connection::Down>,
    /// The post-mortem (reports written by a sidecar).
    pub post_mortem: Option<PostMortem>,
    /// Sampling interval, when known.
    pub interval_ms: Option<u64>,
    /// Device OOMs caught by the job's observer.
    pub device_ooms: Vec<memsight::devices::DeviceOom>,
    /// Device memory at each device's peak by Python line (`--device-history`), one per device.
    pub device_lines: Vec<memsight::devices::DeviceLines>,
    /// The heap-profile section (reports).
    pub heap_profile: Option<memsight::heapprof::HeapProfile>,
    /// How many heap profiles the job announced while running.
    pub heap_dumps: u64,
    /// The latest heap profile the job announced.
    pub last_heap_dump: Option<memsight::heapprof::DumpRecord>,
    /// The profile the report will show the sites of: the one with the largest heap so far (a
    /// step profile only while there is no other), as the report's `heap_profile.at_peak`.
    pub peak_heap_dump: Option<memsight::heapprof::DumpRecord>,
    /// Live: the sites of [`Self::peak_heap_dump`] ([`crate::sites`]), or why it could not be
    /// read.
    pub live_sites: Option<Result<memsight_format::heap_profile::ProfileView, String>>,
    /// The run's heap fragmentation (one definition, [`Fragmentation`]): the report's, or live,
    /// at the resident peak of every snapshot seen (also those the bounded timeline let go).
    pub fragmentation: Option<Fragmentation>,
    /// The report: the file replayed (its timeline moved to [`Self::timeline`]), or live, one
    /// built from what arrived by the report's own builder ([`headline`]), refreshed about four times a
    /// second of the job's time. Its peaks are the Overview's figures.
    pub report: Option<Report>,
    /// The live snapshot with the highest jemalloc resident so far.
    resident_peak: Option<(PeakAt, Snapshot)>,
    /// Live: the snapshots as a report keeps them (bounded, peaks exact over every sample).
    recorded: Timeline,
    /// Live: the job time of the latest sample when the report was last built.
    built_at_ms: u64,
}

/// The most of a command line the viewer keeps to draw (every frame wraps it): a crafted or
/// runaway one (a 100 MB argument) is cut, saying how much was left out; the report keeps it whole.
const SHOWN_COMMAND_BYTES: usize = 4096;

/// `command` cut to [`SHOWN_COMMAND_BYTES`] in all, at character boundaries.
pub fn shown_command(command: Vec<String>) -> Vec<String> {
    let total: usize = command.iter().map(|a| a.len() + 1).sum();
    if total <= SHOWN_COMMAND_BYTES {
        return command;
    }
    let mut left = SHOWN_COMMAND_BYTES;
    let mut shown = Vec::new();
    for arg in command {
        if left == 0 {
            break;
        }
        let mut end = arg.len().min(left);
        while !arg.is_char_boundary(end) {
            end -= 1;
        }
        left -= end;
        left = left.saturating_sub(1);
        shown.push(arg[..end].to_string());
    }
    let kept: usize = shown.iter().map(|a| a.len() + 1).sum();
    shown.push(format!(
        "… ({} more bytes, in the report)",
        total.saturating_sub(kept)
    ));
    shown
}

impl ViewerState {
    /// An empty state waiting for a sidecar at `socket`.
    pub fn live(socket: &str) -> Self {
        ViewerState {
            source: Source::Live {
                socket: socket.to_string(),
                connected: false,
            },
            pid: 0,
            command: Vec::new(),
            timeline: Vec::new(),
            dropped: 0,
            phases: Vec::new(),
            steps: Vec::new(),
            histogram: Vec::new(),
            tips: Vec::new(),
            leak: None,
            ended: None,
            down: None,
            post_mortem: None,
            interval_ms: None,
            device_ooms: Vec::new(),
            device_lines: Vec::new(),
            heap_profile: None,
            heap_dumps: 0,
            last_heap_dump: None,
            peak_heap_dump: None,
            live_sites: None,
            fragmentation: None,
            report: None,
            resident_peak: None,
            recorded: Timeline::default(),
            built_at_ms: 0,
        }
    }

    /// The state of a finished run.
    pub fn from_report(path: &str, mut r: Report) -> Self {
        let mut s = ViewerState::live("");
        s.source = Source::Replay {
            path: path.to_string(),
        };
        s.pid = r.job.pid;
        s.command = shown_command(r.job.command.clone());
        s.timeline = std::mem::take(&mut r.timeline);
        s.fragmentation = r.fragmentation.clone();
        s.phases = r.phases.clone();
        s.steps = r.steps.clone();
        s.histogram = r.histogram.clone();
        s.tips = r.tips.clone();
        s.leak = r.leak.clone();
        s.interval_ms = Some(r.interval_ms);
        s.ended = Some(match &r.post_mortem {
            Some(pm) => pm.description.clone(),
            None => r.job.exit.description.clone(),
        });
        s.post_mortem = r.post_mortem.clone();
        s.device_ooms = r.device_ooms.clone();
        s.device_lines = r.device_lines.clone();
        s.heap_profile = r.heap_profile.clone();
        s.report = Some(r);
        s
    }

    /// The Overview's figures: the report's peaks, each where it was first reached.
    pub fn figures(&self) -> Vec<headline::Figure> {
        self.report
            .as_ref()
            .map(|r| headline::figures(r, &self.timeline))
            .unwrap_or_default()
    }

    /// Marks the live connection up or down.
    pub fn set_connected(&mut self, up: bool) {
        if let Source::Live { connected, .. } = &mut self.source {
            *connected = up;
        }
        if up {
            self.down = None;
        }
    }

    /// Marks the live connection down, saying why.
    pub fn set_down(&mut self, down: connection::Down) {
        self.set_connected(false);
        self.down = Some(down);
    }

    /// Applies one wire record.
    pub fn apply(&mut self, r: Record) {
        match r {
            Record::SidecarHello {
                job_pid, command, ..
            } => {
                self.pid = job_pid;
                self.command = shown_command(command);
                self.set_connected(true);
            }
            Record::State { timeline } => {
                self.recorded = Timeline::default();
                for s in &timeline {
                    self.recorded.push(s.clone());
                }
                self.timeline = timeline;
                self.resident_peak = None;
                for s in &self.timeline {
                    raise_resident(&mut self.resident_peak, s);
                }
                self.fragmentation = Fragmentation::at_resident_peak(self.resident_peak.as_ref());
                self.steps = steps_of(&self.timeline);
                self.leak = memsight_format::report::leak::estimate(&self.steps);
                self.refresh_report(true);
            }
            Record::Snapshot(s) => {
                self.push(*s);
                self.refresh_report(false);
            }
            Record::Hello { interval_ms, .. } => self.interval_ms = Some(interval_ms),
            Record::Dropped { count } => self.dropped += count,
            Record::Ended {
                description,
                post_mortem,
            } => {
                self.ended = Some(description);
                self.post_mortem = post_mortem.map(|pm| *pm);
                self.refresh_report(true);
            }
            Record::Phases { phases, histogram } => {
                let first = self.phases.is_empty() && !phases.is_empty();
                self.phases = phases;
                if !histogram.is_empty() {
                    self.histogram = histogram;
                }
                self.refresh_report(first);
            }
            Record::DeviceOom(o) => {
                self.device_ooms.push(*o);
                self.refresh_report(true);
            }
            Record::DeviceLines(l) => {
                self.device_lines.retain(|o| o.device != l.device);
                self.device_lines.push(*l);
            }
            Record::HeapProfile(d) => {
                self.heap_dumps += 1;
                if is_new_peak(self.peak_heap_dump.as_ref(), &d) {
                    self.peak_heap_dump = Some(d.clone());
                }
                self.last_heap_dump = Some(d);
            }
            Record::Finished { .. }
            | Record::SignalSent { .. }
            | Record::FailedAt { .. }
            | Record::Unknown => {}
        }
    }

    fn push(&mut self, s: Snapshot) {
        if memsight_format::report::build::add_step_sample(&mut self.steps, &s) {
            // A step just ended: the live leak slope over the steps so far (same estimator as
            // the report's, on sampled step ends; every 20th step once there are many).
            let n = self.steps.len();
            if n <= 200 || n.is_multiple_of(20) {
                self.leak = memsight_format::report::leak::estimate(&self.steps);
            }
        }
        raise_resident(&mut self.resident_peak, &s);
        self.fragmentation = Fragmentation::at_resident_peak(self.resident_peak.as_ref());
        self.recorded.push(s.clone());
        self.timeline.push(s);
        if self.timeline.len() > MAX_SAMPLES {
            self.timeline.drain(..self.timeline.len() - MAX_SAMPLES);
        }
    }
}

/// Whether `d` becomes the profiled peak over `old`: the largest heap, a step profile only over
/// another step profile (the report's rule, `memsight_analysis::heapprof::summarize`).
fn is_new_peak(
    old: Option<&memsight::heapprof::DumpRecord>,
    d: &memsight::heapprof::DumpRecord,
) -> bool {
    use memsight_format::heap_profile::DumpKind;
    let step = |x: &memsight::heapprof::DumpRecord| x.kind == DumpKind::Step;
    match old {
        None => true,
        Some(o) if step(o) != step(d) => step(o),
        Some(o) => (d.heap_bytes, d.t_ms) > (o.heap_bytes, o.t_ms),
    }
}

fn steps_of(timeline: &[Snapshot]) -> Vec<StepStats> {
    memsight_format::report::build::steps_from_snapshots(timeline)
}
