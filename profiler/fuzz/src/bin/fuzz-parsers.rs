//! `fuzz-parsers [TARGET|all] [EXECUTIONS] [SEED]`: runs the fuzz targets (default: all, 1 000 000
//! executions each) and prints one line per target; inputs that crashed go to `fuzz-crashes/`.
//! `fuzz-parsers TARGET replay FILE…` runs saved inputs again. Exit 0 with no crash, 1 with
//! crashes, 2 on bad arguments. `make fuzz` runs it.

use memsight_fuzz::{replay, run, Target};
use std::process::ExitCode;

/// `TARGET replay FILE…`.
fn replay_files(target: Target, files: &[String]) -> ExitCode {
    let mut crashed = false;
    for f in files {
        match std::fs::read(f).map(|input| replay(target, &input)) {
            Ok(Ok(accepted)) => println!("{f}: no crash (accepted: {accepted})"),
            Ok(Err(msg)) => {
                crashed = true;
                println!("{f}: crash: {msg}");
            }
            Err(e) => {
                eprintln!("fuzz-parsers: {f}: {e}");
                return ExitCode::from(2);
            }
        }
    }
    ExitCode::from(u8::from(crashed))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let (Some(t), Some("replay")) = (args.first(), args.get(1).map(String::as_str)) {
        return match Target::from_name(t) {
            Some(t) => replay_files(t, &args[2..]),
            None => {
                eprintln!("fuzz-parsers: no target {t:?}");
                ExitCode::from(2)
            }
        };
    }
    let which = args.first().map_or("all", String::as_str);
    let targets: Vec<Target> = match which {
        "all" => Target::ALL.to_vec(),
        name => match Target::from_name(name) {
            Some(t) => vec![t],
            None => {
                let names: Vec<&str> = Target::ALL.iter().map(|t| t.name()).collect();
                eprintln!(
                    "fuzz-parsers: no target {name:?} (one of all, {})",
                    names.join(", ")
                );
                return ExitCode::from(2);
            }
        },
    };
    let number = |i: usize, default: u64| match args.get(i) {
        None => Some(default),
        Some(s) => s.replace('_', "").parse().ok(),
    };
    let (Some(executions), Some(seed)) = (number(1, 1_000_000), number(2, 1)) else {
        eprintln!("fuzz-parsers: EXECUTIONS and SEED are whole numbers");
        return ExitCode::from(2);
    };
    let mut crashed = false;
    println!("| target | executions | accepted | crashes | seconds |");
    println!("|---|---:|---:|---:|---:|");
    for t in targets {
        let started = std::time::Instant::now();
        let out = run(t, executions, seed);
        println!(
            "| {} | {} | {} | {} | {:.0} |",
            t.name(),
            out.executions,
            out.accepted,
            out.crashes.len(),
            started.elapsed().as_secs_f64()
        );
        for (i, (input, msg)) in out.crashes.iter().enumerate() {
            crashed = true;
            let dir = std::path::Path::new("fuzz-crashes");
            let path = dir.join(format!("{}-{i}.bin", t.name()));
            let saved = std::fs::create_dir_all(dir)
                .and_then(|()| memsight::safe_file::write(&path, input));
            match saved {
                Ok(()) => eprintln!("  crash: {msg} (input in {})", path.display()),
                Err(e) => eprintln!("  crash: {msg} (cannot save input: {e})"),
            }
        }
    }
    if crashed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
