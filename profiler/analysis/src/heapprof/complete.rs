//! A report whose heap profiles were not symbolized by the job (an in-process session built without
//! memsight's `symbolize` feature lists its profiles and no sites): the readers (`memsight summary`,
//! `memsight view`) symbolize the profiles it names, found where the job wrote them or beside the
//! report, so its sites show like those of a report `memsight run` wrote.

use super::summary::summarize;
use memsight_format::heap_profile::DumpRecord;
use memsight_format::Report;
use std::path::{Path, PathBuf};

/// Fills in the sites of `report` (read from `report_path`) when it names heap profiles but has no
/// sites; otherwise leaves it as it is. When the profiles cannot be read, the report keeps its
/// notes, which say how to list the sites (`memsight heap top`).
pub fn complete(report: &mut Report, report_path: &Path) {
    let Some(hp) = &report.heap_profile else {
        return;
    };
    if hp.at_peak.is_some() || hp.dumps.is_empty() {
        return;
    }
    let report_dir = report_path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let dumps: Vec<DumpRecord> = hp
        .dumps
        .iter()
        .filter_map(|d| {
            found(Path::new(&d.path), report_dir).map(|p| DumpRecord {
                path: p.display().to_string(),
                ..d.clone()
            })
        })
        .collect();
    if let Some(section) = summarize(&dumps, report_dir).filter(|s| s.at_peak.is_some()) {
        report.set_heap_profile(Some(section));
    }
}

/// Where a profile the job named is now: at its path (absolute, or relative to here), beside the
/// report (its `<stem>.heap/` directory moved with the report), or relative to the report.
fn found(path: &Path, report_dir: &Path) -> Option<PathBuf> {
    let mut tail = PathBuf::new();
    let parts: Vec<_> = path.components().rev().take(2).collect();
    for c in parts.iter().rev() {
        tail.push(c);
    }
    [
        path.to_path_buf(),
        report_dir.join(&tail),
        report_dir.join(path),
    ]
    .into_iter()
    .find(|p| p.is_file())
}
