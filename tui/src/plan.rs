//! `memsight plan --gpus N --gpu-memory SIZE [--headroom R] REPORT…`: how many jobs per GPU.

use memsight_analysis::plan::{self, DEFAULT_HEADROOM};
use memsight_format::units::parse_size;
use memsight_format::Report;
use std::path::PathBuf;
use std::process::ExitCode;

/// Jobs are the reports' device peaks; every GPU is alike.
#[derive(clap::Args)]
pub struct Args {
    /// GPUs available.
    #[arg(long)]
    gpus: usize,
    /// Memory of each GPU (e.g. 80GiB).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    gpu_memory: u64,
    /// Share of each GPU kept free.
    #[arg(long, default_value_t = DEFAULT_HEADROOM)]
    headroom: f64,
    /// Print the plan as JSON.
    #[arg(long)]
    json: bool,
    /// Reports of measured runs, one per job to place (repeat a report to place a job twice).
    #[arg(required = true, value_name = "REPORT")]
    reports: Vec<PathBuf>,
}

fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("memsight plan: {msg}");
    ExitCode::from(2)
}

/// Prints the plan; exit 1 when the jobs do not fit, 2 on bad input.
pub fn run(a: Args) -> ExitCode {
    let mut jobs = Vec::new();
    for (i, p) in a.reports.iter().enumerate() {
        let r = match Report::load(p) {
            Ok(r) => r,
            Err(e) => return fail(e),
        };
        let name = format!(
            "#{} {}",
            i + 1,
            p.file_name()
                .map(|f| f.to_string_lossy())
                .unwrap_or_default()
        );
        match plan::job_from_report(&name, &r) {
            Ok(j) => jobs.push(j),
            Err(e) => return fail(e),
        }
    }
    match plan::plan(jobs, a.gpus, a.gpu_memory, a.headroom) {
        Ok(p) => {
            if a.json {
                match serde_json::to_string_pretty(&p) {
                    Ok(t) => println!("{t}"),
                    Err(e) => return fail(e),
                }
            } else {
                print!("{}", p.render());
            }
            ExitCode::SUCCESS
        }
        Err(e @ plan::PlanError::Invalid(_)) => fail(e),
        Err(e) => {
            println!("memsight plan: {e}");
            ExitCode::from(1)
        }
    }
}
