//! The human-readable form of a diagnosis, shared by `memsight diagnose`, post-mortems and the
//! viewer.

use super::facts::Fact;
use super::Diagnosis;
use memsight_format::units::fmt_bytes;
use std::fmt::Write;

fn fact_text(name: &str, v: &Fact) -> String {
    match v {
        Fact::Int(n) if name.ends_with("_bytes") => match u64::try_from(*n) {
            Ok(b) => fmt_bytes(b),
            Err(_) => format!("{n} B"),
        },
        Fact::Int(n) => n.to_string(),
        Fact::Float(x) => format!("{x}"),
        Fact::Text(s) => s.clone(),
        Fact::Bool(b) => b.to_string(),
        Fact::Ints(v) => format!("{v:?}"),
        Fact::Processes(ps) => ps
            .iter()
            .map(|p| {
                let b = u64::try_from(p.bytes).map_or(format!("{} B", p.bytes), fmt_bytes);
                format!("pid {} {b}", p.pid)
            })
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// Several indented lines: kind and line, facts, verdict with evidence, numbered remedies.
pub fn render(d: &Diagnosis, index: usize) -> String {
    let mut s = String::new();
    // Line 0: not from a log (a report's device OOM or post-mortem).
    let place = match d.line {
        0 => "from the report".to_string(),
        n => format!("line {n}"),
    };
    let _ = writeln!(s, "[{index}] {place} · {}", d.kind.as_str());
    let facts: Vec<String> = d
        .facts
        .iter()
        .map(|(n, v)| format!("{} {}", n.trim_end_matches("_bytes"), fact_text(n, v)))
        .collect();
    let _ = writeln!(s, "    facts:   {}", facts.join(" · "));
    let verdict = serde_json::to_value(d.verdict.verdict)
        .ok()
        .and_then(|v| v.as_str().map(str::to_uppercase))
        .unwrap_or_default();
    let _ = writeln!(s, "    verdict: {verdict} — {}", d.verdict.evidence);
    let _ = writeln!(s, "    remedies:");
    for (i, r) in d.remedies.iter().enumerate() {
        let saving = r.saving_bytes.map_or(String::new(), |b| {
            format!(" (frees up to {})", fmt_bytes(b))
        });
        let _ = writeln!(s, "      {}. {}{saving}", i + 1, r.action);
        let _ = writeln!(s, "         why: {}", r.why);
    }
    s
}
