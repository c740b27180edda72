//! The report's heap-profile section, made from the profiles a job wrote: the sites holding the
//! bytes at the largest profiled heap, with a pprof file and a flamegraph beside them, and the
//! sites that grew between the first and the latest step profile (the leak view).

use super::flame;
use super::pprof;
use super::profile::{growth, growth_folded, Profile};
use super::symbolize::Symbolizer;
use memsight_format::heap_profile::{
    DumpKind, DumpRecord, Growth, HeapProfile, ProfileView, TOP_SITES,
};
use memsight_format::units::fmt_bytes;
use std::path::{Path, PathBuf};

/// Builds the section from the job's profiles (one record per file: the recorder and the sidecar
/// keep the latest), writing pprof and flamegraph files beside them.
/// Paths in the section are relative to `report_dir` when they lie under it.
pub fn summarize(dumps: &[DumpRecord], report_dir: &Path) -> Option<HeapProfile> {
    // The collectors keep one record per file; a file may be gone since.
    let dumps: Vec<DumpRecord> = dumps
        .iter()
        .filter(|d| Path::new(&d.path).is_file())
        .cloned()
        .collect();
    let mut notes = Vec::new();
    let peak = dumps
        .iter()
        .filter(|d| d.kind != DumpKind::Step)
        .max_by_key(|d| (d.heap_bytes, d.t_ms))
        .or_else(|| dumps.iter().max_by_key(|d| d.heap_bytes))?;
    let mut sym = Symbolizer::new();
    let mut sample_bytes = 0;
    let at_peak = match Profile::load(Path::new(&peak.path), &mut sym) {
        Ok(profile) => {
            sample_bytes = profile.sample_bytes;
            Some(view(peak, &profile, report_dir, &mut notes))
        }
        Err(e) => {
            notes.push(e);
            None
        }
    };
    let mut steps: Vec<&DumpRecord> = dumps.iter().filter(|d| d.kind == DumpKind::Step).collect();
    steps.sort_by_key(|d| d.step);
    let growth = match (steps.first(), steps.last()) {
        (Some(a), Some(b)) if a.step < b.step => {
            match (
                Profile::load(Path::new(&a.path), &mut sym),
                Profile::load(Path::new(&b.path), &mut sym),
            ) {
                (Ok(pa), Ok(pb)) => {
                    sample_bytes = sample_bytes.max(pb.sample_bytes);
                    Some(growth_view(a, b, &pa, &pb, report_dir, &mut notes))
                }
                (Err(e), _) | (_, Err(e)) => {
                    notes.push(e);
                    None
                }
            }
        }
        _ => None,
    };
    notes.extend(
        sym.missing
            .iter()
            .map(|m| format!("no symbols from {m}: its frames show as addresses")),
    );
    Some(HeapProfile {
        sample_bytes,
        at_peak,
        growth,
        dumps: dumps
            .iter()
            .map(|d| DumpRecord {
                path: relative(Path::new(&d.path), report_dir),
                ..d.clone()
            })
            .collect(),
        notes,
    })
}

fn view(d: &DumpRecord, p: &Profile, report_dir: &Path, notes: &mut Vec<String>) -> ProfileView {
    let heap = PathBuf::from(&d.path);
    let pprof_path = heap.with_extension("pb.gz");
    let pprof_file = match memsight_format::safe_file::write(
        &pprof_path,
        &pprof::encode(p, memsight_format::clock::unix_ms()),
    ) {
        Ok(()) => Some(relative(&pprof_path, report_dir)),
        Err(e) => {
            notes.push(format!("cannot write {}: {e}", pprof_path.display()));
            None
        }
    };
    let title = format!(
        "heap at step {} ({} allocated)",
        d.step,
        fmt_bytes(d.heap_bytes)
    );
    let flamegraph_file = write_svg(
        &heap.with_extension("svg"),
        &title,
        &p.folded(),
        report_dir,
        notes,
    );
    if let Some(note) = kept_apart(
        "libraries' start-up (their initialisers)",
        &p.start_up_bytes(),
        d.step,
    ) {
        notes.push(note);
    }
    let tensors = p.tensor_storage_bytes();
    if tensors >= 1.0 {
        notes.push(format!(
            "CPU tensor storage (PyTorch's CPU allocator) held about {} of the {} sampled at step {}",
            fmt_bytes(tensors.round() as u64),
            fmt_bytes(p.total_bytes().round() as u64),
            d.step
        ));
    }
    if let Some(note) = kept_apart("Python's imports", &p.import_bytes(), d.step) {
        notes.push(note);
    }
    let own = p.own_bytes();
    if own >= 1.0 {
        notes.push(format!(
            "memsight's own bookkeeping held about {} at step {} (in the flamegraph, not among the sites)",
            fmt_bytes(own.round() as u64),
            d.step
        ));
    }
    ProfileView {
        pprof_file,
        flamegraph_file,
        ..sites_view(d, p, relative(&heap, report_dir))
    }
}

/// The report's view of profile `d` as read into `p`: its totals and top sites, with `heap_file`
/// naming it and no pprof or flamegraph file (the live viewer's, and the start of the report's).
pub fn sites_view(d: &DumpRecord, p: &Profile, heap_file: String) -> ProfileView {
    ProfileView {
        kind: d.kind,
        t_ms: d.t_ms,
        step: d.step,
        heap_bytes: d.heap_bytes,
        profiled_bytes: p.total_bytes().round() as u64,
        top_sites: p.top_sites(TOP_SITES),
        heap_file,
        pprof_file: None,
        flamegraph_file: None,
    }
}

fn growth_view(
    a: &DumpRecord,
    b: &DumpRecord,
    pa: &Profile,
    pb: &Profile,
    report_dir: &Path,
    notes: &mut Vec<String>,
) -> Growth {
    let svg = Path::new(&b.path).with_file_name("growth.svg");
    let title = format!("heap growth from step {} to step {}", a.step, b.step);
    let folded = growth_folded(pa, pb);
    let flamegraph_file = if folded.is_empty() {
        None
    } else {
        write_svg(&svg, &title, &folded, report_dir, notes)
    };
    let own_growth = pb.own_bytes() - pa.own_bytes();
    if own_growth >= 1.0 {
        notes.push(format!(
            "memsight's own bookkeeping (its bounded timeline, among others) grew about {} from step {} to step {}; left out of the growth",
            fmt_bytes(own_growth.round() as u64),
            a.step,
            b.step
        ));
    }
    Growth {
        from_step: a.step,
        to_step: b.step,
        sites: growth(pa, pb, TOP_SITES),
        flamegraph_file,
    }
}

fn write_svg(
    path: &Path,
    title: &str,
    folded: &[(String, u64)],
    report_dir: &Path,
    notes: &mut Vec<String>,
) -> Option<String> {
    let written = flame::svg(title, folded)
        .and_then(|svg| memsight_format::safe_file::write(path, &svg).map_err(|e| e.to_string()));
    match written {
        Ok(()) => Some(relative(path, report_dir)),
        Err(e) => {
            notes.push(format!("no flamegraph {}: {e}", path.display()));
            None
        }
    }
}

fn relative(path: &Path, base: &Path) -> String {
    let base = if base.as_os_str().is_empty() {
        Path::new(".")
    } else {
        base
    };
    let base = std::fs::canonicalize(base).unwrap_or_else(|_| base.to_path_buf());
    let full = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    full.strip_prefix(&base)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| path.display().to_string())
}

/// The note for bytes kept out of the sites by who made them (libraries' start-up, Python's
/// imports): their total and the four largest.
fn kept_apart(what: &str, by: &[(String, f64)], step: u64) -> Option<String> {
    if by.is_empty() {
        return None;
    }
    let total: f64 = by.iter().map(|(_, b)| b).sum();
    let each: Vec<String> = by
        .iter()
        .take(4)
        .map(|(m, b)| format!("{m} {}", fmt_bytes(b.round() as u64)))
        .collect();
    Some(format!(
        "{what} held about {} at step {step}: {} (in the flamegraph, not among the sites)",
        fmt_bytes(total.round() as u64),
        each.join(", ")
    ))
}
