//! The targets: what each feeds an input to, the seeds it starts from and the tokens its format is
//! made of.

use memsight::wire::ring::{RingReader, RingWriter};
use memsight::wire::stream::StreamReader;
use memsight::wire::{Record, MAJOR, MINOR};
use memsight::{Report, Snapshot};
use memsight_analysis::budget::Budgets;
use memsight_analysis::heapprof::dump::HeapDump;
use memsight_analysis::heapprof::profile::{growth, Profile};
use memsight_analysis::heapprof::symbolize::Symbolizer;
use memsight_tui::state::ViewerState;
use std::path::PathBuf;

/// A parser of untrusted input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// `Report::from_slice`, then what `check`, `summary` and `view` do with a report.
    Report,
    /// `Budgets::parse`, then a check of the example report.
    Budget,
    /// `RingReader` on a ring file: open, poll, poll after the writer's death.
    Ring,
    /// `StreamReader` on a socket stream, each record applied to the viewer's state.
    Stream,
    /// `HeapDump::parse`, symbolized into sites, folded stacks, growth and pprof.
    HeapProfile,
}

impl Target {
    /// Every target.
    pub const ALL: [Target; 5] = [
        Target::Report,
        Target::Budget,
        Target::Ring,
        Target::Stream,
        Target::HeapProfile,
    ];

    /// The target's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Target::Report => "report",
            Target::Budget => "budget",
            Target::Ring => "ring",
            Target::Stream => "stream",
            Target::HeapProfile => "heap-profile",
        }
    }

    /// The target named `name`.
    pub fn from_name(name: &str) -> Option<Target> {
        Target::ALL.into_iter().find(|t| t.name() == name)
    }

    pub(crate) fn seeds(self) -> Vec<Vec<u8>> {
        match self {
            Target::Report => vec![EXAMPLE_REPORT.as_bytes().to_vec(), small_report()],
            Target::Budget => vec![
                EXAMPLE_BUDGET.as_bytes().to_vec(),
                b"version = 1\nmax_host_peak = \"1GiB\"\n".to_vec(),
            ],
            Target::Ring => ring_seeds(),
            Target::Stream => vec![stream_seed()],
            Target::HeapProfile => vec![
                HEAP_SEED.as_bytes().to_vec(),
                // Found by this target: a mapping's file offset near 2^64 overflowed.
                HEAP_SEED
                    .replace(" 00000000 08:01", " ffffffffffffff00 08:01")
                    .into_bytes(),
            ],
        }
    }

    pub(crate) fn dictionary(self) -> &'static [&'static str] {
        match self {
            Target::Report | Target::Stream => &[
                "null",
                "true",
                "{}",
                "[]",
                "\"\"",
                "\"\\u0000\"",
                "\"\\ud800\"",
                "\"type\":\"snapshot\"",
                "\"type\":\"ended\"",
                "\"schema_version\":1",
                "\"t_ms\":",
                "\"step\":",
                "\"phase\":\"a/b\"",
                "\"bytes\":",
            ],
            Target::Budget => &[
                "version = 1\n",
                "\"\"",
                "[x]\n",
                "= ",
                "\"0B\"",
                "\"1EiB\"",
                "\"99999999999999999999GiB\"",
                "\"-1GiB\"",
                "\"0.5\"",
                "\"1.5%\"",
                "max_device_peak = ",
                "max_fragmentation = ",
            ],
            Target::Ring => &["MSIGHTRG", "\u{1}\u{0}", "\u{ff}\u{ff}\u{ff}\u{ff}"],
            Target::HeapProfile => &[
                "heap_v2/",
                "@ 0x",
                "  t*: ",
                ": ",
                "MAPPED_LIBRARIES:\n",
                " r-xp ",
                "ffffffffffffffff",
                "/proc/self/exe",
                "\n",
            ],
        }
    }

    pub(crate) fn exec(self, input: &[u8], ctx: &mut Context) -> bool {
        match self {
            Target::Report => match Report::from_slice(input) {
                Ok(r) => {
                    let _ = memsight_analysis::summary::markdown(&r);
                    let _ = memsight::report::tips::derive(&r);
                    let _ = ctx.budgets.check(&r);
                    let _ = ViewerState::from_report("fuzz", r);
                    true
                }
                Err(e) => {
                    let _ = e.to_string();
                    false
                }
            },
            Target::Budget => {
                let Ok(text) = std::str::from_utf8(input) else {
                    return false;
                };
                match Budgets::parse(text) {
                    Ok(b) => {
                        let _ = b.check(&ctx.example);
                        true
                    }
                    Err(_) => false,
                }
            }
            Target::Ring => {
                if std::fs::write(&ctx.ring, input).is_err() {
                    return false;
                }
                match RingReader::open(&ctx.ring) {
                    Ok(mut r) => {
                        let _ = r.poll();
                        let _ = r.poll_final();
                        let _ = (r.dropped(), r.alloc_failures(), r.info());
                        true
                    }
                    Err(e) => {
                        let _ = e.to_string();
                        false
                    }
                }
            }
            Target::Stream => {
                let mut s = StreamReader::with_max_line(input, 1 << 20);
                let mut state = ViewerState::live("fuzz");
                let mut ok = false;
                for _ in 0..10_000 {
                    match s.next_record() {
                        Ok(Some(r)) => {
                            state.apply(r);
                            ok = true;
                        }
                        Ok(None) => break,
                        Err(e) => {
                            let _ = e.to_string();
                            return false;
                        }
                    }
                }
                ok
            }
            Target::HeapProfile => {
                let Ok(text) = std::str::from_utf8(input) else {
                    return false;
                };
                match HeapDump::parse(text) {
                    Ok(d) => {
                        let p = Profile::symbolize(&d, &mut Symbolizer::new());
                        let _ = (p.top_sites(10), p.folded(), p.own_bytes());
                        let _ = growth(&p, &p, 10);
                        let _ = memsight_analysis::heapprof::pprof::encode(&p, 0);
                        true
                    }
                    Err(_) => false,
                }
            }
        }
    }
}

/// What targets share across executions.
pub(crate) struct Context {
    budgets: Budgets,
    example: Report,
    ring: PathBuf,
}

impl Context {
    pub(crate) fn new() -> Self {
        let example = Report::from_slice(EXAMPLE_REPORT.as_bytes()).unwrap_or_default();
        let budgets = Budgets::parse(EXAMPLE_BUDGET).unwrap_or_else(|_| {
            Budgets::parse("version = 1\n").unwrap_or_else(|e| panic!("empty budget: {e}"))
        });
        let ring = scratch(&format!(
            "exec-{}",
            std::thread::current().name().unwrap_or("t")
        ));
        Context {
            budgets,
            example,
            ring,
        }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.ring);
    }
}

const EXAMPLE_REPORT: &str = include_str!("../../../docs/report.example.json");
const EXAMPLE_BUDGET: &str = include_str!("../../../docs/budget.example.toml");
const HEAP_SEED: &str = "heap_v2/524288
  t*: 10: 5242880 [0: 0]
  t0: 10: 5242880 [0: 0]
@ 0x400100 0x400200 0x400300
  t*: 4: 2097152 [0: 0]
  t0: 4: 2097152 [0: 0]
@ 0x400100 0x400400
  t*: 6: 3145728 [0: 0]
  t0: 6: 3145728 [0: 0]

MAPPED_LIBRARIES:
00400000-00500000 r-xp 00000000 08:01 123 /nonexistent/memsight-fuzz-app
";

/// A path of this process in memory-backed `/dev/shm` where there is one (a million ring files
/// are written), else in the temporary directory.
fn scratch(name: &str) -> PathBuf {
    let name = name.replace(|c: char| !c.is_ascii_alphanumeric() && c != '-', "_");
    let shm = std::path::Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    dir.join(format!("memsight-fuzz-{}-{name}", std::process::id()))
}

fn snapshot(t: u64) -> Snapshot {
    let mut s = Snapshot {
        t_ms: t,
        step: t / 100,
        phase: Some("train/forward".into()),
        missed_intervals: t / 1000,
        ..Snapshot::default()
    };
    s.heap.live_bytes = 1 << 20;
    s.heap.peak_bytes = 2 << 20;
    s
}

fn small_report() -> Vec<u8> {
    let r = Report {
        schema_version: memsight::report::SCHEMA_VERSION,
        timeline: vec![snapshot(0), snapshot(100)],
        ..Report::default()
    };
    serde_json::to_vec(&r).unwrap_or_default()
}

fn records() -> Vec<Record> {
    vec![
        Record::Hello {
            pid: 7,
            command: vec!["train".into()],
            start_unix_ms: 1,
            interval_ms: 100,
            memsight_version: "0.1.0".into(),
            process: Default::default(),
        },
        Record::Snapshot(Box::new(snapshot(100))),
        Record::Phases {
            phases: Vec::new(),
            histogram: Vec::new(),
        },
        Record::Finished {
            report_path: Some("r.json".into()),
        },
    ]
}

/// A complete ring with a few records, and the same cut short.
fn ring_seeds() -> Vec<Vec<u8>> {
    let p = scratch("seed-ring");
    let _ = std::fs::remove_file(&p);
    let bytes = RingWriter::create_with(&p, 7, 1, 100, 1024, 8)
        .map(|w| {
            for r in records() {
                w.append(&r);
            }
            std::fs::read(&p).unwrap_or_default()
        })
        .unwrap_or_default();
    let _ = std::fs::remove_file(&p);
    let half = bytes[..bytes.len() / 2].to_vec();
    vec![bytes, half]
}

fn stream_seed() -> Vec<u8> {
    let mut lines = vec![
        Record::SidecarHello {
            major: MAJOR,
            minor: MINOR,
            job_pid: 7,
            command: vec!["train".into()],
        },
        Record::State {
            timeline: vec![snapshot(0)],
        },
    ];
    lines.extend(records());
    lines.push(Record::Dropped { count: 3 });
    lines.push(Record::Ended {
        description: "exited with code 0".into(),
        post_mortem: None,
    });
    let mut out = Vec::new();
    for r in lines {
        out.extend(serde_json::to_vec(&r).unwrap_or_default());
        out.push(b'\n');
    }
    out
}
