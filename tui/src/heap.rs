//! `memsight heap top|diff|flamegraph|pprof|dump|sampling`: read the jemalloc heap profiles a job
//! wrote (top sites, growth between two, flamegraph, pprof) and ask a running job for one.

use memsight_analysis::heapprof::symbolize::Symbolizer;
use memsight_analysis::heapprof::{flame, growth, pprof, Profile};
use memsight_format::text;
use memsight_format::units::fmt_bytes;
use memsight_format::wire::ring::{request_heap, HeapRequest, RingReader};
use memsight_format::wire::Record;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Heap profiles: where the bytes are.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
enum What {
    /// The sites holding the most bytes in a profile (`REPORT.heap/peak.heap`).
    Top {
        /// A heap profile (`.heap`, jemalloc's heap_v2 text: memsight's sampler writes it).
        profile: PathBuf,
        /// Sites to list (the libraries' start-up follows them, apart).
        #[arg(short = 'n', long, default_value_t = 15)]
        count: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// The sites that grew from one profile to a later one: the leak view.
    Diff {
        /// The earlier profile.
        before: PathBuf,
        /// The later profile.
        after: PathBuf,
        /// Sites to list.
        #[arg(short = 'n', long, default_value_t = 15)]
        count: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Also draw the growth as a flamegraph SVG here.
        #[arg(long, value_name = "SVG")]
        flamegraph: Option<PathBuf>,
    },
    /// Draw a profile as a flamegraph SVG (frame width = live bytes).
    Flamegraph {
        /// A jemalloc heap profile.
        profile: PathBuf,
        /// The SVG to write.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Convert a profile to gzipped pprof (for `pprof`, speedscope, Pyroscope).
    Pprof {
        /// A jemalloc heap profile.
        profile: PathBuf,
        /// The `.pb.gz` to write.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Ask a running job (with a memsight session) to write a heap profile now; prints its path.
    Dump {
        /// The job's process id.
        pid: u32,
        /// Seconds to wait for the job to write it.
        #[arg(long, default_value_t = 10)]
        wait: u64,
    },
    /// Switch a running job's allocation sampling on or off.
    Sampling {
        /// `on` or `off`.
        #[arg(value_parser = ["on", "off"])]
        state: String,
        /// The job's process id.
        pid: u32,
    },
}

fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("memsight heap: {}", text::line(&msg.to_string()));
    ExitCode::from(2)
}

/// Loads the profiles with one symbolizer; says which files gave no symbols.
fn load<const N: usize>(paths: [&Path; N]) -> Result<[Profile; N], String> {
    let mut sym = Symbolizer::new();
    let mut out = Vec::with_capacity(N);
    for p in paths {
        out.push(Profile::load(p, &mut sym)?);
    }
    for m in &sym.missing {
        eprintln!(
            "memsight heap: no symbols from {}: its frames show as addresses",
            text::line(m)
        );
    }
    out.try_into()
        .map_err(|_| "internal: profile count".to_string())
}

fn print_json(v: &impl serde::Serialize) -> Result<(), String> {
    println!(
        "{}",
        serde_json::to_string_pretty(v).map_err(|e| e.to_string())?
    );
    Ok(())
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), String> {
    memsight_format::safe_file::write(path, bytes)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Runs the verb: exit 0, or 2 with one line on bad input.
pub fn run(a: Args) -> ExitCode {
    match run_inner(a.what) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

fn run_inner(what: What) -> Result<(), String> {
    match what {
        What::Top {
            profile,
            count,
            json,
        } => {
            let [p] = load([&profile])?;
            let sites = p.top_sites(count);
            if json {
                print_json(&sites)?;
            } else {
                println!(
                    "{} live in sampled stacks (one sample per {} allocated)",
                    fmt_bytes(p.total_bytes().round() as u64),
                    fmt_bytes(p.sample_bytes)
                );
                for s in sites {
                    // Function and file names come from the job's binaries: shown escaped.
                    println!("{}", text::line(&s.row()));
                }
                let total = p.total_bytes().max(1.0);
                for (module, bytes) in p.start_up_bytes() {
                    println!(
                        "{:>10}  {:>5.1}%  (library start-up) {}",
                        fmt_bytes(bytes.round() as u64),
                        bytes / total * 100.0,
                        text::line(&module)
                    );
                }
                let tensors = p.tensor_storage_bytes();
                if tensors >= 1.0 {
                    println!(
                        "{:>10}  {:>5.1}%  (CPU tensor storage, all sites above included)",
                        fmt_bytes(tensors.round() as u64),
                        tensors / total * 100.0
                    );
                }
                for (module, bytes) in p.import_bytes() {
                    println!(
                        "{:>10}  {:>5.1}%  (import) {}",
                        fmt_bytes(bytes.round() as u64),
                        bytes / total * 100.0,
                        text::line(&module)
                    );
                }
            }
        }
        What::Diff {
            before,
            after,
            count,
            json,
            flamegraph,
        } => {
            let [a, b] = load([&before, &after])?;
            let sites = growth(&a, &b, count);
            let drawing = match flamegraph {
                Some(svg) => {
                    let folded = memsight_analysis::heapprof::profile::growth_folded(&a, &b);
                    let bytes = if folded.is_empty() {
                        // Nothing grew (a leak-free job): the file asked for says so.
                        flame::empty_svg(
                            "heap growth",
                            &format!(
                                "no site grew from {} to {}",
                                before.display(),
                                after.display()
                            ),
                        )
                    } else {
                        flame::svg("heap growth", &folded)?
                    };
                    Some((svg, bytes))
                }
                None => None,
            };
            if json {
                print_json(&sites)?;
            } else {
                println!(
                    "live heap in sampled stacks: {} → {}",
                    fmt_bytes(a.total_bytes().round() as u64),
                    fmt_bytes(b.total_bytes().round() as u64)
                );
                if sites.is_empty() {
                    println!("no site grew");
                }
                for s in sites {
                    println!("{}", text::line(&s.row()));
                }
            }
            if let Some((svg, bytes)) = drawing {
                write(&svg, &bytes)?;
            }
        }
        What::Flamegraph { profile, output } => {
            let [p] = load([&profile])?;
            write(
                &output,
                &flame::svg(&profile.display().to_string(), &p.folded())?,
            )?;
            println!("{}", output.display());
        }
        What::Pprof { profile, output } => {
            let [p] = load([&profile])?;
            let when = std::fs::metadata(&profile)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_millis() as u64);
            write(&output, &pprof::encode(&p, when))?;
            println!("{}", output.display());
        }
        What::Dump { pid, wait } => {
            let ring = memsight_format::wire::ring_of(pid)?;
            let mut reader = RingReader::open(&ring).map_err(|e| e.to_string())?;
            let n = request_heap(&ring, HeapRequest::Dump).map_err(|e| e.to_string())?;
            let want = format!("request-{n}.heap");
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(wait) {
                for r in reader.poll() {
                    if let Record::HeapProfile(d) = r {
                        if d.path.ends_with(&want) {
                            println!("{}", text::line(&d.path));
                            return Ok(());
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            return Err(format!(
                "process {pid} wrote no heap profile within {wait} s: it needs a memsight session \
                 with heap profiling ({})",
                memsight::heapprof::control::HOW_TO_ENABLE
            ));
        }
        What::Sampling { state, pid } => {
            let ring = memsight_format::wire::ring_of(pid)?;
            request_heap(&ring, HeapRequest::Sampling(state == "on")).map_err(|e| e.to_string())?;
            println!("asked process {pid} to switch heap sampling {state}");
        }
    }
    Ok(())
}
