//! Scores `memsight_analysis::diagnose` on OOM corpus files (the shared corpus's JSONL format): how many
//! messages get any finding at all, how many are found (a finding of the expected kind), how many get exactly their facts (one
//! finding, all facts equal; a negative case, kind `none`, counts for both when nothing is found),
//! and — for cases that name them — how many get the expected
//! `verdict`, `workload` and first remedy (`first_remedy`). Prints a summary per file and the
//! misses with `-v`.
//!
//! `cargo run --release -p memsight --example corpus_score -- [-v] FILE.jsonl…`

use memsight_analysis::diagnose::{diagnose, Context};
use serde_json::Value;

#[derive(Default)]
struct Score {
    cases: usize,
    any: usize,
    found: usize,
    facts: usize,
    judged: usize,
    verdicts: usize,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let verbose = args.iter().any(|a| a == "-v");
    let files: Vec<&String> = args.iter().filter(|a| *a != "-v").collect();
    if files.is_empty() {
        eprintln!("usage: corpus_score [-v] FILE.jsonl…");
        std::process::exit(2);
    }
    let mut total = Score::default();
    for file in files {
        let body = match std::fs::read_to_string(file) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("corpus_score: cannot read {file}: {e}");
                std::process::exit(2);
            }
        };
        let mut s = Score::default();
        for line in body.lines().filter(|l| !l.trim().is_empty()) {
            let case: Value = match serde_json::from_str(line) {
                Ok(v) => v,
                Err(e) => {
                    eprintln!("corpus_score: bad line in {file}: {e}");
                    std::process::exit(2);
                }
            };
            score(&case, &mut s, verbose);
        }
        println!(
            "{file}: {} cases, any finding {}, found {}, facts right {}, verdicts right {} of {}",
            s.cases, s.any, s.found, s.facts, s.verdicts, s.judged
        );
        total.cases += s.cases;
        total.any += s.any;
        total.found += s.found;
        total.facts += s.facts;
        total.judged += s.judged;
        total.verdicts += s.verdicts;
    }
    println!(
        "total: {} cases, any finding {}, found {}, facts right {}, verdicts right {} of {}",
        total.cases, total.any, total.found, total.facts, total.verdicts, total.judged
    );
}

fn score(case: &Value, s: &mut Score, verbose: bool) {
    let id = case["id"].as_str().unwrap_or("?");
    let text = case["text"].as_str().unwrap_or("");
    s.cases += 1;
    let found: Vec<Value> = diagnose(text, &Context::default())
        .iter()
        .filter_map(|d| serde_json::to_string(d).ok())
        .filter_map(|j| serde_json::from_str(&j).ok())
        .collect();
    let miss = |what: &str| {
        if verbose {
            println!("  {id}: {what}");
        }
    };
    if !found.is_empty() {
        s.any += 1;
    }
    // A negative case (kind `none`) is a text that looks like a memory failure and is not one:
    // it is found, with every fact, when the reader reports nothing for it.
    let negative = case["kind"] == "none";
    if (negative && found.is_empty()) || found.iter().any(|d| d["kind"] == case["kind"]) {
        s.found += 1;
    } else {
        miss("not found");
    }
    if (negative && found.is_empty())
        || (found.len() == 1
            && found[0]["kind"] == case["kind"]
            && found[0]["facts"] == case["expected"])
    {
        s.facts += 1;
    } else {
        let got: Vec<&Value> = found.iter().map(|d| &d["facts"]).collect();
        miss(&format!("facts {got:?}, expected {}", case["expected"]));
    }
    let wanted = ["verdict", "workload", "first_remedy"];
    if wanted.iter().all(|w| case.get(w).is_none()) {
        return;
    }
    s.judged += 1;
    let Some(d) = found.first() else { return };
    let got = [&d["verdict"], &d["workload"], &d["remedies"][0]["id"]];
    let right = wanted
        .iter()
        .zip(got)
        .all(|(w, g)| case.get(*w).is_none_or(|want| want == g));
    if right {
        s.verdicts += 1;
    } else {
        miss(&format!(
            "verdict {} / workload {} / first remedy {}",
            d["verdict"], d["workload"], d["remedies"][0]["id"]
        ));
    }
}
