//! `memsight summary --format markdown`: a CI step summary of a report.

use memsight_format::units::{fmt_bytes, fmt_signed_bytes};
use memsight_format::{text, Report};
use std::fmt::Write;

/// Renders the report as GitHub-flavoured markdown.
pub fn markdown(r: &Report) -> String {
    let mut s = String::new();
    header(&mut s, r);
    metrics(&mut s, r);
    if let Some(note) = r.shutdown_note() {
        let _ = writeln!(s, "\n{note}.");
    }
    process_tree(&mut s, r);
    post_mortem(&mut s, r);
    device_lines(&mut s, r);
    phases(&mut s, r);
    heap_profile(&mut s, r);
    tips_and_sources(&mut s, r);
    // Phase names, the command line and paths come from the job: no control character of theirs
    // reaches the terminal (or the CI log) that shows this.
    text::block(&s).into_owned()
}

/// `step N, phase `P``, or what of it is known.
fn at(step: Option<u64>, phase: Option<&str>) -> String {
    let mut w = Vec::new();
    if let Some(st) = step {
        w.push(format!("step {st}"));
    }
    if let Some(ph) = phase {
        w.push(format!("phase `{}`", text::line(ph)));
    }
    w.join(", ")
}

/// The title line: the command, its pid, duration, end and sampling interval.
fn header(s: &mut String, r: &Report) {
    let dur = r.job.end_unix_ms.saturating_sub(r.job.start_unix_ms) as f64 / 1000.0;
    let _ = writeln!(
        s,
        "## memsight report: `{}`\n",
        text::line(&r.job.command.join(" "))
    );
    let _ = writeln!(
        s,
        "pid {} · {:.1} s · {} · sampled every {} ms\n",
        r.job.pid, dur, r.job.exit.description, r.interval_ms
    );
}

/// The headline table, what dominates an ML job first: device memory, tensors, the process heap
/// (all code), RSS with its anon / file / shmem split, the process tree's PSS — each with the
/// step and phase where it first reached its peak and what exactly it counts; then jemalloc,
/// cgroup, growth, OOMs.
fn metrics(s: &mut String, r: &Report) {
    let p = &r.peaks;
    let _ = writeln!(
        s,
        "| memory | peak | first reached | what it counts |\n|---|---|---|---|"
    );
    for d in &r.devices {
        let opt = |v: Option<u64>| v.map(fmt_bytes).unwrap_or_else(|| "n/a".into());
        let _ = writeln!(
            s,
            "| cuda:{} reserved / allocated | {} / {} | | {} device memory{} |",
            d.index,
            opt(d.peak_reserved_bytes.or(d.peak_used_bytes)),
            opt(d.peak_allocated_bytes),
            d.backend,
            d.total_bytes
                .map(|t| format!(", of {}", fmt_bytes(t)))
                .unwrap_or_default()
        );
    }
    if let Some(t) = p.tensor_peak_bytes {
        let _ = writeln!(
            s,
            "| tensors | {} | {} | live CPU tensor storage (libtorch allocator hook, exact) |",
            fmt_bytes(t),
            at(p.tensor_peak_step, p.tensor_peak_phase.as_deref())
        );
    }
    let host = r.host_peak();
    if host.of_job {
        let _ = writeln!(
            s,
            "| job heap | {} | {} | the heaps of the job's {} measured processes at one moment, each its own: what `check --max-host-peak` gates |",
            fmt_bytes(host.bytes),
            at(host.step, host.phase.as_deref()),
            r.processes.iter().filter(|p| p.heap_peak_bytes > 0).count()
        );
    }
    if r.heap_measured() {
        let _ = writeln!(
            s,
            "| process heap | {} | {} | {}, usable sizes |",
            fmt_bytes(p.heap_peak_bytes),
            if r.heap_peaked_outside_marks() {
                memsight_format::report::OUTSIDE_MARKS.to_string()
            } else {
                at(p.heap_peak_step, p.heap_peak_phase.as_deref())
            },
            memsight_format::job_context::JobContext::of(r).heap_words()
        );
    } else {
        let _ = writeln!(
            s,
            "| process heap | – | | {} |",
            memsight_format::Report::HEAP_NOT_MEASURED
        );
    }
    if let Some(a) = &r.python_arenas {
        let _ = writeln!(
            s,
            "| Python small objects | {} | | pymalloc's arenas ({} × {}, CPython's own high-water mark), mapped outside malloc: **not in the process heap above**{} |",
            fmt_bytes(a.peak_bytes),
            a.peak_arenas,
            fmt_bytes(a.arena_size_bytes),
            a.allocated_blocks_bytes
                .map(|b| format!("; {} in objects at exit", fmt_bytes(b)))
                .unwrap_or_default()
        );
    }
    if let Some(rss) = p.rss_peak_bytes {
        let sample = p.rss_peak_sample.as_ref();
        let w = sample
            .map(|a| at(Some(a.step), a.phase.as_deref()))
            .unwrap_or_default();
        let split = sample
            .and_then(|a| r.sample_at(a)?.process)
            .map(|m| {
                format!(
                    ": anon {} · file {} · shmem {} at that sample",
                    fmt_bytes(m.anon),
                    fmt_bytes(m.file),
                    fmt_bytes(m.shmem)
                )
            })
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "| RSS | {} | {} | resident pages of the job's process{} |",
            fmt_bytes(rss),
            w,
            split
        );
    }
    if let Some(tp) = r
        .process_tree
        .as_ref()
        .filter(|t| t.tree.processes.len() > 1)
    {
        let _ = writeln!(
            s,
            "| process tree PSS | {} | {} | {} processes, each shared page split among its sharers |",
            fmt_bytes(tp.at.bytes),
            at(Some(tp.at.step), tp.at.phase.as_deref()),
            tp.tree.processes.len()
        );
    }
    if let Some(res) = &p.jemalloc_resident_peak {
        let _ = writeln!(
            s,
            "| jemalloc resident | {} | {} | heap pages jemalloc holds in memory, in use or cached |",
            fmt_bytes(res.bytes),
            at(Some(res.step), res.phase.as_deref())
        );
    }
    if let Some(f) = &r.fragmentation {
        let _ = writeln!(
            s,
            "| fragmentation | {:.1}% | at the resident peak | (resident − allocated) / resident |",
            f.resident_ratio * 100.0
        );
    }
    if let Some(c) = &p.cgroup_usage_peak {
        let lim = p
            .cgroup_limit_bytes
            .map(fmt_bytes)
            .unwrap_or_else(|| "unlimited".into());
        let _ = writeln!(
            s,
            "| cgroup usage (whole cgroup) | {} | | every process in the job's memory cgroup (the container's, unless the job has one of its own) and their page cache, not only the job's; limit {} |",
            fmt_bytes(c.bytes),
            lim
        );
    }
    if let Some(l) = &r.leak {
        let _ = writeln!(
            s,
            "| process-heap growth | {}/step | | fit over {2} steps, confidence {1:.0}% |",
            fmt_signed_bytes(l.slope_bytes_per_step as i64),
            l.confidence * 100.0,
            l.steps_used
        );
    }
    if r.heap_measured() {
        let _ = writeln!(
            s,
            "| process heap at end | {} | | live when the session finished |",
            fmt_bytes(p.final_live_bytes)
        );
    }
    for o in &r.device_ooms {
        let _ = writeln!(
            s,
            "| **cuda:{} OOM** | asked {} with {} free | step {}{} | |",
            o.device,
            fmt_bytes(o.requested_bytes),
            fmt_bytes(o.free_bytes),
            o.step,
            o.phase
                .as_ref()
                .map(|p| format!(", phase `{p}`"))
                .unwrap_or_default()
        );
    }
}

/// The job's processes when their PSS total peaked: one row per worker with PSS (its share of
/// every page it maps; the rows sum to the tree's footprint), USS (pages only it maps) and RSS
/// (which counts every shared page once per process).
fn process_tree(s: &mut String, r: &Report) {
    let Some(tp) = &r.process_tree else {
        return;
    };
    let opt = |v: Option<u64>| v.map(fmt_bytes).unwrap_or_else(|| "n/a".into());
    let t = &tp.tree;
    let _ = writeln!(
        s,
        "\n### Process tree at its PSS peak ({}, {})\n\n\
         | pid | name | PSS | USS (private) | RSS |\n|---:|---|---:|---:|---:|",
        fmt_bytes(tp.at.bytes),
        at(Some(tp.at.step), tp.at.phase.as_deref())
    );
    for p in &t.processes {
        let _ = writeln!(
            s,
            "| {} | `{}` | {} | {} | {} |",
            p.pid,
            p.name,
            opt(p.pss),
            opt(p.uss),
            fmt_bytes(p.rss)
        );
    }
    let _ = writeln!(
        s,
        "| | **total ({} process{})** | **{}** | {} | {} |",
        t.processes.len(),
        if t.processes.len() == 1 { "" } else { "es" },
        opt(t.total_pss),
        opt(t.total_uss),
        fmt_bytes(t.total_rss)
    );
}

/// How the job ended and the diagnosis engine's findings.
fn post_mortem(s: &mut String, r: &Report) {
    if let Some(pm) = &r.post_mortem {
        let _ = writeln!(s, "\n### Post-mortem: {}\n\n{}", pm.cause, pm.description);
        for f in &pm.findings {
            let _ = writeln!(s, "\n**{}** (`{}`): {}\n", f.verdict, f.kind, f.evidence);
            for (i, rem) in f.remedies.iter().enumerate() {
                let _ = writeln!(s, "{}. {rem}", i + 1);
            }
        }
    }
}

/// Device memory by Python line: at each device's peak, and at each OOM that has its lines.
fn device_lines(s: &mut String, r: &Report) {
    for l in &r.device_lines {
        let reach = match l.covers_peak {
            Some(true) => "; the history reaches back to the allocator's own peak".to_string(),
            Some(false) => format!(
                "; the allocator's own peak, {}, is older than the history's {} actions",
                l.allocator_peak_bytes.map(fmt_bytes).unwrap_or_default(),
                l.history_entries
            ),
            None => String::new(),
        };
        let _ = writeln!(
            s,
            "
### Device memory by line: cuda:{} at its peak ({} allocated{reach})
",
            l.device,
            fmt_bytes(l.live_bytes)
        );
        line_table(s, l);
    }
    for o in r.device_ooms.iter() {
        let Some(l) = &o.lines else { continue };
        let asked = match &l.failed_request {
            Some(f) => format!(
                "the request for {} came from `{}`",
                fmt_bytes(f.bytes),
                f.short()
            ),
            None => format!("the request for {}", fmt_bytes(o.requested_bytes)),
        };
        let _ = writeln!(
            s,
            "
### Device memory by line: cuda:{} OOM at step {} ({asked}; {} allocated then)
",
            o.device,
            o.step,
            fmt_bytes(l.live_bytes)
        );
        line_table(s, l);
    }
}

/// One moment's lines, categories and what has no Python stack.
fn line_table(s: &mut String, l: &memsight_format::device::DeviceLines) {
    let share = |b: u64| {
        if l.live_bytes == 0 {
            0.0
        } else {
            b as f64 * 100.0 / l.live_bytes as f64
        }
    };
    if !l.lines.is_empty() {
        let _ = writeln!(
            s,
            "| bytes | share | line | category |\n|---:|---:|---|---|"
        );
        for line in &l.lines {
            let _ = writeln!(
                s,
                "| {} | {:.1}% | `{}` | {} |",
                fmt_bytes(line.bytes),
                share(line.bytes),
                line.short(),
                line.category
            );
        }
        if l.other_lines_bytes > 0 {
            let _ = writeln!(
                s,
                "| {} | {:.1}% | other lines | |",
                fmt_bytes(l.other_lines_bytes),
                share(l.other_lines_bytes)
            );
        }
        if l.no_stack_bytes > 0 {
            let _ = writeln!(
                s,
                "| {} | {:.1}% | no Python stack (autograd's backward thread, or allocated before the history) | |",
                fmt_bytes(l.no_stack_bytes),
                share(l.no_stack_bytes)
            );
        }
    }
    if !l.categories.is_empty() {
        let cats: Vec<String> = l
            .categories
            .iter()
            .map(|c| format!("{} {}", c.name, fmt_bytes(c.bytes)))
            .collect();
        let _ = writeln!(s, "\nBy category: {}.", cats.join(" · "));
    }
}

/// The 15 phases with the highest peaks.
fn phases(s: &mut String, r: &Report) {
    if !r.phases.is_empty() {
        let _ = writeln!(
            s,
            "\n### Phases\n\n| phase | count | time | peak | net | tensor peak |\n|---|---:|---:|---:|---:|---:|"
        );
        let mut phases = r.phases.clone();
        phases.sort_by_key(|p| std::cmp::Reverse(p.peak_bytes));
        for ph in phases.iter().take(15) {
            let _ = writeln!(
                s,
                "| `{}` | {} | {:.2} s | {} | {} | {} |",
                text::line(&ph.path),
                ph.count,
                ph.total_ms / 1000.0,
                fmt_bytes(ph.peak_bytes),
                fmt_signed_bytes(ph.net_bytes),
                ph.tensor_peak_bytes
                    .map(fmt_bytes)
                    .unwrap_or_else(|| "–".into())
            );
        }
    }
}

/// The sites holding the bytes at the profiled peak, and what grew.
fn heap_profile(s: &mut String, r: &Report) {
    if let Some(hp) = &r.heap_profile {
        if let Some(p) = &hp.at_peak {
            let _ = writeln!(
                s,
                "\n### Allocation sites at the profiled peak (step {}, {} allocated)\n\n\
                 | bytes | share | site |\n|---:|---:|---|",
                p.step,
                fmt_bytes(p.heap_bytes)
            );
            for site in &p.top_sites {
                let _ = writeln!(
                    s,
                    "| {} | {:.1}% | `{}` |",
                    fmt_bytes(site.bytes),
                    site.share * 100.0,
                    site.at.label()
                );
            }
            if let Some(svg) = &p.flamegraph_file {
                let _ = writeln!(s, "\nFlamegraph: `{svg}`");
            }
            // What is kept out of the sites (libraries' start-up, Python's imports, memsight's own
            // bookkeeping) and how much is tensor storage.
            if !hp.notes.is_empty() {
                let _ = writeln!(s);
                for n in &hp.notes {
                    let _ = writeln!(s, "- {n}");
                }
            }
        } else if !hp.notes.is_empty() {
            // Profiles that could not be read here: how to list their sites.
            let _ = writeln!(s, "\n### Allocation sites\n");
            for n in &hp.notes {
                let _ = writeln!(s, "- {n}");
            }
        }
        if let Some(g) = hp.growth.as_ref().filter(|g| !g.sites.is_empty()) {
            let _ = writeln!(
                s,
                "\n### Grew from step {} to step {}\n\n| grew | site |\n|---:|---|",
                g.from_step, g.to_step
            );
            for site in g.sites.iter().take(5) {
                let _ = writeln!(
                    s,
                    "| +{} | `{}` |",
                    fmt_bytes(site.grew_bytes.max(0) as u64),
                    site.at.label()
                );
            }
        }
    }
}

/// Tips, and the sources that could not be read.
fn tips_and_sources(s: &mut String, r: &Report) {
    if !r.tips.is_empty() {
        let _ = writeln!(s, "\n### Tips\n");
        for t in &r.tips {
            let _ = writeln!(s, "- **{}** ({}): {}", t.title, t.severity, t.advice);
        }
    }
    let missing: Vec<_> = r.sources.iter().filter(|x| !x.available).collect();
    if !missing.is_empty() {
        let _ = writeln!(s, "\n### Sources not available\n");
        for m in missing {
            let _ = writeln!(s, "- {}: {}", m.name, m.detail);
        }
    }
}
