//! Allocations: calls per power-of-two size class (live: the job's latest counts), and the sites
//! holding the bytes at the heap's profiled peak (live: the largest profile the job wrote so far),
//! with what grew between step profiles.

use crate::state::ViewerState;
use memsight_format::report::HistogramBucket;
use memsight_format::units::fmt_bytes;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::widgets::{Bar, BarChart, BarGroup, Block, Borders, Paragraph, Row, Table, Wrap};
use ratatui::Frame;

/// Renders the allocations screen.
pub fn render(f: &mut Frame, area: Rect, s: &ViewerState) {
    let [top, bottom] =
        Layout::vertical([Constraint::Percentage(45), Constraint::Percentage(55)]).areas(area);
    render_histogram(f, top, s);
    render_sites(f, bottom, s);
}

fn render_sites(f: &mut Frame, area: Rect, s: &ViewerState) {
    let block = |title: String| Block::default().borders(Borders::ALL).title(title);
    let (view, title) = match (&s.heap_profile, &s.live_sites) {
        (Some(hp), _) => match &hp.at_peak {
            Some(p) => (
                Some(p),
                format!(
                    " allocation sites at the profiled peak (step {}, {} allocated) ",
                    p.step,
                    fmt_bytes(p.heap_bytes)
                ),
            ),
            None => (None, " allocation sites ".to_string()),
        },
        (None, Some(Ok(p))) => (
            Some(p),
            format!(
                " allocation sites at the profiled peak so far (step {}, {} allocated) ",
                p.step,
                fmt_bytes(p.heap_bytes)
            ),
        ),
        (None, live) => {
            let text = match (&s.peak_heap_dump, live) {
                (Some(d), Some(Err(e))) => format!(
                    "The heap profile ({:?} at step {}, {}) could not be read: {e}",
                    d.kind,
                    d.step,
                    fmt_bytes(d.heap_bytes)
                ),
                (Some(d), _) => format!(
                    "Reading the heap profile ({:?} at step {}, {}: {})…",
                    d.kind,
                    d.step,
                    fmt_bytes(d.heap_bytes),
                    d.path
                ),
                (None, _) => no_sites(s),
            };
            f.render_widget(
                Paragraph::new(text)
                    .wrap(Wrap { trim: true })
                    .block(block(" allocation sites ".into())),
                area,
            );
            return;
        }
    };
    let mut rows: Vec<Row> = view
        .map(|p| {
            p.top_sites
                .iter()
                .map(|site| {
                    Row::new(vec![
                        fmt_bytes(site.bytes),
                        format!("{:.1}%", site.share * 100.0),
                        site.at.label(),
                    ])
                })
                .collect()
        })
        .unwrap_or_default();
    if let Some(g) = s
        .heap_profile
        .as_ref()
        .and_then(|hp| hp.growth.as_ref())
        .filter(|g| !g.sites.is_empty())
    {
        rows.push(
            Row::new(vec![
                String::new(),
                String::new(),
                format!("grew from step {} to step {}:", g.from_step, g.to_step),
            ])
            .style(Style::default().add_modifier(Modifier::BOLD)),
        );
        rows.extend(g.sites.iter().take(5).map(|site| {
            Row::new(vec![
                format!("+{}", fmt_bytes(site.grew_bytes.max(0) as u64)),
                String::new(),
                site.at.label(),
            ])
            .style(Style::default().fg(Color::Yellow))
        }));
    }
    let header = Row::new(vec!["bytes", "share", "site"])
        .style(Style::default().add_modifier(Modifier::BOLD));
    let widths = [
        Constraint::Length(12),
        Constraint::Length(7),
        Constraint::Min(20),
    ];
    f.render_widget(
        Table::new(rows, widths).header(header).block(block(title)),
        area,
    );
}

fn render_histogram(f: &mut Frame, area: Rect, s: &ViewerState) {
    let block = Block::default().borders(Borders::ALL);
    if s.histogram.is_empty() {
        let text = if measured(s) == Some(false) {
            "No allocation counted: a process sampled from outside has no histogram (run it under \
             `memsight run`, which preloads memsight)."
        } else {
            "No allocation counted yet."
        };
        f.render_widget(
            Paragraph::new(text).block(block.title(" allocation calls by size class ")),
            area,
        );
        return;
    }
    // Every class up to the largest is drawn at any width: narrower bars first, then neighbouring
    // classes merged, so tensor-sized blocks (MiB, GiB) are never left off the right edge.
    let classes = fit_classes(&s.histogram, area.width.saturating_sub(2) as usize);
    let bars: Vec<Bar> = classes
        .buckets
        .iter()
        .map(|&(first, last, count)| {
            let label = if first == last {
                format!("≥{}", short_bytes(first))
            } else {
                format!("{}-{}", short_bytes(first), short_bytes(last))
            };
            Bar::default()
                .label(label)
                .value(count)
                .style(Style::default().fg(Color::Cyan))
        })
        .collect();
    let title = match classes.merged {
        1 => " allocation calls by size class ".to_string(),
        n => format!(" allocation calls by size class, {n} classes a bar (first-last) "),
    };
    f.render_widget(
        BarChart::default()
            .block(block.title(title))
            .data(BarGroup::default().bars(&bars))
            .bar_width(classes.bar_width)
            .bar_gap(1),
        area,
    );
}

/// The histogram as drawn: bars `(first class, last class, count)` (each class by its smallest
/// size), how many classes each bar holds, and the bars' width.
struct Classes {
    buckets: Vec<(u64, u64, u64)>,
    merged: usize,
    bar_width: u16,
}

/// The widest bars (9 columns down to 5) that show every class in `width` columns; where even 5
/// do not, 9-column bars of neighbouring classes merged (their labels name the first and the last
/// class), the largest classes in a bar of their own where the count does not divide evenly.
fn fit_classes(histogram: &[HistogramBucket], width: usize) -> Classes {
    let n = histogram.len().max(1);
    let fits = |bar: usize| (width + 1) / (bar + 1);
    let (bar_width, merged) = match (5..=9).rev().find(|&b| fits(b) >= n) {
        Some(b) => (b, 1),
        None => (9, n.div_ceil(fits(9).max(1))),
    };
    let buckets = histogram
        .chunks(merged)
        .map(|c| {
            (
                c.first().map_or(0, |b| b.min_bytes),
                c.last().map_or(0, |b| b.min_bytes),
                c.iter().map(|b| b.count).sum(),
            )
        })
        .collect();
    Classes {
        buckets,
        merged,
        bar_width: bar_width as u16,
    }
}

/// `512`, `16K`, `4M`, `1G`: a power-of-two size in at most 4 characters.
fn short_bytes(v: u64) -> String {
    const UNITS: [&str; 6] = ["", "K", "M", "G", "T", "P"];
    let mut v = v;
    let mut unit = 0;
    while v >= 1024 && v.is_multiple_of(1024) && unit + 1 < UNITS.len() {
        v /= 1024;
        unit += 1;
    }
    format!("{v}{}", UNITS[unit])
}

/// Whether the job's heap is measured in-process (`None`: no sample yet).
fn measured(s: &ViewerState) -> Option<bool> {
    if let Some(r) = &s.report {
        if r.heap_measured() {
            return Some(true);
        }
    }
    s.timeline.last().map(|l| l.heap.allocations > 0)
}

/// Why there are no allocation sites, for this job: the report's own reason, a job memsight is
/// preloaded into (it counts that heap without sites), or one sampled from outside.
fn no_sites(s: &ViewerState) -> String {
    let reason = s.report.as_ref().and_then(|r| {
        r.sources
            .iter()
            .find(|x| x.name == "heap profile" && !x.available)
            .map(|x| x.detail.clone())
    });
    if let Some(why) = reason {
        return format!("No allocation sites: {why}.");
    }
    let preloaded = s
        .timeline
        .last()
        .is_some_and(|l| l.heap.allocations > 0 && l.jemalloc.is_none());
    match measured(s) {
        Some(true) if preloaded => "No allocation sites: allocation sites are recorded in a job \
                                    that links memsight; in one it is preloaded into (Python, \
                                    C/C++) the heap is counted exactly, without sites."
            .into(),
        Some(true) if matches!(s.source, crate::state::Source::Replay { .. }) => {
            "No heap profile in this report.".into()
        }
        Some(true) => "No heap profile yet: the job writes one as its heap reaches new peaks \
                       (if sampling is off: `memsight heap sampling on PID`)."
            .into(),
        Some(false) => "No allocation sites: the process is sampled from outside (run it under \
                        `memsight run` for its heap)."
            .into(),
        None => "No heap profile yet.".into(),
    }
}
